"""Notebook 05 checks: the reference passes, other correct implementations pass, every catalogued
mistake fails (and is named), PyTorch's Transformer layers and the reference are refused, the
layers keep the API notebook 06 builds on (and agree with PyTorch's), and real nbgrader takes
points off wrong implementations in the right cells."""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import layers as ref
from attention_course.multihead import MultiHeadAttention
from autograder.checks import core, nb05
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    failure_messages,
    fresh_copy,
    inject,
    judged_as_in_grading,
    solved_notebook,
)

ASSIGNMENT = "05_masked_cross_attention"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb05)


@pytest.mark.parametrize("exercise", nb05.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb05, mistake, graded)


# --------------------------------------------------------------------------- other correct answers pass
def causal_mask_alt(size):
    return torch.tril(torch.ones(size, size)).bool()


def masked_softmax_alt(scores, mask=None):
    """A large negative fill, exp by hand, then the mask multiplied in."""
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    scores = torch.where(mask, scores, torch.full_like(scores, -1e30))
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * mask
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def padding_mask_alt(tokens, pad_id):
    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)


class LayerNormAlt(nn.Module):
    """torch.var with unbiased=False and rsqrt, the parameters created in the other order."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, unbiased=False, keepdim=True)
        return torch.addcmul(self.bias, (x - mean) * torch.rsqrt(var + self.eps), self.weight)


class FeedForwardAlt(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.p = dropout
        self.linear2 = nn.Linear(d_ff, d_model)
        self.linear1 = nn.Linear(d_model, d_ff)

    def forward(self, x):
        return self.linear2(F.dropout(F.relu(self.linear1(x)), self.p, self.training))


class EncoderLayerAlt(nn.Module):
    """A helper for 'sublayer with residual and norm', F.dropout, key/value left to default."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first, self.p = norm_first, dropout
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ff = FeedForwardAlt(d_model, d_ff, dropout)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)

    def _residual(self, x, norm, sublayer):
        if self.norm_first:
            return x + F.dropout(sublayer(norm(x)), self.p, self.training)
        return norm(x + F.dropout(sublayer(x), self.p, self.training))

    def forward(self, x, mask=None):
        x = self._residual(x, self.norm1, lambda h: self.self_attn(h, mask=mask)[0])
        return self._residual(x, self.norm2, self.ff)


class DecoderLayerAlt(nn.Module):
    """The same helper; the weights kept detached."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.norm_first, self.p = norm_first, dropout
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ff = FeedForwardAlt(d_model, d_ff, dropout)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.self_attn_weights = self.cross_attn_weights = None

    def _residual(self, x, norm, sublayer):
        if self.norm_first:
            return x + F.dropout(sublayer(norm(x)), self.p, self.training)
        return norm(x + F.dropout(sublayer(x), self.p, self.training))

    def _self(self, h, mask):
        out, w = self.self_attn(h, mask=mask)
        self.self_attn_weights = w.detach()
        return out

    def _cross(self, h, memory, mask):
        out, w = self.cross_attn(h, memory, memory, mask)
        self.cross_attn_weights = w.detach()
        return out

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        x = self._residual(x, self.norm1, lambda h: self._self(h, tgt_mask))
        x = self._residual(x, self.norm2, lambda h: self._cross(h, memory, memory_mask))
        return self._residual(x, self.norm3, self.ff)


@pytest.mark.parametrize("graded,impl", [("causal_mask", causal_mask_alt), ("masked_softmax", masked_softmax_alt),
                                         ("padding_mask", padding_mask_alt), ("LayerNorm", LayerNormAlt),
                                         ("FeedForward", FeedForwardAlt),
                                         ("EncoderLayer", EncoderLayerAlt), ("DecoderLayer", DecoderLayerAlt)],
                         ids=lambda x: getattr(x, "__name__", x))
def test_other_correct_implementations_pass(graded, impl):
    for exercise in (e for e in nb05.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)


# --------------------------------------------------------------------------- the simulated class's wrong answer
class FeedForwardDropoutLast(FeedForwardAlt):
    """The class's answer: dropout after linear2. It passed: every case ran in evaluation mode."""

    def forward(self, x):
        return F.dropout(self.linear2(F.relu(self.linear1(x))), self.p, self.training)


class FeedForwardDropoutFirst(FeedForwardAlt):
    def forward(self, x):
        return self.linear2(F.relu(self.linear1(F.dropout(x, self.p, self.training))))


FF = nb05.check.exercises["FeedForward"]
FF_DROPOUT = next(c for c in core.cases_of(FF) if "in training mode the output shows" in c.description)


def test_dropout_after_linear2_fails_and_is_named():
    with pytest.raises(CheckFailed, match="training mode") as err:
        nb05.check("FeedForward", FeedForwardDropoutLast)
    assert "known mistake: dropout after linear2 (on the output) instead of after the ReLU" in str(err.value)


def test_dropout_in_the_wrong_place_fails_the_training_mode_case():
    message = core.judge(FF, FF_DROPOUT, core.run_case(FF, FF_DROPOUT, FeedForwardDropoutFirst))
    assert message and "output[1]" in message and "expected True, got False" in message, message


NEVER_CLOSE_NP = ((np, "allclose", lambda *a, **k: True), (np, "isclose", lambda *a, **k: np.ones(np.shape(a[0]), bool)),
                  (torch, "allclose", lambda *a, **k: True))


def test_the_dropout_verdicts_are_decided_by_the_grader():
    """With the closeness tests patched to say 'close' where the cases run, dropout after linear2 still
    fails: the outputs come back and the flags are computed in the trusted process."""
    messages = judged_as_in_grading(FF, FeedForwardDropoutLast, *NEVER_CLOSE_NP)
    failed = [m for m in messages if m]
    assert len(failed) == 1 and "known mistake: dropout after linear2" in failed[0], messages
    assert judged_as_in_grading(FF, FeedForwardAlt) == [None] * len(messages)


# --------------------------------------------------------------------------- masks, softmax by hand, dropout passed on
def masked_softmax_max_over_masked(scores, mask=None):
    """An audit's 29 / 29: stable and fully-masked-safe, but the max runs over the masked scores too."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * mask
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def masked_softmax_inverted_unguarded(scores, mask=None):
    """PyTorch's convention (True = blocked), no zeroing after the softmax: NaN where the inverted mask hides all."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)


def _messages(graded, impl):
    return failure_messages(nb05, graded, impl)


@pytest.mark.parametrize("impl,name", [
    (masked_softmax_max_over_masked, nb05.MAX_OVER_MASKED),
    (masked_softmax_inverted_unguarded, "mask convention inverted (True treated as 'blocked', PyTorch's nn "
                                        "convention): the row that may see every key becomes fully masked and gives NaN"),
], ids=["max over masked keys", "inverted mask, no NaN guard"])
def test_masked_softmax_mistakes_fail_and_are_named(impl, name):
    messages = _messages("masked_softmax", impl)
    assert messages, f"{impl.__name__} passed every check of masked_softmax"
    assert any(f"{core.KNOWN_MISTAKE}{name}." in m for m in messages), messages


class EncoderLayerFFWithoutDropout(EncoderLayerAlt):
    """The reader's layer: FeedForward(d_model, d_ff), the dropout not passed on (its default 0.0 stays)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first)
        self.ff = FeedForwardAlt(d_model, d_ff)


class DecoderLayerFFWithoutDropout(DecoderLayerAlt):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, num_heads, d_ff, dropout, norm_first)
        self.ff = FeedForwardAlt(d_model, d_ff)


@pytest.mark.parametrize("graded,impl", [("EncoderLayer", EncoderLayerFFWithoutDropout),
                                         ("DecoderLayer", DecoderLayerFFWithoutDropout)], ids=["encoder", "decoder"])
def test_a_feed_forward_built_without_the_dropout_is_named_and_told_what_to_pass(graded, impl):
    """It fails only the case that calls each sublayer twice in training mode, which said just 'expected True,
    got False at index (1,)': the message names the mistake and the call to write."""
    messages = _messages(graded, impl)
    assert messages and all("each called twice" in m for m in messages), messages
    for message in messages:
        assert f"{core.KNOWN_MISTAKE}the feed-forward built without the layer's dropout" in message, message
        assert "FeedForward(d_model, d_ff, dropout)" in message, message


# --------------------------------------------------------------------------- honesty and stubs
def test_pytorch_transformer_layer_is_not_accepted():
    class EncoderLayer(EncoderLayerAlt):
        """Our parameter names, PyTorch's layer doing the work."""

        def forward(self, x, mask=None):
            d, h = x.shape[-1], self.self_attn.num_heads
            torch_layer = nn.TransformerEncoderLayer(d, h, self.ff.linear1.out_features, dropout=0.0,
                                                     batch_first=True, norm_first=self.norm_first)
            state = {"self_attn.in_proj_weight": torch.cat([self.self_attn.q_proj.weight, self.self_attn.k_proj.weight,
                                                            self.self_attn.v_proj.weight]),
                     "self_attn.in_proj_bias": torch.cat([self.self_attn.q_proj.bias, self.self_attn.k_proj.bias,
                                                          self.self_attn.v_proj.bias]),
                     "self_attn.out_proj.weight": self.self_attn.out_proj.weight,
                     "self_attn.out_proj.bias": self.self_attn.out_proj.bias,
                     **{k: v for k, v in self.state_dict().items() if k.startswith("norm")},
                     **{k[3:]: v for k, v in self.state_dict().items() if k.startswith("ff.")}}
            torch_layer.load_state_dict(state)
            return torch_layer(x, src_mask=None if mask is None else ~mask)

    with pytest.raises(CheckFailed, match="built-in Transformer layers"):
        nb05.check("EncoderLayer", EncoderLayer)


def _one_group(call):
    """A layer norm by a group, instance or batch norm: [.., D] as one group of D (or D along the batch axis)."""
    def norm(x, weight, bias, eps):
        D = x.shape[-1]
        if call == "batch":  # the rows become the channels: each normalized over its D values
            rows = x.reshape(-1, D).T
            return F.batch_norm(rows, None, None, training=True, eps=eps).T.reshape(x.shape) * weight + bias
        flat = x.reshape(-1, 1, D)
        done = F.group_norm(flat, 1, eps=eps) if call == "group" else F.instance_norm(flat, eps=eps)
        return done.reshape(x.shape) * weight + bias
    return norm


NORMS = {"nn.LayerNorm": None, "F.layer_norm": lambda x, w, b, e: F.layer_norm(x, (x.shape[-1],), w, b, e),
         "torch.layer_norm": lambda x, w, b, e: torch.layer_norm(x, (x.shape[-1],), w, b, e),
         # a red team's: full points, unflagged, under every sandbox
         "torch.native_layer_norm": lambda x, w, b, e: torch.native_layer_norm(x, [x.shape[-1]], w, b, e)[0],
         "F.group_norm": _one_group("group"), "F.instance_norm": _one_group("instance"),
         "F.batch_norm": _one_group("batch"),
         "F.rms_norm": lambda x, w, b, e: F.rms_norm(x - x.mean(-1, keepdim=True), (x.shape[-1],), w, e) + b}
KERNEL_NORMS = {  # the kernel by name: seen in PyTorch's dispatcher
    "torch.ops.aten.native_layer_norm": lambda x, w, b, e: torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, e)[0],
    "torch.ops.aten.native_group_norm": lambda x, w, b, e: torch.ops.aten.native_group_norm(
        x.reshape(-1, 1, x.shape[-1]), None, None, x.numel() // x.shape[-1], 1, x.shape[-1], 1, e)[0].reshape(x.shape)
    * w + b}


@pytest.mark.parametrize("how", [*NORMS, *KERNEL_NORMS])
def test_pytorch_normalizations_are_not_accepted(how):
    class LayerNorm(LayerNormAlt):
        """Our parameters, one of PyTorch's normalizations doing the work."""

        def forward(self, x):
            if how == "nn.LayerNorm":
                torch_norm = nn.LayerNorm(x.shape[-1], eps=self.eps)
                torch_norm.load_state_dict(self.state_dict())
                return torch_norm(x)
            return {**NORMS, **KERNEL_NORMS}[how](x, self.weight, self.bias, self.eps)

    named = how if how in NORMS else "nn.LayerNorm"  # a kernel's reason is that of the first entry it belongs to
    with torch.no_grad():  # it does compute a layer norm: refused, not failed
        ours = LayerNorm(6)
        x = torch.randn(3, 4, 6)
        torch.testing.assert_close(ours(x), F.layer_norm(x, (6,), ours.weight, ours.bias, ours.eps), atol=1e-4, rtol=1e-4)
    with pytest.raises(CheckFailed, match=f"built-in normalizations \\({re.escape(named)}\\)"):
        nb05.check("LayerNorm", LayerNorm)


@pytest.mark.parametrize("name", ["the unbiased variance", "eps added outside the square root",
                                  "normalized over the batch axis", "the learned weight and bias are never applied"])
def test_layer_norm_mistakes_named_in_feedback(name):
    """The four slips the issue names are each caught by the forward cases and by the gradient cases."""
    code = next(m.code for m in nb05.LN_MISTAKES if m.name.startswith(name))
    wrong = core.Mistake(name, "", code).build("LayerNorm")
    for exercise in ("LayerNorm", "LayerNorm_gradients"):
        with pytest.raises(CheckFailed, match="known mistake: " + name):
            nb05.check(exercise, wrong)


def test_calling_the_reference_is_not_accepted():
    def causal_mask(size):
        return ref.causal_mask(size)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb05.check("causal_mask", causal_mask)

    class DecoderLayer(ref.DecoderLayer):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb05.check("DecoderLayer", DecoderLayer)


def test_stub_is_reported_as_not_attempted():
    class EncoderLayer(nn.Module):
        def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
            super().__init__()
            raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb05.check("EncoderLayer", EncoderLayer)


def test_wrong_attribute_names_are_reported():
    class FeedForward(FeedForwardAlt):
        def __init__(self, d_model, d_ff, dropout=0.0):
            super().__init__(d_model, d_ff, dropout)
            self.fc1, self.fc2 = self.linear1, self.linear2
            del self.linear1, self.linear2

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    with pytest.raises(CheckFailed, match="missing: linear1.bias, linear1.weight"):
        nb05.check("FeedForward", FeedForward)


def test_a_layer_norm_with_gamma_and_beta_is_told_the_names_in_every_case():
    """The lecture writes the scale and shift as gamma and beta; nn.LayerNorm (and this notebook) calls them
    weight and bias. The first case (a fresh layer) used to fail with "no attribute 'weight'"."""
    class LayerNorm(nn.Module):
        def __init__(self, d_model, eps=1e-5):
            super().__init__()
            self.eps, self.gamma, self.beta = eps, nn.Parameter(torch.ones(d_model)), nn.Parameter(torch.zeros(d_model))

        def forward(self, x):
            mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta

    for graded in ("LayerNorm", "LayerNorm_gradients"):
        with pytest.raises(CheckFailed, match="missing: bias, weight; unexpected: beta, gamma") as failed:
            nb05.check(graded, LayerNorm)
        assert "no attribute" not in str(failed.value)


# --------------------------------------------------------------------------- the API notebook 06 builds on
def test_layer_api_and_agreement_with_pytorch():
    init = inspect.signature(ref.EncoderLayer.__init__)
    assert list(init.parameters) == ["self", "d_model", "num_heads", "d_ff", "dropout", "norm_first"]
    assert list(inspect.signature(ref.DecoderLayer.__init__).parameters) == list(init.parameters)
    assert list(inspect.signature(ref.EncoderLayer.forward).parameters) == ["self", "x", "mask"]
    assert list(inspect.signature(ref.DecoderLayer.forward).parameters) == ["self", "x", "memory", "tgt_mask", "memory_mask"]
    torch.manual_seed(0)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    src_keep = torch.ones(2, 7, dtype=torch.bool)
    src_keep[1, 5:] = False
    tgt = ref.causal_mask(5)
    for norm_first in (False, True):
        ours = ref.EncoderLayer(16, 4, 32, norm_first=norm_first).eval()
        theirs = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        ours.load_state_dict(ref.state_dict_from_torch(theirs))
        torch.testing.assert_close(ours(memory, ref.padding_mask(src_keep.long(), 0)),
                                   theirs(memory, src_key_padding_mask=~src_keep), atol=1e-5, rtol=1e-4)
        ours = ref.DecoderLayer(16, 4, 32, norm_first=norm_first).eval()
        theirs = nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        ours.load_state_dict(ref.state_dict_from_torch(theirs))
        out = ours(x, memory, tgt_mask=tgt, memory_mask=src_keep[:, None, None, :])
        torch.testing.assert_close(out, theirs(x, memory, tgt_mask=~tgt, memory_key_padding_mask=~src_keep),
                                   atol=1e-5, rtol=1e-4)
        assert ours.self_attn_weights.shape == (2, 4, 5, 5) and ours.cross_attn_weights.shape == (2, 4, 5, 7)
        assert (ours.cross_attn_weights[1, ..., 5:] == 0).all()


def test_masked_softmax_reproduces_the_lecture():
    w = ref.masked_softmax(torch.tensor(nb05.LECTURE_SCORES), ref.causal_mask(4))
    torch.testing.assert_close(w[1, :2], torch.tensor([0.3775, 0.6225]), atol=1e-4, rtol=0)
    assert not torch.isnan(ref.masked_softmax(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool))).any()


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb05.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


ENCODER_CELLS = {"test_EncoderLayer", "test_EncoderLayer_norm_first", "test_EncoderLayer_padding"}
DECODER_CELLS = {"test_DecoderLayer", "test_DecoderLayer_norm_first", "test_DecoderLayer_causal",
                 "test_DecoderLayer_padding", "test_DecoderLayer_weights"}
LAYER_NORM_CELLS = {"test_LayerNorm", "test_LayerNorm_gradients"}
ALL_CELLS = {"test_causal_mask", "test_masked_softmax", "test_masked_softmax_fully_masked", "test_padding_mask",
             "test_FeedForward"} | LAYER_NORM_CELLS | ENCODER_CELLS | DECODER_CELLS
OFF_BY_ONE = "off-by-one diagonal: strictly below the diagonal (a token may not attend to itself)"
KEEPS_FUTURE = "a mask that keeps the future (the upper triangle)"
PADS_TRUE = "padding mask True on the pads (nn's key_padding_mask convention)"
NO_RESIDUAL = "missing residual connection around self-attention"
MEMORY_QUERY = "cross-attention fed the memory as query (and the decoder's states as keys and values)"
NO_CAUSAL = "a decoder without the causal mask (tgt_mask not given to self-attention)"
EPS_OUTSIDE = "eps added outside the square root: (x - mean) / (std + eps)"
UNBIASED = "the unbiased variance (dividing by D - 1, as x.var() and x.std() do by default)"


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == 29, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Six exercises wrong at once (the test cells build their masks themselves, so a wrong mask
    function costs only its own cell; FeedForward stays right, since both layers are built on it;
    the layers use nn.LayerNorm, so a wrong LayerNorm costs only its own cells)."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "causal_mask": _code("causal_mask", OFF_BY_ONE),
        "masked_softmax": _code("masked_softmax", "fully masked rows give NaN (softmax of a row of -inf)"),
        "padding_mask": _code("padding_mask", PADS_TRUE),
        "LayerNorm": _code("LayerNorm", EPS_OUTSIDE),
        "EncoderLayer": _code("EncoderLayer", NO_RESIDUAL),
        "DecoderLayer": _code("DecoderLayer", MEMORY_QUERY),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == ({"test_causal_mask", "test_masked_softmax_fully_masked", "test_padding_mask",
                                     "test_EncoderLayer", "test_EncoderLayer_norm_first"} | LAYER_NORM_CELLS
                                    | DECODER_CELLS)
    assert result.score == 6  # masked_softmax 3 + FeedForward 2 + encoder padding invariance 1
    by_cell = {c.grade_id: c.message for c in result.cells}
    assert OFF_BY_ONE in by_cell["test_causal_mask"]
    assert "fully masked rows give NaN" in by_cell["test_masked_softmax_fully_masked"]
    assert PADS_TRUE in by_cell["test_padding_mask"]
    assert all(EPS_OUTSIDE in by_cell[cell] for cell in LAYER_NORM_CELLS)
    assert NO_RESIDUAL in by_cell["test_EncoderLayer"]
    assert all(MEMORY_QUERY in by_cell[cell] for cell in DECODER_CELLS)


NO_RESIDUAL_DROPOUT = "no dropout on the sublayers' outputs (before each residual add)"


def _answer(nb, grade_id: str) -> str:
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


@pytest.mark.slow
def test_nbgrader_layers_without_dropout_on_the_sublayers_outputs_lose_their_points(course):
    """Dropout only inside attention and the feed-forward (none on each sublayer's output before its residual
    add) took 29 of 29: every case ran in evaluation mode. Graded for real, with the course's own layers edited."""
    solved = solved_notebook(course, ASSIGNMENT)
    without = {cell: re.sub(r"self\.dropout\d\(", "(", _answer(solved, cell)) for cell in ("EncoderLayer", "DecoderLayer")}
    assert all("dropout1" not in code.split("def forward")[1] for code in without.values())
    result = autograde(course, ASSIGNMENT, inject(solved, without))
    failed = failed_cells(result)
    assert failed == {"test_EncoderLayer", "test_EncoderLayer_norm_first", "test_DecoderLayer",
                      "test_DecoderLayer_norm_first"}, failed
    by_cell = {c.grade_id: c.message for c in result.cells}
    assert all(NO_RESIDUAL_DROPOUT in by_cell[cell] for cell in failed), by_cell


@pytest.mark.slow
def test_nbgrader_future_leaks(course):
    """The two ways to let the decoder see the future — a mask keeping the upper triangle, and a
    decoder layer that drops tgt_mask — plus three more slips on other exercises."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "causal_mask": _code("causal_mask", KEEPS_FUTURE),
        "masked_softmax": _code("masked_softmax", "mask applied after the softmax (masked weights zeroed, the rest not renormalized)"),
        "padding_mask": _code("padding_mask", "shape [B, T]: the head and query axes are missing"),
        "LayerNorm": _code("LayerNorm", UNBIASED),
        "EncoderLayer": _code("EncoderLayer", "the self-attention mask is ignored"),
        "DecoderLayer": _code("DecoderLayer", NO_CAUSAL),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == ALL_CELLS - {"test_FeedForward", "test_DecoderLayer_padding"}
    assert result.score == 3  # FeedForward 2 + decoder padding invariance 1
    by_cell = {c.grade_id: c.message for c in result.cells}
    assert KEEPS_FUTURE in by_cell["test_causal_mask"]
    assert "mask applied after the softmax" in by_cell["test_masked_softmax"]
    assert "the self-attention mask is ignored" in by_cell["test_EncoderLayer_padding"]
    assert NO_CAUSAL in by_cell["test_DecoderLayer_causal"]
    assert UNBIASED in by_cell["test_LayerNorm"]
