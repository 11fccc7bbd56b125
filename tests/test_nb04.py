"""Notebook 04 checks: the reference passes, other correct implementations pass, every catalogued
mistake fails (and is named), calling the reference is refused, and real nbgrader takes points
off wrong implementations in the right cells."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import positional as ref
from autograder import serialize
from autograder.checks import core, nb04
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    fresh_copy,
    inject,
    judged_as_in_grading,
    patched,
    solved_notebook,
)

ASSIGNMENT = "04_positional_encoding"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb04)


@pytest.mark.parametrize("exercise", nb04.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb04, mistake, graded)


# --------------------------------------------------------------------------- other correct answers pass
def table_float32_exp_log(max_len, d_model):
    """The PyTorch tutorial's way: frequencies by exp/log, everything in float32."""
    if d_model % 2:
        raise ValueError("odd d_model")
    position = torch.arange(max_len).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def table_numpy_loops(max_len, d_model):
    """Column by column in numpy (column j uses 2 * (j // 2)), converted at the end."""
    if d_model % 2 == 1:
        raise ValueError(f"d_model={d_model}")
    angles = np.array([[pos / np.power(10000, 2 * (j // 2) / d_model) for j in range(d_model)]
                       for pos in range(max_len)])
    angles[:, 0::2] = np.sin(angles[:, 0::2])
    angles[:, 1::2] = np.cos(angles[:, 1::2])
    return torch.tensor(angles, dtype=torch.float32)


class PositionalEncodingAlt(nn.Module):
    """F.dropout with training=self.training, a non-persistent buffer, pe[None] broadcasting."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.register_buffer("pe", table_float32_exp_log(max_len, d_model), persistent=False)

    def forward(self, x):
        B, T, D = x.shape
        if T > len(self.pe):
            raise ValueError(f"{T} positions, table of {len(self.pe)}")
        return F.dropout(x + self.pe[None, :T, :], self.p, training=self.training)


class PositionalEncodingAnnotated(nn.Module):
    """The Annotated Transformer's layout: a [1, max_len, d_model] buffer, pe[:, :T] added (its outputs are exact;
    an audit found it losing the 3 points of the buffer's case for its leading axis alone)."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.register_buffer("pe", table_float32_exp_log(max_len, d_model).unsqueeze(0))

    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError(f"{x.size(1)} positions, table of {self.pe.size(1)}")
        return self.dropout(x + self.pe[:, : x.size(1)])


def shift_block_diag(offset, d_model):
    blocks = []
    for i in range(d_model // 2):
        c, s = math.cos(offset * 10000 ** (-2 * i / d_model)), math.sin(offset * 10000 ** (-2 * i / d_model))
        blocks.append(torch.tensor([[c, s], [-s, c]]))
    return torch.block_diag(*blocks)


@pytest.mark.parametrize("graded,impl", [("sinusoidal_positional_encoding", table_float32_exp_log),
                                         ("sinusoidal_positional_encoding", table_numpy_loops),
                                         ("PositionalEncoding", PositionalEncodingAlt),
                                         ("PositionalEncoding", PositionalEncodingAnnotated),
                                         ("pe_shift_matrix", shift_block_diag)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_other_correct_implementations_pass(graded, impl):
    for exercise in (e for e in nb04.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)


def test_shift_matrix_property_of_the_reference():
    pe = ref.sinusoidal_positional_encoding(200, 32)
    for k in (0, 1, 7, 50):
        torch.testing.assert_close(pe[k:], pe[:200 - k] @ ref.pe_shift_matrix(k, 32).T, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- honesty and stubs
def test_calling_the_reference_is_not_accepted():
    def sinusoidal_positional_encoding(max_len, d_model):
        return ref.sinusoidal_positional_encoding(max_len, d_model)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb04.check("sinusoidal_positional_encoding", sinusoidal_positional_encoding)

    class PositionalEncoding(ref.PositionalEncoding):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb04.check("PositionalEncoding", PositionalEncoding)


def test_always_raising_value_error_does_not_earn_the_odd_d_model_check():
    def sinusoidal_positional_encoding(max_len, d_model):
        raise ValueError("d_model must be even")

    with pytest.raises(CheckFailed, match="an even d_model must NOT raise ValueError"):
        nb04.check("sinusoidal_positional_encoding_odd_d_model", sinusoidal_positional_encoding)


def test_stub_is_reported_as_not_attempted():
    class PositionalEncoding(nn.Module):
        def __init__(self, d_model, max_len=5000, dropout=0.0):
            super().__init__()
            raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb04.check("PositionalEncoding", PositionalEncoding)


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb04.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


ALL_CELLS = {"test_sinusoidal_positional_encoding", "test_sinusoidal_positional_encoding_odd_d_model",
             "test_PositionalEncoding", "test_PositionalEncoding_max_len", "test_PositionalEncoding_dropout",
             "test_pe_shift_matrix"}
SWAPPED = "sin and cos swapped (cos in the even columns, sin in the odd ones)"
SHIFT_HALF_EXPONENT = "exponent i/d_model instead of 2i/d_model"
SEQ_FIRST = "PE indexed by the batch axis, x.size(0) (sequence-first code on batch-first input)"


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == 12, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Three exercises wrong at once: sin and cos swapped in the table, sequence-first indexing in
    the module, the i/d exponent in the shift matrix. The module's forward is checked with the
    correct table copied into its buffer, so its own mistake is named even beside a wrong table;
    the table it builds is checked too, in the same cell. (The i/d exponent of the table itself
    and the other catalogued mistakes are graded in-process above.)"""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "sinusoidal_positional_encoding": _code("sinusoidal_positional_encoding", SWAPPED),
        "PositionalEncoding": _code("PositionalEncoding", SEQ_FIRST),
        "pe_shift_matrix": _code("pe_shift_matrix", SHIFT_HALF_EXPONENT),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {"test_sinusoidal_positional_encoding", "test_PositionalEncoding",
                                    "test_pe_shift_matrix"}
    assert result.score == 3  # odd d_model 1 + max_len 1 + dropout 1
    by_cell = {c.grade_id: c.message for c in result.cells}
    assert SWAPPED in by_cell["test_sinusoidal_positional_encoding"]
    assert SEQ_FIRST in by_cell["test_PositionalEncoding"]
    assert SHIFT_HALF_EXPONENT in by_cell["test_pe_shift_matrix"]


# --------------------------------------------------------------------------- verdicts are decided by the grader
# In grading, a case runs in the sandbox, in the student's process, and the grader judges what it
# returned. A verdict computed there with torch.allclose / torch.equal would be the student's to
# decide: they can monkeypatch those. Each test below runs the cases as the sandbox does, with a
# patch active during run_case (and serialization), restores it, and judges for real. Every patch is
# chosen so that, with the verdict computed inside the case (as before), the wrong module passed.
REAL_EQUAL, REAL_ALLCLOSE = torch.equal, torch.allclose


def _lie(name, fn) -> list:
    """Replace torch.<name> and Tensor.<name> (both spellings a check could use) by `fn`."""
    return [(torch, name, fn), (torch.Tensor, name, fn)]


def _always_close(*args, **kwargs):
    return True


def _equal_if_roughly_close(a, b):
    return REAL_ALLCLOSE(a, b, atol=1e-2)


DROPOUT = next(e for e in nb04.EXERCISES if e.name == "PositionalEncoding_dropout")
BUFFER = next(e for e in nb04.EXERCISES if e.name == "PositionalEncoding")


class _Encoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.register_buffer("pe", table_float32_exp_log(max_len, d_model))

    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("too long")
        return self.dropout(x + self.pe[:x.size(1)])


class DropsWithoutRescaling(_Encoding):
    """Zeroes a fraction p in training mode but does not scale the kept values by 1/(1-p)."""

    def dropout(self, y):
        return y * (torch.rand_like(y) >= self.p) if self.training else y


class NoisyInEvaluation(_Encoding):
    """Right in training mode; in evaluation mode it adds a little noise (eval mode is not untouched)."""

    def dropout(self, y):
        return F.dropout(y, self.p, training=True) if self.training else y + 1e-3 * torch.randn_like(y)


_TRAINING_OUTPUTS: set = set()


class NoDropoutThatLies(_Encoding):
    """No dropout at all, and patches that tell the old in-sandbox checks otherwise: outputs made in
    training mode are 'never equal' to anything, and the mean of anything is 1 - p."""

    def dropout(self, y):
        NoDropoutThatLies.p_seen = self.p
        if self.training and self.p > 0:
            _TRAINING_OUTPUTS.add(id(y))
        else:
            _TRAINING_OUTPUTS.discard(id(y))
        return y


def _not_equal_after_training(a, b):
    return False if id(a) in _TRAINING_OUTPUTS or id(b) in _TRAINING_OUTPUTS else REAL_EQUAL(a, b)


def _mean_is_one_minus_p(self, *args, **kwargs):
    return torch.tensor(1.0 - NoDropoutThatLies.p_seen)


FLAGS = ("training mode changes the output", "kept entries are (x + pe) / (1 - p)",
         "about a fraction p is zeroed", "evaluation mode drops nothing")


@pytest.mark.parametrize("impl,patches,wrong", [
    (DropsWithoutRescaling, _lie("allclose", _always_close), FLAGS[1]),
    (NoisyInEvaluation, _lie("allclose", _always_close) + _lie("equal", _equal_if_roughly_close), FLAGS[3]),
    (NoDropoutThatLies, _lie("allclose", _always_close) + _lie("equal", _not_equal_after_training)
     + [(torch.Tensor, "mean", _mean_is_one_minus_p)], FLAGS[0]),
], ids=["not rescaled, allclose patched", "noisy in eval mode, equal patched", "no dropout, equal and mean patched"])
def test_dropout_verdicts_cannot_be_patched_in_the_sandbox(impl, patches, wrong):
    messages = [m for m in judged_as_in_grading(DROPOUT, impl, *patches) if m]
    assert messages, f"{impl.__name__} passed: the dropout verdicts were decided where the student's code runs"
    assert all("wrong result" in m and "four answers" in m for m in messages), messages
    # and the answer it gets wrong is the one it is wrong about, decided here from its outputs
    caught = False
    for case in core.cases_of(DROPOUT):
        with patched(*patches):
            outcome = serialize.loads(serialize.dumps(core.run_case(DROPOUT, case, impl)))
        want = case.derive(case.run(ref.PositionalEncoding))
        got = case.derive(outcome[1])
        caught |= bool(want[FLAGS.index(wrong)] and not got[FLAGS.index(wrong)])
    assert caught, f"no case found {impl.__name__} wrong about: {wrong}"


def test_the_patches_do_fool_torch():
    """The patches above are real lies (so the tests above would fail if a verdict were decided by
    torch in the sandbox), and they are undone."""
    a, b = torch.zeros(3), torch.ones(3)
    with patched(*_lie("allclose", _always_close)):
        assert torch.allclose(a, b) and a.allclose(b)
    with patched(*_lie("equal", _equal_if_roughly_close)):
        assert torch.equal(a, a + 1e-3) and not torch.equal(a, b)
    assert not torch.allclose(a, b) and not a.allclose(b) and not torch.equal(a, a + 1e-3)
    assert "allclose" not in torch.Tensor.__dict__ and "mean" not in torch.Tensor.__dict__


def test_the_reference_passes_as_in_grading():
    for exercise in (DROPOUT, BUFFER):
        assert judged_as_in_grading(exercise, STUDENT[exercise.graded]) == [None] * len(core.cases_of(exercise))
    module = next(e for e in nb04.EXERCISES if e.name == "PositionalEncoding")  # its table back over the channel
    assert judged_as_in_grading(module, PositionalEncodingAnnotated) == [None] * len(core.cases_of(module))


@pytest.mark.parametrize("garbage", [None, "text", 3, 2.5, (), (1, 2), [torch.zeros(2)], np.zeros(3),
                                     (torch.zeros(2), "x", None), (torch.zeros(0),) * 3,
                                     (torch.zeros(2, 3), torch.zeros(3), torch.ones(4)),
                                     (np.array(["a", "b"]), np.zeros(2), np.zeros(2)),
                                     ([1, 2], "three"), (None, None), serialize.Unsupported("function")],
                         ids=repr)
def test_garbage_is_judged_wrong_without_crashing(garbage):
    for exercise in (DROPOUT, BUFFER):
        for case in core.cases_of(exercise):
            if case.derive is None:
                continue
            assert core.judge(exercise, case, ("value", garbage)), (case.description, garbage)


PATCHED_NOT_RESCALED = '''import torch
torch.allclose = lambda *a, **k: True            # the student's process: tell every check "close"
torch.Tensor.allclose = lambda *a, **k: True
torch.equal = lambda a, b: bool((a - b).abs().max() < 1) if a.shape == b.shape else False


class PositionalEncoding(nn.Module):
    """Drops without rescaling the kept values by 1/(1-p)."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))

    def forward(self, x):
        T = x.size(1)
        if T > self.pe.size(0):
            raise ValueError(f"sequence of length {T} is longer than max_len = {self.pe.size(0)}")
        y = x + self.pe[:T]
        return y * (torch.rand_like(y) >= self.p) if self.training else y
'''


@pytest.mark.slow
def test_patched_torch_earns_no_point_when_graded_for_real(course):
    """The dropout verdict is decided in the grader from the returned tensors: a submission that
    drops without rescaling and patches torch.allclose/torch.equal in its own process loses
    exactly the dropout test, graded for real through the sandbox and nbgrader."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {"PositionalEncoding": PATCHED_NOT_RESCALED})
    result = autograde(course, ASSIGNMENT, nb)
    assert failed_cells(result) == {"test_PositionalEncoding_dropout"}, [(c.grade_id, c.message[:200]) for c in result.cells]


# --------------------------------------------------------------------------- the gradient reaches x
class PositionalEncodingNoGrad(PositionalEncodingAnnotated):
    """An audit's 5 / 5 (12 / 12 for the notebook): "the table is fixed, no gradient needed", so the sum is taken
    under torch.no_grad(), and the embeddings below never learn."""

    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError("too long")
        with torch.no_grad():
            out = x + self.pe[:, : x.size(1)]
        return self.dropout(out)


class PositionalEncodingDetached(PositionalEncodingAnnotated):
    """The same with x.detach() (an audit's 12 / 12)."""

    def forward(self, x):
        if x.size(1) > self.pe.size(1):
            raise ValueError("too long")
        return self.dropout(x.detach() + self.pe[:, : x.size(1)])


@pytest.mark.parametrize("impl", [PositionalEncodingNoGrad, PositionalEncodingDetached], ids=lambda c: c.__name__)
def test_a_positional_encoding_cut_off_from_the_graph_fails_and_is_named(impl):
    with pytest.raises(CheckFailed, match="x.grad") as err:
        nb04.check("PositionalEncoding", impl)
    assert "known mistake: the output cut off from the graph" in str(err.value), str(err.value)


class PositionalEncodingPlainAttribute(nn.Module):
    """pe a plain tensor attribute (it loses the buffer's case, nothing else), the table built in float64 under
    torch.no_grad() and cast: the gradient still reaches x."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        with torch.no_grad():
            self.pe = STUDENT["sinusoidal_positional_encoding"](max_len, d_model).double().float()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("too long")
        return self.dropout(x + self.pe[: x.size(1)])


class PositionalEncodingInferenceTable(PositionalEncodingAnnotated):
    """The table made under torch.inference_mode() and kept as a buffer, an inference tensor (x + pe still
    backpropagates to x)."""

    def __init__(self, d_model, max_len=5000, dropout=0.0):
        nn.Module.__init__(self)
        self.dropout = nn.Dropout(p=dropout)
        with torch.inference_mode():
            table = table_float32_exp_log(max_len, d_model)
        self.register_buffer("pe", table.unsqueeze(0))


@pytest.mark.parametrize("impl", [PositionalEncodingAlt, PositionalEncodingAnnotated, PositionalEncodingPlainAttribute,
                                  PositionalEncodingInferenceTable], ids=lambda c: c.__name__)
def test_the_gradient_case_passes_whatever_holds_the_table(impl):
    exercise = next(e for e in nb04.EXERCISES if e.name == "PositionalEncoding")
    case = next(c for c in core.cases_of(exercise) if "x.grad" in c.description)
    assert core.judge(exercise, case, core.run_case(exercise, case, impl)) is None
