"""The comparison engine behind every hidden test: run the student's implementation and the
reference on the same inputs, compare, and when they differ say *which* known mistake the
student's output matches.

An exercise is a reference implementation, a list of cases and a catalogue of plausible
mistakes. A case is a function that takes an implementation (a function or a class) and
returns its output, so the same case runs the reference, the student's code and every
catalogued mistake. Outputs are compared as nested tuples/lists of numpy arrays, torch
tensors and numbers.
"""
from __future__ import annotations

import contextlib
import contextvars
import dis
import hashlib
import math
import os
import re
import sys
import textwrap
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..serialize import Unsupported, plain, rebuilt, type_name


class CheckFailed(AssertionError):
    """A hidden test failed; the message is written for the student."""


class ForbiddenCall(Exception):
    """The student's code called something the exercise asks them to write themselves."""


def numbers(value, what: str = "") -> np.ndarray:
    """A module's output as float64 numbers (a tensor or an array of numbers); TypeError otherwise,
    naming `what` the output was (e.g. "training mode") when given."""
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        got = type(value).__name__
        raise TypeError(f"the module returned {got} in {what}, not a tensor of numbers" if what
                        else f"expected a tensor of numbers, got {got}")
    return value.astype(np.float64)


def random_state(template, rng) -> dict:
    """Random float32 values for every entry of `template`'s state_dict, drawn from `rng` in its order:
    normalisation layers (a first name part holding "norm") near 1 for their scales and near 0 for
    their shifts, 2-D weights ~ 1/sqrt(fan_in), everything else small. The hidden weights that the
    module checks of notebooks 05 and 07 copy into the student's layer."""
    import torch

    state = {}
    for key, value in template.state_dict().items():
        shape = tuple(value.shape)
        if "norm" in key.split(".")[0]:
            noise = (1.0 if key.endswith("weight") else 0.0) + 0.2 * rng.normal(size=shape)
        elif key.endswith("weight") and value.dim() == 2:
            noise = rng.normal(size=shape) / np.sqrt(value.shape[1])
        else:
            noise = 0.1 * rng.normal(size=shape)
        state[key] = torch.tensor(np.asarray(noise), dtype=torch.float32)
    return state


def flag(value) -> np.ndarray:
    """A yes/no answer as a case returns it: a one-entry boolean array, [value]."""
    return np.array([bool(value)])


def raises(error, call, *args, propagate=(), otherwise=(), **kwargs) -> np.ndarray:
    """flag(True) when `call(*args, **kwargs)` raises `error`, flag(False) when it returns or raises one
    of `otherwise` (and not of `propagate`); any other exception propagates, so the case reports it as
    a crash (or as a stub's NotImplementedError, or a forbidden call)."""
    try:
        call(*args, **kwargs)
    except error:
        return flag(True)
    except propagate:
        raise
    except otherwise:
        return flag(False)
    return flag(False)


def raises_value_error(make) -> np.ndarray:
    """[True] when `make()` raises ValueError, [False] when it returns or raises anything else (a
    stub's NotImplementedError and a forbidden call still propagate: they are not answers)."""
    return raises(ValueError, make, propagate=(NotImplementedError, ForbiddenCall), otherwise=Exception)


@dataclass(frozen=True)
class Mistake:
    """A plausible wrong implementation, written out as code that defines the graded name."""

    name: str  # what went wrong, e.g. "softmax without subtracting the max"
    hint: str  # where to look
    code: str  # source defining the graded function/class (with the graded name)

    def build(self, graded_name: str, namespace: dict | None = None):
        """Execute `code` and return the object it defines under `graded_name`."""
        env = _default_namespace()
        env.update(namespace or {})
        exec(textwrap.dedent(self.code), env)  # our own catalogue
        return env[graded_name]


class Variant(str):
    """A mistake's code written as changes to a correct template (made by `variant`): the text, with
    the template and the (old, new) replacements kept, so that a test can replay them."""

    template: str
    replacements: tuple[tuple[str, str], ...]


def variant(template: str, *replacements: tuple[str, str]) -> Variant:
    """`template` with each (old, new) replaced in turn. ValueError when an `old` is not in the text at
    its turn: a reworded template must not silently turn a mistake into a copy of the correct code."""
    source = template
    for old, new in replacements:
        if old not in source:
            raise ValueError(f"mistake template: {old!r} not found")
        source = source.replace(old, new)
    made = Variant(source)
    made.template, made.replacements = template, tuple(replacements)
    return made


@dataclass(frozen=True)
class Case:
    """One input on which the implementation must agree with the reference."""

    description: str
    run: Callable[[Any], Any]
    # What is compared, computed from what `run` returned. Called only by the judge, in the trusted
    # process (never where the student's code runs), on the student's output, the reference's and
    # each catalogued mistake's: a verdict such as "dropout scaled the kept values by 1/(1-p)" is
    # decided here, from returned values, so monkeypatching torch.allclose in the sandbox cannot
    # decide it. A case's own inputs (p, logits) are in its closure, never read back from the
    # sandbox. It may raise on garbage: `derived` turns that into an `Unreadable` (equal to nothing).
    derive: Callable[[Any], Any] | None = None
    # The absolute tolerance for this case, where it needs a wider one than its exercise's: inputs that
    # float32 itself cannot resolve (scores of -400 are rounded by about 3e-5 each, so a correct student
    # computing in float64 is that far from a float32 reference). None: the exercise's.
    atol: float | None = None
    # The reference for this case, where it is not the exercise's: beam search's exercise is judged against the
    # exhaustive search (what a beam as wide as the vocabulary finds), and a case with a narrower beam against the
    # course's beam search. None: the exercise's.
    reference: Callable[..., Any] | None = None
    # The mistakes this case was built to tell (by name): the diagnosis tries them first here.
    tells: tuple[str, ...] = ()
    # A context manager entered around the student's run, *outside* the guard of forbidden calls: a measurement's
    # own dispatch mode, pushed by PyTorch functions the guard refuses to the student (nb08's memory probe).
    around: Callable[[], Any] | None = None


def case_reference(exercise: "Exercise", case: Case):
    """What `case` is judged against: its own reference, or its exercise's."""
    return case.reference or exercise.reference


def keeps_inputs(description: str, call: Callable[..., Any], *inputs) -> Case:
    """A case that also takes the inputs back after the call: an implementation that changes its caller's
    array or tensor in place (`S /= S.sum(...)`, `mask.logical_not_()`: a mask shared by the next layer is then
    flipped there) took full points, every other case handing it a copy. Compared as (output, whether each
    input is unchanged), the second decided in the trusted process from the inputs this closure keeps."""
    def run(f):
        given = [x.clone() if hasattr(x, "clone") else x.copy() for x in inputs]
        return call(f, *given), tuple(given)

    def derive(result):
        out, after = result
        if not isinstance(after, (tuple, list)) or len(after) != len(inputs):
            raise TypeError("the inputs did not come back")
        return out, np.array([_same_input(a, b) for a, b in zip(after, inputs, strict=True)])

    return Case(f"{description}, then whether each input is unchanged after the call (True: your function must "
                "not change its caller's arrays or tensors in place: compute a new one, x = x - m, not x -= m)",
                run, derive=derive)


def _same_input(after, before) -> bool:
    a, b = np.asarray(_to_numpy(after)), np.asarray(_to_numpy(before))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def tolerances(exercise: Exercise, case: Case) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs on `case`."""
    return exercise.rtol, exercise.atol if case.atol is None else max(case.atol, exercise.atol)


# PyTorch keeps one random generator per process (torch.manual_seed, dropout, nn.Linear's
# initialisation) and Python one set of warning filters. The trusted grader judges notebooks in
# worker threads: a case drawn, or a reference or catalogued mistake run, while another thread
# reseeds would see that thread's random numbers (a dropout case's reference, or the sampler's
# "global random state untouched", came out different). They take turns, holding this lock.
TRUSTED_TURN = threading.RLock()


class OnNumbers(str):
    """A forbidden entry's reason that holds only where the call's tensor (its first argument) holds floating-point
    or complex numbers: indices or a mask turned into a list (`for start in torch.arange(...).tolist()`) are no way
    around an exercise, and lost every point of a correct answer. Refused at run time only, never by name."""

    runtime_only = True


class Advised(str):
    """A forbidden entry's reason that says itself what to use instead: the general advice (write it yourself with
    basic operations) is not added after it. Notebook 07 asks for notebook 02's attention, not for one by hand."""


def refuses(why: str, first_argument) -> bool:
    """Whether a forbidden entry's reason holds for a call whose first argument is `first_argument`: always, but for
    an OnNumbers reason on a plain tensor (its exact type, never a subclass or a pretender) whose dtype, read by
    PyTorch's own C getter (no method of the student's runs inside the guard: a review), is an integer or bool one."""
    if not isinstance(why, OnNumbers):
        return True
    torch = sys.modules.get("torch")
    if torch is None or type(first_argument) not in (torch.Tensor, torch.nn.Parameter):
        return True
    dtype_of, whole = _dtype_reading(torch)
    return dtype_of(first_argument) not in whole


_DTYPE_READING: list = []


def _dtype_reading(torch) -> tuple:
    """(PyTorch's C getter of a tensor's dtype, which no Python code can replace; the integer and bool dtypes, whose
    numbers are indices or flags), read once."""
    if not _DTYPE_READING:
        whole = frozenset(getattr(torch, name) for name in ("bool", "uint8", "int8", "int16", "int32", "int64",
                                                            "uint16", "uint32", "uint64") if hasattr(torch, name))
        _DTYPE_READING.append((torch._C.TensorBase.dtype.__get__, whole))
    return _DTYPE_READING[0]


def _first_argument(frame):
    """The first argument of the function a frame runs (self, for a method), or None."""
    code = frame.f_code
    return frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None


class Unreadable(str):
    """What a case's `derive` made of an output it could not read: never equal to anything expected."""


class Told(Unreadable):
    """What a case's `derive` found wrong with an output before comparing it, in words for the student (shown as
    it is, not as "could not be read")."""


RANDOM_IN_EVAL = ("your output changed from one call to the next in evaluation mode (after .eval(), on the same "
                  "input, with the same weights): something random is still on. Likely cause: F.dropout(x, p) "
                  "without training=self.training, or an nn.Dropout made inside forward, where .eval() cannot "
                  "reach it; make each nn.Dropout once, in __init__, and call it in forward")


def called_twice(run: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A case's `run` for a module in evaluation mode, run twice (a fresh module each time, built and loaded the
    same): its two results, for `same_both_times` to compare in the trusted process."""
    return lambda impl: (run(impl), run(impl))


def same_both_times(derive: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """`derive` for a `called_twice` case: the first result (through `derive`, if given) when the second equals it,
    else Told(RANDOM_IN_EVAL): an evaluation-mode module is deterministic, and "values differ" by 0.016 reads
    like a rounding, not like dropout left on."""
    def verdict(value):
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise TypeError(f"expected two results of the same call, got {type(value).__name__}")
        first, second = value
        if difference(first, second, rtol=1e-6, atol=1e-7) is not None:
            return Told(RANDOM_IN_EVAL)
        return derive(first) if derive else first
    return verdict


def derived(case: Case, value):
    """`case.derive(value)` (or `value` itself for a case without one); never raises. Some derive
    build a model (torch's random generator): they take the trusted turn."""
    if case.derive is None:
        return value
    try:
        with TRUSTED_TURN, warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return case.derive(value)
    except Exception as err:  # noqa: BLE001 - anything the sandbox sent back may be garbage
        return Unreadable(f"{type(err).__name__}: {err}"[:500])


@dataclass
class Exercise:
    name: str
    reference: Any
    cases: Callable[[np.random.Generator], Sequence[Case]]
    mistakes: Sequence[Mistake] = ()
    rtol: float = 1e-5
    atol: float = 1e-6
    # Callables the student may not use for this exercise (built-ins it re-implements, the
    # course's own reference). Python functions are matched by code object, C functions by identity.
    forbidden: Sequence[tuple[Any, str]] = field(default_factory=tuple)
    namespace: dict = field(default_factory=dict)  # extra globals for the mistakes' code
    graded: str = ""  # the graded function/class this checks (defaults to `name`)

    def __post_init__(self):
        self.graded = self.graded or self.name


def _default_namespace() -> dict:
    env: dict[str, Any] = {"np": np, "math": math}
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        env.update(torch=torch, nn=nn, F=F)
    except ImportError:  # pragma: no cover - torch is a course dependency
        pass
    return env


PUBLIC_SALT = "attention-step-by-step"  # the students' own checks; `attn-course grade` draws a secret one per class


# The salt this thread grades with, when grade.checks_salted set one. ATTN_CHECK_SEED is one per
# process, and a Dask worker started with several threads grades notebooks of different classes
# (different salts) at once: when one task ended and put the variable back, another thread would
# draw its remaining cases with the public salt, not its class's.
THREAD_SALT: contextvars.ContextVar[str | None] = contextvars.ContextVar("attn_check_salt", default=None)


def check_salt() -> str:
    """The salt of the hidden inputs' seeds now: this thread's (checks_salted), else
    ATTN_CHECK_SEED, else the public one."""
    return THREAD_SALT.get() or os.environ.get("ATTN_CHECK_SEED", PUBLIC_SALT)


def seed_for(name: str) -> int:
    """A stable seed per exercise and salt (check_salt: ATTN_CHECK_SEED re-randomizes)."""
    salt = check_salt()
    return int.from_bytes(hashlib.sha256(f"{salt}:{name}".encode()).digest()[:4], "little")


# --------------------------------------------------------------------------- comparison
def _to_numpy(value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu()
        try:
            return value.numpy()
        except TypeError:  # a dtype numpy has not (bfloat16): its values as float32, its dtype judged apart
            return value.float().numpy()
    return value


def _short(array, limit: int = 6) -> str:
    a = np.asarray(array)
    with np.printoptions(precision=4, suppress=True, threshold=limit, edgeitems=2, linewidth=100):
        return np.array2string(a) if a.ndim else repr(a.item() if a.size == 1 else a)


@dataclass(frozen=True)
class Difference:
    """How an output differs from the expected one: the sentence for the student and short
    summaries of both sides (what differs: a type, a length, a shape, a dtype, or the values)."""

    message: str
    expected: str = ""
    received: str = ""


def _differs(where: str, expected: str, received: str) -> Difference:
    return Difference(f"{where}: expected {expected}, got {received}", expected, received)


def compare(expected, got, rtol: float = 1e-5, atol: float = 1e-6, where: str = "output") -> str | None:
    """None when `got` matches `expected`, else a sentence saying how it differs."""
    found = difference(expected, got, rtol, atol, where)
    return found.message if found else None


def _kind_of(got) -> str:
    """What came back, in words: its type's name, or what the sandbox could not send (a meta tensor, a nested one)."""
    return got.what if isinstance(got, Unsupported) else type(got).__name__


def difference(expected, got, rtol: float = 1e-5, atol: float = 1e-6, where: str = "output") -> Difference | None:
    """None when `got` matches `expected`, else how it differs (`compare`'s sentence, with both sides)."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)):
            return _differs(where, f"a tuple of {len(expected)} values", _kind_of(got))
        if len(got) != len(expected):
            return Difference(f"{where}: expected {len(expected)} values, got {len(got)}",
                              f"{len(expected)} values", f"{len(got)} values")
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            problem = difference(e, g, rtol, atol, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if expected is None:
        return None if got is None else _differs(where, "None", _kind_of(got))
    is_tensor = type(expected).__module__.startswith("torch")
    if is_tensor and not type(got).__module__.startswith("torch"):
        return _differs(where, "a torch.Tensor", _kind_of(got))
    e, g = _to_numpy(expected), _to_numpy(got)
    if isinstance(e, (bool, np.bool_)) or (isinstance(e, np.ndarray) and e.dtype == bool):
        try:
            g_arr = np.asarray(g)
        except Exception:  # noqa: BLE001
            return _differs(where, "booleans", _kind_of(got))
        if g_arr.dtype != bool:
            return _differs(where, "a boolean mask", f"dtype {g_arr.dtype}")
    if _is_complex(g) and not _is_complex(e):  # float64 below would drop the imaginary part without a word
        return _differs(where, "real numbers", "complex numbers")
    try:
        g = np.asarray(g, dtype=np.float64) if not (isinstance(g, np.ndarray) and g.dtype == bool) else g
    except (TypeError, ValueError, OverflowError):  # not numbers, or integers past float64 (10**400)
        return _differs(where, f"numbers of shape {np.shape(e)}", _kind_of(got))
    e = np.asarray(e)
    if e.shape != g.shape:
        return _differs(where, f"shape {tuple(e.shape)}", f"shape {tuple(g.shape)}")
    if is_tensor and str(expected.dtype) != str(got.dtype):
        return Difference(f"{where}: expected dtype {expected.dtype}, got {got.dtype}"
                          + _right_values(e, g, rtol, atol, str(expected.dtype)),
                          f"dtype {expected.dtype}", f"dtype {got.dtype}")
    return _values_differ(e, g, rtol, atol, where)


def _is_complex(x) -> bool:
    """Whether `x` (a number, a list or an array) holds complex numbers."""
    try:
        return np.asarray(x).dtype.kind == "c"
    except Exception:  # noqa: BLE001 - not numbers at all: the comparison says so
        return False


_CASTS = {"torch.float32": "`.float()`", "torch.int64": "`.long()`", "torch.float64": "`.double()`"}


def _right_values(e: np.ndarray, g: np.ndarray, rtol: float, atol: float, want: str) -> str:
    """Said after a wrong dtype whose values are right (a loss computed in float64, say): only the cast to `want`
    (the expected dtype) is missing."""
    if e.dtype == bool or g.dtype == bool or _values_differ(e, g, rtol, atol, "") is not None:
        return ""
    cast = _CASTS.get(want, f"`.to({want})`")
    return (f" (the values are right: work in another precision if you like, but return {want}: {cast}, or "
            f"`.to(x.dtype)` with x an input of that dtype)")


def _values_differ(e: np.ndarray, g: np.ndarray, rtol: float, atol: float, where: str) -> Difference | None:
    """How two arrays of the same shape differ (None when they agree); both sides summarized by `_short`."""
    if e.dtype == bool:
        e, g = np.atleast_1d(e), np.atleast_1d(g)
        wrong = np.argwhere(e != g)
        if wrong.size:
            idx = tuple(int(i) for i in wrong[0])
            return Difference(f"{where}: {len(wrong)} entries differ, first at index {idx}: expected {e[idx]}, "
                              f"got {g[idx]}", _short(e), _short(g))
        return None
    e = e.astype(np.float64)
    if np.isnan(g).any() and not np.isnan(e).any():
        return Difference(f"{where}: contains NaN where the expected values are finite", _short(e), _short(g))
    if np.isinf(g).any() and not np.isinf(e).any():
        return Difference(f"{where}: contains inf where the expected values are finite", _short(e), _short(g))
    if not np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
        diff = np.abs(np.nan_to_num(g - e, nan=np.inf))
        idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
        at = f" at index {tuple(int(i) for i in idx)}" if idx else ""
        expected, received = _short(e), _short(g)
        return Difference(f"{where}: values differ (largest difference {float(diff.max()):.3g}{at}: "
                          f"expected {float(e[idx]):.6g}, got {float(g[idx]):.6g})" + _half_precision(e, g)
                          + f"\n    expected: {expected}\n    received: {received}" + _where_they_differ(e, g, rtol, atol),
                          expected, received)
    return None


def _where_they_differ(e: np.ndarray, g: np.ndarray, rtol: float, atol: float, shown: int = 4) -> str:
    """Which entries differ, each with both values, when the printed arrays elide them (a reader: an
    inverse_sqrt_lr with step // warmup printed two identical-looking arrays, its wrong entries inside the '...')."""
    if e.ndim == 0 or e.size <= 6:
        return ""
    wrong = np.argwhere(~np.isclose(g, e, rtol=rtol, atol=atol, equal_nan=True))
    listed = ", ".join(f"{tuple(int(i) for i in at)}: expected {float(e[tuple(at)]):.6g}, got {float(g[tuple(at)]):.6g}"
                       for at in wrong[:shown])
    more = f", and {len(wrong) - shown} more" if len(wrong) > shown else ""
    return f"\n    {len(wrong)} of {e.size} entries differ: {listed}{more}"


def _half_precision(e: np.ndarray, g: np.ndarray) -> str:
    """The sentence for an output computed in 16-bit floats and cast back (float16 or bfloat16: its differences
    are a few units of the third digit): every value returned is a 16-bit float, when the expected ones are not."""
    def sixteen_bit(x: np.ndarray) -> dict[str, np.ndarray]:
        as32 = x.astype(np.float32)
        with np.errstate(over="ignore"):
            return {"bfloat16": (as32.view(np.uint32) & np.uint32(0xFFFF)) == 0,  # first: bfloat16's fit float16 too
                    "float16": as32.astype(np.float16).astype(np.float32) == as32}

    finite = np.isfinite(e) & np.isfinite(g) & (g != 0)
    if finite.sum() < 4:
        return ""
    ee, gg = e[finite], g[finite]
    if not np.abs(ee).max() > 0 or len(np.unique(gg)) < min(len(np.unique(ee)), 8):
        return ""  # fewer distinct numbers than expected: another answer (uniform weights 1/T), not a rounding
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = float(np.nanmax(np.abs(gg - ee) / (np.abs(ee) + 0.1 * np.abs(ee).max())))
    expected_fits = sixteen_bit(ee)
    for kind, fits in sixteen_bit(gg).items():
        near = relative <= {"bfloat16": 1 / 16, "float16": 1 / 64}[kind]  # a few of its roundings, not another answer
        if near and fits.all() and expected_fits[kind].mean() <= 0.5:
            return (f"\n    Likely cause: every number you returned is a {kind} number (about {3 if kind == 'float16' else 2} significant digits): "
                    f"the computation ran in 16-bit floats ({'.half(), torch.float16' if kind == 'float16' else '.bfloat16()'}"
                    ", or autocast) and was cast back. Compute in float32.")
    return ""


# --------------------------------------------------------------------------- forbidden calls
@dataclass(frozen=True)
class ByName:
    """A forbidden function named by module and attribute path, resolved only where its module is
    already imported: a numpy exercise forbids torch's softmax without importing torch into every
    check (seconds per notebook). A student's code that imports the module during the check is run
    again with it resolved (`_run_student`)."""

    module: str
    path: str
    banned: str = ""  # the name a student reaches it by, where that is not the path's last part: a layer's
    # forward is reached by its class ("MultiheadAttention.forward" -> "MultiheadAttention"), not by "forward"

    @property
    def __name__(self) -> str:  # what the static pass bans it by (honesty._banned_names)
        return self.banned or self.path.rsplit(".", 1)[-1]

    def resolve(self):
        """The function, or None while its module is not imported."""
        obj = sys.modules.get(self.module)
        for part in self.path.split(".") if obj is not None else ():
            obj = getattr(obj, part, None)
        return obj


def _resolved(forbidden: Iterable[tuple[Any, str]]) -> tuple[list[tuple[Any, str]], set[str]]:
    """(the forbidden entries as functions, the modules of those not yet importable by name)."""
    found, pending = [], set()
    for func, why in forbidden:
        if isinstance(func, ByName):
            obj = func.resolve()
            if obj is None:
                pending.add(func.module)
                continue
            func = obj
        found.append((func, why))
    return found, pending


class _CallGuard:
    """Raise ForbiddenCall when a forbidden function is entered. A profile hook on this thread and on
    the threads started meanwhile sees Python functions (by code object), C functions (by identity)
    and torch.ops calls (by kernel name); where a forbidden entry is PyTorch's, PyTorch's function
    mode also sees calls made from C (map(F.scaled_dot_product_attention, ...)) and its dispatch
    mode the kernels behind the built-in (torch._scaled_dot_product_flash_attention_for_cpu, ...).
    It also refuses the C functions that start a process (F6: multiprocessing's spawn raises no audit
    event), and refuses to start when PyTorch's hooks its modes need were left switched off (F8: an
    unpickled payload can enter torch._C.DisableTorchFunction outside any check)."""

    def __init__(self, forbidden: Iterable[tuple[Any, str]]):
        # Keyed by identity: code objects compare *equal* when their source is the same, and a
        # student who writes exactly the reference's one-liner has done nothing wrong.
        self.codes: dict[int, tuple[Any, str]] = {}
        self.builtins: dict[int, tuple[Any, str]] = {}
        self.torch_functions: dict[int, tuple[Any, str]] = {}  # what torch's function dispatcher can see
        from_torch = []
        forbidden, self.pending = _resolved(forbidden)  # pending: modules of ByName entries not imported yet
        for func, why in forbidden:
            code = getattr(func, "__code__", None)
            if code is not None:
                self.codes[id(code)] = (code, why)
            else:
                self.builtins[id(func)] = (func, why)
            owner = getattr(func, "__objclass__", None)  # a Tensor method: its module is its class's (torch._C)
            if str(getattr(func, "__module__", None) or getattr(owner, "__module__", "") or "").startswith("torch"):
                from_torch.append((func, why))
                if code is None or "." not in func.__qualname__:  # not a module's method
                    self.torch_functions[id(func)] = (func, why)
        self.kernels = _forbidden_kernels(from_torch)  # (name prefix, why)
        if self.kernels:
            for func, why in _kernel_functions(self.kernels):  # torch._scaled_dot_product_..., by identity
                self.builtins.setdefault(id(func), (func, why))
        self.op_calls = op_call_codes() if self.kernels else {}
        for func, why in _process_starters():  # F6: seen by identity too, where no audit event is raised
            self.builtins.setdefault(id(func), (func, why))
        self.libraries = model_library_folders()  # ready-made models' code, refused wherever it is entered
        self.hit: str | None = None
        self.watchers: list = []  # an exercise's own checks of a call's arguments (watching_calls), in every thread
        self.scripts_refused = False  # TorchScript refused while this guard is on (where PyTorch's entries are forbidden)
        self._modes: list = []

    def __enter__(self):
        import threading

        if (self.torch_functions or self.kernels) and _torch_hooks_off():  # before anything is installed
            self.hit = TORCH_HOOKS_OFF
            raise ForbiddenCall(self.hit)
        self._previous = sys.getprofile()
        self._previous_threads = threading.getprofile()
        self._installed = self._hook
        self._owner = threading.get_ident()
        threading.setprofile(_thread_dispatch)  # threads started during the check: the dispatcher, never this guard's
        # own hook, which a thread would keep after the case (its findings then went to a guard nobody reads)
        _ACTIVE_GUARD[:] = [self]  # threads the notebook started before it: their dispatcher forwards here
        self.scripts_refused = bool(self.torch_functions or self.kernels)
        if self.scripts_refused:
            _refuse_torchscript_in_checks()
        self._modes = _torch_modes(self) if self.torch_functions or self.kernels else []
        for mode in self._modes:
            mode.__enter__()
        sys.setprofile(self._installed)
        return self

    def __exit__(self, *exc):
        import threading

        switched_off = sys.getprofile() is not self._installed or threading.getprofile() is not _thread_dispatch
        if _TAMPERED and not self.hit:
            self.hit = _TAMPERED[0]
        _ACTIVE_GUARD[:] = [None]
        sys.setprofile(self._previous)
        threading.setprofile(self._previous_threads)
        for mode in reversed(self._modes):
            try:
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - the student's code left PyTorch's mode stack in disorder
                pass
        if switched_off and not self.hit:
            self.hit = ("it switches off the grader's check of the built-ins you call (sys.setprofile, or the hook "
                        "threading gives new threads); remove that")
        return False

    def _found(self, why: str) -> None:
        import threading

        self.hit = self.hit or why
        if threading.get_ident() != self._owner:  # another thread: noted, the case ends forbidden all the same; no
            return  # raise there, which would take that thread's hook away (CPython unsets a hook that raises)
        sys.setprofile(None)
        raise ForbiddenCall(self.hit)

    def _hook(self, frame, event, arg):
        if event == "call":
            found = self.codes.get(id(frame.f_code))
            if found and found[0] is frame.f_code and not on_behalf_of_torch_printing(frame.f_back) \
                    and refuses(found[1], _first_argument(frame)):
                self._found(found[1])
            if id(frame.f_code) in self.op_calls:  # torch.ops.<namespace>.<kernel>(...)
                why = self._kernel(op_name(frame))
                if why:
                    self._found(why)
            if self.libraries and frame.f_code.co_filename.startswith(self.libraries):
                self._found(model_library_why(frame.f_code.co_filename))
        elif event == "c_call":
            found = self.builtins.get(id(arg))
            if found and found[0] is arg and not on_behalf_of_torch_printing(frame):
                self._found(found[1])
        for watcher in self.watchers:
            why = watcher(frame, event, arg)
            if why:
                self._found(why)

    def _kernel(self, name: str) -> str | None:
        """The reason a kernel (aten::name, aten.name.overload or its Python name) is forbidden, if it is."""
        name = name.split("::", 1)[-1]
        for prefix, why in self.kernels:
            if name.startswith(prefix):
                return _kernel_seen(why, name.split(".")[0])
        return None


def _kernel_seen(why: str, kernel: str) -> str:
    """A forbidden kernel's reason, naming the kernel: a student who wrote exp(x - torch.logsumexp(x)) never
    typed 'softmax', and the message says which of their calls is one."""
    return f"{why} (PyTorch's `{kernel}` was called)"


def _codes_of(*owners) -> set:
    """The code objects of the functions (and methods, and the functions nested in them) of modules or classes."""
    import types

    found, todo = set(), []
    for owner in owners:
        for value in vars(owner).values():
            value = getattr(value, "__func__", value)
            value = getattr(value, "__wrapped__", value)
            if isinstance(value, types.FunctionType):
                todo.append(value.__code__)
            elif isinstance(value, type) and value.__module__ == getattr(owner, "__name__", None):
                found |= _codes_of(value)
    while todo:
        code = todo.pop()
        if code not in found:
            found.add(code)
            todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


_PYTORCH_OWN: dict = {}


def on_behalf_of_torch_printing(frame, depth: int = 16) -> bool:
    """Whether a forbidden PyTorch function is called by PyTorch itself on behalf of its printing, which turns the
    dispatch modes off while it formats a tensor (a student's debug print(m) had the whole exercise refused):
    walking up from the caller `frame`, only PyTorch's own dispatch-mode and printing code (and contextlib's)
    comes before a frame of its printing. Matched by code object, never by file name (a code object's file name
    is the student's to set)."""
    if not _PYTORCH_OWN:
        import torch._tensor_str
        import torch.utils._python_dispatch

        printing = _codes_of(torch._tensor_str)
        _PYTORCH_OWN.update(anchors=printing,
                            between=printing | _codes_of(torch.utils._python_dispatch, contextlib))
    while frame is not None and depth > 0:
        code = frame.f_code
        if code in _PYTORCH_OWN["anchors"]:
            return True
        if code not in _PYTORCH_OWN["between"]:
            return False
        frame, depth = frame.f_back, depth - 1
    return False


MODEL_LIBRARIES = ("transformers",)  # installed with the course (its peer benchmark): whole models, ready-made
MODEL_LIBRARY_WHY = ("it runs code of Hugging Face's transformers ({where}), a library of ready-made models whose "
                     "attention, normalisation layers, masks and losses are what the exercises ask you to write; "
                     "remove it and write that part yourself")


_LIBRARIES_IMPORTED: set[str] = set()  # model libraries the notebook imported (the behaviour watch's audit hook)
_LIBRARY_FOLDERS: set[str] = set()  # their folders, once found: never forgotten


def model_library_folders() -> tuple[str, ...]:
    """The folders of the model libraries the notebook imported (none imported: nothing to watch). Their code
    does the exercises (transformers' eager_attention_forward, DebertaLayerNorm, LabelSmoother took full marks).
    Found from any of the library's modules still loaded and remembered; where the audit hook saw an import of
    one whose every sys.modules entry was deleted since, from where Python would find it."""
    for key, module in list(sys.modules.items()):
        top = key.split(".", 1)[0]
        file = getattr(module, "__file__", None) if top in MODEL_LIBRARIES else None
        if isinstance(file, str):
            _LIBRARY_FOLDERS.update(_library_folder(file, top))
    for name in _LIBRARIES_IMPORTED:
        if not any(os.sep + name + os.sep in folder for folder in _LIBRARY_FOLDERS):
            _LIBRARY_FOLDERS.update(_library_folder(_origin(name), name))
    return tuple(sorted(_LIBRARY_FOLDERS))


def _library_folder(file: str, top: str) -> list[str]:
    """The folder of library `top` that holds `file` (as given and with links resolved), or none."""
    found = []
    for path in (file, os.path.realpath(file)) if file else ():
        head, marker, _ = path.rpartition(os.sep + top + os.sep)
        if marker:
            found.append(head + marker)
    return found


def _origin(name: str) -> str:
    try:
        import importlib.util

        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    return str(getattr(spec, "origin", "") or "")


def model_library_why(filename: str) -> str:
    """The student's message for code of a model library entered during a check."""
    parts = filename.replace(os.sep, "/").split("/")
    top = next((i for i, p in enumerate(parts) if p in MODEL_LIBRARIES), len(parts) - 1)
    return MODEL_LIBRARY_WHY.format(where="/".join(parts[top:]))


def _process_starters() -> list[tuple[Any, str]]:
    """The C functions that start a process, refused by the profile hook while a case runs. The audit
    hook (install_behaviour_watch) sees most of them, but not _posixsubprocess.fork_exec, which
    multiprocessing's spawn and forkserver start methods call directly: it raises no audit event."""
    if not _PROCESS_STARTERS:
        found = [(getattr(os, name), f"os.{name}") for name in
                 ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "execv", "execve") if hasattr(os, name)]
        try:
            import _posixsubprocess

            found.append((_posixsubprocess.fork_exec, "_posixsubprocess.fork_exec"))
        except (ImportError, AttributeError):  # pragma: no cover - not a POSIX system
            pass
        _PROCESS_STARTERS.extend((func, PROCESS_WHY.format(event=name)) for func, name in found)
    return _PROCESS_STARTERS


_PROCESS_STARTERS: list[tuple[Any, str]] = []
TORCHSCRIPT_WHY = ("it runs TorchScript (torch.jit) while the grader checks it: compiled code in which the grader "
                   "cannot see which of PyTorch's functions run (a scripted multi_head_attention_forward does an "
                   "exercise's work unseen); write the exercise in plain Python and PyTorch")


def _refuse_torchscript_in_checks() -> None:
    """Make a call of TorchScript code (a scripted function, a scripted module's method) refuse while a guard
    that forbids PyTorch's entries is on: its graph runs in PyTorch's own interpreter, where neither the
    profile hook nor the function mode sees the forbidden function it was scripted from, and its kernels
    (linear, bmm, softmax) are everyone's. Once per process; a no-op until torch is imported."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(_refuse_torchscript_in_checks, "done", False):
        return
    for cls in (getattr(torch._C, "ScriptFunction", None), getattr(torch._C, "ScriptMethod", None)):
        if cls is None:
            continue
        original = cls.__call__

        def refusing(self, *args, _original=original, **kwargs):
            guard = _ACTIVE_GUARD[0]
            if guard is not None and guard.scripts_refused:
                guard.hit = guard.hit or TORCHSCRIPT_WHY
                raise ForbiddenCall(guard.hit)
            return _original(self, *args, **kwargs)

        cls.__call__ = refusing
    _refuse_torchscript_in_checks.done = True
TORCH_HOOKS_OFF = ("it leaves PyTorch's function or dispatch hooks switched off (torch._C.DisableTorchFunction, "
                   "torch._C._DisableTorchDispatch, entered and never left, for instance by unpickling), and the "
                   "grader's check of the built-ins you call relies on them; remove that")


def _torch_hooks_off() -> bool:
    """Whether PyTorch's function hooks or its Python dispatch key are switched off on this thread (as
    code outside the check can leave them: the guard's modes would then see nothing)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return not torch._C._is_torch_function_enabled() or \
            torch._C._dispatch_tls_local_exclude_set().has(torch._C.DispatchKey.Python)
    except Exception:  # noqa: BLE001 - a PyTorch without these: the modes are all the guard has
        return False


# The ATen kernels behind a built-in: calling one by name (torch.ops.aten.<kernel>, torch.<kernel>)
# is the built-in under another spelling.
_NORMALIZATIONS = ("native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "native_batch_norm",
                   "_native_batch_norm", "batch_norm", "_batch_norm", "instance_norm", "_fused_rms_norm", "rms_norm")
# a softmax is any of them: F.softmin, F.cross_entropy (log_softmax, then the loss) and F.gumbel_softmax reach one
# from C, where the function mode does not see them; x - logsumexp(x) is log_softmax; attention with the identity as
# keys and values is softmax, computed by attention's own kernels (_safe_softmax, or one fused kernel)
_SOFTMAXES = ("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax", "_masked_softmax",
              "_sparse_softmax", "_sparse_log_softmax", "_nested_tensor_softmax", "special_softmax",
              "special_log_softmax", "logsumexp", "special_logsumexp", "logcumsumexp", "_logcumsumexp",
              "_scaled_dot_product", "scaled_dot_product", "_native_multi_head_attention", "multi_head_attention")
# cosine similarity and the loss that is 1 - cosine (both decompose into products and sums, so they are known by
# name only: torch.ops.aten.cosine_similarity, torch.cosine_embedding_loss)
_COSINES = ("cosine_similarity", "cosine_embedding_loss")
_KERNELS = {
    "softmax": _SOFTMAXES,
    "log_softmax": _SOFTMAXES,
    "cosine_similarity": _COSINES,
    "cosine_embedding_loss": _COSINES,
    "scaled_dot_product_attention": ("_scaled_dot_product", "scaled_dot_product"),
    "MultiheadAttention": ("_native_multi_head_attention", "multi_head_attention"),
    "multi_head_attention_forward": ("_native_multi_head_attention", "multi_head_attention"),
    # a normalization is any of them (one group, one instance, or the input transposed, is a layer norm)
    **{name: _NORMALIZATIONS for name in ("LayerNorm", "layer_norm", "native_layer_norm", "GroupNorm", "group_norm",
                                          "native_group_norm", "RMSNorm", "rms_norm", "_BatchNorm", "batch_norm",
                                          "native_batch_norm", "_InstanceNorm", "instance_norm")},
}


def _forbidden_kernels(torch_entries: Iterable[tuple[Any, str]]) -> tuple[tuple[str, str], ...]:
    """(kernel name prefix, why) for the forbidden PyTorch entries that have ATen kernels of their own."""
    found = []
    for func, why in torch_entries:
        qual = str(getattr(func, "__qualname__", "") or "")
        for key in sorted({qual.split(".")[0], str(getattr(func, "__name__", ""))}):
            found += [(prefix, why) for prefix in _KERNELS.get(key, ()) if (prefix, why) not in found]
    return tuple(found)


_KERNEL_FUNCTIONS: dict[tuple, list] = {}


def _kernel_functions(kernels: tuple[tuple[str, str], ...]) -> list[tuple[Any, str]]:
    """The C functions of torch's own namespaces whose names start with a forbidden kernel's."""
    if kernels not in _KERNEL_FUNCTIONS:
        import torch

        found = []
        for space in (torch, torch._C._VariableFunctions, torch._C._nn):
            for name in dir(space):
                why = next((w for prefix, w in kernels if name.startswith(prefix)), None)
                func = getattr(space, name, None)
                if why and callable(func) and not hasattr(func, "__code__"):
                    found.append((func, _kernel_seen(why, name)))
        _KERNEL_FUNCTIONS[kernels] = found
    return _KERNEL_FUNCTIONS[kernels]


def op_name(frame) -> str:
    """The kernel's name (aten::x, or x.overload) in a frame of one of torch.ops' call methods."""
    op = frame.f_locals.get("self")
    return str(getattr(op, "_qualified_op_name", None) or getattr(op, "_name", ""))


def op_call_codes() -> dict[int, Any]:
    """The code of torch.ops' call methods (torch.ops.aten.x(...) enters one of them)."""
    try:
        from torch._ops import OpOverload, OpOverloadPacket
    except ImportError:  # pragma: no cover - torch is a course dependency
        return {}
    codes = [getattr(cls.__call__, "__code__", None) for cls in (OpOverload, OpOverloadPacket)]
    return {id(c): c for c in codes if c is not None}


_MODE_CLASSES: list = []


# Tensor methods that run a Python function of the caller's per element: PyTorch runs it with this guard's function
# mode switched off (as every mode's handler runs its function), so a built-in called from C there (map) went unseen
_CALLBACK_METHODS = frozenset({"apply_", "map_", "map2_"})
CALLBACK_WHY = ("it runs Python code through Tensor.{name}, where the grader's check of the built-ins you call cannot "
                "follow it; compute with tensor operations instead")


def _thread_modes() -> None:
    """A thread's own PyTorch modes (modes are per thread), for whichever case is running whenever it runs: its
    profile hook alone cannot see a built-in called from C (map over F.scaled_dot_product_attention in a worker
    thread took full points). Entered when the thread first runs during a case (not at its start: IPython's
    own history thread, started with the shell, was one), for the rest of its life; none without PyTorch."""
    if "torch" not in sys.modules:
        return
    for mode in _torch_modes(None):
        mode.__enter__()


def _torch_modes(guard: _CallGuard | None) -> list:
    """PyTorch modes for the guard: a TorchFunctionMode refusing the forbidden PyTorch functions (by
    identity, or by kernel name), and a TorchDispatchMode refusing the forbidden kernels."""
    if not _MODE_CLASSES:
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        class _RefuseFunctions(TorchFunctionMode):
            def __init__(self, owner: _CallGuard):
                super().__init__()
                self.owner = owner

            def __torch_function__(self, func, types, args=(), kwargs=None):
                owner = self.owner or _ACTIVE_GUARD[0]  # none: a thread's mode, for whichever case is running
                if owner is not None and (owner.torch_functions or owner.kernels):
                    found = owner.torch_functions.get(id(func))
                    if found and found[0] is func and refuses(found[1], args[0] if args else None):
                        owner._found(found[1])
                    if owner.kernels:
                        why = owner._kernel(getattr(func, "__name__", ""))
                        if why:
                            owner._found(why)
                    if getattr(func, "__name__", "") in _CALLBACK_METHODS:
                        owner._found(CALLBACK_WHY.format(name=func.__name__))
                return func(*args, **(kwargs or {}))

        class _RefuseKernels(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False  # else PyTorch wraps the hook for torch.compile, importing dynamo (seconds)

            def __init__(self, owner: _CallGuard):
                super().__init__()
                self.owner = owner

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                owner = self.owner or _ACTIVE_GUARD[0]
                why = owner._kernel(func._schema.name) if owner is not None and owner.kernels else None
                if not why and owner is not None and owner.kernels and any(map(_dispatches_itself, types)):
                    why = DISPATCHING_SUBCLASS
                if why:
                    owner._found(why)
                return func(*args, **(kwargs or {}))

        _MODE_CLASSES[:] = [_RefuseFunctions, _RefuseKernels]
    functions, kernels = _MODE_CLASSES
    return [functions(guard)] + ([kernels(guard)] if guard is None or guard.kernels else [])


# While this mode hands a kernel on, PyTorch takes it off the stack: a tensor subclass's own __torch_dispatch__
# then runs the kernels it likes unseen (a red team's softmax, computed from cross-entropy inside one).
DISPATCHING_SUBCLASS = ("it uses a tensor subclass with its own __torch_dispatch__, which runs PyTorch's kernels where "
                        "the grader's check of this exercise's built-ins cannot see them: write the exercise with "
                        "ordinary tensors")


def _dispatches_itself(kind) -> bool:
    """Whether a tensor type (a dispatch's `types`) has a __torch_dispatch__ of its own, read from the classes'
    own dictionaries (nothing of a student's class runs)."""
    import torch

    mro = type.__dict__["__mro__"].__get__(kind) if isinstance(kind, type) else ()
    for cls in mro:
        if cls is torch.Tensor or cls is torch._C.TensorBase:
            return False
        own = type.__dict__["__dict__"].__get__(cls).get("__torch_dispatch__")
        if own is not None:
            return getattr(own, "__func__", own) is not torch._C._disabled_torch_dispatch_impl
    return False


def reference_guard(module) -> list[tuple[Any, str]]:
    """Every function and method in the course's reference `module`: not to be called by students."""
    why = (f"it calls the course's reference implementation ({module.__name__}); "
           "write the exercise yourself")
    found = []
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        for func in [value, *(vars(value).values() if isinstance(value, type) else ())]:
            own = _own_function(func, module)
            if own is not None:
                found.append((own, why))
    return found


def _own_function(value: Any, module) -> Any:
    """The function a module's value runs as its own code: a decorated one's inner function (a
    @contextmanager's, an lru_cache's), never the decorator's wrapper, whose code every decorated function
    shares (contextlib's `helper`, which PyTorch's own function modes enter: banned, it refused every
    model once a torch mode was on). None for what is not a function of the module's."""
    import inspect

    try:
        func = inspect.unwrap(value) if callable(value) else value
    except ValueError:  # a cycle of __wrapped__
        return None
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    made_here = code.co_filename == getattr(module, "__file__", None) or code.co_filename.startswith("<")
    return func if made_here else None  # '<string>': a dataclass's generated methods, its class's own


# --------------------------------------------------------------------------- behaviour while checked
# Events (PEP 578 audit hooks) that start another process, where the built-ins called cannot be seen
# (F6), and the unpickler looking a function up by its name (F8): refused while an implementation is
# being checked. An audit hook cannot be removed; it is installed in the sandbox only (the runner).
PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                            "subprocess.Popen", "pty.spawn", "os.startfile", "os.startfile/2"})
PROCESS_WHY = ("it starts another process ({event}) while the grader checks it: the grader does not allow "
               "starting processes while an exercise is checked (it cannot see what runs there); compute the "
               "result in your function")
UNPICKLE_WHY = ("it looks {name} up by name while unpickling, like a getattr with a computed name: an exercise "
                "may not load functions from data while it is checked")
SWITCHED_OFF = "it switches off the grader's watch over the processes it starts (the audit hook's state)"
_WATCH: list[dict] = []  # the audit hook's state, once the runner installed it
_ACTIVE_GUARD: list = [None]  # the _CallGuard of the case running now, if any


@contextlib.contextmanager
def watching_calls(watcher):
    """Let `watcher(frame, event, arg) -> reason or None` (a profile hook's arguments) refuse a call while the
    case running now is checked, wherever the guard's hook runs: on the checking thread and on every thread
    the notebook started, before the check or during it (a hook of the exercise's own, set with
    sys.setprofile, sees the checking thread only: label smoothing computed in a worker thread took full
    points). With no guard on (an exercise that forbids only the course's reference, which the sandbox leaves to
    the reference's stub; the trusted process), a guard of its own watches the block."""
    guard = _ACTIVE_GUARD[0]
    if guard is None:
        guard = _CallGuard(())
        with guard:
            guard.watchers.append(watcher)
            yield
        if guard.hit:  # seen on another thread, or the student's code swallowed the refusal
            raise ForbiddenCall(guard.hit)
        return
    guard.watchers.append(watcher)
    try:
        yield
    finally:
        if watcher in guard.watchers:
            guard.watchers.remove(watcher)


def _thread_dispatch(frame, event, arg):
    """The profile hook of every thread the notebook starts (threading's, set before any student code):
    it forwards to the guard of the case running, if any. A thread started before a check and handed its
    inputs there (a queue) otherwise called a forbidden built-in out of the guard's sight, which is on
    the checking thread only (sys.setprofile; PyTorch's modes are per thread too)."""
    if event == "c_call" and arg is _SETPROFILE and not _keeps_the_dispatcher(frame):
        _TAMPERED[:] = _TAMPERED or [HOOK_TAKEN]
        raise ForbiddenCall(HOOK_TAKEN)  # the call never happens: the thread ends here, its work not done
    guard = _ACTIVE_GUARD[0]
    if guard is not None:
        if not getattr(_IN_THREAD, "modes", False):  # once per thread, when it first runs during a case
            _IN_THREAD.modes = True
            try:
                _thread_modes()
            except Exception:  # noqa: BLE001 - PyTorch unusable here: the profile hook still watches
                pass
        guard._hook(frame, event, arg)


_IN_THREAD = threading.local()  # per thread: whether its own PyTorch modes were entered
_SETPROFILE = sys.setprofile
_TAMPERED: list[str] = []  # why every later case ends forbidden: a watched thread's hook was being replaced
HOOK_TAKEN = ("it takes the grader's check of the built-ins you call away from a thread (its profile function "
              "replaced): remove what changes sys.setprofile or threading's profile hook")


def _keeps_the_dispatcher(frame) -> bool:
    """Whether a sys.setprofile call from `frame` leaves a watched thread with the dispatcher: threading's own
    bootstrap handing the new thread threading's hook, while that hook is the dispatcher itself."""
    import threading

    return frame.f_code is threading.Thread._bootstrap_inner.__code__ and \
        frame.f_globals.get("_profile_hook") is _thread_dispatch


def _hooked(function, args, kwargs):
    """A new thread's first code: the dispatcher as its profile hook, before anything of the notebook runs there
    (a Thread subclass's own _bootstrap_inner ran run() without threading's hook), then `function`."""
    _SETPROFILE(_thread_dispatch)
    return function(*args, **kwargs)


_THREAD_STARTS: dict = {}  # Python's own thread starts, while the watch's stand in for them


def _watch_thread_starts(state: dict) -> None:
    """Every thread starts watched (Python 3.11 has no profile hook for every thread, and raises no audit event
    for a new one): `_thread.start_new_thread`, its alias `start_new` and threading's own copy run `_hooked`
    first. A second `_thread` module, made afresh from the interpreter's built-ins (`_imp`), is this one."""
    import _imp
    import _thread
    import threading

    if _THREAD_STARTS:
        return
    _THREAD_STARTS.update(start_new_thread=_thread.start_new_thread, start_new=_thread.start_new,
                          threading=threading._start_new_thread, create_builtin=_imp.create_builtin,
                          exec_builtin=_imp.exec_builtin)
    start, create, execute = _thread.start_new_thread, _imp.create_builtin, _imp.exec_builtin

    def start_new_thread(function, args, kwargs=None):
        return start(_hooked, (function, tuple(args), dict(kwargs or {})))

    def create_builtin(spec):
        return _thread if getattr(spec, "name", None) == "_thread" else create(spec)

    def exec_builtin(module):
        return 0 if module is _thread else execute(module)  # run again, it would put Python's own starts back

    _thread.start_new_thread = _thread.start_new = threading._start_new_thread = start_new_thread
    _imp.create_builtin, _imp.exec_builtin = create_builtin, exec_builtin


def unwatch_thread_starts() -> None:
    """Python's own thread starts back, and no hook for new threads: for a test that installed the watch in
    its own process (the sandbox's runner never takes it off)."""
    import _imp
    import _thread
    import threading

    threading.setprofile(None)
    _TAMPERED.clear()
    if _THREAD_STARTS:
        _thread.start_new_thread, _thread.start_new = _THREAD_STARTS["start_new_thread"], _THREAD_STARTS["start_new"]
        threading._start_new_thread = _THREAD_STARTS["threading"]
        _imp.create_builtin, _imp.exec_builtin = _THREAD_STARTS["create_builtin"], _THREAD_STARTS["exec_builtin"]
        _THREAD_STARTS.clear()


def install_behaviour_watch() -> None:
    """Install (once) the audit hook that refuses, while `run_case` runs a student's implementation,
    to start a process or to resolve a name for an unpickler: ForbiddenCall in the student's code, and
    the case's outcome is "forbidden" even when the student catches it. Called by the sandbox's
    runner before any student code; the state lives in this closure and in `_WATCH` (student code
    can reach it only through gc or frames, which the static pass flags; switching it off is seen).
    Every thread started from here on carries `_thread_dispatch`, the case's guard in that thread, and none
    starts without it (`_watch_thread_starts`)."""
    import threading

    threading.setprofile(_thread_dispatch)
    if _WATCH:
        _watch_thread_starts(_WATCH[0])
        return
    state = {"checking": False, "hit": ""}
    _watch_thread_starts(state)

    def hook(event: str, args: tuple) -> None:
        if event == "import" and args and str(args[0]).split(".", 1)[0] in MODEL_LIBRARIES:
            _LIBRARIES_IMPORTED.add(str(args[0]).split(".", 1)[0])  # for good: sys.modules can forget it, this cannot
        if not state["checking"]:
            return
        if event in PROCESS_EVENTS:
            why = PROCESS_WHY.format(event=event)
        elif event == "pickle.find_class":
            why = UNPICKLE_WHY.format(name=".".join(str(a) for a in args[:2]))
        else:
            return
        state["hit"] = state["hit"] or why
        raise ForbiddenCall(why)

    sys.addaudithook(hook)
    _WATCH.append(state)


def _watched_run(case: Case, impl):
    """`case.run(impl)` under the behaviour watch (when installed): what it refused, even if caught,
    and a watch switched off during the run, end the case as ForbiddenCall. The result is read into the
    grader's own types (serialize.plain) before the watch and the guard end."""
    state = _WATCH[0] if _WATCH else None
    if state is None:
        return _read_run(case, impl)
    state["hit"], state["checking"] = "", True
    try:
        out = _read_run(case, impl)  # read here, watched and guarded: never by the serializer after the guard
    finally:
        switched_off = not state["checking"]
        state["checking"] = False
    if state["hit"] or _TAMPERED:
        raise ForbiddenCall(state["hit"] or _TAMPERED[0])
    if switched_off:
        raise ForbiddenCall(SWITCHED_OFF)
    return out


class _StudentRaised(Exception):
    """A student's exception, read where it was raised (its type's name, its message, where it came from): its
    own __str__ or __traceback__ runs under the case's guard, never after it (a message's __str__ could run a
    library unwatched)."""

    def __init__(self, notimpl: bool, name: str, message: str, site: str, raised_in: str):
        super().__init__(name)
        self.notimpl, self.name, self.message, self.site, self.raised_in = notimpl, name, message, site, raised_in


def _read_run(case: Case, impl):
    """`case.run(impl)`, its result read into the grader's types, its exception into a _StudentRaised."""
    try:
        return plain(case.run(impl))
    except (ForbiddenCall, _StudentRaised):
        raise
    except Exception as err:  # noqa: BLE001 - the student's: read here, reported by run_case
        raise _read_error(err) from None


def _read_error(err: Exception) -> _StudentRaised:
    try:
        message = str(err)[:2000]
    except Exception:  # noqa: BLE001 - a message that cannot be written is not the student's crash
        message = "(its message could not be written)"
    stub = _a_stub_raised(err)
    return _StudentRaised(stub, type_name(type(err)), message, crash_site(err), _raised_in(err) if stub else "")


def _around(case: Case):
    """The case's own context (Case.around), or none."""
    return case.around() if case.around is not None else contextlib.nullcontext()


def _run_student(exercise: Exercise, case: Case, impl):
    if not exercise.forbidden and not model_library_folders():
        with _around(case):
            out = _watched_run(case, impl)
        if not model_library_folders():
            return out
        return _guarded_run(_CallGuard(()), case, impl)  # it imported a model library meanwhile: again, guarded
    guard = _CallGuard(exercise.forbidden)
    out = _guarded_run(guard, case, impl)
    if any(m in sys.modules for m in guard.pending) or (not guard.libraries and model_library_folders()):
        out = _guarded_run(_CallGuard(exercise.forbidden), case, impl)  # imported meanwhile: again, guarded
    return out


def _guarded_run(guard: _CallGuard, case: Case, impl):
    with _around(case), guard:
        try:
            out = _watched_run(case, impl)
        except ForbiddenCall:
            raise
        except Exception:
            if guard.hit:  # the student swallowed our exception
                raise ForbiddenCall(guard.hit) from None
            raise
    if guard.hit:
        raise ForbiddenCall(guard.hit)
    return out


# --------------------------------------------------------------------------- the check


def trusted_run(case: Case, impl):
    """`case.run(impl)` for the reference or a catalogued mistake, in the trusted process: one
    thread at a time, warnings silenced."""
    with TRUSTED_TURN, warnings.catch_warnings(), np.errstate(all="ignore"), plain_torch_settings():
        warnings.simplefilter("ignore")
        return case.run(impl)


def _run_mistake(exercise: Exercise, case: Case, mistake: Mistake):
    with TRUSTED_TURN:
        return trusted_run(case, mistake.build(exercise.graded, exercise.namespace))


def _diagnosis_order(exercise: Exercise, case: Case) -> list[Mistake]:
    """The mistakes `case` was built to tell, then the rest of the catalogue, in its order."""
    told = [m for m in exercise.mistakes if m.name in case.tells]
    return told + [m for m in exercise.mistakes if m.name not in case.tells]


def diagnose(exercise: Exercise, case: Case, got) -> Mistake | None:
    """The first catalogued mistake whose output on `case` matches the student's (`got` as the
    case returned it: both sides go through the case's `derive` before they are compared)."""
    got = derived(case, got)
    if isinstance(got, Unreadable):
        return None
    for mistake in _diagnosis_order(exercise, case):
        try:
            wrong = _run_mistake(exercise, case, mistake)
        except Exception:  # noqa: BLE001 - a mistake may well crash on this input
            continue
        wrong = derived(case, wrong)
        if not isinstance(wrong, Unreadable) and compare(wrong, got, *tolerances(exercise, case)) is None:
            return mistake
    return None


def diagnose_crash(exercise: Exercise, case: Case, error_type: str, error_message: str) -> Mistake | None:
    """The first catalogued mistake that crashes on `case` with the same error as the student's."""
    for mistake in exercise.mistakes:
        try:
            _run_mistake(exercise, case, mistake)
        except Exception as err:  # noqa: BLE001
            if type(err).__name__ == error_type and str(err) == error_message:
                return mistake
    return None


KNOWN_MISTAKE = "This matches a known mistake: "  # the sentence naming a recognised mistake, for the student


def _explain(mistake: Mistake | None) -> str:
    """The lines naming a recognised mistake and where to look, for the student's message."""
    if not mistake:
        return ""
    return f"\n  {KNOWN_MISTAKE}{mistake.name}.\n  Where to look: {mistake.hint}"


def cases_of(exercise: Exercise) -> Sequence[Case]:
    """The exercise's cases, drawn from its own stable seed (the same list every call; some seed
    torch to build their modules, so they take the trusted turn)."""
    with TRUSTED_TURN, plain_torch_settings():
        return exercise.cases(np.random.default_rng(seed_for(exercise.name)))


def run_case(exercise: Exercise, case: Case, impl) -> tuple:
    """Run one case on the student's implementation -> an outcome the judge can read:
    ("value", output) | ("missing",) | ("notimpl", where) | ("forbidden", why) | ("error", type, message, site),
    where `where` is the qualified name of the function that raised NotImplementedError and `site` the line of
    the notebook's own code a crash came from ('' when none of it is on the traceback).
    This is the only part that runs student code; in the grader it runs inside the sandbox."""
    if impl is None:
        return ("missing",)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), plain_torch_settings():
            warnings.simplefilter("ignore")
            return ("value", _run_student(exercise, case, impl))
    except _StudentRaised as err:  # read inside the case (_read_run)
        return ("notimpl", err.raised_in) if err.notimpl else ("error", err.name, err.message, err.site)
    except ForbiddenCall as err:
        return ("forbidden", str(err))
    except NotImplementedError as err:
        if _a_stub_raised(err):
            return ("notimpl", _raised_in(err))
        return ("error", type(err).__name__, str(err)[:2000], crash_site(err))
    except Exception as err:  # noqa: BLE001 - any crash is reported to the student
        return ("error", type(err).__name__, str(err)[:2000], crash_site(err))


@contextlib.contextmanager
def plain_torch_settings():
    """PyTorch's process-wide settings as the reference ran with them, for one case: gradients on, inference
    mode and anomaly detection off, float32 as the default dtype, the CPU as the default device, float32 matrix
    products at full precision. An honest notebook may change them in a cell
    of its own (torch.set_default_dtype(torch.float64) built the hidden modules in float64 and left 8 of
    notebook 05's 29 points); the student's settings come back afterwards."""
    torch = sys.modules.get("torch")
    if torch is None:  # nothing of PyTorch's was imported, so nothing was changed
        yield
        return
    dtype, anomaly = torch.get_default_dtype(), torch.is_anomaly_enabled()
    anomaly_checks_nan = torch.is_anomaly_check_nan_enabled()
    precision = torch.get_float32_matmul_precision()
    device = torch.get_default_device()
    torch.set_default_dtype(torch.float32)
    torch.set_anomaly_enabled(False)
    torch.set_float32_matmul_precision("highest")  # "high"/"medium" let a GPU round float32 products as TF32
    if device.type != "cpu":  # torch.set_default_device("cuda") on Colab built the hidden modules beside CPU inputs
        torch.set_default_device(None)
    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        torch.set_default_dtype(dtype)
        torch.set_anomaly_enabled(anomaly, anomaly_checks_nan)
        torch.set_float32_matmul_precision(precision)
        if device.type != "cpu":
            torch.set_default_device(device)


def _in_a_cell(filename: str) -> bool:
    """Whether code came from a notebook cell: IPython's name for a cell (the grader's runner), or ipykernel's
    file of one (a check the student runs in Jupyter)."""
    return filename.startswith("<ipython-input-") or os.path.basename(os.path.dirname(filename)).startswith("ipykernel_")


def crash_site(err: BaseException) -> str:
    """Where in the notebook's own code `err` was raised: the deepest frame of a cell's code, as "`function`, line
    N of its cell: the line" ('' when no cell's code is on the traceback). A crash in make_masks, called by the
    student's greedy_decode, was told as greedy_decode's alone."""
    import linecache

    tb, found = err.__traceback__, None
    while tb is not None:
        if _in_a_cell(tb.tb_frame.f_code.co_filename):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    name = str(getattr(code, "co_qualname", code.co_name))
    text = " ".join(linecache.getline(code.co_filename, found.tb_lineno).split())
    where = f"line {found.tb_lineno} of a cell" if name == "<module>" else f"`{name}`, line {found.tb_lineno} of its cell"
    return (where + (f": {text[:200]}" if text else ""))[:300]


def crash_site_of(outcome) -> str:
    """The site an ("error", ...) outcome names, as one line ('' when absent). Sent by the sandbox: it only
    shapes the student's message about their own code, and never earns a point."""
    site = outcome[3] if isinstance(outcome, tuple) and len(outcome) > 3 else ""
    return " ".join(site.split())[:300] if isinstance(site, str) else ""


def _a_stub_raised(err: BaseException) -> bool:
    """Whether `err` is a NotImplementedError raised by a `raise` statement (a stub, or a part not written yet), not by
    a library: PyTorch raises one for an operation a dtype lacks (`&` of two float masks: '"bitwise_and_cpu" not
    implemented for 'Float''), and a student who had written make_masks was told it was "not attempted yet"."""
    if not isinstance(err, NotImplementedError):
        return False
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return True
    code = tb.tb_frame.f_code.co_code
    return tb.tb_lasti >= len(code) or code[tb.tb_lasti] in _RAISES


_RAISES = frozenset(dis.opmap[name] for name in ("RAISE_VARARGS", "RERAISE") if name in dis.opmap)


def _raised_in(err: BaseException) -> str:
    """The qualified name of the function whose frame raised `err` (the innermost one)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return ""
    code = tb.tb_frame.f_code
    return str(getattr(code, "co_qualname", code.co_name))[:200]


def notimpl_origin(outcome) -> str:
    """Where a ("notimpl", where) outcome says NotImplementedError came from ('' when unknown).
    Sent by the sandbox: it only shapes the student's message and never earns a point."""
    where = outcome[1] if isinstance(outcome, tuple) and len(outcome) > 1 else ""
    return where if isinstance(where, str) and where.replace(".", "").replace("_", "").isalnum() else ""


def owned_by(qualname: str, graded: str) -> bool:
    """Whether a function's qualified name belongs to the graded function or class `graded`."""
    return qualname == graded or qualname.startswith(graded + ".")


_SIZE_MISMATCH = re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\(\[([\d, ]*)\]\) "
                            r"from checkpoint, the shape in current model is torch\.Size\(\[([\d, ]*)\]\)")
_KEYS = re.compile(r"(Missing|Unexpected) key\(s\) in state_dict: ([^\n]*)")


_LARGEST_DIM = 2**48  # larger than any tensor's side; the message is the student's to write (a 400-digit shape
# overflowed the ratio below, and the grader failed on the notebook)


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.replace(" ", "").split(",") if x)


def state_dict_summary(name: str, message: str, known_cause: bool = False) -> str | None:
    """PyTorch's load_state_dict error (one line per parameter) as one or two lines a student can
    act on: which parameter, expected shape versus yours, and the likely cause. None for any
    other error message."""
    if not isinstance(message, str) or "Error(s) in loading state_dict" not in message:
        return None
    wrong = [(p, _dims(want), _dims(got)) for p, want, got in _SIZE_MISMATCH.findall(message)]
    if any(d > _LARGEST_DIM for _, want, got in wrong for d in (*want, *got)):  # no tensor's: a student's own text
        return None
    keys = {kind: [k.strip(' ".') for k in names.split(",") if k.strip(' ".')] for kind, names in _KEYS.findall(message)}
    shape = lambda dims: "[" + ", ".join(map(str, dims)) + "]"
    if wrong:
        param, want, got = wrong[0]
        others = [p for p, _, _ in wrong[1:]]
        also = f" (and {len(others)} more: {', '.join(others[:6])}{', ...' if len(others) > 6 else ''})" if others else ""
        lines = [f"{name}: the test copies weights of the right shapes into your module, and {param} has the "
                 f"wrong shape: expected {shape(want)}, yours is {shape(got)}{also}."]
        ratios = {g / w for _, want_, got_ in wrong for w, g in zip(want_, got_, strict=False) if w and g != w and len(want_) == len(got_)}
        if not known_cause and len(ratios) == 1:
            ratio = ratios.pop()
            factor = f"{ratio:g} times too {'wide' if ratio > 1 else 'narrow'}" if ratio >= 1 else \
                f"{1 / ratio:g} times too narrow"
            head_sizes = any(p.split(".")[0] in ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj_weight")
                             for p, _, _ in wrong)
            lines.append(f"  Likely cause: these layers are {factor}" + (
                " - key_dim (and value_dim) default to d_model // num_heads, so q_proj, k_proj and v_proj map "
                "d_model -> num_heads * key_dim; a key_dim left at d_model makes them num_heads times too wide."
                if head_sizes and ratio > 1 else
                ": compare the sizes your __init__ gives each nn.Linear with the specification."))
        elif not known_cause:
            lines.append("  Likely cause: compare the sizes your __init__ gives each layer with the specification.")
        return "\n".join(lines)
    missing, unexpected = keys.get("Missing", []), keys.get("Unexpected", [])
    if missing or unexpected:
        parts = []
        if unexpected:
            parts.append(f"your module has no parameter {', '.join(unexpected[:6])} (the test copies one in)")
        if missing:
            parts.append(f"it has parameters the specification does not name: {', '.join(missing[:6])}")
        head = f"{name}: the test copies weights into your module by name, and {'; '.join(parts)}."
        if known_cause:  # the catalogued mistake's own line says why
            return head
        if missing and not unexpected and all(k.endswith(".bias") for k in missing):
            return (head + "\n  Likely cause: the layers have no bias here (this case passes bias=False, or the "
                           "specification's layers have none at all, as Bahdanau's), and yours have biases anyway: "
                           "build each nn.Linear with bias=bias where your __init__ takes a bias argument, else with "
                           "bias=False.")
        return head + "\n  Likely cause: the attribute names must be exactly the ones the exercise gives."
    return None


@dataclass(frozen=True)
class Failure:
    """Why a case failed: the student's message and, as data, the catalogued mistake it matches
    ('' when none was recognised) and short expected/received summaries ('' where unknown)."""

    message: str
    mistake: str = ""
    expected: str = ""
    received: str = ""


def judge(exercise: Exercise, case: Case, outcome: tuple, expected=None) -> str | None:
    """None when the outcome is right, else the student-facing message. Runs in the trusted process."""
    found = failure_of(exercise, case, outcome, expected)
    return found.message if found else None


def failure_of(exercise: Exercise, case: Case, outcome: tuple, expected=None) -> Failure | None:
    """None when the outcome is right, else the Failure (`judge`'s message, the mistake's name and
    the summaries as fields, so nothing downstream reads them out of the text). Trusted process only."""
    name = exercise.graded
    kind = outcome[0]
    if kind == "value":  # read in this process (a notebook's own check): tensors again, as `loads` gives them
        outcome = ("value", rebuilt(outcome[1]))
    if kind == "missing":
        return Failure(f"{name}: nothing named `{name}` is defined. Run the cell that defines it (and keep its name).")
    if kind == "notimpl":
        return Failure(_not_written(name, notimpl_origin(outcome)))
    if kind == "forbidden":
        return Failure(f"{name}: not accepted, because {outcome[1]}.")
    if kind == "error":
        return _crash_failure(exercise, case, outcome)
    return _value_failure(exercise, case, outcome, expected)


def _not_written(name: str, where: str) -> str:
    """The message for a NotImplementedError, raised in `where` (a qualified name, or '')."""
    if where and not owned_by(where, name) and not where.startswith("_"):
        return (f"{name} calls `{where}`, which still raises NotImplementedError (it is not written yet): "
                f"write {where.split('.')[0]} too.")
    if where.startswith("_"):
        return (f"{name} raised NotImplementedError (in `{where}`): is a method missing, e.g. `forward`?")
    if where and where not in (name, f"{name}.__init__"):  # a class begun: __init__ written, this method not yet
        method = where[len(name) + 1:]
        return (f"{name}: not finished yet: its method `{method}` still raises NotImplementedError. "
                f"Replace the `raise NotImplementedError()` in {method} with your code.")
    return (f"{name}: not attempted yet (it still raises NotImplementedError). "
            f"Replace `raise NotImplementedError()` with your code.")


def _crash_failure(exercise: Exercise, case: Case, outcome: tuple) -> Failure:
    """An ("error", type, message) outcome: what raised, on which case, and the mistake that raises the same."""
    name = exercise.graded
    mistake = diagnose_crash(exercise, case, outcome[1], outcome[2])
    try:  # a summary of the student's message: never the reason the grader fails on their notebook
        summary = state_dict_summary(name, outcome[2], known_cause=mistake is not None)
    except Exception:  # noqa: BLE001 - the plain message below says what was raised
        summary = None
    head = summary if summary else f"{name} raised {outcome[1]}: {outcome[2]}"
    if outcome[1] == "StoppedEarlier":  # the runner's stand-in for an exercise that ran past its limit before
        head = f"{name}: not run again: {outcome[2]}"
    site = crash_site_of(outcome)
    where = f"\n  raised at: {site}" if site else ""
    hint = IN_PLACE_HINT if mistake is None and "in-place operation" in outcome[2] else ""
    return Failure(f"{head}{where}\n  on: {case.description}" + _explain(mistake) + hint, mistake.name if mistake else "")


# PyTorch's words for a tensor that autograd needs, changed in place ("a leaf Variable that requires grad is being used in
# an in-place operation", "... has been modified by an inplace operation" is the other spelling, said later)
IN_PLACE_HINT = ("\n  Likely cause: a tensor you were given, changed in place (q.div_(...), q /= ..., masked_fill_(...)): "
                 "autograd needs it as it was, and so does the caller. Make a new tensor instead (q = q / "
                 "math.sqrt(d_k)); wrapping the line in torch.no_grad() or .detach() hides this error but still "
                 "changes the caller's tensor.")


def _value_failure(exercise: Exercise, case: Case, outcome: tuple, expected) -> Failure | None:
    """A ("value", output) outcome compared with the reference's (`expected`, as the case returned
    it: trusted.expected caches exactly that); both sides go through the case's `derive` here."""
    name = exercise.graded
    if expected is None:
        expected = trusted_run(case, case_reference(exercise, case))
    want, got = derived(case, expected), derived(case, outcome[1])
    if isinstance(want, Unreadable):
        return Failure(f"{name}: the grader could not read the reference's result on: {case.description} "
                       f"(a course bug: tell your instructor): {want}")
    problem = (Difference(str(got)) if isinstance(got, Told)
               else Difference(f"output: could not be read ({got})") if isinstance(got, Unreadable)
               else difference(want, got, *tolerances(exercise, case)))
    if not problem:
        return None
    mistake = diagnose(exercise, case, outcome[1])
    return Failure(f"{name} gave a wrong result on: {case.description}" + _explain(mistake) + f"\n  {problem.message}",
                   mistake.name if mistake else "", problem.expected, problem.received)


def check_exercise(exercise: Exercise, impl) -> None:
    """Run every case; raise CheckFailed with a student-facing message on the first mismatch.

    Returns None on purpose: a number left as a test cell's last value would be read by
    nbgrader as a partial-credit score.
    """
    for case in cases_of(exercise):
        message = judge(exercise, case, run_case(exercise, case, impl))
        if message:
            raise CheckFailed(message)


def make_checker(exercises: Sequence[Exercise]) -> Callable[[str, Any], None]:
    """`check(name, impl)` for a notebook's hidden tests."""
    by_name = {ex.name: ex for ex in exercises}

    def check(name: str, impl) -> None:
        if name not in by_name:
            raise KeyError(f"no check named {name!r}; known: {sorted(by_name)}")
        check_exercise(by_name[name], impl)

    check.exercises = by_name  # type: ignore[attr-defined]
    return check
