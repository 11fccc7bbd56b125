"""Checks for notebook 08, "Long context" (PyTorch): FlashAttention's online softmax (its output, its
masks, and the largest tensor it creates, measured inside the call and judged here) and the
sliding-window mask.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.utils._python_dispatch as _python_dispatch

from attention_course import long_context as ref
from attention_course.attention import scaled_dot_product_attention

from .core import (
    Case,
    Exercise,
    Mistake,
    OnNumbers,
    keeps_inputs,
    make_checker,
    raises_value_error,
    reference_guard,
    variant,
)
from .tensors import FUSED_ATTENTION, as_float32, causal, random_mask, shape_text, tensor, torch_attention

HONESTY = tuple(reference_guard(ref))
NO_BUILTIN = FUSED_ATTENTION
# The online softmax's memory is measured in PyTorch's dispatcher: work moved to numpy is out of its sight (a red
# team's whole score matrix built there passed). The exercise is PyTorch's, so numpy's arrays are not for it.
# Every way out: .numpy(), numpy's own conversion (np.asarray(t) enters Tensor.__array__, whose .numpy() the
# function mode never sees: a red team's np.asarray passed), DLPack (np.from_dlpack) and Python lists.
_LEAVES_WHY = ("it turns tensors into {what}; this exercise is in PyTorch, where the grader measures the memory "
               "your online softmax uses: keep every step in torch")
# The numbers themselves: refused where the tensor holds floating-point numbers (scores, q, k, v); a list of block
# starts or of mask flags (torch.arange(0, T_k, block_size).tolist()) carries none of the attention out (a fairness
# audit: a correct answer looping over .tolist() lost all 6 points, and so did a .tolist() in a debug print).
_NUMBERS_WHY = ("it turns a tensor of floating-point numbers into {what}; this exercise is in PyTorch, where the "
                "grader measures the memory your online softmax uses: keep the scores, q, k and v in torch (a list of "
                "indices or mask flags is fine)")
LEAVES_TORCH = tuple((f, OnNumbers(_NUMBERS_WHY.format(what=what))) for f, what in (
    (torch.Tensor.numpy, "numpy arrays (Tensor.numpy)"),
    (torch.Tensor.__array__, "numpy arrays (np.asarray, np.array: Tensor.__array__)"),
    (torch.Tensor.__dlpack__, "another library's arrays (DLPack: np.from_dlpack, Tensor.__dlpack__)"),
    (torch.Tensor.tolist, "Python lists (Tensor.tolist)"))) + tuple(
    (f, _LEAVES_WHY.format(what=what)) for f, what in (
    (torch.utils.dlpack.to_dlpack, "another library's arrays (DLPack: torch.utils.dlpack.to_dlpack)"),
    # and the bytes under them, read without PyTorch's dispatcher (a reviewer's torch.save into a BytesIO, parsed
    # back with zipfile and struct: 8/8): saving or pickling a tensor, a storage read byte by byte (bytes(s), s[i])
    (torch.serialization.save, "bytes (torch.save)"),
    (torch.Tensor.__reduce_ex__, "bytes (pickling a tensor: Tensor.__reduce_ex__)"),
    (torch.UntypedStorage.__getitem__, "bytes (a storage read byte by byte: UntypedStorage.__getitem__)"),
    (torch.UntypedStorage.tolist, "Python lists (UntypedStorage.tolist)")))
# The memory is measured by a dispatch mode around the call: code that steps out of it is out of its sight (a
# reviewer's plain attention under _disable_current_modes kept the memory point).
_MODES_OFF_WHY = ("it switches PyTorch's dispatch modes off ({what}), which is how the grader measures the memory your "
                  "online softmax uses: this exercise needs no such thing")
# Popping them by hand and pushing them back (a red team's 8/8, its answer cloned where the mode saw it) as well:
# PyTorch's printing is let through (core.on_behalf_of_torch_printing); the measurement pushes its own mode before
# the guard is on (Case.around).
# The two context managers by their generators: a @contextmanager function's own code object is contextlib's helper,
# shared by every context manager (a student's own, and PyTorch's printing, were refused as _disable_current_modes).
MODES_OFF = tuple((f, _MODES_OFF_WHY.format(what=name)) for name, f in (
    ("_disable_current_modes", _python_dispatch._disable_current_modes.__wrapped__),
    ("_pop_mode", _python_dispatch._pop_mode), ("_push_mode", _python_dispatch._push_mode),
    ("_pop_mode_temporarily", _python_dispatch._pop_mode_temporarily.__wrapped__),
    ("torch._C._pop_torch_dispatch_stack", torch._C._pop_torch_dispatch_stack),
    ("torch._C._push_on_torch_dispatch_stack", torch._C._push_on_torch_dispatch_stack)))
FORBIDDEN = HONESTY + torch_attention(*NO_BUILTIN)
RTOL, ATOL = 1e-4, 1e-5
# Scores of a few hundred are rounded by about 3e-5 in float32: a correct student computing in float64 (or
# scaling q before the product) lands up to 3e-5 from the float32 reference, beyond ATOL under some salts (salt-41 of the test below).
# tests/test_nb08.py::test_a_float64_student_passes_the_ill_conditioned_cases_under_every_salt holds it to 60 salts;
# a running max started at 0 gives NaN or 0, far off.
WIDE_ATOL = 1e-4


# --------------------------------------------------------------------------- cases: online softmax
def _online_cases(rng):
    def x(*shape, scale=1.0):
        return tensor(rng, *shape, scale=scale)

    cases = []
    for (lead, T_q, T_k, D, Dv), block in [(((2, 3), 9, 20, 8, 5), 4), (((1,), 6, 13, 4, 4), 5),
                                           (((), 7, 7, 16, 3), 1), (((2,), 5, 8, 8, 8), 32), (((2, 2), 16, 33, 8, 4), 8)]:
        q, k, v = x(*lead, T_q, D, scale=1.5), x(*lead, T_k, D, scale=1.5), x(*lead, T_k, Dv)
        cases.append(Case(f"q {shape_text(q)}, k {shape_text(k)}, v {shape_text(v)}, block_size={block}, no mask",
                          lambda f, q=q, k=k, v=v, b=block: f(q.clone(), k.clone(), v.clone(), b)))
    # scores of a few hundred: exp() overflows unless the running max is subtracted
    q, k, v = x(2, 6, 8, scale=8.0), x(2, 12, 8, scale=8.0), x(2, 12, 4)
    cases.append(Case("large scores (|q . k| / sqrt(d) in the hundreds), q [2, 6, 8], k [2, 12, 8], block_size=5",
                      lambda f: f(q.clone(), k.clone(), v.clone(), 5), atol=WIDE_ATOL))
    # every score far below 0: exp(score) underflows to 0 unless the running max starts at -inf
    base = as_float32(10.0 * np.ones((1, 16)))
    k2 = base + x(10, 16, scale=0.3)
    q2 = -base + x(4, 16, scale=0.3)
    v2 = x(10, 3)
    cases.append(Case("every score about -400 (q . k / sqrt(d) far below 0), q [4, 16], k [10, 16], block_size=4",
                      lambda f: f(q2.clone(), k2.clone(), v2.clone(), 4), atol=WIDE_ATOL))
    # q.mul_(scale) or v /= ... changes the caller's tensors: every other case hands over copies
    q3, k3, v3 = x(2, 7, 8, scale=1.5), x(2, 10, 8, scale=1.5), x(2, 10, 4)
    cases.append(keeps_inputs("q [2, 7, 8], k [2, 10, 8], v [2, 10, 4], block_size=3",
                              lambda f, q, k, v: f(q, k, v, 3), q3, k3, v3))
    return cases


def _online_mask_cases(rng):
    def x(*shape, scale=1.5):
        return tensor(rng, *shape, scale=scale)

    cases = []
    B, H, T = 2, 2, 11
    q, k, v = x(B, H, T, 8), x(B, H, T, 8), x(B, H, T, 5, scale=1.0)
    cases.append(Case(f"q, k [{B}, {H}, {T}, 8], v [{B}, {H}, {T}, 5], a causal mask [{T}, {T}], block_size=4",
                      lambda f: f(q.clone(), k.clone(), v.clone(), 4, mask=causal(T))))
    keep = (torch.arange(T)[None, :] < torch.tensor([T, 6])[:, None])[:, None, None, :]
    cases.append(Case(f"the same q, k, v with a padding mask [{B}, 1, 1, {T}] (the second sentence has 6 real "
                      "tokens), block_size=3",
                      lambda f: f(q.clone(), k.clone(), v.clone(), 3, mask=keep.clone())))
    rand = random_mask(rng, B, H, T, T, p_keep=0.4, keep_column=None)
    rand[0, 1, 2] = False                      # a row with no allowed key at all
    rand[1, 0, 5] = False
    rand[1, 0, 5, 9] = True                    # a row whose only key sits in the last, partial block
    cases.append(Case(f"a random mask [{B}, {H}, {T}, {T}] with a fully masked row (it must give zeros, not NaN), "
                      "block_size=4", lambda f: f(q.clone(), k.clone(), v.clone(), 4, mask=rand.clone())))
    left = torch.ones(T, T, dtype=torch.bool).tril() & (torch.arange(T) >= 5)[None, :]   # rows 0..4 see nothing
    cases.append(keeps_inputs(f"q, k [{B}, {H}, {T}, 8], v [{B}, {H}, {T}, 5], a causal mask [{T}, {T}], block_size=4",
                              lambda f, q, k, v, m: f(q, k, v, 4, mask=m), q, k, v, causal(T)))
    cases.append(Case("causal AND left padding: the first 5 rows may attend to nothing (zeros), the first block is "
                      "masked for every row, block_size=4",
                      lambda f: f(q.clone(), k.clone(), v.clone(), 4, mask=left.clone())))
    # the padded keys point along the queries (scores near +500) and the real ones score about 1: a max taken before
    # the mask, with the masked weights zeroed after exp(), underflows every allowed weight to 0
    D, T_real = 16, 7
    direction = as_float32(np.ones((1, D)))
    q4 = 3.0 * direction + x(2, 6, D, scale=0.3)
    k4 = torch.cat([x(2, T_real, D, scale=0.5), 40.0 * direction + x(2, 3, D, scale=0.3)], dim=-2)     # [2, 10, D]
    v4 = x(2, T_real + 3, 4, scale=1.0)
    pads = (torch.arange(T_real + 3) < T_real)[None, None, :]                                             # [1, 1, 10]
    cases.append(Case(f"a padding mask [1, 1, {T_real + 3}] whose 3 padded keys score far above the real ones "
                      "(about +500 against about 1), q [2, 6, 16], k [2, 10, 16], block_size=4",
                      lambda f: f(q4.clone(), k4.clone(), v4.clone(), 4, mask=pads.clone()),
                      tells=("the mask applied after exp(), with the running max taken over the masked scores too",)))
    # left padding and every score about -400: a row's running max must stay -inf through the blocks it may not see (a
    # max overwritten by 0 there underflows every later score of the row to exp(-400) = 0)
    base = as_float32(10.0 * np.ones((1, 16)))
    k5, q5, v5 = base + x(10, 16, scale=0.3), -base + x(4, 16, scale=0.3), x(10, 3)
    late = (torch.arange(10) >= 4)[None, :].expand(4, 10)                                                  # [4, 10]
    cases.append(Case("every score about -400 and the first block of 4 keys masked for every query (left padding), "
                      "q [4, 16], k [10, 16], block_size=4: the running max stays -inf until a key is allowed",
                      lambda f: f(q5.clone(), k5.clone(), v5.clone(), 4, mask=late.clone()), atol=WIDE_ATOL,
                      tells=("the running max itself set to 0 while nothing is allowed (not only the one subtracted)",)))
    return cases


_REDUCTIONS = frozenset({"_softmax", "_log_softmax", "_safe_softmax", "amax", "amin", "max", "min", "logsumexp", "sum",
                         "mean", "prod", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "linalg_vector_norm",
                         "norm", "nansum", "var", "std", "argmax", "argmin", "aminmax"})  # dim second, default all
_SELECTIONS = {"topk": 2, "kthvalue": 2, "sort": 1, "argsort": 1}  # where the dim is; default the last
_PRODUCTS = {"mm": 0, "bmm": 0, "addmm": 1, "baddbmm": 1, "addbmm": 1, "mv": 0, "addmv": 1, "dot": 0, "vdot": 0}


def _over_many_keys(func, args, kwargs, above: int) -> bool:
    """Whether one PyTorch operation reduces numbers over a dimension longer than `above` (the longest the online
    algorithm reduces over: the queries, a block of keys, a vector), that is over many keys at once: a softmax, a max,
    a sort, a sum, or a product whose inner dimension is that long. An online softmax reads the keys a block at a time
    and never does; attention over every key for a few queries at a time (a red team's 8/8: its memory is that of
    the online algorithm) does. Booleans (a mask's `any`) are not numbers reduced."""
    name = func.overloadpacket.__name__
    kwargs = kwargs or {}
    if name in _PRODUCTS:
        a = args[_PRODUCTS[name]] if len(args) > _PRODUCTS[name] else None
        return isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[-1] > above
    if (name not in _REDUCTIONS and name not in _SELECTIONS) or not args or not isinstance(args[0], torch.Tensor):
        return False
    x = args[0]
    if not (x.dtype.is_floating_point or x.dtype.is_complex) or x.dim() == 0:
        return False
    if name in _SELECTIONS:
        at = _SELECTIONS[name]
        dims = args[at] if len(args) > at else kwargs.get("dim", -1)
    else:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        dims = range(x.dim())
    elif isinstance(dims, int):
        dims = [dims]
    elif not isinstance(dims, (list, tuple)):
        return False
    return any(isinstance(d, int) and -x.dim() <= d < x.dim() and x.shape[d] > above for d in dims)


# A storage's address and size, by PyTorch's own C methods bound here: the probe runs in the student's process, and a
# red team's answer replaced Tensor.untyped_storage for the length of its call (every storage said 4 bytes)
_STORAGE_OF, _ADDRESS, _NBYTES = (torch._C.TensorBase.untyped_storage, torch._C.StorageBase.data_ptr,
                                  torch._C.StorageBase.nbytes)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of the storage under `t`."""
    storage = _STORAGE_OF(t)
    return int(_ADDRESS(storage)), int(_NBYTES(storage))


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an operation writes into: an in-place one's self, an `out=` overload's outputs (its schema's
    mutable arguments)."""
    kwargs = kwargs or {}
    found = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = kwargs.get(argument.name) if argument.kwarg_only or i >= len(args) else args[i]
        found += [t for t in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(t, torch.Tensor)]
    return found


_EXITS = frozenset({"tolist", "numpy", "__array__", "__dlpack__"})  # a tensor's numbers, taken out of PyTorch whole


class _Largest:
    """The largest storage a call allocates or writes into (a storage made before the call, written by it, counts
    whole; views and in-place changes of what it made do not count again), whether it ever reduces over many keys at
    once (`_over_many_keys`), the storages it created and how many single numbers it read out of tensors (.item(),
    float(t), int(t)), via a PyTorch dispatch mode; used inside the case, its numbers are judged in the trusted
    process."""

    def __init__(self, above: int = 0):
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        owner = self

        class Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if above and not owner.all_keys and _over_many_keys(func, args, kwargs, above):
                    owner.all_keys = True
                if func.overloadpacket.__name__ == "_local_scalar_dense" and args and isinstance(args[0], torch.Tensor) \
                        and args[0].dtype != torch.bool:  # a number read out (.item(), float(), int() of an int32 view
                    owner.scalar_reads += 1         # of the floats' bits: a red team's); a bool test is not
                # the inputs' storages before the call: an `out=` tensor it resizes (an empty one given to
                # torch.matmul to hold the whole score matrix) is new memory, and counted
                inputs = {address for address, size in (_storage(t) for t in tree_flatten((args, kwargs))[0]
                                                        if isinstance(t, torch.Tensor)) if size}
                out = func(*args, **(kwargs or {}))
                for t in _written(func, args, kwargs):  # memory made before the call and written now (a scratch
                    address, size = _storage(t)        # tensor of the answer's cell holding the whole score matrix)
                    if address not in owner.created:
                        owner.largest = max(owner.largest, size)
                for address, size in (_storage(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)):
                    if address not in inputs:
                        owner.largest = max(owner.largest, size)
                        owner.created.add(address)
                return out

        class Exits(TorchFunctionMode):
            """Numbers taken out of PyTorch whole (.tolist(), .numpy(), np.asarray), counted with the ones read one
            at a time: integers may leave (indices, mask flags; floating-point tensors are refused), but the
            scores quantised to integers (q * 2**24 as int64, then attention in Python) read all of q, k and v."""

            def __torch_function__(self, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") in _EXITS and args and isinstance(args[0], torch.Tensor):
                    t = args[0]  # counted as the float32 numbers its bytes could carry: an int64 view two, four
                    owner.scalar_reads += -(-t.numel() * t.element_size() // 4)   # bools (a view of one float) one
                return func(*args, **(kwargs or {}))

        self.largest, self.all_keys, self.scalar_reads, self.created = 0, False, 0, set()
        self.mode, self.exits = Mode(), Exits()

    @contextlib.contextmanager
    def watching(self):
        """Both modes: the allocations (dispatch) and the numbers taken out whole (functions)."""
        with self.mode, self.exits:
            yield

    def unseen(self, out) -> bool:
        """Whether the answer was made out of the mode's sight: by code that took the mode off PyTorch's stack
        for a while (a red team's _pop_mode, plain attention, _push_mode kept the memory point), or in Python
        numbers read out one at a time (another's: attention in lists of floats)."""
        return isinstance(out, torch.Tensor) and _storage(out)[0] not in self.created


def _keys_watched_above(q, k, v, block, watch_keys: bool) -> int:
    """The longest reduction an online softmax makes (the queries, a block, a vector), or 0 where keys are not watched."""
    above = max(q.shape[-2], block, q.shape[-1], v.shape[-1])
    return above if watch_keys and k.shape[-2] > above else 0


class _Measurement:
    """One memory case's probe, pushed by the case's `around` (core.Case.around) before the grader's guard is on:
    the guard refuses PyTorch's mode-stack functions to the student (popping the modes hid the whole score matrix),
    and pushing a mode calls them. Where no `around` ran (the reference, the mistakes, in the grader's own process),
    `_measured` pushes a probe of its own."""

    def __init__(self, above: int):
        self.above, self.probe = above, None

    @contextlib.contextmanager
    def measuring(self):
        self.probe = _Largest(above=self.above)
        try:
            with self.probe.watching():
                yield
        finally:
            self.probe = None


NOT_PRINTED = "[the numbers are not printed while the grader measures your function's memory]"


@contextlib.contextmanager
def _numbers_not_printed():
    """PyTorch's printing shows a placeholder instead of a tensor's numbers while the memory case runs: printing
    formats a tensor with the dispatch modes off, out of the probe's sight, and a red team did attention on q, k
    and v parsed out of their printed text (8/8; then integer tensors, and chunks under the summary threshold,
    printed every digit at the default options). A student's debug print still prints, and costs nothing."""
    import torch._tensor_str as printing

    real = printing._tensor_str
    printing._tensor_str = lambda self, indent: NOT_PRINTED
    try:
        yield
    finally:
        printing._tensor_str = real


def _measured(f, q, k, v, block, mask, watch_keys=False, measurement: _Measurement | None = None):
    """(output, [largest allocation, whether it reduced over many keys at once, whether it was computed out of the
    measurement's sight]); the second only with `watch_keys` (more keys than queries, no mask: then nothing honest
    reduces over more than the queries, a block or a vector). Out of sight: the output was not made by an operation
    the measurement saw, or more numbers were read out one at a time (.item(), float(t), int(t)) than k holds
    (a check per row and block is far fewer; attention in Python floats reads all of q, k and v)."""
    probe = measurement.probe if measurement is not None else None
    if probe is None:
        probe = _Largest(above=_keys_watched_above(q, k, v, block, watch_keys))
    with torch.no_grad(), (probe.watching() if measurement is None or measurement.probe is None else contextlib.nullcontext()), \
            _numbers_not_printed():
        out = f(q.clone(), k.clone(), v.clone(), block, mask=None if mask is None else mask.clone())
    unseen = probe.unseen(out) or probe.scalar_reads > k.numel()  # attention in floats reads all of q, k and v
    return out, np.array([probe.largest, float(probe.all_keys), float(unseen)])



def _fits(limit: int):
    """derive: (output, [largest allocation, reduced over every key]) -> (output, [largest allocation < limit and
    no reduction over every key at once]), decided here."""
    def verdict(result):
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise TypeError(f"unexpected result {type(result).__name__}")
        out, measured = result
        measured = np.asarray(measured, dtype=np.float64).reshape(-1)
        over_all_keys = len(measured) > 1 and bool(measured[1])
        unseen = len(measured) > 2 and bool(measured[2])
        return out, np.array([float(measured[0]) < limit and not over_all_keys and not unseen])
    return verdict


def _online_memory_cases(rng):
    cases = []
    # The limit is per batch and head: a [T_q, T_k] copy of the caller's mask (an additive float mask, say)
    # stays below it; a [B, H, T_q, T_k] score matrix does not. The first case has three times more keys than
    # queries and no mask: there nothing but attention over many keys at once reduces over more than the queries.
    # Heads of 4 features: a float64 copy of k or v (an honest student computing in float64) stays below the limit
    # (with 8, it was exactly half the score matrix, and lost the point).
    for (B, H, T_q, T_k, D), block, masked in [((1, 2, 32, 96, 4), 16, False), ((2, 2, 80, 80, 4), 8, True)]:
        q, k, v = tensor(rng, B, H, T_q, D), tensor(rng, B, H, T_k, D), tensor(rng, B, H, T_k, D)
        full = B * H * T_q * T_k * 4
        mask = causal(T_q) if masked else None
        keys = "" if masked else (f", and no softmax, max, sort, sum or product runs over more than {T_q} of the "
                                  f"{T_k} keys at once: they come a block at a time")
        measurement = _Measurement(_keys_watched_above(q, k, v, block, not masked))
        cases.append(Case(f"q [{B}, {H}, {T_q}, {D}], k, v [{B}, {H}, {T_k}, {D}], block_size={block}"
                          + (", a causal mask" if masked else "")
                          + f": (output, whether the largest tensor created inside stays below half of the "
                          f"[{B}, {H}, {T_q}, {T_k}] float32 score matrix, {full // 2} bytes, with what it writes "
                          f"into tensors made before the call{keys}; measured in PyTorch: the output made by its "
                          f"operations, at most {B * H * T_k * D} numbers read out of tensors with .item(), "
                          "float(), int(), .tolist() or .numpy())",
                          lambda f, q=q, k=k, v=v, b=block, m=mask, w=not masked, s=measurement:
                          _measured(f, q, k, v, b, m, w, s), derive=_fits(full // 2), around=measurement.measuring))
    return cases


# --------------------------------------------------------------------------- cases: sliding window
def _window_cases(rng):
    cases = [Case(f"sliding_window_mask({n}, {w})", lambda f, n=n, w=w: f(n, w))
             for n, w in [(6, 3), (5, 1), (4, 4), (4, 10), (8, 2), (1, 1), (7, 5)]]
    cases += [Case("sliding_window_mask(4, 0): a window without even the token itself must raise ValueError "
                   "(True = it did)", lambda f: raises_value_error(lambda: f(4, 0))),
              Case("sliding_window_mask(4, 1) must NOT raise ValueError (True = it did)",
                   lambda f: raises_value_error(lambda: f(4, 1))),
              Case("sliding_window_mask(4, -2): a negative window must raise ValueError too (True = it did; "
                   "`if not window` lets it through)", lambda f: raises_value_error(lambda: f(4, -2)))]
    return cases


ONLINE_SOURCE = """
def online_softmax_attention(q, k, v, block_size, mask=None):
    T_k = k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = q.new_full((*q.shape[:-1], 1), float('-inf'))
    l = q.new_zeros((*q.shape[:-1], 1))
    acc = q.new_zeros((*q.shape[:-1], v.shape[-1]))
    for start in range(0, T_k, block_size):
        stop = start + block_size
        s = (q @ k[..., start:stop, :].transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(~mask[..., start:stop], float('-inf'))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = m_new.masked_fill(m_new == float('-inf'), 0.0)
        p = torch.exp(s - m_safe)
        correction = torch.exp(m - m_safe)
        l = l * correction + p.sum(dim=-1, keepdim=True)
        acc = acc * correction + p @ v[..., start:stop, :]
        m = m_new
    return acc / torch.where(l > 0, l, torch.ones_like(l))
"""
ONLINE_MISTAKES = (
    Mistake("neither running sum rescaled when the max changes (the factor exp(m - m_new) forgotten)",
            "when a block raises the running max from m to m_new, everything summed so far was exp(s - m): multiply "
            "both l and acc by correction = exp(m - m_new) before adding the new block's p.sum(-1) and p @ v",
            variant(ONLINE_SOURCE, ("l = l * correction + p.sum", "l = l + p.sum"),
                    ("acc = acc * correction + p @", "acc = acc + p @"))),
    Mistake("the running sum not rescaled when the max changes",
            "when a block raises the running max from m to m_new, everything summed so far was exp(s - m): multiply "
            "it by exp(m - m_new) before adding the new block, l = l * exp(m - m_new) + sum(exp(s - m_new))",
            variant(ONLINE_SOURCE, ("l = l * correction + p.sum", "l = l + p.sum"))),
    Mistake("the running output not rescaled when the max changes",
            "the output accumulator holds sums of exp(s - m) * v: rescale it by exp(m - m_new) too, like the running sum",
            variant(ONLINE_SOURCE, ("acc = acc * correction + p @", "acc = acc + p @"))),
    Mistake("the running max itself set to 0 while nothing is allowed (not only the one subtracted)",
            "keep m = -inf for a row that has seen no allowed key yet, and subtract 0 instead only in the exp: "
            "m_safe = m_new.masked_fill(m_new == -inf, 0.0) for exp(s - m_safe) and exp(m - m_safe), then m = m_new "
            "(a max of 0 left behind underflows every later score far below 0)",
            variant(ONLINE_SOURCE, ("        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n",
                                    "        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))\n"
                                    "        m_new = m_new.masked_fill(m_new == float('-inf'), 0.0)\n"))),
    Mistake("the running max started at 0 instead of -inf",
            "start m at -inf: with scores far below 0, exp(score - 0) underflows to 0 and the row is lost",
            variant(ONLINE_SOURCE, ("m = q.new_full((*q.shape[:-1], 1), float('-inf'))", "m = q.new_zeros((*q.shape[:-1], 1))"))),
    Mistake("fully masked rows give NaN (0 / 0 at the end, or exp(-inf - (-inf)))",
            "a row whose keys are all masked keeps m = -inf and l = 0: subtract 0 instead of -inf inside exp(), and "
            "divide by 1 where l == 0, so that the row comes out as zeros",
            variant(ONLINE_SOURCE, ("m_safe = m_new.masked_fill(m_new == float('-inf'), 0.0)", "m_safe = m_new"),
                    ("return acc / torch.where(l > 0, l, torch.ones_like(l))", "return acc / l"))),
    Mistake("fully masked rows give NaN (0 / 0: l is 0 for a row with no allowed key)",
            "a row whose keys are all masked ends with l = 0 and acc = 0: divide by torch.where(l > 0, l, 1) so that "
            "the row comes out as zeros",
            variant(ONLINE_SOURCE, ("return acc / torch.where(l > 0, l, torch.ones_like(l))", "return acc / l"))),
    Mistake("the mask applied after exp(), with the running max taken over the masked scores too",
            "mask the scores before the max: s.masked_fill(~mask[..., start:stop], float('-inf')). A masked key that "
            "scores far above the allowed ones otherwise sets the max, and every allowed exp(s - m) underflows to 0",
            variant(ONLINE_SOURCE, ("s = s.masked_fill(~mask[..., start:stop], float('-inf'))", "pass"),
                    ("        p = torch.exp(s - m_safe)\n",
                     "        p = torch.exp(s - m_safe)\n"
                     "        if mask is not None:\n"
                     "            p = p * mask[..., start:stop]\n"))),
    Mistake("the last, partial block dropped (T_k not a multiple of block_size)",
            "loop over range(0, T_k, block_size): the last block may be shorter, and its keys count too",
            variant(ONLINE_SOURCE, ("for start in range(0, T_k, block_size):",
                                    "for start in range(0, T_k - block_size + 1, block_size):"))),
    Mistake("the mask ignored",
            "fill the masked scores of each block with -inf: s.masked_fill(~mask[..., start:stop], float('-inf'))",
            variant(ONLINE_SOURCE, ("        if mask is not None:\n            s = s.masked_fill", "        if False:\n            s = s.masked_fill"))),
    Mistake("the whole [T_q, T_k] score matrix built (plain attention, not tiled)",
            "the point of the exercise is never to hold all T_q x T_k scores at once: compute q @ k^T one block of "
            "keys at a time inside the loop",
            """
def online_softmax_attention(q, k, v, block_size, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float('-inf'))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ v
"""),
    Mistake("no 1/sqrt(d) scaling",
            "scores are q . k / sqrt(d), as in notebook 02: multiply each block's scores by 1 / sqrt(q.shape[-1])",
            variant(ONLINE_SOURCE, ("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0"))),
)

WINDOW_SOURCE = """
def sliding_window_mask(size, window):
    if window < 1:
        raise ValueError("window")
    i = torch.arange(size)[:, None]
    j = torch.arange(size)[None, :]
    return (j <= i) & (j > i - window)
"""
WINDOW_MISTAKES = (
    Mistake("off-by-one window: window + 1 keys (i - j <= window)",
            "query i sees itself and the window - 1 positions before it: keys i - window + 1 .. i, so j > i - window",
            variant(WINDOW_SOURCE, ("(j > i - window)", "(j >= i - window)"))),
    Mistake("off-by-one window: window - 1 keys (i - j < window - 1)",
            "query i sees `window` keys, itself included: i - window < j <= i",
            variant(WINDOW_SOURCE, ("(j > i - window)", "(j > i - window + 1)"))),
    Mistake("a symmetric band: the window also looks ahead (|i - j| < window)",
            "a decoder's window is causal: keys after the query stay masked, (j <= i) & (j > i - window)",
            variant(WINDOW_SOURCE, ("return (j <= i) & (j > i - window)", "return (i - j).abs() < window"))),
    Mistake("the query itself left out of its window (j < i)",
            "a token always sees itself: query i's window is keys i - window + 1 .. i, the diagonal included, "
            "(j <= i) & (j > i - window)",
            variant(WINDOW_SOURCE, ("return (j <= i) & (j > i - window)", "return (j < i) & (j >= i - window)"))),
    Mistake("the window ignored (the plain causal mask)",
            "use window: keys more than window - 1 positions back are masked",
            variant(WINDOW_SOURCE, ("return (j <= i) & (j > i - window)", "return j <= i"))),
    Mistake("PyTorch's nn.Transformer convention: True = blocked",
            "in this course True means 'may attend': True inside the window",
            variant(WINDOW_SOURCE, ("return (j <= i) & (j > i - window)", "return ~((j <= i) & (j > i - window))"))),
    Mistake("a float 0/1 mask instead of booleans",
            "return a boolean tensor: the comparisons give one already, don't convert it",
            variant(WINDOW_SOURCE, ("return (j <= i) & (j > i - window)", "return ((j <= i) & (j > i - window)).float()"))),
    Mistake("no ValueError for a window smaller than 1",
            "a window must hold at least the token itself: raise ValueError when window < 1",
            variant(WINDOW_SOURCE, ('raise ValueError("window")', "pass"))),
)

# The mistakes run beside the course's attention (02).
NAMESPACE = {"scaled_dot_product_attention": scaled_dot_product_attention}


def _exercise(name, reference, cases, mistakes, graded=None):
    forbidden = FORBIDDEN + (LEAVES_TORCH + MODES_OFF if (graded or name) == "online_softmax_attention" else ())
    return Exercise(name, reference, cases, mistakes=mistakes, rtol=RTOL, atol=ATOL, forbidden=forbidden,
                    namespace=NAMESPACE, graded=graded or name)


EXERCISES = [
    _exercise("online_softmax_attention", ref.online_softmax_attention, _online_cases, ONLINE_MISTAKES),
    _exercise("online_softmax_attention_mask", ref.online_softmax_attention, _online_mask_cases, ONLINE_MISTAKES,
              graded="online_softmax_attention"),
    _exercise("online_softmax_attention_memory", ref.online_softmax_attention, _online_memory_cases, ONLINE_MISTAKES,
              graded="online_softmax_attention"),
    _exercise("sliding_window_mask", ref.sliding_window_mask, _window_cases, WINDOW_MISTAKES),
]

check = make_checker(EXERCISES)
