"""Notebook 02 checks: the reference passes, other correct implementations pass, every catalogued
mistake fails (and is named), the built-in and the reference are refused, and real nbgrader
takes points off wrong implementations in the right cells."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import attention as ref
from autograder.checks import core, nb02
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    failure_messages,
    fresh_copy,
    inject,
    solved_notebook,
)

ASSIGNMENT = "02_queries_keys_values"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb02)


@pytest.mark.parametrize("exercise", nb02.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb02, mistake, graded)


# --------------------------------------------------------------------------- other correct answers pass
def sdpa_einsum(q, k, v, mask=None):
    """Scale q first, einsum, a large negative fill and a multiplicative mask."""
    scores = torch.einsum("...qd,...kd->...qk", q / math.sqrt(q.size(-1)), k)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), -1e9)
    weights = scores.softmax(dim=-1)
    if mask is not None:
        weights = weights * mask
    return torch.einsum("...qk,...kd->...qd", weights, v), weights


def sdpa_where_nan_to_num(q, k, v, mask=None):
    """torch.where with -inf, then NaN -> 0, computed in float64 and cast back."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.mT) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype))
    weights = torch.nan_to_num(torch.softmax(scores, -1), nan=0.0)
    return (weights @ v).float(), weights.float()


class SelfAttentionAlt(nn.Module):
    def __init__(self, d_model, d_k, d_v=None, bias=True):
        super().__init__()
        self.v_proj = nn.Linear(d_model, d_v or d_k, bias=bias)    # created in another order
        self.k_proj = nn.Linear(d_model, d_k, bias=bias)
        self.q_proj = nn.Linear(d_model, d_k, bias=bias)

    def forward(self, x, mask=None):
        return sdpa_einsum(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)


class AdditiveAttentionAlt(nn.Module):
    """Another correct additive attention: einsum for v, a large negative fill and a multiplicative mask,
    the projections created in another order, the keys expanded instead of broadcast."""

    def __init__(self, query_dim, key_dim, attn_dim):
        super().__init__()
        self.score = nn.Linear(attn_dim, 1, bias=False)
        self.k_proj = nn.Linear(key_dim, attn_dim, bias=False)
        self.q_proj = nn.Linear(query_dim, attn_dim, bias=False)

    def forward(self, query, key, value=None, mask=None):
        if value is None:
            value = key
        B, T_q, T_k = query.shape[0], query.shape[1], key.shape[1]
        q = self.q_proj(query)[:, :, None, :].expand(B, T_q, T_k, -1)
        k = self.k_proj(key)[:, None, :, :].expand(B, T_q, T_k, -1)
        scores = torch.einsum("bqka,a->bqk", torch.tanh(q + k), self.score.weight[0])
        if mask is not None:
            scores = scores.masked_fill(mask.logical_not(), -1e9)
        weights = scores.softmax(dim=-1)
        if mask is not None:
            weights = weights * mask
        return torch.bmm(weights, value), weights


def test_other_correct_additive_attention_passes():
    for exercise in (e for e in nb02.EXERCISES if e.graded == "AdditiveAttention"):
        check_exercise(exercise, AdditiveAttentionAlt)


@pytest.mark.parametrize("impl", [sdpa_einsum, sdpa_where_nan_to_num], ids=lambda f: f.__name__)
def test_other_correct_attention_passes(impl):
    for exercise in (e for e in nb02.EXERCISES if e.graded == "scaled_dot_product_attention"):
        check_exercise(exercise, impl)


class SelfAttentionWithABuffer(SelfAttentionAlt):
    """A constant kept with register_buffer (as a cached mask or scale would be): not in the specification,
    no mistake, and it must keep its value when the test copies the weights in."""

    def __init__(self, d_model, d_k, d_v=None, bias=True):
        super().__init__(d_model, d_k, d_v, bias)
        self.register_buffer("unit", torch.ones(1))

    def forward(self, x, mask=None):
        out, weights = super().forward(x, mask)
        return out * self.unit, weights


@pytest.mark.parametrize("impl", [SelfAttentionAlt, SelfAttentionWithABuffer], ids=lambda c: c.__name__)
def test_other_correct_self_attention_passes(impl):
    for exercise in (e for e in nb02.EXERCISES if e.graded == "SelfAttention"):
        check_exercise(exercise, impl)


# --------------------------------------------------------------------------- the simulated class's wrong answer
class SelfAttentionXAsValues(SelfAttentionAlt):
    """The class's answer: the values are x itself whenever x already has the values' width. It passed,
    because every case had d_v != d_model."""

    def forward(self, x, mask=None):
        v = x if x.shape[-1] == self.v_proj.out_features else self.v_proj(x)
        return sdpa_einsum(self.q_proj(x), self.k_proj(x), v, mask)


def test_x_as_the_values_when_the_widths_allow_fails_and_is_named():
    with pytest.raises(CheckFailed, match="d_v = d_model") as err:
        nb02.check("SelfAttention", SelfAttentionXAsValues)
    assert "known mistake: the values are the input x whenever it is d_v wide" in str(err.value), str(err.value)
    widths = [c.description for c in core.cases_of(nb02.check.exercises["SelfAttention"])]
    assert any("d_v=8" in d and "d_model=8" in d for d in widths), widths


# --------------------------------------------------------------------------- honesty and stubs
def test_calling_the_builtin_is_not_accepted():
    def scaled_dot_product_attention(q, k, v, mask=None):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        _, weights = sdpa_einsum(q, k, v, mask)
        return out, weights

    with pytest.raises(CheckFailed, match="scaled_dot_product_attention, the built-in"):
        nb02.check("scaled_dot_product_attention", scaled_dot_product_attention)


def test_calling_the_reference_is_not_accepted():
    def scaled_dot_product_attention(q, k, v, mask=None):
        return ref.scaled_dot_product_attention(q, k, v, mask)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb02.check("scaled_dot_product_attention", scaled_dot_product_attention)

    class SelfAttention(ref.SelfAttention):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb02.check("SelfAttention", SelfAttention)


def test_stub_is_reported_as_not_attempted():
    class SelfAttention(nn.Module):
        def __init__(self, d_model, d_k, d_v=None, bias=True):
            super().__init__()
            raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb02.check("SelfAttention", SelfAttention)


def test_additive_stub_is_reported_as_not_attempted():
    class AdditiveAttention(nn.Module):
        def __init__(self, query_dim, key_dim, attn_dim):
            super().__init__()
            raise NotImplementedError()

    for name in ("AdditiveAttention", "AdditiveAttention_mask"):
        with pytest.raises(CheckFailed, match="not attempted"):
            nb02.check(name, AdditiveAttention)


def test_calling_the_reference_additive_attention_is_not_accepted():
    class AdditiveAttention(ref.AdditiveAttention):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb02.check("AdditiveAttention", AdditiveAttention)


def test_tanh_forgotten_is_caught_by_the_weights_not_depending_on_the_query():
    """Without tanh, v^T W_q s is the same for every key: the weights ignore the query. The check's
    message names it, and the reference's weights really do change with the query."""
    layer = ref.AdditiveAttention(3, 4, 5)
    key = torch.randn(1, 6, 4)
    _, w1 = layer(torch.randn(1, 1, 3), key)
    _, w2 = layer(torch.randn(1, 1, 3), key)
    assert not torch.allclose(w1, w2)
    no_tanh = next(m for m in nb02.ADDITIVE_MISTAKES if m.name.startswith("tanh forgotten")).build("AdditiveAttention")
    wrong = no_tanh(3, 4, 5)
    _, w1 = wrong(torch.randn(1, 1, 3), key)
    _, w2 = wrong(torch.randn(1, 1, 3), key)
    torch.testing.assert_close(w1, w2)


# --------------------------------------------------------------------------- the reference itself
def test_reference_fully_masked_row_is_zero_with_finite_gradients():
    q, k, v = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    mask[2] = False
    out, w = ref.scaled_dot_product_attention(q, k, v, mask)
    assert (w[:, 2] == 0).all() and (out[:, 2] == 0).all()
    (out.sum() + w.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_reference_matches_torch_builtin():
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 4)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    for m in (None, mask):
        torch.testing.assert_close(ref.scaled_dot_product_attention(q, k, v, m)[0],
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=m), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- softmax by hand, inverted masks
def sdpa_no_max(q, k, v, mask=None):
    """A softmax by hand without the max subtracted (an audit's 14 / 14): NaN once a score passes about 88."""
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    if mask is not None:
        e = e * mask
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return weights @ v, weights


def sdpa_max_over_masked(q, k, v, mask=None):
    """Stable, but the max is taken over the masked keys too and the mask multiplied in after exp() (14 / 14)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    if mask is not None:
        e = e * mask
    total = e.sum(dim=-1, keepdim=True)
    weights = e / torch.where(total > 0, total, torch.ones_like(total))
    return weights @ v, weights


def sdpa_inverted_unguarded(q, k, v, mask=None):
    """PyTorch's convention (True = blocked) and no NaN guard: the inverted causal mask's last row is all -inf."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


class AdditiveMaxOverMasked(nn.Module):
    """The reference's projections, then a softmax by hand whose max runs over the padded keys too (14 / 14)."""

    def __init__(self, query_dim, key_dim, attn_dim):
        super().__init__()
        self.q_proj = nn.Linear(query_dim, attn_dim, bias=False)
        self.k_proj = nn.Linear(key_dim, attn_dim, bias=False)
        self.score = nn.Linear(attn_dim, 1, bias=False)

    def forward(self, query, key, value=None, mask=None):
        value = key if value is None else value
        scores = self.score(torch.tanh(self.q_proj(query).unsqueeze(-2) + self.k_proj(key).unsqueeze(-3))).squeeze(-1)
        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
        if mask is not None:
            e = e * mask
        total = e.sum(dim=-1, keepdim=True)
        weights = e / torch.where(total > 0, total, torch.ones_like(total))
        return weights @ value, weights


def _named(graded, impl, name):
    """`impl` fails a check of `graded`, and a message names the mistake `name` (with its hint)."""
    messages = failure_messages(nb02, graded, impl)
    assert messages, f"{impl.__name__} passed every check of {graded}"
    assert any(f"{core.KNOWN_MISTAKE}{name}." in m for m in messages), messages


@pytest.mark.parametrize("impl,name", [(sdpa_no_max, nb02.UNSTABLE), (sdpa_max_over_masked, nb02.MAX_OVER_MASKED)],
                         ids=["no max", "max over masked keys"])
def test_a_softmax_by_hand_that_loses_rows_fails_and_is_named(impl, name):
    _named("scaled_dot_product_attention", impl, name)


def test_additive_attention_with_the_max_over_padded_keys_fails_and_is_named():
    _named("AdditiveAttention", AdditiveMaxOverMasked, nb02.MAX_OVER_MASKED)


def test_the_inverted_mask_without_the_nan_guard_is_named():
    """The output is NaN where the inverted causal mask hides every key: the check names the inversion (the
    reader's 3 / 6 said only 'contains NaN where the expected values are finite')."""
    _named("scaled_dot_product_attention", sdpa_inverted_unguarded, "inverted mask (True treated as 'blocked', "
           "PyTorch's nn convention): the row that may see every key becomes fully masked and gives NaN")


class AdditiveInvertedUnguarded(AdditiveMaxOverMasked):
    """masked_fill(mask, -inf) (PyTorch's convention) and no zeroing after the softmax: NaN for a sentence without
    padding, whose inverted mask hides every key."""

    def forward(self, query, key, value=None, mask=None):
        value = key if value is None else value
        scores = self.score(torch.tanh(self.q_proj(query).unsqueeze(-2) + self.k_proj(key).unsqueeze(-3))).squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return weights @ value, weights


def test_additive_attention_with_the_inverted_mask_without_the_nan_guard_is_named():
    _named("AdditiveAttention", AdditiveInvertedUnguarded, "inverted mask (True treated as 'blocked', PyTorch's nn "
           "convention): a row that may see every key becomes fully masked and gives NaN")


def test_the_large_score_cases_are_finite_and_far_from_each_mistake():
    """The reference's output on the new cases is finite; the unstable softmax gives NaN there, the max over masked
    keys gives rows of zeros."""
    exercise = next(e for e in nb02.EXERCISES if e.name == "scaled_dot_product_attention_mask")
    large, dominant = core.cases_of(exercise)[-2:]
    for case in (large, dominant):
        out, weights = case.run(ref.scaled_dot_product_attention)
        assert torch.isfinite(out).all() and torch.allclose(weights.sum(-1), torch.ones(()))
    assert torch.isnan(large.run(sdpa_no_max)[0]).any()
    assert (dominant.run(sdpa_max_over_masked)[1][:, :2].sum(-1) == 0).all()


def test_a_float64_answer_passes_the_large_score_cases_under_every_salt():
    """Scores of a few hundred are rounded by about 3e-5 in the float32 reference: a float64 answer (and one that
    scales q first) is that far from it, inside the cases' wider atol whatever the salt draws."""
    from autograder.checks.core import THREAD_SALT

    exercise = next(e for e in nb02.EXERCISES if e.name == "scaled_dot_product_attention_mask")
    failed = []
    for n in range(40):
        token = THREAD_SALT.set(f"salt-{n}")
        try:
            for impl in (sdpa_where_nan_to_num, sdpa_einsum):
                try:
                    check_exercise(exercise, impl)
                except CheckFailed as failure:
                    failed.append((n, impl.__name__, str(failure).splitlines()[0]))
        finally:
            THREAD_SALT.reset(token)
    assert failed == [], failed


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb02.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


ALL_CELLS = {"test_AdditiveAttention", "test_AdditiveAttention_mask", "test_scaled_dot_product_attention", "test_scaled_dot_product_attention_mask",
             "test_scaled_dot_product_attention_matches_torch", "test_SelfAttention",
             "test_SelfAttention_mask", "test_SelfAttention_gradients"}


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == 14, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """A mask applied after the softmax, and a SelfAttention without the scale (written without
    the student's attention function, so the two don't feed each other)."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "scaled_dot_product_attention": _code("scaled_dot_product_attention",
                                              "mask applied after the softmax (the allowed weights no longer sum to 1)"),
        "SelfAttention": _code("SelfAttention", "no 1/sqrt(d_k) scaling"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {
        "test_scaled_dot_product_attention_mask", "test_scaled_dot_product_attention_matches_torch",
        "test_SelfAttention", "test_SelfAttention_mask", "test_SelfAttention_gradients",
    }
    assert result.score == 6  # the unmasked attention (3) and AdditiveAttention (2 + 1) are still right
    messages = " ".join(c.message for c in result.cells)
    assert "no 1/sqrt(d_k) scaling" in messages


ADDITIVE_WRONG = {  # a mistake -> the test cells it must fail (a mask mistake passes the unmasked cases)
    "tanh applied after the sum with v (tanh(v^T (W_q s + W_k h)))": {"test_AdditiveAttention",
                                                                       "test_AdditiveAttention_mask"},
    "mask applied after the softmax (the allowed weights no longer sum to 1)": {"test_AdditiveAttention_mask"},
}


@pytest.mark.slow
@pytest.mark.parametrize("mistake", list(ADDITIVE_WRONG))
def test_nbgrader_takes_points_for_wrong_additive_attention(course, mistake):
    """Graded for real: a wrong AdditiveAttention loses exactly its own cells' points, with the mistake
    named, and costs no other exercise anything."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {"AdditiveAttention": _code("AdditiveAttention", mistake)})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == ADDITIVE_WRONG[mistake], [(c.grade_id, c.message[:300]) for c in result.cells]
    points = {"test_AdditiveAttention": 2, "test_AdditiveAttention_mask": 1}
    assert result.score == 14 - sum(points[c] for c in ADDITIVE_WRONG[mistake])
    messages = " ".join(c.message for c in result.cells)
    assert f"This matches a known mistake: {mistake}." in messages, messages


ATTENTION_OF_THE_QUANTIZATION_TOOLS = '''def scaled_dot_product_attention(q, k, v, mask=None):
    import torch.ao.quantization as tq
    layer = list(tq.get_default_custom_config_dict()["float_to_observed_custom_module_class"].values())[1]
    d = q.shape[-1]
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Tq, Tk = q.shape[-2], k.shape[-2]
    qq, kk = q.expand(*lead, Tq, d).reshape(-1, Tq, d), k.expand(*lead, Tk, d).reshape(-1, Tk, d)
    m = layer(d, 1, bias=False, batch_first=True)
    with torch.no_grad():
        for lin in (m.linear_Q, m.linear_K, m.linear_V):
            lin.weight.copy_(torch.eye(d))
    blocked = None if mask is None else ~mask.expand(*lead, Tq, Tk).reshape(-1, Tq, Tk)
    _, w = m(qq, kk, kk, attn_mask=blocked, need_weights=True)
    w = w.reshape(*lead, Tq, Tk)
    if mask is not None:
        w = w.masked_fill(~mask, 0.0)
    return w @ v, w
'''


@pytest.mark.slow
def test_the_quantization_tools_attention_reached_without_its_name_gets_no_points(course):
    """torch.ao.nn.quantizable.MultiheadAttention is a whole attention in Python of its own (not
    nn.MultiheadAttention's forward), found through the quantization's default module mapping: it took
    scaled_dot_product_attention's 6 points unflagged. Now the run-time guard knows its code."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"scaled_dot_product_attention": ATTENTION_OF_THE_QUANTIZATION_TOOLS}))
    failed = failed_cells(result)
    assert {"test_scaled_dot_product_attention", "test_scaled_dot_product_attention_mask"} <= failed, failed
    assert "torch.ao.nn.quantizable.MultiheadAttention" in " ".join(c.message for c in result.cells)


THE_BUILTIN_INSIDE = '''def scaled_dot_product_attention(q, k, v, mask=None):
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    w = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
    return out, w
'''


@pytest.mark.slow
def test_a_builtin_inside_a_dependency_costs_its_own_exercise_only(course):
    """An instructor's walkthrough: scaled_dot_product_attention calling the built-in lost its 6 points, and the
    honest SelfAttention built on it (as the notebook asks) lost its 5 too, while a wrong one cost only its own.
    One refusal, one penalty: SelfAttention is checked with the course's function in its place, and passes."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"scaled_dot_product_attention": THE_BUILTIN_INSIDE}))
    failed = failed_cells(result)
    assert {"test_scaled_dot_product_attention", "test_scaled_dot_product_attention_mask"} <= failed, failed
    assert not {c for c in failed if c.startswith("test_SelfAttention")}, failed
    refused = next(c.message for c in result.cells if c.grade_id == "test_scaled_dot_product_attention")
    assert "not accepted" in refused and "scaled_dot_product_attention" in refused, refused
    note = next(c.message for c in result.cells if c.grade_id == "test_SelfAttention")
    assert "course's `scaled_dot_product_attention` instead of yours" in note, note


# --------------------------------------------------------------------------- one layer, many calls
class AdditiveAttentionKeysKept(AdditiveMaxOverMasked):
    """An audit's 3 / 3: "the encoder states do not change: project them once", kept on the module, so every call
    after the first attends over the first call's keys (the reference's projections, as AdditiveMaxOverMasked's)."""

    def forward(self, query, key, value=None, mask=None):
        value = key if value is None else value
        q = self.q_proj(query).unsqueeze(-2)
        if getattr(self, "_keys", None) is None:
            self._keys = self.k_proj(key).unsqueeze(-3)
        scores = self.score(torch.tanh(q + self._keys)).squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return weights @ value, weights


def test_additive_attention_that_keeps_the_first_calls_keys_fails_and_is_named():
    _named("AdditiveAttention", AdditiveAttentionKeysKept,
           "the keys' projection kept from the first call (the second call attends over the first call's keys)")


class AdditiveAttentionKeysHelper(AdditiveAttentionAlt):
    """Correct: the keys projected by a helper of its own on every call, the last weights kept for a heatmap
    (stored, never read back)."""

    def project_keys(self, key):
        self.projected_keys = self.k_proj(key)
        return self.projected_keys

    def forward(self, query, key, value=None, mask=None):
        value = key if value is None else value
        scores = self.score(torch.tanh(self.q_proj(query).unsqueeze(-2) + self.project_keys(key).unsqueeze(-3)))
        scores = scores.squeeze(-1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
        self.last_weights = weights.detach()
        return weights @ value, weights


def test_additive_attention_that_stores_but_recomputes_its_keys_passes():
    for exercise in (e for e in nb02.EXERCISES if e.graded == "AdditiveAttention"):
        check_exercise(exercise, AdditiveAttentionKeysHelper)
