"""Grade a class with nbgrader, one student at a time, each in its own process.

Layout of the output folder DIR:
    DIR/gradebook.db                 nbgrader's gradebook
    DIR/grades.csv                   student_id,notebook,score,max_score,...,status,...,notes (CSV_COLUMNS)
    DIR/feedback/<student>/<assignment>.html   per-student feedback, hidden tests removed
    DIR/course/                      nbgrader's course directory (source, submitted, autograded, ...)
"""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import itertools
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import textwrap
import threading
import time
import unicodedata
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any

import nbformat

from . import folder_lock, timings, trusted, warm_sandbox
from .checks.core import MODEL_LIBRARIES, THREAD_SALT
from .course import (
    CourseFolder,
    CourseNotFound,
    cache_root,
    hash_python_sources,
    is_course,
    library_dir,
    modules_from,
    package_dir,
    prepare_grading_course,
    prepared_courses_dir,
    settle_course_config,
    solutions_dir,
)
from .course import assignments as list_assignments
from .exports import safe_row
from .lateness import POLICY_FILE, LatePolicy, how_late, read_policy, write_policy
from .outcomes import (
    AS_HANDED_IN,
    BY_HAND,
    EXTENDED,
    GRADERS_OWN,
    KEPT_OVER_A_FAILURE,
    REFUSED,
    Status,
    Verdict,
    is_blank,
    plain_fields,
    status_from_text,
    status_text,
)
from .printable import printable
from .sandbox import (
    JobResult,
    SandboxUnavailable,
    World,
    _contains_needed,
    describe_sandbox,
    make_kit,
    require_reachable,
    require_strong_sandbox,
    run_notebook_job,
)
from .settings import GradingSettings, Limits
from .submissions import (
    TIMESTAMP_FILE,
    TOO_LARGE,
    StudentSubmission,
    collect_all,
    match_assignment,
    parse_notebook,
    student_id_for,
)

# Settings for the grading course only: nbgrader runs nothing of the student's. Test cells get
# their verdicts from TrustedVerdicts (decided outside the student's process); deleted test
# cells are put back so they count as failed, not as missing.
GRADING_CONFIG = (Path(__file__).resolve().parent / "nbgrader_grading_config.py").read_text()
_KIT_LOCK = threading.Lock()
CSV_COLUMNS = ["student_id", "notebook", "score", "max_score", "late_penalty", "submitted", "due", "seconds_late",
               "status", "review", "sandbox", "source_file", "notes"]
RECORD_FORMAT = 2  # saved runs: 2 = typed status, notes and mistakes as fields (1, unmarked: status as text)


@dataclass
class CellResult:
    grade_id: str
    exercise: str
    score: float
    max_score: float
    message: str = ""
    mistake: str = ""  # the catalogued mistake the verdict named ("" when none): the report counts these
    expected: str = ""  # the verdict's short summary of the expected value, where it had one
    received: str = ""  # ... and of the student's
    cause: str = ""  # what decided a failure (Verdict.cause: notimpl, value, error, ...): the report's "blank"
    extra_credit: float = 0.0  # given in formgrader, inside `score` (nbgrader's): the exports and the report show it apart
    by_hand: bool = False  # the score was typed in formgrader (nbgrader's manual score), not the grader's

    def earned(self) -> float:
        """The score without extra credit: what the test cell's own points measure."""
        return self.score - self.extra_credit

    def take_verdict(self, verdict: Verdict) -> None:
        """A failed verdict's fields on this cell (nbgrader keeps only the text)."""
        self.message, self.mistake = verdict.message, verdict.mistake
        self.expected, self.received, self.cause = verdict.expected, verdict.received, verdict.cause

    @classmethod
    def from_dict(cls, payload: Any) -> "CellResult":
        """A saved cell: the fields' types checked (ValueError otherwise); older ones lack the verdict's fields."""
        return cls(**plain_fields(cls, payload, required=("grade_id", "exercise", "score", "max_score")))


@dataclass
class NotebookResult:
    student_id: str
    notebook: str
    score: float
    max_score: float
    status: Status = Status.OK  # what happened to the notebook as a whole (a Status; "ok" is taken too)
    cells: list[CellResult] = field(default_factory=list)
    review: str = ""  # code the honesty pass could not decide: for a human to look at
    sandbox: str = ""  # which sandbox ran the notebook (sandbox.isolation_mode)
    late_penalty: float = 0.0  # points taken for lateness, by the class's policy (lateness.py), at export time
    timestamp: str = ""  # the submission time nbgrader recorded (UTC, ISO 8601)
    due: str = ""  # the due date in force for this student (extensions included; UTC, ISO 8601), "" when none
    seconds_late: float = 0.0  # after `due`, from the gradebook (0 on time or without a due date)
    source_file: str = ""  # the file graded, relative to the class folder, and where its time came from
    detail: str = ""  # the status in words: what happened, where (free text: shown, never parsed)
    notes: list[str] = field(default_factory=list)  # about the submission (a renamed id, a second copy): not the status
    other_kinds: list[Status] = field(default_factory=list)  # kinds of the incidents after the first (in `detail` too)
    not_yet: bool = False  # MISSING while its due date had not passed when the tables were made: no 0, not a problem

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a value such as "ok" is taken; free text is refused
        # free text that may quote a student's file names or messages: never a control sequence or an undecodable
        # byte (one file name not UTF-8 stopped every table of the class; another forged the console's table)
        self.detail, self.review, self.source_file = map(printable, (self.detail, self.review, self.source_file))
        self.notes = [printable(n) for n in self.notes]

    @property
    def status_text(self) -> str:
        """The status column of grades.csv: the kind, then the detail ('timeout: ...'), where a test that
        scored 0 for an incident has had its score set by hand since, saying so."""
        detail = self.detail
        for c in self.cells:
            if c.by_hand:  # the incident's words were written when the grader gave it 0
                detail = re.sub(rf"(the checks of {re.escape(c.grade_id)}: .*?)\(this test scored 0\)",
                                lambda m, c=c: f"{m.group(1)}(the grader scored it 0; {c.score:g} of {c.max_score:g} "
                                               f"{BY_HAND} since)", detail, count=1, flags=re.S)
        return status_text(self.status, detail)

    def not_due_yet(self) -> bool:
        """Missing while its due date has not passed (decided once, by `_missing_as_of`, when the tables
        were made): nothing is wrong yet (no 0, no problem)."""
        return self.status is Status.MISSING and self.not_yet

    def final_score(self) -> float:
        """The points handed on: the score less the late penalty, never below 0."""
        return max(self.score - self.late_penalty, 0.0)

    def held_back(self) -> bool:
        """No score to hand on (left empty in grades_wide.csv and every export, never a 0): the grader's
        own failure, or a notebook not due yet."""
        return self.status in GRADERS_OWN or self.not_due_yet()

    @property
    def kinds(self) -> list[Status]:
        """Every kind of trouble this notebook met, in order ([OK] when none)."""
        return [self.status, *self.other_kinds]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (saved runs, results.json)."""
        return self.__dict__ | {"status": self.status.value, "other_kinds": [k.value for k in self.other_kinds],
                                "cells": [c.__dict__ for c in self.cells]}

    @classmethod
    def from_dict(cls, payload: Any) -> "NotebookResult":
        """A saved result, its fields' types checked (ValueError otherwise). One saved by an older
        grader (status as text with the notes in it, cells without mistakes) is read as well."""
        fields_ = plain_fields(cls, payload, required=("student_id", "notebook", "score", "max_score"))
        status = fields_.get("status", Status.OK.value)
        if not isinstance(status, str):
            raise ValueError("NotebookResult.status: expected a str")
        if "detail" not in fields_:  # an older record: the whole status was one text
            status, fields_["detail"], fields_["notes"] = status_from_text(status)
        fields_["status"] = Status(status)
        fields_["notes"] = _strings(fields_.get("notes", []), "notes")
        fields_["other_kinds"] = [Status(k) for k in _strings(fields_.get("other_kinds", []), "other_kinds")]
        cells = fields_.get("cells", [])
        if not isinstance(cells, list):
            raise ValueError("NotebookResult.cells: expected a list")
        fields_["cells"] = [CellResult.from_dict(c) for c in cells]
        return cls(**fields_)


def _strings(value: Any, name: str) -> list[str]:
    """`value` when it is a list of str, else ValueError naming the field."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"NotebookResult.{name}: expected a list of str")
    return list(value)


# --------------------------------------------------------------------------- the course
def quiet_gradebook() -> None:
    """nbgrader's gradebook, used in-process (its API, a roster, due dates), trips SQLAlchemy's
    autoflush warnings ("... not in session ...") on a fresh database: noise between the progress
    bar's lines. Silenced once the grader uses the gradebook (not when this module is imported). So is
    nbformat's MissingIDFieldWarning, which nbgrader's feedback of a wrong notebook (another notebook handed
    in under this one's name) printed into the console: nothing for the instructor to do."""
    from nbformat.warnings import MissingIDFieldWarning

    warnings.filterwarnings("ignore", message=".*not in session.*")
    warnings.filterwarnings("ignore", category=MissingIDFieldWarning)


class Course:
    """An nbgrader course directory whose gradebook knows every assignment."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.db_path = self.root.parent / "gradebook.db"
        self.db_url = f"sqlite:///{self.db_path}"
        self.extra_hidden: list[str] = []  # e.g. the submissions folder: hidden from every sandbox
        self.folder: CourseFolder | None = None  # the checkout graded from (None: found from the current folder)
        self._kit: str | None = None
        self.library = library_dir()  # decided once: the copy judged against is the copy bound in every sandbox

    @property
    def kit(self) -> str:
        """The runner's modules, copied once per run (under a lock: workers share the course)."""
        with _KIT_LOCK:
            if self._kit is None:
                self._kit = make_kit(self.root.parent / "kit")
            return self._kit

    def setup(self, solutions: Path | None = None, only: list[str] | None = None) -> "Course":
        prepare_grading_course(self.root, self.db_path, solutions, only)
        config = self.root / "nbgrader_config.py"
        config.write_text(config.read_text() + GRADING_CONFIG)
        self.lock = threading.Lock()  # the gradebook is SQLite: one nbgrader writer at a time
        return self

    def settle(self) -> str | None:
        """Its nbgrader settings pointed at this place (a grading folder copied or moved still names the old
        one, and nbgrader would grade into that): a line saying so when they were, None when already here."""
        old = settle_course_config(self.root, self.db_url)
        if old is None:
            return None
        self._api = None
        if Path(old).resolve() == self.root.resolve():  # only the grader's own settings file moved (another checkout or venv)
            return (f"{self.root.parent}: its nbgrader settings were brought up to date (they name this grader's shared "
                    "settings and the course's own folders)")
        return (f"{self.root.parent} was graded as {Path(old).parent} before (copied or moved): its nbgrader settings "
                f"now name this folder, and nothing is read from or written to {Path(old).parent}")

    @property
    def api(self):
        """nbgrader's own Python API, in this process: no second startup per notebook."""
        if getattr(self, "_api", None) is None:
            from nbgrader.apps import NbGraderAPI
            from traitlets.config.loader import PyFileConfigLoader

            quiet_gradebook()

            config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
            self._api = NbGraderAPI(config=config)
        return self._api

    def autograde_with_verdicts(self, assignment: str, student: str, verdicts: Path) -> str | None:
        """nbgrader autograde + generate_feedback for one notebook; None or the reason it failed."""
        with self.lock, timings.phase(timings.NBGRADER):
            settings = self.api.config.TrustedVerdicts  # nbgrader's config, read by the preprocessor it makes
            settings.verdicts_file = str(verdicts)
            try:
                done = self.api.autograde(assignment, student, force=True, create=True)
                if not done["success"]:
                    return _nbgrader_reason(done.get("error", "") + done.get("log", ""))
                done = self.api.generate_feedback(assignment, student, force=True)
                if not done["success"]:
                    return "feedback: " + _nbgrader_reason(done.get("error", "") + done.get("log", ""))
            finally:
                settings.verdicts_file = ""
        return None

    def set_late_penalty(self, method: str) -> None:
        """The class's late policy (lateness.LatePolicy: none, zero, per-day:P), kept in the course for
        later runs and applied at export time. nbgrader's own plugin is set to "none": it would fix a
        penalty into the gradebook when a notebook is graded, and a later change of policy would not reach it."""
        policy = LatePolicy.parse(method)  # PolicyError names what is accepted
        write_policy(self.root, policy)
        config = self.root / "nbgrader_config.py"
        lines = [line for line in config.read_text().splitlines() if "LateSubmissionPlugin.penalty_method" not in line]
        lines.append('c.LateSubmissionPlugin.penalty_method = "none"  # the penalty is applied at export: see late-penalty')
        config.write_text("\n".join(lines) + "\n")
        self._api = None

    def late_policy(self) -> LatePolicy:
        """The policy in force: the course's late-penalty file, else a penalty method an instructor set by
        hand in the generated nbgrader_config.py ("none" or "zero"), else none."""
        if (self.root / POLICY_FILE).exists():
            return read_policy(self.root)
        config = self.root / "nbgrader_config.py"
        found = re.findall(r"LateSubmissionPlugin\.penalty_method\s*=\s*[\"'](\w+)[\"']",
                           config.read_text() if config.exists() else "")
        return LatePolicy.parse(found[-1]) if found and found[-1] in ("none", "zero") else LatePolicy()

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


def read_result(course: Course, student: str, assignment: str, status: Status = Status.OK,
                detail: str = "") -> NotebookResult:
    """Scores from the gradebook, messages from the autograded notebook."""
    from nbgrader.api import Gradebook, MissingEntry

    max_score = course.max_score(assignment)
    result = NotebookResult(student, assignment, 0.0, max_score, status, detail=detail)
    try:
        with Gradebook(course.db_url) as gb:
            nb = gb.find_submission_notebook(assignment, assignment, student)
            result.score = float(nb.score)
            grades = {g.name: (float(g.score), float(g.max_score), float(g.extra_credit or 0), g.manual_score is not None)
                      for g in nb.grades}
            result.notes = [_by_hand(g) for g in nb.grades if g.manual_score is not None or (g.extra_credit or 0) > 0]
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
    for gid, (score, top, extra, by_hand) in grades.items():
        message = _error_message(cells[gid]) if gid in cells else ""
        result.cells.append(CellResult(gid, exercise_of(gid, graded), score, top, message, extra_credit=extra,
                                       by_hand=by_hand))
    return result




def _by_hand(grade) -> str:
    """The note for one of nbgrader's grades a person set or added to in formgrader: the grader's own score beside
    it, since a manual score outlives every later grading of the notebook (a corrected resubmission's too)."""
    def pts(x) -> str:
        return f"{float(x or 0):g}"

    parts = []
    if grade.manual_score is not None:
        parts.append(f"{pts(grade.manual_score)} of {pts(grade.max_score)} (the grader's: {pts(grade.auto_score)})")
    if (grade.extra_credit or 0) > 0:
        parts.append(f"extra credit {pts(grade.extra_credit)}")
    return f"{BY_HAND} in formgrader: {grade.name} {', '.join(parts)}"


# The module that stands for an answer module in the sandbox: importing it is harmless (an unused import above a
# student's class cost the whole exercise, where the same line below it cost nothing: a fairness audit); reading any
# of its names is refused. Dunder names are left to Python's own lookups (hasattr, inspect), which expect
# AttributeError.
ANSWER_KEY_STUB = '''_WHY = ("attention_course.{module} holds the answers of this notebook or a later one: it is not available "
        "while your own code is graded")


def __getattr__(name):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    raise ImportError(f"{{name}} from {{_WHY}}")
'''


def sandbox_world(course: Course, assignment: str, job: Path) -> World:
    """What the student's code may see (see `world_for`), for a notebook of the grading course."""
    return world_for(course.root / "source" / assignment / f"{assignment}.ipynb", job, course.kit,
                     [str(course.root.parent), *course.extra_hidden], course.folder, course.library)


def _course_folder(solutions: Path | None = None) -> CourseFolder | None:
    """The checkout holding `solutions` when it is one, else the one found from the current folder."""
    if solutions is not None and is_course(Path(solutions).resolve().parent):
        return CourseFolder(Path(solutions).resolve().parent)
    try:
        return CourseFolder.find()
    except CourseNotFound:
        return None  # solutions given as a bare folder: bubblewrap's allow-list still holds


def never_seen(folder: CourseFolder | None, library: Path) -> list[str]:
    """What student code must never see, wherever things are installed: the private folders of the
    course graded and of the checkout the library comes from (an editable install), that course's
    own copy of the library when it is not the one imported (it holds every reference module), the
    grader and the tools as installed (the hidden checks), the model libraries (whole models that do
    the exercises), and the caches of prepared notebooks."""
    folders = [folder] if folder else []
    if is_course(library.parent) or (library.parent / ".git").exists():
        folders.append(CourseFolder(library.parent))
    hide = [p for f in folders for p in f.private]
    hide += [f.root / "attention_course" for f in folders if (f.root / "attention_course").resolve() != library]
    hide += [p for p in (package_dir("autograder"), package_dir("course_tools")) if p is not None]
    # ready-made models (transformers' eager_attention_forward does an exercise): no notebook needs them, and
    # absent, no renamed code object or exec'd copy of their source gets past the run-time guard
    hide += [p for p in map(package_dir, MODEL_LIBRARIES) if p is not None]
    hide += [library / "__pycache__", prepared_courses_dir(), cache_root()]
    return list(dict.fromkeys(str(p) for p in hide))


def world_for(source: Path, job: Path, kit: str, hidden: list[str], folder: CourseFolder | None = None,
              library: Path | None = None) -> World:
    """The student-facing library (the copy `library`, default the one this Python imports: what
    the grader judges against, bound at one fixed path inside, minus the modules this notebook and
    later ones export) and the course's data, read-only; everything else of the course is absent
    (bubblewrap) or hidden (the namespaces fallback's deny-list, which also covers `hidden`).
    `folder`: the course checkout (default: the one found from the current folder)."""
    job.mkdir(parents=True, exist_ok=True)
    folder = folder or _course_folder()
    library = Path(library or library_dir()).resolve()
    hide = [*never_seen(folder, library), *hidden, str(Path.home())]
    stubs = []
    for module in modules_from(source, *([folder.solutions] if folder else [])):
        stub = job / f"unavailable_{module.replace('.', '_')}.py"
        stub.write_text(ANSWER_KEY_STUB.format(module=module))
        stubs.append((str(stub), str(library / f"{module.replace('.', '/')}.py")))
    readonly = [str(folder.data)] if folder and folder.data.is_dir() else []
    root = folder.root if folder else None
    return World(readonly=readonly, stubs=stubs, hide=[p for p in hide if not _contains_needed(p, root, library)],
                 kit=kit, course_root=str(root or ""), library=str(library))


def verdicts_in_sandbox(source: Path, nb, hidden: list[str], limits: Limits | None = None) -> dict[str, dict]:
    """The trusted path for one notebook already in memory (nbgrader's own `autograde`, run
    without `attn-course grade`): sandboxed run, verdicts judged here. {grade_id: Verdict.to_dict()}."""
    source_nb = nbformat.read(source, as_version=4)
    tests = trusted.test_cells(source_nb)
    job = trusted.build_job(trusted.normalize_submission(nb, source_nb), tests)
    limits = limits or Limits()
    with tempfile.TemporaryDirectory(prefix="attn-autograde-") as tmp:
        folder = Path(tmp) / "job"
        world = world_for(source, folder, make_kit(Path(tmp) / "kit"), hidden)
        verdicts, _ = trusted.grade_job(job, tests, limits.cell_seconds,
                                        lambda inputs: run_notebook_job(folder, inputs, world, limits))
    return {k: v.to_dict() for k, v in verdicts.items()}


def _load_submission(data: bytes) -> tuple[dict | None, str | None]:
    """The notebook as a dict, or why it cannot be graded (bounded: size, depth, cells, source)."""
    return parse_notebook(data)


def grade_notebook(course: Course, student: str, assignment: str, data: bytes,
                   limits: Limits | None = None, timestamp: datetime | None = None, secret: str = "") -> NotebookResult:
    """Run one notebook in the sandbox, judge it outside, record it in nbgrader's gradebook."""
    limits = limits or Limits()
    student_nb, problem = _load_submission(data)
    if problem:  # nbgrader never sees it; its time is kept here (the row said when nothing, nor whether on time)
        return NotebookResult(student, assignment, 0.0, course.max_score(assignment), Status.UNREADABLE, detail=problem,
                              timestamp=_utc_text(timestamp))
    source = course.source(assignment)
    tests = trusted.test_cells(source)
    normalized = trusted.normalize_submission(student_nb, source)
    job = trusted.build_job(normalized, tests)
    job.wrong = trusted.wrong_notebook(student_nb, normalized, source, assignment)  # none of its answer cells
    folder = _job_folder(course, student, assignment)
    world = sandbox_world(course, assignment, folder)

    def in_sandbox(inputs: dict) -> JobResult:
        with timings.phase(timings.SANDBOX):
            return run_notebook_job(folder, inputs, world, limits, warm=warm_sandbox.current())

    with timings.phase(timings.TRUSTED):
        verdicts, run = trusted.grade_job(job, tests, limits.cell_seconds, in_sandbox)
    status, detail, others = trusted.incidents_status(run, job)
    judged = NotebookResult(student, assignment, 0.0, 0.0, status, detail=detail, other_kinds=others,
                            review=trusted.review_notes(job), sandbox=run.isolation)
    return record_verdicts(course, normalized, source, verdicts, judged, timestamp, folder, secret,
                           notes=trusted.submission_notes(student_nb, source))


def _job_folder(course: Course, student: str, assignment: str) -> Path:
    """The grader's own folder for one notebook (verdicts.json; never visible inside a sandbox), emptied."""
    folder = course.root.parent / "jobs" / f"{student}--{assignment}"
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def record_judged(course: Course, judged: NotebookResult, verdicts: dict[str, Verdict], data: bytes,
                  timestamp: datetime | None = None, secret: str = "") -> NotebookResult:
    """A notebook judged elsewhere (a Dask worker: autograder/cluster.py) into this course's gradebook:
    the worker's status, review and verdicts, nbgrader's scores. A notebook nothing was judged of (an
    unreadable file, a grader incident, a worker that died) comes back as it is."""
    if not verdicts and judged.status is not Status.OK:
        judged.max_score = course.max_score(judged.notebook)
        if judged.status is Status.UNREADABLE and not judged.timestamp:  # as a local run records it
            judged.timestamp = _utc_text(timestamp)
        return judged
    source = course.source(judged.notebook)
    student_nb, _ = _load_submission(data)
    normalized = trusted.normalize_submission(student_nb, source)
    folder = _job_folder(course, judged.student_id, judged.notebook)
    folder.mkdir(parents=True)
    return record_verdicts(course, normalized, source, verdicts, judged, timestamp, folder, secret,
                           notes=trusted.submission_notes(student_nb, source))


def record_verdicts(course: Course, normalized, source, verdicts: dict[str, Verdict], judged: NotebookResult,
                    timestamp: datetime | None, folder: Path, secret: str = "", notes: list[str] = ()) -> NotebookResult:
    """nbgrader's side of one judged notebook: the submission and its verdicts into the gradebook
    (autograde, feedback), then the result read back, with `judged`'s status, review and sandbox,
    the trusted messages on its cells, and `notes` on the submission's form (trusted.submission_notes)."""
    student, assignment = judged.student_id, judged.notebook
    verdict_file = folder / "verdicts.json"
    verdict_file.write_text(json.dumps({k: v.to_dict() for k, v in verdicts.items()}))
    target = course.root / "submitted" / student / assignment
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    nbformat.write(trusted.with_answer_cells(normalized, source), target / f"{assignment}.ipynb")
    if timestamp is not None:  # nbgrader's own file: autograde records it, AssignLatePenalties uses it
        (target / "timestamp.txt").write_text(timestamp.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    if secret:  # nbgrader's exchange: autograde and generate_feedback carry it to feedback/, release_feedback reads it
        (target / "submission_secret.txt").write_text(secret)
    status, detail, others = judged.status, judged.detail, judged.other_kinds
    failure = course.autograde_with_verdicts(assignment, student, verdict_file)
    if failure:
        status, detail, others = Status.ERROR, "nbgrader: " + failure, []
    result = read_result(course, student, assignment, status, detail)
    result.other_kinds = others
    result.review, result.sandbox = judged.review, judged.sandbox
    for cell in result.cells:  # the trusted message, whatever nbgrader kept of it
        v = verdicts.get(cell.grade_id)
        if v and not v.passed:
            cell.take_verdict(v)
        elif v and v.note and cell.score >= cell.max_score:
            cell.message = v.note  # passed, with something to know (a failed dependency was replaced)
    result.notes = [*result.notes, *notes, *refusal_notes(verdicts)]
    return result


def refusal_notes(verdicts: dict[str, Verdict]) -> list[str]:
    """One note per exercise refused for academic honesty (a built-in, a library or the course's reference did
    its work): grades.csv's notes and the report's attention list name it, not only the student's feedback."""
    found: dict[str, str] = {}
    for v in verdicts.values():
        if not v.passed and v.cause in ("forbidden", "forbidden-static"):
            graded, _, rest = v.message.partition(": not accepted, because ")
            if rest and graded not in found:
                why = textwrap.shorten(rest.split(";", 1)[0], 160, placeholder=" ...")  # at a word: "(w" was a cut
                found[graded] = f"{REFUSED}: {graded} ({why})"
    return list(found.values())


NOT_SUBMITTED = "no notebook for this assignment was submitted"  # the detail of a MISSING status
NOT_YET = "not handed in yet: due {due}"  # ... while its due date has not passed (no 0, not a problem)
STOPPING = ("\nstopping (Ctrl-C): no other notebook is started; the ones in their sandboxes now finish first, within "
            "their time limits (Ctrl-C again not to wait for their grades)")
INCIDENT_ADVICE = ("the grader's own problem, not the student's: not graded and not saved, so running the "
                   "same command again grades it; if it happens again, the README's 'How grading works' says what "
                   "each incident means")


def grade_one(course: Course, sub: StudentSubmission, limits: Limits | None = None,
              assignments: list[str] | None = None) -> list[NotebookResult]:
    """Grade every notebook of one student (or those of `assignments`); a failure is reported in
    `status`, never raised."""
    results = []
    for assignment in course.assignments if assignments is None else assignments:
        if assignment not in sub.notebooks:
            results.append(not_graded_here(course, sub, assignment))
            continue
        results.append(_grade_or_report(course, sub, assignment, limits))
    return results


def not_graded_here(course: Course, sub: StudentSubmission, assignment: str) -> NotebookResult:
    """The row of a notebook the intake holds no file of: perhaps handed in where the grader could not read (the
    grader's incident), a file of its name too large to read (unreadable: a fairness audit's correct notebook with a
    20 MiB picture was 'missing, nothing handed in', a 0 with no feedback), else missing."""
    top = course.max_score(assignment)
    if sub.unread:
        return NotebookResult(sub.student_id, assignment, 0.0, top, Status.INCIDENT, detail=_unread_detail(sub))
    too_large = next((f"{key}: {why}" for key, why in sub.problems.items()
                      if assignment in key and why.startswith(TOO_LARGE)), "")
    if too_large:
        return NotebookResult(sub.student_id, assignment, 0.0, top, Status.UNREADABLE, detail=too_large)
    return NotebookResult(sub.student_id, assignment, 0.0, top, Status.MISSING, detail=NOT_SUBMITTED)


def _utc_text(when: datetime | None) -> str:
    """A time as the tables write it ('2026-12-01T20:00:00Z'), '' for none."""
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if when else ""


def _dated_unreadable(r: NotebookResult, due: datetime | None) -> None:
    """An unreadable notebook's due date and lateness (no gradebook entry: nbgrader never saw it), from the time the
    intake found for it: whether a broken file was on time decides whether to take a fixed one after the due date."""
    r.due = _utc_text(due)
    if due and r.timestamp:
        handed = datetime.fromisoformat(r.timestamp.replace("Z", "+00:00"))
        r.seconds_late = max((handed - due).total_seconds(), 0.0)


def _own_due(due: datetime | None, extension_hours: float | None) -> datetime | None:
    """The class's due date moved by an extension waiting for the student's notebook (lateness.read_pending)."""
    return due + timedelta(hours=extension_hours) if due and extension_hours else due


def _missing_as_of(r: NotebookResult, due: datetime | None, now: datetime) -> None:
    """A missing notebook's due date, and its words: 'not handed in yet' while the due date has not passed
    (grading the early submissions made everyone else 'missing', with a 0 and exit status 1)."""
    r.due = due.isoformat().replace("+00:00", "Z") if due else ""
    r.not_yet = bool(due and due > now)
    r.detail = NOT_YET.format(due=r.due) if r.not_yet else NOT_SUBMITTED


def _unread_detail(sub: StudentSubmission) -> str:
    """Why a student's notebook may be there unseen: the files and folders of theirs the grader could not read."""
    paths = list(sub.unread)
    named = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    return (f"not graded: {named} {'was' if len(paths) == 1 else 'were'} there but {sub.unread[paths[0]]}; "
            f"the grader's own problem, not the student's (never a 0): make them readable to the account that "
            f"grades, then run the same command again")


GRADER_TRIES = 2  # a grader failure (an exception of ours, not the student's) is tried once more before it is reported


def tried_again(work: Callable[[], Any]) -> Any:
    """`work()`, done once more when it raises; its second exception is raised. SandboxUnavailable
    is raised at once: the sandbox has tried its own start already (START_ATTEMPTS)."""
    try:
        return work()
    except SandboxUnavailable:
        raise
    except Exception:  # noqa: BLE001 - the grader's own failure: once more (GRADER_TRIES in all)
        return work()


def _grade_or_report(course: Course, sub: StudentSubmission, assignment: str, limits: Limits | None) -> NotebookResult:
    """`grade_notebook`, with the grader's own failures tried again and then reported, never raised."""
    stamp = getattr(sub, "timestamps", {}).get(assignment)
    secret = getattr(sub, "secrets", {}).get(assignment, "")
    try:
        return tried_again(lambda: grade_notebook(course, sub.student_id, assignment, sub.notebooks[assignment],
                                                  limits, stamp, secret))
    except SandboxUnavailable as err:  # nothing of the student's ran: the grader's incident, never a grade
        return NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                              Status.INCIDENT, detail=f"{err}; {INCIDENT_ADVICE}")
    except Exception as err:  # noqa: BLE001 - one student's disaster never stops the batch
        detail = f"the grader failed on this notebook, {GRADER_TRIES} times ({type(err).__name__}: {err})"
        return NotebookResult(sub.student_id, assignment, 0.0, course.max_score(assignment),
                              Status.ERROR, detail=detail[:400 - len("error: ")])


def _nbgrader_reason(log: str) -> str:
    for pattern in (r"(\w+Error: [^\n]+)", r"\[AutogradeApp \| ERROR\] ([^\n]+)"):
        found = re.findall(pattern, log)
        if found:
            return found[-1][:300]
    return "nbgrader autograde failed"


# --------------------------------------------------------------------------- outputs
def write_csv(results: list[NotebookResult], path: Path) -> None:
    """Write atomically: a crash mid-write never leaves a half table behind. A notebook not handed in before its
    due date (`not_due_yet`: the class's, or an extension's) has an empty score and the status 'not handed in yet:
    due ...', not 'missing' (grades_wide.csv and the exports leave it empty too: never a 0)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", newline="", dir=path.parent, delete=False, suffix=".tmp") as fh:
        writer = csv.writer(fh)
        writer.writerow(safe_row(CSV_COLUMNS))
        for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
            waiting = r.not_due_yet()  # no score and not 'missing' before its due date: never a 0 (the wide CSV, exports)
            writer.writerow(safe_row([r.student_id, r.notebook, "" if waiting else f"{r.score:g}", f"{r.max_score:g}",
                                      f"{r.late_penalty:g}", r.timestamp, r.due, f"{r.seconds_late:.0f}",
                                      r.detail if waiting else r.status_text, r.review, r.sandbox,
                                      r.source_file, "; ".join([BLANK] * is_blank(r) + r.notes)]))
    os.chmod(fh.name, 0o644)  # readable by the group (NamedTemporaryFile makes 0600)
    os.replace(fh.name, path)


def collect_feedback(course: Course, out: Path) -> None:
    for html in (course.root / "feedback").glob("*/*/*.html"):
        student, assignment = html.parent.parent.name, html.parent.name
        target = out / "feedback" / student / f"{assignment}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(html, target)


BLANK = "blank: handed in, but no exercise attempted"


def format_table(results: list[NotebookResult], hide_missing: bool = False) -> str:
    rows = [("student", "notebook", "score", "status")]
    for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
        if hide_missing and r.status is Status.MISSING:
            continue
        notes = f" ({'; '.join(r.notes)})" if r.notes else ""
        score = f"- / {r.max_score:g}" if r.not_due_yet() else f"{r.score:g} / {r.max_score:g}"  # no 0 before it is due
        if r.late_penalty:
            score = f"{max(r.score - r.late_penalty, 0):g} / {r.max_score:g} ({r.score:g} - {r.late_penalty:g} late)"
        late = f"; {how_late(r.seconds_late)} (due {r.due})" if r.seconds_late > 0 else ""
        status = r.detail if r.not_due_yet() else r.status_text  # 'not handed in yet: due ...', as in grades.csv
        if is_blank(r):  # the report's "blank" too: handed in, but every exercise still the release's stub
            status = BLANK if status == Status.OK.value else f"{status}; {BLANK}"
        rows.append(tuple(map(printable, (r.student_id, r.notebook, score, status + late + notes))))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for k, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        if k == 0:
            lines.append("-" * (sum(widths) + 12))
    return "\n".join(lines)


def _fingerprint(sub: StudentSubmission, assignment: str, solutions: Path, salt: str = "", timed: bool = True) -> str:
    """What a saved result depends on: the notebook, its submission time (`timed`), the solution and the
    salt of the hidden inputs (hashed: the record never holds the secret)."""
    h = hashlib.sha256(assignment.encode() + b"\0" + hashlib.sha256(sub.notebooks.get(assignment, b"")).digest())
    h.update(hashlib.sha256(salt.encode()).digest())
    stamp = getattr(sub, "timestamps", {}).get(assignment)
    if timed:
        h.update(str(stamp).encode())
    h.update(_file_digest(solutions / assignment / f"{assignment}.ipynb"))
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def judge_digest() -> bytes:
    """sha256 of what decides a grade besides the notebooks: the grader's code (its checks, tolerances, honesty
    rules, sandbox) and the course library (the reference the checks compare with). A saved grade made by other
    code is made again (an instructor who loosened a tolerance in checks/ saw every grade reused as it was),
    unless it is an instructor's override (`_overridden`)."""
    import autograder

    h = hashlib.sha256()
    for top in (Path(autograder.__file__).parent, library_dir()):
        h.update(top.name.encode() + b"\0")
        hash_python_sources(h, top)
    return h.digest()


def _removed_before(course: Course, out: Path, ids: list[str], named: list[str]) -> list[str]:
    """The students of `ids` an instructor took out with remove-student (OUT/removed/<id>) and nobody brought
    back since (not in the gradebook: no roster and no --student named them): their files still in the class
    folder made them graded, and back in every export, on the next run."""
    from nbgrader.api import Gradebook

    gone = [i for i in ids if i not in named and (out / "removed" / i).is_dir()]
    if not gone:
        return []
    with Gradebook(course.db_url) as gb:
        enrolled = {s.id for s in gb.students}
    return sorted(i for i in gone if i not in enrolled)


def _refresh_changed_solutions(course: Course, solutions: Path) -> list[str]:
    """The grading course's copy of each solution notebook that differs from solutions/ (an instructor fixed
    a hidden test mid-term), made again with nbgrader from solutions/: the changed ones, by name. The saved
    grades depend on the solution too (`_fingerprint`), so their notebooks are graded again; before, they
    were, against the old copy, and the fix reached nobody."""
    changed = [a for a in course.assignments if (solutions / a / f"{a}.ipynb").is_file()
               and _file_digest(solutions / a / f"{a}.ipynb") != _file_digest(course.root / "source" / a / f"{a}.ipynb")]
    for a in changed:  # nbgrader refuses to add or remove a graded notebook's cells: said before anything is touched
        new, old = _graded_cells(solutions / a / f"{a}.ipynb"), _graded_cells(course.root / "source" / a / f"{a}.ipynb")
        if new != old:
            raise SolutionCellsChanged(
                f"{solutions / a / f'{a}.ipynb'} changed its graded cells since {course.root.parent} graded it "
                f"(new: {', '.join(sorted(new - old)) or 'none'}; gone: {', '.join(sorted(old - new)) or 'none'}): "
                "nbgrader cannot change the cells of a notebook it holds grades for. Grade the class into a new "
                "folder (--out), or put the cells back as they were; nothing was changed here")
    if changed:
        course.setup(solutions, only=changed)
        course._api = None  # nbgrader's settings are read again, with the grading lines setup wrote
    return changed


class SolutionCellsChanged(ValueError):
    """A solution notebook whose graded cells changed since the grading folder graded it: nbgrader cannot follow."""


def _graded_cells(path: Path) -> set[str]:
    """The grade ids of a notebook's nbgrader cells (answers, tests, written answers)."""
    return {c.metadata["nbgrader"].get("grade_id", "") for c in nbformat.read(path, as_version=4).cells
            if c.metadata.get("nbgrader", {}).get("grade") or c.metadata.get("nbgrader", {}).get("solution")}


def _file_digest(path: Path) -> bytes:
    """sha256 of a file (b"" when it is absent), read once per version of it: every notebook of a class
    fingerprints the same solution up to four times."""
    try:
        st = path.stat()
    except OSError:
        return b""
    return _digest_of(str(path), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _digest_of(path: str, mtime_ns: int, size: int) -> bytes:
    return hashlib.sha256(Path(path).read_bytes()).digest()


def _record_path(out: Path, student: str, assignment: str) -> Path:
    return out / "students" / student / f"{assignment}.json"


def _solution_digest(course_root: Path, assignment: str) -> str:
    """The digest of the grading course's copy of a solution (hidden tests, points): what a grade was made with."""
    return _file_digest(course_root / "source" / assignment / f"{assignment}.ipynb").hex()


def graded_by_other_tests(out: Path, assignments: Iterable[str], skip: Iterable[tuple[str, str]] = ()) -> list[str]:
    """'<student> <notebook>: <file graded>' for each saved grade made with other hidden tests (a solution changed
    since) or other grading code than now, and not in `skip` (graded now). A run regrades the notebooks of its own
    folder only: a late upload graded from week1-late/ kept its grade from the old test, and export sent it."""
    judge, skip = judge_digest().hex(), set(skip)
    lines = []
    for assignment in assignments:
        current = _solution_digest(out / "course", assignment)
        for path in sorted((out / "students").glob(f"*/{assignment}.json")):
            payload = _payload(path)
            if (path.parent.name, assignment) in skip or not payload.get("fingerprint"):
                continue  # graded now, or the grader's own failure (graded again anyway)
            result = _saved_result(payload)
            solution = payload.get("solution")
            if result is None or result.status is Status.MISSING or (
                    payload.get("judge") == judge and (not isinstance(solution, str) or solution == current)):
                continue
            override = (f" (a grade set with --force: grade that folder again with --force --student {path.parent.name} "
                        f"--assignment {assignment})" if payload.get("forced") is True else "")
            lines.append(f"{path.parent.name} {assignment}: {result.source_file or 'its notebook'}{override}")
    return lines


def _save_result(path: Path, fingerprint: str, result: NotebookResult, content: str = "", forced: bool = False,
                 hand_ins: dict[str, str] | None = None, solution: str = "") -> None:
    """The record of one graded notebook. It also keeps the contents graded for this student and notebook
    before (`seen`) and whether this grade is an instructor's override (`forced`: --force --student
    --assignment), so a later plain run never grades again, over the override, a file it graded before; and
    the digest of the code that judged it (`judge_digest`): a grade saved by other code is made again."""
    earlier = _payload(path)
    before = [*earlier.get("seen", []), earlier.get("content", "") if earlier.get("fingerprint") else ""]
    seen = [c for c in dict.fromkeys(before) if isinstance(c, str) and c and c != content]
    payload = {"format": RECORD_FORMAT, "fingerprint": fingerprint, "content": content, "result": result.to_dict(),
               "seen": seen, "forced": forced, "judge": judge_digest().hex(), "solution": solution,
               "times": _earliest(earlier.get("times"), hand_ins or {})}
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_record(path, payload)


def _earliest(*maps) -> dict[str, str]:
    """Notebook digest -> the earliest of the ISO times the maps give it (records' `times`)."""
    merged: dict[str, str] = {}
    for found in maps:
        for digest, when in (found.items() if isinstance(found, dict) else ()):
            if isinstance(digest, str) and isinstance(when, str) and (digest not in merged or
                                                                       _utc_iso(when) < _utc_iso(merged[digest])):
                merged[digest] = when
    return merged


def _utc_iso(when: str) -> datetime:
    try:
        moment = datetime.fromisoformat(when)
    except (TypeError, ValueError):  # a damaged record: no time, never a stopped run
        return datetime.max.replace(tzinfo=timezone.utc)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _remember_hand_ins(path: Path, payload: dict[str, Any], hand_ins: dict[str, str]) -> None:
    """The times of the notebooks found for a grade that is kept as it is (reused, or kept over an older file)
    into its record (`payload`, read from `path`), so a later copy of the folder is timed by them too."""
    if not payload or not hand_ins:
        return
    merged = _earliest(payload.get("times"), hand_ins)
    if merged != payload.get("times"):
        payload["times"] = merged
        _write_record(path, payload)


def known_times(out: Path) -> Callable[[str, str], dict[str, datetime]]:
    """`collect_all`'s `known`: for a student and notebook, the times earlier runs into `out` saw their notebooks
    at (by digest), from the grade's record."""
    def known(student: str, assignment: str) -> dict[str, datetime]:
        times = _payload(_record_path(out, student, assignment)).get("times")
        return {d: _utc_iso(w) for d, w in _earliest(times).items()}  # _earliest keeps only strings
    return known


def _write_record(path: Path, payload: dict[str, Any]) -> None:
    """A record written whole or not at all (a run stopped mid-write leaves the old one)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def _payload(path: Path) -> dict[str, Any]:
    """A saved record as it is on disk ({} when absent or damaged)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return payload if isinstance(payload, dict) else {}


def _overridden(payload: dict[str, Any], content: str) -> bool:
    """Whether the saved grade (a record's `_payload`) is an instructor's override (--force --student
    --assignment) and `content` (a notebook's untimed fingerprint) was graded for this student and notebook before it."""
    seen = payload.get("seen", [])
    forced = payload.get("forced") is True and bool(payload.get("fingerprint"))  # a grade, not the grader's failure
    return bool(content) and forced and isinstance(seen, list) and content in seen


def _print_listed(title: str, lines: list[str]) -> None:
    """A titled, sorted list of the run's console lines (nothing when there are none)."""
    if lines:
        print(title)
        for line in sorted(lines):
            print(printable(f"  {line}"))


def _results_before(course: Course, out: Path) -> dict[tuple[str, str], NotebookResult]:
    """The grades before this run, by (student, notebook): OUT's tables (results.json) for where each came from,
    with the gradebook's score now, which holds the scores typed in formgrader since; none when unreadable."""
    try:
        rows = json.loads((out / "results.json").read_text())
        earlier = {(r.student_id, r.notebook): r for r in map(NotebookResult.from_dict, rows)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}
    for key, score in _gradebook_scores(course).items():
        if key in earlier:
            earlier[key].score = score
    return earlier


def _gradebook_scores(course: Course) -> dict[tuple[str, str], float]:
    """Every submitted notebook's score in the gradebook (manual scores and extra credit included), by
    (student, notebook); none when there is no gradebook yet."""
    from nbgrader.api import Gradebook, SubmittedNotebook

    if not course.db_path.exists():
        return {}
    with Gradebook(course.db_url) as gb:
        return {(nb.student.id, nb.name): float(nb.score) for nb in gb.db.query(SubmittedNotebook)}


def _lower_than_before(before: dict, results: list[NotebookResult], now: set, out: Path) -> list[str]:
    """For each notebook graded now from another file than its earlier grade's, whose final score (late penalty
    taken) is lower: the line that says so, both scores and where each file came from."""
    lines = []
    for r in results:
        old = before.get((r.student_id, r.notebook))
        if (r.student_id, r.notebook) not in now or old is None or old.status is Status.MISSING:
            continue
        if old.source_file == r.source_file and old.timestamp == r.timestamp:
            continue  # the same hand-in, graded again
        if r.final_score() < old.final_score() - 1e-9:
            late = f", {r.late_penalty:g} taken for lateness" if r.late_penalty else ""
            lines.append(f"{r.student_id} {r.notebook}: {old.final_score():g} -> {r.final_score():g}{late}; now "
                         f"{r.source_file or 'a newer file'}, before {old.source_file or 'an earlier file'}")
    return lines


def _commented_by_hand(course: Course, now: set[tuple[str, str]]) -> list[str]:
    """'student notebook: cell' for each comment typed in formgrader on a notebook graded in this run."""
    if not now:
        return []
    from nbgrader.api import Gradebook, MissingEntry

    found = []
    with Gradebook(course.db_url) as gb:
        for student, notebook in sorted(now):
            try:
                submitted = gb.find_submission_notebook(notebook, notebook, student)
            except MissingEntry:
                continue
            found += [f"{student} {notebook}: {c.name}" for c in submitted.comments if (c.manual_comment or "").strip()]
    return found


def _keep_earlier_time(sub: StudentSubmission, assignment: str, when: datetime | None | str) -> None:
    """The gradebook's submission time (`when`) for the very notebook graded before, when it is earlier than
    this folder's: `--force` on a new download of the class (every file dated the day of the download)
    once made every regraded student late."""
    if not isinstance(when, datetime):
        return
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    now = sub.timestamps.get(assignment)
    if now is None or when < now:
        sub.timestamps[assignment] = when


def _held_line(sub: StudentSubmission, assignment: str) -> str:
    """The console line of a file not graded again because an instructor's override replaced its grade."""
    where = sub.origins.get(assignment, "") or "the file here"
    return (f"{sub.student_id} {assignment}: {where} was graded before the grade set since with --force --student "
            f"{sub.student_id} --assignment {assignment}, which is kept; to grade this file instead, run again "
            f"with --force --student {sub.student_id} --assignment {assignment} on this folder")


def _load_result(path: Path, fingerprint: str | None = None, content: str | None = None) -> NotebookResult | None:
    """A saved result (any, or only one made from the same files when `fingerprint` is given, or from the
    same notebook at whatever time when `content` is); None when absent or damaged. One saved by an older
    grader is read for the tables, but not reused in place of grading: grading again fills in its mistakes."""
    return _saved_result(_payload(path), fingerprint, content)


def _saved_result(payload: dict[str, Any], fingerprint: str | None = None,
                  content: str | None = None) -> NotebookResult | None:
    """`_load_result` of a record already read (`_payload`): a run reads each notebook's record once."""
    if fingerprint is not None and (payload.get("fingerprint") != fingerprint or payload.get("format") != RECORD_FORMAT):
        return None
    if content is not None and (not content or payload.get("content") != content
                                or payload.get("format") != RECORD_FORMAT or not payload.get("fingerprint")):
        return None
    try:
        return NotebookResult.from_dict(payload["result"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


SEED_FILE = "check-seed"  # beside the gradebook: the class's secret salt for the hidden inputs (0600)


def class_salt(out: Path) -> str:
    """The salt the hidden inputs are drawn with for the class graded into `out`: ATTN_CHECK_SEED
    when set (tests, a chosen term), else a secret drawn on the first run and kept beside the
    gradebook (readable by the grader only), so a regrade draws the same inputs and nobody can
    compute them from the public repository beforehand."""
    if os.environ.get("ATTN_CHECK_SEED"):
        return os.environ["ATTN_CHECK_SEED"]
    path = Path(out) / SEED_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        salt = path.read_text().strip()
        if not salt:
            raise ValueError(f"{path} is empty: delete it to draw a new secret seed (saved grades are then regraded)") from None
        return salt
    salt = secrets.token_hex(16)
    with os.fdopen(fd, "w") as fh:
        fh.write(salt + "\n")
    return salt


@contextmanager
def checks_salted(salt: str):
    """The hidden inputs are drawn with `salt` in this thread while the block grades, whatever other
    threads (another class's tasks on a Dask worker) use meanwhile; ATTN_CHECK_SEED is not touched.
    A thread the block starts does not inherit it: each grading thread enters its own."""
    token = THREAD_SALT.set(salt)
    try:
        yield
    finally:
        THREAD_SALT.reset(token)


def due_dates(course: Course) -> dict[str, datetime]:
    """The due dates the gradebook keeps (given with --due in an earlier run), aware UTC: a later run reads
    a platform's late mark against them as the first run did, so an unchanged file keeps its time."""
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        return {a.name: a.duedate.replace(tzinfo=timezone.utc) for a in gb.assignments if a.duedate is not None}


def set_due_dates(course: Course, due: dict[str, datetime]) -> None:
    """Due dates into nbgrader's gradebook (naive UTC, as nbgrader stores them)."""
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        for assignment, when in due.items():
            gb.update_or_create_assignment(assignment, duedate=when.astimezone(timezone.utc).replace(tzinfo=None))


ROSTER_IDS = "roster-ids.json"  # in the grading course: the ids of the last roster given (who is "on the roster")
ROSTER_COLUMNS = ("id", "first_name", "last_name", "email")
NOT_ON_ROSTER = ("not on the roster: graded all the same; add them to the roster CSV (then --roster again), "
                 "or check whose folder or file this is")


class RosterError(ValueError):
    """A roster the grader cannot take as it is: the message names the file, the line and what to do."""


def read_roster(roster: Path) -> list[dict[str, str]]:
    """The students of a roster CSV: a header row with an `id` column (any case; optional first_name,
    last_name, email), then one line per student; commas, semicolons or tabs between the fields.
    RosterError names the line of an empty or repeated id, or a header without `id`."""
    roster = Path(roster)
    try:
        text = roster.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise RosterError(f"{roster} is not a readable CSV file ({err}): save it as UTF-8 CSV") from None
    try:
        dialect = csv.Sniffer().sniff(text.split("\n", 1)[0] or ",", delimiters=",;\t")
    except csv.Error:
        dialect = csv.excel  # one column, or nothing to tell: commas
    try:  # lines end at CR/LF only (str.splitlines also broke them at U+2028 and the like, inside quotes too:
        # a student's name from the LMS could add a roster row of its own)
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=dialect.delimiter)
        numbered = [(reader.line_num, fields) for fields in reader]
    except csv.Error as err:
        raise RosterError(f"{roster} is not a readable CSV file ({err})") from None
    lines = [fields for _, fields in numbered]
    header = [c.strip() for c in lines[0]] if lines else []
    columns = [c.lower() for c in header]
    if "id" not in columns:
        found = ", ".join(h for h in header if h) or "no header"
        raise RosterError(f"{roster} needs a header row with an 'id' column (found: {found}) on line 1; name the column "
                          f"of student ids 'id' (the name of each student's folder or zip), e.g. "
                          f"id,first_name,last_name,email")
    where = {name: columns.index(name) for name in ROSTER_COLUMNS if name in columns}
    students, first_seen = [], {}
    for number, fields in numbered[1:]:
        if not any(f.strip() for f in fields):
            continue  # a blank line
        row = {name: (fields[k].strip() if k < len(fields) else "") for name, k in where.items()}
        odd = next((c for f in row.values() for c in f if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
        if odd is not None:  # in a column read (an address or notes column may hold line breaks of its own)
            raise RosterError(f"{roster}: line {number} holds a control character or line break inside a field "
                              f"(U+{ord(odd):04X}, in {dialect.delimiter.join(fields)!r}): remove it, one student "
                              f"per line")
        sid = row["id"]
        if not sid:
            raise RosterError(f"{roster}: line {number} has no student id ({dialect.delimiter.join(fields)!r}): "
                              f"fill in its 'id' column or delete the line")
        raw, sid = sid, student_id_for(sid)  # cleaned up as a folder of that name is ('alice+cs' -> 'alice_cs')
        row["id"] = sid
        if sid in first_seen:
            first, written = first_seen[sid]
            read = "" if raw == written == sid else f" ({written!r} on line {first} and {raw!r} here both read as it)"
            raise RosterError(f"{roster}: line {number} repeats student id {sid!r}{read} (first on line {first}): "
                              f"keep one line per student")
        first_seen[sid] = (number, raw)
        students.append(row)
    return students


def import_roster(course: Course, roster: Path) -> list[str]:
    """Students from a roster CSV (see read_roster) into the gradebook, so a student who submits
    nothing still has a row; their ids are kept in the course: a student graded later who is not
    among them is flagged "not on the roster" (and graded all the same)."""
    from nbgrader.api import Gradebook

    rows = read_roster(roster)
    ids = []
    with Gradebook(course.db_url) as gb:
        for row in rows:
            extra = {k: row[k] for k in ("first_name", "last_name", "email") if row.get(k)}
            gb.update_or_create_student(row["id"], **extra)
            ids.append(row["id"])
    (course.root / ROSTER_IDS).write_text(json.dumps(ids))
    return ids


def differ_in_case(ids: Iterable[str], roster_ids: set[str] | None) -> dict[str, str]:
    """{student id not on the roster: the roster id(s) it differs from only in case} ('Alice' -> 'alice'): never
    merged (a grade under the wrong id is worse than a clear message), only named."""
    folded: dict[str, list[str]] = {}
    for rid in sorted(roster_ids or ()):
        folded.setdefault(rid.casefold(), []).append(rid)
    return {sid: " or ".join(repr(rid) for rid in folded[sid.casefold()]) for sid in ids
            if roster_ids is not None and sid not in roster_ids and sid.casefold() in folded}


def case_note(twin: str) -> str:
    """The note (grades.csv's notes, the report) on a student id that differs from roster id(s) `twin` only in case."""
    return (f"the roster has {twin}, which differs from this id only in case: ids are exact, so these are two "
            f"students here (not merged); if this is their work, rename the folder or file to the roster's id (or "
            f"correct the roster's id) and grade again")


def read_roster_ids(course: Course) -> set[str] | None:
    """The ids of the last roster given to this class (None when none was)."""
    try:
        ids = json.loads((course.root / ROSTER_IDS).read_text())
    except (OSError, ValueError):
        return None
    return {i for i in ids if isinstance(i, str)} if isinstance(ids, list) else None


@dataclass
class InPlay:
    """The notebooks a run grades and why each is in play; those handed in here that are not."""

    chosen: list[str]
    reasons: dict[str, list[str]]  # in play -> why
    named: bool  # chosen with --assignment
    stray: dict[str, str] = field(default_factory=dict)  # handed in here, not in play -> why not

    def describe(self) -> str:
        """The console line: each notebook in play and why."""
        if not self.chosen:
            return "in play: nothing (no notebook of this course was handed in, named or given a due date)"
        parts = [f"{a} ({'; '.join(self.reasons.get(a, []))})" for a in self.chosen]
        return "in play: " + ", ".join(parts)

    def left_out(self, subs: list[StudentSubmission]) -> list[tuple[str, str]]:
        """(file, why) for each notebook handed in by `subs` that this run does not grade."""
        rows = []
        for sub in subs:
            for assignment in sub.notebooks:
                if assignment in self.chosen:
                    continue
                where = (sub.origins.get(assignment, "") or f"{sub.student_id}'s {assignment}").rsplit(" (", 1)[0]
                if self.named:
                    why = (f"{assignment} of {sub.student_id}: this run grades only {', '.join(self.chosen)} "
                           f"(--assignment); run again with --assignment {assignment} to grade it")
                else:
                    why = f"{assignment} of {sub.student_id}: {self.stray.get(assignment, 'not in play')}"
                rows.append((where, why))
        return sorted(rows)


def choose_in_play(course: Course, everyone: list[StudentSubmission], named: list[str] | None,
                   now: datetime | None = None) -> InPlay:
    """What a run grades: the notebooks named (`--assignment`), else those in play for the class (due
    by now, graded in an earlier run), those handed in by at least two students and a quarter of the class
    (the gradebook's students, a roster's included, and this folder's), and, when nothing else is in play
    (a first run without due dates), this folder's most handed-in notebook. A notebook fewer students
    handed in (one student's stray copy of next week's notebook), not yet due and never graded, is not
    put in play: it would make everyone else "missing" it and add a column of zeros to every export. It is
    listed as not graded, with how to grade it. A due date still to come puts nothing in play by itself
    (a term's due-date file given in week 1)."""
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        due = {a.name: a.duedate for a in gb.assignments if a.duedate is not None}
        handed_in = {a.name for a in gb.assignments if a.submissions}
        known = {st.id for st in gb.students}  # the roster and earlier runs' students
    counts: dict[str, int] = {}
    for sub in everyone:
        for a in sub.notebooks:
            counts[a] = counts.get(a, 0) + 1
    total = len(everyone)
    size = len(known | {sub.student_id for sub in everyone})  # the class as far as the gradebook knows it
    reasons: dict[str, list[str]] = {}

    def why(a: str, text: str) -> None:
        reasons.setdefault(a, []).append(text)

    now = now or datetime.now(timezone.utc)
    for a in named or ():
        why(a, "named with --assignment")
    for a, when in due.items():
        if when.replace(tzinfo=timezone.utc) <= now:
            why(a, f"due {when:%Y-%m-%d %H:%M} UTC")
    for a in handed_in:
        why(a, "graded in an earlier run")
    stray = {}
    first = not reasons  # nothing named, due or graded yet: this folder decides
    most = max(counts.values(), default=0)
    for a, n in counts.items():
        if a in reasons or (n >= 2 and 4 * n >= size) or (first and n == most):
            why(a, f"handed in by {n} of {total} students here")
        else:
            coming = f"due {due[a]:%Y-%m-%d %H:%M} UTC, not yet" if a in due else "with no due date"
            stray[a] = (f"not in play: handed in by only {n} of the {size} students of the class ({n} of {total} "
                        f"here), {coming} and never graded before, so it is not graded (it would make everyone "
                        f"else 'missing' it); to grade it, name it (--assignment {a})"
                        + ("" if a in due else f" or give it a due date that has passed (--due {a}=DATE)"))
    if named:
        chosen = list(named)
    else:
        chosen = [a for a in course.assignments if a in reasons]
    return InPlay(chosen, {a: reasons[a] for a in chosen}, bool(named), stray)


def in_play(course: Course, chosen: list[str] | None = None, submitted: set[str] | frozenset = frozenset()) -> list[str]:
    """The assignments that count for the class, in course order: those due by now, those anyone
    submitted (now or in an earlier run), and those asked for (`chosen`). A notebook not handed out
    yet, or not due yet and handed in by nobody, is in none of these: nobody is "missing" it and it is
    not in anyone's total."""
    from nbgrader.api import Gradebook

    now = datetime.now(timezone.utc).replace(tzinfo=None)  # the gradebook's due dates: naive UTC
    with Gradebook(course.db_url) as gb:
        due = {a.name for a in gb.assignments if a.duedate is not None and a.duedate <= now}
        handed_in = {a.name for a in gb.assignments if a.submissions}
    wanted = due | handed_in | set(chosen or ()) | set(submitted)
    return [a for a in course.assignments if a in wanted]


@dataclass
class _Lateness:
    submitted: str  # ISO 8601, UTC
    due: str  # ISO 8601, UTC ("" when none)
    seconds_late: float
    recorded_penalty: float  # what the gradebook holds now


def _lateness(gb, assignment: str, student: str) -> _Lateness | None:
    from nbgrader.api import MissingEntry

    try:
        sub = gb.find_submission(assignment, student)
    except MissingEntry:
        return None
    due = sub.duedate
    notebook = next((nb for nb in sub.notebooks if nb.name == assignment), None)
    return _Lateness(sub.timestamp.isoformat() + "Z" if sub.timestamp else "", due.isoformat() + "Z" if due else "",
                     float(sub.total_seconds_late or 0.0),
                     float(notebook.late_submission_penalty or 0.0) if notebook is not None else 0.0)


def _extension_notes(r: NotebookResult, class_due: datetime | None) -> list[str]:
    """`r.notes` where the student's own due date (an extension) is later than the class's: a note saying so
    (grades.csv and the report said nothing of it: two instructors' first weeks), and a platform's late mark
    (Canvas's _LATE_) beside no lateness says it was on time all the same."""
    own = _utc_iso(r.due) if r.due else None
    if own is None or class_due is None or own <= class_due or own.year == datetime.max.year:  # none, or unreadable
        return r.notes
    notes = [n for n in r.notes if not n.startswith(EXTENDED + ": ")]
    if r.seconds_late <= 0:
        said = f"; on time all the same: their own due date (an extension) is {own:%Y-%m-%d %H:%M} UTC"
        notes = [n + said if n.startswith(f"{r.notebook} (late): ") and not n.endswith(said) else n for n in notes]
    return [*notes, f"{EXTENDED}: due {own:%Y-%m-%d %H:%M} UTC (the class's: {class_due:%Y-%m-%d %H:%M} UTC)"]


def class_results(course: Course, out: Path, assignments: list[str] | None = None) -> list[NotebookResult]:
    """Every student the gradebook knows × every assignment in play (`assignments`, default
    `in_play`): scores (manual overrides included) from the gradebook, lateness from it too, the
    late penalty by the policy in force now, status and messages from the saved runs. The one
    source of grades.csv, the wide CSV and the report, whatever this run graded. A penalty that
    differs from the one the gradebook holds (the policy changed) is written back, and that
    notebook's feedback page made again, so formgrader and the feedback say the same."""
    from nbgrader.api import Gradebook

    assignments = in_play(course) if assignments is None else assignments
    policy = course.late_policy()
    with Gradebook(course.db_url) as gb:
        students = sorted(s.id for s in gb.students)
        late = {(sid, a): found for a in assignments for sid in students
                if (found := _lateness(gb, a, sid)) is not None}
    from .lateness import read_pending

    dues, now, waiting = due_dates(course), datetime.now(timezone.utc), read_pending(out)
    results, changed = [], []
    for sid in students:
        for assignment in assignments:
            saved = _load_result(_record_path(out, sid, assignment))
            facts = late.get((sid, assignment))
            if facts is None:
                r = saved or NotebookResult(sid, assignment, 0.0, course.max_score(assignment), Status.MISSING,
                                            detail=NOT_SUBMITTED)
                if r.status is Status.MISSING:  # an extension given before they hand in is their due date already
                    _missing_as_of(r, _own_due(dues.get(assignment), waiting.get(sid, {}).get(assignment)), now)
                elif r.status is Status.UNREADABLE:
                    _dated_unreadable(r, _own_due(dues.get(assignment), waiting.get(sid, {}).get(assignment)))
                results.append(r)
                continue
            r = read_result(course, sid, assignment)
            if saved:
                _take_saved(r, saved)
            r.timestamp, r.due, r.seconds_late = facts.submitted, facts.due, facts.seconds_late
            r.late_penalty = policy.penalty(r.score, r.max_score, r.seconds_late)
            r.notes = _extension_notes(r, dues.get(assignment))
            if abs(r.late_penalty - facts.recorded_penalty) > 1e-9:
                changed.append((sid, assignment, r.late_penalty))
            results.append(r)
    _record_penalties(course, changed)
    return results


def _record_penalties(course: Course, changed: list[tuple[str, str, float]]) -> None:
    """The penalties of the policy in force into the gradebook, and those notebooks' feedback again."""
    if not changed:
        return
    from nbgrader.api import Gradebook

    with course.lock, Gradebook(course.db_url) as gb:
        for sid, assignment, penalty in changed:
            gb.find_submission_notebook(assignment, assignment, sid).late_submission_penalty = penalty
        gb.db.commit()
    for sid, assignment, _ in changed:
        with course.lock:
            course.api.generate_feedback(assignment, sid, force=True)


def _take_saved(r: NotebookResult, saved: NotebookResult) -> None:
    """What the gradebook does not hold, from the saved run onto `r` (scores from the gradebook):
    the status, notes and review; per cell, a failure's message and the mistake it named (kept
    when a manual grade passed it since), or a pass's note if it passed when graded too."""
    r.status, r.detail, r.other_kinds = saved.status, saved.detail, saved.other_kinds
    r.notes = [*saved.notes, *r.notes]  # the intake's, then the gradebook's scores set by hand
    r.review, r.sandbox, r.source_file = saved.review, saved.sandbox, saved.source_file
    by_id = {c.grade_id: c for c in saved.cells}
    for c in r.cells:
        old = by_id.get(c.grade_id)
        if old is None:
            continue
        failed_then = old.score < old.max_score
        if c.score < c.max_score or (not failed_then and old.message):
            c.message = old.message
        if failed_then:
            c.mistake, c.expected, c.received, c.cause = old.mistake, old.expected, old.received, old.cause


def write_wide_csv(results: list[NotebookResult], path: Path) -> None:
    """One row per student, one column per notebook (score after late penalty), and the total:
    the shape an LMS gradebook import expects. A notebook the grader failed on (GRADERS_OWN), and one not
    handed in before its due date, are left empty, as the LMS exports leave them: never a 0; the total
    and max_total count the others."""
    notebooks = sorted({r.notebook for r in results})
    by_student: dict[str, dict[str, NotebookResult]] = {}
    for r in results:
        by_student.setdefault(r.student_id, {})[r.notebook] = r
    tops = {n: next(r.max_score for r in results if r.notebook == n) for n in notebooks}
    with tempfile.NamedTemporaryFile("w", newline="", dir=path.parent, delete=False, suffix=".tmp") as fh:
        writer = csv.writer(fh)
        writer.writerow(safe_row(["student_id", *notebooks, "total", "max_total"]))
        for sid in sorted(by_student):
            finals = {n: _wide_cell(by_student[sid].get(n)) for n in notebooks}
            counted = [n for n in notebooks if finals[n] is not None]
            writer.writerow(safe_row([sid, *("" if finals[n] is None else f"{finals[n]:g}" for n in notebooks),
                                      f"{sum(finals[n] for n in counted):g}", f"{sum(tops[n] for n in counted):g}"]))
    os.chmod(fh.name, 0o644)
    os.replace(fh.name, path)


def _wide_cell(r: NotebookResult | None) -> float | None:
    """A notebook's final score in grades_wide.csv: None (left empty) when held back, 0 for no result."""
    if r is None:
        return 0.0
    return None if r.held_back() else r.final_score()


# grades `subs` elsewhere (a Dask cluster: autograder.cluster.on_cluster), calling `finish` for each
# notebook; returns how many workers graded: (course, subs, todo, finish, limits, salt, solutions, progress)
RemoteGrader = Callable[..., int]


def grade(submissions: Path, out: Path, *args, **kwargs) -> list[NotebookResult]:
    """Grade the students in SUBMISSIONS into OUT (see _grade), one run at a time in OUT: a second run
    into a folder another run holds is refused at once (folder_lock.FolderInUse), before it writes."""
    with folder_lock.held(Path(out).resolve()):
        return _grade(submissions, out, *args, **kwargs)


def _grade(submissions: Path, out: Path, solutions: Path | None = None, progress: bool = True,
           workers: int | None = None, limits: Limits | None = None, *, assignments: list[str] | None = None,
           students: list[str] | None = None, force: bool = False, due: dict[str, datetime] | None = None,
           roster: Path | None = None, late_penalty: str | None = None,
           remote: RemoteGrader | None = None, warm: bool = True) -> list[NotebookResult]:
    """Grade the students in SUBMISSIONS into OUT, in parallel; return the whole class's table.

    `remote` (autograder/cluster.py's `on_cluster(settings)`): each notebook is run and judged on a
    worker of a Dask cluster and recorded here; otherwise `workers` threads grade on this machine.

    `assignments` / `students` restrict what is graded (the rest of the gradebook is untouched);
    `force` regrades even what is saved. `warm`: with bubblewrap, notebooks start from a fork
    server per assignment with the imports done (warm_sandbox.py); False starts each one fresh. Resumable: each graded notebook is saved (atomically)
    with a fingerprint of its file, its submission time and its solution, so running the same
    command again grades only what is new or changed. grades.csv, grades_wide.csv and
    report.html are rebuilt from the gradebook after every run: earlier runs, other folders,
    roster students and formgrader's manual grades all show.
    """
    require_strong_sandbox()  # before anything is written: never a weaker sandbox by surprise
    quiet_gradebook()
    if Path(submissions).is_dir() and not any(not p.name.startswith(".") for p in Path(submissions).iterdir()):
        raise NothingToGrade(nothing_to_grade(Path(submissions), []))  # before the output folder is made
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    solutions = solutions_dir(solutions)
    folder = _course_folder(solutions)
    require_reachable({"the course library": library_dir(), "the grading folder": out,
                       **({"the course": folder.root} if folder else {})})  # before the course is prepared
    course = Course(out / "course")
    course.folder = folder
    if not (course.root / "source").is_dir() or not course.db_path.exists():
        course.setup(solutions)
    else:
        course.lock = threading.Lock()
        moved = course.settle()  # a copied or moved grading folder grades into itself, never the old place
        if progress and moved:
            print(moved)
        refreshed = _refresh_changed_solutions(course, solutions)
        if progress and refreshed:
            print(f"changed in {solutions} since this folder was prepared: {', '.join(refreshed)}; its hidden tests "
                  "and points were taken from there again, and its notebooks are graded again")
    course.extra_hidden = [str(Path(submissions).resolve()), str(solutions.resolve())]
    intake = collect_all(Path(submissions), course.grade_ids(), due={**due_dates(course), **(due or {})},
                         known=known_times(out))
    if not any(s.notebooks for s in intake.students):  # before anything of this run is written into the gradebook
        raise NothingToGrade(nothing_to_grade(Path(submissions), intake.ignored))
    unknown = sorted(set(students or ()) - {s.student_id for s in intake.students})
    if unknown:  # a typo in --student graded nobody and said nothing
        import difflib

        ids = [s.student_id for s in intake.students]
        hints = [f"{sid!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(
            sid, ids, n=1) or [i for i in ids if i.lower() == sid.lower()]) else "") for sid in unknown]
        raise NothingToGrade(f"--student: no submission in {submissions} for {', '.join(hints)}: student ids are "
                             f"exact (case too); the ids here are the names of the students' folders or files")
    _not_this_class(submissions, intake.students,
                    {r["id"] for r in read_roster(roster)} if roster else read_roster_ids(course))
    _ = course.kit  # built once, before any worker starts a sandbox
    if late_penalty:
        course.set_late_penalty(late_penalty)
    if due:
        set_due_dates(course, due)
    if roster:
        import_roster(course, roster)
    if progress:
        banner, strong = describe_sandbox()
        print(banner, file=sys.stdout if strong else sys.stderr)
    subs = [s for s in intake.students if not students or s.student_id in students]
    removed = _removed_before(course, out, [s.student_id for s in subs], named=students or [])
    subs = [s for s in subs if s.student_id not in removed]
    play = choose_in_play(course, intake.students, assignments)
    chosen = play.chosen
    left_out = play.left_out(subs)
    if progress:
        print(play.describe())
    if progress and (intake.ignored or left_out):
        n = len(intake.ignored) + len(left_out)
        print(f"not graded ({n} file{'' if n == 1 else 's'}; each with the reason):")
        for path, why in [*intake.ignored, *left_out]:
            print(printable(f"  {path}: {why}"))
    if progress and removed:
        print(f"not graded: taken out of this class with remove-student ({len(removed)}; their earlier files are in "
              f"{out / 'removed'}): {', '.join(removed)}; to grade one of them again, name them: --student ID")
    roster_ids = read_roster_ids(course)
    strangers = sorted(s.student_id for s in subs if roster_ids is not None and s.student_id not in roster_ids)
    if progress and strangers:
        twins = differ_in_case(strangers, roster_ids)
        named = [f"{sid} (the roster has {twins[sid]}: the ids differ only in case)" if sid in twins else sid
                 for sid in strangers]
        print(f"not on the roster ({len(strangers)}; graded all the same, marked in the report and the notes "
              f"column): {', '.join(named)}; add them to the roster CSV and pass it again with --roster, "
              f"or check whose folder or file that is"
              + ("; student ids are exact, case too: rename a folder or file that differs from its roster id only "
                 "in case (or correct the roster's id) and grade again" if twins else ""))
    workers = workers or GradingSettings().worker_count
    done: list[NotebookResult] = []  # notebooks graded in this run
    reused: list[NotebookResult] = []
    kept: list[str] = []  # what this folder holds that is older than what is graded: not graded, said why
    resent: list[str] = []  # notebooks graded before, handed in again unchanged with a later file time
    held: list[str] = []  # files graded before an instructor's --force regrade replaced their grade: not graded again
    unreadable_newer: list[str] = []  # newer files that are no notebook, over a grade of a readable one: not graded
    replaced_unreadable: dict[tuple[str, str], str] = {}  # the note on a notebook graded over a file that was none
    @functools.cache  # two grading threads asking at once may both read: the same files, the same answer
    def class_dues() -> tuple[dict, dict]:
        """The gradebook's due dates and the extensions waiting, read once per run (under the course's lock)."""
        from .lateness import read_pending

        with course.lock:
            return due_dates(course), read_pending(out)
    nothing_here: list[str] = []  # an override (--force --student --assignment) of a notebook this folder does not hold
    other_code: list[str] = []  # notebooks graded again because other grading code made their saved grade
    still_forced: set[tuple[str, str]] = set()  # overrides (--force) whose very file is graded again: they stay overrides
    overriding = bool(force and students and assignments)  # this run's grades replace others by hand: remembered
    started = time.time()
    salt = class_salt(out)
    before = _results_before(course, out)  # the grades this run may replace: said when a newer file's grade is lower

    def todo(sub: StudentSubmission) -> list[str]:
        """The student enrolled; their notebooks to grade (saved results of the same files reused). A
        notebook older than the one the gradebook holds for them (a rerun of the on-time folder after
        the late one), or absent here when they were graded before, keeps the newer grade; a file graded
        before an instructor's override (--force --student --assignment) keeps the override's grade."""
        recorded = _enrol(course, sub.student_id, chosen)
        left = []
        for assignment in chosen:
            fingerprint = _fingerprint(sub, assignment, solutions, salt)
            record = _payload(_record_path(out, sub.student_id, assignment))  # read once, here
            _remember_hand_ins(_record_path(out, sub.student_id, assignment), record, sub.hand_ins.get(assignment, {}))
            judged_so_now = record.get("judge") == judge_digest().hex()  # else saved by other grading code
            retry = record.get("failed_since") is True  # a grade kept over a later failure (_kept_over_a_failure)
            saved = None if force or not judged_so_now or retry else _saved_result(record, fingerprint)
            if saved is not None:
                if saved.status is not Status.MISSING:  # missing: counted from the tables, never as graded
                    reused.append(saved)
                continue
            content = _fingerprint(sub, assignment, solutions, salt, timed=False) if assignment in sub.notebooks else ""
            same = _saved_result(record, content=content) if content else None  # the very notebook graded before
            if same is not None and (force or not judged_so_now or retry):  # graded again, as handed in when it first was
                _keep_earlier_time(sub, assignment, recorded.get(assignment))
                if record.get("forced") is True:  # an override's file, graded again by other code: still the override
                    still_forced.add((sub.student_id, assignment))
            elif same is not None:  # the very notebook graded before, downloaded again (a new file time): kept as graded
                reused.append(same)
                resent.append(f"{sub.student_id} {assignment}: {sub.origins.get(assignment, '') or 'the file here'} is "
                              f"the notebook graded earlier, unchanged: its grade and earlier submission time are kept")
                continue
            if not force and not retry and _overridden(record, content):  # the instructor's choice stands over a file seen before
                held.append(_held_line(sub, assignment))
                continue
            why = _keep_recorded(sub, assignment, recorded.get(assignment, ""))
            if _grade_over_an_unreadable_file(record, sub, assignment):  # --force or not: a file that is no notebook
                note = _unreadable_note(sub, assignment, submissions.name, older=bool(why))  # never replaces the grade
                _note_on_record(_record_path(out, sub.student_id, assignment), note)  # of one that was (forced, its
                unreadable_newer.append(f"{sub.student_id} {assignment}: {note}")  # score stayed beside an
                continue                                                           # 'unreadable' status): said, noted
            if overriding and why:  # the instructor's choice: this folder's file over the newer one graded before
                why = None
            if why is None and not force and _graded_before_the_newer(record, sub, assignment, content):
                note = _older_again_note(sub, assignment, submissions.name)  # a copy of an older folder, most likely:
                _note_on_record(_record_path(out, sub.student_id, assignment), note)  # said, and noted on the row
                kept.append(f"{sub.student_id} {assignment}: {note}")
                continue
            if why is None:
                left.append(assignment)
                note = _replaced_note(record, sub, assignment, lambda a=assignment: class_dues()[0].get(a),
                                      lambda a=assignment: class_dues()[1].get(sub.student_id, {}).get(a))
                if note:  # said on the row that replaces it (and kept by its regrades): whether to waive a penalty
                    replaced_unreadable[(sub.student_id, assignment)] = note
                if same is not None and not judged_so_now and not force:  # a new file is graded anyway: not said
                    other_code.append(assignment)
            elif why:
                kept.append(why)
            elif overriding:  # nothing of theirs for it here: an override of no file never takes the grade away
                nothing_here.append(f"{sub.student_id} {assignment}: no notebook for it in {submissions}; the grade from "
                              "an earlier folder stands (run the override on the folder that holds the file)")
        return left

    def finish(sub: StudentSubmission, assignment: str, r: NotebookResult) -> None:
        note_submission(r, sub, assignment, Path(submissions).resolve().name, course.assignments)
        replaced = replaced_unreadable.get((sub.student_id, assignment))
        if replaced and r.status not in GRADERS_OWN and r.status is not Status.UNREADABLE:
            r.notes.append(replaced)
        # the grader's own failure (an incident, an error) is shown, but kept under no fingerprint:
        # the next run grades it again
        own = r.status in GRADERS_OWN
        if own and not r.max_score:  # made where the course was not read (a Dask worker, the head): out of its points
            r.max_score = course.max_score(assignment)
        content = _fingerprint(sub, assignment, solutions, salt, timed=False) if assignment in sub.notebooks else ""
        if own and _kept_over_a_failure(_record_path(out, sub.student_id, assignment), r, content):
            done.append(r)  # said on the console; the grade saved before stands in every table
            return
        _save_result(_record_path(out, sub.student_id, assignment),
                     "" if own else _fingerprint(sub, assignment, solutions, salt), r,
                     content=_fingerprint(sub, assignment, solutions, salt, timed=False) if assignment in sub.notebooks else "",
                     forced=(overriding or (sub.student_id, assignment) in still_forced) and not own,
                     hand_ins=sub.hand_ins.get(assignment), solution=_solution_digest(course.root, assignment))
        if r.status is not Status.MISSING:
            done.append(r)

    slots, slot = itertools.count(), threading.local()

    def one(sub: StudentSubmission) -> None:
        if not hasattr(slot, "number"):
            slot.number = next(slots)  # this grading thread's
        left = staggered(todo(sub), chosen, slot.number, workers)
        with checks_salted(salt):  # this worker thread's
            graded = grade_one(course, sub, limits, left) if left else []
        for assignment, r in zip(left, graded, strict=True):
            finish(sub, assignment, r)

    if remote is not None:
        with checks_salted(salt):
            workers = remote(course, subs, todo, finish, limits, salt, solutions, progress)
    else:
        if progress:  # the servers start before the first notebook: seconds with nothing else on the screen
            print(f"starting the sandboxes{' (a fork server per notebook in play)' if warm else ''} ...", flush=True)
        trusted.warm_up()
        with warm_sandbox.warm_sandboxes(warm_sandbox.servers_for(workers, len(chosen)), enabled=warm), \
                ThreadPoolExecutor(max_workers=workers) as pool:
            try:
                _progress_as_done(pool, one, subs, progress)
            except KeyboardInterrupt:  # said at once: the notebooks in the sandboxes now still finish first
                print(STOPPING, file=sys.stderr, flush=True)
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    playing = in_play(course, chosen)
    dropped: list[str] = []
    with timings.phase(timings.OUTPUTS):
        results = write_outputs(course, out, playing, said=dropped)
    if progress and dropped:
        print(dropped[0])
    # this run's students, and each notebook in play that another student of the gradebook has not handed in (a
    # roster's absentee; one who handed in last week's notebook and not this week's, once left out: exit 0)
    graded = {s.student_id for s in subs}
    reported = [r for r in results if r.notebook in chosen and
                (r.student_id in graded or (not students and r.status is Status.MISSING))]
    if progress:
        now = {(r.student_id, r.notebook) for r in done}
        hand_kept = [f"{r.student_id} {r.notebook}: {n.removeprefix(BY_HAND + ' in formgrader: ')}" for r in results
                     if (r.student_id, r.notebook) in now for n in r.notes if n.startswith(BY_HAND)]
        not_yet = sum(1 for r in reported if r.not_due_yet())
        missing = sum(1 for r in reported if r.status is Status.MISSING) - not_yet
        _print_listed(f"kept the newer submission graded earlier ({len(kept)}; the older file here was not graded):", kept)
        _print_listed(f"kept the grade set with --force ({len(held)}; the file here was graded before that, not graded "
                      "again):", held)
        _print_listed(f"kept the grade of a readable notebook over a file of theirs that is none ({len(unreadable_newer)}; "
                      "noted in grades.csv):", unreadable_newer)
        _print_listed(f"nothing to regrade ({len(nothing_here)}; --force named a notebook this folder does not hold):",
                      nothing_here)
        _print_listed(f"handed in again unchanged ({len(resent)}; graded as before, at the earlier submission time):",
                      resent)
        _print_listed(f"a score set by hand kept over a notebook graded now ({len(hand_kept)}; look at it again in "
                      "formgrader, where it can be emptied):", hand_kept)
        commented = _commented_by_hand(course, now)
        _print_listed(f"a comment written by hand kept over a notebook graded now ({len(commented)}; it was written "
                      "about the notebook graded before: look at it again in formgrader):", commented)
        lowered = _lower_than_before(before, results, now, out)
        _print_listed(f"a newer submission's grade replaced a higher one ({len(lowered)}; to keep the earlier grade, "
                      "grade the folder that holds its file again with --force --student ID --assignment NAME):", lowered)
        if other_code:
            print(f"graded again: {len(other_code)} notebook{'s' if len(other_code) > 1 else ''} whose saved grade was "
                  "made by other grading code (the grader's checks or the course library changed since)")
        stale = graded_by_other_tests(out, chosen, skip=now)
        left_out = _left_out_here(stale, submissions, intake.students, students)
        _print_listed(f"NOT GRADED AGAIN, made with earlier hidden tests or grader code, left out by --student "
                      f"({len(left_out)}; their files are in this folder: grade it again without --student, before "
                      "exporting):", left_out)
        stale = [line for line in stale if line not in left_out]
        _print_listed(f"NOT GRADED AGAIN, made with earlier hidden tests or grader code ({len(stale)}; a run grades the "
                      "files of its own folder: grade the folder that holds each file again, e.g. the late uploads', "
                      "before exporting):", stale)
        failed = sum(1 for r in done if r.status in GRADERS_OWN)
        print(summary_line(len(subs), len(done) - failed, len(reused), time.time() - started, workers, out, results,
                           playing, course.late_policy(), kept=len(kept) + len(unreadable_newer), missing=missing,
                           held=len(held), not_yet=not_yet, failed=failed))
    return reported


def _left_out_here(stale: list[str], submissions: Path, here: list[StudentSubmission],
                   students: list[str] | None) -> list[str]:
    """The lines of `stale` (graded_by_other_tests) that a --student run left out: the grade of a student of this
    folder not named by --student, made from a file of this folder ('... (file time; in week1)')."""
    if not students:
        return []
    folder = f"; in {Path(submissions).resolve().name})"
    others = {s.student_id for s in here} - set(students)
    return [line for line in stale if line.split(" ", 1)[0] in others and folder in line]


def _progress_as_done(pool: ThreadPoolExecutor, one: Callable[[StudentSubmission], None],
                      subs: list[StudentSubmission], progress: bool) -> None:
    """one(sub) for every student on the pool; the bar counts each student when done (in any order: counted in
    order, a notebook that looped held it at 6/12 for two minutes while the other worker finished five) and names
    the students being graded now."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from tqdm import tqdm

    running: set[str] = set()
    lock = threading.Lock()
    with tqdm(total=len(subs), desc="grading", unit="student", disable=not progress) as bar:
        def started(sub: StudentSubmission) -> None:
            with lock:
                running.add(sub.student_id)
                bar.set_postfix_str("now: " + ", ".join(sorted(running)), refresh=True)
            try:
                one(sub)
            finally:
                with lock:
                    running.discard(sub.student_id)

        pending = {pool.submit(started, sub) for sub in subs}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                future.result()  # the grader's own exception: raised, as pool.map raised it
            with lock:
                bar.set_postfix_str("now: " + ", ".join(sorted(running)) if running else "", refresh=False)
            bar.update(len(finished))


def staggered(left: list[str], chosen: list[str], slot: int, workers: int) -> list[str]:
    """A student's notebooks in the order grading thread `slot` (of `workers`) takes them: the
    assignments in turn, starting `slot / workers` of the way along. Threads grading at the same
    time then work on different assignments, so each assignment's fork server (warm_sandbox.py) is
    started once and serves the next student, instead of one per thread for the same assignment."""
    start = (slot % max(workers, 1)) * len(chosen) // max(workers, 1)
    turn = {a: (i - start) % len(chosen) for i, a in enumerate(chosen)}
    return sorted(left, key=lambda a: turn.get(a, len(chosen)))


def write_outputs(course: Course, out: Path, playing: list[str], said: list[str] | None = None) -> list[NotebookResult]:
    """OUT's grades.csv, grades_wide.csv, report.html, results.json and feedback pages, from the
    gradebook as it is now: what `grade` writes after grading, and `export` before exporting, so
    a score, extra credit or comment typed in formgrader shows everywhere without regrading. A student
    of the gradebook who is not on the last roster given and never handed anything in (dropped from the
    class) has no rows: nothing of theirs is lost, and they are not "missing" on every run; `said` gets
    a line naming them."""
    from .lateness import give_pending

    give_pending(course.db_url, out)  # extensions given before the student handed anything in
    _refresh_manual_feedback(course)
    results = class_results(course, out, playing)
    roster_ids = read_roster_ids(course)
    strangers = sorted({r.student_id for r in results} - roster_ids) if roster_ids is not None else []
    dropped = [sid for sid in strangers if all(r.status is Status.MISSING for r in results if r.student_id == sid)]
    if dropped:
        results = [r for r in results if r.student_id not in dropped]
        strangers = [sid for sid in strangers if sid not in dropped]
        if said is not None:
            said.append(f"not on the roster and nothing handed in ({len(dropped)}; no rows in the tables and "
                        f"exports, still in the gradebook): {', '.join(dropped)}")
    twins = differ_in_case(strangers, roster_ids)
    for r in results:
        if r.student_id in strangers and NOT_ON_ROSTER not in r.notes:
            r.notes = [*r.notes, NOT_ON_ROSTER]
        if r.student_id in twins and case_note(twins[r.student_id]) not in r.notes:
            r.notes = [*r.notes, case_note(twins[r.student_id])]
    write_csv(results, out / "grades.csv")
    write_wide_csv(results, out / "grades_wide.csv")
    collect_feedback(course, out)
    from .report import class_report, unreadable_feedback

    for r in results:  # nbgrader has no page for a file it never saw: the student still learns why it is 0
        if r.status is Status.UNREADABLE:
            unreadable_feedback(r, out / "feedback" / r.student_id / f"{r.notebook}.html")

    class_report(results, out / "report.html", course.late_policy(), not_on_roster=strangers, differ_in_case=twins)
    (out / "results.json").write_text(json.dumps([r.to_dict() for r in results], indent=1))
    return results


BY_HAND_PAGES = "feedback-by-hand.json"  # beside the gradebook: the feedback pages last made with edits by hand


def _refresh_manual_feedback(course: Course) -> None:
    """Feedback pages again for the notebooks someone graded or commented on by hand (formgrader):
    nbgrader writes a page when a notebook is graded, and a later manual score would not reach it. A
    page made with an edit by hand that was taken back since (a manual score emptied) is made again
    too: it still showed the old score."""
    from nbgrader.api import Comment, Grade, Gradebook

    with Gradebook(course.db_url) as gb:  # two queries, whatever the size of the class
        by_hand = gb.db.query(Grade).filter((Grade.manual_score.isnot(None)) | (Grade.extra_credit > 0)).all()
        by_hand += gb.db.query(Comment).filter(Comment.manual_comment.isnot(None), Comment.manual_comment != "").all()
        touched = {(entry.notebook.assignment.name, entry.notebook.student.id) for entry in by_hand}
    record = course.root.parent / BY_HAND_PAGES
    before = _payload(record).get("pages", [])
    undone = {tuple(p) for p in before if isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)}
    for assignment, student in sorted(touched | undone):
        if (course.root / "autograded" / student / assignment).is_dir():
            with course.lock:
                course.api.generate_feedback(assignment, student, force=True)
    if touched != undone:
        tmp = record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pages": sorted(list(p) for p in touched)}))
        os.replace(tmp, record)


def summary_line(students: int, new: int, reused: int, seconds: float, workers: int, out: Path,
                 results: list[NotebookResult], playing: list[str], policy: LatePolicy, kept: int = 0,
                 missing: int = 0, held: int = 0, not_yet: int = 0, failed: int = 0) -> str:
    """What the run did, in one sentence: how many notebooks were graded now and how many reused, how many
    newer grades (or grades set with --force: `held`) were kept over a file of this folder, how many the
    grader failed on (`failed`: its incidents and errors, never counted as graded), and how many
    notebooks in play the run's students did not hand in (missing: never counted as graded; `not_yet`:
    before their due date)."""
    def count(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    late = sum(1 for r in results if r.seconds_late > 0)
    older = (f", {kept} kept: a grade of theirs over the file here (listed above)" if kept else "") + (f", {held} kept: set with --force" if held else "")
    failures = (f", {failed} NOT GRADED now: the grader's own failure (its row's status or notes say why, and whether "
                f"an earlier grade stands); the same command grades {'it' if failed == 1 else 'them'} again") \
        if failed else ""
    return (f"{count(students, 'student')}: {count(new + reused + kept + held + failed, 'notebook')} ({new} graded now, "
            f"{reused} reused from earlier runs{older}{failures})" + (f", {missing} missing (no notebook handed in)" if missing else "")
            + (f", {not_yet} not handed in yet (not due)" if not_yet else "")
            + f" in {seconds:.0f} s, {workers} in parallel -> {out / 'grades.csv'}; "
            f"{count(len({r.student_id for r in results}), 'student')} in the gradebook, "
            f"in play: {', '.join(playing) or 'nothing yet'}"
            + (f"; {late} late ({policy.describe()})" if late else ""))


def note_submission(r: NotebookResult, sub: StudentSubmission, assignment: str, folder: str = "",
                    assignments: Iterable[str] = ()) -> None:
    """What the intake found about this student's files (a renamed id, a second copy, a refused
    file) into `r.notes`, and the file graded into `r.source_file`: never into the status, whose
    kind says what happened to the notebook itself. `folder`: the class folder's name, said in
    `source_file` (week1/ and week1-late/ are graded into one table, with the same paths in each).
    `assignments`: the course's; a note about another of them is left to that one's row (notebook 01's
    duplicate files and Canvas late mark were on the student's 02 row too)."""
    others = {a: set() for a in assignments if a != assignment}
    r.notes = [printable(f"{k}: {v}") for k, v in sub.problems.items() if not _about_another(k, assignment, others)] + \
        [n for n in r.notes if n.startswith((REFUSED + ": ", AS_HANDED_IN + ": "))]
    r.source_file = printable(sub.origins.get(assignment, ""))
    if folder and r.source_file.endswith(")"):  # 'bob/01.ipynb (file time)' -> '... (file time; in week1-late)'
        r.source_file = f"{r.source_file[:-1]}; in {folder})"


def _about_another(key: str, assignment: str, others: dict[str, set]) -> bool:
    """Whether a student's note (its key: an assignment, '<assignment> (late)', or a file's name) is about
    another of the course's notebooks than `assignment`."""
    head = key.split(" (", 1)[0]  # '<assignment> (late)' is about that assignment
    subject = head if head in others or head == assignment else key
    if subject == assignment:
        return False
    if subject in others:
        return True
    return match_assignment(PurePosixPath(subject).name, b"", {**others, assignment: set()}) in others


def _enrol(course: Course, student: str, assignments: list[str] = ()) -> dict[str, datetime | None]:
    """The student into the gradebook (even with nothing to grade): they then have rows. Returns, per
    assignment of `assignments` the gradebook holds a submission of theirs for, its submission time
    (nbgrader's timestamp, aware UTC; None when it recorded none)."""
    from nbgrader.api import Gradebook, MissingEntry

    recorded: dict[str, datetime | None] = {}
    with course.lock, Gradebook(course.db_url) as gb:
        gb.update_or_create_student(student)
        for assignment in assignments:
            try:
                stamp = gb.find_submission(assignment, student).timestamp
            except MissingEntry:
                continue
            recorded[assignment] = stamp.replace(tzinfo=timezone.utc) if stamp is not None else None
    return recorded


def _graded_before_the_newer(record: dict[str, Any], sub: StudentSubmission, assignment: str, content: str) -> bool:
    """Whether this folder's notebook is one graded for this student before the submission whose grade the
    record holds (its content among the record's `seen`), timed only by its file: a copy or a new download
    of an older folder, whose new file time would otherwise make it the newest submission. A time the
    platform wrote (nbgrader's timestamp.txt) is a real handing in again, and is judged by its time."""
    seen = record.get("seen", [])
    platform_timed = sub.origins.get(assignment, "").endswith(f"({TIMESTAMP_FILE})")
    return bool(content) and isinstance(seen, list) and content in seen and not platform_timed


def _kept_over_a_failure(path: Path, failure: NotebookResult, content: str) -> bool:
    """When the grader failed on a notebook (`failure`: an incident, an error) whose record holds a grade, that grade
    stands, noted on its row, and `failure` says so: an instructor's `--force` regrade with no worker to grade left
    the exports with an empty cell where a good grade had been, while the message said "not saved". The record is
    marked so that the next run grades the notebook again, as it would after any failure. False when the record
    holds no grade (then the failure is saved, under no fingerprint, as before)."""
    payload = _payload(path)
    kept = _saved_result(payload, content=content) if content else None  # a grade of this very file: a newer file's
    if kept is None or kept.status in GRADERS_OWN or kept.status is Status.MISSING:  # failure never sends the older
        return False                                                                    # file's grade, nor a 0
    what = failure.detail.split("; " + INCIDENT_ADVICE.split(":")[0])[0]  # the failure, without the advice
    what = what if len(what) <= 240 else what[:239].rstrip() + "…"
    note = (f"{KEPT_OVER_A_FAILURE} ({failure.status.value}: {what}); this grade, made before, stands until a run "
            f"grades it")
    kept.notes = [*[n for n in kept.notes if not n.startswith(KEPT_OVER_A_FAILURE)], note]
    if failure.status not in kept.other_kinds:  # the run's summary counts it as a problem (exit 1), the score stands
        kept.other_kinds = [*kept.other_kinds, failure.status]
    payload["result"], payload["failed_since"] = kept.to_dict(), True  # the next run grades it again
    _write_record(path, payload)
    failure.detail += f"; the grade saved before ({kept.final_score():g} / {kept.max_score:g}) stands"
    return True


def _note_on_record(path: Path, note: str) -> None:
    """Add `note` (once) to the notes of the grade a record holds, which every table is written from."""
    payload = _payload(path)
    result = payload.get("result")
    if not isinstance(result, dict) or note in (result.get("notes") or []):
        return
    result["notes"] = [*[n for n in result.get("notes") or [] if isinstance(n, str)], note]
    _write_record(path, payload)


def _grade_over_an_unreadable_file(record: dict[str, Any], sub: StudentSubmission, assignment: str) -> NotebookResult | None:
    """The grade that stands when this folder's notebook for `assignment` cannot be read (not JSON, not a
    notebook) and the record holds a notebook of theirs graded earlier that could: its row kept whole (a
    corrupt late upload left the earlier score and time beside the new file's 'unreadable' status)."""
    data = sub.notebooks.get(assignment)
    if data is None or parse_notebook(data)[0] is not None:
        return None
    saved = _saved_result(record, content=str(record.get("content") or ""))
    return saved if saved is not None and saved.status not in (Status.UNREADABLE, Status.MISSING) else None


REPLACED_UNREADABLE = "an upload of theirs that could not be read"  # how the note on the row graded over one starts


def _replaced_note(record: dict[str, Any], sub: StudentSubmission, assignment: str, due: Callable[[], datetime | None],
                   extension: Callable[[], float | None]) -> str:
    """The note for a notebook about to be graded over a record of theirs: the record's file could not be read (a
    broken upload: an instructor's walkthrough graded a damaged on-time file, then a good late one, and the row said
    only 'late'), or the record's grade already carried that note (a regrade keeps it). '' when neither."""
    saved = _saved_result(record, content=str(record.get("content") or ""))
    if saved is None:
        return ""
    if saved.status is not Status.UNREADABLE:
        return next((n for n in saved.notes if n.startswith(REPLACED_UNREADABLE)), "")
    _dated_unreadable(saved, _own_due(due(), extension()))
    where = saved.source_file or "a file"
    when = f", handed in {saved.timestamp[:16].replace('T', ' ')} UTC" if saved.timestamp else ""
    timely = (" on time" if saved.seconds_late <= 0 else " late") if saved.timestamp and saved.due else ""
    now = sub.timestamps.get(assignment)
    later = bool(saved.timestamp and now and datetime.fromisoformat(saved.timestamp.replace("Z", "+00:00")) > now)
    if later:  # the broken file came after the notebook graded now (the late folder was graded first)
        return printable(f"{REPLACED_UNREADABLE}, {where}{when}{timely}, came after this notebook ({saved.detail[:120]}): "
                         f"this earlier notebook is graded; ask the student whether the later file mattered")
    return printable(f"{REPLACED_UNREADABLE}, {where}{when}{timely}, came before this notebook ({saved.detail[:120]}): "
                     f"this later notebook is graded in its place, with its own lateness; to waive a late penalty, "
                     f"give them a later due date (attn-course extend)")


def _unreadable_note(sub: StudentSubmission, assignment: str, folder: str, older: bool = False) -> str:
    """The note (grades.csv, the report) on a grade kept over a file of theirs that is no notebook: a newer upload
    gone wrong, or an `older` one (handed in on time, say, and broken: what decides whether to waive a penalty)."""
    where = f"{folder}/{sub.origins.get(assignment, '') or 'a file'}"
    why = parse_notebook(sub.notebooks.get(assignment, b""))[1] or "it is not a notebook"
    stamp = sub.timestamps.get(assignment)
    when = f", handed in {stamp:%Y-%m-%d %H:%M} UTC," if stamp else ""
    keep = ("a file that cannot be read never replaces the grade of a notebook that could, --force or not; to give "
            "another score, set it by hand in formgrader")
    if older:
        return (f"an earlier upload, {where}{when} cannot be read ({why[:120]}): the grade of the notebook handed in "
                f"after it stands, with its own lateness if it was late ({keep})")
    return f"a newer upload, {where}{when} cannot be read ({why[:120]}): the earlier notebook's grade stands; ask " \
           f"the student for the file again ({keep})"


def _older_again_note(sub: StudentSubmission, assignment: str, folder: str) -> str:
    where = f"{folder}/{sub.origins.get(assignment, '') or 'a file'}"
    return (f"{where} is a notebook of theirs graded before the submission graded now, with a later file time (a "
            f"copy or a new download of an older folder): that newer submission's grade is kept; if they handed this "
            f"one in again on purpose, grade it with --force --student {sub.student_id} --assignment {assignment}")


def _keep_recorded(sub: StudentSubmission, assignment: str, recorded: datetime | None | str = "") -> str | None:
    """Whether the grade the gradebook holds is kept over what this folder has for `assignment`: None
    (grade this folder's file), "" (keep it, nothing to say: no file here), or the line that says why
    (this file was handed in before the one graded). `recorded`: the gradebook's submission time, ""
    when it holds no submission."""
    if recorded == "":
        return None
    if assignment not in sub.notebooks:
        return ""  # graded from another folder before: a folder without the file takes nothing away
    stamp = getattr(sub, "timestamps", {}).get(assignment)
    if recorded is None or stamp is None or stamp >= recorded:
        return None
    where = sub.origins.get(assignment, "") or "the file here"
    return (f"{sub.student_id} {assignment}: {where}, handed in {stamp:%Y-%m-%d %H:%M:%S} UTC, is older than the "
            f"submission graded earlier (handed in {recorded:%Y-%m-%d %H:%M:%S} UTC, from another folder): "
            f"the newer one's grade is kept; to grade this older one instead, run again with "
            f"--force --student {sub.student_id} --assignment {assignment}")


def _inside_them(students: list[StudentSubmission], roster_ids: set[str]) -> bool:
    """Whether a student's notebooks came from inside a folder or file named after a roster student
    (`week1/alice/...`, `week1/carol_1003_..._01.ipynb`): the students found are class folders."""
    for sub in students:
        for origin in sub.origins.values():
            inner = origin.rsplit(" (", 1)[0].split("/")[1:]  # below the student's own entry
            if set(re.split(r"[/_. ]+", "/".join(inner))) & roster_ids:
                return True
    return False


def _not_this_class(submissions: Path, students: list[StudentSubmission], roster_ids: set[str] | None) -> None:
    """NothingToGrade when a roster is in force, not one of the folder's students is on it, and their
    notebooks lie inside folders or files named after roster students: the folder above the class folder
    (its `week1/` and `week1-late/` graded as two students, every enrolled student "missing", the two
    strangers in every table from then on)."""
    ids = sorted(s.student_id for s in students)
    if not roster_ids or not ids or set(ids) & roster_ids or not _inside_them(students, roster_ids):
        return  # a folder of late enrollers alone (not on the roster yet) is graded, each named
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    raise NothingToGrade(
        f"none of the {len(ids)} student{'s' if len(ids) != 1 else ''} found in {submissions} ({shown}) is on the "
        f"roster ({len(roster_ids)} ids, such as {', '.join(sorted(roster_ids)[:3])}): nothing was graded. Is "
        f"{submissions} the folder above the class folder? Give the class folder itself (the one holding a folder "
        f"or file per student).")


class NothingToGrade(ValueError):
    """The submissions folder holds no student's submission: the run stops before writing anything."""


EXPECTED_LAYOUT = ("one sub-folder per student (<student_id>/<notebook>.ipynb), one zip per student "
                   "(<student_id>.zip), nbgrader's submitted/<student_id>/<assignment>/ tree, or a platform's "
                   "download with the files at the top (Canvas: name_123456_7890_<file>.ipynb; or "
                   "<student_id>_<assignment>.ipynb)")


def nothing_to_grade(folder: Path, ignored: list[tuple[str, str]]) -> str:
    """The message of an empty (or all-refused) submissions folder: which folder, what it held, what was expected."""
    if ignored:
        held = f"its {len(ignored)} file{'s' if len(ignored) != 1 else ''} cannot be graded (" + "; ".join(
            printable(f"{path}: {why}") for path, why in ignored[:5]) + ("; ..." if len(ignored) > 5 else "") + ")"
    else:
        held = "it holds no notebook, zip or student folder"
    return (f"nothing to grade in {folder}: {held}. Expected {EXPECTED_LAYOUT}. Check that you gave the folder "
            f"holding the submissions (not a parent or an empty download); nothing was graded.")
