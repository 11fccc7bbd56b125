"""Two hints a student gets without a catalogued mistake: an answer computed in 16-bit floats and cast back
(every number returned is a float16 or bfloat16 one, the differences a few of their roundings), and an input
changed in place (PyTorch's autograd error, which torch.no_grad() would only hide). A wrong answer that is not
16-bit gets no such sentence."""
from __future__ import annotations

import math

import pytest
import torch

from autograder.checks import nb02
from autograder.checks.core import CheckFailed, check_exercise, difference

SDPA = next(e for e in nb02.EXERCISES if e.name == "scaled_dot_product_attention")
LIKELY_16 = "Likely cause: every number you returned is a {} number"


CORRECT = nb02._sdpa(nb02.GOOD_SCORES)  # the catalogue's correct scaled_dot_product_attention, as source


def _written(source: str):
    """The function a student's cell `source` defines."""
    env = {"torch": torch, "math": math}
    exec(source, env)
    return env["scaled_dot_product_attention"]


def _attention(dtype):
    """The correct attention computed in `dtype`, returned as float32 (a student's .half() and back)."""
    correct = _written(CORRECT)

    def scaled_dot_product_attention(q, k, v, mask=None):
        out, weights = correct(q.to(dtype), k.to(dtype), v.to(dtype), mask)
        return out.float(), weights.float()
    return scaled_dot_product_attention


def _message(impl) -> str:
    """The first failing check's message, over the exercises that grade scaled_dot_product_attention."""
    for exercise in (e for e in nb02.EXERCISES if e.graded == SDPA.graded):
        try:
            check_exercise(exercise, impl)
        except CheckFailed as failed:
            return str(failed)
    raise AssertionError("passed every check")


@pytest.mark.parametrize("dtype, kind", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16")])
def test_an_attention_computed_in_16_bits_is_told_so(dtype, kind):
    message = _message(_attention(dtype))
    assert LIKELY_16.format(kind) in message and "Compute in float32" in message, message


@pytest.mark.parametrize("wrong", [lambda e: e.round(), lambda e: torch.zeros_like(e), lambda e: e * 1.01,
                                   lambda e: (e * 4).round() / 4, lambda e: torch.full_like(e, 0.25)])
@pytest.mark.parametrize("expected", [torch.randn(4, 6, generator=torch.Generator().manual_seed(0)),
                                      0.25 + 1e-3 * torch.randn(4, 6, generator=torch.Generator().manual_seed(1))],
                         ids=["values", "nearly uniform weights"])
def test_a_wrong_answer_that_is_not_16_bit_gets_no_precision_hint(wrong, expected):
    """Uniform weights 1/4 where the expected ones are nearly uniform were called bfloat16 (a reviewer)."""
    problem = difference(expected, wrong(expected))
    assert problem is not None and "Likely cause: every number" not in problem.message, problem.message


def test_an_input_scaled_in_place_is_told_to_make_a_new_tensor():
    in_place = _written(CORRECT.replace("    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])",
                                        "    q.div_(math.sqrt(q.shape[-1]))\n    scores = q @ k.transpose(-2, -1)"))
    message = _message(in_place)
    assert "in-place operation" in message and "Likely cause: a tensor you were given, changed in place" in message, \
        message
