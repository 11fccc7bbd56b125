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
from autograder.checks import nb04
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import assert_mistake_fails_and_is_named, catalogued_mistakes, autograde, failed_cells, fresh_copy, inject, solved_notebook

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


def shift_block_diag(offset, d_model):
    blocks = []
    for i in range(d_model // 2):
        c, s = math.cos(offset * 10000 ** (-2 * i / d_model)), math.sin(offset * 10000 ** (-2 * i / d_model))
        blocks.append(torch.tensor([[c, s], [-s, c]]))
    return torch.block_diag(*blocks)


@pytest.mark.parametrize("graded,impl", [("sinusoidal_positional_encoding", table_float32_exp_log),
                                         ("sinusoidal_positional_encoding", table_numpy_loops),
                                         ("PositionalEncoding", PositionalEncodingAlt),
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
