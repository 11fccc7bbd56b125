"""Grade a class with nbgrader, one student at a time, each in its own process.

Layout of the output folder DIR:
    DIR/gradebook.db                 nbgrader's gradebook
    DIR/grades.csv                   student_id,notebook,score,max_score,status
    DIR/feedback/<student>/<assignment>.html   per-student feedback, hidden tests removed
    DIR/course/                      nbgrader's course directory (source, submitted, autograded, ...)
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from attention_course.build import SOLUTIONS, assignments as list_assignments, prepare_source_course, tool_env

from .submissions import StudentSubmission, collect

STUDENT_TIMEOUT_S = float(os.environ.get("ATTN_GRADE_TIMEOUT", 600))
CSV_COLUMNS = ["student_id", "notebook", "score", "max_score", "status"]


@dataclass
class CellResult:
    grade_id: str
    exercise: str
    score: float
    max_score: float
    message: str = ""


@dataclass
class NotebookResult:
    student_id: str
    notebook: str
    score: float
    max_score: float
    status: str = "ok"
    cells: list[CellResult] = field(default_factory=list)


# --------------------------------------------------------------------------- the course
class Course:
    """An nbgrader course directory whose gradebook knows every assignment."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.db_path = self.root.parent / "gradebook.db"
        self.db_url = f"sqlite:///{self.db_path}"

    def setup(self, solutions: Path = SOLUTIONS, only: list[str] | None = None) -> "Course":
        prepare_source_course(self.root, solutions, self.db_url, only)
        return self

    @property
    def assignments(self) -> list[str]:
        return list_assignments(self.root / "source")

    def release(self, assignment: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "release" / assignment / f"{assignment}.ipynb", as_version=4)

    def grade_ids(self) -> dict[str, set[str]]:
        return {a: {c.metadata.get("nbgrader", {}).get("grade_id", "") for c in self.release(a).cells} - {""}
                for a in self.assignments}

    def max_score(self, assignment: str) -> float:
        return float(sum(c.metadata["nbgrader"].get("points", 0) for c in self.release(assignment).cells
                         if c.metadata.get("nbgrader", {}).get("grade")))

    def nbgrader(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess:
        """nbgrader in its own process group, killed whole at the wall-clock limit."""
        proc = subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=self.root,
                                env=tool_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def exercise_of(test_id: str, graded: set[str]) -> str:
    """`test_<name>` or `test_<name>_<aspect>` -> `<name>` (the longest graded name that fits)."""
    name = test_id[5:] if test_id.startswith("test_") else test_id
    fits = [g for g in graded if name == g or name.startswith(g + "_")]
    return max(fits, key=len) if fits else name


def _error_message(cell) -> str:
    for out in cell.get("outputs", []):
        if out.output_type == "error":
            return re.sub(r"\x1b\[[0-9;]*m", "", f"{out.ename}: {out.evalue}")
        if out.output_type == "stream" and out.name == "stderr":
            return "wrote to stderr: " + out.text.strip()[-500:]
    return ""


def read_result(course: Course, student: str, assignment: str, status: str = "ok") -> NotebookResult:
    """Scores from the gradebook, messages from the autograded notebook."""
    from nbgrader.api import Gradebook, MissingEntry

    max_score = course.max_score(assignment)
    result = NotebookResult(student, assignment, 0.0, max_score, status)
    try:
        with Gradebook(course.db_url) as gb:
            nb = gb.find_submission_notebook(assignment, assignment, student)
            result.score = float(nb.score)
            grades = {g.name: (float(g.score), float(g.max_score)) for g in nb.grades}
    except MissingEntry:
        return result
    autograded = course.root / "autograded" / student / assignment / f"{assignment}.ipynb"
    cells = {}
    if autograded.exists():
        for c in nbformat.read(autograded, as_version=4).cells:
            gid = c.metadata.get("nbgrader", {}).get("grade_id")
            if gid:
                cells[gid] = c
    graded = {c.metadata["nbgrader"]["grade_id"] for c in course.release(assignment).cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    for gid, (score, top) in grades.items():
        message = _error_message(cells[gid]) if gid in cells else ""
        result.cells.append(CellResult(gid, exercise_of(gid, graded), score, top, message))
    return result


def grade_one(course: Course, sub: StudentSubmission, timeout: float = STUDENT_TIMEOUT_S) -> list[NotebookResult]:
    """Autograde every notebook of one student; a failure is reported, never raised."""
    results = []
    for assignment in course.assignments:
        if assignment not in sub.notebooks:
            results.append(NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                                          "missing: no notebook for this assignment was submitted"))
            continue
        problem = _unreadable(sub.notebooks[assignment])
        if problem:
            results.append(NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                                          f"unreadable notebook: {problem}"))
            continue
        target = course.root / "submitted" / sub.student_id / assignment
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        (target / f"{assignment}.ipynb").write_bytes(sub.notebooks[assignment])
        status = "ok"
        try:
            run = course.nbgrader("autograde", assignment, "--student", sub.student_id, "--force",
                                  timeout=timeout)
            if run.returncode != 0:
                status = "error: " + _nbgrader_reason(run.stdout + run.stderr)
        except subprocess.TimeoutExpired:
            status = f"timeout: grading took longer than {timeout:.0f} s"
        result = read_result(course, sub.student_id, assignment, status)
        if status == "ok":
            course.nbgrader("generate_feedback", assignment, "--student", sub.student_id, "--force",
                            timeout=timeout)
        results.append(result)
    return results


def _unreadable(data: bytes) -> str | None:
    """Why a submitted file is not a notebook nbgrader can read, or None."""
    try:
        nbformat.reads(data.decode("utf-8"), as_version=4)
    except UnicodeDecodeError:
        return "not UTF-8 text (is it really a .ipynb?)"
    except Exception as err:  # noqa: BLE001 - nbformat raises several kinds
        return f"not valid notebook JSON ({type(err).__name__}: {str(err)[:120]})"
    return None


def _nbgrader_reason(log: str) -> str:
    for pattern in (r"(\w+Error: [^\n]+)", r"\[AutogradeApp \| ERROR\] ([^\n]+)"):
        found = re.findall(pattern, log)
        if found:
            return found[-1][:300]
    return "nbgrader autograde failed"


# --------------------------------------------------------------------------- outputs
def write_csv(results: list[NotebookResult], path: Path) -> None:
    """Write atomically: a crash mid-write never leaves a half table behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", newline="", dir=path.parent, delete=False, suffix=".tmp") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
            writer.writerow([r.student_id, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status])
    os.replace(fh.name, path)


def collect_feedback(course: Course, out: Path) -> None:
    for html in (course.root / "feedback").glob("*/*/*.html"):
        student, assignment = html.parent.parent.name, html.parent.name
        target = out / "feedback" / student / f"{assignment}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(html, target)


def format_table(results: list[NotebookResult]) -> str:
    rows = [("student", "notebook", "score", "status")]
    for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
        rows.append((r.student_id, r.notebook, f"{r.score:g} / {r.max_score:g}", r.status))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        if k == 0:
            lines.append("-" * (sum(widths) + 12))
    return "\n".join(lines)


def grade(submissions: Path, out: Path, solutions: Path = SOLUTIONS, progress: bool = True) -> list[NotebookResult]:
    """Grade every student in SUBMISSIONS into OUT; returns one result per student and notebook."""
    from tqdm import tqdm

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    course = Course(out / "course").setup(solutions)
    students = collect(Path(submissions), course.grade_ids())
    results: list[NotebookResult] = []
    started = time.time()
    for sub in tqdm(students, desc="grading", unit="student", disable=not progress):
        student_results = grade_one(course, sub)
        for r in student_results:
            problems = [f"{k}: {v}" for k, v in sub.problems.items()]
            if problems and r.status == "ok":
                r.status = "ok (" + "; ".join(problems) + ")"
        results.extend(student_results)
        write_csv(results, out / "grades.csv")  # after every student: nothing is lost on interrupt
    collect_feedback(course, out)
    (out / "results.json").write_text(json.dumps(
        [r.__dict__ | {"cells": [c.__dict__ for c in r.cells]} for r in results], indent=1))
    if progress:
        print(f"graded {len(students)} students in {time.time() - started:.0f} s -> {out / 'grades.csv'}")
    return results
