"""`attn-course check NOTEBOOK`: grade one notebook the way the instructor will, and say per
exercise whether it passes, fails (and why), or has not been attempted yet."""
from __future__ import annotations

import tempfile
from collections import defaultdict
from pathlib import Path

import nbformat

from attention_course.build import SOLUTIONS, assignments

from .grade import Course, NotebookResult, grade_one
from .submissions import StudentSubmission, match_assignment


def _solution_sources(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def self_check(notebook: Path, solutions: Path = SOLUTIONS) -> tuple[NotebookResult, dict[str, str]]:
    """Grade `notebook`; returns the result and, per exercise, 'pass', 'fail' or 'not attempted'."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise FileNotFoundError(f"{notebook} does not exist: give the path of your .ipynb file")
    data = notebook.read_bytes()
    known = {a: set() for a in assignments(solutions)}
    assignment = match_assignment(notebook.name, data, known)
    if assignment is None:
        raise ValueError(f"{notebook.name} is not one of the course notebooks ({', '.join(known)}); "
                         "keep the file name you were given")
    with tempfile.TemporaryDirectory(prefix="attn-check-") as tmp:
        course = Course(Path(tmp) / "course").setup(solutions, only=[assignment])
        sub = StudentSubmission("me", {assignment: data})
        (result,) = grade_one(course, sub)
        stubs = _solution_sources(course.release(assignment))
    try:
        mine = _solution_sources(nbformat.reads(data.decode("utf-8"), as_version=4))
    except Exception:  # noqa: BLE001 - corrupt notebooks are reported by grade_one already
        mine = {}
    verdicts: dict[str, str] = {}
    by_exercise = defaultdict(list)
    for cell in result.cells:
        by_exercise[cell.exercise].append(cell)
    for exercise, cells in by_exercise.items():
        if exercise in stubs and mine.get(exercise, stubs[exercise]) == stubs[exercise]:
            verdicts[exercise] = "not attempted"
        elif all(c.score >= c.max_score for c in cells):
            verdicts[exercise] = "pass"
        else:
            verdicts[exercise] = "fail"
    return result, verdicts


def format_report(result: NotebookResult, verdicts: dict[str, str]) -> str:
    marks = {"pass": "PASS", "fail": "FAIL", "not attempted": "TODO"}
    lines = [f"{result.notebook}: {result.score:g} / {result.max_score:g} points"
             + ("" if result.status == "ok" else f"  [{result.status}]")]
    by_exercise = defaultdict(list)
    for cell in result.cells:
        by_exercise[cell.exercise].append(cell)
    width = max((len(e) for e in by_exercise), default=10)
    for exercise, cells in by_exercise.items():
        verdict = verdicts.get(exercise, "fail")
        score = sum(c.score for c in cells)
        top = sum(c.max_score for c in cells)
        lines.append(f"  {marks[verdict]}  {exercise.ljust(width)}  {score:g}/{top:g}")
        if verdict == "not attempted":
            lines.append("        not attempted yet: replace `raise NotImplementedError()` with your code")
            continue
        for c in cells:
            if c.score < c.max_score and c.message:
                text = c.message.replace("\n", "\n        ")
                lines.append(f"        {c.grade_id}: {text}")
    return "\n".join(lines)
