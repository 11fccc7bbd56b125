"""Shared fixtures: a real nbgrader course (gradebook filled by generate_assignment) and helpers
to autograde a notebook built from the solutions with wrong implementations injected."""
from __future__ import annotations

import itertools
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import nbformat
import pytest

import autograder.grade
from autograder.course import notebook_path
from autograder.grade import Course, NotebookResult, grade_one, write_csv
from autograder.submissions import StudentSubmission
from course_tools.demo import solved, with_mistake

from .layout import REPO

# `make test` runs two pytest processes (pytest-xdist) on a 2-core machine: one thread each for
# PyTorch and BLAS, here and in the notebook kernels nbval starts (they inherit the environment),
# or the two processes' thread pools fight over the cores (a 9 s notebook cell took 130 s).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")
    import torch

    torch.set_num_threads(1)

# The hidden inputs' public salt for the suite (`attn-course grade` draws a secret one per class
# otherwise): messages with numbers stay the same from run to run. tests/test_secret_seed.py unsets it.
os.environ.setdefault("ATTN_CHECK_SEED", "attention-step-by-step")

_ids = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def warm_sandboxes():
    """The suite's sandboxes start from warm fork servers, as `attn-course grade`'s do, so every
    attack here also runs against them (ATTN_WARM_SANDBOX=0: a fresh bubblewrap sandbox each time).
    Servers start in the foreground: a run waits for its server, so which one serves is known."""
    from autograder import warm_sandbox
    from autograder.settings import GradingSettings

    with warm_sandbox.warm_sandboxes(4, enabled=GradingSettings.from_env().warm, background=False):
        yield


@pytest.fixture(scope="session")
def course(tmp_path_factory) -> Course:
    """An nbgrader course directory with every assignment generated (one per test session)."""
    return Course(tmp_path_factory.mktemp("grading") / "course").setup()


def solved_notebook(course: Course, assignment: str) -> nbformat.NotebookNode:
    """The student release with every exercise filled in with the reference solution."""
    return solved(course.release(assignment), nbformat.read(notebook_path(assignment), as_version=4))


def inject(nb: nbformat.NotebookNode, replacements: dict[str, str]) -> nbformat.NotebookNode:
    """Replace the solution cells named in `replacements` (grade_id -> code)."""
    for graded, code in replacements.items():
        if not any(c.metadata.get("nbgrader", {}).get("grade_id") == graded for c in nb.cells):
            raise KeyError(f"no solution cell {graded!r}")
        nb = with_mistake(nb, graded, code)
    return nb


def autograde(course: Course, assignment: str, nb: nbformat.NotebookNode | bytes,
              student: str | None = None) -> NotebookResult:
    """Grade one notebook for real (nbgrader autograde in its own process)."""
    student = student or f"s{next(_ids):03d}"
    data = nb if isinstance(nb, bytes) else nbformat.writes(nb).encode()
    shutil.rmtree(course.root / "autograded" / student, ignore_errors=True)
    sub = StudentSubmission(student, {assignment: data})
    results = grade_one(course, sub)  # other assignments come back "missing" at no cost
    return next(r for r in results if r.notebook == assignment)


def cell_scores(result: NotebookResult) -> dict[str, float]:
    return {c.grade_id: c.score for c in result.cells}


def failed_cells(result: NotebookResult) -> set[str]:
    return {c.grade_id for c in result.cells if c.score < c.max_score}


def fresh_copy(module):
    """The reference module's functions re-created from source: the same code, but not the
    reference's own objects (the honesty guard rejects those)."""
    namespace: dict = {"__name__": "student_copy"}
    exec(compile(Path(module.__file__).read_text(), "<student copy>", "exec"), namespace)
    return namespace


@pytest.fixture
def never_grade(monkeypatch):
    """grade() must not be reached: argument errors (a bad roster among them) come before any setup."""
    def fail(*args, **kwargs):
        raise AssertionError("grade() was called although the arguments are bad")
    monkeypatch.setattr(autograder.grade, "grade", fail)


@pytest.fixture
def fake_grade(monkeypatch):
    """grade() replaced: records its arguments, writes grades.csv as the real one does, returns `results`."""
    calls = []

    def fake(submissions, out, **kwargs):
        calls.append((submissions, out, kwargs))
        write_csv(fake.results, Path(out) / "grades.csv")
        return fake.results

    fake.results = []
    fake.calls = calls
    monkeypatch.setattr(autograder.grade, "grade", fake)
    return fake


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


# The files that take longest (summed test times of a `make test` run, longest first): started first, so
# the two workers (pytest-xdist, a file at a time) end together instead of one waiting out a long file
# left for the end (the solution notebooks come last otherwise). Only the order changes; a file missing
# here (under 6 s in all) keeps its place after these. Measured with `make test` (--durations=0) on the
# 2-core machine: 1,543 s of tests, which this order splits into two halves of 771 s.
LONGEST_FIRST = [
    "tests/test_grading.py", "tests/test_sandbox_attacks.py", "tests/test_sandbox_setups.py",
    "solutions/07_attention_at_scale/07_attention_at_scale.ipynb", "tests/test_hub_e2e.py",
    "tests/test_dask_grading.py", "tests/test_translator_learning.py", "tests/test_causes.py",
    "tests/test_adversarial.py", "tests/test_selfcheck.py", "tests/test_browser.py", "tests/test_honesty_runtime.py",
    "tests/test_behaviour_watch.py", "solutions/06_transformer_translator/06_transformer_translator.ipynb",
    "tests/test_build.py", "tests/test_nb06.py", "tests/test_offline.py", "tests/test_book.py",
    "tests/test_warm_sandbox.py", "tests/test_decoding.py", "tests/test_readme_walkthrough.py",
    "tests/test_distributed.py", "tests/test_bench_compile.py", "tests/test_isolation.py", "tests/test_live_check.py", "tests/test_course.py",
    "tests/test_formgrader.py", "tests/test_term.py", "tests/test_exchange.py", "tests/test_nbgrader_native.py",
    "tests/test_wrong_notebooks.py", "tests/test_nb02.py", "tests/test_nb07.py", "tests/test_translator.py",
    "tests/test_cli.py", "tests/test_bench_peer.py", "tests/test_nb03.py", "solutions/05_masked_cross_attention/05_masked_cross_attention.ipynb",
    "solutions/02_queries_keys_values/02_queries_keys_values.ipynb", "tests/test_nb05.py", "tests/test_nb01.py",
    "tests/test_translator_regularisers.py", "tests/test_nb04.py", "tests/test_secret_seed.py",
    "tests/test_lms_export.py", "solutions/04_positional_encoding/04_positional_encoding.ipynb",
    "tests/test_layers.py", "tests/test_nb08.py", "solutions/08_long_context/08_long_context.ipynb",
]


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: a file's tests keep their order


def pytest_terminal_summary(terminalreporter):
    """Per solution notebook, the time nbval took to execute it (the spec wants < 60 s each)."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if ".ipynb::" in nodeid and getattr(report, "when", "") == "call":
                name = nodeid.split("::")[0]
                totals[name] = totals.get(name, 0.0) + report.duration
    if totals:
        terminalreporter.write_sep("-", "solution notebooks: execution time (nbval)")
        for name, seconds in sorted(totals.items()):
            terminalreporter.write_line(f"{seconds:6.1f} s  {name}")


# --------------------------------------------------------------------------- mistake catalogues
def catalogued_mistakes(checks) -> list[tuple]:
    """(mistake, graded name) for every mistake of a checks module, in a stable order."""
    return [(m, g) for g in sorted({e.graded for e in checks.EXERCISES})
            for m in dict.fromkeys(m for e in checks.EXERCISES if e.graded == g for m in e.mistakes)]


def assert_mistake_fails_and_is_named(checks, mistake, graded: str) -> None:
    """The mistake fails a check of its exercise, and that check's message names it. Checks run
    in order and stop at the first message naming it (later ones may be slow)."""
    from autograder.checks.core import CheckFailed, check_exercise

    named = f"This matches a known mistake: {mistake.name}."
    messages = []
    for exercise in (e for e in checks.EXERCISES if e.graded == graded):
        try:
            check_exercise(exercise, mistake.build(graded, exercise.namespace))
        except CheckFailed as err:
            messages.append(str(err))
            if named in messages[-1]:
                return
    assert messages, f"{mistake.name!r} passed every check of {graded}"
    raise AssertionError(f"no message names {mistake.name!r}: {messages}")


def failure_messages(checks, graded: str, impl) -> list[str]:
    """The message of every check of `graded` (in the checks module `checks`) that `impl` fails."""
    from autograder.checks.core import CheckFailed, check_exercise

    messages = []
    for exercise in (e for e in checks.EXERCISES if e.graded == graded):
        try:
            check_exercise(exercise, impl)
        except CheckFailed as err:
            messages.append(str(err))
    return messages


_ABSENT = object()


@contextmanager
def patched(*patches):
    """(owner, attribute, replacement): what a student's code can do in the process that runs the
    cases (the grader's sandbox) — applied for the block, then undone."""
    saved = [(owner, name, owner.__dict__.get(name, _ABSENT) if isinstance(owner, type) else getattr(owner, name))
             for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def judged_as_in_grading(exercise, impl, *patches) -> list:
    """Each case's message (None = passed): run_case and serialization with `patches` active, as in
    the sandbox, then judged in this (trusted) process with the real functions."""
    from autograder import serialize
    from autograder.checks import core

    messages = []
    for case in core.cases_of(exercise):
        with patched(*patches):
            blob = serialize.dumps(core.run_case(exercise, case, impl))
        messages.append(core.judge(exercise, case, serialize.loads(blob)))
    return messages


# A scaled_dot_product_attention without the 1/sqrt(d_k) scale: the missing-scale mistake, as a student
# writes it (tests of messages and of one-bug-one-penalty grade it through the real grader).
NO_SCALE = '''def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights'''
