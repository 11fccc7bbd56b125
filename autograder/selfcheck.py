"""`attn-course check NOTEBOOK`: grade one notebook the way the instructor will, and say per
exercise whether it passes, fails (and why), or has not been attempted yet.

The verdicts are the instructor's: the notebook runs in the same sandbox (sandbox.py) and each
test cell is judged outside it by the same trusted code (trusted.py) that `attn-course grade`
uses; a test cell scores its points when it passes, 0 otherwise, exactly what nbgrader's
autograde records from those verdicts. What the check skips is nbgrader's bookkeeping around
them (a course folder, `generate_assignment`, a gradebook, autograde, feedback): a student
needs none of it, and setting it up took most of a minute.

What the check needs of an assignment depends only on its solution notebook and the grader's
code, so it is prepared once and kept in a cache folder (`cache_root()`), one entry per
assignment and version: a copy of the source notebook, the answer-cell stubs the student
release has (nbgrader's ClearSolutions, with the course's configuration) and the sandbox's
kit. An entry is built aside and renamed into place, so concurrent checks never see half of
one; a changed solution or grader gets a new entry (older ones are pruned).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import nbformat

from . import trusted, warm_sandbox
from .course import CACHE_ENV, assignments, cache_root, hash_python_sources, notebook_path, write_course_config  # noqa: F401 - CACHE_ENV named here by tests
from .grade import CellResult, Course, NotebookResult, exercise_of, sandbox_world
from .outcomes import Status
from .printable import printable
from .sandbox import Limits, SandboxUnavailable, make_kit, run_notebook_job
from .submissions import export_of, match_assignment, parse_notebook

STARTING = "starting the sandbox"  # what `progress` hears before the first cell runs

READY = "ready.json"  # written last in an entry: its presence means the entry is complete
PRUNE_AFTER_SECONDS = 3600  # entries of an older version, and abandoned builds, unused this long are removed


# --------------------------------------------------------------------------- the cache


@lru_cache(maxsize=1)
def grader_version() -> str:
    """A hash of the grader's code (every .py of autograder/, its nbgrader configuration included)
    and of nbgrader's version: a prepared entry made by other code is never reused."""
    from importlib.metadata import PackageNotFoundError, version

    h = hashlib.sha256()
    hash_python_sources(h, Path(__file__).resolve().parent)
    try:
        h.update(version("nbgrader").encode())
    except PackageNotFoundError:
        pass
    return h.hexdigest()


@dataclass
class Prepared:
    """What checking one assignment needs, ready on disk (a cache entry, or a temporary folder)."""

    assignment: str
    folder: Path
    stubs: dict[str, str]  # answer cell grade_id -> the stub the student release has
    cached: bool = True

    @property
    def course(self) -> Course:
        """A course of one assignment (its source notebook only): all the sandbox's world needs."""
        course = Course(self.folder / "course")
        course._kit = str(self.folder / "kit")
        return course

    @property
    def source_path(self) -> Path:
        return self.folder / "course" / "source" / self.assignment / f"{self.assignment}.ipynb"

    def source(self) -> nbformat.NotebookNode:
        return nbformat.read(self.source_path, as_version=4)


def _solution_sources(nb) -> dict[str, str]:
    return {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("solution")}


def release_stubs(source_nb, course_dir: Path) -> dict[str, str]:
    """The answer cells of the student release, by grade_id: nbgrader's ClearSolutions (the only
    step of `generate_assignment` that touches an answer cell) with the course's configuration."""
    from nbgrader.preprocessors import ClearSolutions
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course_dir)).load_config()
    nb, _ = ClearSolutions(config=config).preprocess(copy.deepcopy(source_nb), {})
    return _solution_sources(nb)


def _entry_key(assignment: str, solution: bytes) -> str:
    h = hashlib.sha256(assignment.encode() + b"\0" + hashlib.sha256(solution).digest())
    h.update(grader_version().encode())
    return h.hexdigest()[:20]


def _build_entry(staging: Path, assignment: str, solution: bytes, key: str) -> dict[str, str]:
    course = staging / "course"
    source = course / "source" / assignment / f"{assignment}.ipynb"
    source.parent.mkdir(parents=True)
    source.write_bytes(solution)
    write_course_config(course)
    stubs = release_stubs(nbformat.reads(solution.decode("utf-8"), as_version=4), course)
    make_kit(staging / "kit")
    (staging / "stubs.json").write_text(json.dumps(stubs))
    (staging / READY).write_text(json.dumps({"key": key, "assignment": assignment, "created": time.time()}))
    return stubs


def _load_entry(folder: Path, key: str) -> dict[str, str] | None:
    try:
        if json.loads((folder / READY).read_text()).get("key") != key:
            return None
        return json.loads((folder / "stubs.json").read_text())
    except (OSError, ValueError, AttributeError):
        return None


def _prune(root: Path, assignment: str, keep: Path) -> None:
    """Remove entries of `assignment` made for another solution or grader, and abandoned builds,
    once nothing has used them for PRUNE_AFTER_SECONDS (no check can still be running on them)."""
    now = time.time()
    for path in root.glob(f"*{assignment}-*"):
        if path == keep or not (path.name.startswith(f"{assignment}-") or path.name.startswith(f".{assignment}-")):
            continue
        try:
            if now - path.stat().st_mtime > PRUNE_AFTER_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def prepare(assignment: str, solutions: Path | None = None, root: Path | None = None) -> Prepared:
    """The prepared entry for `assignment`: reused when one exists for this solution notebook and
    this grader, else built (atomically: in a folder aside, then renamed). Where the cache
    cannot be written, a temporary folder is prepared instead (the caller removes it)."""
    solution = notebook_path(assignment, solutions).read_bytes()
    key = _entry_key(assignment, solution)
    root = Path(root) if root else cache_root()
    folder = root / f"{assignment}-{key}"
    stubs = _load_entry(folder, key)
    if stubs is not None:
        try:
            os.utime(folder)  # in use: an entry is pruned only once nothing has used it for a while
        except OSError:
            pass
        return Prepared(assignment, folder, stubs)
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{assignment}-", dir=root))
    except OSError:  # no writable cache: prepare in a temporary folder, used once
        staging = Path(tempfile.mkdtemp(prefix="attn-check-"))
        try:
            return Prepared(assignment, staging, _build_entry(staging, assignment, solution, key), cached=False)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    try:
        stubs = _build_entry(staging, assignment, solution, key)
        try:
            staging.rename(folder)
        except OSError:  # another check put the same entry in place first: use theirs
            if _load_entry(folder, key) is None:  # ... unless it is broken: replace it
                broken = Path(tempfile.mkdtemp(prefix=f".{assignment}-broken-", dir=root))
                folder.rename(broken / "entry")
                staging.rename(folder)
                shutil.rmtree(broken, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _prune(root, assignment, folder)
    return Prepared(assignment, folder, stubs)


# --------------------------------------------------------------------------- grading
CheckProgress = Callable[[int, int, str, float, float], None]  # (cell index, cells, what runs, its seconds, the limit)


def check_notebook(prepared: Prepared, data: bytes, limits: Limits | None = None,
                   student: str = "me", progress: CheckProgress | None = None) -> NotebookResult:
    """Grade one notebook (its bytes) as `grade_notebook` does, without nbgrader's bookkeeping:
    the same sandbox run, the same trusted verdicts, the same points and messages per test cell.
    `progress`, when given, hears which cell runs and for how long (five times a second)."""
    try:
        return judge_notebook(prepared, data, limits, student, progress)[0]
    except SandboxUnavailable as err:  # nothing of the student's ran: say so, score nothing
        return NotebookResult(student, prepared.assignment, 0.0, _max_score(prepared.source()), Status.INCIDENT,
                              detail=f"{err}; this is the grader's problem, not your notebook's: try again, "
                                     "and tell your instructor if it happens again")


def _max_score(source) -> float:
    return float(sum(c.metadata["nbgrader"].get("points", 0) for c in source.cells
                     if c.metadata.get("nbgrader", {}).get("grade")))


def judge_notebook(prepared: Prepared, data: bytes, limits: Limits | None = None, student: str = "me",
                   progress: CheckProgress | None = None, hidden: tuple[str, ...] = ()
                   ) -> tuple[NotebookResult, dict[str, trusted.Verdict]]:
    """`check_notebook`'s result and the trusted verdicts it was scored from (what nbgrader's
    gradebook is filled from on the grading machine: autograder/cluster.py). `hidden`: more folders
    the sandbox never shows. SandboxUnavailable when the sandbox could not run it."""
    limits = limits or Limits()
    assignment = prepared.assignment
    source = prepared.source()
    tests = trusted.test_cells(source)
    max_score = _max_score(source)
    student_nb, problem = parse_notebook(data)
    if problem:
        return NotebookResult(student, assignment, 0.0, max_score, Status.UNREADABLE, detail=problem), {}
    normalized = trusted.normalize_submission(student_nb, source)
    job = trusted.build_job(normalized, tests)
    job.wrong = trusted.wrong_notebook(student_nb, normalized, source, assignment)  # none of its answer cells
    course = prepared.course
    # every prepared entry (other notebooks' solutions) is hidden, whatever the sandbox
    course.extra_hidden = [str(prepared.folder.parent if prepared.cached else prepared.folder), *hidden]
    jobs = prepared.folder / "jobs"
    jobs.mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{student}--", dir=jobs))  # one per check: checks may overlap
    try:
        world = sandbox_world(course, assignment, folder)
        def live(i: int | None, seconds: float) -> None:
            what = trusted.describe_cell(job, i) if i is not None else STARTING
            progress(i or 0, len(job.cells), what, seconds, limits.cell_seconds)

        # a check on its own starts a fresh sandbox; inside a `warm_sandboxes` block (a grading run, the
        # test suite) it forks from that block's server for this world, as `attn-course grade`'s runs do
        warm = warm_sandbox.current()
        verdicts, run = trusted.grade_job(job, tests, limits.cell_seconds,
                                          lambda inputs: run_notebook_job(folder, inputs, world, limits,
                                                                          live if progress else None, warm=warm))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    graded = set(_solution_sources(source))
    status, detail, others = trusted.incidents_status(run, job)
    result = NotebookResult(student, assignment, 0.0, max_score, status, detail=detail, other_kinds=others)
    for t in tests:
        v = verdicts.get(t.grade_id) or trusted.Verdict(False, "not graded")
        cell = CellResult(t.grade_id, exercise_of(t.grade_id, graded), t.points if v.passed else 0.0, t.points, v.note)
        if not v.passed:
            cell.take_verdict(v)
        result.cells.append(cell)
    result.score = float(sum(c.score for c in result.cells))
    result.review, result.sandbox = trusted.review_notes(job), run.isolation
    return result, verdicts


def self_check(notebook: Path, solutions: Path | None = None, limits: Limits | None = None,
               cache: Path | None = None, progress: CheckProgress | None = None) -> tuple[NotebookResult, dict[str, str]]:
    """Grade `notebook`; returns the result and, per exercise, 'pass', 'fail' or 'not attempted'."""
    notebook = Path(notebook)
    if not notebook.is_file():
        raise FileNotFoundError(f"{notebook} does not exist: give the path of your .ipynb file")
    return self_check_data(notebook.read_bytes(), notebook.name, solutions, limits, cache, progress)


def self_check_data(data: bytes, name: str = "", solutions: Path | None = None, limits: Limits | None = None,
                    cache: Path | None = None, progress: CheckProgress | None = None) -> tuple[NotebookResult, dict[str, str]]:
    """`self_check` on a notebook's JSON itself (a live notebook: Colab's is no file on the machine).
    `name` is its file name when known; else the notebook is recognised by its answer cells."""
    known = {a: set() for a in assignments(solutions)}
    exported = export_of(name, known) if name else None
    if exported is not None and parse_notebook(data)[1] is not None:  # the HTML or .py Jupyter exported, say
        kind = exported[1].split(" of ", 1)[0]
        raise ValueError(f"{name} is {kind} of {exported[0]}, not the notebook: nothing in it can be checked or "
                         f"graded; check (and hand in) the .ipynb file itself: attn-course check {exported[0]}.ipynb")
    assignment = match_assignment(name, data, known) if name else None
    if assignment is None:
        assignment = match_assignment(name, data, _grade_ids_of(known, solutions))
    if assignment is None:
        what = name or "this notebook"
        unreadable = parse_notebook(data)[1]
        if unreadable is not None:  # no name to go by, and no cells to recognise it by: the file itself is broken
            raise ValueError(f"{what} cannot be read as a notebook: {unreadable}. Open your copy of the notebook in "
                             "Jupyter and save it again (or download it again, as .ipynb), then check that file")
        raise ValueError(f"{what} is not one of the course notebooks ({', '.join(known)}); "
                         "keep the file name you were given")
    prepared = prepare(assignment, solutions, cache)
    try:
        result = check_notebook(prepared, data, limits, progress=progress)
    finally:
        if not prepared.cached:
            shutil.rmtree(prepared.folder, ignore_errors=True)
    return result, verdicts_of(result, data, prepared.stubs)


def _grade_ids_of(known: dict[str, set[str]], solutions: Path | None) -> dict[str, set[str]]:
    """Each assignment's grade ids, read from its solution notebook (to recognise a notebook by content)."""
    ids = {}
    for assignment in known:
        nb = nbformat.read(notebook_path(assignment, solutions), as_version=4)
        ids[assignment] = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                           if c.metadata.get("nbgrader", {}).get("grade_id")}
    return ids


def verdicts_of(result: NotebookResult, data: bytes, stubs: dict[str, str]) -> dict[str, str]:
    """Per exercise: 'missing' when the notebook has no answer cell for it and its tests fail (a
    deleted cell, or another notebook: there is no `raise NotImplementedError()` to replace),
    'not attempted' while its answer cell still holds the release's stub, else 'pass' when every
    one of its test cells scored full points, else 'fail'."""
    mine = _answer_sources(data)
    verdicts: dict[str, str] = {}
    by_exercise = defaultdict(list)
    for cell in result.cells:
        by_exercise[cell.exercise].append(cell)
    for exercise, cells in by_exercise.items():
        passed = all(c.score >= c.max_score for c in cells)
        if exercise in stubs and exercise not in mine and not passed:
            verdicts[exercise] = "missing"
        elif exercise in stubs and mine.get(exercise) == stubs[exercise]:
            verdicts[exercise] = "not attempted"
        else:
            verdicts[exercise] = "pass" if passed else "fail"
    return verdicts


def _answer_sources(data: bytes) -> dict[str, str]:
    """grade_id -> source of a submission's code cells that carry a grade id (the first of each), read
    as leniently as the grader reads it; {} for a file that is not a notebook."""
    notebook, _ = parse_notebook(data)
    found: dict[str, str] = {}
    for cell in notebook["cells"] if notebook else []:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if isinstance(gid, str) and cell.get("cell_type") == "code" and gid not in found:
            source = cell.get("source", "")
            found[gid] = "".join(source) if isinstance(source, list) else str(source)
    return found


def format_report(result: NotebookResult, verdicts: dict[str, str]) -> str:
    marks = {"pass": "PASS", "fail": "FAIL", "not attempted": "TODO", "missing": "GONE"}
    lines = [f"{result.notebook}: {result.score:g} / {result.max_score:g} points"
             + ("" if result.status is Status.OK else f"  [{result.status_text}]")]
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
        if verdict == "missing":
            skipped = next((c.message.split("Where to look: ", 1)[1] for c in cells
                            if "Where to look: " in (c.message or "")), "")
            if skipped:  # their code is there, in a cell the grader does not run (merged into a grader-skip cell)
                lines.append(f"        no answer cell for {exercise} in your notebook, and {skipped}")
                continue
            lines.append(f"        no answer cell for {exercise} in your notebook (deleted, or another notebook): in "
                         "Jupyter, copy that cell from a fresh copy of the course notebook (the whole cell, not just "
                         "its text) and put your code in it")
            continue
        for c in cells:
            if c.message:  # why it failed; for a passed cell, a note (a failed dependency was replaced)
                text = "\n        ".join(printable(line) for line in c.message.split("\n"))  # a student's own
                # exception message may hold a terminal's control sequences (an instructor checks suspicious ones)
                lines.append(f"        {c.grade_id}: {'' if c.score < c.max_score else 'passed; '}{text}")
    if result.review:  # an instructor reads these by hand: the student hears of them before submitting, not after
        lines.append("for your instructor to look at by hand (they take no points by themselves; a line your code "
                     "does not need is better removed):")
        lines += [f"  - {note}" for note in re.split(r"; (?=cell \d+, line \d+: )", result.review) if note]
    if (result.sandbox or "").startswith("none"):
        why = result.sandbox.split(":", 1)[1].strip() if ":" in result.sandbox else result.sandbox
        lines.append(f"note: checked without a sandbox here ({why}): your code ran as yourself, with the same "
                     "checks and points as the instructor's grader, which runs it sandboxed")
    return "\n".join(lines)
