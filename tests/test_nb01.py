"""Notebook 01 checks: the reference passes, every catalogued mistake fails (and is named),
and real nbgrader takes points off wrong implementations in the right cells."""
from __future__ import annotations

import nbformat
import numpy as np
import pytest

from attention_course import similarity as ref
from autograder import serialize, trusted
from autograder.checks import nb01
from autograder.checks.core import CheckFailed, check_exercise, run_case
from autograder.course import notebook_path
from autograder.sandbox import JobResult
from autograder.selfcheck import format_report, verdicts_of

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    fresh_copy,
    inject,
    solved_notebook,
)

ASSIGNMENT = "01_similarity_attention"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb01)


@pytest.mark.parametrize("exercise", nb01.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb01, mistake, graded)


def test_calling_the_reference_is_not_accepted():
    def softmax(x, axis=-1):
        return ref.softmax(x, axis)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb01.check("softmax", softmax)


def test_stub_is_reported_as_not_attempted():
    def softmax(x, axis=-1):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb01.check("softmax", softmax)


# --------------------------------------------------------------------------- float32 answers pass
# The spec promises float32 tolerances. A student may cast to np.float32 (or compute in torch): each
# input is then rounded to 24 bits, and the rows at +-800 of the stability check moved by up to 6.9e-6.
F32 = np.float32


def normalize_rows_f32(S):
    S = np.asarray(S, dtype=F32)
    return S * (F32(1) / S.sum(axis=1, keepdims=True))


def contextualize_f32(W, E):
    W, E = np.asarray(W, dtype=F32), np.asarray(E, dtype=F32)
    return (W[:, :, None] * E[None, :, :]).sum(axis=1)          # the weighted sum, written out


def softmax_f32(x, axis=-1):
    x = np.asarray(x, dtype=F32)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_f32_logsumexp(x, axis=-1):
    x = np.asarray(x, dtype=F32)
    m = x.max(axis=axis, keepdims=True)
    return np.exp(x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True)))


def dot_similarity_f32(E):
    E = np.asarray(E, dtype=F32)
    return (E[:, None, :] * E[None, :, :]).sum(axis=-1)


def cosine_similarity_f32(E):
    E = np.asarray(E, dtype=F32)
    n = np.sqrt((E * E).sum(axis=1, keepdims=True))
    return (E @ E.T) / (n * n.T)


def basic_self_attention_f32(X):
    X = np.asarray(X, dtype=F32)
    return softmax_f32_logsumexp(X @ X.T, axis=1) @ X


FLOAT32 = [normalize_rows_f32, contextualize_f32, softmax_f32, softmax_f32_logsumexp, dot_similarity_f32,
           cosine_similarity_f32, basic_self_attention_f32]


@pytest.mark.parametrize("impl", FLOAT32, ids=lambda f: f.__name__)
def test_float32_implementations_pass(impl):
    graded = impl.__name__.split("_f32")[0]
    exercises = [e for e in nb01.EXERCISES if e.graded == graded]
    assert exercises
    for exercise in exercises:
        check_exercise(exercise, impl)


def test_the_reported_float32_softmax_passes_the_stability_check():
    """The class's answer: correct, in float32, and failed on the rows at +-800 (difference 6.9e-6)."""
    stability = next(e for e in nb01.EXERCISES if e.name == "softmax_stability")
    check_exercise(stability, softmax_f32)
    assert stability.rtol >= 1e-3   # float32 rounding of inputs near 1000 is ~1e-4 of the weights


# --------------------------------------------------------------------------- a library's softmax
def _judged(code_for: dict[str, str], outcome) -> dict[str, str]:
    """Grade the solved notebook with some answer cells replaced, as the grader does: the static pass over
    every cell, then the sandbox's outcomes (here `outcome(check, case)`, what the sandbox sends back)
    judged in the trusted process. -> the failing cells' messages."""
    source = nbformat.read(notebook_path(ASSIGNMENT), as_version=4)
    student = nbformat.from_dict(source)
    for cell in student.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in code_for:
            cell.source = code_for[gid]
    tests = trusted.test_cells(source)
    job = trusted.build_job(trusted.normalize_submission(student, source), tests)
    results = {job.test_cell_index[t.grade_id]: serialize.dumps(
        {c.key: [outcome(c, case) for case in trusted.cases(c)] for c in t.checks}) for t in tests}
    verdicts = trusted.judge_job(job, tests, JobResult(isolation="none: judged without a run", results=results,
                                                       finished=True))
    return {gid: v.message for gid, v in verdicts.items() if not v.passed}


def test_a_softmax_star_imported_from_scipy_is_told_to_write_its_own():
    """`from scipy.special import *` in place of softmax: scipy is not a course dependency, so the import
    fails where the notebook runs and nothing named softmax exists. The student used to read "nothing
    named `softmax` is defined"; the message says the exercise asks for their own softmax."""
    def sandbox(check, case):
        if trusted.exercise(check).graded == "softmax":
            return ("missing",)          # the import failed: softmax was never bound
        return run_case(trusted.exercise(check), case, STUDENT[trusted.exercise(check).graded])

    failed = _judged({"softmax": "from scipy.special import *"}, sandbox)
    assert set(failed) == {"test_softmax", "test_softmax_stability"}, failed
    for message in failed.values():
        assert "nothing named `softmax` is defined" not in message, message
        assert "your own implementation of softmax" in message and "from scipy.special import *" in message, message


@pytest.mark.parametrize("code", ["from scipy.special import softmax",
                                  "import scipy.special\nsoftmax = scipy.special.softmax",
                                  "from scipy.special import *"])
def test_a_library_softmax_is_refused_with_the_reason(code):
    failed = _judged({"softmax": code}, lambda check, case: ("missing",))
    message = failed["test_softmax"]
    assert "not accepted" in message and "softmax" in message and "yourself" in message, message
    assert "nothing named `softmax` is defined" not in message, message
    # where: the cell's number as Jupyter shows it (markdown and test cells counted), not among code cells
    cells = nbformat.read(notebook_path(ASSIGNMENT), as_version=4).cells
    number = 1 + next(i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    assert f"(cell {number} of the notebook, line " in message, message


def _code(graded, name):
    for e in nb01.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Five functions wrong at once (they don't feed each other): each loses its cells."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "normalize_rows": _code("normalize_rows", "divided each row by its maximum"),
        "contextualize": _code("contextualize", "used the columns of W (W.T @ E) instead of its rows"),
        "dot_similarity": _code("dot_similarity", "E.T @ E (a [d, d] matrix) instead of E @ E.T"),
        "cosine_similarity": _code("cosine_similarity", "cosine similarity that forgets to normalize (a plain dot product)"),
        "basic_self_attention": _code("basic_self_attention", "no softmax: (X X^T) X"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {
        "test_normalize_rows", "test_normalize_rows_apple_in_sentence_2", "test_contextualize",
        "test_dot_similarity", "test_cosine_similarity", "test_basic_self_attention",
        "test_basic_self_attention_permutation_equivariance",
    }
    assert result.score == 5  # only softmax (3) and its stability (2) were right
    messages = " ".join(c.message for c in result.cells)
    assert "forgets to normalize" in messages and "no softmax" in messages


@pytest.mark.slow
def test_nbgrader_softmax_mistakes(course):
    """An unstable softmax loses only the stability points; softmax over the whole array loses
    softmax's cells, and only those: basic_self_attention, which calls it, is graded on its own (with
    the course's softmax in its place, nb01.DEPENDS), so one mistake costs one exercise."""
    unstable = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "softmax": _code("softmax", "softmax without subtracting the max")}))
    assert failed_cells(unstable) == {"test_softmax_stability"}
    assert unstable.score == unstable.max_score - 2
    whole = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "softmax": _code("softmax", "softmax over the whole array instead of along `axis`")}))
    assert failed_cells(whole) == {"test_softmax", "test_softmax_stability"}
    assert "over the whole array" in " ".join(c.message for c in whole.cells)


@pytest.mark.slow
def test_nbgrader_a_crash_says_which_line_of_the_notebook_raised_it(course):
    """Graded for real: the crash's message names the student's helper and its line as the cell shows it (two header
    lines, then the code), not the graded function alone."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "softmax": "def shifted(x, axis):\n    return x - x.max(axis=axis, keepdims=True)[100]\n\n\n"
                   "def softmax(x, axis=-1):\n    e = np.exp(shifted(x, axis))\n    return e / e.sum(axis=axis, keepdims=True)\n"}))
    message = next(c.message for c in result.cells if c.grade_id == "test_softmax")
    assert "softmax raised IndexError" in message, message
    assert "raised at: `shifted`, line 4 of its cell: return x - x.max(axis=axis, keepdims=True)[100]" in message, message


@pytest.mark.slow
def test_nbgrader_a_star_imported_library_softmax(course):
    """Through real nbgrader: the softmax cells fail with the reason, not "nothing named softmax"."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"softmax": "from scipy.special import *\n"}))
    assert {"test_softmax", "test_softmax_stability"} <= failed_cells(result)
    messages = {c.grade_id: c.message for c in result.cells}
    for cell in ("test_softmax", "test_softmax_stability"):
        assert "your own implementation of softmax" in messages[cell], messages[cell]


@pytest.mark.slow
def test_a_name_set_only_in_a_cell_the_grader_skips_is_said_where(course):
    """A global the answer uses, set only in a cell tagged grader-skip (as a student's `device` in notebook
    06's training cell): the NameError says which cell sets it and that the grader does not run that cell."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {"softmax": (
        "def softmax(x, axis=-1):\n"
        "    x = np.asarray(x, dtype=float) / TEMPERATURE\n"
        "    e = np.exp(x - np.max(x, axis=axis, keepdims=True))\n"
        "    return e / e.sum(axis=axis, keepdims=True)\n")})
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    skipped = nbformat.v4.new_code_cell("TEMPERATURE = 1.0  # with my experiments\n")
    skipped.metadata["tags"] = ["grader-skip"]
    nb.cells.insert(at, skipped)
    result = autograde(course, ASSIGNMENT, nb)
    messages = {c.grade_id: c.message for c in result.cells if c.score < c.max_score}
    assert "test_softmax" in messages, messages
    assert "NameError" in messages["test_softmax"], messages["test_softmax"]
    assert (f"`TEMPERATURE` is set only in cell {at + 1} of the notebook, which the grader does not run"
            in messages["test_softmax"]), messages["test_softmax"]


@pytest.mark.slow
def test_an_answer_merged_into_a_skipped_cell_and_one_below_its_test_are_told_so(course, tmp_path):
    """A fairness audit of students' tools: Lab's "merge cells" of a grader-skip cell and the answer below keeps the
    first cell's tag, so the answer never ran, and the student read "no answer cell (deleted, or another notebook)";
    an answer cell moved below its own test cell read "was it renamed?". Each now says what happened."""
    from autograder.selfcheck import self_check

    nb = solved_notebook(course, ASSIGNMENT)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    answer = nb.cells[at]
    merged = nbformat.v4.new_code_cell("SEED = 0  # my slow experiment\n\n" + answer.source)
    merged.metadata["tags"] = ["grader-skip"]  # the first cell's metadata, as Lab's merge keeps it
    nb.cells[at] = merged
    path = tmp_path / f"{ASSIGNMENT}.ipynb"
    nbformat.write(nb, path)
    result, _ = self_check(path)
    report = format_report(result, verdicts_of(result, path.read_bytes(), {}))
    assert f"`softmax` is set only in cell {at + 1} of the notebook, which the grader " \
        "does not run" in report and "split it back into a cell of its own" in report, report

    nb = solved_notebook(course, ASSIGNMENT)
    test = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "test_normalize_rows")
    answer = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "normalize_rows")
    nb.cells.insert(test + 1, nb.cells.pop(answer))  # the answer cell dragged below its test cell
    result = autograde(course, ASSIGNMENT, nb)
    message = next(c.message for c in result.cells if c.grade_id == "test_normalize_rows")
    assert "comes after its test cell" in message and "Move your answer cell back above its test cell" in message, \
        message


@pytest.mark.slow
def test_a_notebook_saved_with_a_byte_order_mark_is_graded_in_full(course):
    """Some Windows editors save UTF-8 with a byte-order mark: the solved notebook so saved scored 0 as
    'unreadable notebook: not valid JSON (Unexpected UTF-8 BOM ...)', under grade and under check."""
    from autograder.submissions import parse_notebook

    data = b"\xef\xbb\xbf" + nbformat.writes(solved_notebook(course, ASSIGNMENT)).encode()
    notebook, problem = parse_notebook(data)
    assert problem is None and notebook["cells"], problem
    result = autograde(course, ASSIGNMENT, data)
    assert result.score == result.max_score and result.status.value == "ok", (result.status, result.detail)


@pytest.mark.slow
@pytest.mark.parametrize("softmax, score", [
    ("def softmax(x, axis=-1):\n    raise ValueError('\\ud800')\n", 12),  # a lone surrogate in the message
    ("def softmax(x, axis=-1):\n    return [10**400] * len(x)\n", 12),  # integers past float64
    ("def softmax(x, axis=-1):\n    import torch\n    return torch.zeros(len(x), dtype=torch.bfloat16)\n", 12),
], ids=["surrogate-message", "huge-integers", "bfloat16"])
def test_a_students_odd_output_is_their_own_result_never_the_graders_error(course, softmax, score):
    """A red team's outputs that the grader failed on, each reported as the grader's own error (0 shown,
    nothing saved, regraded every run): a lone surrogate in an exception message, integers past float64,
    a bfloat16 tensor (numpy has no such dtype). Now each is the student's wrong answer, the rest graded.
    A lone surrogate escaped in the notebook's JSON (a comment) is read as U+FFFD."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {"softmax": softmax})
    data = nbformat.writes(nb).encode()
    if softmax.startswith("def softmax(x, axis=-1):\n    raise"):  # and one in a comment, escaped in the JSON
        data = data.replace(b"def softmax(x, axis=-1):", b"def softmax(x, axis=-1):  # \\ud800", 1)
    result = autograde(course, ASSIGNMENT, data)
    assert result.status.value == "ok" and result.score == score, (result.status, result.score, result.detail)


FORKED_CHILD_RAISES = '''import os
_child = os.fork()
if _child == 0:
    raise RuntimeError("a forked child that forgot os._exit")  # back into whatever ran this cell
os.waitpid(_child, 0)
'''


def test_a_forked_child_that_falls_back_into_the_runner_never_speaks_for_the_notebook(course):
    """A child that the student's code forks and that raises instead of calling os._exit falls back
    into the runner's loop, a copy of it: it ran the next cells and wrote their frames among the real
    run's, which made the channel 'written out of the runner's order' and the whole run void (0 points,
    a channel incident). The copy now leaves at its first frame, and the notebook is graded in full."""
    nb = solved_notebook(course, ASSIGNMENT)
    first_answer = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells.insert(first_answer, nbformat.v4.new_code_cell(FORKED_CHILD_RAISES))
    result = autograde(course, ASSIGNMENT, nb)
    assert result.score == result.max_score and result.status.value == "ok", (result.status, result.detail)


LIBRARIES_DOING_THE_WORK = {
    "softmax": '''def softmax(x, axis=-1):
    import torch
    t = torch.as_tensor(np.asarray(x, dtype=float)).movedim(axis, -1)
    return torch.distributions.Categorical(logits=t).logits.exp().movedim(-1, axis).numpy()
''',
    "cosine_similarity": '''def cosine_similarity(E):
    import torch
    t = torch.as_tensor(np.asarray(E, dtype=float))
    return torch.nn.CosineSimilarity(dim=-1)(t[:, None, :], t[None, :, :]).numpy()
''',
    "basic_self_attention": '''def basic_self_attention(X):
    import torch
    t = torch.as_tensor(np.asarray(X, dtype=float))
    return torch.nn.functional.scaled_dot_product_attention(t, t, t, scale=1.0).numpy()
''',
}


@pytest.mark.slow
def test_libraries_that_do_an_exercises_work_get_no_points(course):
    """A red team's 17 of 17 with 11 points of library work, unflagged: a categorical distribution's normalised
    logits for softmax, nn.CosineSimilarity, PyTorch's fused attention with scale=1 for basic self-attention.
    Each loses its exercise's points now, saying which library did the work; nothing else is lost."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), LIBRARIES_DOING_THE_WORK))
    assert result.status == "ok", result.status_text
    assert failed_cells(result) == {"test_softmax", "test_softmax_stability", "test_cosine_similarity",
                                    "test_basic_self_attention", "test_basic_self_attention_permutation_equivariance"}, \
        failed_cells(result)
    messages = " ".join(c.message for c in result.cells)
    for library in ("Categorical", "CosineSimilarity", "scaled_dot_product_attention"):
        assert library in messages, (library, messages)


# --------------------------------------------------------------------------- a library's softmax, cosine or
# normalization under another name (a red team's cheats): refused in its own exercise, and only there
SOFTMAX_UNDER_ANOTHER_NAME = {
    # softmin of -x: F.softmin's own softmax ran unseen (the function mode runs what it sees with itself off)
    "softmin": '''import torch
import torch.nn.functional as F
def softmax(x, axis=-1):
    return F.softmin(torch.from_numpy(-np.asarray(x, dtype=np.float64)), dim=axis).numpy()
''',
    # the cross-entropy of every class as the target: exp(-nll) is the softmax (a log_softmax inside)
    "cross_entropy": '''import torch
import torch.nn.functional as F
def softmax(x, axis=-1):
    t = torch.from_numpy(np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1))
    shape = t.shape
    logits = t.reshape(-1, shape[-1])
    n, k = logits.shape
    nll = F.cross_entropy(logits.repeat_interleave(k, dim=0), torch.arange(k).repeat(n), reduction="none")
    return np.moveaxis(torch.exp(-nll).reshape(shape).numpy(), -1, axis)
''',
    # attention with the identity as keys and values, scale 1: softmax(x I^T) I
    "sdpa": '''import torch
import torch.nn.functional as F
def softmax(x, axis=-1):
    t = torch.from_numpy(np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1).copy())
    shape = t.shape
    q = t.reshape(-1, shape[-1])
    keep = torch.isfinite(q)
    eye = torch.eye(shape[-1], dtype=t.dtype)
    p = F.scaled_dot_product_attention(q.masked_fill(~keep, 0.0), eye, eye, attn_mask=keep, scale=1.0)
    return np.moveaxis(p.reshape(shape).numpy(), -1, axis)
''',
    # x - logsumexp(x) is log_softmax, and the library's logsumexp subtracts the max: the lesson, done for you
    "logsumexp": '''import torch
def softmax(x, axis=-1):
    t = torch.as_tensor(np.asarray(x, dtype=np.float64))
    return torch.exp(t - torch.logsumexp(t, dim=axis, keepdim=True)).numpy()
''',
    # the kernel by name, spelled so that no name gives it away (the static pass refuses torch.ops itself: this one is
    # for the runtime guard, in the check only)
    "aten": '''import torch
def softmax(x, axis=-1):
    t = torch.as_tensor(np.asarray(x, dtype=np.float64))
    return getattr(torch.ops.aten, "_soft" + "max")(t, axis, False).numpy()
''',
}


@pytest.mark.parametrize("name", SOFTMAX_UNDER_ANOTHER_NAME)
def test_a_library_softmax_under_another_name_is_refused_in_the_check(name):
    namespace = {"np": np}
    exec(compile(SOFTMAX_UNDER_ANOTHER_NAME[name], f"<ipython-input-{name}>", "exec"), namespace)
    for exercise in (e for e in nb01.EXERCISES if e.graded == "softmax"):
        with pytest.raises(CheckFailed, match="not accepted") as refused:
            check_exercise(exercise, namespace["softmax"])
        assert "a library's softmax" in str(refused.value), str(refused.value)


@pytest.mark.parametrize("name, kernel", [("logsumexp", "logsumexp"), ("aten", "_softmax")])
def test_a_refused_kernel_is_named_in_the_message(name, kernel):
    """A student who wrote exp(x - torch.logsumexp(x)) never typed 'softmax': the refusal says which call was one."""
    namespace = {"np": np}
    exec(compile(SOFTMAX_UNDER_ANOTHER_NAME[name], f"<ipython-input-{name}>", "exec"), namespace)
    exercise = next(e for e in nb01.EXERCISES if e.graded == "softmax")
    with pytest.raises(CheckFailed, match="not accepted") as refused:
        check_exercise(exercise, namespace["softmax"])
    assert f"PyTorch's `{kernel}` was called" in str(refused.value), str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["softmin", "cross_entropy", "sdpa", "logsumexp"])
def test_nbgrader_a_library_softmax_under_another_name_costs_softmax_only(course, name):
    """F.softmin(-x), F.cross_entropy per target class then exp(-nll), F.scaled_dot_product_attention(x, I, I,
    scale=1) and exp(x - torch.logsumexp(x)) each took softmax's 5 points (the attention one's refusal landed on
    basic_self_attention, which calls it). Each is refused in softmax's cells now, as a library's softmax;
    basic_self_attention, graded with the course's softmax in its place, keeps its points."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {"softmax": SOFTMAX_UNDER_ANOTHER_NAME[name]})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok", result.status_text
    assert failed_cells(result) == {"test_softmax", "test_softmax_stability"}, failed_cells(result)
    assert result.score == result.max_score - 5, result.score
    messages = {c.grade_id: c.message for c in result.cells}
    for cell in ("test_softmax", "test_softmax_stability"):
        assert "not accepted" in messages[cell] and "a library's softmax" in messages[cell], messages[cell]


# A second red team's: PyTorch's softmax in its distributions' transform and its compiler's decompositions, the
# library's logsumexp under logcumsumexp, a softmax computed inside a tensor subclass's own __torch_dispatch__ (where
# the kernel check had stepped aside), and a Dirichlet's mean for normalize_rows: each took its exercise's points.
MORE_LIBRARY_WORK = {
    "simplex": ("softmax", """import torch
from torch.distributions import constraints, transform_to
def softmax(x, axis=-1):
    t = torch.from_numpy(np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1).copy())
    return np.moveaxis(transform_to(constraints.simplex)(t).numpy(), -1, axis)
""", "SoftmaxTransform"),
    "decomposition": ("softmax", """import torch
from torch._decomp.decompositions import _softmax as _norm_exp
def softmax(x, axis=-1):
    return _norm_exp(torch.from_numpy(np.asarray(x, dtype=np.float64).copy()), axis, False).numpy()
""", "written out for its compiler"),
    "logcumsumexp": ("softmax", """import torch
def softmax(x, axis=-1):
    t = torch.from_numpy(np.asarray(x, dtype=np.float64).copy())
    total = torch.logcumsumexp(t, dim=axis).narrow(axis, t.shape[axis] - 1, 1)
    return torch.exp(t - total).numpy()
""", "a library's softmax"),
    "dispatching subclass": ("softmax", """import torch
import torch.nn.functional as F
_PLAIN = {}
class _Carrier(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        x = _PLAIN[id(args[0])]
        n, V = x.shape
        return torch.stack([-F.cross_entropy(x, torch.full((n,), c), reduction="none") for c in range(V)], 1).exp()
def softmax(x, axis=-1):
    a = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    flat = torch.from_numpy(a.reshape(-1, a.shape[-1]).copy())
    carrier = torch.Tensor._make_subclass(_Carrier, flat.clone())
    _PLAIN[id(carrier)] = flat
    return np.moveaxis(torch.neg(carrier).numpy().reshape(a.shape), -1, axis)
""", "its own __torch_dispatch__"),
    "dirichlet": ("normalize_rows", """import torch
from torch.distributions import Dirichlet
def normalize_rows(S):
    return Dirichlet(torch.as_tensor(np.asarray(S, dtype=np.float64)), validate_args=False).mean.numpy()
""", "Dirichlet"),
}


@pytest.mark.parametrize("name", MORE_LIBRARY_WORK)
def test_more_library_work_is_refused_in_the_check(name):
    graded, code, said = MORE_LIBRARY_WORK[name]
    namespace = {"np": np}
    exec(compile(code, f"<ipython-input-{name}>", "exec"), namespace)
    for exercise in (e for e in nb01.EXERCISES if e.graded == graded):
        with pytest.raises(CheckFailed, match="not accepted") as refused:
            check_exercise(exercise, namespace[graded])
        assert said in str(refused.value), str(refused.value)


COSINE_AND_NORMALIZE_ELSEWHERE = {
    # F.normalize with p=1: each row divided by its 1-norm, the row sum of a non-negative S
    "normalize_rows": '''import torch
import torch.nn.functional as F
def normalize_rows(S):
    return F.normalize(torch.from_numpy(np.asarray(S, dtype=np.float64)), p=1, dim=1).numpy()
''',
    # the cosine embedding loss of every pair is 1 - cos
    "cosine_similarity": '''import torch
import torch.nn.functional as F
def cosine_similarity(E):
    t = torch.from_numpy(np.asarray(E, dtype=np.float64))
    n = t.shape[0]
    a, b = t.repeat_interleave(n, dim=0), t.repeat(n, 1)
    loss = F.cosine_embedding_loss(a, b, torch.ones(n * n, dtype=t.dtype), reduction="none")
    return (1 - loss).reshape(n, n).numpy()
''',
}


def test_a_library_normalize_or_cosine_loss_is_refused_in_the_check():
    for graded, library in (("normalize_rows", "torch.nn.functional.normalize"),
                            ("cosine_similarity", "torch.nn.functional.cosine_embedding_loss")):
        namespace = {"np": np}
        exec(compile(COSINE_AND_NORMALIZE_ELSEWHERE[graded], f"<ipython-input-{graded}>", "exec"), namespace)
        exercise = next(e for e in nb01.EXERCISES if e.graded == graded)
        with pytest.raises(CheckFailed, match="not accepted") as refused:
            check_exercise(exercise, namespace[graded])
        assert library in str(refused.value), str(refused.value)


@pytest.mark.slow
def test_nbgrader_a_library_normalize_or_cosine_loss_costs_its_exercise_only(course):
    """F.normalize(S, p=1, dim=1) took normalize_rows' 3 points and F.cosine_embedding_loss (1 - cos of every
    pair) cosine_similarity's 2: each is refused in its own cells now, and nothing else is lost (contextualize's
    cells call normalize_rows: they are graded with the course's in its place)."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), COSINE_AND_NORMALIZE_ELSEWHERE))
    assert result.status == "ok", result.status_text
    assert failed_cells(result) == {"test_normalize_rows", "test_normalize_rows_apple_in_sentence_2",
                                    "test_cosine_similarity"}, failed_cells(result)
    messages = " ".join(c.message for c in result.cells)
    for library in ("torch.nn.functional.normalize", "cosine_embedding_loss"):
        assert library in messages, (library, messages)


# Honest answers in numpy or PyTorch, with the library's norms, logs and einsum: never refused.
HONEST = {
    "normalize_rows": [
        "def normalize_rows(S):\n    S = np.asarray(S, dtype=float)\n    return S / np.sum(S, axis=1, keepdims=True)\n",
        "import torch\ndef normalize_rows(S):\n    t = torch.as_tensor(np.asarray(S, dtype=float))\n"
        "    return (t / t.sum(dim=1, keepdim=True)).numpy()\n",
        "def normalize_rows(S):\n    S = np.asarray(S, dtype=float)\n    return np.einsum('ij,i->ij', S, 1 / np.einsum('ij->i', S))\n",
    ],
    "softmax": [
        "def softmax(x, axis=-1):\n    e = np.exp(x - np.max(x, axis=axis, keepdims=True))\n"
        "    return e / np.sum(e, axis=axis, keepdims=True)\n",
        "import torch\ndef softmax(x, axis=-1):\n    t = torch.as_tensor(np.asarray(x, dtype=float))\n"
        "    e = torch.exp(t - t.max(dim=axis, keepdim=True).values)\n    return (e / e.sum(dim=axis, keepdim=True)).numpy()\n",
        # a logsumexp of one's own (the name is no library's when it is yours)
        "def logsumexp(x, axis):\n    m = np.max(x, axis=axis, keepdims=True)\n"
        "    return m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))\n\n"
        "def softmax(x, axis=-1):\n    return np.exp(x - logsumexp(x, axis))\n",
        "import torch\ndef softmax(x, axis=-1):\n    t = torch.as_tensor(np.asarray(x, dtype=float))\n"
        "    z = t - torch.amax(t, dim=axis, keepdim=True)\n    return torch.exp(z - torch.log(torch.exp(z).sum(axis, keepdim=True))).numpy()\n",
    ],
    "cosine_similarity": [
        "def cosine_similarity(E):\n    U = E / np.linalg.norm(E, axis=1, keepdims=True)\n    return U @ U.T\n",
        "import torch\ndef cosine_similarity(E):\n    t = torch.as_tensor(np.asarray(E, dtype=float))\n"
        "    u = t / torch.linalg.norm(t, dim=1, keepdim=True)\n    return (u @ u.T).numpy()\n",
        "import torch\ndef cosine_similarity(E):\n    t = torch.as_tensor(np.asarray(E, dtype=float))\n"
        "    n = t.norm(dim=1, keepdim=True)\n    return (t @ t.T / (n * n.T)).numpy()\n",
        "def cosine_similarity(E):\n    E = np.asarray(E, dtype=float)\n    n = np.sqrt(np.einsum('id,id->i', E, E))\n"
        "    return np.einsum('id,jd->ij', E, E) / np.outer(n, n)\n",
    ],
    "basic_self_attention": [
        "import torch\ndef basic_self_attention(X):\n    t = torch.as_tensor(np.asarray(X, dtype=float))\n"
        "    s = t @ t.T\n    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)\n"
        "    return ((e / e.sum(dim=-1, keepdim=True)) @ t).numpy()\n",
        "def basic_self_attention(X):\n    X = np.asarray(X, dtype=float)\n"
        "    return softmax(np.einsum('id,jd->ij', X, X), axis=-1) @ X\n",
    ],
}


@pytest.mark.parametrize("graded,code", [(g, c) for g, codes in HONEST.items() for c in codes],
                         ids=[f"{g}-{i}" for g, codes in HONEST.items() for i in range(len(codes))])
def test_honest_numpy_and_torch_answers_pass(graded, code):
    namespace = {"np": np, "softmax": STUDENT["softmax"]}
    exec(compile(code, f"<ipython-input-{graded}>", "exec"), namespace)
    for exercise in (e for e in nb01.EXERCISES if e.graded == graded):
        check_exercise(exercise, namespace[graded])


@pytest.mark.slow
def test_nbgrader_honest_torch_answers_get_full_marks(course):
    """Every exercise answered in PyTorch (the softmax the max-subtraction way, basic self-attention on it, the
    cosine with torch.linalg.norm), graded for real: full marks, nothing refused."""
    torch_softmax = HONEST["softmax"][1]
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "normalize_rows": HONEST["normalize_rows"][1], "softmax": torch_softmax,
        "cosine_similarity": HONEST["cosine_similarity"][1],
        "basic_self_attention": "def basic_self_attention(X):\n    X = np.asarray(X, dtype=float)\n"
                                "    return softmax(X @ X.T, axis=-1) @ X\n"}))
    assert result.status == "ok", result.status_text
    assert result.score == result.max_score, [(c.grade_id, c.message) for c in result.cells if c.score < c.max_score]


# --------------------------------------------------------------------------- the caller's arrays stay as they were
def cosine_similarity_in_place(E):
    """An audit's 2 / 2: np.asarray(E, dtype=float) is E itself for a float E, and `E /= ...` normalized the
    caller's embeddings (a dot_similarity(E) after it gave 1 on the diagonal)."""
    E = np.asarray(E, dtype=float)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    return E @ E.T


def contextualize_in_place(W, E):
    """The contextualized embeddings written over the old ones: the right result, and the caller's E replaced."""
    out = W @ E
    E[...] = out
    return E


def basic_self_attention_in_place(X):
    """The same for X: each row replaced by its weighted average, in the caller's array."""
    X[...] = softmax_f32_logsumexp(X @ X.T, axis=-1) @ X
    return X


def test_a_cosine_similarity_that_normalizes_the_callers_array_fails_and_is_named():
    with pytest.raises(CheckFailed, match="unchanged after the call") as err:
        nb01.check("cosine_similarity", cosine_similarity_in_place)
    assert "known mistake: E divided in place (E /= its norms)" in str(err.value), str(err.value)


@pytest.mark.parametrize("graded,impl", [("contextualize", contextualize_in_place),
                                         ("basic_self_attention", basic_self_attention_in_place)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_functions_that_overwrite_their_callers_array_fail(graded, impl):
    with pytest.raises(CheckFailed, match="unchanged after the call"):
        nb01.check(graded, impl)


def cosine_similarity_asarray_out_of_place(E):
    """np.asarray without a copy, then new arrays only: the caller's E is read, never written."""
    E = np.asarray(E, dtype=float)
    U = E / np.linalg.norm(E, axis=1, keepdims=True)
    return U @ U.T


def dot_similarity_asarray(E):
    E = np.asarray(E)
    return E @ E.T


@pytest.mark.parametrize("graded,impl", [("cosine_similarity", cosine_similarity_asarray_out_of_place),
                                         ("dot_similarity", dot_similarity_asarray)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_answers_that_only_read_their_inputs_pass(graded, impl):
    for exercise in (e for e in nb01.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)
