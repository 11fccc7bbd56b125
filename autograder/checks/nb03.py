"""Checks for notebook 03, "Multi-head attention" (PyTorch).

Modules are compared by loading one random state_dict (the spec's attribute names q_proj,
k_proj, v_proj, out_proj) into the student's module, so no case depends on how the student's
code draws its initial weights; outputs *and* attention weights are compared, and gradient cases
compare the gradient of every projection. The comparison with torch.nn.MultiheadAttention uses
PyTorch's own layer as the reference, with its weights copied in.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import multihead as ref

from .core import Case, Exercise, Mistake, Told, keeps_inputs, make_checker, numbers, raises, reference_guard
from .nb02 import ATTEND_SOURCE, UNSTABLE, WIDE_ATOL
from .tensors import (
    Builtin,
    backpropagate,
    calls_of_one_layer,
    causal,
    load_weights,
    random_mask,
    tensor,
    torch_attention,
    two_outputs,
)

# Cases are pickled by value into the grading sandbox, where neither the other checks modules
# nor this notebook's reference module can be imported: what a case holds comes from this module
# or from the kit the sandbox holds, `.core` and `.tensors` (never from nb02), and no case holds an
# object of attention_course.multihead.
RTOL, ATOL = 1e-4, 1e-5


HONESTY = tuple(reference_guard(ref))
NO_BUILTIN = (
    (nn.MultiheadAttention.forward,
     "it uses torch.nn.MultiheadAttention, the layer this exercise asks you to write yourself"),
    (F.multi_head_attention_forward,
     "it calls torch.nn.functional.multi_head_attention_forward, the built-in this exercise asks you "
     "to write yourself"),
)
TORCH_MHA = Builtin("torch.nn.MultiheadAttention", ref.__name__)


def _changed(before, after) -> bool:
    """Whether `after` differs from `before` (torch.allclose's tolerances; a different shape, a NaN
    or anything that is not an array of numbers counts as a change). Trusted side only."""
    try:
        a = np.asarray(before.detach().cpu().double() if isinstance(before, torch.Tensor) else before, dtype=np.float64)
        b = np.asarray(after.detach().cpu().double() if isinstance(after, torch.Tensor) else after, dtype=np.float64)
    except Exception:  # noqa: BLE001 - garbage is not "unchanged"
        return True
    return a.shape != b.shape or not np.allclose(b, a, rtol=1e-5, atol=1e-8)


def _four(result):
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise TypeError("expected (output, weights) in evaluation mode, then in training mode, "
                        f"got {type(result).__name__}")
    return result


def _dropout_verdict(result):
    """derive for the dropout case: (out, weights, out_train, weights_train) in eval then training mode ->
    (out, weights, [training mode changes the output, training mode returns the same weights]), decided
    in the trusted process. The weights a layer returns are the attention weights before dropout."""
    out, w, out_train, w_train = _four(result)
    return out, w, np.array([_changed(out, out_train), not _changed(w, w_train)])


def _dropout_structure_verdict(p: float, H: int, T_k: int):
    """derive (trusted side) for the case whose v_proj and out_proj are the identity and whose values are
    one-hot per key plus a column of ones: in training mode, head h's output for query t is then
    [dropped-out weights over the keys, their sum]. (out, weights, out_train, weights_train) ->
    (out, weights, [training mode changes the output, it returns the same weights, every output is the
    values weighted by dropped-out weights (0, or the weight / (1 - p)), about a fraction p is dropped]).
    p, H and T_k come from the case itself, not from the sandbox."""
    def verdict(result):
        out, w, out_train, w_train = _four(result)
        o, weights = numbers(out_train), numbers(w)
        B, T_q = weights.shape[0], weights.shape[2]
        if o.shape != (B, T_q, H * (T_k + 1)) or weights.shape != (B, H, T_q, T_k):
            raise ValueError(f"unexpected shapes: output {o.shape}, weights {weights.shape}")
        heads = o.reshape(B, T_q, H, T_k + 1).transpose(0, 2, 1, 3)        # [B, H, T_q, T_k + 1]
        picked, total = heads[..., :T_k], heads[..., T_k]
        dropped = np.abs(picked) <= 1e-6
        kept = np.isclose(picked, weights / (1.0 - p), rtol=1e-4, atol=1e-6)
        pattern = bool((dropped | kept).all()) and bool(np.allclose(total, picked.sum(-1), rtol=1e-4, atol=1e-5))
        fraction = abs(float(dropped.mean()) - p) < 0.1
        return out, w, np.array([_changed(out, out_train), not _changed(w, w_train), pattern, fraction])

    return verdict


# --------------------------------------------------------------------------- split / merge
def _rejects_head_count(f, x, num_heads) -> np.ndarray:
    """Whether split_heads(x, num_heads) raised ValueError ([True] / [False]); any other exception
    propagates and is reported as the crash it is."""
    return raises(ValueError, f, x.clone(), num_heads)


def _split_cases(rng):
    cases = []
    for shape, H in [((2, 5, 12), 3), ((1, 7, 8), 4), ((3, 4, 6), 6), ((2, 3, 10), 1), ((2, 6, 12), 2)]:
        x = tensor(rng, *shape)
        cases.append(Case(f"x {list(shape)}, num_heads={H}", lambda f, x=x, H=H: f(x.clone(), H)))
    for shape, H in [((2, 5, 10), 3), ((1, 2, 7), 2)]:
        x = tensor(rng, *shape)
        cases.append(Case(f"x {list(shape)}, num_heads={H}: {shape[-1]} is not divisible by {H}, "
                          f"so split_heads must raise ValueError (returns whether it did)",
                          lambda f, x=x, H=H: _rejects_head_count(f, x, H)))
    cases.append(keeps_inputs("x [2, 5, 12], num_heads=3", lambda f, x: f(x, 3), tensor(rng, 2, 5, 12)))
    return cases


def _merge_cases(rng):
    cases = []
    for shape in [(2, 3, 5, 4), (1, 4, 7, 2), (3, 1, 4, 6), (2, 6, 3, 1)]:
        x = tensor(rng, *shape)
        cases.append(Case(f"x [B, H, T, Dh] = {list(shape)}", lambda f, x=x: f(x.clone())))
    B, T, H, Dh = 2, 5, 3, 4
    x = tensor(rng, B, T, H, Dh)
    cases.append(Case(f"a non-contiguous x [B, H, T, Dh] = {[B, H, T, Dh]} (a transposed view)",
                      lambda f, x=x: f(x.clone().transpose(1, 2))))
    # x.transpose_(1, 2) gave the right output and turned the caller's [2, 3, 5, 4] into [2, 5, 3, 4] (an audit's 2 / 2)
    cases.append(keeps_inputs("x [B, H, T, Dh] = [2, 3, 5, 4]", lambda f, x: f(x), tensor(rng, 2, 3, 5, 4)))
    return cases


SPLIT_MISTAKES = (
    Mistake("heads split without the transpose",
            "reshape to [B, T, H, Dh] first (cut the features), then transpose(1, 2) to [B, H, T, Dh]; "
            "reshaping straight to [B, H, T, Dh] mixes positions into heads",
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    if D % num_heads:\n"
            "        raise ValueError('not divisible')\n"
            "    return x.reshape(B, num_heads, T, D // num_heads)\n"),
    Mistake("heads interleaved (feature f goes to head f % H)",
            "head h owns the consecutive features h*Dh .. (h+1)*Dh - 1: reshape to [B, T, H, Dh], not [B, T, Dh, H]",
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    if D % num_heads:\n"
            "        raise ValueError('not divisible')\n"
            "    return x.reshape(B, T, D // num_heads, num_heads).permute(0, 3, 1, 2)\n"),
    Mistake("split to [B, T, H, Dh] but not transposed to [B, H, T, Dh]",
            "after the reshape, move the head axis in front of time: .transpose(1, 2)",
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    if D % num_heads:\n"
            "        raise ValueError('not divisible')\n"
            "    return x.reshape(B, T, num_heads, D // num_heads)\n"),
    Mistake("no ValueError when the width is not divisible by num_heads",
            "check D % num_heads before reshaping and raise ValueError with a clear message",
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    return x.reshape(B, T, num_heads, D // num_heads).transpose(1, 2)\n"),
    Mistake("the width is split into Dh heads of size H (arguments of the reshape swapped)",
            "num_heads is the number of heads H; each head gets Dh = D // num_heads features",
            "def split_heads(x, num_heads):\n"
            "    B, T, D = x.shape\n"
            "    if D % num_heads:\n"
            "        raise ValueError('not divisible')\n"
            "    return x.reshape(B, T, D // num_heads, num_heads).transpose(1, 2)\n"),
)

MERGE_MISTAKES = (
    Mistake("merge that scrambles heads (reshape without the transpose)",
            "transpose(1, 2) back to [B, T, H, Dh] before reshaping to [B, T, H*Dh]",
            "def merge_heads(x):\n"
            "    B, H, T, Dh = x.shape\n"
            "    return x.reshape(B, T, H * Dh)\n"),
    Mistake("merge that interleaves heads (features ordered [Dh, H])",
            "head h's features must land in the consecutive block h*Dh .. (h+1)*Dh - 1: "
            "x.transpose(1, 2).reshape(B, T, H*Dh)",
            "def merge_heads(x):\n"
            "    B, H, T, Dh = x.shape\n"
            "    return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)\n"),
    Mistake(".view() on the transposed tensor (it is not contiguous)",
            "after transpose the memory layout no longer matches: use .reshape(...) or .contiguous().view(...)",
            "def merge_heads(x):\n"
            "    B, H, T, Dh = x.shape\n"
            "    return x.transpose(1, 2).view(B, T, H * Dh)\n"),
    Mistake("transposed but not reshaped (returns [B, T, H, Dh])",
            "after transpose(1, 2), reshape to [B, T, H*Dh]",
            "def merge_heads(x):\n"
            "    return x.transpose(1, 2)\n"),
    Mistake("kept only the first head",
            "every head's output goes into the result, side by side",
            "def merge_heads(x):\n"
            "    return x[:, 0]\n"),
    Mistake("x transposed in place (x.transpose_(1, 2)): the caller's tensor is now [B, T, H, Dh]",
            "transpose_ (with the underscore) changes the tensor you were given, so whoever passed it in finds its "
            "axes swapped: x.transpose(1, 2) returns a new view and leaves x alone",
            "def merge_heads(x):\n"
            "    B, H, T, Dh = x.shape\n"
            "    return x.transpose_(1, 2).reshape(B, T, H * Dh)\n"),
)


# --------------------------------------------------------------------------- MultiHeadAttention
def _mha_state(rng, d_model, H, key_dim, value_dim, bias):
    shapes = {"q_proj": (H * key_dim, d_model), "k_proj": (H * key_dim, d_model),
              "v_proj": (H * value_dim, d_model), "out_proj": (d_model, H * value_dim)}
    sd = {}
    for name, (d_out, d_in) in shapes.items():
        sd[f"{name}.weight"] = tensor(rng, d_out, d_in, scale=1.2 / np.sqrt(d_in))
        if bias:
            sd[f"{name}.bias"] = tensor(rng, d_out, scale=0.3)
    return sd


def _args_text(args: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in args.items())


def _mha_case(rng, args: dict, T_q=5, T_k=None, B=2, call="self", mask=None, mask_text="",
              grads=False, dropout_check=False, adjust=None, **extra):
    """call: 'self' -> m(x); 'key' -> m(x, memory); 'key_value' -> m(x, memory, value). `adjust(state)` may
    change the hidden weights in place; `extra` goes to the Case (atol, tells)."""
    d_model, H = args["d_model"], args["num_heads"]
    key_dim = args.get("key_dim") or d_model // H
    value_dim = args.get("value_dim") or key_dim
    state = _mha_state(rng, d_model, H, key_dim, value_dim, args.get("bias", True))
    if adjust is not None:
        adjust(state)
    T_k = T_q if T_k is None else T_k
    query = tensor(rng, B, T_q, d_model)
    memory = tensor(rng, B, T_k, d_model)
    value = tensor(rng, B, T_k, d_model)

    def forward(layer, inputs):
        m = None if mask is None else mask.clone()
        positional = {"self": inputs[:1], "key": inputs[:2], "key_value": inputs}[call]
        return layer(*positional, mask=m) if m is not None else layer(*positional)

    def run(cls):
        layer = load_weights(cls(**args), state)
        inputs = [query.clone(), memory.clone(), value.clone()]
        if dropout_check:
            with torch.no_grad(), torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)   # a mistake that drops out in eval mode then draws as the student's code does
                out, w = forward(layer, inputs)
                layer.train()
                out_train, w_train = forward(layer, inputs)
            return out, w, out_train, w_train   # compared after _dropout_verdict, in the trusted process
        if not grads:
            with torch.no_grad():
                return forward(layer, inputs)
        inputs = [t.requires_grad_() for t in inputs]
        if (pair := two_outputs(result := forward(layer, inputs))) is None:
            return result
        out, w = pair
        backpropagate(out, w)
        params = dict(layer.named_parameters())
        used = {"self": 1, "key": 2, "key_value": 3}[call]
        return ((out, w) + tuple(t.grad for t in inputs[:used])
                + tuple(params[name].grad if name in params else None for name in state))

    inputs_text = {"self": f"x [{B}, {T_q}, {d_model}] (self-attention: mha(x))",
                   "key": f"query [{B}, {T_q}, {d_model}], key [{B}, {T_k}, {d_model}] (mha(query, key): value defaults to key)",
                   "key_value": f"query [{B}, {T_q}, {d_model}], key and value [{B}, {T_k}, {d_model}] (three different tensors)"}[call]
    what = (" (returns output, weights, the inputs' grads and every projection's grads)" if grads else
            " (returns output and weights in eval mode, and [training mode changes the output, training mode "
            "returns the same weights: the weights before dropout])" if dropout_check else "")
    return Case(f"MultiHeadAttention({_args_text(args)}) on {inputs_text}{mask_text}{what}", run,
                derive=_dropout_verdict if dropout_check else None, **extra)


def _mha_cases(rng):
    return [
        _mha_case(rng, dict(d_model=16, num_heads=4)),
        _mha_case(rng, dict(d_model=12, num_heads=3), T_q=6, B=3),
        _mha_case(rng, dict(d_model=16, num_heads=3, key_dim=2), T_q=6, B=1),     # the lecture's Keras layer
        _mha_case(rng, dict(d_model=8, num_heads=2, key_dim=5, value_dim=3), T_q=4),
        _mha_case(rng, dict(d_model=12, num_heads=4, bias=False), T_q=3),
        _mha_case(rng, dict(d_model=8, num_heads=1), T_q=4),
        _mha_case(rng, dict(d_model=12, num_heads=3, dropout=0.5), T_q=5, dropout_check=True),
        _mha_dropout_structure_case(rng),
        _mha_case(rng, dict(d_model=16, num_heads=2), T_q=5, adjust=_shared_direction,
                  mask_text=", q_proj's bias shifted by +3 and k_proj's by +20, so that every query and key share a "
                  "direction: scores in the hundreds (about 170, a few units apart), where exp() overflows unless the "
                  "row's max is subtracted", atol=WIDE_ATOL, tells=(UNSTABLE,)),
    ]


def _shared_direction(state):
    """Queries about +3 and keys about +20 in every feature: each score q . k / sqrt(key_dim) is about 60
    sqrt(key_dim), in the hundreds, and the scores of one query still differ by a few units."""
    state["q_proj.bias"] = state["q_proj.bias"] + 3.0
    state["k_proj.bias"] = state["k_proj.bias"] + 20.0


def _mha_dropout_structure_case(rng, H=2, T_k=5, T_q=40, B=2, p=0.3):
    """Dropout in training mode, seen through the output: v_proj and out_proj are the identity and the
    value vectors one-hot per key plus a column of ones, so head h's output for query t is
    [w'_1, ..., w'_T_k, sum of w'] with w' the weights after dropout. Dropout on the weights gives 0 or
    w / (1 - p) in each place and their sum in the last; dropout on the output (or on the heads) zeroes
    places independently, so the last column is no longer the sum."""
    key_dim, value_dim = 3, T_k + 1
    d_model = H * value_dim
    args = dict(d_model=d_model, num_heads=H, key_dim=key_dim, value_dim=value_dim, dropout=p)
    state = _mha_state(rng, d_model, H, key_dim, value_dim, True)
    state["q_proj.weight"] = state["q_proj.weight"] * 0.6        # moderate scores: no weight is near 0
    state["v_proj.weight"], state["v_proj.bias"] = torch.eye(d_model), torch.zeros(d_model)
    state["out_proj.weight"], state["out_proj.bias"] = torch.eye(d_model), torch.zeros(d_model)
    query, key = tensor(rng, B, T_q, d_model), tensor(rng, B, T_k, d_model)
    value = torch.zeros(B, T_k, d_model)
    for h in range(H):
        for k in range(T_k):
            value[:, k, h * value_dim + k] = 1.0          # one-hot: picks key k's weight
        value[:, :, h * value_dim + T_k] = 1.0            # ones: the sum of the weights

    def run(cls):
        layer = load_weights(cls(**args), state)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out, w = layer(query.clone(), key.clone(), value.clone())
            layer.train()
            out_train, w_train = layer(query.clone(), key.clone(), value.clone())
        return out, w, out_train, w_train   # compared after _dropout_structure_verdict, in the trusted process

    return Case(f"MultiHeadAttention({_args_text(args)}) on query [{B}, {T_q}, {d_model}], key and value "
                f"[{B}, {T_k}, {d_model}], with v_proj and out_proj set to the identity and value vectors one-hot "
                f"per key plus a column of ones, so that in training mode the output shows each head's weights "
                f"after dropout (returns output and weights in eval mode, and [training mode changes the output, "
                f"training mode returns the same weights: the weights before dropout, each output is the values "
                f"weighted by the dropped-out weights: 0 or weight / (1 - p), about a fraction p = {p} of the "
                f"weights is dropped])", run, derive=_dropout_structure_verdict(p, H, T_k))


def _mha_mask_cases(rng):
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[0, ..., 4:] = False
    pad[1, ..., 1:] = False
    per_head = random_mask(rng, 2, 3, 4, 4, keep_column=None)
    per_head[..., 0] = True
    per_head[1, 2, 3] = False                       # batch 1, head 2, query 3: no key at all
    empty = causal(5).clone()
    empty[1] = False
    return [
        _mha_case(rng, dict(d_model=12, num_heads=3), T_q=5, mask=causal(5), mask_text=", a [5, 5] causal mask"),
        _mha_case(rng, dict(d_model=16, num_heads=4), T_q=6, mask=pad, mask_text=", a [2, 1, 1, 6] padding mask"),
        _mha_case(rng, dict(d_model=12, num_heads=3, key_dim=3, value_dim=2), T_q=4, mask=per_head,
                  mask_text=", a [2, 3, 4, 4] mask, different per head (one row fully masked)"),
        _mha_case(rng, dict(d_model=8, num_heads=2), T_q=5, mask=empty,
                  mask_text=", a causal mask with a fully masked row (query 1): zero weights, no NaN"),
        _mha_keeps_inputs(rng),
    ]


def _mha_keeps_inputs(rng):
    """The mask and x after a call: a mask flipped in place (mask.logical_not_() for PyTorch's convention)
    is flipped for every other layer that shares it."""
    state = _mha_state(rng, 8, 2, 4, 4, True)

    def call(cls, x, mask):
        with torch.no_grad():
            return load_weights(cls(d_model=8, num_heads=2), state)(x, mask=mask)
    return keeps_inputs("MultiHeadAttention(d_model=8, num_heads=2) on x [2, 4, 8] with a [4, 4] causal mask", call,
                        tensor(rng, 2, 4, 8), causal(4))


def _mha_cross_cases(rng):
    pad = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    pad[1, ..., 5:] = False
    return [
        _mha_case(rng, dict(d_model=16, num_heads=4), T_q=3, T_k=7, call="key"),
        _mha_case(rng, dict(d_model=12, num_heads=2, key_dim=4, value_dim=5), T_q=6, T_k=4, call="key_value"),
        _mha_case(rng, dict(d_model=8, num_heads=2), T_q=4, T_k=7, B=3, call="key_value", mask=pad,
                  mask_text=", a [3, 1, 1, 7] padding mask"),
        _mha_two_memories(rng),
    ]


MEMORY_KEPT = ("the memory's keys and values kept from the first call (the second call attends over the first "
               "call's memory)")


def _mha_two_memories(rng, B=2, T_q=3, T_k=6, d_model=12, H=3):
    """ONE layer called on two different memories: every other case builds a fresh layer and calls it once, so a
    layer that projects the memory on its first call and keeps it ("the encoder output is the same at every decoding
    step: project it once", self._kv) took 10 / 10, and a decoder's cross-attention built on it translates every batch
    after the first against the first batch's source (an audit)."""
    args = dict(d_model=d_model, num_heads=H)
    state = _mha_state(rng, d_model, H, d_model // H, d_model // H, True)
    calls = [(tensor(rng, B, T_q, d_model), tensor(rng, B, T_k, d_model)) for _ in range(2)]

    def run(cls):
        return calls_of_one_layer(load_weights(cls(**args), state), calls)

    return Case(f"one MultiHeadAttention({_args_text(args)}) called twice, on two different memories: query "
                f"[{B}, {T_q}, {d_model}] over key = value [{B}, {T_k}, {d_model}] (mha(query, memory)), then another "
                "query and memory of the same shapes (returns both calls' (output, weights): the second call must "
                "attend over ITS memory)", run, tells=(MEMORY_KEPT,))


def _mha_gradient_cases(rng):
    return [
        _mha_case(rng, dict(d_model=12, num_heads=3), T_q=4, grads=True),
        _mha_case(rng, dict(d_model=8, num_heads=2, key_dim=3, value_dim=5), T_q=3, T_k=5, call="key_value",
                  mask=causal(5)[:3], mask_text=", a [3, 5] mask", grads=True),
    ]


# --------------------------------------------------------------------------- torch.nn.MultiheadAttention
def _torch_mha_case(rng, d_model, H, T_q=5, T_k=None, B=2, call="self", mask=None, mask_text="", bias=True):
    T_k = T_q if T_k is None else T_k
    with torch.random.fork_rng():
        theirs = nn.MultiheadAttention(d_model, H, bias=bias, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(tensor(rng, 3 * d_model, d_model, scale=1.2 / np.sqrt(d_model)))
        theirs.out_proj.weight.copy_(tensor(rng, d_model, d_model, scale=1.2 / np.sqrt(d_model)))
        if bias:
            theirs.in_proj_bias.copy_(tensor(rng, 3 * d_model, scale=0.3))
            theirs.out_proj.bias.copy_(tensor(rng, d_model, scale=0.3))
    theirs.eval()
    wq, wk, wv = theirs.in_proj_weight.detach().clone().chunk(3)
    state = {"q_proj.weight": wq, "k_proj.weight": wk, "v_proj.weight": wv,
             "out_proj.weight": theirs.out_proj.weight.detach().clone()}
    if bias:
        bq, bk, bv = theirs.in_proj_bias.detach().clone().chunk(3)
        state.update({"q_proj.bias": bq, "k_proj.bias": bk, "v_proj.bias": bv,
                      "out_proj.bias": theirs.out_proj.bias.detach().clone()})
    query, memory, value = tensor(rng, B, T_q, d_model), tensor(rng, B, T_k, d_model), tensor(rng, B, T_k, d_model)
    args = dict(d_model=d_model, num_heads=H) if bias else dict(d_model=d_model, num_heads=H, bias=False)

    def run(cls):
        q = query.clone()
        k = q if call == "self" else memory.clone()
        v = k if call != "key_value" else value.clone()
        with torch.no_grad():
            if cls is TORCH_MHA:
                kwargs = {}
                if mask is not None and mask.dim() == 4 and mask.shape[1] == 1 and mask.shape[2] == 1:
                    kwargs["key_padding_mask"] = ~mask[:, 0, 0, :]         # torch: True = ignore
                elif mask is not None and mask.dim() == 4:
                    kwargs["attn_mask"] = ~mask.reshape(B * H, T_q, T_k)   # torch: True = not allowed
                elif mask is not None:
                    kwargs["attn_mask"] = ~mask
                return theirs(q, k, v, need_weights=True, average_attn_weights=False, **kwargs)
            layer = load_weights(cls(**args), state)
            positional = {"self": (q,), "key": (q, k), "key_value": (q, k, v)}[call]
            return layer(*positional, mask=mask.clone()) if mask is not None else layer(*positional)

    inputs_text = {"self": f"self-attention on x [{B}, {T_q}, {d_model}]",
                   "key": f"query [{B}, {T_q}, {d_model}] over key = value [{B}, {T_k}, {d_model}]",
                   "key_value": f"query [{B}, {T_q}, {d_model}], key and value [{B}, {T_k}, {d_model}]"}[call]
    return Case(f"torch.nn.MultiheadAttention({d_model}, {H}{'' if bias else ', bias=False'}) with its weights "
                f"copied into MultiHeadAttention({_args_text(args)}): {inputs_text}{mask_text}", run)


def _mha_torch_cases(rng):
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 4:] = False
    return [
        _torch_mha_case(rng, 12, 3),
        _torch_mha_case(rng, 16, 4, T_q=3, T_k=6, call="key_value"),
        _torch_mha_case(rng, 8, 2, T_q=5, mask=causal(5), mask_text=", a [5, 5] causal mask"),
        _torch_mha_case(rng, 16, 2, T_q=4, T_k=6, call="key", mask=pad, mask_text=", a [2, 1, 1, 6] padding mask"),
        _torch_mha_case(rng, 8, 4, T_q=4, bias=False),
        _torch_mha_case(rng, 12, 3, T_q=4, mask=random_mask(rng, 2, 3, 4, 4, keep_column=2),
                        mask_text=", a [2, 3, 4, 4] mask, different per head"),
    ]


_INIT = """\
        key_dim = d_model // num_heads if key_dim is None else key_dim
        value_dim = key_dim if value_dim is None else value_dim
"""
_PROJECTIONS = """\
        self.h, self.dk, self.dv, self.d_model = num_heads, key_dim, value_dim, d_model
        self.q_proj = nn.Linear(d_model, num_heads * key_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_heads * key_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_heads * value_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * value_dim, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
"""
_DEFAULTS = """\
        key = query if key is None else key
        value = key if value is None else value
"""
_SPLIT = """\
        B, Tq, Tk = query.shape[0], query.shape[1], key.shape[1]
        q = self.q_proj(query).reshape(B, Tq, self.h, self.dk).transpose(1, 2)
        k = self.k_proj(key).reshape(B, Tk, self.h, self.dk).transpose(1, 2)
        v = self.v_proj(value).reshape(B, Tk, self.h, self.dv).transpose(1, 2)
"""
_ATTENTION = """\
        _, w = _attend(q, k, v, mask)
        out = self.dropout(w) @ v
"""
_MERGE = """\
        out = out.transpose(1, 2).reshape(B, Tq, self.h * self.dv)
"""
_RETURN = """\
        return self.out_proj(out), w
"""


def _mha(init: str = _INIT + _PROJECTIONS, defaults: str = _DEFAULTS, split: str = _SPLIT,
         attention: str = _ATTENTION, merge: str = _MERGE, ret: str = _RETURN) -> str:
    """A self-contained MultiHeadAttention (it can replace the student's cell) with one piece swapped."""
    return (ATTEND_SOURCE +
            "class MultiHeadAttention(nn.Module):\n"
            "    def __init__(self, d_model, num_heads, key_dim=None, value_dim=None, dropout=0.0, bias=True):\n"
            "        super().__init__()\n"
            f"{init}\n"
            "    def forward(self, query, key=None, value=None, mask=None):\n"
            f"{defaults}{split}{attention}{merge}{ret}")


MHA_MISTAKES = (
    Mistake("heads split without the transpose",
            "reshape the projections to [B, T, H, Dh] and then transpose(1, 2) to [B, H, T, Dh] "
            "(split_heads); reshaping straight to [B, H, T, Dh] mixes positions into heads",
            _mha(split="""\
        B, Tq, Tk = query.shape[0], query.shape[1], key.shape[1]
        q = self.q_proj(query).reshape(B, self.h, Tq, self.dk)
        k = self.k_proj(key).reshape(B, self.h, Tk, self.dk)
        v = self.v_proj(value).reshape(B, self.h, Tk, self.dv)
""", merge="""\
        out = out.reshape(B, Tq, self.h * self.dv)
""")),
    Mistake("merge that scrambles heads (reshape without the transpose)",
            "transpose the heads' outputs back to [B, T, H, Dh] before reshaping to [B, T, H*Dh] (merge_heads)",
            _mha(merge="""\
        out = out.reshape(B, Tq, self.h * self.dv)
""")),
    Mistake("out_proj missing (the merged heads are returned without the output projection)",
            "finish with self.out_proj(merged heads): it mixes the heads and maps H*value_dim back to d_model",
            _mha(ret="""\
        return out, w
""")),
    Mistake("key_dim ignored (the projections are always d_model // num_heads per head)",
            "q_proj and k_proj map d_model -> num_heads * key_dim; key_dim defaults to d_model // num_heads "
            "only when it is None",
            _mha(init="""\
        key_dim = d_model // num_heads
        value_dim = key_dim if value_dim is None else value_dim
""" + _PROJECTIONS)),
    Mistake("value_dim ignored (the values use key_dim)",
            "v_proj maps d_model -> num_heads * value_dim and out_proj maps num_heads * value_dim -> d_model",
            _mha(init="""\
        key_dim = d_model // num_heads if key_dim is None else key_dim
        value_dim = key_dim
""" + _PROJECTIONS)),
    Mistake("scaled by sqrt(d_model) instead of sqrt(key_dim)",
            "each head compares key_dim-wide queries and keys: the scale is 1/sqrt(key_dim)",
            _mha(attention="""\
        _, w = _attend(q, k, v, mask, scale=self.d_model)
        out = self.dropout(w) @ v
""")),
    Mistake("no 1/sqrt(key_dim) scaling",
            "divide the scores by sqrt(key_dim) (scaled_dot_product_attention does it for you)",
            _mha(attention="""\
        _, w = _attend(q, k, v, mask, scale=1)
        out = self.dropout(w) @ v
""")),
    Mistake("softmax over the query axis (columns sum to 1, not rows)",
            "each query's row of weights must sum to 1: softmax over the keys, dim=-1",
            _mha(attention="""\
        _, w = _attend(q, k, v, mask, dim=-2)
        out = self.dropout(w) @ v
""")),
    Mistake("(weights, output) returned in the wrong order",
            "return the output first and the weights second: return self.out_proj(merged), weights "
            "(as scaled_dot_product_attention returns (output, weights))",
            _mha(ret="""\
        return w, self.out_proj(out)
""")),
    Mistake("weights averaged over the heads",
            "return one weight matrix per head, [B, H, T_q, T_k] (torch's layer averages them unless "
            "average_attn_weights=False)",
            _mha(ret="""\
        return self.out_proj(out), w.mean(dim=1)
""")),
    Mistake("mask ignored",
            "pass the mask on to the attention of every head",
            _mha(attention="""\
        _, w = _attend(q, k, v)
        out = self.dropout(w) @ v
""")),
    Mistake("inverted mask (True treated as 'blocked')",
            "True means *may attend*: pass the mask as it is (torch.nn.MultiheadAttention's attn_mask is the opposite)",
            _mha(attention="""\
        _, w = _attend(q, k, v, None if mask is None else ~mask)
        out = self.dropout(w) @ v
""")),
    Mistake("a large negative number (-1e9) instead of -inf: fully masked rows become uniform",
            "-1e9 is fine for a row with an allowed key, but a row with none becomes a uniform average of every "
            "key; fill with float('-inf') and set the weights of a row with no allowed key to 0 (notebook 02's "
            "scaled_dot_product_attention does both)",
            _mha(attention="""\
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        if mask is not None:
            scores = scores.masked_fill(~mask, -1e9)
        w = torch.softmax(scores, dim=-1)
        out = self.dropout(w) @ v
""")),
    Mistake(UNSTABLE,
            "exp() of a score above about 88 is inf in float32, and inf / inf is NaN: subtract each row's max before "
            "exp() (with the masked scores filled with -inf first), or call your scaled_dot_product_attention, whose "
            "torch.softmax does it for you",
            _mha(attention="""\
        e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(self.dk))
        if mask is not None:
            e = e * mask
        total = e.sum(dim=-1, keepdim=True)
        w = e / torch.where(total > 0, total, torch.ones_like(total))
        out = self.dropout(w) @ v
""")),
    Mistake("value defaults to the query instead of the key",
            "value defaults to *key* (which itself defaults to query): mha(x, memory) attends over memory's values",
            _mha(defaults="""\
        value = query if value is None else value
        key = query if key is None else key
""")),
    Mistake("dropout never applied",
            "apply self.dropout to the attention weights before they multiply the values",
            _mha(attention="""\
        out, w = _attend(q, k, v, mask)
""")),
    Mistake("returned the attention weights after dropout",
            "return the weights *before* dropout (they sum to 1 and are what the heatmaps show); dropout only "
            "changes the copy that multiplies the values: out = self.dropout(weights) @ v, return weights "
            "(torch.nn.MultiheadAttention returns them after dropout; this course's layer does not)",
            _mha(attention="""\
        _, w = _attend(q, k, v, mask)
        w = self.dropout(w)
        out = w @ v
""")),
    Mistake("dropout applied to the layer's output instead of the attention weights",
            "in multi-head attention dropout goes on the attention weights, before they multiply the values: "
            "out = self.dropout(weights) @ v (the residual dropout on the output belongs to the encoder and "
            "decoder layers of notebook 05)",
            _mha(attention="""\
        out, w = _attend(q, k, v, mask)
""", ret="""\
        return self.dropout(self.out_proj(out)), w
""")),
    Mistake(MEMORY_KEPT,
            "project key and value in every call, k = self.k_proj(key), v = self.v_proj(value): the layer sees a new "
            "memory (a new batch of encoder states) each time, and a module keeps its weights, not its last inputs "
            "(no self._kv); notebook 07's KV cache is the way to reuse keys, and it is handed in, not kept",
            _mha(split="""\
        B, Tq, Tk = query.shape[0], query.shape[1], key.shape[1]
        q = self.q_proj(query).reshape(B, Tq, self.h, self.dk).transpose(1, 2)
        if getattr(self, '_kv', None) is None:
            self._kv = (self.k_proj(key).reshape(B, Tk, self.h, self.dk).transpose(1, 2),
                        self.v_proj(value).reshape(B, Tk, self.h, self.dv).transpose(1, 2))
        k, v = self._kv
""")),
    Mistake("dropout applied in eval mode too",
            "dropout must switch off with .eval(): make one nn.Dropout in __init__ and call it in forward (a module "
            "that .eval() reaches); F.dropout(..., training=True), or an nn.Dropout made inside forward, stays on",
            _mha(attention="""\
        _, w = _attend(q, k, v, mask)
        out = F.dropout(w, self.dropout.p, training=True) @ v
""")),
)


# --------------------------------------------------------------------------- the Keras example
def _keras_case(rng, key_dim):
    d_model, H, T = 16, 3, 6
    state = _mha_state(rng, d_model, H, key_dim, key_dim, True)
    x = tensor(rng, 1, T, d_model)
    names = ["q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
             "v_proj.weight", "v_proj.bias", "out_proj.weight", "out_proj.bias"]

    def run(cls):
        layer = cls(d_model=d_model, num_heads=H, key_dim=key_dim)
        params = dict(layer.named_parameters())
        shapes = tuple(np.array(params[n].shape) if n in params else np.array([-1]) for n in names)
        total = np.array([sum(p.numel() for p in layer.parameters())])
        load_weights(layer, state)
        with torch.no_grad():
            out, w = layer(x.clone())
        return shapes + (total, out, w)

    return Case(f"the lecture's Keras layer: MultiHeadAttention(d_model=16, num_heads=3, key_dim={key_dim}) on "
                f"x [1, 6, 16] (returns the shapes of {', '.join(names)}, the number of parameters "
                f"({4 * d_model * H * key_dim + 3 * H * key_dim + d_model}), output and weights)", run)


def _keras_cases(rng):
    return [_keras_case(rng, 2), _keras_case(rng, 5)]


# --------------------------------------------------------------------------- count_parameters
class _KerasLayout(nn.Module):
    """The Keras layer's four weight groups as plain Linear layers (not the reference class:
    cases must unpickle where attention_course.multihead is not available)."""

    def __init__(self, d_model, num_heads, key_dim, bias=True):
        super().__init__()
        self.query = nn.Linear(d_model, num_heads * key_dim, bias=bias)
        self.key = nn.Linear(d_model, num_heads * key_dim, bias=bias)
        self.value = nn.Linear(d_model, num_heads * key_dim, bias=bias)
        self.output = nn.Linear(num_heads * key_dim, d_model, bias=bias)


def _frozen() -> nn.Module:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
    model[0].weight.requires_grad_(False)
    return model


def _count_cases(rng):
    with torch.random.fork_rng():
        torch.manual_seed(int(rng.integers(2**31)))
        shared = nn.Linear(4, 4)
        tied = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Tanh(), nn.Linear(4, 4, bias=False))
        tied[2].weight = tied[0].weight  # one weight in two different layers (tied embeddings, say)
        modules = [
            ("the lecture's Keras layer (d_model=16, num_heads=3, key_dim=2) as four Linear layers",
             _KerasLayout(16, 3, 2)),
            ("the same with key_dim=5", _KerasLayout(16, 3, 5)),
            ("the same without biases (d_model=12, num_heads=4, key_dim=3, bias=False)", _KerasLayout(12, 4, 3, bias=False)),
            ("nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 3, bias=False))",
             nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4), nn.Linear(4, 3, bias=False))),
            ("nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6)) (BatchNorm also has buffers, which are not parameters)",
             nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6))),
            ("nn.Sequential(lin, nn.ReLU(), lin): one Linear(4, 4) used twice (shared parameters count once)",
             nn.Sequential(shared, nn.ReLU(), shared)),
            ("nn.Sequential(a, nn.Tanh(), b) with b.weight = a.weight: one weight tied between two different "
             "layers (counts once)", tied),
            ("torch.nn.MultiheadAttention(8, 2)", nn.MultiheadAttention(8, 2)),
            ("nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3)) with the embedding frozen "
             "(requires_grad=False: a frozen parameter is still a parameter)", _frozen()),
        ]
    return [Case(text, lambda f, m=m: f(m)) for text, m in modules]


COUNT_MISTAKES = (
    Mistake("counted parameter tensors instead of numbers",
            "add up p.numel() for every parameter p, not the number of tensors",
            "def count_parameters(module):\n    return len(list(module.parameters()))\n"),
    Mistake("biases not counted",
            "every parameter counts: weights *and* biases (and LayerNorm's scale and shift)",
            "def count_parameters(module):\n"
            "    return sum(p.numel() for name, p in module.named_parameters() if not name.endswith('bias'))\n"),
    # before the state_dict: all three count a weight tied between two layers twice, and the diagnosis names the
    # first that matches (a double count by children() or remove_duplicate=False was told "counted the state_dict")
    Mistake("added up the parameters layer by layer (over module.children() or module.modules()): a weight tied "
            "between two layers counted once per layer",
            "module.parameters() already walks every submodule, and yields a parameter shared or tied between layers "
            "once, however many layers hold it: sum(p.numel() for p in module.parameters())",
            "def count_parameters(module):\n"
            "    return sum(p.numel() for m in module.children() for p in m.parameters())\n"),
    Mistake("counted a shared parameter once per use (named_parameters(remove_duplicate=False))",
            "remove_duplicate=False yields a parameter again under each name it has (a layer used twice, a tied "
            "weight); the default, module.parameters(), yields each once: sum(p.numel() for p in module.parameters())",
            "def count_parameters(module):\n"
            "    return sum(p.numel() for _, p in module.named_parameters(remove_duplicate=False))\n"),
    Mistake("counted the state_dict (buffers and shared parameters too)",
            "module.state_dict() also holds buffers (BatchNorm's running statistics) and repeats shared "
            "weights; count module.parameters()",
            "def count_parameters(module):\n    return sum(t.numel() for t in module.state_dict().values())\n"),
    Mistake("added up the shapes instead of multiplying them",
            "a [6, 16] weight holds 6 * 16 = 96 numbers: p.numel()",
            "def count_parameters(module):\n    return sum(sum(p.shape) for p in module.parameters())\n"),
    Mistake("counted only the trainable parameters (requires_grad=True)",
            "count every parameter, frozen or not: sum(p.numel() for p in module.parameters()) without an "
            "`if p.requires_grad` filter (a frozen weight is still part of the model, as in Keras' 'Total params')",
            "def count_parameters(module):\n"
            "    return sum(p.numel() for p in module.parameters() if p.requires_grad)\n"),
    Mistake("counted only the module's own parameters, not its submodules'",
            "module.parameters() recurses into submodules by default; don't pass recurse=False",
            "def count_parameters(module):\n    return sum(p.numel() for p in module.parameters(recurse=False))\n"),
)


# --------------------------------------------------------------------------- mha_param_count
PARAM_SIZES = [  # (d_model, num_heads, key_dim, value_dim, bias): None = the layer's default
    (16, 3, 2, None, True),     # the lecture's Keras layer: 418
    (16, 3, 5, None, True),     # its question: 1021
    (12, 4, 3, 5, True),        # values wider than keys
    (12, 4, 5, 2, True),        # keys wider than values
    (8, 2, None, None, True),   # both defaults: key_dim = d_model // num_heads
    (12, 4, None, 6, False),    # no biases, key_dim by default
    (10, 5, 2, 7, False),
    (24, 6, None, None, False),
]


def _param_count_cases(rng):
    cases = []
    for d, h, k, v, bias in PARAM_SIZES:
        args = {"key_dim": k, "value_dim": v, "bias": bias}
        shown = ", ".join(f"{name}={value}" for name, value in args.items() if value is not None or name == "bias")
        cases.append(Case(f"mha_param_count(d_model={d}, num_heads={h}, {shown})",
                          lambda f, d=d, h=h, args=args: f(d, h, **{n: a for n, a in args.items() if a is not None}),
                          derive=_a_whole_count))
    return cases


def _a_whole_count(value):
    """The count as an array to compare, when it is a whole number's type (an int, numpy's, or a 0-d integer tensor);
    a float, even 418.0, is told: a count of parameters is an int (d_model / num_heads makes a float where // does
    not, and everything computed from it is one)."""
    value = value.detach().float().numpy() if isinstance(value, torch.Tensor) and value.is_floating_point() else value
    if np.asarray(value).dtype.kind == "f":
        return Told(f"mha_param_count returned {value!r}, a float: a number of parameters is a whole number, so "
                    f"return an int. Likely cause: d_model / num_heads (a float, even where it divides evenly) where "
                    f"d_model // num_heads keeps it an int")
    return np.array(value)


PARAM_COUNT_MISTAKES = (
    Mistake("the output projection's bias forgotten",
            "out_proj has a bias too, one per output feature: + d_model when bias=True",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model // num_heads\n    v = value_dim or k\n"
            "    b = 1 if bias else 0\n"
            "    return 2 * (d_model * num_heads * k + b * num_heads * k) + d_model * num_heads * v + b * num_heads * v "
            "+ num_heads * v * d_model\n"),
    Mistake("the output projection's bias sized num_heads * value_dim (its input) instead of d_model",
            "a Linear layer has one bias per OUTPUT feature: out_proj maps num_heads * value_dim features to d_model, "
            "so its bias has d_model entries",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model // num_heads\n    v = value_dim or k\n    b = 1 if bias else 0\n"
            "    return 2 * (d_model * num_heads * k + b * num_heads * k) + d_model * num_heads * v + b * num_heads * v "
            "+ num_heads * v * d_model + b * num_heads * v\n"),
    Mistake("value_dim ignored (the values and the output map sized with key_dim)",
            "v_proj makes num_heads * value_dim features and out_proj reads them: those two grow with value_dim",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model // num_heads\n    b = 1 if bias else 0\n"
            "    return 4 * d_model * num_heads * k + b * (3 * num_heads * k + d_model)\n"),
    Mistake("the output map sized with key_dim (it reads the values)",
            "out_proj maps the merged heads, num_heads * value_dim features, to d_model",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model // num_heads\n    v = value_dim or k\n    b = 1 if bias else 0\n"
            "    return 2 * (d_model * num_heads * k + b * num_heads * k) + d_model * num_heads * v + b * num_heads * v "
            "+ num_heads * k * d_model + b * d_model\n"),
    Mistake("biases counted even with bias=False",
            "with bias=False no projection has a bias: count the weights only",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model // num_heads\n    v = value_dim or k\n"
            "    return 2 * (d_model * num_heads * k + num_heads * k) + d_model * num_heads * v + num_heads * v "
            "+ num_heads * v * d_model + d_model\n"),
    Mistake("key_dim defaults to d_model (it is d_model // num_heads per head)",
            "without key_dim each head gets d_model // num_heads features, so all heads together have d_model",
            "def mha_param_count(d_model, num_heads, key_dim=None, value_dim=None, bias=True):\n"
            "    k = key_dim or d_model\n    v = value_dim or k\n    b = 1 if bias else 0\n"
            "    return 2 * (d_model * num_heads * k + b * num_heads * k) + d_model * num_heads * v + b * num_heads * v "
            "+ num_heads * v * d_model + b * d_model\n"),
)


FORBIDDEN = HONESTY + torch_attention(*NO_BUILTIN, allowed=(F.scaled_dot_product_attention,))  # notebook 02's step: allowed
_COMMON = dict(forbidden=FORBIDDEN, rtol=RTOL, atol=ATOL)
EXERCISES = [
    Exercise("split_heads", ref.split_heads, _split_cases, mistakes=SPLIT_MISTAKES, **_COMMON),
    Exercise("merge_heads", ref.merge_heads, _merge_cases, mistakes=MERGE_MISTAKES, **_COMMON),
    Exercise("MultiHeadAttention", ref.MultiHeadAttention, _mha_cases, mistakes=MHA_MISTAKES, **_COMMON),
    Exercise("MultiHeadAttention_mask", ref.MultiHeadAttention, _mha_mask_cases, mistakes=MHA_MISTAKES,
             graded="MultiHeadAttention", **_COMMON),
    Exercise("MultiHeadAttention_cross", ref.MultiHeadAttention, _mha_cross_cases, mistakes=MHA_MISTAKES,
             graded="MultiHeadAttention", **_COMMON),
    Exercise("MultiHeadAttention_gradients", ref.MultiHeadAttention, _mha_gradient_cases, mistakes=MHA_MISTAKES,
             graded="MultiHeadAttention", **_COMMON),
    Exercise("MultiHeadAttention_torch", TORCH_MHA, _mha_torch_cases, mistakes=MHA_MISTAKES,
             graded="MultiHeadAttention", **_COMMON),
    Exercise("MultiHeadAttention_keras", ref.MultiHeadAttention, _keras_cases, mistakes=MHA_MISTAKES,
             graded="MultiHeadAttention", **_COMMON),
    Exercise("count_parameters", ref.count_parameters, _count_cases, mistakes=COUNT_MISTAKES, **_COMMON),
    Exercise("mha_param_count", ref.mha_param_count, _param_count_cases, mistakes=PARAM_COUNT_MISTAKES, **_COMMON),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"MultiHeadAttention": ("split_heads", "merge_heads")}
