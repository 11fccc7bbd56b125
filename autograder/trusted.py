"""The trusted half of grading: turn a submission into a sandbox job, then judge what comes
back against the reference. Nothing here executes student code.

A test cell's verdict is decided here, from the hidden checks written in the *source*
notebook's test cell (`nbXX.check("name", variable)`): the cell passes when every one of
them agrees with the reference on every case.

Each exercise is graded on its own (`grade_job`). An exercise that calls another graded one (a
notebook's `DEPENDS`, in autograder/checks/nbXX.py: `basic_self_attention` calls `softmax`) would
otherwise lose its points for the other one's mistake. So when such a dependency failed its own
tests and the exercise failed too, the notebook runs a second time in the sandbox, and while the
exercise's test cells are checked the failed dependencies are the course's implementations: the
exercise then passes or fails on its own code, and the message says which dependency decided.
The course's implementations travel as code objects without source, docstrings or file names
(`blind_reference`); from that second run only verdicts come back to the student (passed or not,
and which catalogued mistake the output matches): no value, error message, output, incident or
timing of it is shown, so nothing the student's code does with the reference can reach them.
A notebook whose dependencies pass (a correct one, a blank one) runs once, as before.
"""
from __future__ import annotations

import builtins
import copy
import dataclasses
import hashlib
import importlib
import re
import sys
import types
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import cloudpickle
import nbformat

from .checks.core import (
    KNOWN_MISTAKE,
    TRUSTED_TURN,
    Exercise,
    case_reference,
    cases_of,
    check_salt,
    diagnose,
    diagnose_crash,
    failure_of,
    judge,
    notimpl_origin,
    owned_by,
    trusted_run,
)
from .outcomes import AS_HANDED_IN, Status, Verdict, summarize
from .sandbox import Incident, JobResult
from .syntax_trees import in_turn

SKIP_TAG = "grader-skip"  # cell tag: the grader does not run this cell (it is long and not graded)
INSTALL_TAG = "colab-install"  # the course's Colab install cell (course_tools/colab.py), in every notebook
PROVIDED = "attn_provided_install"  # set by normalize_submission only, on a cell equal to the course's install cell
CHECK_CALL = re.compile(r"\b(nb\d+)\.check\(\s*[\"'](\w+)[\"']\s*,\s*(\w+)\s*\)")
CELL_ERRORS = "#cell-errors"  # runner.CELL_ERRORS: the code cells' exceptions, inside a test cell's results
REFERENCE_MODULE = "attention_reference"  # the module the blind references claim (it exists nowhere)
# Causes of a failed test cell that a run with the course's dependencies cannot change.
NOT_ISOLABLE = {"missing", "notimpl", "forbidden-static", "no-checks", "unreadable"}


@dataclass(frozen=True)
class CheckRef:
    module: str  # autograder.checks.<module>
    name: str  # the check's name in that module
    variable: str  # the notebook variable it is applied to

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass
class TestCell:
    grade_id: str
    points: float
    checks: list[CheckRef]


@dataclass
class Job:
    cells: list[dict]
    test_cell_index: dict[str, int]  # test grade_id -> index in cells
    solution_sources: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # every code cell the student wrote, run or not
    source_positions: list = field(default_factory=list)  # per entry of `sources`: its cell number in the notebook
    findings: list = field(default_factory=list)  # honesty.Finding, from the static pass
    positions: list = field(default_factory=list)  # per entry of `cells`: its cell number in the notebook (1-based), or None
    answer_cells: dict[str, int] = field(default_factory=dict)  # answer grade_id -> index in cells
    cell_timeout: float = 60.0  # the per-cell time limit the sandbox ran with
    errors: dict[int, dict] = field(default_factory=dict)  # code cell index -> the exception it stopped with
    sandbox_runs: int = 0  # 1, or 2 when a failed dependency had its exercises checked again
    wrong: WrongNotebook | None = None  # set when the submission has none of the assignment's answer cells
    skipped: list = field(default_factory=list)  # (cell number, source) of the cells not run (grader-skip)


# --------------------------------------------------------------------------- source side
def test_cells(source_nb) -> list[TestCell]:
    """The graded test cells of a source notebook, with the hidden checks each one runs."""
    found = []
    for cell in source_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            checks = [CheckRef(m, n, v) for m, n, v in CHECK_CALL.findall(cell.source)]
            found.append(TestCell(meta["grade_id"], float(meta.get("points", 0)), checks))
    return found


@lru_cache(maxsize=None)
def exercise(ref: CheckRef) -> Exercise:
    module = importlib.import_module(f"autograder.checks.{ref.module}")
    return module.check.exercises[ref.name]


def cases(ref: CheckRef):
    """The exercise's hidden cases under the salt in force (a grading run's secret one, or the public one)."""
    with TRUSTED_TURN:  # drawn once per process, by one thread: every thread then judges the same cases
        return _cases(ref, check_salt())


def expected(ref: CheckRef):
    """The reference's output on each of `cases(ref)` (computed once, as `cases` is)."""
    with TRUSTED_TURN:
        return _expected(ref, check_salt())


@lru_cache(maxsize=None)
def _cases(ref: CheckRef, salt: str):
    return tuple(cases_of(exercise(ref)))


@lru_cache(maxsize=None)
def _expected(ref: CheckRef, salt: str):
    return tuple(trusted_run(case, case_reference(exercise(ref), case)) for case in _cases(ref, salt))


def _sandbox_exercise(ex: Exercise) -> Exercise:
    """What the sandbox may know of an exercise: its name and the built-ins it forbids.
    No reference, no mistakes, no case generator."""
    builtins_ = tuple((f, why) for f, why in ex.forbidden
                      if not str(getattr(f, "__module__", "")).startswith("attention_course"))
    return dataclasses.replace(ex, reference=None, cases=None, mistakes=(), namespace={}, forbidden=builtins_)


# --------------------------------------------------------------------------- the submission
def _as_typed(source: str) -> str:
    """A cell's text as typed: an editor's line endings (CRLF, CR), trailing spaces and blank lines at the end
    change nothing a person wrote (the course's install cell saved on Windows was read as the student's code)."""
    lines = source.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def install_digest(source: str) -> str:
    """SHA-256 of an install cell's source as typed (line ends and trailing spaces aside): how an earlier release's
    cell, unedited, is known (course_tools.colab.earlier_digests)."""
    return hashlib.sha256(_as_typed(source).encode()).hexdigest()


def normalize_submission(student_nb, source_nb) -> nbformat.NotebookNode:
    """The student's notebook as nbgrader should see it: grade metadata restored from the source
    for the first cell of each known grade_id, dropped from duplicates and unknown ids (so an
    edited `points`, a renamed grade_id or a duplicated cell can neither earn nor crash), and the
    course's kernelspec. The outputs of each code cell are carried, bounded and filtered, in its
    metadata (outputs.student_outputs, plugins.TrustedVerdicts): feedback shows them, nothing runs them."""
    from .outputs import (
        FEEDBACK_OUTPUTS,
        NOTEBOOK_MARKUP_LIMIT,
        NOTEBOOK_OUTPUT_LIMIT,
        _is_count,
        not_shown,
        student_outputs,
    )

    source_meta = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]
                   for c in source_nb.cells if "nbgrader" in c.metadata}
    source_type = {c.metadata["nbgrader"]["grade_id"]: c.cell_type
                   for c in source_nb.cells if "nbgrader" in c.metadata}
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": source_nb.metadata.get("kernelspec", {}),
                                            "language_info": {"name": "python"}})
    seen, output_budget, markup_budget = set(), NOTEBOOK_OUTPUT_LIMIT, NOTEBOOK_MARKUP_LIMIT
    # the course's own install cell, unedited: neither run (it does nothing off Colab) nor read as the
    # student's code (it starts pip); edited, it is the student's code like any other cell
    installs = [c for c in source_nb.cells if c.cell_type == "code" and INSTALL_TAG in c.metadata.get("tags", [])]
    provided = {_as_typed(c.source) for c in installs}
    earlier = {d for c in installs for d in c.metadata.get("attn_install_earlier", []) if isinstance(d, str)}
    for cell in student_nb.get("cells", []):
        if not isinstance(cell, dict):  # a string or null among the cells: no cell (it once made the grader fail)
            continue
        ctype = cell.get("cell_type")
        src = cell.get("source", "")
        src = "".join(p for p in src if isinstance(p, str)) if isinstance(src, list) else \
            src if isinstance(src, str) else ""
        if ctype == "code":
            new = nbformat.v4.new_code_cell(src)
        elif ctype in ("markdown", "raw"):
            if len(src) > markup_budget:  # every later reader parses it as HTML: bounded per notebook, as outputs are
                src = not_shown(f"{ctype} cell", f"the notebook's {ctype} and markdown cells are past the "
                                f"{NOTEBOOK_MARKUP_LIMIT:,} characters the feedback page shows")
            markup_budget -= len(src)
            new = (nbformat.v4.new_markdown_cell if ctype == "markdown" else nbformat.v4.new_raw_cell)(src)
        else:
            continue
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        tags = meta.get("tags")
        if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
            new.metadata["tags"] = list(tags)
        gid = meta.get("nbgrader", {}).get("grade_id") if isinstance(meta.get("nbgrader"), dict) else None
        if isinstance(gid, str) and gid in source_meta and gid not in seen and source_type[gid] == ctype:
            seen.add(gid)
            new.metadata["nbgrader"] = dict(source_meta[gid])
            new.metadata["nbgrader"].pop("checksum", None)
        if ctype == "code" and "nbgrader" not in new.metadata and \
                (_as_typed(src) in provided or (earlier and install_digest(src) in earlier)):
            new.metadata[PROVIDED] = True
        test_cell = new.metadata.get("nbgrader", {}).get("grade") and not new.metadata["nbgrader"].get("solution")
        if ctype == "code" and not test_cell:  # a test cell shows its verdict only
            outputs, used = student_outputs(cell.get("outputs"), output_budget)
            output_budget -= used
            if outputs:
                count = cell.get("execution_count")
                new.metadata[FEEDBACK_OUTPUTS] = {"outputs": outputs, "execution_count": count if _is_count(count) else None}
        nb.cells.append(new)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:04d}"
    return nb


# --------------------------------------------------------------------------- is it this notebook?
MAX_NAMED = 8  # answer cells named one by one in a message; the rest are counted
RESTORED_ANSWER = ("# The grader put this answer cell back, empty: your notebook had no answer cell `{gid}`\n"
                   "# (it was deleted, or the code was pasted into a cell without the course's marks).\n")


@dataclass(frozen=True)
class WrongNotebook:
    """A submission with none of its assignment's answer cells: another notebook (another course's,
    another assignment's), or this one with every answer cell deleted or pasted into a new notebook.
    It is still run and judged like any other (code pasted into unmarked cells keeps the points it
    earns); its status says what is wrong, and each test that finds nothing to check says why,
    instead of nbgrader failing on the cells it cannot put back."""

    assignment: str
    expected: tuple[str, ...]  # the assignment's answer cells, in notebook order
    found: tuple[str, ...]  # answer cells the submission has, of another notebook

    @property
    def detail(self) -> str:
        """The status detail, for the instructor's table and the student's check: one line."""
        found = (f"it has the answer cells of another notebook ({_names(self.found)})" if self.found
                 else "it has no answer cell at all")
        return (f"none of the {len(self.expected)} answer cells of {self.assignment} is in this notebook "
                f"({_names(self.expected)}); {found}: another notebook, its answer cells deleted, or its cells' "
                "metadata removed by a tool (jupytext's or nbstripout's metadata filters, a paste into a new "
                "notebook); each test scored what the notebook's own code defines")

    @property
    def message(self) -> str:
        """A test cell's message when the name it checks is not defined: what was expected, what
        came back, what to do. The same for every test cell, so the feedback shows it once."""
        found = (f"answer cells of another notebook ({_names(self.found)})" if self.found else
                 "no answer cell at all (deleted, or your code was pasted into a new notebook, which drops "
                 "the marks that make a cell an answer cell)")
        return (f"Your notebook has none of the answer cells of {self.assignment}: is it another notebook?\n"
                f"  Expected: the answer cells {_names(self.expected)}, the cells under the exercises that held "
                "`raise NotImplementedError()`.\n"
                f"  Found: {found}.\n"
                f"  What to do: open the course's {self.assignment}.ipynb (a fresh copy if yours is lost), put your "
                "code in its answer cells, save it and submit that file.")


def _names(ids) -> str:
    ids = list(ids)
    shown = ", ".join(ids[:MAX_NAMED])
    return shown + (f" and {len(ids) - MAX_NAMED} more" if len(ids) > MAX_NAMED else "")


def answer_cell_ids(source_nb) -> list[str]:
    """The grade ids of a source notebook's answer cells (nbgrader solution cells), in order."""
    return [c.metadata["nbgrader"]["grade_id"] for c in source_nb.cells
            if c.metadata.get("nbgrader", {}).get("solution") and c.metadata["nbgrader"].get("grade_id")]


def missing_answer_cells(normalized, source_nb) -> list[str]:
    """The source's answer cells that a normalized submission has no cell for (normalize_submission
    keeps a grade id only on a cell of the source's type): deleted, or another notebook."""
    present = {c.metadata.get("nbgrader", {}).get("grade_id") for c in normalized.cells}
    return [gid for gid in answer_cell_ids(source_nb) if gid not in present]


def wrong_notebook(student_nb: dict, normalized, source_nb, assignment: str) -> WrongNotebook | None:
    """A WrongNotebook when the submission has none of the source's answer cells, else None.
    `student_nb` is the submission as parsed (its own answer cells name the notebook it is)."""
    expected = answer_cell_ids(source_nb)
    if not expected or len(missing_answer_cells(normalized, source_nb)) < len(expected):
        return None
    return WrongNotebook(assignment, tuple(expected), tuple(_own_answer_ids(student_nb)))


def _own_answer_ids(student_nb: dict) -> list[str]:
    """The grade ids of the cells a submission itself marks as answer cells, shown in messages: the
    submission's own text, so each is cut to 60 characters of letters, digits, '_', '.' and '-'."""
    found = []
    for cell in student_nb.get("cells", []) if isinstance(student_nb, dict) else []:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) and nbgrader.get("solution") else None
        shown = re.sub(r"[^\w.-]", "?", gid, flags=re.ASCII)[:60] if isinstance(gid, str) else ""
        if shown and shown not in found:
            found.append(shown)
    return found


def submission_notes(student_nb: dict, source_nb) -> list[str]:
    """What the instructor's table says of a submission's form, handled without costing a point: an answer or test
    cell that appears more than once (a copy made in the editor; every copy runs, in order), and a kernel of another
    language than Python (the notebook is run with the course's)."""
    known = {c.metadata["nbgrader"]["grade_id"] for c in source_nb.cells if "nbgrader" in c.metadata}
    counts: dict[str, int] = {}
    for cell in student_nb.get("cells", []) if isinstance(student_nb, dict) else []:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        gid = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if isinstance(gid, str) and gid in known:
            counts[gid] = counts.get(gid, 0) + 1
    notes = [f"{AS_HANDED_IN}: cell `{gid}` appears {n} times (copied in the editor): every copy ran, in order, and "
             f"each test used the definition above it" for gid, n in counts.items() if n > 1]
    meta = student_nb.get("metadata") if isinstance(student_nb, dict) else None
    kernel = meta.get("kernelspec") if isinstance(meta, dict) else None
    if isinstance(kernel, dict):  # said by its language only: a Python kernel's name is any name (VS Code's venvs)
        language = str(kernel.get("language") or "")
        if language and "python" not in language.lower():
            shown = re.sub(r"[^\w .()-]", "?", str(kernel.get("display_name") or kernel.get("name") or language))[:60]
            notes.append(f"{AS_HANDED_IN}: its kernel was set to {shown}; it was run with the course's Python kernel")
    return notes


def with_answer_cells(normalized, source_nb) -> nbformat.NotebookNode:
    """A copy of a normalized submission with each answer cell it lacks put back (empty but for a
    comment saying why) after the nearest earlier cell of the source that it has: what nbgrader
    records and the feedback shows. Without them nbgrader's autograde fails when it puts back a
    deleted test cell whose answer cell is gone too (KeyError: 'normalize_rows'). Never run: the
    sandbox's job is built from the submission itself."""
    nb = nbformat.from_dict(copy.deepcopy(dict(normalized)))
    order = [c.metadata["nbgrader"]["grade_id"] for c in source_nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")]
    meta = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"] for c in source_nb.cells
            if c.metadata.get("nbgrader", {}).get("grade_id")}
    for gid in missing_answer_cells(nb, source_nb):
        cell = nbformat.v4.new_code_cell(RESTORED_ANSWER.format(gid=gid))
        cell.metadata["nbgrader"] = {k: v for k, v in meta[gid].items() if k != "checksum"}
        nb.cells.insert(_after_earlier(nb, order[:order.index(gid)]), cell)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:04d}"
    return nb


def _after_earlier(nb, earlier: list[str]) -> int:
    """The index just after the cell of `nb` holding the last of the `earlier` grade ids it has (0: none)."""
    where = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(nb.cells)}
    for gid in reversed(earlier):
        if gid in where:
            return where[gid] + 1
    return 0


def build_job(student_nb, tests: list[TestCell]) -> Job:
    """Cells to run, in the student's order; each known test cell becomes a 'record' step
    (its source is never run); test cells the student deleted are recorded at the end."""
    by_id = {t.grade_id: t for t in tests}
    cells, index, solutions, sources, positions, answers, source_positions, skipped = [], {}, {}, [], [], {}, [], []
    for number, cell in enumerate(student_nb.cells, start=1):
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if cell.cell_type != "code" or cell.metadata.get(PROVIDED):
            continue
        if gid in by_id and gid not in index:
            index[gid] = len(cells)
            cells.append({"kind": "record", "test": gid,
                          "checks": [{"name": c.key, "variable": c.variable} for c in by_id[gid].checks]})
            positions.append(number)
            continue
        sources.append(cell.source)
        source_positions.append(number)
        if meta.get("solution") and gid:
            solutions[gid] = cell.source
        if SKIP_TAG in cell.metadata.get("tags", []) and not meta.get("solution"):
            skipped.append((number, cell.source))
            continue  # long, ungraded work (data download, training): not run when grading
        if meta.get("solution") and gid and gid not in answers:
            answers[gid] = len(cells)
        cells.append({"kind": "code", "source": cell.source})
        positions.append(number)
    for t in tests:
        if t.grade_id not in index:
            index[t.grade_id] = len(cells)
            cells.append({"kind": "record", "test": t.grade_id,
                          "checks": [{"name": c.key, "variable": c.variable} for c in t.checks]})
            positions.append(None)
    return Job(cells, index, solutions, sources, positions=positions, answer_cells=answers,
               source_positions=source_positions, skipped=skipped)


def _blind_checks(refs) -> bytes:
    """The checks the sandbox runs, pickled: per check the cases' inputs (descriptions blanked) and
    the forbidden built-ins. No references, no mistakes, no case descriptions."""
    checks = {}
    for ref in sorted(set(refs), key=lambda c: c.key):
        cloudpickle.register_pickle_by_value(importlib.import_module(f"autograder.checks.{ref.module}"))
        blind = [dataclasses.replace(case, description=f"case {i}", reference=None) for i, case in enumerate(cases(ref))]
        checks[ref.key] = {"exercise": _sandbox_exercise(exercise(ref)), "cases": blind}
    return cloudpickle.dumps(checks)


def job_inputs(job: Job, tests: list[TestCell], cell_timeout: float) -> dict:
    """Everything the sandbox gets, in one pickled message on a descriptor (never a file in a
    folder it can see): the cells to run and, per check, the cases' inputs and the forbidden
    built-ins. No references, no mistakes, no case descriptions."""
    job.cell_timeout = cell_timeout
    return {"cells": job.cells, "skip": [], "cell_timeout": cell_timeout,
            "checks": _blind_checks(c for t in tests for c in t.checks)}


# --------------------------------------------------------------------------- grading, start to end
_WARM: list[bool] = []


def warm_up() -> None:
    """Import, once and before the grading threads need them, what judging would otherwise first
    import inside one of them: every notebook's checks, the course library (the honesty scan
    resolves names in it) and matplotlib's mathtext (the feedback pages' formulas). A first import
    of torch's or matplotlib's modules parses Python, so it takes syntax_trees' turn."""
    if not _WARM:
        in_turn(_import_everything_judging_uses)
        _WARM.append(True)


def _import_everything_judging_uses() -> None:
    import pkgutil

    import attention_course

    from . import checks

    for module in pkgutil.iter_modules(checks.__path__):
        if module.name.startswith("nb"):
            importlib.import_module(f"{checks.__name__}.{module.name}")
    for module in pkgutil.iter_modules(attention_course.__path__):
        importlib.import_module(f"attention_course.{module.name}")
    importlib.import_module("matplotlib.mathtext")


def grade_job(job: Job, tests: list[TestCell], cell_timeout: float,
              run: Callable[[dict], JobResult]) -> tuple[dict[str, Verdict], JobResult]:
    """The whole trusted path for one notebook: `run(inputs)` runs the sandbox once; its outcomes
    are judged here. Only when an exercise failed and a graded function it calls (DEPENDS) failed
    its own tests too does a second run check that exercise with the course's dependency in place
    (see the module's docstring). Returns the verdicts and the first run (status, incidents)."""
    first = run(job_inputs(job, tests, cell_timeout))
    job.sandbox_runs = 1
    verdicts = _judge_run(job, tests, first)
    plan = isolation_plan(job, tests, verdicts)
    if plan is not None:
        second = run(isolated_inputs(job, tests, plan, first))
        job.sandbox_runs = 2
        apply_isolation(job, tests, verdicts, plan, second)
    condense(job, tests, verdicts)
    return verdicts, first


# --------------------------------------------------------------------------- judging
def judge_job(job: Job, tests: list[TestCell], run: JobResult) -> dict[str, Verdict]:
    """A verdict per test cell, from the outcomes one sandbox run sent (held in the grader's memory)."""
    verdicts = _judge_run(job, tests, run)
    condense(job, tests, verdicts)
    return verdicts


def _judge_run(job: Job, tests: list[TestCell], run: JobResult) -> dict[str, Verdict]:
    from .serialize import loads

    job.findings = honesty_findings(job, tests)
    parsed: dict[int, Any] = {}
    for i, blob in run.results.items():
        try:
            parsed[i] = loads(blob)
        except Exception as err:  # noqa: BLE001 - anything the sandbox sent is untrusted
            parsed[i] = err
    job.errors = _cell_errors(job, parsed.values())
    verdicts = {}
    for t in tests:
        i = job.test_cell_index[t.grade_id]
        if not t.checks:
            verdicts[t.grade_id] = Verdict(False, "this test cell has no hidden check (a course bug: tell your instructor)",
                                           cause="no-checks")
            continue
        if i not in parsed:
            verdicts[t.grade_id] = Verdict(False, _why_not_reached(t, i, run, job), cause="unreached")
            continue
        outcomes = parsed[i]
        if isinstance(outcomes, Exception):
            verdicts[t.grade_id] = Verdict(False, f"the grader could not read this cell's results "
                                                  f"({type(outcomes).__name__}: {str(outcomes)[:200]})", cause="unreadable")
            continue
        verdicts[t.grade_id] = _judge_cell(t, outcomes, job, run)
    _explain_names_set_where_skipped(job, verdicts)
    return verdicts


# a NameError in a check, or the grader's own "nothing named `X` is defined" (a student's answer merged into the
# grader-skip cell above it, in Lab: the merged cell keeps the first cell's tag, and their answer never ran)
_NOT_DEFINED = re.compile(r"name '(\w+)' is not defined|nothing named `(\w+)` is defined")


def _explain_names_set_where_skipped(job: Job, verdicts: dict[str, Verdict]) -> None:
    """A NameError for a name that only cells the grader skips (grader-skip) set: the message says which
    cells, and that they do not run. Each cell is parsed at most once per notebook, and only when its text
    holds one of the names (a huge skipped cell must not hold the grader's parse turn once per test cell)."""
    names = {m.group(1) or m.group(2) for v in verdicts.values() if not v.passed
             for m in [_NOT_DEFINED.search(v.message or "")] if m}
    if not names or not job.skipped:
        return
    from .honesty import top_level_names

    parsed: dict[int, set[str]] = {}

    def binds(key: int, source: str, name: str) -> bool:
        if not re.search(rf"\b{re.escape(name)}\b", source):
            return False
        if key not in parsed:
            parsed[key] = top_level_names(source)
        return name in parsed[key]

    run = [(-1 - i, c["source"]) for i, c in enumerate(job.cells) if c["kind"] == "code"]
    hints = {}
    for name in sorted(names):
        numbers = [number for number, source in job.skipped if binds(number, source, name)]
        if numbers and not any(binds(key, source, name) for key, source in run):
            cells = f"cell {numbers[0]}" if len(numbers) == 1 else \
                "cells " + ", ".join(map(str, numbers[:-1])) + f" and {numbers[-1]}"
            hints[name] = (f"\n  Where to look: `{name}` is set only in {cells} of the notebook, which the grader does "
                           f"not run (tagged {SKIP_TAG}: long, ungraded work such as training). Set it in a cell the "
                           f"grader runs, such as your answer cell or one before it (an answer merged into that cell "
                           f"keeps its tag: split it back into a cell of its own, such as the answer cell from a fresh "
                           f"copy of the notebook).")
    for v in verdicts.values():
        found = None if v.passed else _NOT_DEFINED.search(v.message or "")
        name = found and (found.group(1) or found.group(2))
        if name in hints:
            v.message += hints[name]


def _cell_errors(job: Job, outcomes) -> dict[int, dict]:
    """The code cells' exceptions the runner reported (untrusted: only used to explain, and checked)."""
    found = {}
    for value in outcomes:
        reported = value.get(CELL_ERRORS) if isinstance(value, dict) else None
        for key, error in (reported.items() if isinstance(reported, dict) else ()):
            try:
                i = int(key)
            except (TypeError, ValueError):
                continue
            if not (0 <= i < len(job.cells)) or job.cells[i]["kind"] != "code" or not isinstance(error, dict):
                continue
            kind, message, line = error.get("type"), error.get("message"), error.get("line")
            if isinstance(kind, str) and isinstance(message, str) and (line is None or isinstance(line, int)):
                found[i] = {"type": kind[:100], "message": message[:500], "line": line}
    return found


def honesty_findings(job: Job, tests: list[TestCell]) -> list:
    """The static honesty pass over every code cell of the submission (honesty.py)."""
    from . import honesty

    exercises = [exercise(ref) for t in tests for ref in t.checks]
    # a graded function another one calls is judged by its own exercise: a built-in inside it does not refuse
    # the caller too (SelfAttention lost its 5 points for the scaled_dot_product_attention it is asked to call);
    # the caller's check meets it at run time, and is checked again with the course's dependency in its place
    stops = {exercise(ref).graded: dependencies(ref.module).get(exercise(ref).graded, ())
             for t in tests for ref in t.checks}
    return honesty.scan(job.sources, honesty.rules_for_exercises(exercises), stops=stops)


def review_notes(job: Job) -> str:
    """What the static pass could not decide, for a human: '' when nothing was flagged."""
    return "; ".join(f"cell {source_number(job, f.cell)}, line {f.line}: {f.reason} [{f.code}]"
                     for f in job.findings if f.severity == "review")


def source_number(job: Job, k: int) -> int:
    """The notebook's cell number (1-based, as Jupyter counts every cell) of the student's k-th code cell,
    which is what the honesty pass's findings count in."""
    return job.source_positions[k] if 0 <= k < len(job.source_positions) else k + 1


def _forbidden(job: Job, graded: str):
    return next((f for f in job.findings if f.severity == "forbidden" and (not f.exercises or graded in f.exercises)),
                None)


def _judge_cell(t: TestCell, outcomes, job: Job, run: JobResult) -> Verdict:
    for ref in t.checks:
        ex = exercise(ref)
        found = _forbidden(job, ex.graded)
        if found:
            return Verdict(False, f"{ex.graded}: not accepted, because {found.reason} "
                                  f"(cell {source_number(job, found.cell)} of the notebook, line {found.line}: {found.code}).",
                           cause="forbidden-static")
        got = outcomes.get(ref.key) if isinstance(outcomes, dict) else None
        if not isinstance(got, list) or len(got) != len(cases(ref)):
            return Verdict(False, f"{ex.graded}: the checks did not complete", cause="unreadable")
        for case, outcome, want in zip(cases(ref), got, expected(ref), strict=True):
            if not isinstance(outcome, tuple) or not outcome or not isinstance(outcome[0], str):
                return Verdict(False, f"{ex.graded}: unreadable result", cause="unreadable")
            if outcome[0] == "missing":
                return Verdict(False, _missing_message(job, run, ex.graded, ref.variable), cause="missing")
            failed = failure_of(ex, case, outcome, want)
            if failed:
                cause = outcome[0]
                if cause == "notimpl" and not owned_by(notimpl_origin(outcome) or ex.graded, ex.graded):
                    cause = "notimpl-elsewhere"  # a function it calls is not written yet
                return Verdict(False, failed.message, cause=cause, mistake=failed.mistake,
                               expected=failed.expected, received=failed.received)
    return Verdict(True)


# --------------------------------------------------------------------------- saying where
def describe_cell(job: Job, i: int) -> str:
    """A cell as the student finds it: 'your answer cell `softmax` (cell 17 of the notebook)'."""
    if not 0 <= i < len(job.cells):
        return "outside any cell"
    cell = job.cells[i]
    number = job.positions[i] if i < len(job.positions) else None
    at = f"cell {number} of the notebook" if number else "added back by the grader: yours was deleted"
    if cell["kind"] == "record":
        return f"test cell `{cell['test']}` ({at})"
    answer = next((gid for gid, k in job.answer_cells.items() if k == i), None)
    if answer:
        return f"your answer cell `{answer}` ({at})"
    first = next((line.strip() for line in cell["source"].splitlines() if line.strip()), "")[:60]
    return f"{at} (the code cell starting {first!r})"


def _source_line(job: Job, i: int, line) -> str:
    if not isinstance(line, int) or line < 1:
        return ""
    lines = job.cells[i]["source"].splitlines()
    return lines[line - 1].strip()[:120] if line <= len(lines) else ""


def _timeout_text(job: Job, incident) -> str:
    if "notebook ran past" in incident.detail:
        return incident.detail
    return (f"ran past the per-cell time limit of {job.cell_timeout:g} s and "
            + ("ignored the interrupt (it was stopped)" if "ignored" in incident.detail else "was interrupted"))


def _missing_message(job: Job, run: JobResult, graded: str, variable: str) -> str:
    """'Nothing named X is defined', with the reason when the grader knows it: the answer cell
    raised (type, message, line), ran past its time limit, crashed, or is gone."""
    base = f"{graded}: nothing named `{variable}` is defined"
    i = job.answer_cells.get(graded)
    if i is None and job.wrong is not None:
        return job.wrong.message
    if i is None:
        return (f"{base}, and your notebook has no answer cell for {graded} (was it deleted, or copied without its "
                f"metadata?). Put your code back in the answer cell below the exercise and keep the name `{variable}`.")
    where = describe_cell(job, i)
    incident = next((x for x in run.incidents if x.cell == i), None)
    if incident is not None and incident.kind == "timeout":
        return (f"{base}, because {where} {_timeout_text(job, incident)} before it defined `{variable}`. Look for a "
                f"loop that never ends (or far too much work) at the top level of that cell.")
    if incident is not None:
        return (f"{base}, because {where} stopped the notebook ({incident.kind}: {incident.detail}), so the grader "
                f"skipped that cell.")
    error = job.errors.get(i)
    if error:
        line = error["line"]
        text = _source_line(job, i, line)
        at = f" at line {line}" + (f": `{text}`" if text else "") if isinstance(line, int) else ""
        return (f"{base}, because {where} stopped with {error['type']}: {error['message']}{at}. "
                f"Everything after that line in the cell never ran: fix it and run the cell again.")
    test = min((k for k, c in enumerate(job.cells) if c.get("kind") != "code"
                and any(check.get("variable") == variable for check in c.get("checks", ()))), default=None)
    if test is not None and i > test:  # moved below its test: Restart & Run All fails the same way
        return (f"{base} when its test runs: {where} comes after its test cell ({describe_cell(job, test)}), so the "
                f"test ran before your code did. Move your answer cell back above its test cell.")
    return f"{base}, though {where} ran without an error. Keep the name `{variable}` (was it renamed?)."


def _why_not_reached(t: TestCell, i: int, run: JobResult, job: Job) -> str:
    """Why a test cell has no results: its own checks ran out of time or crashed, or the notebook
    stopped before it (and in which cell, and why)."""
    names = ", ".join(dict.fromkeys(f"`{exercise(ref).graded}`" for ref in t.checks))
    here = [x for x in run.incidents if x.cell == i]
    if here:
        x = here[0]
        if x.kind == "timeout":
            return (f"not graded: checking your {names} in {describe_cell(job, i)} {_timeout_text(job, x)}. The test "
                    f"calls {names} on small inputs, which takes well under a second: look for a loop that never ends.")
        return f"not graded: checking your {names} in {describe_cell(job, i)} stopped the notebook ({x.kind}: {x.detail})"
    stopped = [x for x in run.incidents if x.cell < i and not x.points_kept]
    slow = [x for x in run.incidents if 0 <= x.cell < i and x.points_kept and x.kind == "timeout"]
    reasons = [f"{describe_cell(job, x.cell)}: " + (_timeout_text(job, x) if x.kind == "timeout" else f"{x.kind}, {x.detail}")
               for x in stopped[-3:]]
    if slow:
        reasons.append("cells that ran past the per-cell time limit of "
                       f"{job.cell_timeout:g} s before it: " + ", ".join(describe_cell(job, x.cell) for x in slow[:5]))
    if reasons:
        return "not graded: the notebook stopped before this test (" + "; ".join(reasons) + ")"
    return "not graded: the notebook stopped before this test, and the grader was not told why"


def incidents_status(run: JobResult, job: Job) -> tuple[Status, str, list[Status]]:
    """The notebook's status for grades.csv: (kind, detail, the kinds of further incidents): a
    wrong notebook first (it has none of the answer cells), then the run's incidents in order and
    the sandbox it ran in; (OK, '', []) when nothing went wrong."""
    parts = [(Status.WRONG_NOTEBOOK, job.wrong.detail)] if job.wrong is not None else []
    parts += [(Status.of_incident(x.kind), _incident_text(x, job)) for x in run.incidents]
    if not run.isolated:
        parts.append((Status.SANDBOX, run.isolation))
    return summarize(parts)


def _incident_text(x: Incident, job: Job) -> str:
    """One incident for the instructor: where it happened, what, and what became of the points."""
    if not 0 <= x.cell < len(job.cells):
        return x.detail
    cell = job.cells[x.cell]
    if cell["kind"] == "code":
        first = next((line.strip() for line in cell["source"].splitlines() if line.strip()), "")[:60]
        answer = next((gid for gid, k in job.answer_cells.items() if k == x.cell), None)
        where = f"the answer cell {answer}" if answer else f"the code cell starting {first!r}"
        number = job.positions[x.cell] if x.cell < len(job.positions) else None
        where += f" (cell {number})" if number else ""
    else:
        where = f"the checks of {cell['test']}"
    if x.points_kept:
        after = "the points it earned stand" if cell["kind"] == "code" else "this test scored 0"
    else:
        after = "skipped; the rest was graded"
    return f"{where}: {x.detail} ({after})"


# --------------------------------------------------------------------------- one mistake, one penalty
@lru_cache(maxsize=None)
def dependencies(module: str) -> dict[str, tuple[str, ...]]:
    """graded name -> the graded names it calls, directly or through another (the checks module's
    `DEPENDS`, declared once per notebook, closed under 'calls')."""
    declared = getattr(importlib.import_module(f"autograder.checks.{module}"), "DEPENDS", {}) or {}
    closed = {}
    for name in declared:
        seen, todo = [], list(declared[name])
        while todo:
            dep = todo.pop(0)
            if dep != name and dep not in seen:
                seen.append(dep)
                todo += list(declared.get(dep, ()))
        closed[name] = tuple(seen)
    return closed


@lru_cache(maxsize=None)
def reference_of(module: str, graded: str):
    """The course's implementation of the graded function or class `graded` (from its exercises)."""
    checks = importlib.import_module(f"autograder.checks.{module}")
    for ex in checks.check.exercises.values():
        ref = ex.reference
        if ex.graded == graded and getattr(ref, "__name__", None) == graded and \
                str(getattr(ref, "__module__", "")).startswith("attention_course"):
            return ref
    raise LookupError(f"autograder.checks.{module}: no exercise's reference is the course's {graded}")


@dataclass
class Isolation:
    """The second run's plan: at each test cell, the failed dependencies replaced by the course's."""

    swaps: dict[int, tuple[str, ...]]  # test cell index -> graded names bound to the course's there
    failing: dict[str, list[str]]  # graded name -> its test cells that failed in the first run
    modules: dict[str, str]  # graded name (a dependency) -> its checks module


def isolation_plan(job: Job, tests: list[TestCell], verdicts: dict[str, Verdict]) -> Isolation | None:
    """Which failed test cells to check again with the course's dependencies (None: no second run).
    A cell qualifies when it failed for a reason its dependencies could cause (not: its own
    function missing or not written, the static honesty check) and a dependency failed too."""
    failing: dict[str, list[str]] = {}
    for t in tests:
        if not verdicts[t.grade_id].passed:
            for ref in t.checks:
                failing.setdefault(exercise(ref).graded, []).append(t.grade_id)
    swaps, modules = {}, {}
    for t in tests:
        v = verdicts[t.grade_id]
        if v.passed or v.cause in NOT_ISOLABLE:
            continue
        deps = []
        for ref in t.checks:
            for dep in dependencies(ref.module).get(exercise(ref).graded, ()):
                if dep in failing and dep not in deps:
                    deps.append(dep)
                    modules[dep] = ref.module
        if deps:
            swaps[job.test_cell_index[t.grade_id]] = tuple(deps)
    return Isolation(swaps, failing, modules) if swaps else None


def isolated_inputs(job: Job, tests: list[TestCell], plan: Isolation, first: JobResult) -> dict:
    """The second run: the same cells, except the test cells not in the plan, the cells after its
    last one, and the code cells that crashed or ran out of time in the first run (their time is
    spent already; the first run's restarts skipped them too); the plan's test cells with their
    dependencies bound to the course's implementations (blind: code objects, no source)."""
    by_index = {job.test_cell_index[t.grade_id]: t for t in tests}
    last = max(plan.swaps)
    skip = set(range(last + 1, len(job.cells)))
    skip |= {i for i, cell in enumerate(job.cells) if cell["kind"] == "record" and i not in plan.swaps}
    skip |= {x.cell for x in first.incidents if 0 <= x.cell < len(job.cells) and job.cells[x.cell]["kind"] == "code"}
    names = sorted({name for deps in plan.swaps.values() for name in deps})
    references = {name: blind_reference(reference_of(plan.modules[name], name)) for name in names}
    return {"cells": job.cells, "skip": sorted(skip), "cell_timeout": job.cell_timeout,
            "checks": _blind_checks(c for i in plan.swaps for c in by_index[i].checks),
            "swap": {i: list(deps) for i, deps in plan.swaps.items()},
            "references": cloudpickle.dumps(references)}


def _quoted(names) -> str:
    names = [f"`{n}`" for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def apply_isolation(job: Job, tests: list[TestCell], verdicts: dict[str, Verdict], plan: Isolation,
                    second: JobResult) -> None:
    """Each planned test cell's verdict from the second run. Only its verdict is used — passed or
    not, and which catalogued mistake its output matches — never a value, an error message, an
    incident or a time of that run: those could carry what the student's code read of the
    course's implementation."""
    for t in tests:
        i = job.test_cell_index[t.grade_id]
        if i not in plan.swaps:
            continue
        deps = plan.swaps[i]
        graded = ", ".join(dict.fromkeys(exercise(ref).graded for ref in t.checks))
        first = verdicts[t.grade_id]
        course = f"the course's {_quoted(deps)}"
        outcome = _verdict_only(t, second.results.get(i), job)
        if outcome is None:
            first.message += (f"\n  (The grader also tried {graded} with {course} in place of yours, but that run "
                              "did not reach this test, so the result above stands.)")
            continue
        passed, mistake = outcome
        if passed:
            failed = sorted({cell for dep in deps for cell in plan.failing.get(dep, [])},
                            key=lambda c: job.test_cell_index.get(c, 0))
            verdicts[t.grade_id] = Verdict(True, note=(
                f"{graded} passes when it calls {course} instead of yours. Your {_quoted(deps)} "
                f"{'fails' if len(deps) == 1 else 'fail'} {'its' if len(deps) == 1 else 'their'} own "
                f"test{'s' if len(failed) > 1 else ''} ({', '.join(failed)}), and that mistake costs points there only."),
                cause="isolated")
            continue
        line = f"\n  It fails with {course} in place of yours too, so the mistake is in {graded} itself."
        if mistake is not None and mistake.name != first.mistake:
            line += f"\n  {KNOWN_MISTAKE}{mistake.name}.\n  Where to look: {mistake.hint}"
            first.mistake = mistake.name  # its own mistake, found with the course's dependencies in place
        head, _, rest = first.message.partition("\n")  # right under the first line: it changes how to read the rest
        first.message = head + line + ("\n" + rest if rest else "")


def _verdict_only(t: TestCell, blob: bytes | None, job: Job):
    """(passed, the catalogued mistake matched or None) from one test cell's results, or None when
    they are absent or unreadable. Nothing else of the results leaves this function."""
    from .serialize import loads

    if blob is None:
        return None
    try:
        outcomes = loads(blob)
    except Exception:  # noqa: BLE001 - untrusted; its error text is not shown either
        return None
    for ref in t.checks:
        ex = exercise(ref)
        if _forbidden(job, ex.graded):
            return False, None
        got = outcomes.get(ref.key) if isinstance(outcomes, dict) else None
        if not isinstance(got, list) or len(got) != len(cases(ref)):
            return None
        for case, outcome, want in zip(cases(ref), got, expected(ref), strict=True):
            if not isinstance(outcome, tuple) or not outcome or not isinstance(outcome[0], str):
                return None
            if judge(ex, case, outcome, want) is None:
                continue
            mistake = None
            try:
                if outcome[0] == "value" and len(outcome) > 1:
                    mistake = diagnose(ex, case, outcome[1])
                elif outcome[0] == "error" and len(outcome) > 2:
                    mistake = diagnose_crash(ex, case, str(outcome[1]), str(outcome[2]))
            except Exception:  # noqa: BLE001 - a diagnosis is a courtesy
                mistake = None
            return False, mistake
    return True, None


# --------------------------------------------------------------------------- the course's code, blind
def blind_reference(obj):
    """A copy of a course function or class that the sandbox may run but not read: its code
    objects (bytecode, constants, names) and nothing written about it — no docstrings, no
    annotations, no source file name or line numbers to look the source up by. It claims a module
    that exists nowhere (REFERENCE_MODULE), so cloudpickle ships it by value: the sandbox, where the
    reference module is a stub that refuses to import, never needs it. Other course objects it uses
    are copied the same way; modules (numpy, torch) stay references.

    The bytecode can still be disassembled inside the sandbox: that is why nothing but verdicts
    comes back from a run that holds one (apply_isolation)."""
    return _blind(obj, {})


def _is_course(obj) -> bool:
    return str(getattr(obj, "__module__", "") or "").startswith("attention_course")


def _blind(obj, memo: dict):
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, types.FunctionType) and _is_course(obj):
        return _blind_function(obj, memo)
    if isinstance(obj, type) and _is_course(obj):
        return _blind_class(obj, memo)
    return obj


_CODE_NAMES = ("<lambda>", "<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>", "<module>")


def _blind_code(code: types.CodeType, doc) -> types.CodeType:
    consts = list(code.co_consts)
    # A def's docstring is its first constant (CPython 3.11, 3.12); comprehensions and lambdas have none.
    if consts and isinstance(consts[0], str) and code.co_name not in _CODE_NAMES and sys.version_info < (3, 13) \
            and (doc is None or consts[0] == doc):
        consts[0] = None
    consts = [_blind_code(c, None) if isinstance(c, types.CodeType) else c for c in consts]
    return code.replace(co_consts=tuple(consts), co_filename="<course code>", co_firstlineno=1)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _blind_function(func: types.FunctionType, memo: dict, class_cell=None) -> types.FunctionType:
    code = _blind_code(func.__code__, func.__doc__)
    namespace = {"__name__": REFERENCE_MODULE, "__builtins__": builtins}
    cells = []
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=True):
        if name == "__class__" and class_cell is not None:
            cells.append(class_cell)
        else:
            try:
                cells.append(types.CellType(_blind(cell.cell_contents, memo)))
            except ValueError:  # an empty cell
                cells.append(types.CellType())
    copy = types.FunctionType(code, namespace, func.__name__,
                              tuple(_blind(d, memo) for d in func.__defaults__) if func.__defaults__ else None,
                              tuple(cells) if cells else None)
    memo[id(func)] = copy
    for name in _global_names(func.__code__):
        if name in func.__globals__:
            namespace[name] = _blind(func.__globals__[name], memo)
    copy.__kwdefaults__ = dict(func.__kwdefaults__) if func.__kwdefaults__ else None
    copy.__qualname__, copy.__module__, copy.__doc__, copy.__annotations__ = func.__qualname__, REFERENCE_MODULE, None, {}
    return copy


def _blind_class(cls: type, memo: dict) -> type:
    class_cell = types.CellType()
    bases = tuple(_blind(b, memo) for b in cls.__bases__)
    copy = type(cls)(cls.__name__, bases, {"__module__": REFERENCE_MODULE, "__doc__": None,
                                           "__qualname__": cls.__qualname__})
    memo[id(cls)] = copy
    for name, value in cls.__dict__.items():
        if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__annotations__"):
            continue
        setattr(copy, name, _blind_member(value, memo, class_cell))
    class_cell.cell_contents = copy
    return copy


def _blind_member(value, memo: dict, class_cell):
    if isinstance(value, types.FunctionType):
        return _blind_function(value, memo, class_cell)
    if isinstance(value, (staticmethod, classmethod)):
        return type(value)(_blind_member(value.__func__, memo, class_cell))
    if isinstance(value, property):
        parts = [_blind_member(f, memo, class_cell) if f is not None else None for f in (value.fget, value.fset, value.fdel)]
        return property(*parts)
    return _blind(value, memo)


# --------------------------------------------------------------------------- one dump per notebook
_DUMP = "\n    expected: "
_AFTER_DUMP = re.compile(r"\n  [A-Za-z(]")  # the next line of the message proper (array lines start otherwise)


def split_dump(message: str) -> tuple[str, str, str]:
    """(before, the expected/received values, after) of a message (core.compare writes the values)."""
    at = message.find(_DUMP)
    if at < 0:
        return message, "", ""
    end = _AFTER_DUMP.search(message, at + len(_DUMP))
    end = end.start() if end else len(message)
    return message[:at], message[at:end], message[end:]
_ONCE = ("  Where to look: ", "  Likely cause: ")


def name_later_mistakes(job: Job, tests: list[TestCell], verdicts: dict[str, Verdict]) -> None:
    """Where the first failing test of a graded function names no mistake and a later test of it does, the first
    says so too, right under its first line: the test a student reads first said only "values differ" (a
    wrong-code audit: softmax over dim=1 was named under the second test of masked_softmax only)."""
    failing: dict[str, list[TestCell]] = {}
    for t in sorted(tests, key=lambda t: job.test_cell_index[t.grade_id]):
        v = verdicts.get(t.grade_id)
        if t.checks and v is not None and not v.passed:
            failing.setdefault(exercise(t.checks[0]).graded, []).append(t)
    for cells in failing.values():
        first = verdicts[cells[0].grade_id]
        later = next((t for t in cells[1:] if verdicts[t.grade_id].mistake), None)
        if first.mistake or later is None:
            continue
        named = verdicts[later.grade_id]
        lines = named.message.split("\n")
        hint = next((line for line in lines if line.startswith("  Where to look: ")), "")
        head, _, rest = first.message.partition("\n")
        first.message = (head + f"\n  {KNOWN_MISTAKE}{named.mistake} (recognised by {later.grade_id}, below)."
                         + (f"\n{hint}" if hint else "") + ("\n" + rest if rest else ""))
        first.mistake = named.mistake


def condense(job: Job, tests: list[TestCell], verdicts: dict[str, Verdict]) -> None:
    """Say each thing once per notebook. In notebook order: a message identical to an earlier
    cell's becomes its first lines and a pointer; expected/received values are shown for the first
    failing cell of each graded function only (later ones keep the one-line difference and point
    back); a hint line ('Where to look', 'Likely cause') already shown is not repeated. First, a mistake
    named by a later test of a function is named under its first failing test too (`name_later_mistakes`)."""
    name_later_mistakes(job, tests, verdicts)
    seen: dict[str, str] = {}
    dumped: dict[str, str] = {}
    hints: set[str] = set()
    notes: dict[str, str] = {}
    for t in sorted(tests, key=lambda t: job.test_cell_index[t.grade_id]):
        v = verdicts.get(t.grade_id)
        graded = exercise(t.checks[0]).graded if t.checks else ""
        if v is not None and v.passed and v.note:
            if v.note in notes:
                v.note = v.note.split(" instead of yours.")[0] + f" instead of yours (see {notes[v.note]})."
            else:
                notes[v.note] = t.grade_id
            continue
        if v is None or v.passed or not v.message:
            continue
        message = v.message
        if message in seen:
            head = [line for line in message.split("\n")[:1]]
            head += [line for line in message.split("\n")[1:] if line.startswith("  " + KNOWN_MISTAKE)]
            v.message = "\n".join(head) + f"\n  (the same as under {seen[message]} above)"
            continue
        seen[message] = t.grade_id
        before, dump, after = split_dump(message)
        if dump:
            if graded in dumped:
                message = before + f"\n    (the expected and received values are shown once, under {dumped[graded]})" + after
            else:
                dumped[graded] = t.grade_id
        kept = []
        for line in message.split("\n"):
            if line.startswith(_ONCE):
                same = re.sub(r"\d+", "#", line)  # 'these layers are 4 times too wide' once, whatever the sizes
                if same in hints:
                    continue
                hints.add(same)
            kept.append(line)
        v.message = "\n".join(kept)
