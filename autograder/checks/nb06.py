"""Checks for notebook 06, "A Transformer translator" (PyTorch, CPU, tiny and deterministic).

* Masks, the loss and the learning-rate schedule are compared with the reference on random
  inputs (pad ids other than 0, ignore_index both a pad id and -100, large logits).
* The learner's `Seq2SeqTransformer` is compared with the library's (attention_course.model) with one
  random state dict loaded into both: the logits of forward and of encode/decode (post- and pre-norm,
  shared and separate embeddings, padded sources and targets), its state_dict loaded back into the
  library's model (strict), and every parameter's gradient (a tied matrix has one, summed gradient).
* Decoding runs on `ToyModel`, a tiny deterministic stand-in for a trained translator with the
  same interface (`encode(src, src_mask)`, `decode(tgt, memory, tgt_mask, memory_mask)`), whose
  output depends on the source padding mask. Greedy decoding has one right answer. Beam search
  has several correct implementations that may differ in general, so it is judged only where all
  of them must agree: against **exhaustive search** on models where a beam as wide as the
  vocabulary provably keeps the optimum (its every prefix ranks within the beam among *all*
  prefixes of its length), and with beam_size=1 against greedy decoding. The diagnosis names the
  first catalogued mistake whose output matches the student's, so the exhaustive cases are also
  chosen so that each catalogued mistake they catch gets them wrong in its own way (see _told_apart).
* Sampling must use `generator`: the draws depend on its state alone (not on torch's global random
  state, which a call leaves as it was), and a second call with the same generator draws afresh.
* Sampling is judged by its **distribution**: 100,000 draws per row, frequencies compared with
  the exact probabilities (within 0.01; the noise is < 0.002). Any correct sampler passes,
  whatever random numbers it uses; it must use the `generator` it is given.
"""
from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from attention_course import model as model_ref
from attention_course import translate as ref
from attention_course.layers import DecoderLayer, EncoderLayer
from attention_course.positional import PositionalEncoding

from .core import (
    Case,
    Exercise,
    ForbiddenCall,
    Mistake,
    called_twice,
    flag,
    keeps_inputs,
    make_checker,
    op_call_codes,
    op_name,
    raises,
    random_state,
    reference_guard,
    same_both_times,
    variant,
    watching_calls,
)
from .nb05 import dropout_in_every_sublayer
from .tensors import load_state, torch_attention

HONESTY = tuple(reference_guard(ref))
RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- helpers
def ids(rng, B, T, low, high, pad_id, lengths=None) -> torch.Tensor:
    """Token ids [B, T] drawn from [low, high) without pad_id, each row padded after its length."""
    choices = np.array([v for v in range(low, high) if v != pad_id])
    x = rng.choice(choices, size=(B, T))
    if lengths is not None:
        for b, n in enumerate(lengths):
            x[b, n:] = pad_id
    return torch.from_numpy(x.astype(np.int64))


# --------------------------------------------------------------------------- make_masks
def _mask_cases(rng, with_target_padding: bool):
    cases = []
    for B, S, T, pad_id in [(2, 5, 4, 0), (3, 6, 6, 1), (1, 3, 5, 3), (4, 7, 3, 2)]:
        src_len = [S] + list(rng.integers(1, S + 1, size=B - 1))
        tgt_len = ([T] + list(rng.integers(1, T + 1, size=B - 1))) if with_target_padding else [T] * B
        if with_target_padding and B > 1:
            tgt_len[-1] = max(1, T - 2)  # at least one padded target row
        src = ids(rng, B, S, 0, 9, pad_id, src_len)
        tgt = ids(rng, B, T, 0, 9, pad_id, tgt_len)
        what = "padded targets" if with_target_padding else "targets without padding"
        cases.append(Case(f"src [{B}, {S}] (padded, pad_id={pad_id}), tgt_in [{B}, {T}] ({what})",
                          lambda f, s=src, t=tgt, p=pad_id: f(s.clone(), t.clone(), p)))
    return cases


MASK_MISTAKES = (
    Mistake("causal mask without the diagonal (a position cannot attend to itself)",
            "position i may attend to keys 0..i *including* i: torch.tril(..) keeps the diagonal (diagonal=0)",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)
    return (src != pad_id)[:, None, None, :], causal & (tgt_in != pad_id)[:, None, None, :]
"""),
    Mistake("the causal mask points the wrong way (upper triangle: attends to the future)",
            "query i (a row) may see keys j <= i: that is the lower triangle, torch.tril",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).triu()
    return (src != pad_id)[:, None, None, :], causal & (tgt_in != pad_id)[:, None, None, :]
"""),
    Mistake("target padding applied over queries (rows) instead of keys (columns)",
            "padding hides *keys*: (tgt_in != pad_id)[:, None, None, :] has shape [B, 1, 1, T] and broadcasts over rows",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (src != pad_id)[:, None, None, :], causal & (tgt_in != pad_id)[:, None, :, None]
"""),
    Mistake("the target mask is only causal: target padding is not masked",
            "AND the causal mask with the target padding mask (over keys)",
            """
def make_masks(src, tgt_in, pad_id):
    B, T = tgt_in.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (src != pad_id)[:, None, None, :], causal.expand(B, 1, T, T)
"""),
    Mistake("the source mask is True on padding (inverted)",
            "True means 'may attend': real tokens are True, padding is False (src != pad_id)",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (src == pad_id)[:, None, None, :], causal & (tgt_in != pad_id)[:, None, None, :]
"""),
    Mistake("the pad id is hard-coded as 0",
            "compare with the pad_id argument, not with 0",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return (src != 0)[:, None, None, :], causal & (tgt_in != 0)[:, None, None, :]
"""),
    Mistake("the source mask has shape [B, S] (no head and query axes)",
            "src_mask must broadcast against scores [B, H, T, S]: index it as [:, None, None, :]",
            """
def make_masks(src, tgt_in, pad_id):
    T = tgt_in.size(1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return src != pad_id, causal & (tgt_in != pad_id)[:, None, None, :]
"""),
)


# --------------------------------------------------------------------------- label smoothing
class _NoBuiltinLabelSmoothing:
    """A watcher of the case's guard (core.watching_calls, so in every thread the notebook runs): F.cross_entropy
    (or nn.CrossEntropyLoss) called with label_smoothing > 0 is the built-in this exercise re-implements, and so
    is its kernel called from anywhere but F.cross_entropy (the kernel's arguments are out of a hook's sight)."""

    why = ("it calls torch.nn.functional.cross_entropy with label_smoothing, the built-in this exercise "
           "asks you to write yourself (log_softmax, gather and a mean are all you need)")

    def __init__(self, mode=None):
        # looked up here, in the process that runs the student's code (the cases travel pickled by value)
        self.code = torch.nn.functional.cross_entropy.__code__
        # the smoothing mode's own call of the kernel: it has read the kernel's arguments already
        self.mode_code = type(mode).__torch_function__.__code__ if mode is not None else None
        self.kernel = torch._C._nn.cross_entropy_loss  # what F.cross_entropy calls
        self.op_calls = op_call_codes()  # torch.ops.aten.cross_entropy_loss(...), however its name was spelled

    def __call__(self, frame, event, arg) -> str | None:
        if event == "call" and frame.f_code is self.code:
            return self.why if _smoothing(frame.f_locals.get("label_smoothing", 0.0)) else None
        if event == "c_call" and arg is self.kernel and frame.f_code is not self.code \
                and frame.f_code is not self.mode_code:
            return self.why
        if event == "call" and id(frame.f_code) in self.op_calls and "cross_entropy_loss" in op_name(frame):
            return self.why
        return None


def _smoothing(value) -> bool:
    """Whether F.cross_entropy smooths with `value`, read as PyTorch reads it: a float's (or a numpy float's) own
    double, whatever its __bool__ or __eq__ say (a red team's `_Eps(0.1)`, false to `if`, smoothed by 0.1 and took
    full points), an int's own value; anything else counts as smoothing."""
    if isinstance(value, float):
        return float.__float__(value) != 0.0
    if isinstance(value, int):
        return int.__index__(value) != 0
    return True


# F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing) and
# its kernel torch._C._nn.cross_entropy_loss(input, target, weight, reduction, ignore_index, label_smoothing):
# where label_smoothing sits when it is given by position
_SMOOTHING_AT = {"cross_entropy": 7, "cross_entropy_loss": 5}


def _smoothing_mode():
    """A TorchFunctionMode that refuses F.cross_entropy or its kernel with label_smoothing > 0, called from C too
    (functools.partial(torch._C._nn.cross_entropy_loss, ...)() and map(...) raise no profile event of their own,
    and took full points); `.hit` keeps the refusal if the student's code swallows it."""
    from torch.overrides import TorchFunctionMode

    class _RefuseSmoothing(TorchFunctionMode):
        hit = ""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            at = _SMOOTHING_AT.get(getattr(func, "__name__", "")) if func in (F.cross_entropy, _kernel()) else None
            if at is not None:
                value = kwargs["label_smoothing"] if "label_smoothing" in kwargs else args[at] if len(args) > at else 0.0
                if _smoothing(value):
                    self.hit = _NoBuiltinLabelSmoothing.why
                    raise ForbiddenCall(self.hit)
            return func(*args, **kwargs)

    return _RefuseSmoothing()


def _kernel():
    return torch._C._nn.cross_entropy_loss


def _guarded(f, *args):
    """Run the loss under the label-smoothing guard (in the sandbox): the loss as it was returned."""
    mode = _smoothing_mode()
    with watching_calls(_NoBuiltinLabelSmoothing(mode)), mode:
        out = f(*args)
    if mode.hit:  # refused, and the student's code caught it
        raise ForbiddenCall(mode.hit)
    return out


def _loss_and_rank(out):
    """derive (trusted side): the loss -> (the loss, [it is a 0-d tensor]), so that a loss of shape [1]
    fails only the second part, with its own message. (A 0-d tensor comes back from the sandbox 0-d.)"""
    if isinstance(out, torch.Tensor):
        return out.reshape(-1) if out.dim() == 0 else out, flag(out.dim() == 0)
    return out, flag(False)


def _ls_cases(rng):
    cases = []
    for shape, V, eps, ignore, p_ignore in [((12,), 7, 0.1, 0, 0.3), ((3, 5), 9, 0.2, 0, 0.3),
                                            ((2, 6), 11, 0.1, -100, 0.25), ((4, 4), 5, 0.0, 1, 0.2),
                                            ((2, 3, 4), 6, 0.3, 2, 0.3)]:
        logits = torch.from_numpy(rng.normal(scale=2.0, size=(*shape, V)).astype(np.float32))
        target = torch.from_numpy(rng.integers(0, V, size=shape).astype(np.int64))
        drop = torch.from_numpy(rng.uniform(size=shape) < p_ignore)
        drop.view(-1)[0] = False
        target[drop] = ignore
        target.view(-1)[-1] = ignore  # always at least one ignored position ...
        if target.view(-1)[0] == ignore:
            target.view(-1)[0] = (ignore + 1) % V  # ... and at least one that counts
        cases.append(Case(f"logits {list(logits.shape)}, target {list(target.shape)} with some positions = "
                          f"ignore_index {ignore}, epsilon={eps} (checks the loss, then that it is a 0-d tensor)",
                          lambda f, x=logits, y=target, e=eps, i=ignore: _guarded(f, x.clone(), y.clone(), e, i),
                          derive=_loss_and_rank))
    # the training step's own call: target = tgt[:, 1:] and logits of a slice, neither contiguous (a loss written with
    # .view(-1, V) passed every case above and crashed the notebook's training: view needs contiguous memory)
    whole = torch.from_numpy(rng.normal(scale=2.0, size=(3, 7, 6)).astype(np.float32))
    ids = torch.from_numpy(rng.integers(1, 6, size=(3, 7)).astype(np.int64))
    ids[:, -2:] = 0
    cases.append(Case("logits [3, 6, 6] and target [3, 6] sliced as the training step slices them (logits[:, 1:], "
                      "tgt[:, 1:]: not contiguous in memory, so .view(-1, V) fails where .reshape(-1, V) works), "
                      "ignore_index 0, epsilon=0.1",
                      lambda f, x=whole, y=ids: _guarded(f, x.clone()[:, 1:], y.clone()[:, 1:], 0.1, 0),
                      derive=_loss_and_rank))
    logits, target = tensor_pair = (torch.from_numpy(rng.normal(scale=2.0, size=(12, 7)).astype(np.float32)),
                                    torch.from_numpy(rng.integers(1, 7, size=(12,)).astype(np.int64)))
    target[::3] = 0
    cases.append(keeps_inputs("logits [12, 7], target [12] with some positions = ignore_index 0, epsilon=0.1 (a "
                              "stable log-softmax written as logits -= logits.max(...) shifts the caller's logits, "
                              "and its backward then fails)",
                              lambda f, x, y: _guarded(f, x, y, 0.1, 0), *tensor_pair))
    return cases


def _ls_stability_cases(rng):
    cases = []
    for scale, V, shape in [(60.0, 8, (10,)), (200.0, 12, (2, 5))]:  # [2, 5, V]: the vocabulary is not axis 1
        logits = torch.from_numpy(rng.normal(scale=scale, size=(*shape, V)).astype(np.float32))
        target = torch.from_numpy(rng.integers(1, V, size=shape).astype(np.int64))
        target.view(-1)[::4] = 0
        cases.append(Case(f"large logits {list(logits.shape)} (scale {scale:g}): exp overflows and softmax "
                          "underflows to 0",
                          lambda f, x=logits, y=target: _guarded(f, x.clone(), y.clone(), 0.1, 0),
                          derive=_loss_and_rank))
    return cases


LS_MISTAKES = (
    Mistake("epsilon times the SUM of -log p over the classes, not their mean",
            "the smoothed target gives each of the V classes epsilon / V: the smoothing term is epsilon * the MEAN "
            "over all V classes of -log p[c] (-log_probs.mean(-1)), not epsilon * their sum (V times too large)",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    safe = target.masked_fill(~keep, 0)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll + epsilon * (-logp.sum(-1))
    return (loss * keep).sum() / keep.sum()
"""),
    Mistake("smoothing mass spread over the V-1 wrong classes instead of all V classes",
            "the spec (and F.cross_entropy) spreads epsilon uniformly over *all* classes: "
            "(1 - eps) * nll + eps * mean over all c of -log p[c]",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    safe = target.masked_fill(~keep, 0)
    nll = -logp.gather(1, safe[:, None]).squeeze(1)
    others = (-logp.sum(-1) - nll) / (V - 1)
    loss = (1 - epsilon) * nll + epsilon * others
    return (loss * keep).sum() / keep.sum()
"""),
    Mistake("ignored (padding) positions are counted in the mean",
            "leave out the positions whose target is ignore_index, in the sum *and* in the count",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1).clamp(min=0)
    nll = -logp.gather(1, target[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll + epsilon * (-logp.mean(-1))
    return loss.mean()
"""),
    Mistake("divided by the number of all positions, not of the kept ones",
            "the mean is over positions whose target is not ignore_index: divide by their count",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    nll = -logp.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll + epsilon * (-logp.mean(-1))
    return (loss * keep).sum() / target.numel()
"""),
    Mistake("summed over positions instead of taking the mean",
            "return the mean over the kept positions (sum / their count)",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    nll = -logp.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll + epsilon * (-logp.mean(-1))
    return (loss * keep).sum()
"""),
    Mistake("the true class keeps weight 1 (no (1 - epsilon) factor)",
            "label smoothing *moves* epsilon of the target's weight to the uniform part: (1 - eps) * nll + eps * uniform",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    nll = -logp.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)
    loss = nll + epsilon * (-logp.mean(-1))
    return (loss * keep).sum() / keep.sum()
"""),
    Mistake("the KL divergence to the smoothed target instead of the cross-entropy (off by the target's entropy)",
            "the loss is the cross-entropy -sum(q * log p) with q the smoothed target: KL(q || p) is smaller by q's "
            "entropy, a constant that nn.CrossEntropyLoss(label_smoothing=...) does not subtract",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    q = torch.full_like(logp, epsilon / V).scatter_add(
        1, target.masked_fill(~keep, 0)[:, None], torch.full_like(logp[:, :1], 1 - epsilon))
    loss = (q * (q.clamp_min(1e-30).log() - logp)).sum(-1)
    return (loss * keep).sum() / keep.sum()
"""),
    Mistake("log(softmax(x)) instead of log_softmax (underflows to log 0 = -inf for large logits)",
            "use F.log_softmax (or x - logsumexp(x)): it never takes the log of an underflowed 0",
            """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = torch.log(torch.softmax(logits, dim=-1)).reshape(-1, V)
    target = target.reshape(-1)
    keep = target != ignore_index
    nll = -logp.gather(1, target.masked_fill(~keep, 0)[:, None]).squeeze(1)
    loss = (1 - epsilon) * nll + epsilon * (-logp.mean(-1))
    return (loss * keep).sum() / keep.sum()
"""),
)


# --------------------------------------------------------------------------- learning rate
def _lr_cases(rng):
    cases = []
    for warmup, peak in [(4000, 7e-4), (10, 1.0), (1, 0.5), (int(rng.integers(50, 500)), float(rng.uniform(1e-4, 1e-2)))]:
        steps = sorted({0, 1, 2, warmup // 2, warmup - 1, warmup, warmup + 1, 2 * warmup, 4 * warmup,
                        25 * warmup, int(rng.integers(1, 30 * warmup + 2))})
        cases.append(Case(f"warmup={warmup}, peak_lr={peak:g}, steps {steps}",
                          lambda f, s=steps, w=warmup, p=peak: np.array([float(f(i, w, p)) for i in s])))
    return cases


LR_MISTAKES = (
    Mistake("decays like 1/step instead of 1/sqrt(step)",
            "after the warm-up the rate is peak_lr * sqrt(warmup / step): take the square root",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    if step == 0:
        return 0.0
    return peak_lr * min(step / warmup, warmup / step)
"""),
    Mistake("the paper's formula without rescaling (does not reach peak_lr at step == warmup)",
            "d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) peaks at warmup^-0.5; scale it so the peak is peak_lr",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    if step == 0:
        return 0.0
    return peak_lr * min(step ** -0.5, step * warmup ** -1.5)
"""),
    Mistake("max instead of min (never warms up, never decays)",
            "the rate is the *smaller* of the warm-up line and the 1/sqrt(step) curve",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    if step == 0:
        return 0.0
    return peak_lr * max(step / warmup, math.sqrt(warmup / step))
"""),
    Mistake("the decay off by one: sqrt(warmup / (step + 1))",
            "after the warm-up the rate is peak_lr * sqrt(warmup / step), exactly peak_lr at step == warmup",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    if step == 0:
        return 0.0
    return peak_lr * min(step / warmup, math.sqrt(warmup / (step + 1)))
"""),
    Mistake("the warm-up off by one: step / (warmup + 1)",
            "the warm-up reaches peak_lr at step == warmup: peak_lr * step / warmup",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    if step == 0:
        return 0.0
    return peak_lr * min(step / (warmup + 1), math.sqrt(warmup / step))
"""),
    Mistake("off by one: uses step + 1 (step 0 is not 0)",
            "the rate at step 0 is 0 and reaches peak_lr exactly at step == warmup",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    step = step + 1
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))
"""),
    Mistake("divides by zero at step 0",
            "handle step 0 first (the rate is 0 there): sqrt(warmup / step) is undefined",
            """
def inverse_sqrt_lr(step, warmup, peak_lr):
    return peak_lr * min(step / warmup, math.sqrt(warmup / step))
"""),
)


# --------------------------------------------------------------------------- a tiny translator
class ToyModel(nn.Module):
    """A tiny deterministic stand-in for a trained translator (random weights, no training).

    encode(src [B, S], src_mask) -> memory [B, S, d]
    decode(tgt [B, T], memory, tgt_mask, memory_mask) -> logits [B, T, vocab]
    Position t's logits depend on tgt[:, :t+1] only (causal by construction, so tgt_mask is not
    needed) and on the mean of the memory over the keys that memory_mask allows (None: all keys).
    <pad> and <bos> are never likely; <eos> grows more likely with every position (eos_ramp).
    """

    def __init__(self, vocab: int = 10, d: int = 8, seed: int = 0, scale: float = 3.0,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2, eos_ramp: float = 0.6, eos_bias: float = -1.5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.src_embed = nn.Parameter(torch.randn(vocab, d, generator=g))
        self.tgt_embed = nn.Parameter(torch.randn(vocab, d, generator=g))
        self.mix = nn.Parameter(torch.randn(d, d, generator=g) / math.sqrt(d))
        self.out = nn.Parameter(torch.randn(d, vocab, generator=g) * scale / math.sqrt(d))
        self.pos = nn.Parameter(torch.randn(64, d, generator=g) * 0.5)
        bias = torch.zeros(vocab)
        bias[pad_id] = bias[bos_id] = -30.0
        bias[eos_id] = eos_bias
        self.register_buffer("bias", bias)
        self.eos_id, self.eos_ramp = eos_id, eos_ramp
        self.calls = 0

    def encode(self, src, src_mask=None):
        S = src.size(1)
        return torch.tanh(self.src_embed[src] + self.pos[:S])

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        self.calls += 1
        T = tgt.size(1)
        context = self._context(memory, memory_mask)                                           # [B, d]
        e = self.tgt_embed[tgt]                                                                 # [B, T, d]
        history = e.cumsum(1) / torch.arange(1, T + 1, dtype=e.dtype)[None, :, None]
        h = torch.tanh(e + history @ self.mix + context[:, None] + self.pos[:T])
        return self._logits(h)

    def _context(self, memory, memory_mask):
        """The mean of the memory over the keys memory_mask allows (None: all keys). [B, d]"""
        _require_source_mask_shape(memory_mask, memory.size(0), memory.size(1))
        keep = _allowed_keys(memory_mask, memory.size(0), memory.size(1), memory.dtype)
        return (memory * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)

    def _logits(self, h):
        logits = h @ self.out + self.bias
        ramp = torch.zeros_like(logits)
        ramp[..., self.eos_id] = self.eos_ramp * torch.arange(h.size(1), dtype=logits.dtype)
        return logits + ramp

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, src_mask)


class MaskedToyModel(ToyModel):
    """ToyModel with masks that matter, as a Transformer's do: the encoder mixes into every source position the
    mean of the positions src_mask allows (the padding too, without one), and the decoder has two layers that
    average the target positions tgt_mask allows (every position without one: then the last position's
    logits see what the earlier positions read of the future). Causal only with a causal tgt_mask."""

    def __init__(self, vocab: int = 10, d: int = 8, seed: int = 0, reads_src_mask: bool = True,
                 reads_tgt_mask: bool = True, **kwargs):
        super().__init__(vocab, d, seed, **kwargs)
        self.reads_src_mask, self.reads_tgt_mask = reads_src_mask, reads_tgt_mask  # off: as if every key were allowed,
        g = torch.Generator().manual_seed(seed + 1)                                 # or the mask were the causal one
        self.src_mix = nn.Parameter(torch.randn(d, d, generator=g) * 2 / math.sqrt(d))
        self.mix2 = nn.Parameter(torch.randn(d, d, generator=g) * 2 / math.sqrt(d))

    def encode(self, src, src_mask=None):
        if not self.reads_src_mask:  # position by position, as ToyModel's: any source mask, or a trimmed source
            return super().encode(src, src_mask)
        B, S = src.shape
        x = torch.tanh(self.src_embed[src] + self.pos[:S])                                     # [B, S, d]
        _require_source_mask_shape(src_mask, B, S)
        allowed = _allowed_pairs(src_mask, B, S, x.dtype)                                      # [B, S_q, S_k]
        summary = allowed @ x / allowed.sum(-1, keepdim=True).clamp(min=1)                     # [B, S, d]
        return torch.tanh(x + summary @ self.src_mix)

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        self.calls += 1
        B, T = tgt.shape
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        allowed = _allowed_pairs(tgt_mask if self.reads_tgt_mask else causal, B, T, memory.dtype)  # [B, T, T]
        count = allowed.sum(-1, keepdim=True).clamp(min=1)
        e = self.tgt_embed[tgt] + self.pos[:T]                                                 # [B, T, d]
        h = torch.tanh(e + (allowed @ e / count) @ self.mix + self._context(memory, memory_mask)[:, None])
        h = torch.tanh(h + (allowed @ h / count) @ self.mix2)
        return self._logits(h)


class TableModel(nn.Module):
    """A hand-made 'model' over the vocabulary <pad> <bos> <eos> a b: the next token's probabilities depend only on
    the tokens after <bos>, read from `table` (prefix -> (p(eos), p(a), p(b))); any other prefix ends at once
    (p(eos) = 0.9). The source is not read: every sentence is translated alike."""

    def __init__(self, table: dict):
        super().__init__()
        self.table = {tuple(k): v for k, v in table.items()}

    def encode(self, src, src_mask=None):
        return torch.zeros(src.size(0), src.size(1), 1)

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        B, T = tgt.shape
        logits = torch.full((B, T, 5), -30.0)
        for b, row in enumerate(tgt.tolist()):
            for t in range(T):
                p_eos, p_a, p_b = self.table.get(tuple(row[1:t + 1]), (0.9, 0.05, 0.05))
                logits[b, t, 2:] = torch.tensor([p_eos, p_a, p_b]).log()
        return logits

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, src_mask)


def _require_source_mask_shape(mask, B: int, S: int) -> None:
    """The test models take a source (memory) mask only as the course's Seq2SeqTransformer does: [B, 1, 1, S] (or
    [B, 1, T, S]; None: every key). A [B, S] mask from `src != pad_id` passed the permissive test models, and
    against the real model's scores [B, H, T, S] it is broadcast along the wrong axes: an error, or, where B
    equals T, a silently wrong translation (an audit's greedy_decode, 4 / 4)."""
    if mask is None:
        return
    shape = list(mask.shape)
    if len(shape) != 4 or shape[1] != 1 or shape[0] not in (1, B) or shape[-1] != S:
        raise ValueError(f"the source mask has shape {shape}: the Seq2SeqTransformer takes it as [B, 1, 1, S] = "
                         f"{[B, 1, 1, S]}, make_masks' src_mask (a [B, S] mask is broadcast against the attention "
                         f"scores [B, H, T, S] along the wrong axes)")


def _allowed_keys(mask, B: int, S: int, dtype) -> torch.Tensor:
    """A source mask of any of the usual shapes ([B, S], [B, 1, S], [B, 1, 1, S]; None: every key) as [B, S]."""
    if mask is None:
        return torch.ones(B, S, dtype=dtype)
    if mask.dim() == 1:  # [S]: one sentence's padding, broadcast as attention broadcasts it
        mask = mask[None]
    return mask.reshape(mask.shape[0], -1, mask.shape[-1])[:, -1].to(dtype).expand(B, S)


def _allowed_pairs(mask, B: int, T: int, dtype) -> torch.Tensor:
    """A target mask of any of the usual shapes ([T, T], [1, T, T], [B, 1, T, T], a key-padding [B, 1, 1, T];
    None: every position) as [B, T, T]."""
    if mask is None:
        return torch.ones(B, T, T, dtype=dtype)
    m = mask.to(torch.bool)
    m = m.reshape(-1, m.shape[-2], m.shape[-1]) if m.dim() >= 2 else m.reshape(1, 1, -1)
    if m.shape[0] not in (1, B):  # one mask per head: the first head's
        m = m.reshape(B, -1, m.shape[-2], m.shape[-1])[:, 0]
    return m.expand(B, T, T).to(dtype)


def _sources(rng, B, S, vocab, pad_id=0):
    lengths = [S] + [int(n) for n in rng.integers(1, S, size=B - 1)]
    return ids(rng, B, S, 3, vocab, pad_id, lengths)


def _greedy_cases(rng):
    cases = []
    for seed, B, S, vocab, max_len, ramp, desc in [
        (11, 4, 6, 12, 12, 0.9, "every row ends before max_len: stop early, pad after eos"),
        (12, 3, 5, 10, 3, -2.0, "max_len=3 and eos unlikely: no row finishes, 3 tokens after <bos>"),
        (13, 5, 4, 9, 10, 0.5, "rows of different lengths"),
        (14, 1, 7, 15, 8, 0.4, "a single sentence"),
    ]:
        model = ToyModel(vocab, seed=int(rng.integers(1 << 30)) + seed, eos_ramp=ramp).eval()
        src = _sources(rng, B, S, vocab)
        cases.append(Case(f"a tiny model (vocab {vocab}), src [{B}, {S}] with padding, max_len={max_len}: {desc}",
                          lambda f, m=model, s=src, n=max_len: f(m, s.clone(), n, 1, 2, 0)))
    model, src = _masked_model_case(rng, "decodes without the causal target mask (tgt_mask=None)", reads_src_mask=False)
    cases.append(Case("a tiny model whose decoder reads tgt_mask, as a Transformer's does (two layers: without the causal "
                      f"mask the earlier positions read later tokens), src [{src.size(0)}, {src.size(1)}] with padding, "
                      f"max_len={MASKED_MAX_LEN}", lambda f, m=model, s=src: f(m, s.clone(), MASKED_MAX_LEN, 1, 2, 0)))
    return cases


MASKED_MAX_LEN = 8


def _masked_model_case(rng, *mistakes: str, B: int = 4, S: int = 7, vocab: int = 12, **reads):
    """A MaskedToyModel (reading the masks `reads` says) and a padded source [B, S] on which greedy decoding with
    each named catalogued mistake answers otherwise than the reference (almost every random model does; the first
    that does is taken)."""
    wrong = [m.build("greedy_decode") for m in GREEDY_MISTAKES if m.name in mistakes]
    assert len(wrong) == len(mistakes), mistakes
    for _ in range(100):
        model = MaskedToyModel(vocab, seed=int(rng.integers(1 << 30)), scale=4.0, eos_ramp=0.5, **reads).eval()
        src = _sources(rng, B, S, vocab)
        want = ref.greedy_decode(model, src.clone(), MASKED_MAX_LEN, 1, 2, 0)
        if all(not torch.equal(out, want) if out.shape == want.shape else True
               for out in (f(model, src.clone(), MASKED_MAX_LEN, 1, 2, 0) for f in wrong)):
            return model, src
    raise RuntimeError("no tiny model found on which the masks change the translation")  # pragma: no cover


def _greedy_padding_cases(rng):
    cases = []
    for B, S, vocab in [(4, 8, 10), (3, 9, 12)]:
        model = ToyModel(vocab, seed=int(rng.integers(1 << 30)), scale=4.0).eval()
        # large pad embeddings: attending to padding visibly changes the translation
        with torch.no_grad():
            model.src_embed[0] = 6.0
        src = ids(rng, B, S, 3, vocab, 0, [S] + [2] * (B - 1))
        cases.append(Case(f"src [{B}, {S}] whose rows are mostly padding (the source padding mask matters)",
                          lambda f, m=model, s=src: f(m, s.clone(), 8, 1, 2, 0)))
    model, src = _masked_model_case(rng, "the encoder gets no source mask (model.encode(src, None))",
                                    reads_tgt_mask=False)
    cases.append(Case("a tiny model whose encoder reads src_mask, as a Transformer's does (without it every source "
                      f"position mixes in the padding), src [{src.size(0)}, {src.size(1)}] with padding, "
                      f"max_len={MASKED_MAX_LEN}", lambda f, m=model, s=src: f(m, s.clone(), MASKED_MAX_LEN, 1, 2, 0)))
    return cases


def _greedy_code(body: str) -> str:
    return ("def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):\n"
            "    with torch.no_grad():\n"
            "        B = src.size(0)\n"
            "        src_mask = (src != pad_id)[:, None, None, :]\n"
            "        memory = model.encode(src, src_mask)\n"
            "        ys = torch.full((B, 1), bos_id, dtype=torch.long)\n"
            "        finished = torch.zeros(B, dtype=torch.bool)\n" + body)


_GREEDY_STEP = (
    "            T = ys.size(1)\n"
    "            tgt_mask = torch.ones(T, T, dtype=torch.bool).tril() & (ys != pad_id)[:, None, None, :]\n"
    "            logits = model.decode(ys, memory, tgt_mask, src_mask)\n")

_GREEDY_NEXT = (  # the rest of a right greedy step: the likeliest token, padding once a row has ended
    "            nxt = logits[:, -1].argmax(-1).masked_fill(finished, pad_id)\n"
    "            ys = torch.cat([ys, nxt[:, None]], 1)\n"
    "            finished |= nxt == eos_id\n"
    "            if finished.all():\n"
    "                break\n"
    "        return ys\n")

GREEDY_MISTAKES = (
    Mistake("does not stop early: always generates max_len tokens",
            "stop as soon as every row has produced eos (if finished.all(): break)",
            _greedy_code("        for _ in range(max_len):\n" + _GREEDY_STEP +
                         "            nxt = logits[:, -1].argmax(-1).masked_fill(finished, pad_id)\n"
                         "            ys = torch.cat([ys, nxt[:, None]], 1)\n"
                         "            finished |= nxt == eos_id\n"
                         "        return ys\n")),
    Mistake("keeps generating after eos instead of padding",
            "once a row has produced eos, append pad_id to it (masked_fill(finished, pad_id))",
            _greedy_code("        for _ in range(max_len):\n" + _GREEDY_STEP +
                         "            nxt = logits[:, -1].argmax(-1)\n"
                         "            ys = torch.cat([ys, nxt[:, None]], 1)\n"
                         "            finished |= nxt == eos_id\n"
                         "            if finished.all():\n"
                         "                break\n"
                         "        return ys\n")),
    Mistake("drops the eos token",
            "keep the first eos in the row, then pad",
            _greedy_code("        for _ in range(max_len):\n" + _GREEDY_STEP +
                         "            nxt = logits[:, -1].argmax(-1)\n"
                         "            done = finished | (nxt == eos_id)\n"
                         "            ys = torch.cat([ys, nxt.masked_fill(done, pad_id)[:, None]], 1)\n"
                         "            finished = done\n"
                         "            if finished.all():\n"
                         "                break\n"
                         "        return ys\n")),
    Mistake("reads the logits of the first position instead of the last",
            "the next token is predicted by the *last* position: logits[:, -1]",
            _greedy_code("        for _ in range(max_len):\n" + _GREEDY_STEP +
                         "            nxt = logits[:, 0].argmax(-1).masked_fill(finished, pad_id)\n"
                         "            ys = torch.cat([ys, nxt[:, None]], 1)\n"
                         "            finished |= nxt == eos_id\n"
                         "            if finished.all():\n"
                         "                break\n"
                         "        return ys\n")),
    Mistake("generates max_len - 1 tokens (counts <bos> in max_len)",
            "max_len counts generated tokens, after <bos>: a row can be max_len + 1 long",
            _greedy_code("        for _ in range(max_len - 1):\n" + _GREEDY_STEP + _GREEDY_NEXT)),
    Mistake("decodes without the causal target mask (tgt_mask=None)",
            "at inference too, pass the causal target mask to model.decode (make_masks gives it): every call "
            "recomputes every position, and without the mask the earlier positions read the later tokens, so the "
            "last position's logits are not the ones the model was trained to give",
            _greedy_code("        for _ in range(max_len):\n"
                         "            logits = model.decode(ys, memory, None, src_mask)\n"
                         + _GREEDY_NEXT)),
    Mistake("the encoder gets no source mask (model.encode(src, None))",
            "pass src_mask to model.encode as well as to model.decode: without it the encoder's self-attention "
            "reads the padding, and every source position's memory changes",
            _greedy_code("        memory = model.encode(src, None)\n"
                         "        for _ in range(max_len):\n" + _GREEDY_STEP + _GREEDY_NEXT)),
    Mistake("no source padding mask (the decoder attends to source padding)",
            "pass memory_mask = src_mask (src != pad_id) to model.encode and model.decode",
            _greedy_code("        src_mask = None\n"
                         "        memory = model.encode(src, None)\n"
                         "        for _ in range(max_len):\n" + _GREEDY_STEP + _GREEDY_NEXT)),
)


# --------------------------------------------------------------------------- beam search
def _log_probs(model, src, prefixes, pad_id=0):
    """log p(next token | prefix) [B, N, V] for each of B source sentences [B, S] and N prefixes [N, t]."""
    B, N = src.size(0), prefixes.size(0)
    s = src.repeat_interleave(N, 0)                                  # [B*N, S]
    mask = (s != pad_id)[:, None, None, :]
    with torch.no_grad():
        logits = model.decode(prefixes.repeat(B, 1), model.encode(s, mask), None, mask)[:, -1]
    return F.log_softmax(logits.double(), dim=-1).view(B, N, -1)


def enumerate_sequences(model, src, max_len, bos_id=1, eos_id=2, pad_id=0):
    """Every sequence of at most max_len tokens after <bos> (ending at its first eos, or unfinished at
    max_len), for each sentence of src [B, S], level by level: [(prefixes [N, t+1], sum of log p [B, N],
    ended [N]) for t = 1..max_len]. Prefixes containing <pad> or <bos> are not extended (ToyModel gives
    those tokens log p < -25, so they can neither be the optimum nor outrank one of its prefixes)."""
    live = torch.full((1, 1), bos_id, dtype=torch.long)
    live_score = torch.zeros(src.size(0), 1, dtype=torch.float64)
    levels = []
    for t in range(1, max_len + 1):
        lp = _log_probs(model, src, live, pad_id)                   # [B, N, V]
        B, N, V = lp.shape
        total = (live_score[:, :, None] + lp).reshape(B, N * V)
        prefixes = torch.cat([live.repeat_interleave(V, 0), torch.arange(V).repeat(N)[:, None]], 1)
        ended = (prefixes[:, -1] == eos_id) | (t == max_len)
        levels.append((prefixes, total, ended))
        grow = ~ended & (prefixes[:, -1] != pad_id) & (prefixes[:, -1] != bos_id)
        live, live_score = prefixes[grow], total[:, grow]
    return levels


def best_sequence(levels, b, length_penalty, eos_id=2, count_eos=True, count_bos=False):
    """For sentence b: (best tokens, ranks of its prefixes among all prefixes of their length by
    sum(log p), lead over the runner-up) for sum(log p) / num_generated ** length_penalty (the
    variants: eos not counted, or <bos> counted, in the length)."""
    scores = []
    for t, (prefixes, total, ended) in enumerate(levels, start=1):
        length = torch.full_like(total[b], float(t + count_bos))
        if not count_eos:
            length = (length - (prefixes[:, -1] == eos_id).double()).clamp(min=1)
        scores.append(torch.where(ended, total[b] / length ** length_penalty,
                                  torch.tensor(-math.inf, dtype=torch.float64)))
    flat = torch.cat(scores)
    top2 = flat.topk(2).values
    i = int(flat.argmax())
    for t, sc in enumerate(scores, start=1):
        if i < sc.numel():
            best = levels[t - 1][0][i]
            break
        i -= sc.numel()
    ranks = []
    for t, (prefixes, total, _) in enumerate(levels, start=1):
        if best.size(0) <= t:
            break
        match = (prefixes == best[:t + 1]).all(1).nonzero().flatten()
        ranks.append(int((total[b] > total[b, match[0]]).sum()))
    return best, ranks, float(top2[0] - top2[1])


def greedy_sequence(levels, b, eos_id=2):
    """For sentence b: the tokens greedy decoding picks (the likeliest next token at every step)."""
    best = None
    for t, (prefixes, total, ended) in enumerate(levels, start=1):
        here = total[b] if best is None else torch.where((prefixes[:, :t] == best).all(1), total[b],
                                                           torch.tensor(-math.inf, dtype=torch.float64))
        best = prefixes[int(here.argmax())]
        if bool(ended[int(here.argmax())]):
            return best
    return best


def _pad_rows(rows, pad_id=0):
    out = torch.full((len(rows), max(len(h) for h in rows)), pad_id, dtype=torch.long)
    for b, h in enumerate(rows):
        out[b, :len(h)] = h
    return out


def exhaustive_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    """The exact optimum for each sentence (beam_size is not used), in greedy_decode's format."""
    levels = enumerate_sequences(model, src, max_len, bos_id, eos_id, pad_id)
    return _pad_rows([best_sequence(levels, b, length_penalty, eos_id)[0] for b in range(src.size(0))], pad_id)


def _search_case(rng, vocab, B, S, max_len, lp, differs_from, must_fail=(), named=frozenset(), pool=20):
    """A tiny model and B source sentences [B, S] on which every beam search as wide as the vocabulary
    must find the exhaustive optimum (in each sentence, each prefix of the optimum ranks within the beam
    among all prefixes of its length, with one place to spare, and the runner-up is clearly behind), on
    which the answer differs from each variant in `differs_from` (see _variant) for some sentence, each
    catalogued mistake in `must_fail` gets some sentence wrong, and the catalogued mistakes it catches
    are told apart (see _told_apart). -> (model, src, names of the catalogued mistakes it catches).

    Beam search handles the sentences of a batch independently (and every catalogued mistake does too),
    so `pool` candidate sentences are tried at once and B of them chosen."""
    mistakes = _beam_mistake_functions()
    order = list(mistakes)
    for _ in range(1000):
        model = ToyModel(vocab, seed=int(rng.integers(1 << 30)), scale=float(rng.uniform(3.0, 5.0)),
                         eos_ramp=float(rng.uniform(0.3, 1.2)), eos_bias=float(rng.uniform(-2.0, 0.0))).eval()
        candidates = _sources(rng, pool, S, vocab)
        levels = enumerate_sequences(model, candidates, max_len)
        valid, optimum = [], []
        for b in range(pool):
            best, ranks, gap = best_sequence(levels, b, lp)
            if all(r < vocab - 1 for r in ranks) and gap >= 0.05:
                valid.append(b)
                optimum.append(best.tolist())
        if len(valid) < B:
            continue
        variants = [_variant(levels, valid, v) for v in differs_from]
        if not all(any(a != b for a, b in zip(optimum, v, strict=False)) for v in variants):
            continue
        # Sentences alike in what the search and its variants make of them (and in their padding) are
        # most likely alike for the mistakes too: the mistakes run on one of each kind (running them is
        # the slow part), and the batch finally chosen is checked as it is (_verified).
        signature = list(zip(map(tuple, optimum), *(map(tuple, _variant(levels, valid, v)) for v in _signature(lp)),
                             (candidates[valid] != 0).sum(1).tolist(), strict=True))
        kinds = [i for i in range(len(valid)) if signature[i] not in signature[:i]]
        others = [i for i in range(len(valid)) if i not in kinds]
        memo = _Memo(model)
        rows = {name: _rows(search(memo, candidates[[valid[i] for i in kinds]], vocab, max_len, 1, 2, 0, lp))
                for name, search in mistakes.items()}
        # bit j of a mask: sentence valid[kinds[j]]
        variant_masks = [_mask(optimum[i] != v[i] for i in kinds) for v in variants]
        wrong = {n: _mask(rows[n][j] != optimum[i] for j, i in enumerate(kinds)) for n in order}
        if not all(wrong[n] for n in must_fail):
            continue
        apart = {(e, m): _mask(rows[e][j] != rows[m][j] for j in range(len(kinds)))
                 for j, m in enumerate(order) for e in order[:j]}
        for subset in _subsets(rng, len(kinds), min(B, len(kinds))):
            caught = {n for n in order if wrong[n] & subset}
            if all(v & subset for v in variant_masks) and set(must_fail) <= caught and \
                    _told_apart(order, caught, named, apart, subset):
                chosen = [i for j, i in enumerate(kinds) if subset >> j & 1] + others[:B - bin(subset).count("1")]
                if len(chosen) < B:
                    continue
                src = candidates[[valid[i] for i in chosen]]
                want = _pad_rows([torch.tensor(optimum[i]) for i in chosen])
                if _verified(memo, src, vocab, max_len, lp, want, caught, named):
                    return model, src, caught
    raise RuntimeError("no suitable tiny model found for the beam-search check")  # pragma: no cover


def _variant(levels, sentences, variant) -> list:
    """What a variant of the search returns for each of `sentences` (token lists): the optimum of another
    score (keyword arguments of best_sequence, or gnmt=True: GNMT's length ((5 + length) / 6)), "greedy"
    (greedy_sequence), or "first finished" ([<bos>, <eos>]: with a beam as wide as the vocabulary, eos is in
    the beam at the first step)."""
    if variant == "greedy":
        return [greedy_sequence(levels, b).tolist() for b in sentences]
    if variant == "first finished":
        return [[1, 2] for _ in sentences]
    length_penalty, count_eos, count_bos, gnmt = (variant.get(k, d) for k, d in (
        ("length_penalty", 1.0), ("count_eos", True), ("count_bos", False), ("gnmt", False)))
    scores = []
    for t, (prefixes, total, ended) in enumerate(levels, start=1):
        length = torch.full((prefixes.size(0),), (5 + t) / 6 if gnmt else float(t + count_bos), dtype=torch.float64)
        if not count_eos:
            length = (length - (prefixes[:, -1] == 2).double()).clamp(min=1)
        scores.append(torch.where(ended, total[sentences] / length ** length_penalty,
                                  torch.tensor(-math.inf, dtype=torch.float64)))
    found = []
    for i in torch.cat(scores, dim=1).argmax(1).tolist():
        for prefixes, _, _ in levels:
            if i < prefixes.size(0):
                found.append(prefixes[i].tolist())
                break
            i -= prefixes.size(0)
    return found


def _signature(lp):
    """The variants whose answers, with the optimum's and the padding, sort sentences into kinds."""
    return (dict(length_penalty=0.0), dict(length_penalty=lp, count_eos=False),
            dict(length_penalty=lp, count_bos=True), "greedy")


class _Memo:
    """The model, remembering its answers (whole calls, by their inputs): the catalogued mistakes ask it
    the same questions while a case is searched for."""

    def __init__(self, model):
        self.model, self.seen = model, {}

    @staticmethod
    def _key(*tensors):
        return tuple(None if t is None else (tuple(t.shape), t.numpy().tobytes()) for t in tensors)

    def encode(self, src, src_mask=None):
        key = ("encode",) + self._key(src, src_mask)
        if key not in self.seen:
            self.seen[key] = self.model.encode(src, src_mask)
        return self.seen[key]

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        key = ("decode",) + self._key(tgt, memory, tgt_mask, memory_mask)
        if key not in self.seen:
            self.seen[key] = self.model.decode(tgt, memory, tgt_mask, memory_mask)
        return self.seen[key]


def _rows(out: torch.Tensor, pad_id=0) -> list:
    """A decoder's output [N, L] -> per sentence, its tokens without the trailing padding."""
    rows = []
    for row in out.tolist():
        while row and row[-1] == pad_id:
            row.pop()
        rows.append(row)
    return rows


def _mask(flags) -> int:
    return sum(1 << i for i, f in enumerate(flags) if f)


def _subsets(rng, n: int, k: int):
    """Every k-subset of range(n) as a bit mask, in an order drawn from rng."""
    subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(n), k)]
    return [subsets[i] for i in rng.permutation(len(subsets))]


def _told_apart(order, caught, named, apart, subset) -> bool:
    """The diagnosis names the first catalogued mistake whose output matches the student's. A mistake
    this case catches for the first time in its exercise (not in `named`) must therefore give an output
    of its own: no mistake before it in the catalogue may give the same tokens in every sentence
    (stopping at the first finished hypothesis, or counting <bos> in the length, were told "ignores the
    length penalty")."""
    for j, m in enumerate(order):
        if m in caught and m not in named:
            if any(e in caught and not apart[(e, m)] & subset for e in order[:j]):
                return False
    return True


def _verified(model, src, vocab, max_len, lp, want, caught, named) -> bool:
    """The choice checked on the case exactly as it will be run: the catalogued mistakes on the chosen
    batch, compared as the grader compares (same shape, same tokens). (`model` may be the search's _Memo:
    it gives the model's own answers.)"""
    outs = {}
    for name, search in _beam_mistake_functions().items():
        out = search(model, src.clone(), vocab, max_len, 1, 2, 0, lp)
        fails = not (out.shape == want.shape and torch.equal(out, want))
        if fails != (name in caught):
            return False
        if fails and name not in named and any(o.shape == out.shape and torch.equal(o, out) for o in outs.values()):
            return False
        if fails:
            outs[name] = out
    return True


_MISTAKE_FUNCTIONS: dict = {}


def _beam_mistake_functions() -> dict:
    """name -> the catalogued beam-search mistake, built once (our own code, run in the trusted process),
    in the catalogue's order."""
    if not _MISTAKE_FUNCTIONS:
        _MISTAKE_FUNCTIONS.update((m.name, m.build("beam_search")) for m in _BEAM_DIAGNOSED)
    return _MISTAKE_FUNCTIONS


@contextlib.contextmanager
def _one_thread():
    """The search runs thousands of operations on tensors of a few dozen numbers: one thread does them
    fastest (with more, each waits for the others; on a busy machine, many times longer)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _exhaustive_cases(rng, settings, catch=(), vocab=6, B=4, S=5, max_len=4):
    """One case per (length_penalty, differs_from) setting. Each is chosen knowing which mistakes the
    earlier cases of the exercise already catch (see _told_apart); the last one also catches whichever
    of the mistakes named in `catch` the others do not."""
    with _one_thread():
        return _choose_cases(rng, settings, catch, vocab, B, S, max_len)


def _choose_cases(rng, settings, catch, vocab, B, S, max_len):
    cases, named = [], set()
    for i, (lp, differs_from) in enumerate(settings):
        must_fail = tuple(n for n in catch if n not in named) if i == len(settings) - 1 else ()
        proxies = [_PROXIES[n](lp) for n in must_fail if n in _PROXIES]
        model, src, caught = _search_case(rng, vocab, B, S, max_len, lp, list(differs_from) + proxies,
                                          must_fail, frozenset(named))
        named |= caught
        cases.append(Case(f"a tiny model (vocab {vocab}), src [{B}, {S}] with padding, beam_size={vocab} (as wide as "
                          f"the vocabulary), max_len={max_len}, length_penalty={lp:g}: the exhaustive-search optimum",
                          lambda f, m=model, s=src, lp=lp: f(m, s.clone(), vocab, max_len, 1, 2, 0, lp)))
    return cases


def _same_rng_same_cases(make):
    """Finding the tiny models takes a second; the cases only depend on the rng's state, so each
    check (and each mistake diagnosed on it) reuses them."""
    memo = {}

    def cases(rng):
        key = repr(rng.bit_generator.state)
        if key not in memo:
            memo[key] = make(rng)
        return memo[key]

    return cases


@_same_rng_same_cases
def _beam_cases(rng):
    return _exhaustive_cases(rng, [(1.0, [dict(length_penalty=1.0, count_eos=False)]),
                                   (1.0, [dict(length_penalty=0.0)]),
                                   (0.6, [])], catch=tuple(m.name for m in BEAM_MISTAKES)) + [_late_winner_case(),
                                                                                              _narrow_beam_case()]


# p(eos), p(a), p(b) after each prefix (a = 3, b = 4). After <bos> b, eos scores -0.80 and the live [b, a] -0.86:
# a search that stops there keeps [b, eos], but [b, a, b, eos] goes on to -0.53 (every prefix of it the likeliest
# of its length, so any beam finds it; the runner-up is 0.165 behind).
LATE_WINNER = {(): (0.26, 0.29, 0.45), (3,): (0.28, 0.27, 0.45), (4,): (0.45, 0.40, 0.15), (3, 3): (0.97, 0.01, 0.02),
               (3, 4): (0.09, 0.39, 0.52), (4, 3): (0.08, 0.19, 0.73), (4, 4): (0.62, 0.03, 0.35)}


# p(eos), p(a), p(b) after each prefix, to max_len 4. The best of all sequences is the unfinished [a, a, a, b]; a beam
# of 2 drops [a] at the second step (its [a, a] ranks third) and ends [b, b, a, eos]. Every prefix ranks clearly (the
# answer holds with each probability moved by 1%), and beams that refill or not agree on it.
NARROW_BEAM = {(): (0.1, 0.37, 0.53), (3,): (0.36, 0.37, 0.27), (4,): (0.39, 0.29, 0.32), (3, 3): (0.17, 0.8, 0.03),
               (3, 4): (0.04, 0.44, 0.52), (4, 3): (0.41, 0.45, 0.14), (4, 4): (0.53, 0.44, 0.03),
               (3, 3, 3): (0.02, 0.17, 0.81), (3, 3, 4): (0.03, 0.08, 0.89), (3, 4, 3): (0.24, 0.51, 0.25),
               (3, 4, 4): (0.26, 0.53, 0.21), (4, 3, 3): (0.06, 0.5, 0.44), (4, 3, 4): (0.24, 0.26, 0.5),
               (4, 4, 3): (0.73, 0.06, 0.21), (4, 4, 4): (0.71, 0.22, 0.07)}


def _narrow_beam_case() -> Case:
    model, src = TableModel(NARROW_BEAM), torch.tensor([[3, 4, 3, 0], [4, 4, 0, 0]])
    return Case("a hand-made model (vocab <pad> <bos> <eos> a b), beam_size=2, max_len=4, length_penalty=1: what a "
                "beam of 2 keeps finds [b, b, a, eos]; the best of all sequences, [a, a, a, b], leaves a beam of 2 at "
                "its second step (searching every sequence, or a beam wider than beam_size, finds it instead)",
                lambda f, m=model, s=src: f(m, s.clone(), 2, 4, 1, 2, 0, 1.0), reference=_course_beam_search,
                tells=(STAY_MISTAKE.name,))


def _course_beam_search(*args, **kwargs):
    """The course's beam search, looked up when the grader judges (the sandbox, which builds the cases too, has no
    course answers to look up)."""
    return ref.beam_search(*args, **kwargs)


def _late_winner_case() -> Case:
    model, src = TableModel(LATE_WINNER), torch.tensor([[3, 4, 3, 0], [4, 4, 0, 0]])
    return Case("a hand-made model (vocab <pad> <bos> <eos> a b) whose best translation, [b, a, b, eos] "
                "(sum(log p) / 4 = -0.53), scores worse than the finished [b, eos] (-0.80) while it is the live "
                "[b, a] (-0.86 after 2 tokens): beam_size=5, max_len=4, length_penalty=1",
                lambda f, m=model, s=src: f(m, s.clone(), 5, 4, 1, 2, 0, 1.0), tells=(EARLY_STOP_MISTAKE.name,))


@_same_rng_same_cases
def _beam_length_penalty_cases(rng):
    return _exhaustive_cases(rng, [(0.0, [dict(length_penalty=1.0)]), (2.0, [dict(length_penalty=1.0)])])


def _beam_greedy_cases(rng):
    cases = []
    for B, S, vocab, max_len, ramp, lp in [(4, 6, 12, 10, 0.7, 1.0), (3, 5, 9, 4, -1.0, 0.6), (2, 7, 10, 8, 0.4, 2.0)]:
        model = ToyModel(vocab, seed=int(rng.integers(1 << 30)), eos_ramp=ramp).eval()
        src = _sources(rng, B, S, vocab)
        cases.append(Case(f"beam_size=1 must equal greedy decoding (one live hypothesis: when it ends with eos, "
                          f"the search ends; nothing refills the beam): tiny model (vocab {vocab}), src [{B}, {S}], "
                          f"max_len={max_len}, length_penalty={lp:g}",
                          lambda f, m=model, s=src, n=max_len, lp=lp: f(m, s.clone(), 1, n, 1, 2, 0, lp)))
    model, src = _masked_model_case(rng, "decodes without the causal target mask (tgt_mask=None)",
                                    "the encoder gets no source mask (model.encode(src, None))")
    cases.append(Case("beam_size=1 must equal greedy decoding, on a tiny model whose encoder reads src_mask and whose "
                      "decoder reads tgt_mask, as a Transformer's do (without the causal mask the earlier positions "
                      f"read later tokens): src [{src.size(0)}, {src.size(1)}] with padding, max_len={MASKED_MAX_LEN}",
                      lambda f, m=model, s=src: f(m, s.clone(), 1, MASKED_MAX_LEN, 1, 2, 0, 1.0)))
    return cases


def _greedy_as_beam(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    return ref.greedy_decode(model, src, max_len, bos_id, eos_id, pad_id)


_BEAM_TEMPLATE = '''
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    with torch.no_grad():
        out = []
        for b in range(src.size(0)):
            ys = torch.full(({start}, 1), bos_id, dtype=torch.long)
            scores = torch.zeros({start}, dtype=torch.float64)
            finished = []
            for t in range(1, max_len + 1):
                s = src[b:b + 1].expand(ys.size(0), -1)
                src_mask = {src_mask}
                logits = model.decode(ys, model.encode(s, {enc_mask}), {tgt_mask}, src_mask)[:, -1]
                logp = {logp}
                V = logp.size(-1)
                top, idx = (scores[:, None] + logp).reshape(-1).topk(min(beam_size, logp.numel()))
                ys = torch.cat([ys[idx // V], (idx % V)[:, None]], 1)
                ended = (ys[:, -1] == eos_id) | (t == max_len)
                for i in ended.nonzero().flatten().tolist():
                    score, tokens = float(top[i]), ys[i].tolist()
                    finished.append(({normalize}, tokens))
                ys, scores = ys[~ended], top[~ended]
                if {stop}:
                    break
            {choose}
            out.append(best)
        L = max(len(h) for h in out)
        return torch.tensor([h + [pad_id] * (L - len(h)) for h in out])
'''
_BEAM_RIGHT = dict(src_mask="(s != pad_id)[:, None, None, :]", logp="torch.log_softmax(logits.double(), -1)",
                   normalize="score / t ** length_penalty",
                   choose="best = max(finished, key=lambda h: h[0])[1]",
                   start="1", stop="ys.size(0) == 0", enc_mask="src_mask",
                   tgt_mask="torch.ones(t, t, dtype=torch.bool).tril()")


def _beam_code(**changes) -> str:
    return _BEAM_TEMPLATE.format(**{**_BEAM_RIGHT, **changes})


BEAM_MISTAKES = (
    Mistake("stops at the first finished hypothesis (returns as soon as one hypothesis ends)",
            "a hypothesis that ends with eos leaves the beam, but the search goes on with the others until none "
            "is left or max_len is reached; then return the finished hypothesis with the best "
            "sum(log p) / num_generated_tokens ** length_penalty: a later, longer one can score better",
            _beam_code(stop="finished")),
    Mistake("starts with beam_size identical copies of <bos> (the beam fills with duplicates)",
            "start with one live hypothesis, [<bos>] (or give the copies scores 0, -inf, -inf, ...): identical "
            "copies extend into identical candidates, the best token fills every place in the beam and the "
            "search is no wider than greedy decoding",
            _beam_code(start="beam_size")),
    Mistake("ignores the length penalty (ranks finished hypotheses as the raw sum of log p does)",
            "divide each finished hypothesis' sum of log p by num_generated_tokens ** length_penalty (eos counted, "
            "<bos> not); not another length penalty, such as GNMT's ((5 + length) / 6) ** length_penalty",
            _beam_code(normalize="score")),
    Mistake("counts <bos> in the length (num_generated_tokens + 1)",
            "the length is the number of generated tokens, eos included, <bos> not",
            _beam_code(normalize="score / (t + 1) ** length_penalty")),
    Mistake("does not count eos in the length",
            "eos is a generated token: a hypothesis that ends with eos at step t has length t",
            _beam_code(normalize="score / max(t - (tokens[-1] == eos_id), 1) ** length_penalty")),
    Mistake("uses GNMT's length penalty, ((5 + length) / 6) ** length_penalty (Wu et al., 2016)",
            "this course's beam search divides by num_generated_tokens ** length_penalty (eos counted, <bos> not), "
            "as the notebook says; GNMT's ((5 + length) / 6) ** alpha ranks finished hypotheses differently",
            _beam_code(normalize="score / ((5 + t) / 6) ** length_penalty")),
    Mistake("sums probabilities instead of log-probabilities",
            "a sequence's probability is a product: add log-probabilities (log_softmax), not probabilities",
            _beam_code(logp="torch.softmax(logits.double(), -1)")),
    Mistake("uses raw logits as log-probabilities (no log_softmax)",
            "normalize each step's logits with log_softmax before adding them up",
            _beam_code(logp="logits.double()")),
    Mistake("hypotheses unfinished at max_len do not compete",
            "when max_len is reached, the live hypotheses are candidates too (scored like the others)",
            _beam_code(choose="best = max([h for h in finished if h[1][-1] == eos_id] or finished, "
                              "key=lambda h: h[0])[1]")),
    Mistake("no source padding mask (the decoder attends to source padding)",
            "pass memory_mask = (src != pad_id)[:, None, None, :] to encode and decode",
            _beam_code(src_mask="None")),
    Mistake("prefers a hypothesis still unfinished at max_len over the finished ones",
            "at max_len the live hypotheses join the finished ones as candidates, scored alike: return the best "
            "score of them all, whether it ends with eos or not",
            _beam_code(choose="best = max([h for h in finished if h[1][-1] != eos_id] or finished, "
                              "key=lambda h: h[0])[1]")),
)


# Told by beam_search's last case (a hand-made model), not searched for in the exhaustive ones.
EARLY_STOP_MISTAKE = Mistake(
    "stops once the best finished hypothesis beats every live one's score so far",
    "a live hypothesis can still overtake a finished one: each likely token it adds raises its average "
    "sum(log p) / length ** length_penalty. Go on until no hypothesis is live or max_len is reached",
    _beam_code(stop="ys.size(0) == 0 or (finished and max(h[0] for h in finished) >= float(scores.max()) / "
                    "t ** length_penalty)"))
# Told by beam_search's narrow-beam case: finished hypotheses that keep their places crowd the live ones out.
# Stopping once beam_size hypotheses have finished (Hugging Face's early_stopping=True) ends exactly as this does on
# that case (a wrong-code audit: told only "keeps finished hypotheses", a student whose beam was right looked there):
# the diagnosis names both.
STAY_MISTAKE = Mistake(
    "keeps finished hypotheses in the beam (they hold places the live hypotheses need), or stops once beam_size "
    "hypotheses have finished",
    "a hypothesis that ends with eos leaves the beam for the list of finished ones: each step's beam_size places "
    "go to the best live candidates, and the search goes on until none is live or max_len is reached, however many "
    "have finished (not until beam_size have: a live one can still overtake them)",
    '''
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    with torch.no_grad():
        out = []
        for b in range(src.size(0)):
            beam, finished = [([bos_id], 0.0)], []   # (tokens, sum of log p); a finished one keeps its place
            for t in range(1, max_len + 1):
                live = [h for h in beam if h[0][-1] != eos_id]
                if not live:
                    break
                ys = torch.tensor([tokens for tokens, _ in live])
                s = src[b:b + 1].expand(len(live), -1)
                src_mask = (s != pad_id)[:, None, None, :]
                logits = model.decode(ys, model.encode(s, src_mask), torch.ones(t, t, dtype=torch.bool).tril(),
                                      src_mask)[:, -1]
                logp = torch.log_softmax(logits.double(), -1)
                candidates = [h for h in beam if h[0][-1] == eos_id]
                candidates += [(tokens + [v], score + float(logp[i, v]))
                               for i, (tokens, score) in enumerate(live) for v in range(logp.size(-1))]
                beam = sorted(candidates, key=lambda h: -h[1])[:beam_size]
                finished += [h for h in beam if len(h[0]) == t + 1 and (h[0][-1] == eos_id or t == max_len)]
            best = max(finished, key=lambda h: h[1] / (len(h[0]) - 1) ** length_penalty)[0]
            out.append(best)
        L = max(len(h) for h in out)
        return torch.tensor([h + [pad_id] * (L - len(h)) for h in out])
''')
# In the order the diagnosis tries them, which the exhaustive cases are chosen to respect (see _told_apart). The two
# made for a hand-made case each are tried first there (on the late winner, copies of <bos> end as an early stop
# does; on the narrow beam, stopping at the first finished hypothesis ends as a crowded beam does).
_BEAM_DIAGNOSED = BEAM_MISTAKES[:1] + (EARLY_STOP_MISTAKE,) + BEAM_MISTAKES[1:] + (STAY_MISTAKE,)


# Masks the tiny models of the exhaustive cases ignore (they are causal and read memory_mask only): the
# masked model of beam_search_greedy's last case catches these.
BEAM_MASK_MISTAKES = (
    Mistake("decodes without the causal target mask (tgt_mask=None)",
            "at inference too, pass the causal target mask to model.decode (make_masks gives it): every call "
            "recomputes every position, and without the mask the earlier positions read the later tokens",
            _beam_code(tgt_mask="None")),
    Mistake("the encoder gets no source mask (model.encode(src, None))",
            "pass src_mask to model.encode as well as to model.decode: without it the encoder's self-attention "
            "reads the padding, and every source position's memory changes",
            _beam_code(enc_mask="None")),
)


# The mistakes that pick another finished hypothesis: the beam-search cases catch each of them (with a
# wrong answer of its own). Each has a cheap stand-in computed from the enumeration (what the search
# returns with that mistake, when the beam does not get in the way), tested before the mistakes are run.
_LENGTH_AND_SEARCH_MISTAKES = tuple(m.name for m in BEAM_MISTAKES[:6])
_PROXIES = dict(zip(_LENGTH_AND_SEARCH_MISTAKES, (   # one proxy per mistake
    lambda lp: "first finished",
    lambda lp: "greedy",
    lambda lp: dict(length_penalty=0.0),
    lambda lp: dict(length_penalty=lp, count_bos=True),
    lambda lp: dict(length_penalty=lp, count_eos=False),
    lambda lp: dict(length_penalty=lp, gnmt=True),
), strict=True))


# --------------------------------------------------------------------------- sampling
N_DRAWS = 100_000
SNAP = 0.01     # frequencies this close to the exact probability count as equal (noise is < 0.002)


def _exact_probs(logits, temperature, top_k):
    x = logits.double() / temperature
    if top_k is not None:
        kth = x.topk(min(top_k, x.size(-1)), dim=-1).values[..., -1:]  # top_k past the vocabulary keeps every token
        x = x.masked_fill(x < kth, float("-inf"))
    return torch.softmax(x, dim=-1).numpy()


def _draws(f, logits, temperature, top_k, seed=1234):
    """Runs in the sandbox: N_DRAWS draws per row of `logits`, as the sampler returned them. (Under
    fork_rng: a sampler that reseeds torch's global generator leaves it as it was, here and where the
    grader runs the catalogued mistakes.)"""
    rows, V = logits.shape
    many = logits[:, None, :].expand(rows, N_DRAWS, V).contiguous()
    with torch.random.fork_rng(devices=[]):
        return f(many, temperature=temperature, top_k=top_k, generator=torch.Generator().manual_seed(seed))


def _distribution(logits, temperature, top_k):
    """derive (trusted side) for the sampling cases: the draws -> (their shape, a scalar of their dtype,
    frequencies per row snapped to the exact probabilities). The logits come from the case itself."""
    def distribution(draws):
        if not isinstance(draws, torch.Tensor):
            return draws, None, None
        rows, V = logits.shape
        p = _exact_probs(logits, temperature, top_k)
        freq = np.zeros((rows, V))
        if tuple(draws.shape) == (rows, N_DRAWS) and not draws.dtype.is_complex:
            d = draws.detach().cpu().long()
            for r in range(rows):
                valid = d[r][(d[r] >= 0) & (d[r] < V)]
                freq[r] = np.bincount(valid.numpy(), minlength=V)[:V] / N_DRAWS
        snapped = np.where(np.abs(freq - p) <= SNAP, p, freq)
        return torch.tensor(list(draws.shape)), torch.zeros(1, dtype=draws.dtype), snapped

    return distribution


def _distinct_logits(rng, rows, V, spread=2.0):
    """Logits [rows, V] whose values in a row are at least 0.1 apart (so top-k is well defined)."""
    x = np.sort(rng.normal(scale=spread, size=(rows, V)), axis=-1) + 0.1 * np.arange(V)
    x = np.take_along_axis(x, np.argsort(rng.uniform(size=(rows, V)), axis=-1), axis=-1)
    return torch.from_numpy(x.astype(np.float32))


def _sampling_cases(rng):
    cases = []
    for rows, V, T in [(1, 6, 1.0), (3, 8, 0.5), (2, 7, 2.0), (2, 5, 0.8)]:
        logits = _distinct_logits(rng, rows, V, 1.5)
        cases.append(Case(f"{N_DRAWS:,} draws from each of {rows} rows of logits [{V}], temperature={T:g} "
                          f"(logits [{rows}, {N_DRAWS}, {V}] in one call, compared by frequency)",
                          lambda f, x=logits, T=T: _draws(f, x.clone(), T, None),
                          derive=_distribution(logits.clone(), T, None)))
    return cases


def _top_k_cases(rng):
    cases = []
    for rows, V, T, k in [(2, 8, 1.0, 3), (1, 6, 1.0, 1), (3, 10, 0.7, 5), (2, 6, 1.5, 2), (1, 6, 1.0, 9)]:  # 9 > V: all
        logits = _distinct_logits(rng, rows, V, 1.0)
        cases.append(Case(f"{N_DRAWS:,} draws from each of {rows} rows of logits [{V}], temperature={T:g}, top_k={k}",
                          lambda f, x=logits, T=T, k=k: _draws(f, x.clone(), T, k),
                          derive=_distribution(logits.clone(), T, k)))
    return cases


def _two_draws(f, logits, top_k):
    """Runs in the sandbox: two calls with generators seeded alike, as the sampler returned them."""
    with torch.random.fork_rng(devices=[]):
        a = f(logits.clone(), temperature=1.0, top_k=top_k, generator=torch.Generator().manual_seed(7))
        b = f(logits.clone(), temperature=1.0, top_k=top_k, generator=torch.Generator().manual_seed(7))
    return a, b


def _one_generator_twice(f, logits):
    """Runs in the sandbox: two calls with one generator, the second after the first has drawn from it."""
    with torch.random.fork_rng(devices=[]):
        g = torch.Generator().manual_seed(7)
        return f(logits.clone(), temperature=1.0, generator=g), f(logits.clone(), temperature=1.0, generator=g)


def _different_draws(result) -> np.ndarray:
    """derive (trusted side): (a, b) -> [both are tensors of one shape and they differ]."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"expected the two calls' draws, got {type(result).__name__}")
    a, b = result
    return flag(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and not torch.equal(a, b))


def _under_two_global_states(f, logits):
    """Runs in the sandbox: a call with a generator seeded 7 after torch.manual_seed(1), torch's global
    random state before and after it, and the same call after torch.manual_seed(2)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        before = torch.random.get_rng_state()
        a = f(logits.clone(), temperature=1.0, generator=torch.Generator().manual_seed(7))
        after = torch.random.get_rng_state()
        torch.manual_seed(2)
        b = f(logits.clone(), temperature=1.0, generator=torch.Generator().manual_seed(7))
    return a, b, before, after


def _generator_only(result) -> np.ndarray:
    """derive (trusted side): (a, b, before, after) -> [the draws are the same whatever torch's global
    random state, the call left torch's global random state as it was]."""
    if not isinstance(result, (tuple, list)) or len(result) != 4:
        raise TypeError(f"expected two calls' draws and two random states, got {type(result).__name__}")
    a, b, before, after = result
    same = _same_draws((a, b))[0]
    untouched = (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                 and before.shape == after.shape and torch.equal(before, after))
    return np.array([same, untouched])


def _same_draws(result) -> np.ndarray:
    """derive (trusted side): (a, b) -> [both are tensors and they are equal]."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"expected the two calls' draws, got {type(result).__name__}")
    a, b = result
    same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
            and a.shape == b.shape and torch.equal(a, b))
    return flag(same)


def _rejects_temperature(f, logits, temperature):
    """Whether sample_next_token(logits, temperature=temperature) raised ValueError ([True] / [False]):
    any other exception (NotImplementedError included) is not the asked-for ValueError, so [False]."""
    return raises(ValueError, f, logits.clone(), temperature=temperature, otherwise=Exception)


def _sampling_argument_cases(rng):
    logits = _distinct_logits(rng, 200, 9, 1.0)
    return [
        Case("two calls with generators seeded alike must draw the same tokens (returns whether they did)",
             lambda f: _two_draws(f, logits, None), derive=_same_draws),
        Case("the same with top_k=4 (returns whether they did)", lambda f: _two_draws(f, logits, 4),
             derive=_same_draws),
        Case("temperature=0 must raise ValueError (returns whether it did)", lambda f: _rejects_temperature(f, logits, 0.0)),
        Case("temperature=-1 must raise ValueError (returns whether it did)", lambda f: _rejects_temperature(f, logits, -1.0)),
        Case("a call with a generator seeded 7 under two different global random states (torch.manual_seed(1), "
             "then (2)): the draws must come from the generator alone, and the call must leave torch's global "
             "random state as it was (returns [same draws, global state untouched])",
             lambda f: _under_two_global_states(f, logits), derive=_generator_only),
        Case("one generator used for two calls: the second call continues from where the first left the "
             "generator, so it must draw other tokens (returns whether it did)",
             lambda f: _one_generator_twice(f, logits), derive=_different_draws),
        keeps_inputs("sample_next_token(logits [200, 9], temperature=0.5, top_k=4, a generator seeded 7): the shape "
                     "of the draws (logits /= temperature compounded over a sampling loop that reuses its logits, "
                     "and a top-k mask written in place dropped those tokens for good)",
                     lambda f, x: torch.tensor(list(f(x, temperature=0.5, top_k=4,
                                                      generator=torch.Generator().manual_seed(7)).shape)), logits),
    ]


_SAMPLE_TEMPLATE = '''
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    {check}
    logits = {scale}
    if top_k is not None:
        kth = {kth}
        logits = logits.masked_fill({drop}, float("-inf"))
    probs = {probs}
    {draw}
'''
_SAMPLE_RIGHT = dict(
    check='if not temperature > 0:\n        raise ValueError("temperature must be > 0")',
    scale="logits / temperature", kth="logits.topk(min(top_k, logits.size(-1)), dim=-1).values[..., -1:]", drop="logits < kth",
    probs="torch.softmax(logits, dim=-1)",
    draw="return torch.multinomial(probs.reshape(-1, probs.size(-1)), 1, generator=generator).reshape(probs.shape[:-1])")


def _sample_code(**changes) -> str:
    return _SAMPLE_TEMPLATE.format(**{**_SAMPLE_RIGHT, **changes})


SAMPLE_MISTAKES = (
    Mistake("multiplied the logits by the temperature instead of dividing",
            "divide by the temperature: T < 1 sharpens the distribution, T > 1 flattens it",
            _sample_code(scale="logits * temperature")),
    Mistake("divided the probabilities by the temperature (after softmax: no effect at all)",
            "divide the *logits* by the temperature, before the softmax",
            _sample_code(probs="torch.softmax(logits * temperature, dim=-1) / temperature")),
    Mistake("returned the most likely token (argmax) instead of sampling",
            "draw from the distribution, e.g. torch.multinomial(probs, 1, generator=generator)",
            _sample_code(draw="return probs.argmax(dim=-1)")),
    Mistake("top_k larger than the vocabulary raises (logits.topk(top_k) with top_k > V)",
            "a top_k of V or more keeps every token: take logits.topk(min(top_k, logits.size(-1)))",
            _sample_code(kth="logits.topk(top_k, dim=-1).values[..., -1:]")),
    Mistake("top-k kept the k smallest logits",
            "keep the k *largest*: logits.topk(k) gives them, mask everything below the k-th largest",
            _sample_code(drop="logits > (-logits).topk(min(top_k, logits.size(-1)), dim=-1).values[..., -1:].neg()")),
    Mistake("top-k kept only k-1 tokens (masked the k-th largest too)",
            "mask the logits *strictly* smaller than the k-th largest (logits < kth), so k tokens remain",
            _sample_code(drop="logits <= kth")),
    Mistake("top-k kept k+1 tokens (the threshold taken at the (k+1)-th largest)",
            "the k-th largest logit is logits.topk(top_k).values[..., -1:]: mask the logits strictly below it, so "
            "exactly k tokens can be drawn",
            _sample_code(kth="logits.topk(min(top_k + 1, logits.size(-1)), dim=-1).values[..., -1:]")),
    Mistake("softmax over the wrong axis",
            "the distribution is over the vocabulary: softmax(..., dim=-1)",
            _sample_code(probs="torch.softmax(logits, dim=0)")),
    Mistake("ignores the generator (draws from the global random state)",
            "pass generator=generator to the sampling call (torch.multinomial, torch.rand, ...)",
            _sample_code(draw="return torch.multinomial(probs.reshape(-1, probs.size(-1)), 1).reshape(probs.shape[:-1])")),
    Mistake("seeds torch's global random generator instead of drawing with `generator`",
            "don't call torch.manual_seed in the sampler: pass the generator to the sampling call "
            "(torch.multinomial(probs, 1, generator=generator)), so that each call continues from the "
            "generator's state and the rest of the program's random numbers are left alone",
            _sample_code(draw="torch.manual_seed(generator.initial_seed() if generator is not None else 0)\n"
                              "    return torch.multinomial(probs.reshape(-1, probs.size(-1)), 1).reshape(probs.shape[:-1])")),
    Mistake("no ValueError for a temperature <= 0",
            "check the temperature first: raise ValueError unless temperature > 0",
            _sample_code(check="pass")),
)

# --------------------------------------------------------------------------- Seq2SeqTransformer
# The learner assembles the model from the course's layers. Judged against the library's model
# (attention_course.model.Seq2SeqTransformer) with one random state dict loaded into both, in evaluation
# mode: the logits of forward and of encode/decode, the learner's state dict loaded back into the library's
# model (strict), and the gradients of every parameter name (tied weights share one summed gradient).
MODEL_FORBIDDEN = tuple(reference_guard(model_ref)) + torch_attention(*(
    (f, "it calls PyTorch's built-in Transformer; assemble the model from the course's EncoderLayer and "
        "DecoderLayer yourself") for f in (nn.Transformer.forward, nn.TransformerEncoder.forward,
                                           nn.TransformerDecoder.forward)),
    allowed=(F.scaled_dot_product_attention,))  # the course's own layers call it
# (src_vocab, tgt_vocab, d_model, heads, encoder layers, decoder layers, d_ff, max_len, share_embeddings, norm_first)
MODEL_CONFIGS = [
    (11, 13, 16, 4, 2, 1, 32, 20, False, False),   # post-norm, two vocabularies
    (12, 12, 16, 2, 1, 2, 24, 16, True, True),     # pre-norm, one shared matrix
    (10, 10, 8, 2, 2, 2, 16, 12, False, True),     # pre-norm, one vocabulary size but two matrices
    (9, 9, 12, 3, 1, 1, 16, 10, True, False),      # post-norm, shared
]
_TIED = ("src_embed.weight", "tgt_embed.weight", "generator.weight")


def _model_kwargs(cfg) -> dict:
    V_src, V_tgt, d, H, n_enc, n_dec, d_ff, max_len, share, norm_first = cfg
    return dict(d_model=d, num_heads=H, num_encoder_layers=n_enc, num_decoder_layers=n_dec, d_ff=d_ff,
                dropout=0.1, max_len=max_len, share_embeddings=share, norm_first=norm_first)


def _model_text(cfg) -> str:
    V_src, V_tgt = cfg[:2]
    args = ", ".join(f"{k}={v}" for k, v in _model_kwargs(cfg).items())
    return f"Seq2SeqTransformer({V_src}, {V_tgt}, {args}) in evaluation mode"


def _model_state(cfg, rng) -> dict:
    """Random weights for every parameter of the library's model of `cfg` (LayerNorm scales near 1), the
    real sinusoidal table, and one matrix under the three tied names when share_embeddings."""
    template = model_ref.Seq2SeqTransformer(cfg[0], cfg[1], fused=False, **_model_kwargs(cfg))
    state = random_state(template, rng)
    state["positional.pe"] = template.positional.pe.clone()
    if cfg[8]:
        for name in _TIED[1:]:
            state[name] = state[_TIED[0]].clone()
    return state


def _model_inputs(rng, cfg, B=3, S=6, T=5):
    """src [B, S] and tgt [B, T] (padding id 0, one row of each without padding) and their masks."""
    src = ids(rng, B, S, 1, cfg[0], 0, [S] + list(rng.integers(2, S, size=B - 1)))
    tgt = ids(rng, B, T, 1, cfg[1], 0, [T] + list(rng.integers(2, T, size=B - 1)))
    src_mask = (src != 0)[:, None, None, :]                                           # [B, 1, 1, S]
    tgt_mask = torch.ones(T, T, dtype=torch.bool).tril() & (tgt != 0)[:, None, None, :]   # [B, 1, T, T]
    return src, tgt, src_mask, tgt_mask


def _built(cls, cfg, state):
    return load_state(cls(cfg[0], cfg[1], **_model_kwargs(cfg)), state, check_shapes=False)


def _model_forward(cls, cfg, state, src, tgt, src_mask, tgt_mask, with_state=False):
    model = _built(cls, cfg, state)
    with torch.no_grad():
        logits = model(src.clone(), tgt.clone(), src_mask.clone(), tgt_mask.clone())
    if not with_state:
        return logits
    return logits, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _model_encode_decode(cls, cfg, state, src, tgt, src_mask, tgt_mask):
    model = _built(cls, cfg, state)
    with torch.no_grad():
        memory = model.encode(src.clone(), src_mask.clone())
        return memory, model.decode(tgt.clone(), memory.clone(), tgt_mask.clone(), src_mask.clone())


def _model_gradients(cls, cfg, state, src, tgt, src_mask, tgt_mask, names, weights):
    """The gradient of a fixed random linear function of the logits, for every parameter name of the
    library's model (a tied matrix answers under each of its names with the one summed gradient)."""
    model = _built(cls, cfg, state)
    model.zero_grad()
    (model(src.clone(), tgt.clone(), src_mask.clone(), tgt_mask.clone()) * weights).sum().backward()
    params = dict(model.named_parameters(remove_duplicate=False))
    return [params[n].grad if n in params and params[n].grad is not None else torch.zeros(0) for n in names]


def _loads_into_library(cfg, src, tgt, src_mask, tgt_mask):
    """derive (trusted side): (the logits, [the state dict loads into the library's model with strict=True],
    the library model's logits with those weights)."""
    def derive(out):
        logits, state = out
        library = model_ref.Seq2SeqTransformer(cfg[0], cfg[1], fused=False, **_model_kwargs(cfg)).eval()
        try:
            library.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=True)
        except (RuntimeError, TypeError, ValueError, AttributeError):
            return logits, flag(False), torch.zeros(0)
        with torch.no_grad():
            return logits, flag(True), library(src, tgt, src_mask, tgt_mask)
    return derive


def _model_cases(rng):
    cases = []
    for cfg in MODEL_CONFIGS:
        state = _model_state(cfg, rng)
        src, tgt, src_mask, tgt_mask = _model_inputs(rng, cfg)
        what = f"src {list(src.shape)} and tgt {list(tgt.shape)} with padding, src_mask and tgt_mask from make_masks"
        cases.append(Case(f"{_model_text(cfg)}, forward(src, tgt, src_mask, tgt_mask): the logits ({what})",
                          called_twice(lambda cls, c=cfg, s=state, a=src, b=tgt, m=src_mask, t=tgt_mask:
                                       _model_forward(cls, c, s, a, b, m, t)), derive=same_both_times()))
        cases.append(Case(f"{_model_text(cfg)}: memory = encode(src, src_mask), then decode(tgt, memory, tgt_mask, "
                          f"src_mask) ({what})",
                          called_twice(lambda cls, c=cfg, s=state, a=src, b=tgt, m=src_mask, t=tgt_mask:
                                       _model_encode_decode(cls, c, s, a, b, m, t)), derive=same_both_times()))
    cfg = MODEL_CONFIGS[1]
    state = _model_state(cfg, rng)
    src, tgt, src_mask, tgt_mask = _model_inputs(rng, cfg)
    cases.append(Case(f"{_model_text(cfg)}: the logits, then whether your model's state_dict() loads into the "
                      "library's Seq2SeqTransformer with strict=True (the same parameter names, nothing more), "
                      "then the library model's logits with your weights",
                      lambda cls, c=cfg, s=state, a=src, b=tgt, m=src_mask, t=tgt_mask:
                      _model_forward(cls, c, s, a, b, m, t, with_state=True),
                      derive=_loads_into_library(cfg, src, tgt, src_mask, tgt_mask)))
    kwargs = {**_model_kwargs(cfg), "dropout": 0.5}
    built = f"Seq2SeqTransformer({cfg[0]}, {cfg[1]}, {', '.join(f'{k}={v}' for k, v in kwargs.items())})"
    x = torch.as_tensor(rng.normal(size=(2, 4, kwargs["d_model"])), dtype=torch.float32)
    cases.append(dropout_in_every_sublayer(
        built, lambda cls, s=state: load_state(cls(cfg[0], cfg[1], **kwargs), s, check_shapes=False),
        ("encoder_layers.0.self_attn", "encoder_layers.0.ff", "decoder_layers.0.self_attn",
         "decoder_layers.0.cross_attn", "decoder_layers.0.ff"), x, 0.5))
    src = torch.from_numpy(rng.integers(1, cfg[0], size=(4, 10)).astype(np.int64))
    probe = {**_model_kwargs(cfg), "dropout": 0.5, "num_encoder_layers": 0, "norm_first": False}
    cases.append(Case(f"Seq2SeqTransformer({cfg[0]}, {cfg[1]}, {', '.join(f'{k}={v}' for k, v in probe.items())}) "
                      "in training mode: encode(src [4, 10]) is the embeddings "
                      "plus positions after their dropout; is about half of it zeroed (between 0.35 and 0.65)? (the "
                      "paper drops the sum of the embeddings and the positions, once: PositionalEncoding gets "
                      "`dropout`)", lambda cls, c=cfg, s=src: _embedding_zeros(cls, c, s), derive=_about_half))
    return cases


def _embedding_zeros(cls, cfg, src):
    """The share of exact zeros in encode(src) of a model with no encoder layer, dropout 0.5, in training mode."""
    kwargs = {**_model_kwargs(cfg), "dropout": 0.5, "num_encoder_layers": 0, "norm_first": False}
    model = cls(cfg[0], cfg[1], **kwargs).train()
    with torch.no_grad():
        out = model.encode(src.clone())
    return torch.tensor([float((out == 0).double().mean())])


def _about_half(share):
    """derive (trusted side): the share of zeros -> [it is between 0.35 and 0.65] (0.5 +- 7 standard deviations of
    640 draws; none: no dropout; 0.75: dropout applied twice)."""
    value = float(torch.as_tensor(share).reshape(-1)[0]) if isinstance(share, torch.Tensor) and share.numel() else -1.0
    return flag(0.35 <= value <= 0.65)


def _model_gradient_cases(rng):
    cases = []
    for cfg in MODEL_CONFIGS:
        state = _model_state(cfg, rng)
        src, tgt, src_mask, tgt_mask = _model_inputs(rng, cfg)
        names = [n for n, _ in model_ref.Seq2SeqTransformer(cfg[0], cfg[1], fused=False, **_model_kwargs(cfg))
                 .named_parameters(remove_duplicate=False)]
        weights = torch.from_numpy(rng.normal(size=(*tgt.shape, cfg[1])).astype(np.float32))
        tied = "one matrix under src_embed, tgt_embed and generator" if cfg[8] else "three separate matrices"
        cases.append(Case(f"{_model_text(cfg)}: the gradient of every parameter ({len(names)} names, in the library "
                          f"model's order; {tied}) for a random linear function of forward's logits",
                          lambda cls, c=cfg, s=state, a=src, b=tgt, m=src_mask, t=tgt_mask, n=names, w=weights:
                          _model_gradients(cls, c, s, a, b, m, t, n, w)))
    return cases


MODEL_SOURCE = """
class Seq2SeqTransformer(nn.Module):
    def __init__(self, src_vocab_size, tgt_vocab_size, d_model=256, num_heads=4, num_encoder_layers=3,
                 num_decoder_layers=3, d_ff=1024, dropout=0.1, max_len=256, share_embeddings=False,
                 norm_first=False):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = self.src_embed if share_embeddings else nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_encoder_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_decoder_layers))
        self.encoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if share_embeddings:
            self.generator.weight = self.tgt_embed.weight

    def embed_tokens(self, embedding, tokens):
        return self.positional(embedding(tokens) * math.sqrt(self.d_model))

    def encode(self, src, src_mask=None):
        x = self.embed_tokens(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        y = self.embed_tokens(self.tgt_embed, tgt)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask, memory_mask)
        return self.generator(self.decoder_norm(y))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, src_mask)
"""
_EMBED = "return self.positional(embedding(tokens) * math.sqrt(self.d_model))"
MODEL_MISTAKES = (
    Mistake("the embeddings never dropped (PositionalEncoding built without `dropout`)",
            "the paper drops the sum of the embeddings and the positions: PositionalEncoding(d_model, max_len, "
            "dropout), whose forward adds the positions and then applies its dropout (once: not again after it)",
            variant(MODEL_SOURCE, ("self.positional = PositionalEncoding(d_model, max_len, dropout)",
                                   "self.positional = PositionalEncoding(d_model, max_len)"))),
    Mistake("embeddings not scaled by sqrt(d_model)",
            "multiply the token embeddings by math.sqrt(self.d_model) before the positions are added: "
            "positional(embedding(tokens) * sqrt(d_model))",
            variant(MODEL_SOURCE, (_EMBED, "return self.positional(embedding(tokens))"))),
    Mistake("the positions scaled too (sqrt(d_model) applied after adding the positional encoding)",
            "scale the embeddings first, then add the positions: positional(embedding(tokens) * sqrt(d_model)); "
            "the sinusoids keep their size",
            variant(MODEL_SOURCE, (_EMBED, "return self.positional(embedding(tokens)) * math.sqrt(self.d_model)"))),
    Mistake("the positional encoding added twice",
            "embed_tokens adds the positions once (self.positional); encode and decode use its result as it is",
            variant(MODEL_SOURCE, (_EMBED, "return self.positional(self.positional(embedding(tokens) * "
                                           "math.sqrt(self.d_model)))"))),
    Mistake("the final LayerNorm not applied (encoder_norm / decoder_norm built but unused)",
            "a pre-norm stack never normalizes its residual stream: encode returns encoder_norm(x), decode "
            "applies decoder_norm before the generator (both are nn.Identity for post-norm)",
            variant(MODEL_SOURCE, ("return self.encoder_norm(x)", "return x"),
                    ("return self.generator(self.decoder_norm(y))", "return self.generator(y)"))),
    Mistake("the encoder's layers do not get src_mask (the encoder attends to source padding)",
            "pass the mask to every encoder layer: x = layer(x, src_mask)",
            variant(MODEL_SOURCE, ("x = layer(x, src_mask)", "x = layer(x)"))),
    Mistake("the decoder's layers do not get tgt_mask (no causal mask: the decoder sees the future)",
            "pass the target mask to every decoder layer: layer(y, memory, tgt_mask, memory_mask)",
            variant(MODEL_SOURCE, ("layer(y, memory, tgt_mask, memory_mask)", "layer(y, memory, None, memory_mask)"))),
    Mistake("the source padding mask not passed to the decoder (cross-attention attends to source padding)",
            "forward passes src_mask twice: to encode, and to decode as memory_mask: "
            "decode(tgt, encode(src, src_mask), tgt_mask, src_mask)",
            variant(MODEL_SOURCE, ("self.encode(src, src_mask), tgt_mask, src_mask)",
                                   "self.encode(src, src_mask), tgt_mask)"))),
    Mistake("the target tokens embedded with the source embedding",
            "decode embeds the target with self.tgt_embed (the same matrix only when share_embeddings=True)",
            variant(MODEL_SOURCE, ("self.embed_tokens(self.tgt_embed, tgt)", "self.embed_tokens(self.src_embed, tgt)"))),
    Mistake("the generator not tied to the target embedding (share_embeddings=True)",
            "with share_embeddings=True the output layer uses the target embedding's matrix: "
            "self.generator.weight = self.tgt_embed.weight (one parameter, whose gradient sums both uses)",
            variant(MODEL_SOURCE, ("            self.generator.weight = self.tgt_embed.weight\n", ""),
                    ("        if share_embeddings:\n", ""))),
)
MODEL_NAMESPACE = {"EncoderLayer": EncoderLayer, "DecoderLayer": DecoderLayer, "PositionalEncoding": PositionalEncoding}


EXERCISES = [
    Exercise("make_masks", ref.make_masks, lambda rng: _mask_cases(rng, False), MASK_MISTAKES, forbidden=HONESTY),
    Exercise("make_masks_padding", ref.make_masks, lambda rng: _mask_cases(rng, True), MASK_MISTAKES,
             forbidden=HONESTY, graded="make_masks"),
    Exercise("label_smoothed_cross_entropy", ref.label_smoothed_cross_entropy, _ls_cases, LS_MISTAKES,
             rtol=RTOL, atol=ATOL, forbidden=HONESTY),
    Exercise("label_smoothed_cross_entropy_stability", ref.label_smoothed_cross_entropy, _ls_stability_cases,
             LS_MISTAKES, rtol=RTOL, atol=1e-4, forbidden=HONESTY, graded="label_smoothed_cross_entropy"),
    Exercise("inverse_sqrt_lr", ref.inverse_sqrt_lr, _lr_cases, LR_MISTAKES, rtol=1e-6, atol=1e-12,
             forbidden=HONESTY),
    Exercise("greedy_decode", ref.greedy_decode, _greedy_cases, GREEDY_MISTAKES, forbidden=HONESTY),
    Exercise("greedy_decode_source_padding", ref.greedy_decode, _greedy_padding_cases, GREEDY_MISTAKES,
             forbidden=HONESTY, graded="greedy_decode"),
    Exercise("beam_search", exhaustive_search, _beam_cases, _BEAM_DIAGNOSED, forbidden=HONESTY),
    Exercise("beam_search_length_penalty", exhaustive_search, _beam_length_penalty_cases, _BEAM_DIAGNOSED,
             forbidden=HONESTY, graded="beam_search"),
    Exercise("beam_search_greedy", _greedy_as_beam, _beam_greedy_cases, BEAM_MISTAKES + BEAM_MASK_MISTAKES,
             forbidden=HONESTY,
             graded="beam_search"),
    Exercise("sample_next_token", ref.sample_next_token, _sampling_cases, SAMPLE_MISTAKES, rtol=0, atol=0.02,
             forbidden=HONESTY),
    Exercise("sample_next_token_top_k", ref.sample_next_token, _top_k_cases, SAMPLE_MISTAKES, rtol=0, atol=0.02,
             forbidden=HONESTY, graded="sample_next_token"),
    Exercise("sample_next_token_generator", ref.sample_next_token, _sampling_argument_cases, SAMPLE_MISTAKES,
             forbidden=HONESTY, graded="sample_next_token"),
    Exercise("Seq2SeqTransformer", model_ref.Seq2SeqTransformer, _model_cases, MODEL_MISTAKES, rtol=RTOL, atol=ATOL,
             forbidden=HONESTY + MODEL_FORBIDDEN, namespace=MODEL_NAMESPACE),
    Exercise("Seq2SeqTransformer_gradients", model_ref.Seq2SeqTransformer, _model_gradient_cases, MODEL_MISTAKES,
             rtol=RTOL, atol=ATOL, forbidden=HONESTY + MODEL_FORBIDDEN, namespace=MODEL_NAMESPACE,
             graded="Seq2SeqTransformer"),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"greedy_decode": ("make_masks",), "beam_search": ("make_masks",)}
