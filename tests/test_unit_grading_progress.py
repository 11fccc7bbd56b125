"""The grading bar counts each student when their notebooks are done, in any order, and names who is being graded:
counted in order (pool.map), one looping notebook held the bar at 6/12 for two minutes while the other worker
finished five students, and nothing said which notebook it was waiting for."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import tqdm as tqdm_module

from autograder.grade import _progress_as_done


def test_a_slow_student_does_not_hold_the_count_and_is_named(monkeypatch, capsys):
    counted = threading.Event()
    shown: list[tuple[int, str]] = []

    class Bar(tqdm_module.tqdm):
        def update(self, n=1):
            super().update(n)
            shown.append((self.n, self.postfix or ""))
            counted.set()

    monkeypatch.setattr(tqdm_module, "tqdm", Bar)
    graded: list[str] = []

    def one(sub):
        if sub.student_id == "ann":  # the looping notebook: still running when bob's is counted
            assert counted.wait(30), "bob was not counted while ann was still being graded"
        graded.append(sub.student_id)

    students = [SimpleNamespace(student_id="ann"), SimpleNamespace(student_id="bob")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        _progress_as_done(pool, one, students, progress=True)
    assert graded == ["bob", "ann"]
    assert shown[0] == (1, "now: ann"), shown  # bob counted, ann named as the one still running
    assert shown[-1][0] == 2
