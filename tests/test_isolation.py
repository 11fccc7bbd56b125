"""One bug, one penalty: an exercise that calls another graded one (a notebook's DEPENDS) is graded
on its own. When the function it calls failed its own tests, the notebook runs once more in the
sandbox with the course's version of that function in its place, and only the verdict of that run
comes back. Graded for real (the sandbox, the trusted judge; nbgrader and its feedback page for
the attack), including a student who tries to get the course's code out through every channel."""
from __future__ import annotations

import importlib
import inspect
import pickle
import re

import cloudpickle
import nbformat
import pytest

from autograder import selfcheck, trusted
from autograder.checks.core import check_exercise
from autograder.outcomes import Status
from autograder.sandbox import Limits

from .conftest import NO_SCALE, autograde, inject, solved_notebook
from .layout import REPO

A01, A02, A05 = "01_similarity_attention", "02_queries_keys_values", "05_masked_cross_attention"
MODULES = ("nb01", "nb02", "nb03", "nb04", "nb05", "nb06")
LIMITS = Limits(cell_seconds=20, notebook_seconds=240)

NO_KEEPDIMS = "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True))\n    return e / e.sum(axis=axis)"
NO_SOFTMAX = "def basic_self_attention(X):\n    return (X @ X.T) @ X"
GELU = '''class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.nn.functional.gelu(self.linear1(x))))'''

# A basic_self_attention that plays straight with the student's own softmax (so it fails, and the
# grader runs it again with the course's softmax) and then tries every way out with the course's.
ATTACK = '''import dis, io, os, sys, tempfile
import numpy as np

_calls = [0]
_MARK = "".join(map(chr, (88, 70, 73, 76, 84, 82, 65, 84, 69)))  # spelt at run time: never in this source


def _read(f):
    """Everything the course's softmax gives away inside the sandbox, as text."""
    text = io.StringIO()
    dis.dis(f, file=text)
    parts = [_MARK, repr(getattr(f, "__module__", None)), repr(f.__code__.co_varnames),
             repr(f.__code__.co_consts), f.__code__.co_filename, text.getvalue()]
    try:
        import inspect
        parts.append(inspect.getsource(f))
    except Exception as err:
        parts.append(repr(err))
    return "\\n".join(parts)


def basic_self_attention(X):
    X = np.asarray(X, dtype=float)
    f = softmax
    if getattr(f, "__module__", "__main__") == "__main__":  # my own (broken) softmax: play it straight
        return f(X @ X.T, axis=-1) @ X
    _calls[0] += 1
    info = _read(f)
    print(info)
    sys.stderr.write(info)
    for path in ("leak.txt", os.path.join(tempfile.gettempdir(), "leak.txt"), os.path.expanduser("~/leak.txt")):
        try:
            with open(path, "a") as fh:
                fh.write(info)
        except OSError:
            pass
    if _calls[0] == 1:
        raise ValueError(info)  # through an error message
    if _calls[0] == 2:  # through the values
        codes = np.frombuffer(info.encode()[: X.size], dtype=np.uint8).astype(float)
        base = float("".join(map(str, range(9, 4, -1)))) * 10000
        return base + np.resize(codes, X.shape)
    if _calls[0] == 3:  # through an exception's name
        raise type(_MARK + "_" + "_".join(f.__code__.co_varnames), (Exception,), {})(info)
    if "shi" + "fted" in f.__code__.co_varnames:  # through a verdict: the one bit that comes back
        return f(X @ X.T, axis=-1) @ X
    return X
'''
# What the course's softmax would give away if anything of that run came back: its local name
# `shifted`, its disassembly, the module and file name the blind copy claims, the attack's own
# marker (spelt from character codes at run time) and its encoded values (987650000 + a byte).
LEAKS = ("shifted", "LOAD_", "BINARY_OP", "RETURN_VALUE", "attention_reference", "<course code>", "XFILTRATE")
# The encoded values as numbers, not inside the gradebook's hex ids (one, c7987654072f..., once failed the test)
ENCODED = re.compile(r"(?<![0-9a-fA-F])98765[0-9]{4}(?![0-9a-fA-F])")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """`attn-course check` on a notebook in memory: (result, report, sandbox runs)."""
    cache = tmp_path_factory.mktemp("check-cache")

    def run(assignment: str, nb, limits: Limits = LIMITS):
        prepared = selfcheck.prepare(assignment, root=cache)
        data = nbformat.writes(nb).encode()
        runs = []
        real = selfcheck.run_notebook_job

        def counted(*args, **kwargs):
            runs.append(args[1])
            return real(*args, **kwargs)

        selfcheck.run_notebook_job = counted
        try:
            result = selfcheck.check_notebook(prepared, data, limits)
        finally:
            selfcheck.run_notebook_job = real
        return result, selfcheck.format_report(result, selfcheck.verdicts_of(result, data, prepared.stubs)), runs

    return run


def cells(result) -> dict[str, tuple[float, str]]:
    return {c.grade_id: (c.score, c.message) for c in result.cells}


def exercise_score(result, exercise: str) -> tuple[float, float]:
    mine = [c for c in result.cells if c.exercise == exercise]
    return sum(c.score for c in mine), sum(c.max_score for c in mine)


# --------------------------------------------------------------------------- the declarations
@pytest.mark.parametrize("module", MODULES)
def test_dependencies_are_declared_once_and_resolve(module):
    """Each notebook declares DEPENDS beside its exercises; every name is a graded function of that
    notebook whose course implementation the grader can find."""
    checks = importlib.import_module(f"autograder.checks.{module}")
    graded = {e.graded for e in checks.EXERCISES}
    assert isinstance(checks.DEPENDS, dict) and checks.DEPENDS
    for name, deps in checks.DEPENDS.items():
        assert name in graded and set(deps) <= graded and name not in deps, (name, deps)
        for dep in deps:
            assert trusted.reference_of(module, dep).__name__ == dep


@pytest.mark.parametrize("module,name", [(m, d) for m in MODULES
                                         for d in sorted({d for ds in importlib.import_module(
                                             f"autograder.checks.{m}").DEPENDS.values() for d in ds})])
def test_the_course_code_travels_without_its_source(module, name):
    """What goes into the sandbox: code objects; no docstring, no source line, no file to find the
    source in; and it behaves exactly as the course's code on every case of its exercise."""
    ref = trusted.reference_of(module, name)
    data = cloudpickle.dumps(trusted.blind_reference(ref))
    source = inspect.getsource(ref)
    assert ref.__doc__ and ref.__doc__.encode()[:40] not in data
    for line in (line.strip() for line in source.splitlines()):
        if len(line) > 15 and not line.startswith(("def ", "class ")):
            assert line.encode() not in data, line
    assert b"attention_course" not in data and str(REPO).encode() not in data
    copy = pickle.loads(data)
    assert copy.__doc__ is None and copy.__module__ == trusted.REFERENCE_MODULE
    with pytest.raises((OSError, TypeError)):
        inspect.getsource(copy)
    for exercise in importlib.import_module(f"autograder.checks.{module}").EXERCISES:
        if exercise.graded == name:
            check_exercise(exercise, copy)


# --------------------------------------------------------------------------- one bug, one penalty
@pytest.mark.slow
def test_softmax_without_keepdims_costs_softmax_only(course, check):
    result, report, runs = check(A01, inject(solved_notebook(course, A01), {"softmax": NO_KEEPDIMS}))
    assert exercise_score(result, "softmax") == (0, 5)
    assert exercise_score(result, "basic_self_attention") == (4, 4), report
    score, note = cells(result)["test_basic_self_attention"]
    assert note.startswith("basic_self_attention passes when it calls the course's `softmax` instead of yours. Your "
                           "`softmax` fails its own tests (test_softmax, test_softmax_stability)"), note
    assert "PASS  basic_self_attention" in report and "passed; basic_self_attention passes" in report
    assert len(runs) == 2 and runs[1]["swap"] and "references" in runs[1]


@pytest.mark.slow
def test_a_correct_or_blank_notebook_runs_once(course, check):
    """No failed dependency, no second run: full marks, the release untouched, and a mistake in the
    exercise that calls (not in the one called)."""
    for nb in (solved_notebook(course, A01), course.release(A01),
               inject(solved_notebook(course, A01), {"basic_self_attention": NO_SOFTMAX})):
        result, report, runs = check(A01, nb)
        assert len(runs) == 1, report
        assert all("references" not in inputs and "swap" not in inputs for inputs in runs)


@pytest.mark.slow
def test_both_wrong_costs_both_and_says_the_mistake_is_its_own(course, check):
    nb = inject(solved_notebook(course, A01), {"softmax": NO_KEEPDIMS, "basic_self_attention": NO_SOFTMAX})
    result, report, runs = check(A01, nb)
    assert len(runs) == 2
    assert exercise_score(result, "softmax") == (0, 5) and exercise_score(result, "basic_self_attention") == (0, 4)
    message = cells(result)["test_basic_self_attention"][1]
    assert message.split("\n")[1] == ("  It fails with the course's `softmax` in place of yours too, so the mistake is "
                                      "in basic_self_attention itself."), message
    assert "This matches a known mistake: no softmax: (X X^T) X." in message
    mistakes = {c.grade_id: c.mistake for c in result.cells}
    assert mistakes["test_basic_self_attention"] == "no softmax: (X X^T) X", mistakes  # the field, for the report


@pytest.mark.slow
def test_every_scaled_dot_product_attention_mistake_no_longer_fails_self_attention(course, check):
    result, report, runs = check(A02, inject(solved_notebook(course, A02), {"scaled_dot_product_attention": NO_SCALE}))
    assert exercise_score(result, "scaled_dot_product_attention") == (0, 6)
    assert exercise_score(result, "SelfAttention") == (5, 5), report
    assert "course's `scaled_dot_product_attention`" in cells(result)["test_SelfAttention"][1]


@pytest.mark.slow
def test_gelu_in_feed_forward_costs_feed_forward_only(course, check):
    result, report, runs = check(A05, inject(solved_notebook(course, A05), {"FeedForward": GELU}))
    assert exercise_score(result, "FeedForward") == (0, 2)
    assert "GELU instead of ReLU" in cells(result)["test_FeedForward"][1]
    assert exercise_score(result, "EncoderLayer") == (6, 6) and exercise_score(result, "DecoderLayer") == (10, 10), report
    assert "the course's `FeedForward`" in cells(result)["test_EncoderLayer"][1]
    assert "the course's `FeedForward`" in cells(result)["test_DecoderLayer"][1]
    assert result.score == result.max_score - 2


# --------------------------------------------------------------------------- the harm that must not happen
def _leaks(text: str) -> list[str]:
    return [leak for leak in LEAKS if leak in text] + ENCODED.findall(text)


@pytest.mark.slow
def test_nothing_of_the_course_code_reaches_the_student(course, check):
    """The attack prints what it reads of the course's softmax, writes it to files, raises it as an
    error message and as an exception's class name, returns it as values — and passes one test cell
    only if the code it was handed is the course's (so it did read it). Graded through nbgrader:
    the verdict of that cell is all that comes back; none of it is in the table, the status, the
    messages, the feedback page, the autograded notebook, the gradebook or the verdicts file."""
    nb = inject(solved_notebook(course, A01), {"softmax": NO_KEEPDIMS, "basic_self_attention": ATTACK})
    student = "exfiltrator"
    result = autograde(course, A01, nb, student=student)
    by = cells(result)
    # the attack ran with the course's softmax, read its bytecode and sent one bit: the verdict
    assert by["test_basic_self_attention_permutation_equivariance"][0] == 1, by
    assert "passes when it calls the course's `softmax`" in by["test_basic_self_attention_permutation_equivariance"][1]
    assert by["test_basic_self_attention"][0] == 0
    assert "It fails with the course's `softmax` in place of yours too" in by["test_basic_self_attention"][1]
    texts = {"status": result.status_text, "notes": "; ".join(result.notes), "review": result.review,
             **{f"message {c.grade_id}": c.message for c in result.cells}}
    texts["feedback"] = (course.root / "feedback" / student / A01 / f"{A01}.html").read_text()
    texts["autograded"] = (course.root / "autograded" / student / A01 / f"{A01}.ipynb").read_text()
    texts["gradebook"] = course.db_path.read_bytes().decode("utf-8", "replace")
    texts["verdicts"] = (course.root.parent / "jobs" / f"{student}--{A01}" / "verdicts.json").read_text()
    for where, text in texts.items():
        assert not _leaks(text), (where, _leaks(text))
    _, report, runs = check(A01, nb)  # the student's own check says the same, and no more
    assert len(runs) == 2 and not _leaks(report), _leaks(report)


@pytest.mark.slow
def test_exit_codes_and_crashes_of_the_second_run_are_not_reported(course, check):
    """The same attacker ends the second run with an exit code that encodes the course's code: the
    status (only the first run's) shows no exit, and the test cells keep their first verdicts."""
    exits = ATTACK.replace("    _calls[0] += 1\n", "    _calls[0] += 1\n    os._exit(64 + len(f.__code__.co_varnames))\n")
    assert exits != ATTACK
    nb = inject(solved_notebook(course, A01), {"softmax": NO_KEEPDIMS, "basic_self_attention": exits})
    result, report, runs = check(A01, nb)
    assert len(runs) == 2
    assert result.status is Status.OK, result.status_text
    assert "exit code" not in report and not _leaks(report), report
    assert exercise_score(result, "basic_self_attention") == (0, 4)
    assert "did not reach this test, so the result above stands" in cells(result)["test_basic_self_attention"][1]


@pytest.mark.slow
def test_an_exercise_built_on_one_not_written_yet_is_graded_with_the_course_s(course, check):
    """softmax still the release's stub, basic_self_attention written: it is graded (and passes)
    with the course's softmax, and says so; softmax is 'not attempted'."""
    stub = next(c.source for c in course.release(A01).cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    nb = solved_notebook(course, A01)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "softmax":
            cell.source = stub
    result, report, runs = check(A01, nb)
    assert len(runs) == 2
    assert exercise_score(result, "softmax") == (0, 5) and "TODO  softmax" in report
    assert exercise_score(result, "basic_self_attention") == (4, 4), report
    assert "the course's `softmax` instead of yours" in cells(result)["test_basic_self_attention"][1]
