"""Grade a class with nbgrader, one student at a time, each in its own process.

Layout of the output folder DIR:
    DIR/gradebook.db                 nbgrader's gradebook
    DIR/grades.csv                   student_id,notebook,score,max_score,status
    DIR/feedback/<student>/<assignment>.html   per-student feedback, hidden tests removed
    DIR/course/                      nbgrader's course directory (source, submitted, autograded, ...)
"""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from attention_course.build import (
    LIBRARY, REPO, SOLUTIONS, assignments as list_assignments, extract_module, prepare_source_course,
)

from . import trusted
from .sandbox import Limits, World, _contains_needed, make_kit, run_notebook_job
from .submissions import StudentSubmission, collect, parse_notebook

# nbgrader's API, used in-process, trips SQLAlchemy's autoflush warnings on every call: noise.
warnings.filterwarnings("ignore", message=".*not in session.*")

# Settings for the grading course only: nbgrader runs nothing of the student's. Test cells get
# their verdicts from TrustedVerdicts (decided outside the student's process); deleted test
# cells are put back so they count as failed, not as missing.
GRADING_CONFIG = """
c.Autograde.autograde_preprocessors = [
    "autograder.plugins.TrustedVerdicts",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.OverwriteCells.add_missing_cells = True
"""
_KIT_LOCK = threading.Lock()
CSV_COLUMNS = ["student_id", "notebook", "score", "max_score", "status", "review", "sandbox"]


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
    review: str = ""  # code the honesty pass could not decide: for a human to look at
    sandbox: str = ""  # which sandbox ran the notebook (sandbox.isolation_mode)


# --------------------------------------------------------------------------- the course
class Course:
    """An nbgrader course directory whose gradebook knows every assignment."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.db_path = self.root.parent / "gradebook.db"
        self.db_url = f"sqlite:///{self.db_path}"
        self.extra_hidden: list[str] = []  # e.g. the submissions folder: hidden from every sandbox
        self._kit: str | None = None

    @property
    def kit(self) -> str:
        """The runner's modules, copied once per run (under a lock: workers share the course)."""
        with _KIT_LOCK:
            if self._kit is None:
                self._kit = make_kit(self.root.parent / "kit")
            return self._kit

    def setup(self, solutions: Path = SOLUTIONS, only: list[str] | None = None) -> "Course":
        prepare_source_course(self.root, solutions, self.db_url, only)
        config = self.root / "nbgrader_config.py"
        config.write_text(config.read_text() + GRADING_CONFIG)
        self.lock = threading.Lock()  # the gradebook is SQLite: one nbgrader writer at a time
        return self

    @property
    def api(self):
        """nbgrader's own Python API, in this process: no second startup per notebook."""
        if getattr(self, "_api", None) is None:
            from nbgrader.apps import NbGraderAPI
            from traitlets.config.loader import PyFileConfigLoader

            config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
            self._api = NbGraderAPI(config=config)
        return self._api

    def autograde_with_verdicts(self, assignment: str, student: str, verdicts: Path) -> str | None:
        """nbgrader autograde + generate_feedback for one notebook; None or the reason it failed."""
        with self.lock:
            os.environ["ATTN_VERDICTS"] = str(verdicts)
            try:
                done = self.api.autograde(assignment, student, force=True, create=True)
                if not done["success"]:
                    return _nbgrader_reason(done.get("error", "") + done.get("log", ""))
                done = self.api.generate_feedback(assignment, student, force=True)
                if not done["success"]:
                    return "feedback: " + _nbgrader_reason(done.get("error", "") + done.get("log", ""))
            finally:
                os.environ.pop("ATTN_VERDICTS", None)
        return None

    def source(self, assignment: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / "source" / assignment / f"{assignment}.ipynb", as_version=4)

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


def sandbox_world(course: Course, assignment: str, job: Path) -> World:
    """What the student's code may see: the student-facing library (minus this notebook's
    reference module) and the course's data, read-only; everything else of the course is absent
    (bubblewrap) or hidden (the namespaces fallback's deny-list)."""
    job.mkdir(parents=True, exist_ok=True)
    hide = [str(REPO / "solutions"), str(REPO / ".git"), str(REPO / "tests"), str(REPO / "build"),
            str(REPO / "autograder"), str(course.root.parent), str(LIBRARY / "__pycache__"),
            *course.extra_hidden, str(Path.home())]
    stubs = []
    exported = extract_module(course.root / "source" / assignment / f"{assignment}.ipynb")
    if exported:
        ref_stub = job / "reference_stub.py"
        ref_stub.write_text(f'raise ImportError("attention_course.{exported[0]} is the reference for this '
                            f'notebook: it is not available while your own code is graded")\n')
        stubs.append((str(ref_stub), str(LIBRARY / f"{exported[0]}.py")))
    readonly = [str(LIBRARY)] + [str(REPO / d) for d in ("data",) if (REPO / d).is_dir()]
    return World(readonly=readonly, stubs=stubs, hide=[p for p in hide if not _contains_needed(p)],
                 kit=course.kit)


def _load_submission(data: bytes) -> tuple[dict | None, str | None]:
    """The notebook as a dict, or why it cannot be graded (bounded: size, depth, cells, source)."""
    return parse_notebook(data)


def grade_notebook(course: Course, student: str, assignment: str, data: bytes,
                   limits: Limits | None = None) -> NotebookResult:
    """Run one notebook in the sandbox, judge it outside, record it in nbgrader's gradebook."""
    limits = limits or Limits()
    student_nb, problem = _load_submission(data)
    if problem:
        return NotebookResult(student, assignment, 0.0, course.max_score(assignment), f"unreadable notebook: {problem}")
    source = course.source(assignment)
    tests = trusted.test_cells(source)
    normalized = trusted.normalize_submission(student_nb, source)
    job = trusted.build_job(normalized, tests)
    folder = course.root.parent / "jobs" / f"{student}--{assignment}"  # the grader's own, never visible inside
    shutil.rmtree(folder, ignore_errors=True)
    world = sandbox_world(course, assignment, folder)
    run = run_notebook_job(folder, trusted.job_inputs(job, tests, limits.cell_seconds), world, limits)
    verdicts = trusted.judge_job(job, tests, run)
    verdict_file = folder / "verdicts.json"
    verdict_file.write_text(json.dumps({k: v.__dict__ for k, v in verdicts.items()}))
    status = trusted.incidents_status(run, job)

    target = course.root / "submitted" / student / assignment
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    nbformat.write(normalized, target / f"{assignment}.ipynb")
    failure = course.autograde_with_verdicts(assignment, student, verdict_file)
    if failure:
        status = "error: nbgrader: " + failure
    result = read_result(course, student, assignment, status)
    result.review, result.sandbox = trusted.review_notes(job), run.isolation
    for cell in result.cells:  # the trusted message, whatever nbgrader kept of it
        v = verdicts.get(cell.grade_id)
        if v and not v.passed:
            cell.message = v.message
    return result


def grade_one(course: Course, sub: StudentSubmission, limits: Limits | None = None) -> list[NotebookResult]:
    """Grade every notebook of one student; a failure is reported in `status`, never raised."""
    results = []
    for assignment in course.assignments:
        if assignment not in sub.notebooks:
            results.append(NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                                          "missing: no notebook for this assignment was submitted"))
            continue
        try:
            results.append(grade_notebook(course, sub.student_id, assignment, sub.notebooks[assignment], limits))
        except Exception as err:  # noqa: BLE001 - one student's disaster never stops the batch
            results.append(NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                                          f"error: the grader failed on this notebook ({type(err).__name__}: {err})"[:400]))
    return results


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
            writer.writerow([r.student_id, r.notebook, f"{r.score:g}", f"{r.max_score:g}", r.status, r.review, r.sandbox])
    os.replace(fh.name, path)


def collect_feedback(course: Course, out: Path) -> None:
    for html in (course.root / "feedback").glob("*/*/*.html"):
        student, assignment = html.parent.parent.name, html.parent.name
        target = out / "feedback" / student / f"{assignment}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(html, target)


def format_table(results: list[NotebookResult], hide_missing: bool = False) -> str:
    rows = [("student", "notebook", "score", "status")]
    for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
        if hide_missing and r.status.startswith("missing"):
            continue
        rows.append((r.student_id, r.notebook, f"{r.score:g} / {r.max_score:g}", r.status))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        if k == 0:
            lines.append("-" * (sum(widths) + 12))
    return "\n".join(lines)


def _fingerprint(sub: StudentSubmission, solutions: Path) -> str:
    h = hashlib.sha256()
    for a in sorted(sub.notebooks):
        h.update(a.encode() + b"\0" + hashlib.sha256(sub.notebooks[a]).digest())
    for nb in sorted(solutions.glob("*/*.ipynb")):
        h.update(nb.name.encode() + hashlib.sha256(nb.read_bytes()).digest())
    return h.hexdigest()


def _save_student(path: Path, fingerprint: str, results: list[NotebookResult]) -> None:
    payload = {"fingerprint": fingerprint,
               "results": [r.__dict__ | {"cells": [c.__dict__ for c in r.cells]} for r in results]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def _load_student(path: Path, fingerprint: str) -> list[NotebookResult] | None:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if payload.get("fingerprint") != fingerprint:
        return None
    return [NotebookResult(**{**r, "cells": [CellResult(**c) for c in r["cells"]]}) for r in payload["results"]]


def grade(submissions: Path, out: Path, solutions: Path = SOLUTIONS, progress: bool = True,
          workers: int | None = None, limits: Limits | None = None) -> list[NotebookResult]:
    """Grade every student in SUBMISSIONS into OUT, in parallel; one result per student and notebook.

    Resumable: each finished student is saved (atomically) with a fingerprint of their files and
    of the solutions; running the same command again after an interruption grades only the rest.
    """
    from tqdm import tqdm

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    course = Course(out / "course")
    if not (course.root / "source").is_dir() or not course.db_path.exists():
        course.setup(solutions)
    else:
        course.lock = threading.Lock()
    course.extra_hidden = [str(Path(submissions).resolve())]
    course.kit  # built once, before any worker starts a sandbox
    students = collect(Path(submissions), course.grade_ids())
    workers = workers or int(os.environ.get("ATTN_GRADE_WORKERS", 0)) or (os.cpu_count() or 1)
    done: dict[str, list[NotebookResult]] = {}
    csv_lock = threading.Lock()
    started = time.time()

    def one(sub: StudentSubmission) -> None:
        fingerprint = _fingerprint(sub, solutions)
        saved = out / "students" / f"{sub.student_id}.json"
        results = _load_student(saved, fingerprint)
        if results is None:
            results = grade_one(course, sub, limits)
            problems = [f"{k}: {v}" for k, v in sub.problems.items()]
            for r in results:
                if problems:
                    r.status = r.status + " (" + "; ".join(problems) + ")"
            _save_student(saved, fingerprint, results)
        with csv_lock:
            done[sub.student_id] = results
            write_csv([r for rs in done.values() for r in rs], out / "grades.csv")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(tqdm(pool.map(one, students), total=len(students), desc="grading", unit="student",
                  disable=not progress))
    results = [r for s in students for r in done[s.student_id]]
    write_csv(results, out / "grades.csv")
    collect_feedback(course, out)
    from .report import class_report

    class_report(results, out / "report.html")
    (out / "results.json").write_text(json.dumps(
        [r.__dict__ | {"cells": [c.__dict__ for c in r.cells]} for r in results], indent=1))
    if progress:
        print(f"graded {len(students)} students in {time.time() - started:.0f} s "
              f"({workers} in parallel) -> {out / 'grades.csv'}")
    return results
