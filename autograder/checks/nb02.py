"""Checks for notebook 02, "Queries, keys and values" (PyTorch).

Cases are pickled by value into the grading sandbox, where neither this module nor the
reference module can be imported: they may use torch, numpy, what is defined here and the kit the
sandbox holds (`.core`, `.tensors`), nothing from attention_course. Every case runs on float32
tensors built from the exercise's own random generator, so the student's code sees exactly the
inputs the reference sees. Modules are compared by loading one random state_dict (the spec's
attribute names) into the student's module: no case depends on how the student's code draws its
initial weights.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from attention_course import attention as ref

from .core import Case, Exercise, Mistake, keeps_inputs, make_checker, reference_guard, variant
from .tensors import (
    RANDOM_COLUMN,
    Builtin,
    as_float32,
    backpropagate,
    calls_of_one_layer,
    causal,
    load_weights,
    random_mask,
    shape_text,
    tensor,
    torch_attention,
    two_outputs,
)

HONESTY = tuple(reference_guard(ref))
NO_BUILTIN = ((F.scaled_dot_product_attention,
               "it calls torch.nn.functional.scaled_dot_product_attention, the built-in this exercise "
               "asks you to write yourself"),)
FORBIDDEN = HONESTY + torch_attention(*NO_BUILTIN)
RTOL, ATOL = 1e-4, 1e-5


TORCH_SDPA = Builtin("torch.nn.functional.scaled_dot_product_attention", ref.__name__)


# --------------------------------------------------------------------------- scaled_dot_product_attention
def _sdpa_case(description, q, k, v, mask=None, grads=False):
    def run(f):
        if f is TORCH_SDPA:
            return F.scaled_dot_product_attention(q.clone(), k.clone(), v.clone(),
                                                  attn_mask=None if mask is None else mask.clone())
        if grads:
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out, w = f(qq, kk, vv, None if mask is None else mask.clone())
            backpropagate(out, w)
            return out, w, qq.grad, kk.grad, vv.grad
        return f(q.clone(), k.clone(), v.clone(), None if mask is None else mask.clone())
    return Case(description, run)


def _output_only(case: Case) -> Case:
    """For the comparison with PyTorch's built-in, which returns no weights."""
    def run(f):
        result = case.run(f)
        return result if f is TORCH_SDPA else (result[0] if isinstance(result, (tuple, list)) else result)
    return Case(case.description, run)


def _sdpa_cases(rng):
    cases = []
    for q_shape, T_k, d_v in [((4, 8), 6, 5), ((2, 5, 4), 5, 4), ((3, 4, 16), 7, 3),
                              ((2, 3, 4, 5), 6, 7), ((2, 2, 3, 6, 32), 5, 8)]:
        *lead, T_q, d_k = q_shape
        q = tensor(rng, *q_shape, scale=1.5)
        k = tensor(rng, *lead, T_k, d_k, scale=1.5)
        v = tensor(rng, *lead, T_k, d_v)
        cases.append(_sdpa_case(f"q {shape_text(q)}, k {shape_text(k)}, v {shape_text(v)} (no mask)", q, k, v))
    return cases


def _sdpa_mask_cases(rng):
    q, k, v = tensor(rng, 2, 5, 8), tensor(rng, 2, 5, 8), tensor(rng, 2, 5, 3)
    cases = [_sdpa_case("a [5, 5] causal mask on q, k [2, 5, 8] (broadcast over the batch)", q, k, v, causal(5))]
    q, k, v = tensor(rng, 3, 4, 6), tensor(rng, 3, 7, 6), tensor(rng, 3, 7, 5)
    pad = torch.ones(3, 1, 7, dtype=torch.bool)
    pad[1, :, 5:] = False
    pad[2, :, 3:] = False
    cases.append(_sdpa_case("a [3, 1, 7] padding mask, 4 queries over 7 keys", q, k, v, pad))
    q, k, v = tensor(rng, 2, 3, 4, 8), tensor(rng, 2, 3, 6, 8), tensor(rng, 2, 3, 6, 4)
    cases.append(_sdpa_case("a random [2, 3, 4, 6] mask (every row keeps a key)", q, k, v,
                            random_mask(rng, 2, 3, 4, 6, keep_column=int(rng.integers(6)))))
    q, k, v = tensor(rng, 2, 4, 8), tensor(rng, 2, 5, 8), tensor(rng, 2, 5, 3)
    full = random_mask(rng, 2, 4, 5)
    full[0, 2] = False
    full[1, 0] = False
    cases.append(_sdpa_case("a mask with fully masked rows (batch 0 query 2, batch 1 query 0): "
                            "zero weights, zero output, no NaN", q, k, v, full))
    q, k, v = tensor(rng, 2, 4, 8), tensor(rng, 2, 4, 8), tensor(rng, 2, 4, 3)
    empty = causal(4).clone()
    empty[3] = False
    cases.append(_sdpa_case("gradients through a causal mask whose last row is fully masked "
                            "(returns output, weights, q.grad, k.grad, v.grad)", q, k, v, empty, grads=True))
    q, k, v = tensor(rng, 2, 3, 6), tensor(rng, 2, 5, 6), tensor(rng, 2, 5, 4)
    cases.append(_sdpa_case("gradients without a mask (returns output, weights, q.grad, k.grad, v.grad)",
                            q, k, v, grads=True))
    q, k, v = tensor(rng, 2, 4, 6), tensor(rng, 2, 4, 6), tensor(rng, 2, 4, 3)
    cases.append(keeps_inputs("q, k [2, 4, 6], v [2, 4, 3], a [4, 4] causal mask (a mask shared by every layer of a "
                              "model)", lambda f, *given: f(*given), q, k, v, causal(4)))
    return cases + _sdpa_large_score_cases(rng)


# Scores of a few hundred are rounded by about 3e-5 in float32: a correct answer computing in float64 (or scaling q
# before the product) lands that far from the float32 reference; every mistake these cases are for is NaN or 0.
WIDE_ATOL = 1e-4
UNSTABLE = "softmax written by hand without subtracting the row's max (exp overflows past a score of about 88)"
MAX_OVER_MASKED = ("the mask applied after exp(), with the max taken over the masked scores too (a masked key that "
                   "scores far above the allowed ones underflows every allowed weight to 0)")


def _sdpa_large_score_cases(rng):
    """q and k share a direction, so that every score is in the hundreds and they differ by a few units: exp()
    overflows unless the row's max is subtracted. Then keys that the mask forbids score about 200 above the allowed
    ones: a max taken over every key, the mask applied after exp(), underflows each allowed weight to 0."""
    D = 16
    direction = as_float32(np.ones((1, D)))
    q = 3.0 * direction + tensor(rng, 2, 4, D, scale=0.5)
    k = 20.0 * direction + tensor(rng, 2, 6, D, scale=0.5)
    v = tensor(rng, 2, 6, 3)
    prefix = causal(6)[2:]                        # 4 queries at positions 2..5 of 6
    cases = [Case("scores in the hundreds (q . k / sqrt(d_k) about 240, a few units apart: exp() overflows unless the row's max "
                  "is subtracted), q [2, 4, 16], k [2, 6, 16], v [2, 6, 3], a [4, 6] causal mask",
                  _sdpa_case("", q, k, v, prefix).run, atol=WIDE_ATOL, tells=(UNSTABLE,))]
    T = 5
    q = 2.0 * direction + tensor(rng, 2, T, D, scale=0.5)
    k = torch.cat([tensor(rng, 2, 2, D, scale=0.5), 25.0 * direction + tensor(rng, 2, T - 2, D, scale=0.5)], dim=-2)
    v = tensor(rng, 2, T, 4)
    cases.append(Case(f"a [{T}, {T}] causal mask whose future keys score far above the allowed ones (queries 0 and 1 "
                      "see keys scoring about 1, the keys they may not see score about 200), q, k [2, 5, 16], "
                      "v [2, 5, 4]", _sdpa_case("", q, k, v, causal(T)).run, atol=WIDE_ATOL,
                      tells=(MAX_OVER_MASKED, UNSTABLE)))
    return cases


def _sdpa_torch_cases(rng):
    cases = [_output_only(c) for c in _sdpa_cases(rng)[:4]]
    q, k, v = tensor(rng, 2, 3, 5, 8), tensor(rng, 2, 3, 7, 8), tensor(rng, 2, 3, 7, 4)
    cases.append(_output_only(_sdpa_case("a random [2, 1, 5, 7] mask (every row keeps a key)", q, k, v,
                                         random_mask(rng, 2, 1, 5, 7, keep_column=3))))
    q, k, v = tensor(rng, 6, 8), tensor(rng, 6, 8), tensor(rng, 6, 2)
    cases.append(_output_only(_sdpa_case("a [6, 6] causal mask", q, k, v, causal(6))))
    return [Case(f"{c.description}, compared with F.scaled_dot_product_attention", c.run) for c in cases]


def _sdpa(body: str, mask_fill: str = "    scores = scores.masked_fill(~mask, float('-inf'))",
          after: str = "    weights = weights.masked_fill(~mask, 0.0)") -> str:
    """A scaled_dot_product_attention whose pieces can be swapped for a mistake."""
    return (
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        f"{body}\n"
        "    if mask is not None:\n"
        f"    {mask_fill}\n"
        "    weights = torch.softmax(scores, dim=-1)\n"
        "    if mask is not None:\n"
        f"    {after}\n"
        "    return weights @ v, weights\n")


GOOD_SCORES = "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])"

SDPA_MISTAKES = (
    Mistake("the mask inverted in place (mask.logical_not_(), ~= ...): the caller's mask is flipped too",
            "an in-place change of the mask reaches every layer that shares it: make a new one, ~mask or mask == 0",
            _sdpa(GOOD_SCORES, mask_fill="    mask.logical_not_()\n        scores = scores.masked_fill(mask, float('-inf'))",
                  after="    weights = weights.masked_fill(mask, 0.0)")),
    Mistake("no 1/sqrt(d_k) scaling",
            "divide the scores q @ k^T by math.sqrt(d_k), where d_k = q.shape[-1]",
            _sdpa("    scores = q @ k.transpose(-2, -1)")),
    Mistake("scaled by d_k instead of sqrt(d_k)",
            "the scale is 1 / sqrt(d_k): math.sqrt(q.shape[-1]), not q.shape[-1]",
            _sdpa("    scores = q @ k.transpose(-2, -1) / q.shape[-1]")),
    Mistake("scaled by a sequence length instead of d_k",
            "d_k is the width of the queries and keys, q.shape[-1]: not a count of positions such as the number of "
            "keys k.shape[-2], nor a fixed axis such as q.size(1), which is a length once there is a batch axis",
            _sdpa("    scores = q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])")),
    Mistake("softmax over the query axis (columns sum to 1, not rows)",
            "each query's row of weights must sum to 1: softmax over the keys, dim=-1",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            f"{GOOD_SCORES}\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = torch.softmax(scores, dim=-2)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)\n"
            "    return weights @ v, weights\n"),
    Mistake("k.T instead of k.transpose(-2, -1)",
            "for batched tensors k.T reverses *every* axis; swap only the last two: k.transpose(-2, -1)",
            _sdpa("    scores = q @ k.T / math.sqrt(q.shape[-1])")),
    Mistake("returned (weights, output) instead of (output, weights)",
            "return the output first, then the weights",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            f"{GOOD_SCORES}\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)\n"
            "    return weights, weights @ v\n"),
    Mistake("mask applied after the softmax (the allowed weights no longer sum to 1)",
            "mask the *scores* (masked_fill(~mask, -inf)) before softmax, so the allowed weights are renormalized",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            f"{GOOD_SCORES}\n"
            "    weights = torch.softmax(scores, dim=-1)\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)\n"
            "    return weights @ v, weights\n"),
    Mistake("inverted mask (True treated as 'blocked')",
            "True means *may attend*: fill the scores where the mask is False, masked_fill(~mask, -inf)",
            _sdpa(GOOD_SCORES, mask_fill="    scores = scores.masked_fill(mask, float('-inf'))",
                  after="    weights = weights.masked_fill(mask, 0.0)")),
    # the same without the NaN guard: an inverted causal mask leaves the last row fully masked, so the output is NaN
    # there (placed before "a fully masked row gives NaN", which sends the student to the guard, not the inversion)
    Mistake("inverted mask (True treated as 'blocked', PyTorch's nn convention): the row that may see every key "
            "becomes fully masked and gives NaN",
            "True means *may attend*: fill the scores where the mask is False, masked_fill(~mask, -inf), not "
            "masked_fill(mask, -inf); then zero the masked weights after the softmax, weights.masked_fill(~mask, 0.0), "
            "so that a row with no allowed key gives zeros, not NaN",
            _sdpa(GOOD_SCORES, mask_fill="    scores = scores.masked_fill(mask, float('-inf'))", after="    pass")),
    Mistake("the scale applied after the softmax (each row of weights sums to 1/sqrt(d_k), not 1)",
            "divide the *scores* by math.sqrt(d_k) before the softmax: softmax(q @ k^T / sqrt(d_k)); dividing the "
            "weights afterwards only shrinks them",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            "    scores = q @ k.transpose(-2, -1)\n"
            "    if mask is not None:\n"
            "        scores = scores.masked_fill(~mask, float('-inf'))\n"
            "    weights = torch.softmax(scores, dim=-1) / math.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        weights = weights.masked_fill(~mask, 0.0)\n"
            "    return weights @ v, weights\n"),
    Mistake("masked scores set to 0 instead of -inf, then zeroed after the softmax (the allowed weights no longer "
            "sum to 1)",
            "a score of 0 still gets weight exp(0) = 1 in the softmax's sum, so the allowed weights come out too small "
            "even after the masked ones are zeroed: fill forbidden scores with float('-inf')",
            _sdpa(GOOD_SCORES, mask_fill="    scores = scores.masked_fill(~mask, 0.0)")),
    Mistake("masked scores set to 0 instead of -inf",
            "a score of 0 still gets weight exp(0) = 1: fill forbidden scores with float('-inf')",
            _sdpa(GOOD_SCORES, mask_fill="    scores = scores.masked_fill(~mask, 0.0)", after="    pass")),
    Mistake("mask ignored",
            "use the mask: scores.masked_fill(~mask, float('-inf')) before the softmax",
            _sdpa(GOOD_SCORES, mask_fill="    pass", after="    pass")),
    Mistake("a fully masked row gives NaN",
            "softmax of a row that is all -inf is 0/0 = NaN: set the weights of masked positions to 0 "
            "after the softmax (weights.masked_fill(~mask, 0.0))",
            _sdpa(GOOD_SCORES, after="    pass")),
    Mistake("a fully masked row gives uniform weights instead of zeros",
            "filling with a large negative number makes an all-masked row uniform; such a row must get "
            "zero weights: weights.masked_fill(~mask, 0.0) after the softmax",
            _sdpa(GOOD_SCORES, mask_fill="    scores = scores.masked_fill(~mask, -1e9)", after="    pass")),
    Mistake(UNSTABLE,
            "exp() of a score above about 88 is inf in float32, and inf / inf is NaN: subtract each row's max before "
            "exp(), e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) (with the masked scores filled with -inf "
            "first), or use torch.softmax, which does it for you",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            f"{GOOD_SCORES}\n"
            "    e = torch.exp(scores)\n"
            "    if mask is not None:\n"
            "        e = e * mask\n"
            "    total = e.sum(dim=-1, keepdim=True)\n"
            "    weights = e / torch.where(total > 0, total, torch.ones_like(total))\n"
            "    return weights @ v, weights\n"),
    Mistake(MAX_OVER_MASKED,
            "fill the masked scores with -inf *before* taking the max and exp(), scores.masked_fill(~mask, "
            "float('-inf')), then zero the masked weights after; multiplying exp(scores - max) by the mask afterwards "
            "lets a forbidden key set the max",
            "def scaled_dot_product_attention(q, k, v, mask=None):\n"
            f"{GOOD_SCORES}\n"
            "    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
            "    if mask is not None:\n"
            "        e = e * mask\n"
            "    total = e.sum(dim=-1, keepdim=True)\n"
            "    weights = e / torch.where(total > 0, total, torch.ones_like(total))\n"
            "    return weights @ v, weights\n"),
)


# --------------------------------------------------------------------------- AdditiveAttention
def _additive_state(rng, query_dim, key_dim, attn_dim):
    """Hidden weights for q_proj, k_proj and score (no biases: Bahdanau's v^T tanh(W_q s + W_k h)). The
    projections are drawn wide enough that tanh bends (a layer without it, or with it in the wrong
    place, gives other weights), the score vector of size about 1."""
    return {"q_proj.weight": tensor(rng, attn_dim, query_dim, scale=1.2 / np.sqrt(query_dim)),
            "k_proj.weight": tensor(rng, attn_dim, key_dim, scale=1.2 / np.sqrt(key_dim)),
            "score.weight": tensor(rng, 1, attn_dim, scale=1.5 / np.sqrt(attn_dim))}


def _additive_case(rng, description, query_shape, key_shape, attn_dim, value_dim=None, mask=None, grads=False,
                   adjust=None, **extra):
    """AdditiveAttention(query_dim, key_dim, attn_dim) with the hidden weights, on query [B, T_q, query_dim]
    and key [B, T_k, key_dim] (value [B, T_k, value_dim] when given, else the keys are the values). `adjust(state,
    key)` may change the hidden weights and the keys in place before they are used; `extra` goes to the Case."""
    *_, query_dim = query_shape
    *lead, T_k, key_dim = key_shape
    state = _additive_state(rng, query_dim, key_dim, attn_dim)
    query, key = tensor(rng, *query_shape), tensor(rng, *key_shape)
    value = None if value_dim is None else tensor(rng, *lead, T_k, value_dim)
    if adjust is not None:
        adjust(state, key)
    args = dict(query_dim=query_dim, key_dim=key_dim, attn_dim=attn_dim)

    def run(cls):
        layer = _build(cls, args, state)
        extra = {} if mask is None else {"mask": mask.clone()}
        if value is not None:
            extra["value"] = value.clone()
        if not grads:
            with torch.no_grad():
                return layer(query.clone(), key.clone(), **extra)
        q, k = query.clone().requires_grad_(), key.clone().requires_grad_()
        if value is not None:
            extra["value"] = extra["value"].requires_grad_()
        if (pair := two_outputs(result := layer(q, k, **extra))) is None:
            return result
        context, weights = pair
        backpropagate(context, weights)
        params = dict(layer.named_parameters())
        return ((context, weights, q.grad, k.grad, None if value is None else extra["value"].grad)
                + tuple(params[name].grad if name in params else None for name in state))

    inputs = f"query {list(query_shape)}, key {list(key_shape)}" + (
        "" if value is None else f", value {list(value.shape)}")
    return Case(f"AdditiveAttention(query_dim={query_dim}, key_dim={key_dim}, attn_dim={attn_dim}) on "
                f"{inputs}{description}", run, **extra)


def _additive_cases(rng):
    return [
        _additive_case(rng, " (the keys are the values)", (2, 3, 6), (2, 5, 4), attn_dim=8),
        # query_dim == key_dim: W_q applied to the keys runs (and gives other weights) only here
        _additive_case(rng, " (one decoder step; values of their own)", (3, 1, 5), (3, 7, 5), attn_dim=6, value_dim=2),
        _additive_case(rng, " (query_dim = key_dim, the keys are the values)", (2, 4, 8), (2, 6, 8), attn_dim=4),
        _additive_case(rng, " (returns context, weights, query.grad, key.grad, value.grad and the parameters' grads)",
                       (2, 3, 6), (2, 4, 5), attn_dim=7, value_dim=3, grads=True),
        # the keys are the values: the key's gradient comes through both (a detached copy of the key as the
        # value passed every other case)
        _additive_case(rng, " (the keys are the values; returns context, weights, query.grad, key.grad and the "
                       "parameters' grads)", (2, 3, 6), (2, 4, 5), attn_dim=5, grads=True),
        _additive_two_calls(rng),
    ]


KEYS_KEPT = "the keys' projection kept from the first call (the second call attends over the first call's keys)"


def _additive_two_calls(rng, B=2, T_q=3, T_k=5, query_dim=6, key_dim=4, attn_dim=8):
    """ONE layer called on two different sentences: every other case builds a fresh layer and calls it once, so a
    layer that projects the keys on its first call and keeps them ("the encoder states do not change: project them
    once", self._keys) took 3 / 3, and a decoder built on it attends over its first batch's source forever (an
    audit)."""
    state = _additive_state(rng, query_dim, key_dim, attn_dim)
    calls = [(tensor(rng, B, T_q, query_dim), tensor(rng, B, T_k, key_dim)) for _ in range(2)]

    def run(cls):
        return calls_of_one_layer(_build(cls, dict(query_dim=query_dim, key_dim=key_dim, attn_dim=attn_dim), state), calls)

    return Case(f"one AdditiveAttention(query_dim={query_dim}, key_dim={key_dim}, attn_dim={attn_dim}) called twice, "
                f"on two different sentences: query [{B}, {T_q}, {query_dim}] and key [{B}, {T_k}, {key_dim}] (the keys "
                "are the values), then another query and key of the same shapes (returns both calls' (context, "
                "weights): the second call must attend over ITS keys)", run, tells=(KEYS_KEPT,))


def _additive_mask_cases(rng):
    lengths = torch.ones(2, 1, 5, dtype=torch.bool)   # [B, 1, T_k]: source sentences of 5 and 3 tokens
    lengths[1, :, 3:] = False
    full = random_mask(rng, 2, 4, 6)
    full[0, 1] = False
    full[1, 3] = False
    empty = random_mask(rng, 2, 3, 4, keep_column=RANDOM_COLUMN)
    empty[1, 0] = False
    return [
        _additive_case(rng, ", a [2, 1, 5] padding mask (the second source sentence has 3 tokens)",
                       (2, 3, 6), (2, 5, 6), attn_dim=8, mask=lengths),
        _additive_case(rng, ", a random [2, 4, 6] mask (every row keeps a key)", (2, 4, 5), (2, 6, 4), attn_dim=6,
                       value_dim=3, mask=random_mask(rng, 2, 4, 6, keep_column=RANDOM_COLUMN)),
        _additive_case(rng, ", a mask with fully masked rows (batch 0 query 1, batch 1 query 3): zero weights, "
                       "zero context, no NaN", (2, 4, 6), (2, 6, 6), attn_dim=5, mask=full),
        _additive_case(rng, ", gradients through a mask with a fully masked row (returns context, weights and "
                       "every gradient)", (2, 3, 4), (2, 4, 5), attn_dim=6, value_dim=2, mask=empty, grads=True),
        _additive_keeps_inputs(rng, lengths),
        _additive_dominant_pads_case(rng),
    ]


def _additive_dominant_pads_case(rng):
    """Padded keys that score about +100 and real ones about -100: the first key feature says 'pad' (+1) or 'real'
    (-1), k_proj carries it into 4 of the 8 attention features (tanh saturates there at +1 or -1) and the score
    weights those features by 25. The other 4 features give the real keys' scores their differences. A max taken
    over every key, the mask applied after exp(), underflows each real weight to 0; exp(+100) overflows a softmax
    written without the max."""
    keep = torch.ones(2, 1, 6, dtype=torch.bool)
    keep[0, :, 4:] = False
    keep[1, :, 2:] = False

    def adjust(state, key):
        state["k_proj.weight"][:4, 0] = 20.0
        state["k_proj.weight"][4:, 0] = 0.0
        state["score.weight"][0, :4] = 25.0
        state["score.weight"][0, 4:] *= 3.0
        key[..., 0] = torch.where(keep[:, 0, :], -1.0, 1.0)
    return _additive_case(rng, ", a [2, 1, 6] padding mask whose padded keys score far above the real ones (about "
                          "+100 against about -100)", (2, 3, 5), (2, 6, 6), attn_dim=8, value_dim=3, mask=keep,
                          adjust=adjust, tells=(MAX_OVER_MASKED, UNSTABLE))


def _additive_keeps_inputs(rng, mask):
    """query, key and the padding mask after a call: a mask flipped in place (mask.logical_not_(), PyTorch's
    convention) is flipped for the caller, who passes the same mask to the next step (an audit's 3 / 3)."""
    state = _additive_state(rng, 6, 6, 8)

    def call(cls, query, key, mask):
        with torch.no_grad():
            return _build(cls, dict(query_dim=6, key_dim=6, attn_dim=8), state)(query, key, mask=mask)
    return keeps_inputs("AdditiveAttention(6, 6, 8) on query [2, 3, 6], key [2, 5, 6] with a [2, 1, 5] padding mask",
                        call, tensor(rng, 2, 3, 6), tensor(rng, 2, 5, 6), mask.clone())


# Correct additive attention, as source code: the mistakes below are changes to it (core.variant).
ADDITIVE_SOURCE = (
    "class AdditiveAttention(nn.Module):\n"
    "    def __init__(self, query_dim, key_dim, attn_dim):\n"
    "        super().__init__()\n"
    "        self.q_proj = nn.Linear(query_dim, attn_dim, bias=False)\n"
    "        self.k_proj = nn.Linear(key_dim, attn_dim, bias=False)\n"
    "        self.score = nn.Linear(attn_dim, 1, bias=False)\n"
    "\n"
    "    def forward(self, query, key, value=None, mask=None):\n"
    "        value = key if value is None else value\n"
    "        q = self.q_proj(query).unsqueeze(-2)\n"
    "        k = self.k_proj(key).unsqueeze(-3)\n"
    "        scores = self.score(torch.tanh(q + k)).squeeze(-1)\n"
    "        if mask is not None:\n"
    "            scores = scores.masked_fill(~mask, float('-inf'))\n"
    "        weights = torch.softmax(scores, dim=-1)\n"
    "        if mask is not None:\n"
    "            weights = weights.masked_fill(~mask, 0.0)\n"
    "        return weights @ value, weights\n")

_SCORES = "        scores = self.score(torch.tanh(q + k)).squeeze(-1)\n"
_MASK_SCORES = ("        if mask is not None:\n"
                "            scores = scores.masked_fill(~mask, float('-inf'))\n")
_MASK_WEIGHTS = ("        if mask is not None:\n"
                 "            weights = weights.masked_fill(~mask, 0.0)\n")
_SOFTMAX = "        weights = torch.softmax(scores, dim=-1)\n"
_OWN_SOFTMAX = ("        e = {e}\n"                       # a softmax by hand, the mask multiplied in after exp()
                "        if mask is not None:\n"
                "            e = e * mask\n"
                "        total = e.sum(dim=-1, keepdim=True)\n"
                "        weights = e / torch.where(total > 0, total, torch.ones_like(total))\n")

ADDITIVE_MISTAKES = (
    Mistake("softmax over the query axis (columns sum to 1, not rows)",
            "each query's weights over the source positions must sum to 1: softmax over the keys, dim=-1",
            variant(ADDITIVE_SOURCE, ("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"))),
    Mistake("tanh forgotten (v^T (W_q s + W_k h): the query no longer changes the weights)",
            "the score is v^T tanh(W_q s + W_k h): without tanh, v^T W_q s is the same for every key and "
            "cancels in the softmax",
            variant(ADDITIVE_SOURCE, ("self.score(torch.tanh(q + k))", "self.score(q + k)"))),
    Mistake("tanh applied after the sum with v (tanh(v^T (W_q s + W_k h)))",
            "tanh acts on every feature of W_q s + W_k h, before v sums them: self.score(torch.tanh(q + k))",
            variant(ADDITIVE_SOURCE, ("self.score(torch.tanh(q + k)).squeeze(-1)",
                                      "torch.tanh(self.score(q + k)).squeeze(-1)"))),
    Mistake("W_q applied to the keys and W_k to the query (q_proj and k_proj swapped)",
            "q_proj (W_q) maps the query (the decoder state), k_proj (W_k) the keys (the encoder states)",
            variant(ADDITIVE_SOURCE, ("self.q_proj(query)", "self.k_proj(query)"),
                    ("self.k_proj(key)", "self.q_proj(key)"))),
    Mistake("W_q applied to the keys too (k_proj unused)",
            "the keys go through their own map: k = k_proj(key)",
            variant(ADDITIVE_SOURCE, ("self.k_proj(key)", "self.q_proj(key)"))),
    Mistake("scores divided by sqrt(attn_dim), as in scaled dot-product attention",
            "additive scores are v^T tanh(W_q s + W_k h) as they are: no 1/sqrt(d) here",
            variant(ADDITIVE_SOURCE, (_SCORES, _SCORES + "        scores = scores / math.sqrt(q.shape[-1])\n"))),
    Mistake("the keys averaged instead of the values",
            "the weights average the values: weights @ value (value defaults to key only when it is None)",
            variant(ADDITIVE_SOURCE, ("return weights @ value, weights", "return weights @ key, weights"))),
    Mistake("returned (weights, context) instead of (context, weights)",
            "return the context first, then the weights",
            variant(ADDITIVE_SOURCE, ("return weights @ value, weights", "return weights, weights @ value"))),
    Mistake("biases in the projections (nn.Linear's default bias=True)",
            "Bahdanau's score has no biases: nn.Linear(..., bias=False) for q_proj, k_proj and score",
            variant(ADDITIVE_SOURCE, (", bias=False)", ")"))),
    Mistake("mask applied after the softmax (the allowed weights no longer sum to 1)",
            "mask the *scores* (masked_fill(~mask, -inf)) before the softmax, so the allowed weights are renormalized",
            variant(ADDITIVE_SOURCE, (_MASK_SCORES, ""))),
    Mistake("inverted mask (True treated as 'blocked')",
            "True means *may attend*: fill where the mask is False, masked_fill(~mask, ...)",
            variant(ADDITIVE_SOURCE, ("masked_fill(~mask, float('-inf'))", "masked_fill(mask, float('-inf'))"),
                    ("masked_fill(~mask, 0.0)", "masked_fill(mask, 0.0)"))),
    Mistake("inverted mask (True treated as 'blocked', PyTorch's nn convention): a row that may see every key "
            "becomes fully masked and gives NaN",
            "True means *may attend*: fill where the mask is False, masked_fill(~mask, -inf), not masked_fill(mask, "
            "-inf); then zero the masked weights after the softmax, weights.masked_fill(~mask, 0.0), so that a row "
            "with no allowed key gives zeros, not NaN",
            variant(ADDITIVE_SOURCE, ("masked_fill(~mask, float('-inf'))", "masked_fill(mask, float('-inf'))"),
                    (_MASK_WEIGHTS, ""))),
    Mistake("mask ignored",
            "use the mask: scores.masked_fill(~mask, float('-inf')) before the softmax",
            variant(ADDITIVE_SOURCE, (_MASK_SCORES, ""), (_MASK_WEIGHTS, ""))),
    Mistake("a fully masked row gives NaN",
            "softmax of a row that is all -inf is 0/0 = NaN: set the weights of masked positions to 0 after the "
            "softmax (weights.masked_fill(~mask, 0.0))",
            variant(ADDITIVE_SOURCE, (_MASK_WEIGHTS, ""))),
    Mistake("a fully masked row gives uniform weights instead of zeros",
            "filling with a large negative number makes an all-masked row uniform; such a row must get zero "
            "weights: weights.masked_fill(~mask, 0.0) after the softmax",
            variant(ADDITIVE_SOURCE, ("masked_fill(~mask, float('-inf'))", "masked_fill(~mask, -1e9)"),
                    (_MASK_WEIGHTS, ""))),
    Mistake(UNSTABLE,
            "exp() of a score above about 88 is inf in float32, and inf / inf is NaN: subtract each row's max before "
            "exp() (with the masked scores filled with -inf first), or use torch.softmax, which does it for you",
            variant(ADDITIVE_SOURCE, (_MASK_SCORES + _SOFTMAX + _MASK_WEIGHTS, _OWN_SOFTMAX.format(e="torch.exp(scores)")))),
    Mistake(MAX_OVER_MASKED,
            "fill the masked scores with -inf *before* taking the max and exp(), scores.masked_fill(~mask, "
            "float('-inf')), then zero the masked weights after; multiplying exp(scores - max) by the mask afterwards "
            "lets a padded key set the max",
            variant(ADDITIVE_SOURCE, (_MASK_SCORES + _SOFTMAX + _MASK_WEIGHTS,
                                      _OWN_SOFTMAX.format(e="torch.exp(scores - scores.amax(dim=-1, keepdim=True))")))),
    Mistake(KEYS_KEPT,
            "project the keys in every call, k = self.k_proj(key): the layer is called on a new sentence (a new batch "
            "of encoder states) each time, and a module keeps its weights, not its last inputs (no self._keys)",
            variant(ADDITIVE_SOURCE, ("        k = self.k_proj(key).unsqueeze(-3)\n",
                                      "        if getattr(self, '_keys', None) is None:\n"
                                      "            self._keys = self.k_proj(key).unsqueeze(-3)\n"
                                      "        k = self._keys\n"))),
)


# --------------------------------------------------------------------------- SelfAttention
def _self_attention_state(rng, d_model, d_k, d_v, bias):
    sd = {}
    for name, d_out in (("q_proj", d_k), ("k_proj", d_k), ("v_proj", d_v)):
        sd[f"{name}.weight"] = tensor(rng, d_out, d_model, scale=1.0 / np.sqrt(d_model))
        if bias:
            sd[f"{name}.bias"] = tensor(rng, d_out, scale=0.3)
    return sd


def _build(cls, args: dict, state: dict):
    return load_weights(cls(**args), state)


def _self_attention_case(rng, description, args, x_shape, mask=None, grads=False):
    d_v = args.get("d_v") or args["d_k"]
    state = _self_attention_state(rng, args["d_model"], args["d_k"], d_v, args.get("bias", True))
    x = tensor(rng, *x_shape)

    def run(cls):
        layer = _build(cls, args, state)
        m = None if mask is None else mask.clone()
        if not grads:
            with torch.no_grad():
                return layer(x.clone(), mask=m) if m is not None else layer(x.clone())
        xx = x.clone().requires_grad_()
        result = layer(xx, mask=m) if m is not None else layer(xx)
        if (pair := two_outputs(result)) is None:
            return result
        out, w = pair
        backpropagate(out, w)
        params = dict(layer.named_parameters())
        return (out, w, xx.grad) + tuple(params[name].grad if name in params else None for name in state)

    args_text = ", ".join(f"{k}={v}" for k, v in args.items())
    return Case(f"SelfAttention({args_text}) on x {list(x_shape)}{description}", run)


def _self_attention_cases(rng):
    return [
        _self_attention_case(rng, "", dict(d_model=8, d_k=4), (2, 5, 8)),
        _self_attention_case(rng, "", dict(d_model=6, d_k=5, d_v=3), (3, 4, 6)),
        _self_attention_case(rng, " (no batch axis)", dict(d_model=16, d_k=8, d_v=12), (7, 16)),
        _self_attention_case(rng, " (two batch axes)", dict(d_model=8, d_k=6, bias=False), (2, 3, 4, 8)),
        # d_v == d_model: x itself has the values' width, so using it in place of v_proj(x) shows here only
        _self_attention_case(rng, " (d_v = d_model: the values are as wide as x)", dict(d_model=8, d_k=4, d_v=8),
                             (2, 5, 8)),
        _self_attention_case(rng, " (d_k = d_model, so d_v = d_model too)", dict(d_model=6, d_k=6), (3, 4, 6)),
    ]


def _self_attention_mask_cases(rng):
    pad = torch.ones(3, 1, 6, dtype=torch.bool)
    pad[0, :, 4:] = False
    pad[2, :, 1:] = False
    empty = causal(5).clone()
    empty[2] = False
    return [
        _self_attention_case(rng, ", a [5, 5] causal mask", dict(d_model=8, d_k=4), (2, 5, 8), causal(5)),
        _self_attention_case(rng, ", a [3, 1, 6] padding mask", dict(d_model=6, d_k=5, d_v=3), (3, 6, 6), pad),
        _self_attention_case(rng, ", a mask with a fully masked row (query 2)", dict(d_model=8, d_k=4),
                             (2, 5, 8), empty),
    ]


def _self_attention_gradient_cases(rng):
    return [
        _self_attention_case(rng, " (returns output, weights, x.grad and every projection's grads)",
                             dict(d_model=8, d_k=4, d_v=6), (2, 5, 8), grads=True),
        _self_attention_case(rng, ", causal mask (returns output, weights, x.grad and every projection's grads)",
                             dict(d_model=6, d_k=3, bias=False), (3, 4, 6), causal(4), grads=True),
    ]


# Correct attention, as source code: the mistake variants here and in nb03 are built on it.
ATTEND_SOURCE = (
    "def _attend(q, k, v, mask=None, scale=None, dim=-1):\n"
    "    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1] if scale is None else scale)\n"
    "    if mask is not None:\n"
    "        scores = scores.masked_fill(~mask, float('-inf'))\n"
    "    weights = torch.softmax(scores, dim=dim)\n"
    "    if mask is not None:\n"
    "        weights = weights.masked_fill(~mask, 0.0)\n"
    "    return weights @ v, weights\n\n")


def _self_attention(init: str, forward: str) -> str:
    """A SelfAttention with a self-contained attention helper (`_attend`), so it can be dropped
    into a notebook in place of the student's cell."""
    return (ATTEND_SOURCE +
            "class SelfAttention(nn.Module):\n"
            "    def __init__(self, d_model, d_k, d_v=None, bias=True):\n"
            "        super().__init__()\n"
            "        self.d_model = d_model\n"
            f"{init}\n"
            "    def forward(self, x, mask=None):\n"
            f"{forward}\n")


GOOD_INIT = ("        d_v = d_k if d_v is None else d_v\n"
             "        self.q_proj = nn.Linear(d_model, d_k, bias=bias)\n"
             "        self.k_proj = nn.Linear(d_model, d_k, bias=bias)\n"
             "        self.v_proj = nn.Linear(d_model, d_v, bias=bias)\n")

SELF_ATTENTION_MISTAKES = (
    Mistake("scaled by sqrt(d_model) instead of sqrt(d_k)",
            "the scores compare d_k-wide queries and keys: divide by sqrt(d_k), the width after the projection",
            _self_attention(GOOD_INIT, "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask, scale=self.d_model)")),
    Mistake("no 1/sqrt(d_k) scaling",
            "divide the scores by sqrt(d_k) (use your scaled_dot_product_attention)",
            _self_attention(GOOD_INIT, "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask, scale=1)")),
    Mistake("softmax over the query axis (columns sum to 1, not rows)",
            "each query's row of weights must sum to 1: softmax over the keys, dim=-1",
            _self_attention(GOOD_INIT, "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask, dim=-2)")),
    Mistake("queries and keys swapped (k q^T instead of q k^T)",
            "row i of the weights belongs to query i: scores = q @ k^T with q = q_proj(x), k = k_proj(x)",
            _self_attention(GOOD_INIT, "        return _attend(self.k_proj(x), self.q_proj(x), self.v_proj(x), mask)")),
    # before the next one: where d_v == d_model the two give the same output, and this is the one that
    # shows only there
    Mistake("the values are the input x whenever it is d_v wide (v_proj skipped when d_v == d_model)",
            "the values are always the projection v = v_proj(x), even when d_v equals d_model: "
            "v_proj is a learned map, not a resize",
            _self_attention(GOOD_INIT, "        v = x if x.shape[-1] == self.v_proj.out_features else self.v_proj(x)\n"
                                       "        return _attend(self.q_proj(x), self.k_proj(x), v, mask)")),
    Mistake("the values are the input x (v_proj unused)",
            "the weights average the *projected* values: v = v_proj(x)",
            _self_attention(GOOD_INIT, "        return _attend(self.q_proj(x), self.k_proj(x), x, mask)")),
    Mistake("the queries are used as keys (k_proj unused)",
            "keys come from their own projection: k = k_proj(x)",
            _self_attention(GOOD_INIT, "        q = self.q_proj(x)\n        return _attend(q, q, self.v_proj(x), mask)")),
    Mistake("d_v ignored (v_proj maps to d_k)",
            "v_proj is nn.Linear(d_model, d_v), with d_v defaulting to d_k only when it is None",
            _self_attention("        self.q_proj = nn.Linear(d_model, d_k, bias=bias)\n"
                            "        self.k_proj = nn.Linear(d_model, d_k, bias=bias)\n"
                            "        self.v_proj = nn.Linear(d_model, d_k, bias=bias)\n",
                            "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)")),
    Mistake("q_proj and k_proj are one module (self.k_proj = self.q_proj): queries and keys share their weights",
            "queries and keys need weights of their own: build k_proj as its own nn.Linear(d_model, d_k, bias=bias); "
            "two names for one module load a single set of weights",
            _self_attention(GOOD_INIT + "        self.k_proj = self.q_proj\n",
                            "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)")),
    Mistake("bias argument ignored (always bias=True)",
            "pass bias=bias to every nn.Linear",
            _self_attention("        d_v = d_k if d_v is None else d_v\n"
                            "        self.q_proj = nn.Linear(d_model, d_k)\n"
                            "        self.k_proj = nn.Linear(d_model, d_k)\n"
                            "        self.v_proj = nn.Linear(d_model, d_v)\n",
                            "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)")),
    Mistake("mask ignored",
            "pass the mask on to the attention: scaled_dot_product_attention(q, k, v, mask)",
            _self_attention(GOOD_INIT, "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x))")),
    Mistake("inverted mask (True treated as 'blocked')",
            "True means *may attend*: pass the mask as it is",
            _self_attention(GOOD_INIT, "        m = None if mask is None else ~mask\n"
                                       "        return _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), m)")),
    Mistake("the weights computed without gradient (detached)",
            "don't detach or wrap the attention in torch.no_grad(): the projections learn through the weights",
            _self_attention(GOOD_INIT,
                            "        out, w = _attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)\n"
                            "        w = w.detach()\n"
                            "        return w @ self.v_proj(x), w")),
)


EXERCISES = [
    Exercise("AdditiveAttention", ref.AdditiveAttention, _additive_cases,
             mistakes=ADDITIVE_MISTAKES, forbidden=HONESTY, rtol=RTOL, atol=ATOL),
    Exercise("AdditiveAttention_mask", ref.AdditiveAttention, _additive_mask_cases,
             mistakes=ADDITIVE_MISTAKES, forbidden=HONESTY, rtol=RTOL, atol=ATOL, graded="AdditiveAttention"),
    Exercise("scaled_dot_product_attention", ref.scaled_dot_product_attention, _sdpa_cases,
             mistakes=SDPA_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL),
    Exercise("scaled_dot_product_attention_mask", ref.scaled_dot_product_attention, _sdpa_mask_cases,
             mistakes=SDPA_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL,
             graded="scaled_dot_product_attention"),
    Exercise("scaled_dot_product_attention_torch", TORCH_SDPA, _sdpa_torch_cases,
             mistakes=SDPA_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL,
             graded="scaled_dot_product_attention"),
    Exercise("SelfAttention", ref.SelfAttention, _self_attention_cases,
             mistakes=SELF_ATTENTION_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL),
    Exercise("SelfAttention_mask", ref.SelfAttention, _self_attention_mask_cases,
             mistakes=SELF_ATTENTION_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL, graded="SelfAttention"),
    Exercise("SelfAttention_gradients", ref.SelfAttention, _self_attention_gradient_cases,
             mistakes=SELF_ATTENTION_MISTAKES, forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL, graded="SelfAttention"),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"SelfAttention": ("scaled_dot_product_attention",)}
