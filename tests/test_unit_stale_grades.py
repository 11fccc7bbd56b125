"""graded_by_other_tests: the saved grades made with another solution or other grading code than now, whose files a
run of another folder does not grade again (the late uploads after a hidden test was fixed)."""
from __future__ import annotations

import json

from autograder.grade import NotebookResult, Status, _solution_digest, graded_by_other_tests, judge_digest

A = "01_similarity_attention"


def _record(out, student, *, solution, judge=None, forced=False, status=Status.OK, fingerprint="f"):
    result = NotebookResult(student, A, 17.0, 17.0, status, source_file=f"{student}/{A}.ipynb (file time; in late)")
    payload = {"format": 0, "fingerprint": fingerprint, "content": "c", "result": result.to_dict(), "seen": [],
               "forced": forced, "judge": judge or judge_digest().hex(), "times": {}}
    if solution is not None:
        payload["solution"] = solution
    path = out / "students" / student / f"{A}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_grades_made_with_another_solution_or_code_are_listed_and_overrides_say_how(tmp_path):
    source = tmp_path / "course" / "source" / A / f"{A}.ipynb"
    source.parent.mkdir(parents=True)
    source.write_text("{}")
    now = _solution_digest(tmp_path / "course", A)
    _record(tmp_path, "current", solution=now)
    _record(tmp_path, "no_digest_yet", solution=None)  # saved before records held the solution's digest
    _record(tmp_path, "old_test", solution="0" * 64)
    _record(tmp_path, "old_code", solution=now, judge="another version of checks/")
    _record(tmp_path, "old_override", solution="0" * 64, forced=True)  # a reviewer: overrides were never listed
    _record(tmp_path, "missing", solution="0" * 64, status=Status.MISSING)
    _record(tmp_path, "incident", solution="0" * 64, fingerprint="")  # the grader's own failure: graded again anyway
    _record(tmp_path, "graded_now", solution="0" * 64)
    lines = graded_by_other_tests(tmp_path, [A], skip={("graded_now", A)})
    assert lines == [
        f"old_code {A}: old_code/{A}.ipynb (file time; in late)",
        f"old_override {A}: old_override/{A}.ipynb (file time; in late) (a grade set with --force: grade that folder "
        f"again with --force --student old_override --assignment {A})",
        f"old_test {A}: old_test/{A}.ipynb (file time; in late)"], lines
