"""Notebook 03 checks: the reference passes, other correct implementations pass, every catalogued
mistake fails (and is named), torch.nn.MultiheadAttention and the reference are refused, the
layer keeps the API notebook 05 builds on, and real nbgrader takes points off wrong
implementations in the right cells."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import multihead as ref
from autograder import serialize
from autograder.checks import core, nb03
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

ASSIGNMENT = "03_multi_head_attention"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb03)


@pytest.mark.parametrize("exercise", nb03.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb03, mistake, graded)


# --------------------------------------------------------------------------- other correct answers pass
class MultiHeadAttentionAlt(nn.Module):
    """einsum over [B, T, H, Dh] (no explicit split/merge), F.dropout, a large negative fill."""

    def __init__(self, d_model, num_heads, key_dim=None, value_dim=None, dropout=0.0, bias=True):
        super().__init__()
        self.h = num_heads
        self.kd = key_dim or d_model // num_heads
        self.vd = value_dim or self.kd
        self.p = dropout
        self.out_proj = nn.Linear(self.h * self.vd, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, self.h * self.vd, bias=bias)
        self.k_proj = nn.Linear(d_model, self.h * self.kd, bias=bias)
        self.q_proj = nn.Linear(d_model, self.h * self.kd, bias=bias)

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q = self.q_proj(query).unflatten(-1, (self.h, self.kd))
        k = self.k_proj(key).unflatten(-1, (self.h, self.kd))
        v = self.v_proj(value).unflatten(-1, (self.h, self.vd))
        scores = torch.einsum("bqhd,bkhd->bhqk", q * self.kd ** -0.5, k)
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), -1e30)
        weights = scores.softmax(-1)
        if mask is not None:
            weights = weights * mask
        heads = torch.einsum("bhqk,bkhd->bqhd", F.dropout(weights, self.p, self.training), v)
        return self.out_proj(heads.flatten(2)), weights


def split_heads_chunks(x, num_heads):
    if x.shape[-1] % num_heads:
        raise ValueError(f"{x.shape[-1]} features do not split into {num_heads} heads")
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


def merge_heads_cat(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


def count_parameters_trainable(module):
    """The class's answer: only parameters with requires_grad. It passed: no case had a frozen parameter."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def count_parameters_unique(module):
    """Unique parameters by identity, frozen or not."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


class MultiHeadAttentionWithABuffer(MultiHeadAttentionAlt):
    """A constant kept with register_buffer: not in the specification, no mistake, kept when weights are copied in."""

    def __init__(self, d_model, num_heads, key_dim=None, value_dim=None, dropout=0.0, bias=True):
        super().__init__(d_model, num_heads, key_dim, value_dim, dropout, bias)
        self.register_buffer("unit", torch.ones(1))

    def forward(self, query, key=None, value=None, mask=None):
        out, weights = super().forward(query, key, value, mask)
        return out * self.unit, weights


@pytest.mark.parametrize("graded,impl", [("MultiHeadAttention", MultiHeadAttentionAlt),
                                         ("MultiHeadAttention", MultiHeadAttentionWithABuffer),
                                         ("split_heads", split_heads_chunks),
                                         ("merge_heads", merge_heads_cat),
                                         ("count_parameters", count_parameters_unique)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_other_correct_implementations_pass(graded, impl):
    for exercise in (e for e in nb03.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)


# --------------------------------------------------------------------------- the simulated class's wrong answers
class WeightsAfterDropout(MultiHeadAttentionAlt):
    """The class's answer: dropout on the weights, and the dropped-out weights returned."""

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q = self.q_proj(query).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
        k = self.k_proj(key).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
        v = self.v_proj(value).unflatten(-1, (self.h, self.vd)).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / self.kd ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.dropout(torch.nan_to_num(scores.softmax(-1)), self.p, self.training)
        return self.out_proj((weights @ v).transpose(1, 2).flatten(2)), weights


class DropoutOnTheOutput(MultiHeadAttentionAlt):
    """The class's answer: the attention without dropout, the dropout on the layer's output."""

    def forward(self, query, key=None, value=None, mask=None):
        p, self.p = self.p, 0.0
        try:
            out, weights = super().forward(query, key, value, mask)
        finally:
            self.p = p
        return F.dropout(out, self.p, self.training), weights


@pytest.mark.parametrize("impl,name", [
    (WeightsAfterDropout, "returned the attention weights after dropout"),
    (DropoutOnTheOutput, "dropout applied to the layer's output instead of the attention weights"),
], ids=["weights after dropout", "dropout on the output"])
def test_the_classes_dropout_mistakes_fail_and_are_named(impl, name):
    with pytest.raises(CheckFailed, match="training mode") as err:
        nb03.check("MultiHeadAttention", impl)
    assert f"known mistake: {name}." in str(err.value), str(err.value)


class OwnUnstableSoftmax(MultiHeadAttentionAlt):
    """An audit's 18 / 18: the heads' softmax written by hand, exp(q k^T / sqrt(d)) without the max subtracted."""

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        q = self.q_proj(query).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
        k = self.k_proj(key).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
        v = self.v_proj(value).unflatten(-1, (self.h, self.vd)).transpose(1, 2)
        e = torch.exp(q @ k.transpose(-2, -1) / self.kd ** 0.5)
        if mask is not None:
            e = e * mask
        weights = e / e.sum(-1, keepdim=True).clamp_min(1e-30)
        heads = F.dropout(weights, self.p, self.training) @ v
        return self.out_proj(heads.transpose(1, 2).flatten(2)), weights


def test_an_unstable_softmax_by_hand_fails_and_is_named():
    with pytest.raises(CheckFailed, match="scores in the hundreds") as err:
        nb03.check("MultiHeadAttention", OwnUnstableSoftmax)
    assert f"known mistake: {nb03.UNSTABLE}." in str(err.value), str(err.value)


def test_counting_only_trainable_parameters_fails_and_is_named():
    with pytest.raises(CheckFailed, match="frozen") as err:
        nb03.check("count_parameters", count_parameters_trainable)
    assert "known mistake: counted only the trainable parameters" in str(err.value), str(err.value)


def _param_count_as(kind):
    """The reference's count, returned as `kind` makes it (an int's other spellings, or a float)."""
    return lambda *args, **kwargs: kind(STUDENT["mha_param_count"](*args, **kwargs))


PARAM_COUNT = next(e for e in nb03.EXERCISES if e.graded == "mha_param_count")


@pytest.mark.parametrize("kind", [int, np.int64, torch.tensor, lambda n: torch.tensor(n, dtype=torch.int32)],
                         ids=["int", "np.int64", "torch.tensor", "int32 tensor"])
def test_a_parameter_count_of_any_integer_type_passes(kind):
    assert judged_as_in_grading(PARAM_COUNT, _param_count_as(kind)) == [None] * len(core.cases_of(PARAM_COUNT))


@pytest.mark.parametrize("kind", [float, np.float32, lambda n: torch.tensor(float(n))], ids=["float", "np.float32",
                                                                                              "float tensor"])
def test_a_parameter_count_returned_as_a_float_is_told_to_be_an_int(kind):
    """d_model / num_heads makes every count a float (418.0): right in value, not a number of parameters."""
    messages = judged_as_in_grading(PARAM_COUNT, _param_count_as(kind))
    assert all(m and "a float: a number of parameters is a whole number" in m and "d_model // num_heads" in m
               for m in messages), messages


# --------------------------------------------------------------------------- honesty and stubs
def test_using_torch_multihead_attention_is_not_accepted():
    class MultiHeadAttention(MultiHeadAttentionAlt):
        def __init__(self, d_model, num_heads, **kwargs):
            super().__init__(d_model, num_heads, **kwargs)
            self._torch = nn.MultiheadAttention(d_model, num_heads, batch_first=True)

        def load_state_dict(self, state, strict=True):
            state = dict(state, **{f"_torch.{k}": v for k, v in self._torch.state_dict().items()})
            return super().load_state_dict(state, strict)

        def forward(self, query, key=None, value=None, mask=None):
            key = query if key is None else key
            value = key if value is None else value
            return self._torch(query, key, value, attn_mask=None if mask is None else ~mask,
                               average_attn_weights=False)

    with pytest.raises(CheckFailed, match="torch.nn.MultiheadAttention, the layer"):
        nb03.check("MultiHeadAttention", MultiHeadAttention)


def test_calling_the_reference_is_not_accepted():
    def split_heads(x, num_heads):
        return ref.split_heads(x, num_heads)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb03.check("split_heads", split_heads)


def test_stub_is_reported_as_not_attempted():
    def merge_heads(x):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb03.check("merge_heads", merge_heads)


BEGUN_MHA = """
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, key_dim=None, value_dim=None, dropout=0.0, bias=True):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model, bias=bias)
                                                                for _ in range(4))

    def forward(self, query, key=None, value=None, mask=None):
        raise NotImplementedError()
"""


def test_a_class_begun_but_not_finished_is_told_which_method_is_left():
    """__init__ written, forward still the stub: "not attempted yet" told a student who had begun that they had
    not; the message names the method left to write."""
    namespace = {"nn": nn}
    exec(compile(BEGUN_MHA, "<student cell>", "exec"), namespace)  # defined at top level, as in a notebook
    MultiHeadAttention = namespace["MultiHeadAttention"]
    with pytest.raises(CheckFailed) as failed:
        nb03.check("MultiHeadAttention", MultiHeadAttention)
    message = str(failed.value)
    assert "not finished yet: its method `forward` still raises NotImplementedError" in message, message
    assert "not attempted" not in message, message


# --------------------------------------------------------------------------- verdicts are decided by the grader
# In grading a case runs in the sandbox, in the student's process; a verdict computed there with
# torch.allclose would be the student's to decide (they can monkeypatch it). The dropout case now
# returns the training-mode output and the grader decides "training mode changes the output".
MHA = next(e for e in nb03.EXERCISES if e.name == "MultiHeadAttention")
NEVER_CLOSE = ((torch, "allclose", lambda *a, **k: False), (torch.Tensor, "allclose", lambda *a, **k: False))


NEVER_CLOSE_NP = ((np, "allclose", lambda *a, **k: True), (np, "isclose", lambda *a, **k: np.ones(np.shape(a[0]), bool)))
DROPOUT_CASES = [c.description for c in core.cases_of(MHA) if c.derive is not None]


@pytest.mark.parametrize("name", ["dropout never applied", "returned the attention weights after dropout",
                                  "dropout applied to the layer's output instead of the attention weights"])
def test_dropout_verdict_cannot_be_patched_in_the_sandbox(name):
    """Layers that get dropout wrong, with torch's and numpy's closeness tests patched to lie while the
    cases run (with the verdicts computed inside the case, 'never applied' passed), fail only the
    dropout cases, and are named: the flags are decided in the trusted process."""
    mistake = next(m for m in MHA.mistakes if m.name == name)
    with patched(*NEVER_CLOSE):
        assert not torch.allclose(torch.zeros(2), torch.zeros(2))   # the patch is a real lie ...
    assert torch.allclose(torch.zeros(2), torch.zeros(2)) and "allclose" not in torch.Tensor.__dict__  # ... undone
    messages = judged_as_in_grading(MHA, mistake.build("MultiHeadAttention", MHA.namespace),
                                    *NEVER_CLOSE, *NEVER_CLOSE_NP)
    failed = [(c.description, m) for c, m in zip(core.cases_of(MHA), messages, strict=True) if m]
    assert failed, messages
    for description, message in failed:
        assert description in DROPOUT_CASES, message
        assert f"known mistake: {name}." in message, message
        assert "output[2]" in message and "expected True, got False" in message, message


def test_the_dropout_cases_say_what_they_check():
    assert "training mode changes the output" in DROPOUT_CASES[0] and "weights before dropout" in DROPOUT_CASES[0]
    assert "fraction p = 0.3" in DROPOUT_CASES[1] and "weight / (1 - p)" in DROPOUT_CASES[1]


def test_dropout_on_the_weights_drawn_otherwise_passes():
    """The dropout cases judge what dropout did, not which random numbers drew it: a layer that draws its
    own Bernoulli mask (from the global generator, in another order) passes."""
    class BernoulliDropout(MultiHeadAttentionAlt):
        def forward(self, query, key=None, value=None, mask=None):
            key = query if key is None else key
            value = key if value is None else value
            torch.rand(7)                                 # draws something else first
            q = self.q_proj(query).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
            k = self.k_proj(key).unflatten(-1, (self.h, self.kd)).transpose(1, 2)
            v = self.v_proj(value).unflatten(-1, (self.h, self.vd)).transpose(1, 2)
            scores = q @ k.transpose(-2, -1) / self.kd ** 0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.nan_to_num(scores.softmax(-1))
            dropped = weights
            if self.training and self.p > 0:
                keep = torch.rand(weights.shape).flip(0) >= self.p
                dropped = weights * keep / (1 - self.p)
            return self.out_proj((dropped @ v).transpose(1, 2).flatten(2)), weights

    for exercise in (e for e in nb03.EXERCISES if e.graded == "MultiHeadAttention"):
        check_exercise(exercise, BernoulliDropout)


def test_the_reference_passes_as_in_grading():
    assert judged_as_in_grading(MHA, STUDENT["MultiHeadAttention"]) == [None] * len(core.cases_of(MHA))


@pytest.mark.parametrize("garbage", [None, "text", 3, (), (1, 2), [torch.zeros(2)], (torch.zeros(2), "x", None),
                                     (torch.zeros(2, 5, 12), torch.zeros(2, 3, 5, 5), torch.zeros(7)),
                                     (torch.zeros(2, 5, 12), torch.zeros(2, 3, 5, 5), "text"),
                                     serialize.Unsupported("function")], ids=repr)
def test_garbage_is_judged_wrong_without_crashing(garbage):
    case = next(c for c in core.cases_of(MHA) if c.derive is not None)
    assert core.judge(MHA, case, ("value", garbage))


# --------------------------------------------------------------------------- the API notebook 05 builds on
def test_multihead_attention_api():
    init = inspect.signature(ref.MultiHeadAttention.__init__)
    assert list(init.parameters) == ["self", "d_model", "num_heads", "key_dim", "value_dim", "dropout", "bias"]
    assert [init.parameters[p].default for p in ("key_dim", "value_dim", "dropout", "bias")] == [None, None, 0.0, True]
    forward = inspect.signature(ref.MultiHeadAttention.forward)
    assert list(forward.parameters) == ["self", "query", "key", "value", "mask"]
    mha = ref.MultiHeadAttention(16, 4).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    padding = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    padding[1, ..., 5:] = False
    out, w = mha(x, memory, mask=padding)
    assert out.shape == (2, 5, 16) and w.shape == (2, 4, 5, 7)
    assert (w[1, ..., 5:] == 0).all()
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    out, w = mha(x, mask=causal)
    assert (w[..., ~causal] == 0).all()
    assert ref.count_parameters(ref.MultiHeadAttention(16, 3, key_dim=2)) == 418
    assert ref.count_parameters(ref.MultiHeadAttention(16, 3, key_dim=5)) == 1021


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb03.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


ALL_CELLS = {"test_split_heads", "test_merge_heads", "test_MultiHeadAttention", "test_MultiHeadAttention_mask",
             "test_MultiHeadAttention_cross", "test_MultiHeadAttention_gradients", "test_count_parameters",
             "test_MultiHeadAttention_keras_example", "test_mha_param_count", "test_MultiHeadAttention_matches_torch"}
MHA_CELLS = {"test_MultiHeadAttention", "test_MultiHeadAttention_mask", "test_MultiHeadAttention_cross",
             "test_MultiHeadAttention_gradients", "test_MultiHeadAttention_matches_torch"}


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == 18, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Four exercises wrong at once; the layer's mistake is written without the student's
    split/merge, so none feeds another."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "split_heads": _code("split_heads", "heads split without the transpose"),
        "merge_heads": _code("merge_heads", "merge that scrambles heads (reshape without the transpose)"),
        "MultiHeadAttention": _code("MultiHeadAttention",
                                    "out_proj missing (the merged heads are returned without the output projection)"),
        "count_parameters": _code("count_parameters", "counted the state_dict (buffers and shared parameters too)"),
        "mha_param_count": _code("mha_param_count", "the output map sized with key_dim (it reads the values)"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {"test_split_heads", "test_merge_heads", "test_count_parameters",
                                    "test_MultiHeadAttention_keras_example", "test_mha_param_count"} | MHA_CELLS
    assert result.score == 0
    messages = " ".join(c.message for c in result.cells)
    assert "out_proj missing" in messages and "counted the state_dict" in messages
    assert "the output map sized with key_dim" in messages


@pytest.mark.slow
def test_nbgrader_key_dim_ignored_and_other_slips(course):
    """Ignoring key_dim only shows when key_dim is given: the Keras example and the hidden cases
    with key_dim lose points, the comparison with torch (key_dim = d_model / H) does not."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "split_heads": _code("split_heads", "no ValueError when the width is not divisible by num_heads"),
        "merge_heads": _code("merge_heads", ".view() on the transposed tensor (it is not contiguous)"),
        "MultiHeadAttention": _code("MultiHeadAttention",
                                    "key_dim ignored (the projections are always d_model // num_heads per head)"),
        "count_parameters": _code("count_parameters", "counted parameter tensors instead of numbers"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {"test_split_heads", "test_merge_heads", "test_count_parameters",
                                    "test_MultiHeadAttention_keras_example"} | MHA_CELLS - {"test_MultiHeadAttention_matches_torch"}
    assert result.score == 4  # count_parameters is wrong; mha_param_count (2 points) and the torch comparison right
    messages = " ".join(c.message for c in result.cells)
    assert "key_dim ignored" in messages


# --------------------------------------------------------------------------- one layer, many calls; the caller's tensors
class MultiHeadAttentionMemoryKept(MultiHeadAttentionAlt):
    """An audit's 10 / 10: "the memory is the same at every decoding step: project it once", kept on the module, so
    every call after the first attends over the first call's memory."""

    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        if getattr(self, "_kv", None) is None:
            self._kv = (self.k_proj(key).unflatten(-1, (self.h, self.kd)), self.v_proj(value).unflatten(-1, (self.h, self.vd)))
        k, v = self._kv
        q = self.q_proj(query).unflatten(-1, (self.h, self.kd))
        scores = torch.einsum("bqhd,bkhd->bhqk", q * self.kd ** -0.5, k)
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        weights = torch.nan_to_num(scores.softmax(-1), nan=0.0)
        heads = torch.einsum("bhqk,bkhd->bqhd", F.dropout(weights, self.p, self.training), v)
        return self.out_proj(heads.flatten(2)), weights


class MultiHeadAttentionKeepsItsLastWeights(MultiHeadAttentionAlt):
    """Correct: the last weights and the last projected keys kept for a heatmap, stored and never read back."""

    def forward(self, query, key=None, value=None, mask=None):
        self.last_keys = self.k_proj(query if key is None else key).detach()
        out, self.last_weights = super().forward(query, key, value, mask)
        return out, self.last_weights


def test_multi_head_attention_that_keeps_the_first_memory_fails_and_is_named():
    with pytest.raises(CheckFailed, match="called twice") as err:
        nb03.check("MultiHeadAttention_cross", MultiHeadAttentionMemoryKept)
    assert "known mistake: the memory's keys and values kept from the first call" in str(err.value), str(err.value)


def test_multi_head_attention_that_stores_what_it_computes_passes():
    for exercise in (e for e in nb03.EXERCISES if e.graded == "MultiHeadAttention"):
        check_exercise(exercise, MultiHeadAttentionKeepsItsLastWeights)


def merge_heads_transpose_in_place(x):
    """An audit's 2 / 2: the right output, and the caller's [B, H, T, Dh] tensor left as [B, T, H, Dh]."""
    B, H, T, Dh = x.shape
    return x.transpose_(1, 2).reshape(B, T, H * Dh)


def split_heads_resized_in_place(x, num_heads):
    """The right output, and the caller's [B, T, D] tensor left as [B, T, H, Dh] (resize_ changes x itself)."""
    B, T, D = x.shape
    if D % num_heads:
        raise ValueError(f"{D} features do not split into {num_heads} heads")
    return x.resize_(B, T, num_heads, D // num_heads).transpose(1, 2)


def test_a_merge_heads_that_transposes_its_argument_in_place_fails_and_is_named():
    with pytest.raises(CheckFailed, match="unchanged after the call") as err:
        nb03.check("merge_heads", merge_heads_transpose_in_place)
    assert "known mistake: x transposed in place (x.transpose_(1, 2))" in str(err.value), str(err.value)


def test_a_split_heads_that_reshapes_its_argument_in_place_fails():
    with pytest.raises(CheckFailed, match="unchanged after the call"):
        nb03.check("split_heads", split_heads_resized_in_place)


def count_parameters_per_child(module):
    return sum(p.numel() for m in module.children() for p in m.parameters())


def count_parameters_per_module(module):
    """A mutation test's answer: each module's own parameters (recurse=False), over module.modules()."""
    return sum(p.numel() for m in module.modules() for p in m.parameters(recurse=False))


def count_parameters_every_name(module):
    return sum(p.numel() for _, p in module.named_parameters(remove_duplicate=False))


@pytest.mark.parametrize("impl,name,case", [
    (count_parameters_per_child, "added up the parameters layer by layer", "b.weight = a.weight"),
    (count_parameters_per_module, "added up the parameters layer by layer", "b.weight = a.weight"),
    (count_parameters_every_name, "counted a shared parameter once per use (named_parameters(remove_duplicate=False))",
     "one Linear(4, 4) used twice"),
], ids=["children", "modules", "remove_duplicate=False"])
def test_double_counted_shared_parameters_are_named_for_what_they_are(impl, name, case):
    """An audit: both were told "counted the state_dict", which they never touch (the state_dict repeats shared
    weights too, and the diagnosis names the first catalogued mistake that matches)."""
    with pytest.raises(CheckFailed, match="count_parameters gave a wrong result") as err:
        nb03.check("count_parameters", impl)
    message = str(err.value)
    assert case in message and f"known mistake: {name}" in message and "state_dict" not in message, message
