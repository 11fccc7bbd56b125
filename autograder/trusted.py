"""The trusted half of grading: turn a submission into a sandbox job, then judge what comes
back against the reference. Nothing here executes student code.

A test cell's verdict is decided here, from the hidden checks written in the *source*
notebook's test cell (`nbXX.check("name", variable)`): the cell passes when every one of
them agrees with the reference on every case.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import cloudpickle
import nbformat

from .checks.core import Exercise, cases_of, judge
from .sandbox import JobResult

SKIP_TAG = "grader-skip"  # cell tag: the grader does not run this cell (it is long and not graded)
CHECK_CALL = re.compile(r"\b(nb\d+)\.check\(\s*[\"'](\w+)[\"']\s*,\s*(\w+)\s*\)")


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
class Verdict:
    passed: bool
    message: str = ""


@dataclass
class Job:
    cells: list[dict]
    test_cell_index: dict[str, int]  # test grade_id -> index in cells
    solution_sources: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # every code cell the student wrote, run or not
    findings: list = field(default_factory=list)  # honesty.Finding, from the static pass


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


@lru_cache(maxsize=None)
def cases(ref: CheckRef):
    return tuple(cases_of(exercise(ref)))


@lru_cache(maxsize=None)
def expected(ref: CheckRef):
    return tuple(case.run(exercise(ref).reference) for case in cases(ref))


def _sandbox_exercise(ex: Exercise) -> Exercise:
    """What the sandbox may know of an exercise: its name and the built-ins it forbids.
    No reference, no mistakes, no case generator."""
    builtins = tuple((f, why) for f, why in ex.forbidden
                     if not str(getattr(f, "__module__", "")).startswith("attention_course"))
    return dataclasses.replace(ex, reference=None, cases=None, mistakes=(), namespace={}, forbidden=builtins)


# --------------------------------------------------------------------------- the submission
def normalize_submission(student_nb, source_nb) -> nbformat.NotebookNode:
    """The student's notebook as nbgrader should see it: grade metadata restored from the source
    for the first cell of each known grade_id, dropped from duplicates and unknown ids (so an
    edited `points`, a renamed grade_id or a duplicated cell can neither earn nor crash), and the
    course's kernelspec. The outputs of each code cell are carried, bounded and filtered, in its
    metadata (plugins.student_outputs, plugins.TrustedVerdicts): feedback shows them, nothing runs them."""
    from .plugins import FEEDBACK_OUTPUTS, NOTEBOOK_OUTPUT_LIMIT, _is_count, student_outputs

    source_meta = {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]
                   for c in source_nb.cells if "nbgrader" in c.metadata}
    source_type = {c.metadata["nbgrader"]["grade_id"]: c.cell_type
                   for c in source_nb.cells if "nbgrader" in c.metadata}
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": source_nb.metadata.get("kernelspec", {}),
                                            "language_info": {"name": "python"}})
    seen, output_budget = set(), NOTEBOOK_OUTPUT_LIMIT
    for cell in student_nb.get("cells", []):
        ctype = cell.get("cell_type")
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if ctype == "code":
            new = nbformat.v4.new_code_cell(src)
        elif ctype in ("markdown", "raw"):
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


def build_job(student_nb, tests: list[TestCell]) -> Job:
    """Cells to run, in the student's order; each known test cell becomes a 'record' step
    (its source is never run); test cells the student deleted are recorded at the end."""
    by_id = {t.grade_id: t for t in tests}
    cells, index, solutions, sources = [], {}, {}, []
    for cell in student_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        gid = meta.get("grade_id")
        if cell.cell_type != "code":
            continue
        if gid in by_id and gid not in index:
            index[gid] = len(cells)
            cells.append({"kind": "record", "test": gid,
                          "checks": [{"name": c.key, "variable": c.variable} for c in by_id[gid].checks]})
            continue
        sources.append(cell.source)
        if meta.get("solution") and gid:
            solutions[gid] = cell.source
        if SKIP_TAG in cell.metadata.get("tags", []) and not meta.get("solution"):
            continue  # long, ungraded work (data download, training): not run when grading
        cells.append({"kind": "code", "source": cell.source})
    for t in tests:
        if t.grade_id not in index:
            index[t.grade_id] = len(cells)
            cells.append({"kind": "record", "test": t.grade_id,
                          "checks": [{"name": c.key, "variable": c.variable} for c in t.checks]})
    return Job(cells, index, solutions, sources)


def job_inputs(job: Job, tests: list[TestCell], cell_timeout: float) -> dict:
    """Everything the sandbox gets, in one pickled message on a descriptor (never a file in a
    folder it can see): the cells to run and, per check, the cases' inputs and the forbidden
    built-ins. No references, no mistakes, no case descriptions."""
    refs = sorted({c for t in tests for c in t.checks}, key=lambda c: c.key)
    checks = {}
    for ref in refs:
        cloudpickle.register_pickle_by_value(importlib.import_module(f"autograder.checks.{ref.module}"))
        blind = [dataclasses.replace(case, description=f"case {i}") for i, case in enumerate(cases(ref))]
        checks[ref.key] = {"exercise": _sandbox_exercise(exercise(ref)), "cases": blind}
    return {"cells": job.cells, "skip": [], "cell_timeout": cell_timeout, "checks": cloudpickle.dumps(checks)}


# --------------------------------------------------------------------------- judging
def judge_job(job: Job, tests: list[TestCell], run: JobResult) -> dict[str, Verdict]:
    """A verdict per test cell, from the outcomes the sandbox sent (held in the grader's memory)."""
    from .serialize import loads

    job.findings = honesty_findings(job, tests)
    verdicts = {}
    for t in tests:
        i = job.test_cell_index[t.grade_id]
        blob = run.results.get(i)
        if not t.checks:
            verdicts[t.grade_id] = Verdict(False, "this test cell has no hidden check (a course bug: tell your instructor)")
            continue
        if blob is None:
            verdicts[t.grade_id] = Verdict(False, _why_not_reached(i, run))
            continue
        try:
            outcomes = loads(blob)
        except Exception as err:  # noqa: BLE001 - anything the sandbox sent is untrusted
            verdicts[t.grade_id] = Verdict(False, f"the grader could not read this cell's results ({type(err).__name__}: {str(err)[:200]})")
            continue
        verdicts[t.grade_id] = _judge_cell(t, outcomes, job)
    return verdicts


def honesty_findings(job: Job, tests: list[TestCell]) -> list:
    """The static honesty pass over every code cell of the submission (honesty.py)."""
    from . import honesty

    exercises = [exercise(ref) for t in tests for ref in t.checks]
    return honesty.scan(job.sources, honesty.rules_for_exercises(exercises))


def review_notes(job: Job) -> str:
    """What the static pass could not decide, for a human: '' when nothing was flagged."""
    return "; ".join(f"cell {f.cell + 1}, line {f.line}: {f.reason} [{f.code}]"
                     for f in job.findings if f.severity == "review")


def _forbidden(job: Job, graded: str):
    return next((f for f in job.findings if f.severity == "forbidden" and (not f.exercises or graded in f.exercises)),
                None)


def _judge_cell(t: TestCell, outcomes, job: Job) -> Verdict:
    for ref in t.checks:
        ex = exercise(ref)
        found = _forbidden(job, ex.graded)
        if found:
            return Verdict(False, f"{ex.graded}: not accepted, because {found.reason} "
                                  f"(your cell {found.cell + 1}, line {found.line}: {found.code}).")
        got = outcomes.get(ref.key) if isinstance(outcomes, dict) else None
        if not isinstance(got, list) or len(got) != len(cases(ref)):
            return Verdict(False, f"{ex.graded}: the checks did not complete")
        for case, outcome, want in zip(cases(ref), got, expected(ref)):
            if not isinstance(outcome, tuple) or not outcome or not isinstance(outcome[0], str):
                return Verdict(False, f"{ex.graded}: unreadable result")
            message = judge(ex, case, outcome, want)
            if message:
                return Verdict(False, message)
    return Verdict(True)


def _why_not_reached(i: int, run: JobResult) -> str:
    for incident in run.incidents:
        if incident.cell == i:
            return f"not graded: checking this cell {incident.detail}"
    before = [x for x in run.incidents if x.cell < i and not x.points_kept]
    if before:
        x = before[-1]
        return f"not graded: the notebook stopped before this test ({x.kind}: {x.detail})"
    return "not graded: the notebook stopped before this test"


def incidents_status(run: JobResult, job: Job) -> str:
    """The explicit reason that goes in grades.csv's status ('ok' when nothing went wrong)."""
    parts = []
    for x in run.incidents:
        if 0 <= x.cell < len(job.cells):
            cell = job.cells[x.cell]
            if cell["kind"] == "code":
                first = next((line.strip() for line in cell["source"].splitlines() if line.strip()), "")[:60]
                where = f"the code cell starting {first!r}"
            else:
                where = f"the checks of {cell['test']}"
            if x.points_kept:
                after = "the points it earned stand" if cell["kind"] == "code" else "this test scored 0"
            else:
                after = "skipped; the rest was graded"
            parts.append(f"{x.kind}: {where}: {x.detail} ({after})")
        else:
            parts.append(f"{x.kind}: {x.detail}")
    if not run.isolated:
        parts.append(f"sandbox: {run.isolation}")
    return "; ".join(parts) or "ok"
