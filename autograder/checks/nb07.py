"""Checks for notebook 07, "Attention at today's scale" (PyTorch): the cost model, the KV cache,
rotary embeddings, grouped-query and multi-head latent attention. (FlashAttention's online softmax and
the sliding-window mask are notebook 08's: checks/nb08.py.)

Modules are compared with the reference by loading one random state dict (the reference's
parameter names) into both, in evaluation mode, so that nothing depends on the order of random
draws inside the student's code. Each exercise is judged on its own: where one takes a cache, the
cases hand it this module's `_Cache` (the API of the notebook's KVCache, written independently), and
MultiHeadLatentAttention runs with a correct apply_rotary in place of the student's while its cases
run, so a wrong KVCache or apply_rotary costs only its own test cells.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch
import torch.nn.functional as F

from attention_course import efficient as ref
from attention_course.attention import scaled_dot_product_attention
from attention_course.multihead import MultiHeadAttention, merge_heads, split_heads

from .core import (
    Advised,
    Case,
    Exercise,
    Mistake,
    Told,
    keeps_inputs,
    make_checker,
    raises_value_error,
    random_state,
    reference_guard,
    variant,
)
from .tensors import as_float32, causal, load_state, random_mask, shape_text, tensor, torch_attention

HONESTY = tuple(reference_guard(ref))
# the exercises call notebook 02's attention, which the fused kernel's name differs from by `F.` only
NO_BUILTIN = ((F.scaled_dot_product_attention,
               Advised("it calls torch.nn.functional.scaled_dot_product_attention, PyTorch's fused attention, which "
                       "this notebook does not accept; call notebook 02's scaled_dot_product_attention instead (imported "
                       "at the top of this notebook: the same name, without `F.`)")),)
FORBIDDEN = HONESTY + torch_attention(*NO_BUILTIN)
RTOL, ATOL = 1e-4, 1e-5


# --------------------------------------------------------------------------- helpers
def _n(count: int, thing: str) -> str:
    """'1 position', '3 positions'."""
    return f"{count} {thing}" + ("" if count == 1 else "s")


class _Cache:
    """The KV cache the cases hand to cached_attention and the modules: the API of the notebook's
    KVCache (keys[layer] / values[layer], append, seq_len, nbytes), written independently. A method the student
    added to their own KVCache (`like`) works on it too (a fairness audit: a correct cached_attention calling its
    cache's own `get(layer)` got 0/5, told "'_Cache' object has no attribute 'get'", a class it never saw)."""

    def __init__(self, num_layers: int = 1, like: type | None = None):
        self.keys = [None] * num_layers
        self.values = [None] * num_layers
        self._theirs = like
        self._lend_their_attributes(num_layers)

    def _lend_their_attributes(self, num_layers: int) -> None:
        """The attributes the student's own KVCache(num_layers) sets besides its keys and values (self.num_layers,
        which their methods read: a review), copied here; none where their class cannot be built so."""
        if self._theirs is None:
            return
        try:
            theirs = vars(self._theirs(num_layers))
        except Exception:  # noqa: BLE001 - their own class, judged by its own exercise: its methods may still do
            return
        for name, value in theirs.items():
            if isinstance(name, str) and name not in ("keys", "values", "_theirs") and not hasattr(type(self), name):
                self.__dict__.setdefault(name, value)

    def __getattr__(self, name: str):
        theirs = self.__dict__.get("_theirs")
        if theirs is None or name.startswith("__"):
            raise AttributeError(f"the grader's KVCache has no attribute {name!r} (it has keys, values, append, "
                                 "seq_len and nbytes, as the notebook's KVCache does)")
        try:
            found = inspect.getattr_static(theirs, name)
        except AttributeError:
            raise AttributeError(f"KVCache has no attribute {name!r}") from None
        return found.__get__(self, type(self)) if hasattr(found, "__get__") else found

    def append(self, layer, k, v):
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=-2)
        return self.keys[layer], self.values[layer]

    def seq_len(self, layer=0):
        return 0 if self.keys[layer] is None else int(self.keys[layer].shape[-2])

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def _their_kvcache(solution) -> type | None:
    """The notebook's own KVCache class, seen from the student's function or class (None where it has none)."""
    code = solution if hasattr(solution, "__globals__") else getattr(solution, "forward", None)
    found = (getattr(code, "__globals__", None) or {}).get("KVCache")
    return found if isinstance(found, type) else None


def _key(name: str):
    """derive: one entry of the dict attention_flops_and_memory returns."""
    def pick(d):
        if not isinstance(d, dict):
            raise TypeError(f"expected a dict, got {type(d).__name__}")
        if name not in d:
            raise KeyError(f"the dict has no key {name!r} (its keys: {sorted(map(str, d))})")
        if isinstance(d[name], (float, np.floating)):  # the exercise asks for five integers (a wrong-code audit)
            return Told(f"{name!r} is {d[name]!r}, a float: FLOPs and bytes are counted in whole numbers, so return "
                        f"ints. Likely cause: d_model / num_heads (a float, even where it divides evenly) where "
                        f"d_model // num_heads keeps it an int")
        return d[name]
    return pick


# --------------------------------------------------------------------------- cases: cost model
COST_KEYS = ("projection_flops", "score_flops", "score_bytes", "kv_cache_bytes_per_token", "kv_cache_bytes")
COST_CONFIGS = [
    ("GPT-2 small", dict(seq_len=1024, d_model=768, num_heads=12, num_layers=12)),
    ("grouped queries", dict(seq_len=4096, d_model=4096, num_heads=32, num_layers=32, num_kv_heads=8)),
    ("multi-query, float32, a batch of 3", dict(seq_len=100, d_model=64, num_heads=4, num_layers=2, num_kv_heads=1,
                                                batch_size=3, bytes_per_value=4)),
    ("a small odd one", dict(seq_len=7, d_model=48, num_heads=6, num_layers=3, num_kv_heads=3, batch_size=2,
                             bytes_per_value=4)),
    ("DeepSeek-V3's widths as multi-head attention: heads wider than d_model / num_heads",
     dict(seq_len=4096, d_model=7168, num_heads=128, num_layers=61, head_dim=128)),
    ("head_dim given, grouped queries", dict(seq_len=12, d_model=20, num_heads=4, num_layers=2, num_kv_heads=2,
                                            head_dim=6, bytes_per_value=4)),
]


def _args(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def _cost_cases(rng):
    cases = []
    for what, cfg in COST_CONFIGS:
        for key in COST_KEYS:
            cases.append(Case(f"attention_flops_and_memory({_args(cfg)}) ({what}): the value of {key!r}",
                              lambda f, cfg=cfg: f(**cfg), derive=_key(key)))
    bad = dict(seq_len=10, d_model=48, num_heads=6, num_layers=1, num_kv_heads=4)
    good = dict(seq_len=10, d_model=20, num_heads=6, num_layers=1, num_kv_heads=2, head_dim=8)
    cases += [Case(f"attention_flops_and_memory({_args(bad)}): 6 query heads cannot share 4 key/value heads "
                   "evenly, so it must raise ValueError (True = it did)",
                   lambda f: raises_value_error(lambda: f(**bad))),
              Case(f"attention_flops_and_memory({_args(good)}): 20 is not a multiple of 6, but head_dim is given, "
                   "so it must NOT raise ValueError (True = it did)",
                   lambda f: raises_value_error(lambda: f(**good)))]
    uneven = dict(seq_len=10, d_model=50, num_heads=6, num_layers=1)  # d_model // num_heads would cover 48 of 50
    cases.append(Case(f"attention_flops_and_memory({_args(uneven)}): 50 features cannot be split into 6 heads and no "
                      "head_dim is given, so it must raise ValueError (True = it did)",
                      lambda f: raises_value_error(lambda: f(**uneven))))
    return cases


# --------------------------------------------------------------------------- cases: KV cache
def _kv_appends(cls, steps, num_layers):
    """Run `steps` = [(layer, k, v), ...] through a fresh cache; every append's return value."""
    cache = cls(num_layers)
    returned = []
    for layer, k, v in steps:
        out = cache.append(layer, k.clone(), v.clone())
        returned.append(tuple(out) if isinstance(out, (tuple, list)) else out)
    return cache, returned


def _kv_cache_cases(rng):
    def kv(*shape):
        return tensor(rng, *shape), tensor(rng, *shape)

    B, H, D = 2, 3, 4
    one = [(0, *kv(B, H, 4, D)), (0, *kv(B, H, 1, D)), (0, *kv(B, H, 1, D))]
    two = [(0, *kv(B, H, 3, D)), (1, *kv(B, H, 3, D)), (0, *kv(B, H, 1, D)), (1, *kv(B, H, 1, D)),
           (0, *kv(B, H, 2, D))]
    latent = [(0, *kv(B, 5, 6)), (0, *kv(B, 1, 6))]           # MLA's cache: [B, T, r], no heads axis
    k_only = tensor(rng, 1, 2, 3, 8)
    v_wide = tensor(rng, 1, 2, 3, 5)  # values may be narrower or wider than keys
    kv_fixed = [kv(1, 2, 5, 4), kv(1, 2, 1, 4)]

    def lengths(cls):
        cache = cls(3)
        seen = [cache.seq_len(0), cache.seq_len(2)]
        cache.append(0, *kv_fixed[0])
        seen += [cache.seq_len(0), cache.seq_len(1)]
        cache.append(0, *kv_fixed[1])
        cache.append(2, *kv_fixed[1])
        seen += [cache.seq_len(0), cache.seq_len(1), cache.seq_len(2)]
        return np.array(seen)

    def latent_lengths(cls):
        cache, seen = cls(1), []
        for layer, k, v in latent:
            cache.append(layer, k.clone(), v.clone())
            seen.append(cache.seq_len(0))
        return np.array(seen)

    def sizes(cls, dtype=torch.float32):
        cache = cls(2)
        keys, values = k_only.to(dtype), v_wide.to(dtype)
        cache.append(0, keys.clone(), values.clone())
        first = cache.nbytes()
        cache.append(1, keys[..., :1, :].clone(), values[..., :1, :].clone())
        cache.append(0, keys[..., :1, :].clone(), values[..., :1, :].clone())
        return np.array([first, cache.nbytes()])

    longer_k, longer_v = tensor(rng, 1, 2, 50, 8), tensor(rng, 1, 2, 50, 8)

    def sliced(cls):
        cache = cls(1)
        cache.append(0, longer_k.clone()[..., :3, :], longer_v.clone()[..., :3, :])
        return np.array([cache.nbytes()])

    def layers(cls):
        cache, _ = _kv_appends(cls, two, 2)
        return cache.keys[0], cache.values[0], cache.keys[1], cache.values[1]

    return [
        Case(f"KVCache(1): append k, v {shape_text(one[0][1])}, then {shape_text(one[1][1])} twice: what each append returns "
             "(everything cached so far)", lambda cls: _kv_appends(cls, one, 1)[1]),
        Case("KVCache(2): layers 0 and 1 filled alternately (3, 3, then 1, 1, then 2 more on layer 0): "
             "(keys[0], values[0], keys[1], values[1]) at the end", layers),
        Case("KVCache(1) for multi-head latent attention: append [2, 5, 6] then [2, 1, 6] (no heads axis; the time "
             "axis is still the second-to-last): what each append returns", lambda cls: _kv_appends(cls, latent, 1)[1]),
        Case("KVCache(1) for multi-head latent attention: seq_len(0) after appending [2, 5, 6], then after [2, 1, 6] "
             "(5, then 6: the time axis is the second-to-last, whatever the number of axes)", latent_lengths),
        Case("KVCache(3): seq_len(0), seq_len(2) when empty; after 5 positions on layer 0: seq_len(0), seq_len(1); "
             "after 1 more on layers 0 and 2: seq_len(0), seq_len(1), seq_len(2)", lengths),
        Case("KVCache(2), float32 keys [1, 2, 3, 8] and values [1, 2, 3, 5]: nbytes() after the first append, "
             "then after one more position on each layer (bytes, keys and values, all layers)", sizes),
        Case("the same in float16, as a cache is kept for inference (2 bytes per number: the tensors' own element "
             "size, t.element_size())", lambda cls: sizes(cls, torch.float16)),
        Case("KVCache(1): a prefill appended as slices of longer tensors (k_all[..., :3, :], as a model that computed "
             "more keys than it keeps hands them over): nbytes() counts the numbers cached, 2 x 2 x 3 x 8 x 4 = 384 "
             "bytes, not the storage under the slices", sliced),
    ]


# --------------------------------------------------------------------------- cases: cached attention
def _prefilled(layer_fill: dict, num_layers: int = 2, like: type | None = None) -> _Cache:
    """A _Cache whose layers hold the given (k, v) already (`layer_fill`: {layer: (k, v)})."""
    cache = _Cache(num_layers, like)
    for layer, (k, v) in layer_fill.items():
        cache.append(layer, k.clone(), v.clone())
    return cache


def _cached_step(f, q, k, v, fill, layer):
    cache = _prefilled(fill, like=_their_kvcache(f))
    out = f(q.clone(), k.clone(), v.clone(), cache, layer)
    return out, cache.keys[layer], cache.values[layer]


def _cached_attention_cases(rng):
    def x(*shape, scale=1.0):
        return tensor(rng, *shape, scale=scale)

    B, H, D, Dv = 2, 3, 8, 5
    past = {0: (x(B, H, 4, D), x(B, H, 4, Dv))}
    other = {0: (x(B, H, 6, D), x(B, H, 6, Dv)), 1: (x(B, H, 4, D), x(B, H, 4, Dv))}
    short = {0: (x(B, H, 3, D), x(B, H, 3, Dv))}
    step = (x(B, H, 1, D, scale=1.5), x(B, H, 1, D, scale=1.5), x(B, H, 1, Dv))
    prefill = (x(B, H, 5, D, scale=1.5), x(B, H, 5, D, scale=1.5), x(B, H, 5, Dv))
    two = (x(B, H, 2, D, scale=1.5), x(B, H, 2, D, scale=1.5), x(B, H, 2, Dv))
    return [
        Case(f"cache layer 0 holds 4 positions; one new position q_t, k_t {shape_text(step[0])}, v_t {shape_text(step[2])}: "
             "(output, the cache's keys and values afterwards)",
             lambda f: _cached_step(f, *step, past, 0)),
        Case("layer=1 of a cache whose layer 0 holds 6 other positions and layer 1 holds 4: one new position: "
             "(output, layer 1's keys and values afterwards)", lambda f: _cached_step(f, *step, other, 1)),
        Case(f"an empty cache and 5 new positions at once (a prefill), q_t {shape_text(prefill[0])}: each may attend to "
             "itself and the positions before it", lambda f: _cached_step(f, *prefill, {}, 0)),
        Case("a cache holding 3 positions and 2 new ones: new position i (absolute 3 + i) may attend to 0 .. 3 + i",
             lambda f: _cached_step(f, *two, short, 0)),
        # layer 0 longer than layer 1: a past length read from layer 0 shifts the prefill's mask (wrong-code audit 12)
        Case("layer=1 of a cache whose layer 0 holds 6 positions and layer 1 holds 4: 2 new positions at once, new "
             "position i (absolute 4 + i) may attend to 0 .. 4 + i of layer 1: (output, layer 1's keys and values)",
             lambda f: _cached_step(f, *two, other, 1), tells=(PAST_FROM_LAYER_0,)),
        keeps_inputs("a cache holding 3 positions and 2 new ones, q_t, k_t, v_t as above (the caller keeps them)",
                     lambda f, q, k, v: f(q, k, v, _prefilled(short, like=_their_kvcache(f)), 0), *two),
        *_cached_extreme_cases(x, B, H, D, Dv),
    ]


def _cached_extreme_cases(x, B, H, D, Dv) -> list[Case]:
    """Scores a softmax of one's own gets wrong: in the hundreds (exp overflows unless the row's max is subtracted),
    and a future key far above every key a new query may see (a max taken over it, the masked weights zeroed after
    exp(), underflows every allowed weight)."""
    big = (x(B, H, 1, D, scale=10.0), x(B, H, 1, D, scale=10.0), x(B, H, 1, Dv))
    big_past = {0: (x(B, H, 4, D, scale=10.0), x(B, H, 4, Dv))}
    direction = torch.ones(D)
    q_new = torch.stack([3.0 * direction + x(B, H, D, scale=0.3), x(B, H, D)], dim=-2)            # [B, H, 2, D]
    k_new = torch.stack([x(B, H, D), 20.0 * direction + x(B, H, D, scale=0.3)], dim=-2)           # the second: far up
    future = (q_new, k_new, x(B, H, 2, Dv))
    ordinary = {0: (x(B, H, 2, D), x(B, H, 2, Dv))}
    return [
        Case("cache layer 0 holds 4 positions, one new position, every score q . k / sqrt(d) in the hundreds "
             "(exp() overflows unless each row's largest allowed score is subtracted first): (output, keys, values)",
             lambda f: _cached_step(f, *big, big_past, 0), atol=1e-4, tells=("softmax without the max subtracted",)),
        Case("a cache holding 2 positions and 2 new ones, where new position 0's score with new key 1 (its future, "
             "masked) is about +170 and its allowed scores about 1: (output, keys, values)",
             lambda f: _cached_step(f, *future, ordinary, 0),
             tells=("the masked scores' max taken too (the mask applied after exp())",)),
    ]


def _decode(f, q, k, v, chunks, layer=0):
    """Feed q, k, v [B, H, T, D] through f in chunks of the given sizes, with one cache: the outputs joined."""
    cache = _Cache(layer + 1, _their_kvcache(f))
    outs, start = [], 0
    for n in chunks:
        outs.append(f(q[..., start:start + n, :].clone(), k[..., start:start + n, :].clone(),
                      v[..., start:start + n, :].clone(), cache, layer))
        start += n
    return torch.cat(outs, dim=-2)


def _cached_decoding_cases(rng):
    cases = []
    for (B, H, T, D, Dv), chunks in [((1, 2, 7, 4, 4), [3, 1, 1, 1, 1]), ((2, 3, 6, 8, 5), [1] * 6),
                                     ((3, 1, 5, 16, 8), [2, 2, 1])]:
        q, k, v = (tensor(rng, B, H, T, d, scale=1.5) for d in (D, D, Dv))
        cases.append(Case(f"decoding q, k [{B}, {H}, {T}, {D}], v [{B}, {H}, {T}, {Dv}] through one cache in steps of "
                          f"{chunks} positions: the outputs joined (they must equal one causal attention pass over "
                          f"all {T} positions)", lambda f, q=q, k=k, v=v, c=chunks: _decode(f, q, k, v, c)))
    return cases


# --------------------------------------------------------------------------- cases: rotary
def _rotary_cases(rng):
    def x(*shape):
        return tensor(rng, *shape)

    settings = [
        ("x [6, 8], positions 0..5", x(6, 8), torch.arange(6), None),
        ("x [2, 3, 5, 16] (batch, heads), positions 7..11 (a decoding offset)", x(2, 3, 5, 16), torch.arange(7, 12), None),
        ("x [4, 4], positions [5, 8, 22, 255]", x(4, 4), torch.tensor([5, 8, 22, 255]), None),
        ("x [3, 10], positions 0..2, base=500.0", x(3, 10), torch.arange(3), 500.0),
        ("x [1, 2, 3, 64], positions [0, 100, 200]", x(1, 2, 3, 64), torch.tensor([0, 100, 200]), None),
    ]
    cases = [Case(f"apply_rotary on {what}", lambda f, t=t, p=p, b=b:
                  f(t.clone(), p.clone()) if b is None else f(t.clone(), p.clone(), base=b))
             for what, t, p, b in settings]
    odd = x(3, 5)
    cases += [Case("apply_rotary on x [3, 5]: an odd feature dimension cannot be split into pairs, so it must raise "
                   "ValueError (True = it did)", lambda f: raises_value_error(lambda: f(odd.clone(), torch.arange(3))))]
    cases.append(keeps_inputs("apply_rotary on x [2, 3, 5, 16], positions 7..11", lambda f, t, p: f(t, p),
                              x(2, 3, 5, 16), torch.arange(7, 12)))
    half = x(2, 4, 8).to(torch.bfloat16)
    cases.append(Case("apply_rotary on x [2, 4, 8] in bfloat16, positions 0..3: the same shape and dtype back "
                      "(a model in bf16 gets bf16)", lambda f: f(half.clone(), torch.arange(4)), atol=2e-2))
    # bfloat16 keeps 8 bits of a number: positions and angles computed in it are off by whole radians past ~256 (the
    # angles of a 4,095th position, in bf16, turned vectors by up to 2.5 against entries of about 2.5)
    far = x(4, 16).to(torch.bfloat16)
    cases.append(Case("apply_rotary on x [4, 16] in bfloat16, positions [0, 300, 1000, 4095]: the angles computed in "
                      "float32 (in bf16, a position like 1000 is rounded by 4 and its angle by whole radians)",
                      lambda f: f(far.clone(), torch.tensor([0, 300, 1000, 4095])), atol=3e-2,
                      tells=("angles computed in bfloat16",)))
    return cases


def _rotary_relative_cases(rng):
    T, D = 6, 16
    q, k = tensor(rng, T, D), tensor(rng, T, D)
    one_q, one_k = tensor(rng, 1, D).expand(12, D), tensor(rng, 1, D).expand(12, D)

    def shifted(f, shift):
        p = torch.arange(T)
        scores = f(q.clone(), p) @ f(k.clone(), p).T
        moved = f(q.clone(), p + shift) @ f(k.clone(), p + shift).T
        return moved - scores

    def diagonals(f):
        p = torch.arange(12)
        s = f(one_q.clone(), p) @ f(one_k.clone(), p).T         # the same q and k, at every position
        return s[1:, 1:] - s[:-1, :-1]

    def lengths(f):
        return f(q.clone(), torch.arange(T) * 37).norm(dim=-1) - q.norm(dim=-1)

    return [
        Case(f"q, k [{T}, {D}] rotated at positions 0..{T - 1}, then all moved 5 positions later: the change of the "
             "scores q_m . k_n (should be 0: they depend on n - m only)", lambda f: shifted(f, 5)),
        Case("the same, moved 123 positions later (should be 0)", lambda f: shifted(f, 123)),
        Case("one query vector and one key vector placed at every position 0..11: score(m + 1, n + 1) - score(m, n) "
             "(should be 0: the score matrix is constant along its diagonals)", diagonals),
        Case("the length of every rotated vector minus its length before (should be 0: a rotation keeps lengths)",
             lengths),
    ]


# --------------------------------------------------------------------------- cases: grouped-query attention
def _gqa_run(cls, cfg, state, x, mask):
    d, H, H_kv = cfg
    m = load_state(cls(d, H, H_kv), state)
    with torch.no_grad():
        out = m(x.clone()) if mask is None else m(x.clone(), mask=mask.clone())
    return tuple(out) if isinstance(out, (tuple, list)) else out


NO_GRADIENT = "forward run under torch.no_grad() (or on detached inputs): no gradient reaches the input or the weights"


def _gradients(module, x, mask) -> tuple:
    """(output, weights, x.grad, each parameter's grad in name order) after backpropagating a fixed random function of
    the output (the weights may come back detached: they are for looking at) through `module` in evaluation mode; an
    output cut off from the graph is not backpropagated, and its grads come back None (a wrong-code audit:
    @torch.no_grad() on forward kept full marks, and notebook 07's own training then never moved the attention)."""
    module.eval()
    xx = x.clone().requires_grad_()
    result = module(xx, mask=mask.clone())
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        return result
    out, weights = result
    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
    return (out, weights, xx.grad, *(p.grad for _, p in sorted(module.named_parameters())))


def _no_gradient(source: str) -> Mistake:
    """The layer's forward under @torch.no_grad(), in the catalogue of the layer written by `source`."""
    return Mistake(NO_GRADIENT, "a layer that trains needs its graph: remove @torch.no_grad() (and any .detach()) from "
                                "forward; generation code may wrap its own calls in torch.no_grad(), the layer must not",
                   variant(source, ("    def forward(self, x, mask=None, cache=None, layer=0):",
                                    "    @torch.no_grad()\n    def forward(self, x, mask=None, cache=None, layer=0):")))


def _gqa_cases(rng):
    cases = []
    for (d, H, H_kv), (B, T), kind in [((16, 4, 2), (2, 5), "causal"), ((24, 6, 3), (2, 6), "random"),
                                       ((16, 4, 1), (3, 4), None), ((12, 3, 3), (2, 5), "padding"),
                                       ((32, 8, 2), (1, 7), "causal")]:
        state = random_state(ref.GroupedQueryAttention(d, H, H_kv), rng)
        x = tensor(rng, B, T, d)
        mask = {"causal": causal(T), None: None,
                "random": random_mask(rng, B, 1, T, T, keep_column=None) | torch.eye(T, dtype=torch.bool),
                "padding": (torch.arange(T)[None, :] < torch.tensor([T, T - 2])[:, None])[:, None, None, :]}[kind]
        what = {"causal": f"a causal mask [{T}, {T}]", None: "no mask", "random": f"a random mask [{B}, 1, {T}, {T}]",
                "padding": f"a padding mask [{B}, 1, 1, {T}]"}[kind]
        cases.append(Case(f"GroupedQueryAttention(d_model={d}, num_heads={H}, num_kv_heads={H_kv}) in evaluation mode, "
                          f"x [{B}, {T}, {d}], {what}: (output, weights)",
                          lambda cls, c=(d, H, H_kv), s=state, x=x, m=mask: _gqa_run(cls, c, s, x, m)))
    # scores in the hundreds: exp() overflows in a softmax of one's own unless each row's max is subtracted
    state = random_state(ref.GroupedQueryAttention(16, 4, 2), rng)
    loud = tensor(rng, 2, 5, 16, scale=15.0)
    cases.append(Case("GroupedQueryAttention(16, 4, 2) in evaluation mode, x [2, 5, 16] with entries of about 15 (scores "
                      "in the hundreds: exp() overflows unless each row's largest score is subtracted first), a causal "
                      "mask: (output, weights)", lambda cls, s=state, x=loud: _gqa_run(cls, (16, 4, 2), s, x, causal(5)),
                      atol=1e-3, tells=("softmax without the max subtracted",)))
    # bias=False: every case above builds the default layer, so projections that ignored it passed
    state = random_state(ref.GroupedQueryAttention(16, 4, 2, bias=False), rng)
    x = tensor(rng, 2, 5, 16)

    def unbiased(cls, s=state, x=x):
        m = cls(16, 4, 2, bias=False)
        names = sorted(name for name, _ in m.named_parameters())
        return (np.array([name.endswith("bias") for name in names]).any().reshape(1),
                *_gqa_run(lambda *a: m, (16, 4, 2), s, x, causal(5)))
    cases.append(Case("GroupedQueryAttention(16, 4, 2, bias=False) in evaluation mode, x [2, 5, 16], a causal mask: "
                      "(whether it has a bias parameter (False), output, weights)", unbiased))
    for d, H, H_kv in [(16, 4, 3), (18, 4, 2)]:
        cases.append(Case(f"GroupedQueryAttention({d}, {H}, {H_kv}) must raise ValueError (True = it did): "
                          + ("4 query heads cannot share 3 key/value heads evenly" if H_kv == 3
                             else "18 features cannot be split into 4 heads"),
                          lambda cls, a=(d, H, H_kv): raises_value_error(lambda: cls(*a))))
    cases.append(Case("GroupedQueryAttention(16, 4, 2) must NOT raise ValueError (True = it did)",
                      lambda cls: raises_value_error(lambda: cls(16, 4, 2))))
    state = random_state(ref.GroupedQueryAttention(16, 4, 2), rng)  # a mask flipped in place: flipped for the next layer

    def call(cls, x, mask, s=state):
        with torch.no_grad():
            return load_state(cls(16, 4, 2), s)(x, mask=mask)
    cases.append(keeps_inputs("GroupedQueryAttention(16, 4, 2) on x [2, 5, 16] with a [5, 5] causal mask", call,
                              tensor(rng, 2, 5, 16), causal(5)))
    state = random_state(ref.GroupedQueryAttention(16, 4, 2), rng)  # a forward under torch.no_grad() trains nothing
    x = tensor(rng, 2, 5, 16)
    cases.append(Case("GroupedQueryAttention(16, 4, 2) in evaluation mode, x [2, 5, 16] that requires grad, a causal "
                      "mask, backpropagating a fixed random function of the output: (output, weights, "
                      "x.grad, every parameter's grad; the gradient must reach the input and every projection, or "
                      "nothing learns)", lambda cls, s=state, x=x: _gradients(load_state(cls(16, 4, 2), s), x, causal(5)),
                      tells=(NO_GRADIENT,)))
    return cases


def _gqa_mha_cases(rng):
    cases = []
    for d, H, B, T in [(16, 4, 2, 5), (12, 2, 1, 6)]:
        mha = MultiHeadAttention(d, H).eval()
        with torch.no_grad():
            for p in mha.parameters():
                p.copy_(as_float32(rng.normal(size=tuple(p.shape)) / np.sqrt(p.shape[-1])))
        state = {k: v.clone() for k, v in mha.state_dict().items()}
        x, mask = tensor(rng, B, T, d), causal(T)
        with torch.no_grad():
            theirs, their_weights = mha(x.clone(), mask=mask.clone())

        def run(cls, c=(d, H, H), s=state, x=x, m=mask, t=theirs, tw=their_weights):
            out = _gqa_run(cls, c, s, x, m)
            return out[0] - t, out[1] - tw
        cases.append(Case(f"GroupedQueryAttention({d}, num_heads={H}, num_kv_heads={H}) loaded with the weights of a "
                          f"MultiHeadAttention({d}, {H}) (notebook 03), x [{B}, {T}, {d}], causal mask: your (output, "
                          "weights) minus multi-head attention's (should be 0)", run))
    return cases


def _gqa_cached(cls, cfg, state, x, prefill):
    """(keys cached, values cached, bytes cached, outputs of prefill + one-by-one decoding, full pass)."""
    d, H, H_kv = cfg
    m = load_state(cls(d, H, H_kv), state)
    T = x.shape[1]
    cache = _Cache(2, _their_kvcache(cls))
    with torch.no_grad():
        full = m(x.clone(), mask=causal(T))[0]
        outs = [m(x[:, :prefill].clone(), mask=causal(prefill), cache=cache, layer=1)[0]]
        keys, values = cache.keys[1], cache.values[1]
        for t in range(prefill, T):
            outs.append(m(x[:, t:t + 1].clone(), cache=cache, layer=1)[0])
    return keys, values, np.array([cache.nbytes()]), torch.cat(outs, dim=1) - full


def _gqa_cache_cases(rng):
    cases = []
    for (d, H, H_kv), (B, T, P) in [((16, 4, 2), (2, 6, 3)), ((24, 6, 1), (1, 5, 2)), ((16, 4, 4), (2, 4, 1))]:
        state = random_state(ref.GroupedQueryAttention(d, H, H_kv), rng)
        x = tensor(rng, B, T, d)
        Dh = d // H
        heads = _n(H_kv, "key/value head") + (f", not {H}" if H_kv != H else "")
        cases.append(Case(
            f"GroupedQueryAttention({d}, num_heads={H}, num_kv_heads={H_kv}), x [{B}, {T}, {d}]: a prefill of "
            f"{_n(P, 'position')} (causal mask) into layer 1 of a cache: (the keys and the values it cached, which must "
            f"be [{B}, {H_kv}, {P}, {Dh}]: {heads}; the cache's nbytes() at the end), then the other positions one at "
            f"a time: their outputs minus one causal pass over all {T} (should be 0)",
            lambda cls, c=(d, H, H_kv), s=state, x=x, p=P: _gqa_cached(cls, c, s, x, p)))
    return cases


# --------------------------------------------------------------------------- cases: multi-head latent attention
MLA_CONFIGS = [  # d_model, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    (32, 4, 16, 12, 8, 4, 6),
    (24, 2, 8, 6, 4, 8, 8),
    (16, 1, 12, 8, 6, 2, 4),
]
MLA_NAMES = ("d_model", "num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _mla_text(cfg) -> str:
    return "MultiHeadLatentAttention(" + ", ".join(f"{n}={v}" for n, v in zip(MLA_NAMES, cfg, strict=True)) + ")"


def _mla_make(cls, cfg, state):
    return load_state(cls(**dict(zip(MLA_NAMES, cfg, strict=True))), state)


def _with_correct_rotary(cls, run):
    """run() with a correct apply_rotary in place of the notebook's own while it runs (where the module's
    forward finds it by that global name), so that a wrong apply_rotary costs its own test cells only."""
    names = getattr(getattr(cls, "forward", None), "__globals__", None)
    if not isinstance(names, dict) or "apply_rotary" not in names:
        return run()
    saved = names["apply_rotary"]
    names["apply_rotary"] = _ROTARY_ENV["apply_rotary"]
    try:
        return run()
    finally:
        names["apply_rotary"] = saved


def _mla_run(cls, cfg, state, x, mask):
    def run():
        m = _mla_make(cls, cfg, state)
        with torch.no_grad():
            out = m(x.clone()) if mask is None else m(x.clone(), mask=mask.clone())
        return tuple(out) if isinstance(out, (tuple, list)) else out
    return _with_correct_rotary(cls, run)


def _mla_state(cfg, rng):
    return random_state(ref.MultiHeadLatentAttention(**dict(zip(MLA_NAMES, cfg, strict=True))), rng)


def _mla_cases(rng):
    cases = []
    for cfg, (B, T), kind in [(MLA_CONFIGS[0], (2, 6), "causal"), (MLA_CONFIGS[1], (1, 5), None),
                              (MLA_CONFIGS[2], (3, 4), "causal"), (MLA_CONFIGS[0], (2, 5), "padding")]:
        state = _mla_state(cfg, rng)
        x = tensor(rng, B, T, cfg[0])
        mask = {"causal": causal(T), None: None,
                "padding": (torch.arange(T)[None, :] < torch.tensor([T, T - 2])[:, None])[:, None, None, :]}[kind]
        what = {"causal": f"a causal mask [{T}, {T}]", None: "no mask", "padding": f"a padding mask [{B}, 1, 1, {T}]"}[kind]
        cases.append(Case(f"{_mla_text(cfg)} in evaluation mode, x [{B}, {T}, {cfg[0]}], {what}, no cache "
                          f"(positions 0..{T - 1}): (output, weights)",
                          lambda cls, c=cfg, s=state, x=x, m=mask: _mla_run(cls, c, s, x, m)))
    cfg, loud = MLA_CONFIGS[0], _mla_state(MLA_CONFIGS[0], rng)  # q_up and k_up x 8: scores 64 times larger
    loud = {name: value * 8.0 if name in ("q_up.weight", "k_up.weight") else value for name, value in loud.items()}
    x = tensor(rng, 2, 5, cfg[0])
    cases.append(Case(f"{_mla_text(cfg)} in evaluation mode with q_up's and k_up's weights 8 times larger (scores in the "
                      f"hundreds: exp() overflows unless each row's largest score is subtracted first), x [2, 5, "
                      f"{cfg[0]}], a causal mask: (output, weights)",
                      lambda cls, s=loud, x=x: _mla_run(cls, cfg, s, x, causal(5)), atol=1e-3,
                      tells=("softmax without the max subtracted",)))
    cfg, state = MLA_CONFIGS[0], _mla_state(MLA_CONFIGS[0], rng)  # a mask flipped in place: flipped for the next layer

    def call(cls, x, mask):
        with torch.no_grad():
            return _with_correct_rotary(cls, lambda: _mla_make(cls, cfg, state)(x, mask=mask))
    cases.append(keeps_inputs(f"{_mla_text(cfg)} on x [2, 5, {cfg[0]}] with a [5, 5] causal mask", call,
                              tensor(rng, 2, 5, cfg[0]), causal(5)))
    cfg, state = MLA_CONFIGS[0], _mla_state(MLA_CONFIGS[0], rng)  # a forward under torch.no_grad() trains nothing
    x = tensor(rng, 2, 5, cfg[0])
    cases.append(Case(f"{_mla_text(cfg)} in evaluation mode, x [2, 5, {cfg[0]}] that requires grad, a causal mask, "
                      "backpropagating a fixed random function of the output: (output, weights, x.grad, "
                      "every parameter's grad; the gradient must reach the input and every projection, or nothing "
                      "learns)", lambda cls, s=state, x=x: _with_correct_rotary(cls, lambda: _gradients(
                          _mla_make(cls, cfg, s), x, causal(5))), tells=(NO_GRADIENT,)))
    return cases


def _mla_cache_run(cls, cfg, state, x, layer):
    def run():
        m = _mla_make(cls, cfg, state)
        cache = _Cache(layer + 1, _their_kvcache(cls))
        with torch.no_grad():
            m(x.clone(), mask=causal(x.shape[1]), cache=cache, layer=layer)
        return cache.keys[layer], cache.values[layer], np.array([cache.nbytes()])
    return _with_correct_rotary(cls, run)


def _mla_cache_cases(rng):
    cases = []
    for cfg, (B, T), layer in [(MLA_CONFIGS[0], (2, 5), 0), (MLA_CONFIGS[1], (1, 4), 1)]:
        state = _mla_state(cfg, rng)
        x = tensor(rng, B, T, cfg[0])
        r, rope = cfg[3], cfg[5]
        cases.append(Case(f"{_mla_text(cfg)}, x [{B}, {T}, {cfg[0]}], a prefill into layer {layer} of a cache: "
                          f"(cache.keys[{layer}], cache.values[{layer}], cache.nbytes()); the cache must hold the "
                          f"normalized latent [{B}, {T}, {r}] and the rotated shared key [{B}, {T}, {rope}], nothing else",
                          lambda cls, c=cfg, s=state, x=x, layer=layer: _mla_cache_run(cls, c, s, x, layer)))
    return cases


def _mla_decode(cls, cfg, state, x, prefill, layer=0):
    """`layer` > 0: decoded through that layer of the cache, whose layer 0 first holds all of x (another length)."""
    def run():
        m = _mla_make(cls, cfg, state)
        T = x.shape[1]
        cache = _Cache(layer + 1, _their_kvcache(cls))
        on = {"layer": layer} if layer else {}
        with torch.no_grad():
            if layer:
                m(x.clone(), mask=causal(T), cache=cache, layer=0)
            outs = [m(x[:, :prefill].clone(), mask=causal(prefill), cache=cache, **on)[0]]
            for t in range(prefill, T):
                outs.append(m(x[:, t:t + 1].clone(), cache=cache, **on)[0])
        return torch.cat(outs, dim=1)
    return _with_correct_rotary(cls, run)


def _mla_decoding_cases(rng):
    cases = []
    for cfg, (B, T, P) in [(MLA_CONFIGS[0], (2, 7, 3)), (MLA_CONFIGS[2], (1, 5, 1)), (MLA_CONFIGS[1], (2, 4, 2))]:
        state = _mla_state(cfg, rng)
        x = tensor(rng, B, T, cfg[0])
        cases.append(Case(f"{_mla_text(cfg)}, x [{B}, {T}, {cfg[0]}]: a prefill of {_n(P, 'position')} (causal mask), then "
                          f"the other {T - P} one at a time, through one cache: the outputs joined (they must equal one "
                          f"causal pass over all {T} positions)",
                          lambda cls, c=cfg, s=state, x=x, p=P: _mla_decode(cls, c, s, x, p)))
    # A decoder's second layer reads its own place in the cache: its positions (rotary's start) are that layer's
    # length, not layer 0's (an MLA that read cache.seq_len() took 8/8)
    cfg, (B, T, P) = MLA_CONFIGS[0], (2, 5, 2)
    state, x = _mla_state(cfg, rng), tensor(rng, B, T, cfg[0])
    cases.append(Case(f"{_mla_text(cfg)}, x [{B}, {T}, {cfg[0]}], through layer 1 of a 2-layer cache whose layer 0 "
                      f"already holds {T} positions: a prefill of {P}, then the other {T - P} one at a time (they must "
                      f"equal one causal pass: layer 1's positions start at layer 1's cache length, cache.seq_len(layer))",
                      lambda cls, c=cfg, s=state, x=x, p=P: _mla_decode(cls, c, s, x, p, layer=1)))
    return cases


# --------------------------------------------------------------------------- mistakes
COST_SOURCE = """
def attention_flops_and_memory(seq_len, d_model, num_heads, num_layers, num_kv_heads=None, head_dim=None,
                               batch_size=1, bytes_per_value=2):
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if head_dim is None:
        if d_model % num_heads != 0:
            raise ValueError("not divisible")
        head_dim = d_model // num_heads
    if num_heads % num_kv_heads != 0:
        raise ValueError("not divisible")
    B, T, L = batch_size, seq_len, num_layers
    q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
    per_token = 2 * kv_width * bytes_per_value * L
    return {
        "projection_flops": 2 * B * T * d_model * (q_width + 2 * kv_width + q_width) * L,
        "score_flops": 2 * (2 * B * num_heads * T * T * head_dim) * L,
        "score_bytes": B * num_heads * T * T * bytes_per_value,
        "kv_cache_bytes_per_token": per_token,
        "kv_cache_bytes": B * T * per_token,
    }
"""
COST_MISTAKES = (
    Mistake("score FLOPs count q k^T only (the weights @ v product forgotten)",
            "attention does two products of the same size: q @ k^T gives the [T, T] scores, weights @ v mixes the "
            "values; each costs 2 * H * T * T * head_dim FLOPs per layer",
            variant(COST_SOURCE, ('"score_flops": 2 * (2 * B', '"score_flops": (2 * B'))),
    Mistake("a multiply-add counted as one FLOP",
            "FLOP counters count a multiply-add as 2 FLOPs: an [m, k] @ [k, n] product is 2 * m * k * n",
            variant(COST_SOURCE, ('"projection_flops": 2 * B', '"projection_flops": B'),
                    ('"score_flops": 2 * (2 * B', '"score_flops": 2 * (B'))),
    Mistake("the KV cache counts the keys only (the values forgotten)",
            "every layer caches a key AND a value per position: 2 * num_kv_heads * head_dim numbers",
            variant(COST_SOURCE, ("per_token = 2 * kv_width", "per_token = kv_width"))),
    Mistake("the KV cache sized with num_heads (num_kv_heads ignored)",
            "grouped-query attention caches num_kv_heads key/value heads, not num_heads: that is its whole point",
            variant(COST_SOURCE, ("per_token = 2 * kv_width", "per_token = 2 * q_width"))),
    Mistake("the k and v projections counted at full width (num_kv_heads ignored in the projection FLOPs)",
            "k_proj and v_proj map d_model to num_kv_heads * head_dim features each; only q and out are d_model wide",
            variant(COST_SOURCE, ("(q_width + 2 * kv_width + q_width)", "(4 * q_width)"))),
    Mistake("head_dim ignored (d_model // num_heads used even when head_dim is given)",
            "some models' heads are wider than d_model / num_heads (DeepSeek-V3: 128 heads of 128 on a 7168-wide "
            "stream): use head_dim when it is given",
            variant(COST_SOURCE, ("    if head_dim is None:\n        if d_model % num_heads != 0:\n            raise ValueError(\"not divisible\")\n        head_dim = d_model // num_heads\n",
                                  "    if d_model % num_heads != 0:\n        raise ValueError(\"not divisible\")\n    head_dim = d_model // num_heads\n"))),
    Mistake("FLOPs for one sequence (batch_size left out of projection_flops and score_flops)",
            "every sequence of the batch goes through the same projections and products: multiply both FLOP counts "
            "by batch_size, as score_bytes and kv_cache_bytes are",
            variant(COST_SOURCE, ('"projection_flops": 2 * B * T', '"projection_flops": 2 * T'),
                    ('"score_flops": 2 * (2 * B * num_heads', '"score_flops": 2 * (2 * num_heads'))),
    Mistake("score bytes summed over all layers (only one layer's weights exist at a time)",
            "score_bytes is one layer's [B, H, T, T] weights: the layers run one after another, so the memory is reused",
            variant(COST_SOURCE, ("T * T * bytes_per_value,", "T * T * bytes_per_value * L,"))),
)

KV_SOURCE = """
class KVCache:
    def __init__(self, num_layers=1):
        self.keys = [None] * num_layers
        self.values = [None] * num_layers

    def append(self, layer, k, v):
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=-2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=-2)
        return self.keys[layer], self.values[layer]

    def seq_len(self, layer=0):
        return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
"""
KV_MISTAKES = (
    Mistake("nbytes counts the storage under the tensors, not the numbers cached",
            "count what the cache holds, t.numel() * t.element_size() for each tensor; t.untyped_storage().nbytes() "
            "is the memory under a view, which for a slice of a longer tensor is the whole of it",
            variant(KV_SOURCE, ("t.numel() * t.element_size()", "t.untyped_storage().nbytes()"))),
    Mistake("keys and values share one list (self.keys = self.values = [None] * num_layers)",
            "two names for one list: every value overwrites a key. Make two lists: self.keys = [None] * n; "
            "self.values = [None] * n",
            variant(KV_SOURCE, ("self.keys = [None] * num_layers\n        self.values = [None] * num_layers",
                                "self.keys = self.values = [None] * num_layers"))),
    Mistake("one cache for every layer (the layer argument ignored)",
            "each layer has its own keys and values: index the lists with `layer`",
            variant(KV_SOURCE, ("def append(self, layer, k, v):", "def append(self, layer, k, v):\n        layer = 0"),
                    ("def seq_len(self, layer=0):", "def seq_len(self, layer=0):\n        layer = 0"))),
    Mistake("concatenated along the heads axis (dim=1) instead of the time axis",
            "positions are the second-to-last axis: torch.cat([...], dim=-2) works for [B, H, T, D] and [B, T, r] alike",
            variant(KV_SOURCE, ("dim=-2)", "dim=1)"))),
    Mistake("concatenated along dim=2 (the time axis of [B, H, T, D] only)",
            "multi-head latent attention caches [B, T, r], where dim=2 is the features: count the time axis from the "
            "end, torch.cat([...], dim=-2), which is right for both",
            variant(KV_SOURCE, ("dim=-2)", "dim=2)"))),
    Mistake("concatenated along the feature axis (dim=-1) instead of the time axis",
            "a new position adds a row, not a column: torch.cat([...], dim=-2)",
            variant(KV_SOURCE, ("dim=-2)", "dim=-1)"))),
    Mistake("append returns only the new keys and values, not everything cached",
            "attention needs every position so far: return self.keys[layer], self.values[layer] after concatenating",
            variant(KV_SOURCE, ("        return self.keys[layer], self.values[layer]\n", "        return k, v\n"))),
    Mistake("seq_len counts the calls to append, not the positions",
            "a prefill appends several positions at once: read the length off the time axis, keys[layer].shape[-2]",
            variant(KV_SOURCE, ("def append(self, layer, k, v):",
                                "def append(self, layer, k, v):\n        self.calls = getattr(self, 'calls', {})\n"
                                "        self.calls[layer] = self.calls.get(layer, 0) + 1"),
                    ("return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]",
                     "return getattr(self, 'calls', {}).get(layer, 0)"))),
    Mistake("seq_len reads shape[2] (the time axis of [B, H, T, D] only)",
            "multi-head latent attention caches [B, T, r], with no heads axis: read the time axis from the end, "
            "keys[layer].shape[-2]",
            variant(KV_SOURCE, ("self.keys[layer].shape[-2]", "self.keys[layer].shape[2]"))),
    Mistake("nbytes counts elements, not bytes",
            "a float32 number takes 4 bytes: numel() * element_size()",
            variant(KV_SOURCE, ("t.numel() * t.element_size()", "t.numel()"))),
    Mistake("nbytes counts the keys only",
            "the cache holds keys and values: sum over self.keys + self.values",
            variant(KV_SOURCE, ("for t in self.keys + self.values", "for t in self.keys"))),
)

CACHED_SOURCE = """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    return scaled_dot_product_attention(q_t, keys, values, mask)[0]
"""
PAST_FROM_LAYER_0 = "the past length read from layer 0 (cache.seq_len() without the layer)"
CACHED_MISTAKES = (
    Mistake(PAST_FROM_LAYER_0,
            "each layer has its own cache: T_past = cache.seq_len(layer), or read it off the keys this layer's append "
            "returns (T_total - T_new)",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    T_past = cache.seq_len()
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_past)
    return scaled_dot_product_attention(q_t, keys, values, mask)[0]
"""),
    Mistake("the causal mask of a prefill ignores what is cached (tril() over [T_new, T_total] from column 0)",
            "new query i sits at position T_past + i: it may see keys 0 .. T_past + i, so shift the diagonal, "
            "torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)",
            variant(CACHED_SOURCE, ("dtype=torch.bool).tril(T_total - T_new)", "dtype=torch.bool).tril()"))),
    Mistake("the cache appended after attending (the new position does not see itself)",
            "append k_t, v_t to the cache FIRST, then attend over everything it holds: a token attends to itself too "
            "(if you build a causal mask, check its diagonal: new query i may see keys 0 .. T_past + i)",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.keys[layer], cache.values[layer]
    if keys is None:
        out = torch.zeros(*q_t.shape[:-1], v_t.shape[-1])
    else:
        out = scaled_dot_product_attention(q_t, keys, values)[0]
    cache.append(layer, k_t, v_t)
    return out
"""),
    Mistake("the new keys and values are never stored (attended over, but not appended to the cache)",
            "use the cache's append: it must keep k_t and v_t for the next steps",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = k_t, v_t
    if cache.keys[layer] is not None:
        keys = torch.cat([cache.keys[layer], k_t], dim=-2)
        values = torch.cat([cache.values[layer], v_t], dim=-2)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    return scaled_dot_product_attention(q_t, keys, values, mask)[0]
"""),
    Mistake("softmax over the query axis (with one new query, every weight becomes 1)",
            "each query's weights are a distribution over the keys: softmax(scores, dim=-1)",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.append(layer, k_t, v_t)
    scores = q_t @ keys.transpose(-2, -1) / math.sqrt(q_t.shape[-1])
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    weights = torch.softmax(scores.masked_fill(~mask, float('-inf')), dim=-2).nan_to_num(0.0)
    return weights @ values
"""),
    Mistake("no causal mask among the new positions (a prefill sees its own future)",
            "with several new positions, new query i (absolute position T_past + i) may attend to keys 0 .. T_past + i "
            "only: mask = ones(T_new, T_total).tril(T_total - T_new)",
            variant(CACHED_SOURCE, ("mask)[0]", "None)[0]"))),
    Mistake("the new positions may not attend to themselves (the causal diagonal off by one)",
            "new query i sits at absolute position T_past + i and sees keys 0 .. T_past + i, itself included: "
            "tril(T_total - T_new), not tril(T_total - T_new - 1)",
            variant(CACHED_SOURCE, ("tril(T_total - T_new)", "tril(T_total - T_new - 1)"))),
    Mistake("the layer argument ignored (always layer 0 of the cache)",
            "each layer has its own cache entry: cache.append(layer, k_t, v_t)",
            variant(CACHED_SOURCE, ("cache.append(layer, k_t, v_t)", "cache.append(0, k_t, v_t)"))),
    Mistake("softmax without the max subtracted",
            "exp() of a score above about 88 overflows to inf (and inf / inf is nan): subtract each row's largest "
            "allowed score before exp(), as notebook 01's softmax does, or use torch.softmax",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    e = torch.exp(q_t @ keys.transpose(-2, -1) / math.sqrt(q_t.shape[-1])) * mask
    return e / e.sum(-1, keepdim=True) @ values
"""),
    Mistake("the masked scores' max taken too (the mask applied after exp())",
            "a masked key (the future) must not count at all: fill the masked scores with -inf BEFORE the max and the "
            "softmax (scores.masked_fill(~mask, float('-inf'))); a max over every key, masked ones too, underflows "
            "the allowed weights when a masked score is far larger",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    scores = q_t @ keys.transpose(-2, -1) / math.sqrt(q_t.shape[-1])
    e = torch.exp(scores - scores.amax(-1, keepdim=True)) * mask
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total)) @ values
"""),
    Mistake("no 1/sqrt(d) scaling",
            "scores are q . k / sqrt(head_dim), as in notebook 02",
            """
def cached_attention(q_t, k_t, v_t, cache, layer=0):
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    scores = (q_t @ keys.transpose(-2, -1)).masked_fill(~mask, float('-inf'))
    return torch.softmax(scores, dim=-1) @ values
"""),
)

ROTARY_SOURCE = """
def apply_rotary(x, positions, base=10000.0):
    D = x.shape[-1]
    if D % 2 != 0:
        raise ValueError("odd")
    inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = torch.as_tensor(positions).to(torch.float32)[..., None] * inv_freq
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
"""
_HALF = "return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)"
ROTARY_MISTAKES = (
    Mistake("interleaved pairs (2i, 2i + 1), as in the RoFormer paper, instead of this notebook's half-split pairs "
            "(i, i + D/2)",
            "pair feature i with feature i + D/2: x1, x2 = x[..., :D//2], x[..., D//2:]. Both layouts are rotary "
            "embeddings, but a model's weights only work with the one it was trained with",
            variant(ROTARY_SOURCE, ("x1, x2 = x[..., : D // 2], x[..., D // 2:]", "x1, x2 = x[..., 0::2], x[..., 1::2]"),
                    (_HALF, "return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).to(x.dtype)"))),
    Mistake("rotated the wrong way (the sign of sin flipped)",
            "a rotation by +angle: (x1 cos - x2 sin, x2 cos + x1 sin)",
            variant(ROTARY_SOURCE, (_HALF, "return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).to(x.dtype)"))),
    Mistake("frequencies base^(-i/D) instead of base^(-2i/D)",
            "pair i turns by base ** (-2i / D) per position: torch.arange(0, D, 2) / D",
            variant(ROTARY_SOURCE, ("torch.arange(0, D, 2, dtype=torch.float32) / D",
                                    "torch.arange(0, D // 2, dtype=torch.float32) / D"))),
    Mistake("the two features of a pair turned by different angles (the frequencies not repeated for the second half)",
            "both members of pair i, features i and i + D/2, turn by the same angle: cos and sin have D/2 columns, "
            "used for both halves",
            variant(ROTARY_SOURCE, ("inv_freq = base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)",
                                    "inv_freq = base ** (-torch.arange(0, D, dtype=torch.float32) / D)"),
                    ("cos, sin = angles.cos(), angles.sin()",
                     "cos, sin = angles.cos(), angles.sin()\n    c1, c2, s1, s2 = cos[..., : D // 2], cos[..., D // 2:], sin[..., : D // 2], sin[..., D // 2:]"),
                    (_HALF, "return torch.cat([x1 * c1 - x2 * s1, x2 * c2 + x1 * s2], dim=-1).to(x.dtype)"))),
    Mistake("positions ignored (every call rotates as if at positions 0, 1, 2, ...)",
            "use the positions argument: a decoding step at position 57 must be turned by 57 * frequency",
            variant(ROTARY_SOURCE, ("torch.as_tensor(positions).to(torch.float32)",
                                    "torch.arange(x.shape[-2], dtype=torch.float32)"))),
    Mistake("positions assumed consecutive (the first position, then + 0, 1, 2, ...)",
            "rotate each row by its own position: angles = positions[..., None] * inv_freq. A batch of prompts of "
            "different lengths, or a window, does not give consecutive positions",
            variant(ROTARY_SOURCE, ("torch.as_tensor(positions).to(torch.float32)",
                                    "(torch.as_tensor(positions).reshape(-1)[0] + torch.arange(x.shape[-2]))"
                                    ".to(torch.float32)"))),
    Mistake("angles computed in bfloat16",
            "compute the positions, frequencies and angles in float32 whatever x's dtype (bf16 keeps 8 bits: position "
            "1000 becomes 1000 +- 4, its angle off by whole radians), and cast only the result back: .to(x.dtype)",
            variant(ROTARY_SOURCE, ("angles = torch.as_tensor(positions).to(torch.float32)[..., None] * inv_freq",
                                    "angles = torch.as_tensor(positions).to(x.dtype)[..., None] * inv_freq.to(x.dtype)"))),
    Mistake("the base argument ignored (always 10000)",
            "use base: inv_freq = base ** (-torch.arange(0, D, 2) / D)",
            variant(ROTARY_SOURCE, ("inv_freq = base **", "inv_freq = 10000.0 **"))),
    Mistake("no ValueError for an odd feature dimension",
            "check x.shape[-1] % 2 and raise ValueError: features are rotated in pairs",
            variant(ROTARY_SOURCE, ('raise ValueError("odd")', 'pass'))),
)

_ROTARY_ENV: dict = {"torch": torch}
exec(ROTARY_SOURCE, _ROTARY_ENV)  # our own code: a correct apply_rotary beside the module mistakes
_KV_ENV: dict = {"torch": torch}
exec(KV_SOURCE, _KV_ENV)

GQA_SOURCE = """
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads, bias=True):
        super().__init__()
        if d_model % num_heads != 0 or num_heads % num_kv_heads != 0:
            raise ValueError("not divisible")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(num_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None, layer=0):
        q = split_heads(self.q_proj(x), self.num_heads)
        k = split_heads(self.k_proj(x), self.num_kv_heads)
        v = split_heads(self.v_proj(x), self.num_kv_heads)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.out_proj(merge_heads(out)), weights
"""
_APPEND = """        if cache is not None:
            k, v = cache.append(layer, k, v)
"""
_REPEAT = """        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
"""
GQA_MISTAKES = (
    _no_gradient(GQA_SOURCE),
    Mistake("softmax without the max subtracted",
            "exp() of a score above about 88 overflows to inf (and inf / inf is nan): subtract each row's largest "
            "allowed score before exp(), as notebook 01's softmax does, or call notebook 02's "
            "scaled_dot_product_attention",
            variant(GQA_SOURCE, ("        out, weights = scaled_dot_product_attention(q, k, v, mask)\n",
                                 "        e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))\n"
                                 "        e = e if mask is None else e * mask\n"
                                 "        total = e.sum(-1, keepdim=True)\n"
                                 "        weights = e / torch.where(total > 0, total, torch.ones_like(total))\n"
                                 "        out = weights @ v\n"))),
    Mistake("key/value heads repeated in the wrong order (.repeat: query head h reads key/value head h % num_kv_heads)",
            "neighbouring query heads share a key/value head: query head h reads key/value head h // (num_heads // "
            "num_kv_heads), so repeat each head in place, k.repeat_interleave(group, dim=1), not k.repeat(1, group, 1, 1)",
            variant(GQA_SOURCE, (_REPEAT, "        k = k.repeat(1, group, 1, 1)\n        v = v.repeat(1, group, 1, 1)\n"))),
    Mistake("the cache holds the repeated heads (num_heads key/value heads: nothing saved)",
            "append k and v to the cache BEFORE repeating them: the cache must hold num_kv_heads heads",
            variant(GQA_SOURCE, (_APPEND, ""), (_REPEAT, _REPEAT + _APPEND))),
    Mistake("no ValueError when num_heads is not a multiple of num_kv_heads",
            "check num_heads % num_kv_heads (and d_model % num_heads) in __init__ and raise ValueError",
            variant(GQA_SOURCE, ("if d_model % num_heads != 0 or num_heads % num_kv_heads != 0:",
                                 "if d_model % num_heads != 0:"))),
    Mistake("the mask ignored",
            "pass the mask on to the attention: scaled_dot_product_attention(q, k, v, mask)",
            variant(GQA_SOURCE, ("scaled_dot_product_attention(q, k, v, mask)", "scaled_dot_product_attention(q, k, v)"))),
    Mistake("the cache ignored (nothing appended, the queries see only the new positions)",
            "with a cache, append the new keys and values and attend over everything it returns",
            variant(GQA_SOURCE, (_APPEND, ""))),
)

MLA_SOURCE = """
class MultiHeadLatentAttention(nn.Module):
    def __init__(self, d_model, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
        super().__init__()
        self.num_heads, self.kv_lora_rank = num_heads, kv_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.q_down = nn.Linear(d_model, q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(q_lora_rank, eps=1e-6)
        self.q_up = nn.Linear(q_lora_rank, num_heads * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_down = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.k_up = nn.Linear(kv_lora_rank, num_heads * qk_nope_head_dim, bias=False)
        self.v_up = nn.Linear(kv_lora_rank, num_heads * v_head_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * v_head_dim, d_model, bias=False)

    def forward(self, x, mask=None, cache=None, layer=0):
        B, T, _ = x.shape
        H = self.num_heads
        start = 0 if cache is None else cache.seq_len(layer)
        positions = torch.arange(start, start + T)
        q = split_heads(self.q_up(self.q_norm(self.q_down(x))), H)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope = apply_rotary(q_rope, positions)
        latent, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = self.kv_norm(latent)
        k_rope = apply_rotary(k_rope, positions)
        if cache is not None:
            latent, k_rope = cache.append(layer, latent, k_rope)
        T_k = latent.shape[1]
        k_nope = split_heads(self.k_up(latent), H)
        v = split_heads(self.v_up(latent), H)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T_k, self.rope_dim)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.nope_dim + self.rope_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float('-inf'))
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(~mask, 0.0)
        return self.out_proj(merge_heads(weights @ v)), weights
"""
_MLA_APPEND = """        if cache is not None:
            latent, k_rope = cache.append(layer, latent, k_rope)
        T_k = latent.shape[1]
        k_nope = split_heads(self.k_up(latent), H)
        v = split_heads(self.v_up(latent), H)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T_k, self.rope_dim)], dim=-1)
"""
MLA_MISTAKES = (
    _no_gradient(MLA_SOURCE),
    Mistake("softmax without the max subtracted",
            "exp() of a score above about 88 overflows to inf (and inf / inf is nan): subtract each row's largest "
            "allowed score before exp(), as notebook 01's softmax does, or use torch.softmax",
            variant(MLA_SOURCE, ("        weights = torch.softmax(scores, dim=-1)\n",
                                 "        e = torch.exp(scores)\n"
                                 "        weights = e / e.sum(dim=-1, keepdim=True)\n"))),
    Mistake("the up-projected keys and values cached (as large a cache as multi-head attention)",
            "cache the small things: the normalized latent [B, T, kv_lora_rank] and the rotated shared key [B, T, "
            "qk_rope_head_dim], and up-project what the cache returns: cache.append(layer, latent, k_rope)",
            variant(MLA_SOURCE, (_MLA_APPEND, """        T_k = latent.shape[1]
        k_nope = split_heads(self.k_up(latent), H)
        v = split_heads(self.v_up(latent), H)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T_k, self.rope_dim)], dim=-1)
        if cache is not None:
            k, v = cache.append(layer, k, v)
"""))),
    Mistake("the latent cached before its RMSNorm (kv_norm)",
            "normalize the latent first, latent = self.kv_norm(latent), and cache the normalized one (DeepSeek's "
            "cache holds kv_norm's output)",
            variant(MLA_SOURCE, ("        latent = self.kv_norm(latent)\n", ""),
                    ("k_nope = split_heads(self.k_up(latent), H)\n        v = split_heads(self.v_up(latent), H)",
                     "k_nope = split_heads(self.k_up(self.kv_norm(latent)), H)\n        "
                     "v = split_heads(self.v_up(self.kv_norm(latent)), H)"))),
    Mistake("rotary embedding applied to the values too",
            "rotary embeddings encode positions in the scores q . k only: rotate the rotary part of the queries and "
            "the shared rotary key, never the values",
            variant(MLA_SOURCE, ("v = split_heads(self.v_up(latent), H)",
                                 "v = apply_rotary(split_heads(self.v_up(latent), H), torch.arange(T_k))"))),
    Mistake("the shared rotary key cached before its rotation (every cached key rotated again at each call)",
            "rotate k_rope at the new tokens' positions first, then append it: the cache holds the rotated key, so a "
            "step rotates only its own token's key (the attention's output is the same either way; the cache is not)",
            variant(MLA_SOURCE, ("        k_rope = apply_rotary(k_rope, positions)\n", ""),
                    ("        T_k = latent.shape[1]\n",
                     "        T_k = latent.shape[1]\n        k_rope = apply_rotary(k_rope, torch.arange(T_k))\n"))),
    Mistake("rotary embedding applied to the whole query and key (the no-position part too)",
            "only the qk_rope_head_dim features are rotated; the qk_nope_head_dim features, reconstructed from the "
            "latent, carry no position (that is what lets DeepSeek absorb k_up into the query)",
            variant(MLA_SOURCE, ("        q_rope = apply_rotary(q_rope, positions)\n", ""),
                    ("        k_rope = apply_rotary(k_rope, positions)\n", ""),
                    ("        q = torch.cat([q_nope, q_rope], dim=-1)\n",
                     "        q = apply_rotary(torch.cat([q_nope, q_rope], dim=-1), positions)\n"
                     "        k = apply_rotary(k, torch.arange(T_k))\n"))),
    Mistake("the query's rotary part not rotated (only the shared key turned)",
            "rotate both sides of the score: q_rope = apply_rotary(q_rope, positions) as well as the shared k_rope; "
            "a score depends on the offset between two positions only when both vectors are turned",
            variant(MLA_SOURCE, ("        q_rope = apply_rotary(q_rope, positions)\n", ""))),
    Mistake("rotary positions start at layer 0's cache length, whatever the layer (cache.seq_len())",
            "each layer has its own place in the cache: start = cache.seq_len(layer)",
            variant(MLA_SOURCE, ("start = 0 if cache is None else cache.seq_len(layer)",
                                 "start = 0 if cache is None else cache.seq_len()"))),
    Mistake("rotary positions restart at 0 at every call (the cache's length ignored)",
            "the new tokens sit after everything cached: positions = torch.arange(start, start + T) with start = "
            "cache.seq_len(layer)",
            variant(MLA_SOURCE, ("start = 0 if cache is None else cache.seq_len(layer)", "start = 0"))),
    Mistake("softmax scale 1/sqrt(qk_nope_head_dim): the rotary part of the head dimension forgotten",
            "a query and a key have qk_nope_head_dim + qk_rope_head_dim features each: divide by the square root of that sum",
            variant(MLA_SOURCE, ("math.sqrt(self.nope_dim + self.rope_dim)", "math.sqrt(self.nope_dim)"))),
    Mistake("the rotary key taken from the first features of kv_down's output (latent and rotary key swapped)",
            "kv_down's output is [latent (kv_lora_rank features), rotary key (qk_rope_head_dim features)], in that order",
            variant(MLA_SOURCE, ("latent, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)",
                                 "k_rope, latent = self.kv_down(x).split([self.rope_dim, self.kv_lora_rank], dim=-1)"))),
)

# The mistakes run beside correct helpers: the course's attention (02) and heads (03), and copies (not the
# reference objects, which the checks refuse) of this notebook's apply_rotary and KVCache.
NAMESPACE = {"scaled_dot_product_attention": scaled_dot_product_attention, "split_heads": split_heads,
             "merge_heads": merge_heads, "MultiHeadAttention": MultiHeadAttention,
             "apply_rotary": _ROTARY_ENV["apply_rotary"], "KVCache": _KV_ENV["KVCache"]}


def _exercise(name, reference, cases, mistakes, graded=None, rtol=RTOL, atol=ATOL):
    return Exercise(name, reference, cases, mistakes=mistakes, rtol=rtol, atol=atol, forbidden=FORBIDDEN,
                    namespace=NAMESPACE, graded=graded or name)


EXERCISES = [
    _exercise("attention_flops_and_memory", ref.attention_flops_and_memory, _cost_cases, COST_MISTAKES,
              rtol=1e-9, atol=0.0),
    _exercise("KVCache", ref.KVCache, _kv_cache_cases, KV_MISTAKES),
    _exercise("cached_attention", ref.cached_attention, _cached_attention_cases, CACHED_MISTAKES),
    _exercise("cached_attention_decoding", ref.cached_attention, _cached_decoding_cases, CACHED_MISTAKES,
              graded="cached_attention"),
    _exercise("apply_rotary", ref.apply_rotary, _rotary_cases, ROTARY_MISTAKES, atol=1e-4),
    _exercise("apply_rotary_relative", ref.apply_rotary, _rotary_relative_cases, ROTARY_MISTAKES,
              graded="apply_rotary", atol=2e-3),
    _exercise("GroupedQueryAttention", ref.GroupedQueryAttention, _gqa_cases, GQA_MISTAKES),
    _exercise("GroupedQueryAttention_matches_mha", ref.GroupedQueryAttention, _gqa_mha_cases, GQA_MISTAKES,
              graded="GroupedQueryAttention"),
    _exercise("GroupedQueryAttention_cache", ref.GroupedQueryAttention, _gqa_cache_cases, GQA_MISTAKES,
              graded="GroupedQueryAttention"),
    _exercise("MultiHeadLatentAttention", ref.MultiHeadLatentAttention, _mla_cases, MLA_MISTAKES),
    _exercise("MultiHeadLatentAttention_cache", ref.MultiHeadLatentAttention, _mla_cache_cases, MLA_MISTAKES,
              graded="MultiHeadLatentAttention"),
    _exercise("MultiHeadLatentAttention_decoding", ref.MultiHeadLatentAttention, _mla_decoding_cases, MLA_MISTAKES,
              graded="MultiHeadLatentAttention"),
]

check = make_checker(EXERCISES)
