"""What the grader's worker threads share in one process, and must take turns at.

Syntax trees (autograder/syntax_trees.py): CPython 3.11 counts tree depth in one counter per
process: two threads parsing at once can fail with "SystemError: AST constructor recursion depth
mismatch". In CI a notebook's honesty scan met the arrays of another notebook being read (numpy
parses every .npy header with ast.literal_eval): the notebook came back "error", unflagged. Here
every parse is slowed so that threads would overlap, and none may; and a parse spoilt by a thread
the grader cannot make wait is done again.

PyTorch's random generator (core.TRUSTED_TURN): the references, catalogued mistakes and derives
that the trusted grader runs seed it or draw from it; beside another thread doing the same, a
dropout case's reference and the sampler's "global random state untouched" came out different.

The salt of the hidden inputs (core.THREAD_SALT): each grading thread keeps its class's."""
from __future__ import annotations

import ast
import threading
import time

import numpy as np
import pytest
import torch

from autograder import serialize, trusted
from autograder.checks import core, nb02
from autograder.honesty import REVIEW, rules_for_exercises, scan
from course_tools.adversarial import HONESTY_BYPASSES

COLLISION = "AST constructor recursion depth mismatch (before=51, after=46)"
CELLS = ["import math\nimport torch\n", next(b for b in HONESTY_BYPASSES if b.name == "worker-thread").code]
RULES = rules_for_exercises(nb02.check.exercises.values())
BLOB = serialize.dumps({"weights": np.arange(12.0).reshape(3, 4), "steps": [np.ones(2), np.zeros((2, 2))]})


def scanned():
    return scan(CELLS, RULES)


def loaded():
    got = serialize.loads(BLOB)
    return got["weights"].tolist(), [a.tolist() for a in got["steps"]]


def test_the_scan_and_reading_arrays_take_turns_across_threads(monkeypatch):
    real, inside, most, count = ast.parse, 0, 0, threading.Lock()

    def slow_parse(*args, **kwargs):
        nonlocal inside, most
        if not threading.current_thread().name.startswith("grader-"):  # a thread of some other test's
            return real(*args, **kwargs)
        with count:
            inside += 1
            most = max(most, inside)
        try:
            time.sleep(0.002)  # the window another thread would parse in
            return real(*args, **kwargs)
        finally:
            with count:
                inside -= 1

    want = {"scan": scanned(), "load": loaded()}
    assert [f for f in want["scan"] if f.severity == REVIEW], want["scan"]
    monkeypatch.setattr(ast, "parse", slow_parse)
    got: list[tuple[str, object]] = []
    work = [("scan", scanned), ("load", loaded)] * 2
    _all_finish([threading.Thread(target=lambda k=k, f=f: got.append((k, f())), name=f"grader-{i}")
                 for i, (k, f) in enumerate(work)])
    assert most == 1, f"{most} threads were parsing at once"
    assert sorted(got, key=lambda kv: kv[0]) == sorted([(k, want[k]) for k, _ in work], key=lambda kv: kv[0])


@pytest.mark.parametrize("work", [scanned, loaded], ids=["scan", "load"])
def test_work_spoilt_by_another_threads_parse_is_done_again(monkeypatch, work):
    """The counter's error is about the process, never the input: the same work is done again (an
    array is read again from its start). Any other SystemError is raised."""
    want, real, calls, this = work(), ast.parse, [], threading.current_thread()

    def spoilt_once(*args, **kwargs):
        if threading.current_thread() is not this:  # a thread of some other test's
            return real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            raise SystemError(COLLISION)
        return real(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", spoilt_once)
    assert work() == want and len(calls) > 1

    def broken(*args, **kwargs):
        raise SystemError("something else")

    monkeypatch.setattr(ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        work()


RANDOM = [trusted.CheckRef("nb03", "MultiHeadAttention", "MultiHeadAttention"),
          trusted.CheckRef("nb05", "FeedForward", "FeedForward"),
          trusted.CheckRef("nb06", "sample_next_token_generator", "sample_next_token")]
MODEL = trusted.CheckRef("nb06", "Seq2SeqTransformer", "Seq2SeqTransformer")  # its derive builds a model


def _outputs(ref: trusted.CheckRef) -> tuple:
    """The reference's outputs on freshly drawn cases, as trusted.expected computes them (bypassing
    only its cache)."""
    trusted._cases.cache_clear()
    return trusted._expected.__wrapped__(ref, core.check_salt())


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and bool(torch.equal(a.nan_to_num(), b.nan_to_num()))
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b, equal_nan=True)
    return a == b or (a != a and b != b)


def _all_finish(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a grading thread never finished (a lock held forever?)"


def test_references_are_the_same_beside_other_grader_threads():
    """Two threads compute the references of the exercises that seed torch, five times each, while a
    third judges nb06's model case (its derive builds a Seq2SeqTransformer); every result equals the
    one computed alone (without the turn, all three differ, every time tried)."""
    alone = {r.name: _outputs(r) for r in RANDOM}
    model_case = next(c for c in trusted.cases(MODEL) if c.derive is not None)
    model_output = trusted.expected(MODEL)[trusted.cases(MODEL).index(model_case)]
    different: list[str] = []
    done = threading.Event()

    def judge_many():
        for _ in range(5):
            for r in RANDOM:
                if not _same(_outputs(r), alone[r.name]):
                    different.append(r.name)

    def judge_the_model():
        while not done.is_set():
            core.derived(model_case, model_output)

    judging = [threading.Thread(target=judge_many) for _ in range(2)]
    model = threading.Thread(target=judge_the_model)
    model.start()
    try:
        _all_finish(judging)
    finally:
        done.set()
        model.join(timeout=300)
    assert not different, f"references that changed beside other threads: {sorted(set(different))}"


def test_each_thread_keeps_its_own_classes_salt(monkeypatch):
    """Salt (grade.checks_salted): a Dask worker with several threads grades two classes at once.
    Class A's task ends while class B's is still drawing its cases: B keeps B's salt, and the
    process's ATTN_CHECK_SEED is never touched."""
    from autograder.grade import checks_salted

    monkeypatch.setenv("ATTN_CHECK_SEED", "the-suites-salt")
    b_inside, a_done, seen = threading.Event(), threading.Event(), {}

    def class_a():
        with checks_salted("salt-of-class-a"):
            b_inside.wait(10)
        a_done.set()

    def class_b():
        with checks_salted("salt-of-class-b"):
            b_inside.set()
            a_done.wait(10)
            seen["b"] = core.check_salt()
            seen["seed"] = core.seed_for("softmax")
        seen["after"] = core.check_salt()

    _all_finish([threading.Thread(target=class_a), threading.Thread(target=class_b)])
    assert seen["b"] == "salt-of-class-b"
    with checks_salted("salt-of-class-b"):
        assert seen["seed"] == core.seed_for("softmax")
    assert seen["after"] == "the-suites-salt" == core.check_salt()
