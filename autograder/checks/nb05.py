"""Checks for notebook 05, "Masked and cross attention" (PyTorch).

Modules are compared with the reference by loading one random state dict (the reference's
parameter names, random values, LayerNorm scales included) into both, in evaluation mode, so no
result depends on the order of random draws inside the student's code.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import layers as ref
from attention_course.multihead import MultiHeadAttention

from .core import (
    Case,
    Exercise,
    Mistake,
    called_twice,
    keeps_inputs,
    make_checker,
    numbers,
    random_state,
    reference_guard,
    same_both_times,
    variant,
)
from .nb02 import MAX_OVER_MASKED
from .tensors import RANDOM_COLUMN, as_float32, load_state, random_mask, require_names, tensor, torch_attention

HONESTY = tuple(reference_guard(ref))
_BUILT_IN = ("it calls PyTorch's built-in Transformer layers; build the layer from MultiHeadAttention, "
             "FeedForward and LayerNorm yourself")
TORCH_LAYERS = tuple((f, _BUILT_IN) for f in (
    nn.TransformerEncoderLayer.forward, nn.TransformerDecoderLayer.forward,
    nn.TransformerEncoder.forward, nn.TransformerDecoder.forward, nn.Transformer.forward))
RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- helpers
def _load(module: nn.Module, state: dict) -> nn.Module:
    """Load `state` into the student's module, with a message naming the expected attributes (a wrong
    shape is left to PyTorch's load_state_dict error, which the grader summarizes)."""
    return load_state(module, state, check_shapes=False)


def _keep(rng, B, T, min_len=1) -> torch.Tensor:
    """[B, T] booleans: each row a real prefix of random length >= min_len, then pads."""
    lengths = rng.integers(min_len, T + 1, size=B)
    lengths[0] = T                       # one row without padding
    if B > 1:
        lengths[-1] = max(min_len, T - 2)  # and one with padding
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


def _fill_torch(layer: nn.Module, rng) -> nn.Module:
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.startswith("norm"):
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(as_float32(base + 0.2 * rng.normal(size=tuple(p.shape))))
            elif p.dim() == 2:
                p.copy_(as_float32(rng.normal(size=tuple(p.shape)) / np.sqrt(p.shape[1])))
            else:
                p.copy_(as_float32(0.1 * rng.normal(size=tuple(p.shape))))
    return layer.train()  # training mode with dropout 0: PyTorch's exact (non-fused) path


# --------------------------------------------------------------------------- cases: masks and softmax
LECTURE_SCORES = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.1, 0.3, 0.6, 0.1], [0.1, 0.3, 0.3, 0.3]]


def _causal_cases(rng):
    return [Case(f"causal_mask({n})", lambda f, n=n: f(n)) for n in (4, 7, 1, 2, 10)]


def _softmax_cases(rng):
    causal5 = torch.ones(5, 5, dtype=torch.bool).tril()
    keep = _keep(rng, 2, 6)[:, None, None, :]
    cases = [
        ("the lecture's 'I am a student' scores [4, 4] with the causal mask",
         torch.tensor(LECTURE_SCORES), torch.ones(4, 4, dtype=torch.bool).tril()),
        ("scores [2, 3, 5, 5] with a causal mask [5, 5] (broadcast)", tensor(rng, 2, 3, 5, 5, scale=3), causal5),
        ("scores [2, 1, 4, 6] with a padding mask [2, 1, 1, 6]", tensor(rng, 2, 1, 4, 6, scale=2), keep),
        ("scores [3, 4, 7] with a random mask of the same shape", tensor(rng, 3, 4, 7),
         random_mask(rng, 3, 4, 7, p_keep=0.5, keep_column=RANDOM_COLUMN)),
        ("large scores (|x| ~ 50) with a random mask", tensor(rng, 4, 6, scale=50),
         random_mask(rng, 4, 6, p_keep=0.5, keep_column=RANDOM_COLUMN)),
        # exp overflows in float32 past 88: scores of a few hundred need the max subtracted (at 50 an unstable
        # softmax still passed)
        ("scores of a few hundred (exp overflows without subtracting the max) with a random mask",
         tensor(rng, 3, 5, scale=50) + 300.0, random_mask(rng, 3, 5, p_keep=0.6, keep_column=RANDOM_COLUMN)),
    ]
    found = [Case(d, lambda f, s=s, m=m: f(s.clone(), m.clone())) for d, s, m in cases]
    scores = tensor(rng, 2, 4, 5, scale=2)
    found.append(Case("scores [2, 4, 5] and no mask (mask=None: a plain softmax over the keys)",
                      lambda f, s=scores: f(s.clone())))
    found.append(keeps_inputs("scores [2, 4, 5] with a causal mask [4, 5]", lambda f, *given: f(*given),
                              tensor(rng, 2, 4, 5), torch.ones(4, 5, dtype=torch.bool).tril()))
    # the masked scores far above the allowed ones (a future token, a pad that happens to match the query): a max
    # taken over every key, the mask multiplied in after exp(), underflows each allowed weight to 0
    causal45 = torch.ones(4, 5, dtype=torch.bool).tril()
    high = tensor(rng, 2, 4, 5, scale=2).masked_fill(~causal45, 0.0) + 150.0 * (~causal45).float()
    found.append(Case("scores [2, 4, 5] with a causal mask [4, 5] whose masked scores are about 150, far above the "
                      "allowed ones (a few units either side of 0): every allowed weight must survive",
                      lambda f, s=high, m=causal45: f(s.clone(), m.clone()), tells=(MAX_OVER_MASKED,)))
    return found


def _fully_masked_cases(rng):
    mask = random_mask(rng, 2, 4, 5, p_keep=0.5, keep_column=RANDOM_COLUMN)
    mask[0, 1] = False
    mask[1, 3] = False
    keep = torch.tensor([[True, True, True, True], [False, True, True, True]])   # a left-padded sentence
    left = torch.ones(4, 4, dtype=torch.bool).tril() & keep[:, None, None, :]      # its first query sees nothing
    cases = [
        ("scores [2, 4, 5] where two rows have no allowed key", tensor(rng, 2, 4, 5), mask),
        ("causal AND padding mask [2, 1, 4, 4] for a left-padded sentence (its first row sees nothing)",
         tensor(rng, 2, 2, 4, 4), left),
        ("a mask that is False everywhere", tensor(rng, 3, 3), torch.zeros(3, 3, dtype=torch.bool)),
    ]
    return [Case(d, lambda f, s=s, m=m: f(s.clone(), m.clone())) for d, s, m in cases]


def _padding_cases(rng):
    right = torch.tensor(rng.integers(1, 9, size=(3, 6)))
    right[1, 4:] = 0
    right[2, 2:] = 0
    other = torch.tensor(rng.integers(0, 5, size=(4, 5)))        # pad_id 2; 0 is a real token here
    other[0, 3:] = 2
    other[3, :] = 2                                              # a row of nothing but pads
    no_pads = torch.tensor(rng.integers(1, 9, size=(1, 7)))
    return [
        Case("tokens [3, 6] padded with pad_id=0", lambda f: f(right.clone(), 0)),
        Case("tokens [4, 5] with pad_id=2 (0 is a real token here)", lambda f: f(other.clone(), 2)),
        Case("tokens [1, 7] without padding, pad_id=0", lambda f: f(no_pads.clone(), 0)),
    ]


# --------------------------------------------------------------------------- cases: LayerNorm
def _ln_state(rng, d: int) -> dict:
    """A random scale near 1 and shift near 0 (names as nn.LayerNorm's: weight, bias)."""
    return {"weight": as_float32(1.0 + 0.3 * rng.normal(size=d)), "bias": as_float32(0.2 * rng.normal(size=d))}


def _layer_norm(cls, d, eps, state, x):
    layer = cls(d) if eps is None else cls(d, eps=eps)
    if state is not None:
        layer = _load(layer, state)
    with torch.no_grad():
        return layer(x.clone())


def _ln_text(d, eps):
    return f"LayerNorm({d})" if eps is None else f"LayerNorm({d}, eps={eps})"


def _fresh_scale_and_shift(layer) -> tuple:
    own = require_names(layer, ("weight", "bias"))   # gamma/beta by other names: told which names, not an attribute error
    return own["weight"].detach().clone(), own["bias"].detach().clone()


def _layer_norm_cases(rng):
    cases = [Case("a fresh LayerNorm(6): its weight and bias (ones and zeros, as nn.LayerNorm starts)",
                  lambda cls: _fresh_scale_and_shift(cls(6)))]
    settings = [  # (d, eps, shape of x, scale of x, offset of x, what)
        (8, None, (2, 5, 8), 1.0, 0.0, ""),
        (16, None, (3, 16), 2.0, 0.0, ""),
        (6, None, (2, 3, 4, 6), 1.0, 0.0, " (two leading axes)"),
        (512, None, (2, 3, 512), 1.0, 0.0, " (a wide vector)"),
        (12, None, (4, 12), 1.0, 5.0, " shifted by +5 (the mean must come off)"),
        (8, None, (3, 4, 8), 0.001, 0.0, " of scale 0.001 (variance 1e-6, far below eps)"),
        (10, 0.1, (2, 4, 10), 0.5, 0.0, ""),
    ]
    for d, eps, shape, scale, offset, what in settings:
        state, x = _ln_state(rng, d), offset + tensor(rng, *shape, scale=scale)
        cases.append(Case(f"{_ln_text(d, eps)} with a random weight and bias loaded, on x of shape {list(shape)}{what}",
                          lambda cls, d=d, eps=eps, s=state, x=x: _layer_norm(cls, d, eps, s, x)))
    d, shape = 64, (8, 16, 64)
    state, x = _ln_state(rng, d), LARGE_MEAN + tensor(rng, *shape)
    cases.append(Case(f"LayerNorm({d}) with a random weight and bias loaded, on x of shape {list(shape)} shifted by "
                      f"+{LARGE_MEAN:g} (a residual stream drifts so): the largest difference of your output from "
                      f"LayerNorm computed in float64, shown as {FLOAT64_FLOOR:g} when it is smaller (float32 rounding; "
                      "the reference's own is below 1e-4)",
                      lambda cls, d=d, s=state, x=x: _error_from_float64(cls, d, s, x)))
    # PyTorch's own layer, its state dict loaded into yours as it is (the names are interchangeable)
    d, shape = 20, (3, 7, 20)
    torch_norm = nn.LayerNorm(d)
    with torch.no_grad():
        for name, value in _ln_state(rng, d).items():
            getattr(torch_norm, name).copy_(value)
    x, saved = tensor(rng, *shape), {k: v.clone() for k, v in torch_norm.state_dict().items()}
    with torch.no_grad():
        theirs = torch_norm(x.clone())
    cases.append(Case(f"nn.LayerNorm({d})'s state_dict loaded into your LayerNorm({d}), x of shape {list(shape)}: "
                      "your output minus PyTorch's (should be 0)",
                      lambda cls, s=saved, x=x, t=theirs: _layer_norm(cls, d, None, s, x) - t))
    state = _ln_state(rng, 8)  # called on x itself, not on a copy: `x -= mean` normalized the caller's tensor
    cases.append(keeps_inputs("LayerNorm(8) with a random weight and bias loaded, on x of shape [2, 5, 8]",
                              lambda cls, x, s=state: _no_grad(lambda: _load(cls(8), s)(x)), tensor(rng, 2, 5, 8)))
    return cases


LARGE_MEAN = 100.0
FLOAT64_FLOOR = 1e-3  # float32's own rounding at this mean stays under 1e-4; E[x^2] - E[x]^2 is off by 3e-3 or more


def _error_from_float64(cls, d, state, x) -> float:
    """max |layer(x) - LayerNorm(x) in float64|, floored at FLOAT64_FLOOR: every careful float32 answer gives the
    floor, one that loses digits more."""
    out = _layer_norm(cls, d, None, state, x)
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    exact = (x64 - mean) / torch.sqrt(((x64 - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
    exact = exact * torch.as_tensor(state["weight"]).double() + torch.as_tensor(state["bias"]).double()
    return max(float((out.double() - exact).abs().max()), FLOAT64_FLOOR)


def _layer_norm_gradients(cls, d, eps, state, x, upstream):
    layer = _load(cls(d) if eps is None else cls(d, eps=eps), state)
    xx = x.clone().requires_grad_(True)
    out = layer(xx)
    (out * upstream).sum().backward()
    params = dict(layer.named_parameters())
    return (out.detach(), xx.grad) + tuple(params[n].grad if n in params else None for n in ("weight", "bias"))


def _layer_norm_gradient_cases(rng):
    cases = []
    for d, eps, shape in [(8, None, (2, 5, 8)), (5, 0.1, (4, 5)), (16, None, (2, 2, 3, 16))]:
        state, x, upstream = _ln_state(rng, d), tensor(rng, *shape), tensor(rng, *shape)
        cases.append(Case(f"{_ln_text(d, eps)} on x of shape {list(shape)}, backpropagating a random linear function "
                          "of the output (returns output, x.grad, weight.grad, bias.grad)",
                          lambda cls, d=d, eps=eps, s=state, x=x, u=upstream:
                          _layer_norm_gradients(cls, d, eps, s, x, u)))
    return cases


LN_SOURCE = """
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        x_hat = (x - mean) / torch.sqrt(var + self.eps)
        return x_hat * self.weight + self.bias
"""
_LN_MEAN = "mean = x.mean(dim=-1, keepdim=True)"
_LN_VAR = "var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)"
_LN_HAT = "x_hat = (x - mean) / torch.sqrt(var + self.eps)"
_LN_OUT = "return x_hat * self.weight + self.bias"
LN_MISTAKES = (
    Mistake("the unbiased variance (dividing by D - 1, as x.var() and x.std() do by default)",
            "LayerNorm divides by D, the number of features: ((x - mean) ** 2).mean(-1), or "
            "x.var(-1, unbiased=False). (The Annotated Transformer's (x - mean) / (x.std(-1) + eps) has a second "
            "difference: eps goes inside the square root, (x - mean) / sqrt(var + eps).)",
            variant(LN_SOURCE, (_LN_VAR, "var = x.var(dim=-1, keepdim=True)"))),
    Mistake("the variance as E[x²] − E[x]² (it loses its digits in float32 when the mean is large)",
            "take the variance of the centred values, ((x - mean) ** 2).mean(-1) or x.var(-1, unbiased=False): "
            "E[x²] − mean² subtracts two large, nearly equal numbers, and with a mean of 100 float32 keeps only a few "
            "digits of their difference",
            variant(LN_SOURCE, (_LN_VAR, "var = (x * x).mean(dim=-1, keepdim=True) - mean * mean"))),
    Mistake("eps added outside the square root: (x - mean) / (std + eps)",
            "eps goes inside: (x - mean) / sqrt(var + eps) — it matters when the variance is small, "
            "or eps large",
            variant(LN_SOURCE, (_LN_HAT, "x_hat = (x - mean) / (torch.sqrt(var) + self.eps)"))),
    Mistake("normalized over the batch axis (dim 0, BatchNorm's axis) instead of the features",
            "LayerNorm normalizes each position's vector on its own: mean and variance over the last "
            "axis, dim=-1",
            variant(LN_SOURCE, (_LN_MEAN, "mean = x.mean(dim=0, keepdim=True)"),
                    (_LN_VAR, "var = ((x - mean) ** 2).mean(dim=0, keepdim=True)"))),
    Mistake("normalized over the whole tensor (one mean and variance for everything)",
            "each position gets its own mean and variance, over its D features: dim=-1, keepdim=True",
            variant(LN_SOURCE, (_LN_MEAN, "mean = x.mean()"), (_LN_VAR, "var = ((x - mean) ** 2).mean()"))),
    Mistake("the learned weight and bias are never applied (no affine step)",
            "after normalizing, scale and shift: x_hat * self.weight + self.bias",
            variant(LN_SOURCE, (_LN_OUT, "return x_hat"))),
    Mistake("scale and shift in the wrong order: (x_hat + bias) * weight",
            "scale first, then shift: x_hat * weight + bias",
            variant(LN_SOURCE, (_LN_OUT, "return (x_hat + self.bias) * self.weight"))),
)
_LN_BUILT_IN = ("it calls one of PyTorch's built-in normalizations ({name}), which computes the mean and variance "
                "and normalizes for you: the computation this exercise asks you to write yourself (mean, variance, "
                "divide, then weight and bias)")
# Every public spelling of PyTorch's normalizations: with one group, one instance or the input transposed, a group,
# instance or batch norm is a layer norm (a red team's torch.native_layer_norm and F.group_norm(x, 1) took full
# points). Their kernels are refused too, by name (core._KERNELS: torch.ops.aten.native_layer_norm, ...).
LN_BUILT_INS = (
    (nn.LayerNorm.forward, "nn.LayerNorm"), (nn.GroupNorm.forward, "nn.GroupNorm"), (nn.RMSNorm.forward, "nn.RMSNorm"),
    (nn.modules.batchnorm._BatchNorm.forward, "nn.BatchNorm"),
    (nn.modules.instancenorm._InstanceNorm.forward, "nn.InstanceNorm"),
    *((getattr(F, n), f"F.{n}") for n in ("layer_norm", "group_norm", "instance_norm", "batch_norm", "rms_norm")),
    *((getattr(torch, n), f"torch.{n}") for n in (
        "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "instance_norm", "batch_norm",
        "native_batch_norm", "_native_batch_norm_legit", "_batch_norm_impl_index", "rms_norm", "_fused_rms_norm")
      if hasattr(torch, n)))
LN_FORBIDDEN = HONESTY + tuple((f, _LN_BUILT_IN.format(name=name)) for f, name in LN_BUILT_INS)


# --------------------------------------------------------------------------- cases: modules
def _ff_cases(rng):
    cases = []
    for d, d_ff, p, shape in [(8, 32, 0.0, (2, 5, 8)), (6, 12, 0.2, (3, 4, 6)), (16, 64, 0.0, (1, 1, 16)),
                              (8, 16, 0.0, (5, 8))]:
        state = random_state(ref.FeedForward(d, d_ff), rng)
        x = tensor(rng, *shape)
        run = (lambda cls, d=d, d_ff=d_ff, p=p, s=state, x=x: _no_grad(lambda: _load(cls(d, d_ff, dropout=p), s)(x.clone())))
        cases.append(_in_evaluation_mode(f"FeedForward({d}, {d_ff}, dropout={p}) in evaluation mode on x of shape "
                                         f"{list(shape)}", run, p))
    cases.append(_ff_dropout_case(rng))
    return cases


def _ff_dropout_case(rng, d_ff=8, B=4, T=50, p=0.3):
    """FeedForward in training mode, seen through the output: linear2 is [identity; a row of ones] with no
    bias, so the output is [the hidden units after dropout, their sum]. Dropout after the ReLU gives, per
    hidden unit, 0 or relu(h) / (1 - p), and their sum in the last place; dropout after linear2 zeroes
    places independently (the last is no longer the sum), dropout on x changes the hidden units themselves."""
    d = d_ff + 1
    w1 = as_float32(rng.normal(size=(d_ff, d)) / np.sqrt(d))
    b1 = tensor(rng, d_ff, scale=0.1)
    state = {"linear1.weight": w1, "linear1.bias": b1,
             "linear2.weight": torch.cat([torch.eye(d_ff), torch.ones(1, d_ff)]), "linear2.bias": torch.zeros(d)}
    x = tensor(rng, B, T, d)

    def run(cls):
        layer = _load(cls(d, d_ff, dropout=p), state)
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out = layer(x.clone())
            layer.train()
            out_train = layer(x.clone())
        return out, out_train   # compared after _ff_dropout_verdict, in the trusted process

    return Case(f"FeedForward({d}, {d_ff}, dropout={p}) with linear2 set to [identity; a row of ones] (no bias), "
                f"so that in training mode the output shows the hidden units after dropout, on x of shape "
                f"{[B, T, d]} (returns the output in evaluation mode and [training mode changes the output, each "
                f"hidden unit is 0 or relu(linear1(x)) / (1 - p) and the last output is their sum: dropout sits "
                f"between the ReLU and linear2, about a fraction p = {p} of the active hidden units is dropped])",
                run, derive=_ff_dropout_verdict(p, d_ff))


def _ff_dropout_verdict(p: float, d_ff: int):
    """derive (trusted side): (eval output, training output) -> (eval output, [training mode changes the
    output, the training output is the hidden units after dropout and their sum, the fraction dropped
    is about p]). p and d_ff come from the case itself, not from the sandbox."""
    def verdict(result):
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"expected the outputs in evaluation and training mode, got {type(result).__name__}")
        out, out_train = result
        clean, noisy = numbers(out), numbers(out_train)
        if clean.shape != noisy.shape or clean.shape[-1] != d_ff + 1:
            raise ValueError(f"unexpected shapes: {clean.shape} and {noisy.shape}")
        hidden, picked, total = clean[..., :d_ff], noisy[..., :d_ff], noisy[..., d_ff]
        active = hidden > 1e-6
        dropped = np.abs(picked) <= 1e-6
        kept = np.isclose(picked, hidden / (1.0 - p), rtol=1e-4, atol=1e-6)
        pattern = bool((dropped | kept).all()) and bool(np.allclose(total, picked.sum(-1), rtol=1e-4, atol=1e-5))
        fraction = bool(active.any()) and abs(float(dropped[active].mean()) - p) < 0.1
        changed = not np.allclose(noisy, clean, rtol=1e-5, atol=1e-8)
        return out, np.array([changed, pattern, fraction])

    return verdict


def _in_evaluation_mode(description: str, run, p: float) -> Case:
    """A case of a module in evaluation mode; with dropout on (p > 0), run twice and told apart from a wrong value
    when its two results differ (core.same_both_times: dropout left on in evaluation mode)."""
    if p == 0:
        return Case(description, run)
    return Case(description, called_twice(run), derive=same_both_times())


def dropout_in_every_sublayer(built: str, make, paths: tuple[str, ...], x: torch.Tensor, p: float) -> Case:
    """A case: the module `make(cls)` returns (built with dropout `p`), in training mode, calls each sublayer
    the graded API names (`paths`, dotted: 'ff', 'encoder_layers.0.self_attn') twice on x and returns the
    outputs; the verdict, in the trusted process, is whether each gave two different outputs. A layer that
    builds its attention or feed-forward without passing `dropout` on has deterministic sublayers, which no
    evaluation-mode case and no dropout=1.0 case (the residual dropout hides them) can tell."""
    def run(cls):
        module = make(cls).train()
        outputs = []
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for path in paths:
                sublayer = module.get_submodule(path)
                for _ in range(2):
                    out = sublayer(x.clone())
                    outputs.append(out[0] if isinstance(out, tuple) else out)
        return outputs   # compared after the verdict below, in the trusted process

    def verdict(outputs):
        if not isinstance(outputs, (tuple, list)) or len(outputs) != 2 * len(paths):
            raise TypeError(f"expected two outputs of each of {len(paths)} sublayers, got {type(outputs).__name__}")
        twice = [(numbers(outputs[2 * i]), numbers(outputs[2 * i + 1])) for i in range(len(paths))]
        return np.array([a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-8) for a, b in twice])

    named = ", ".join(f"{built.split('(')[0].lower()}.{path}" for path in paths)
    return Case(f"{built} in training mode, dropout={p}: {named} each called twice on x {list(x.shape)} (returns, "
                f"for each, whether its two outputs differ: dropout inside every sublayer, the layer passing "
                f"`dropout` on to the attention and feed-forward it builds)", run, derive=verdict)


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def _encode(cls, cfg, state, x, mask, training=False):
    d, H, d_ff, p, norm_first = cfg
    layer = _load(cls(d, H, d_ff, dropout=p, norm_first=norm_first), state)
    layer.train(training)
    with torch.no_grad():
        return layer(x.clone()) if mask is None else layer(x.clone(), mask=mask.clone())


def _cfg_text(name, cfg):
    d, H, d_ff, p, nf = cfg
    return f"{name}(d_model={d}, num_heads={H}, d_ff={d_ff}, dropout={p}, norm_first={nf}) in evaluation mode"


_DROP_ALL = ("dropout=1.0 in training mode: every dropout drops everything, so each sublayer's output adds "
             "nothing to the residual path and the output is {what} (a layer without dropout on each sublayer's "
             "output, just before it is added to x, adds the last linear layers' biases)")


def _drop_all_case(name, norm_first, state, run, shapes, sublayers):
    what = "x itself" if norm_first else " of ".join(f"norm{i}" for i in range(sublayers, 0, -1)) + "(x)"
    cfg_text = _cfg_text(name, (16, 4, 32, 1.0, norm_first)).replace(" in evaluation mode", "")
    return Case(f"{cfg_text}, {shapes}, {_DROP_ALL.format(what=what)}", run)


def _encoder_cases(rng, norm_first):
    cases = []
    settings = [((16, 4, 32, 0.0), 2, 5, None), ((16, 4, 32, 0.1), 2, 5, "padding"),
                ((12, 3, 20, 0.0), 3, 7, "random"), ((8, 2, 16, 0.0), 2, 6, "causal")]
    for (d, H, d_ff, p), B, T, kind in settings:
        cfg = (d, H, d_ff, p, norm_first)
        state = random_state(ref.EncoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x = tensor(rng, B, T, d)
        mask = {None: None, "padding": _keep(rng, B, T)[:, None, None, :],
                "random": (random_mask(rng, B, 1, T, T, p_keep=0.5, keep_column=RANDOM_COLUMN)
                           | torch.eye(T, dtype=torch.bool)),
                "causal": torch.ones(T, T, dtype=torch.bool).tril()}[kind]
        what = {None: "no mask", "padding": f"a padding mask [{B}, 1, 1, {T}]",
                "random": f"a random mask [{B}, 1, {T}, {T}]", "causal": f"a causal mask [{T}, {T}]"}[kind]
        cases.append(_in_evaluation_mode(f"{_cfg_text('EncoderLayer', cfg)}, x [{B}, {T}, {d}], {what}",
                                         lambda cls, c=cfg, s=state, x=x, m=mask: _encode(cls, c, s, x, m), p))
    # agreement with PyTorch's layer (weights mapped in, masks converted to its True = blocked)
    d, H, d_ff, B, T = 16, 2, 24, 3, 6
    torch_layer = _fill_torch(nn.TransformerEncoderLayer(d, H, d_ff, dropout=0.0, batch_first=True,
                                                         norm_first=norm_first), rng)
    x, keep = tensor(rng, B, T, d), _keep(rng, B, T)
    with torch.enable_grad():
        theirs = torch_layer(x.clone(), src_key_padding_mask=~keep).detach()
    state, cfg = ref.state_dict_from_torch(torch_layer), (d, H, d_ff, 0.0, norm_first)
    cases.append(Case(f"nn.TransformerEncoderLayer(norm_first={norm_first}) weights loaded into your layer, "
                      f"x [{B}, {T}, {d}] with padding: your output minus PyTorch's (should be 0)",
                      lambda cls, c=cfg, s=state, x=x, m=keep[:, None, None, :], t=theirs:
                      _encode(cls, c, s, x, m) - t))
    cfg = (16, 4, 32, 1.0, norm_first)
    state, x = random_state(ref.EncoderLayer(16, 4, 32, norm_first=norm_first), rng), tensor(rng, 2, 5, 16)
    cases.append(_drop_all_case("EncoderLayer", norm_first, state, lambda cls, c=cfg, s=state, x=x:
                                _encode(cls, c, s, x, None, training=True), "x [2, 5, 16], no mask", 2))
    built = f"EncoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.5, norm_first={norm_first})"
    cases.append(dropout_in_every_sublayer(built, lambda cls, s=state: _load(cls(16, 4, 32, dropout=0.5,
                                           norm_first=norm_first), s), ("self_attn", "ff"), x, 0.5))
    # called on x itself: a residual added in place (`x += ...`) changed the caller's x, and breaks backward
    state = random_state(ref.EncoderLayer(16, 4, 32, norm_first=norm_first), rng)
    cases.append(keeps_inputs(f"{_cfg_text('EncoderLayer', (16, 4, 32, 0.0, norm_first))}, x [2, 5, 16], no mask",
                              lambda cls, x, s=state: _no_grad(lambda: _load(cls(16, 4, 32, dropout=0.0,
                                                                                 norm_first=norm_first), s).eval()(x)),
                              tensor(rng, 2, 5, 16)))
    return cases


def _encoder_padding_cases(rng):
    cases = []
    for norm_first in (False, True):
        d, H, d_ff, B, T, extra = 16, 4, 32, 2, 5, 3
        cfg = (d, H, d_ff, 0.0, norm_first)
        state = random_state(ref.EncoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x = tensor(rng, B, T, d)
        keep = _keep(rng, B, T, min_len=2)
        padded = torch.cat([x, tensor(rng, B, extra, d)], dim=1)
        keep_padded = torch.cat([keep, torch.zeros(B, extra, dtype=torch.bool)], dim=1)
        real = keep[..., None].float()

        def run(cls, c=cfg, s=state, x=x, padded=padded, keep=keep, keep_padded=keep_padded, real=real, T=T):
            short = _encode(cls, c, s, x, keep[:, None, None, :])
            long = _encode(cls, c, s, padded, keep_padded[:, None, None, :])
            return (long[:, :T] - short) * real
        cases.append(Case(f"{_cfg_text('EncoderLayer', cfg)}: {extra} more masked pads appended to x "
                          f"[{B}, {T}, {d}]; change of the outputs at the real positions (should be 0)", run))
    return cases


def _decode(cls, cfg, state, x, memory, tgt_mask, memory_mask, weights=False, training=False):
    d, H, d_ff, p, norm_first = cfg
    layer = _load(cls(d, H, d_ff, dropout=p, norm_first=norm_first), state)
    layer.train(training)
    kwargs = {"tgt_mask": tgt_mask.clone()}
    if memory_mask is not None:
        kwargs["memory_mask"] = memory_mask.clone()
    with torch.no_grad():
        out = layer(x.clone(), memory.clone(), **kwargs)
    if weights:
        return getattr(layer, "self_attn_weights", None), getattr(layer, "cross_attn_weights", None)
    return out


def _decoder_cases(rng, norm_first):
    cases = []
    # The first cases have as many source as target positions, so that a layer which mixes the two
    # up gives wrong numbers (which name its mistake) rather than a shape error.
    settings = [((16, 4, 32, 0.0), 2, 5, 5, "full"), ((16, 4, 32, 0.0), 2, 5, 5, "causal"),
                ((16, 4, 32, 0.1), 2, 4, 6, "causal"), ((12, 3, 24, 0.0), 3, 6, 3, "both")]
    for (d, H, d_ff, p), B, T, S, kind in settings:
        cfg = (d, H, d_ff, p, norm_first)
        state = random_state(ref.DecoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x, memory = tensor(rng, B, T, d), tensor(rng, B, S, d)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        if kind == "full":
            tgt_mask, memory_mask, what = torch.ones(T, T, dtype=torch.bool), None, "an all-True tgt_mask, no memory_mask"
        elif kind == "causal":
            tgt_mask, memory_mask = causal, _keep(rng, B, S)[:, None, None, :]
            what = f"a causal tgt_mask [{T}, {T}], a padding memory_mask [{B}, 1, 1, {S}]"
        else:
            tgt_mask = causal & _keep(rng, B, T)[:, None, None, :]
            memory_mask = _keep(rng, B, S)[:, None, None, :]
            what = f"tgt_mask = causal AND target padding [{B}, 1, {T}, {T}], a padding memory_mask"
        cases.append(_in_evaluation_mode(f"{_cfg_text('DecoderLayer', cfg)}, x [{B}, {T}, {d}], memory [{B}, {S}, "
                                         f"{d}], {what}",
                                         lambda cls, c=cfg, s=state, x=x, mem=memory, tm=tgt_mask, mm=memory_mask:
                                         _decode(cls, c, s, x, mem, tm, mm), p))
    d, H, d_ff, B, T, S = 16, 2, 24, 2, 5, 7
    torch_layer = _fill_torch(nn.TransformerDecoderLayer(d, H, d_ff, dropout=0.0, batch_first=True,
                                                         norm_first=norm_first), rng)
    x, memory = tensor(rng, B, T, d), tensor(rng, B, S, d)
    causal, src_keep = torch.ones(T, T, dtype=torch.bool).tril(), _keep(rng, B, S)
    with torch.enable_grad():
        theirs = torch_layer(x.clone(), memory.clone(), tgt_mask=~causal, memory_key_padding_mask=~src_keep).detach()
    state, cfg = ref.state_dict_from_torch(torch_layer), (d, H, d_ff, 0.0, norm_first)
    cases.append(Case(f"nn.TransformerDecoderLayer(norm_first={norm_first}) weights loaded into your layer, "
                      f"x [{B}, {T}, {d}], memory [{B}, {S}, {d}], causal and padding masks: your output minus "
                      "PyTorch's (should be 0)",
                      lambda cls, c=cfg, s=state, x=x, mem=memory, tm=causal, mm=src_keep[:, None, None, :],
                      t=theirs: _decode(cls, c, s, x, mem, tm, mm) - t))
    cfg = (16, 4, 32, 1.0, norm_first)
    state = random_state(ref.DecoderLayer(16, 4, 32, norm_first=norm_first), rng)
    x, memory, causal = tensor(rng, 2, 5, 16), tensor(rng, 2, 6, 16), torch.ones(5, 5, dtype=torch.bool).tril()
    cases.append(_drop_all_case("DecoderLayer", norm_first, state, lambda cls, c=cfg, s=state, x=x, mem=memory, m=causal:
                                _decode(cls, c, s, x, mem, m, None, training=True),
                                "x [2, 5, 16], memory [2, 6, 16], a causal tgt_mask", 3))
    built = f"DecoderLayer(d_model=16, num_heads=4, d_ff=32, dropout=0.5, norm_first={norm_first})"
    cases.append(dropout_in_every_sublayer(built, lambda cls, s=state: _load(cls(16, 4, 32, dropout=0.5,
                                           norm_first=norm_first), s), ("self_attn", "cross_attn", "ff"), x, 0.5))
    state = random_state(ref.DecoderLayer(16, 4, 32, norm_first=norm_first), rng)
    cases.append(keeps_inputs(f"{_cfg_text('DecoderLayer', (16, 4, 32, 0.0, norm_first))}, x [2, 5, 16], memory "
                              "[2, 6, 16], a causal tgt_mask",
                              lambda cls, x, memory, s=state, m=causal: _no_grad(
                                  lambda: _load(cls(16, 4, 32, dropout=0.0, norm_first=norm_first), s).eval()(
                                      x, memory, tgt_mask=m)), tensor(rng, 2, 5, 16), tensor(rng, 2, 6, 16)))
    return cases


def _causal_leak_cases(rng):
    cases = []
    for norm_first, (B, T, S, t) in [(False, (2, 6, 6, 3)), (True, (2, 5, 5, 2)), (False, (2, 6, 4, 1))]:
        d, H, d_ff = 16, 4, 32
        cfg = (d, H, d_ff, 0.0, norm_first)
        state = random_state(ref.DecoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x, memory = tensor(rng, B, T, d), tensor(rng, B, S, d)
        changed = x.clone()
        changed[:, t:] = tensor(rng, B, T - t, d)
        causal = torch.ones(T, T, dtype=torch.bool).tril()

        def run(cls, c=cfg, s=state, x=x, changed=changed, mem=memory, m=causal, t=t):
            return (_decode(cls, c, s, changed, mem, m, None) - _decode(cls, c, s, x, mem, m, None))[:, :t]
        cases.append(Case(f"{_cfg_text('DecoderLayer', cfg)} with a causal tgt_mask: the target tokens at "
                          f"positions {t}..{T - 1} replaced; change of the outputs at positions 0..{t - 1} "
                          "(should be 0: the future must not leak)", run))
    return cases


def _decoder_padding_cases(rng):
    cases = []
    for norm_first in (False, True):
        d, H, d_ff, B, T = 16, 4, 32, 2, 6
        cfg = (d, H, d_ff, 0.0, norm_first)
        state = random_state(ref.DecoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x, memory = tensor(rng, B, T, d), tensor(rng, B, T, d)
        src_keep = _keep(rng, B, T, min_len=2)
        other = torch.where(src_keep[..., None], memory, tensor(rng, B, T, d))
        causal = torch.ones(T, T, dtype=torch.bool).tril()

        def run(cls, c=cfg, s=state, x=x, mem=memory, other=other, k=src_keep[:, None, None, :], m=causal):
            return _decode(cls, c, s, x, other, m, k) - _decode(cls, c, s, x, mem, m, k)
        cases.append(Case(f"{_cfg_text('DecoderLayer', cfg)}: memory [{B}, {T}, {d}] with padding (memory_mask), "
                          "the pad vectors replaced; change of the outputs (should be 0)", run))
    for norm_first in (False, True):
        d, H, d_ff, B, T, S, extra = 16, 4, 32, 2, 4, 5, 3
        cfg = (d, H, d_ff, 0.0, norm_first)
        state = random_state(ref.DecoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x, memory = tensor(rng, B, T, d), tensor(rng, B, S, d)
        src_keep = _keep(rng, B, S, min_len=2)
        padded = torch.cat([memory, tensor(rng, B, extra, d)], dim=1)
        keep_padded = torch.cat([src_keep, torch.zeros(B, extra, dtype=torch.bool)], dim=1)
        causal = torch.ones(T, T, dtype=torch.bool).tril()

        def run(cls, c=cfg, s=state, x=x, mem=memory, padded=padded, k=src_keep, kp=keep_padded, m=causal):
            return (_decode(cls, c, s, x, padded, m, kp[:, None, None, :])
                    - _decode(cls, c, s, x, mem, m, k[:, None, None, :]))
        cases.append(Case(f"{_cfg_text('DecoderLayer', cfg)}: {extra} more masked pads appended to the memory "
                          f"[{B}, {S}, {d}]; change of the outputs (should be 0)", run))
    return cases


def _decoder_weight_cases(rng):
    cases = []
    for norm_first, (B, H, T, S) in [(False, (2, 4, 4, 4)), (False, (2, 4, 3, 4)), (True, (1, 2, 5, 3))]:
        d, d_ff = 16, 32
        cfg = (d, H, d_ff, 0.0, norm_first)
        state = random_state(ref.DecoderLayer(d, H, d_ff, norm_first=norm_first), rng)
        x, memory = tensor(rng, B, T, d), tensor(rng, B, S, d)
        causal, src_keep = torch.ones(T, T, dtype=torch.bool).tril(), _keep(rng, B, S)[:, None, None, :]
        cases.append(Case(f"{_cfg_text('DecoderLayer', cfg)}, x [{B}, {T}, {d}], memory [{B}, {S}, {d}]: "
                          f"(self_attn_weights [B, H, T, T], cross_attn_weights [B, H, T, S]) after forward",
                          lambda cls, c=cfg, s=state, x=x, mem=memory, tm=causal, mm=src_keep:
                          _decode(cls, c, s, x, mem, tm, mm, weights=True)))
    return cases


# --------------------------------------------------------------------------- mistakes
CAUSAL_MISTAKES = (
    Mistake("off-by-one diagonal: strictly below the diagonal (a token may not attend to itself)",
            "the diagonal is allowed: query i may attend to keys 0..i, so use .tril() (diagonal=0), not .tril(-1)",
            "def causal_mask(size):\n    return torch.ones(size, size, dtype=torch.bool).tril(-1)"),
    Mistake("off-by-one diagonal: each token also sees the next one",
            "query i may attend to keys 0..i only: .tril() (diagonal=0), not .tril(1)",
            "def causal_mask(size):\n    return torch.ones(size, size, dtype=torch.bool).tril(1)"),
    Mistake("a mask that keeps the future (the upper triangle)",
            "True must be on and *below* the diagonal (the past): .tril(), not .triu()",
            "def causal_mask(size):\n    return torch.ones(size, size, dtype=torch.bool).triu()"),
    Mistake("PyTorch's nn.Transformer convention: True above the diagonal (True = blocked)",
            "in this course True means 'may attend': return the lower triangle, .tril()",
            "def causal_mask(size):\n    return torch.ones(size, size, dtype=torch.bool).triu(1)"),
    Mistake("a float 0/1 mask instead of booleans",
            "build it with dtype=torch.bool (or call .bool())",
            "def causal_mask(size):\n    return torch.ones(size, size).tril()"),
    Mistake("an additive float mask (0 and -inf) instead of booleans",
            "return booleans (True = may attend); the -inf goes into the scores inside the softmax",
            "def causal_mask(size):\n"
            "    return torch.zeros(size, size).masked_fill(torch.ones(size, size, dtype=torch.bool).triu(1), float('-inf'))"),
)

_NONE = "def masked_softmax(scores, mask=None):\n    if mask is None:\n        return torch.softmax(scores, dim=-1)\n"
SOFTMAX_MISTAKES = (
    Mistake("mask=None not handled (the mask is optional)",
            "without a mask, masked_softmax is a plain softmax over the keys: start with if mask is None: return "
            "torch.softmax(scores, dim=-1)",
            "def masked_softmax(scores, mask=None):\n"
            "    w = torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1)\n"
            "    return torch.nan_to_num(w.masked_fill(~mask, 0.0))"),
    Mistake("mask applied after the softmax (masked weights zeroed, the rest not renormalized)",
            "fill the masked *scores* with -inf before the softmax, so the allowed weights sum to 1",
            _NONE + "    return torch.softmax(scores, dim=-1) * mask"),
    Mistake("mask convention inverted (True treated as 'blocked', PyTorch's nn convention)",
            "True means 'may attend': fill where the mask is False, scores.masked_fill(~mask, float('-inf'))",
            _NONE + "    w = torch.softmax(scores.masked_fill(mask, float('-inf')), dim=-1)\n"
            "    return w.masked_fill(mask, 0.0)"),
    # the same without the zeroing after the softmax: an inverted causal mask leaves its last row with no key, NaN
    Mistake("mask convention inverted (True treated as 'blocked', PyTorch's nn convention): the row that may see "
            "every key becomes fully masked and gives NaN",
            "True means 'may attend': fill where the mask is False, scores.masked_fill(~mask, float('-inf')), not "
            "masked_fill(mask, ...); then zero the masked weights after the softmax, w.masked_fill(~mask, 0.0), so "
            "that a row with no allowed key gives zeros, not NaN",
            _NONE + "    return torch.softmax(scores.masked_fill(mask, float('-inf')), dim=-1)"),
    Mistake("masked scores set to 0 (or multiplied by the mask) instead of -inf",
            "exp(0) = 1 is not 'no weight': masked scores must be -inf so that exp gives 0",
            _NONE + "    return torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)"),
    Mistake("softmax over the wrong axis (not the keys' axis, dim=-1)",
            "each query's row of weights sums to 1: softmax over the keys, dim=-1",
            _NONE + "    w = torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-2)\n"
            "    return torch.nan_to_num(w.masked_fill(~mask, 0.0))"),
    Mistake("softmax written by hand without subtracting the row's max (exp overflows past a score of about 88)",
            "exp() of a score above about 88 is inf in float32, and inf / inf is NaN: subtract each row's max "
            "(over the allowed scores) before exp(), or use torch.softmax, which does it for you",
            _NONE + "    e = torch.exp(scores) * mask\n"
            "    total = e.sum(dim=-1, keepdim=True)\n"
            "    return e / torch.where(total > 0, total, torch.ones_like(total))"),
    Mistake(MAX_OVER_MASKED,
            "fill the masked scores with -inf *before* taking the max and exp(), scores.masked_fill(~mask, "
            "float('-inf')), and zero the masked weights after; multiplying exp(scores - max) by the mask afterwards "
            "lets a forbidden key set the max",
            _NONE + "    e = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * mask\n"
            "    total = e.sum(dim=-1, keepdim=True)\n"
            "    return e / torch.where(total > 0, total, torch.ones_like(total))"),
)

FULLY_MASKED_MISTAKES = (
    Mistake("fully masked rows give NaN (softmax of a row of -inf)",
            "after the softmax, set the masked entries to 0 (weights.masked_fill(~mask, 0.0)): "
            "a row with no allowed key then becomes all zeros",
            _NONE + "    return torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-1)"),
    Mistake("a large negative number (-1e9) instead of -inf: fully masked rows become uniform",
            "-1e9 is fine for rows with an allowed key, but a row with none becomes a uniform average of "
            "forbidden keys: zero the masked entries after the softmax",
            _NONE + "    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)"),
) + SOFTMAX_MISTAKES

PADDING_MISTAKES = (
    Mistake("padding mask True on the pads (nn's key_padding_mask convention)",
            "in this course True means 'may attend': tokens != pad_id",
            "def padding_mask(tokens, pad_id):\n    return (tokens == pad_id)[:, None, None, :]"),
    Mistake("shape [B, T]: the head and query axes are missing",
            "add two axes so it broadcasts over heads and queries: [:, None, None, :] gives [B, 1, 1, T]",
            "def padding_mask(tokens, pad_id):\n    return tokens != pad_id"),
    Mistake("mask over the queries, shape [B, 1, T, 1]",
            "pads are masked as *keys*: the last axis is the key axis, so the shape is [B, 1, 1, T]",
            "def padding_mask(tokens, pad_id):\n    return (tokens != pad_id)[:, None, :, None]"),
    Mistake("compared with 0 instead of pad_id",
            "use the pad_id argument: tokens != pad_id",
            "def padding_mask(tokens, pad_id):\n    return (tokens != 0)[:, None, None, :]"),
    Mistake("a float 0/1 mask instead of booleans",
            "tokens != pad_id is already boolean: don't convert it with .float()",
            "def padding_mask(tokens, pad_id):\n    return (tokens != pad_id)[:, None, None, :].float()"),
)

FF_SOURCE = """
class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, dropout=0.0):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))
"""
_FF_LINE = "return self.linear2(self.dropout(torch.relu(self.linear1(x))))"
FF_MISTAKES = (
    Mistake("no ReLU between the two linear layers",
            "without the non-linearity the two layers collapse into one linear map: relu(linear1(x))",
            variant(FF_SOURCE, (_FF_LINE, "return self.linear2(self.dropout(self.linear1(x)))"))),
    Mistake("a ReLU after the second linear layer too",
            "the output is linear2(...) as it comes: only the hidden layer has a ReLU",
            variant(FF_SOURCE, (_FF_LINE, "return torch.relu(self.linear2(self.dropout(torch.relu(self.linear1(x)))))"))),
    Mistake("GELU instead of ReLU",
            "the paper's (and this notebook's) feed-forward uses ReLU: torch.relu",
            variant(FF_SOURCE, (_FF_LINE, "return self.linear2(self.dropout(F.gelu(self.linear1(x))))"))),
    Mistake("dropout after linear2 (on the output) instead of after the ReLU",
            "in the feed-forward, dropout goes on the hidden units, between the ReLU and linear2: "
            "linear2(dropout(relu(linear1(x)))); the dropout on the sublayer's output belongs to the "
            "encoder and decoder layers",
            variant(FF_SOURCE, (_FF_LINE, "return self.dropout(self.linear2(torch.relu(self.linear1(x))))"))),
    Mistake("dropout never applied",
            "keep an nn.Dropout(dropout) and apply it to the hidden units: linear2(dropout(relu(linear1(x))))",
            variant(FF_SOURCE, (_FF_LINE, "return self.linear2(torch.relu(self.linear1(x)))"))),
    Mistake("a residual connection inside the feed-forward (x + FFN(x))",
            "FeedForward returns FFN(x) only: the encoder and decoder layers add the residual",
            variant(FF_SOURCE, (_FF_LINE, "return x + self.linear2(self.dropout(torch.relu(self.linear1(x))))"))),
)

ENCODER_SOURCE = """
class EncoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, mask=None):
        if self.norm_first:
            x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])
            x = x + self.dropout(self.ff(self.norm2(x)))
        else:
            x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))
            x = self.norm2(x + self.dropout(self.ff(x)))
        return x
"""
_PRE_SA = "x = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])"
_PRE_FF = "x = x + self.dropout(self.ff(self.norm2(x)))"
_POST_SA = "x = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))"
_POST_FF = "x = self.norm2(x + self.dropout(self.ff(x)))"
_IND = "\n            "

ENCODER_MISTAKES = (
    Mistake("missing residual connection around self-attention",
            "add the sublayer's input back: norm1(x + self_attn(...)) (post-norm), x + self_attn(norm1(x)) (pre-norm)",
            variant(ENCODER_SOURCE, (_PRE_SA, "x = self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])"),
                    (_POST_SA, "x = self.norm1(self.dropout(self.self_attn(x, mask=mask)[0]))"))),
    Mistake("missing residual connection around the feed-forward",
            "add the sublayer's input back: norm2(x + ff(x)) (post-norm), x + ff(norm2(x)) (pre-norm)",
            variant(ENCODER_SOURCE, (_PRE_FF, "x = self.dropout(self.ff(self.norm2(x)))"),
                    (_POST_FF, "x = self.norm2(self.dropout(self.ff(x)))"))),
    Mistake("the self-attention mask is ignored",
            "pass the mask on: self.self_attn(x, mask=mask)",
            variant(ENCODER_SOURCE, ("mask=mask)[0])", "mask=None)[0])"))),
    Mistake("the mask is inverted (~mask, PyTorch's True = blocked convention)",
            "MultiHeadAttention takes this course's convention, True = may attend: pass the mask as it is",
            variant(ENCODER_SOURCE, ("mask=mask)[0])", "mask=None if mask is None else ~mask)[0])"))),
    Mistake("the mask passed as the second positional argument, self_attn(x, mask): it becomes the keys",
            "MultiHeadAttention's positional arguments are query, key, value: pass the mask by name, "
            "self.self_attn(x, mask=mask)",
            variant(ENCODER_SOURCE, ("self.self_attn(self.norm1(x), mask=mask)", "self.self_attn(self.norm1(x), mask)"),
                    ("self.self_attn(x, mask=mask)", "self.self_attn(x, mask)"))),
    Mistake("LayerNorm applied to the sublayer's output before the residual add: x + norm(sublayer(x))",
            "post-norm normalizes the sum: norm1(x + self_attn(x)), norm2(x + ff(x))",
            variant(ENCODER_SOURCE, (_POST_SA, "x = x + self.norm1(self.dropout(self.self_attn(x, mask=mask)[0]))"),
                    (_POST_FF, "x = x + self.norm2(self.dropout(self.ff(x)))"))),
    Mistake("norm1 used for both sublayers (norm2 never used)",
            "each sublayer has its own LayerNorm: norm1 around self-attention, norm2 around the feed-forward",
            variant(ENCODER_SOURCE, ("self.ff(self.norm2(x))", "self.ff(self.norm1(x))"),
                    (_POST_FF, "x = self.norm1(x + self.dropout(self.ff(x)))"))),
    Mistake("the feed-forward applied to the layer's input instead of the attention sublayer's output",
            "the sublayers are chained: the feed-forward sublayer takes the result of the attention sublayer",
            variant(ENCODER_SOURCE,
                    (_PRE_SA + _IND + _PRE_FF,
                     "h = x + self.dropout(self.self_attn(self.norm1(x), mask=mask)[0])" + _IND
                     + "x = h + self.dropout(self.ff(self.norm2(x)))"),
                    (_POST_SA + _IND + _POST_FF,
                     "h = self.norm1(x + self.dropout(self.self_attn(x, mask=mask)[0]))" + _IND
                     + "x = self.norm2(h + self.dropout(self.ff(x)))"))),
    Mistake("no dropout on the sublayers' outputs (before each residual add)",
            "the output of each sublayer goes through dropout before it is added back: "
            "norm1(x + dropout(self_attn(x, ...))) (post-norm), x + dropout(self_attn(norm1(x), ...)) (pre-norm); "
            "the dropout inside attention and the feed-forward is not the same one",
            variant(ENCODER_SOURCE, ("x + self.dropout(self.self_attn(", "x + (self.self_attn("),
                    ("x + self.dropout(self.ff(", "x + (self.ff("))),
    Mistake("norm_first ignored (always post-norm)",
            "with norm_first=True: x = x + self_attn(norm1(x)); x = x + ff(norm2(x))",
            variant(ENCODER_SOURCE, ("if self.norm_first:", "if False:"))),
    # seen only by the training-mode case that calls each sublayer twice (evaluation mode switches dropout off, and
    # with dropout=1.0 the residual dropout hides what the sublayer does): named instead of "expected True, got False"
    Mistake("the feed-forward built without the layer's dropout (FeedForward(d_model, d_ff): its dropout stays 0)",
            "pass the dropout on: self.ff = FeedForward(d_model, d_ff, dropout). FeedForward's dropout defaults to 0.0, "
            "so without it the feed-forward never drops a hidden unit in training",
            variant(ENCODER_SOURCE, ("FeedForward(d_model, d_ff, dropout)", "FeedForward(d_model, d_ff)"))),
    Mistake("the self-attention built without the layer's dropout (MultiHeadAttention(d_model, num_heads): its "
            "dropout stays 0)",
            "pass the dropout on: MultiHeadAttention(d_model, num_heads, dropout=dropout). Its dropout defaults to 0.0, "
            "so without it the attention weights are never dropped in training",
            variant(ENCODER_SOURCE, ("MultiHeadAttention(d_model, num_heads, dropout=dropout)",
                                     "MultiHeadAttention(d_model, num_heads)"))),
    Mistake("pre-norm that normalizes the residual stream itself (x = norm(x); x = x + sublayer(x))",
            "in pre-norm the residual path is never normalized: x = x + self_attn(norm1(x)), not x = norm1(x) first",
            variant(ENCODER_SOURCE, (_PRE_SA + _IND + _PRE_FF,
                                     "x = self.norm1(x)" + _IND
                                     + "x = x + self.dropout(self.self_attn(x, mask=mask)[0])" + _IND
                                     + "x = self.norm2(x)" + _IND + "x = x + self.dropout(self.ff(x))"))),
)

DECODER_SOURCE = """
class DecoderLayer(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first
        self.self_attn_weights = None
        self.cross_attn_weights = None

    def forward(self, x, memory, tgt_mask=None, memory_mask=None):
        if self.norm_first:
            h = self.norm1(x)
            sa, self.self_attn_weights = self.self_attn(h, h, h, mask=tgt_mask)
            x = x + self.dropout(sa)
            h = self.norm2(x)
            ca, self.cross_attn_weights = self.cross_attn(h, memory, memory, mask=memory_mask)
            x = x + self.dropout(ca)
            x = x + self.dropout(self.ff(self.norm3(x)))
        else:
            sa, self.self_attn_weights = self.self_attn(x, x, x, mask=tgt_mask)
            x = self.norm1(x + self.dropout(sa))
            ca, self.cross_attn_weights = self.cross_attn(x, memory, memory, mask=memory_mask)
            x = self.norm2(x + self.dropout(ca))
            x = self.norm3(x + self.dropout(self.ff(x)))
        return x
"""

DECODER_MISTAKES = (
    Mistake("cross-attention fed the memory as query (and the decoder's states as keys and values)",
            "queries come from the decoder, keys and values from the encoder: cross_attn(x, memory, memory)",
            variant(DECODER_SOURCE, ("self.cross_attn(h, memory, memory,", "self.cross_attn(memory, h, h,"),
                    ("self.cross_attn(x, memory, memory,", "self.cross_attn(memory, x, x,"))),
    Mistake("a decoder without the causal mask (tgt_mask not given to self-attention)",
            "the decoder's self-attention must get the target mask: self_attn(x, x, x, mask=tgt_mask)",
            variant(DECODER_SOURCE, ("mask=tgt_mask)", "mask=None)"))),
    Mistake("a causal mask of the layer's own added to tgt_mask (tgt_mask=None or all True is still causal)",
            "the layer uses the masks it is given: the caller (the model) builds the causal tgt_mask; with an all-True "
            "tgt_mask every position may attend to every other",
            variant(DECODER_SOURCE, ("    def forward(self, x, memory, tgt_mask=None, memory_mask=None):\n",
                                     "    def forward(self, x, memory, tgt_mask=None, memory_mask=None):\n"
                                     "        own = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril()\n"
                                     "        tgt_mask = own if tgt_mask is None else tgt_mask & own\n"))),
    Mistake("tgt_mask and memory_mask swapped",
            "self-attention takes tgt_mask (causal, [T, T]); cross-attention takes memory_mask (the source's padding)",
            variant(DECODER_SOURCE, ("mask=tgt_mask)", "mask=MEMORY)"), ("mask=memory_mask)", "mask=tgt_mask)"),
                     ("mask=MEMORY)", "mask=memory_mask)"))),
    Mistake("memory_mask ignored (cross-attention sees the source's pads)",
            "pass the source's padding mask to cross-attention: cross_attn(x, memory, memory, mask=memory_mask)",
            variant(DECODER_SOURCE, ("mask=memory_mask)", "mask=None)"))),
    Mistake("cross-attention over the decoder's own states (the memory is never used)",
            "keys and values of cross-attention are the encoder's output: cross_attn(x, memory, memory)",
            variant(DECODER_SOURCE, ("self.cross_attn(h, memory, memory, mask=memory_mask)", "self.cross_attn(h, h, h)"),
                    ("self.cross_attn(x, memory, memory, mask=memory_mask)", "self.cross_attn(x, x, x)"))),
    Mistake("cross-attention queried with the layer's input instead of the self-attention sublayer's output",
            "the sublayers run one after the other: cross-attention's queries are x after the self-attention "
            "step (its residual add and norm1), not the x the layer was given",
            variant(DECODER_SOURCE, ("memory_mask=None):\n", "memory_mask=None):\n        x0 = x\n"),
                    ("h = self.norm2(x)", "h = self.norm2(x0)"),
                    ("self.cross_attn(x, memory, memory,", "self.cross_attn(x0, memory, memory,"))),
    Mistake("self_attn used for the cross-attention step too (cross_attn never used)",
            "the cross-attention step has its own module: self.cross_attn(x, memory, memory, ...)",
            variant(DECODER_SOURCE, ("= self.cross_attn(", "= self.self_attn("))),
    Mistake("missing residual connection around cross-attention",
            "add the sublayer's input back: norm2(x + cross_attn(...)) (post-norm), x + cross_attn(norm2(x), ...) (pre-norm)",
            variant(DECODER_SOURCE, ("x = x + self.dropout(ca)", "x = self.dropout(ca)"),
                    ("x = self.norm2(x + self.dropout(ca))", "x = self.norm2(self.dropout(ca))"))),
    Mistake("missing residual connection around self-attention",
            "add the sublayer's input back: norm1(x + self_attn(...)) (post-norm), x + self_attn(norm1(x)) (pre-norm)",
            variant(DECODER_SOURCE, ("x = x + self.dropout(sa)", "x = self.dropout(sa)"),
                    ("x = self.norm1(x + self.dropout(sa))", "x = self.norm1(self.dropout(sa))"))),
    Mistake("no dropout on the sublayers' outputs (before each residual add)",
            "the output of each sublayer goes through dropout before it is added back: "
            "norm1(x + dropout(sa)) (post-norm), x + dropout(sa) (pre-norm), and the same for cross-attention "
            "and the feed-forward; the dropout inside attention and the feed-forward is not the same one",
            variant(DECODER_SOURCE, ("x + self.dropout(sa)", "x + sa"), ("x + self.dropout(ca)", "x + ca"),
                    ("x + self.dropout(self.ff(", "x + (self.ff("))),
    Mistake("norm_first ignored (always post-norm)",
            "with norm_first=True each sublayer is x = x + sublayer(norm(x))",
            variant(DECODER_SOURCE, ("if self.norm_first:", "if False:"))),
    Mistake("the feed-forward built without the layer's dropout (FeedForward(d_model, d_ff): its dropout stays 0)",
            "pass the dropout on: self.ff = FeedForward(d_model, d_ff, dropout). FeedForward's dropout defaults to 0.0, "
            "so without it the feed-forward never drops a hidden unit in training",
            variant(DECODER_SOURCE, ("FeedForward(d_model, d_ff, dropout)", "FeedForward(d_model, d_ff)"))),
    Mistake("the attention sublayers built without the layer's dropout (MultiHeadAttention(d_model, num_heads): "
            "their dropout stays 0)",
            "pass the dropout on to both: MultiHeadAttention(d_model, num_heads, dropout=dropout) for self_attn and "
            "cross_attn. Its dropout defaults to 0.0, so without it the attention weights are never dropped in "
            "training",
            variant(DECODER_SOURCE, ("MultiHeadAttention(d_model, num_heads, dropout=dropout)",
                                     "MultiHeadAttention(d_model, num_heads)"))),
    Mistake("pre-norm that also normalizes the memory with norm2",
            "only the queries are normalized: cross_attn(norm2(x), memory, memory) — the memory is used as it comes",
            variant(DECODER_SOURCE, ("self.cross_attn(h, memory, memory,", "self.cross_attn(h, self.norm2(memory), self.norm2(memory),"))),
    Mistake("self-attention and cross-attention weights stored in each other's attribute",
            "self_attn_weights [B, H, T, T] come from self_attn, cross_attn_weights [B, H, T, S] from cross_attn",
            variant(DECODER_SOURCE, ("sa, self.self_attn_weights", "sa, self.SWAP"),
                    ("ca, self.cross_attn_weights", "ca, self.self_attn_weights"),
                    ("sa, self.SWAP", "sa, self.cross_attn_weights"))),
    Mistake("the attention weights are not kept (self_attn_weights / cross_attn_weights stay None)",
            "keep the second value MultiHeadAttention returns: out, self.self_attn_weights = self.self_attn(...)",
            variant(DECODER_SOURCE, ("sa, self.self_attn_weights", "sa, _"), ("ca, self.cross_attn_weights", "ca, _"))),
)

# The mistakes' code runs beside a correct FeedForward (a copy, not the reference: the reference is
# off limits to the code under test) and the course's MultiHeadAttention.
_env: dict = {"torch": torch, "nn": nn}
exec(FF_SOURCE, _env)  # our own code
NAMESPACE = {"MultiHeadAttention": MultiHeadAttention, "FeedForward": _env["FeedForward"]}
LAYER_FORBIDDEN = HONESTY + torch_attention(*TORCH_LAYERS, allowed=(F.scaled_dot_product_attention,))  # 02's step: allowed


def _exercise(name, reference, cases, mistakes, graded=None, forbidden=HONESTY):
    return Exercise(name, reference, cases, mistakes=mistakes, rtol=RTOL, atol=ATOL, forbidden=forbidden,
                    namespace=NAMESPACE, graded=graded or name)


EXERCISES = [
    _exercise("LayerNorm", ref.LayerNorm, _layer_norm_cases, LN_MISTAKES, forbidden=LN_FORBIDDEN),
    _exercise("LayerNorm_gradients", ref.LayerNorm, _layer_norm_gradient_cases, LN_MISTAKES, graded="LayerNorm",
              forbidden=LN_FORBIDDEN),
    _exercise("causal_mask", ref.causal_mask, _causal_cases, CAUSAL_MISTAKES),
    _exercise("masked_softmax", ref.masked_softmax, _softmax_cases, SOFTMAX_MISTAKES),
    _exercise("masked_softmax_fully_masked", ref.masked_softmax, _fully_masked_cases, FULLY_MASKED_MISTAKES,
              graded="masked_softmax"),
    _exercise("padding_mask", ref.padding_mask, _padding_cases, PADDING_MISTAKES),
    _exercise("FeedForward", ref.FeedForward, _ff_cases, FF_MISTAKES, forbidden=LAYER_FORBIDDEN),
    _exercise("EncoderLayer", ref.EncoderLayer, lambda rng: _encoder_cases(rng, False), ENCODER_MISTAKES,
              forbidden=LAYER_FORBIDDEN),
    _exercise("EncoderLayer_norm_first", ref.EncoderLayer, lambda rng: _encoder_cases(rng, True),
              ENCODER_MISTAKES, graded="EncoderLayer", forbidden=LAYER_FORBIDDEN),
    _exercise("EncoderLayer_padding", ref.EncoderLayer, _encoder_padding_cases, ENCODER_MISTAKES,
              graded="EncoderLayer", forbidden=LAYER_FORBIDDEN),
    _exercise("DecoderLayer", ref.DecoderLayer, lambda rng: _decoder_cases(rng, False), DECODER_MISTAKES,
              forbidden=LAYER_FORBIDDEN),
    _exercise("DecoderLayer_norm_first", ref.DecoderLayer, lambda rng: _decoder_cases(rng, True),
              DECODER_MISTAKES, graded="DecoderLayer", forbidden=LAYER_FORBIDDEN),
    _exercise("DecoderLayer_causal", ref.DecoderLayer, _causal_leak_cases, DECODER_MISTAKES,
              graded="DecoderLayer", forbidden=LAYER_FORBIDDEN),
    _exercise("DecoderLayer_padding", ref.DecoderLayer, _decoder_padding_cases, DECODER_MISTAKES,
              graded="DecoderLayer", forbidden=LAYER_FORBIDDEN),
    _exercise("DecoderLayer_weights", ref.DecoderLayer, _decoder_weight_cases, DECODER_MISTAKES,
              graded="DecoderLayer", forbidden=LAYER_FORBIDDEN),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"EncoderLayer": ("FeedForward",), "DecoderLayer": ("FeedForward",)}
