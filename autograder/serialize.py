"""Move values out of the sandbox without trusting it: JSON for structure, an .npz of plain
arrays (loaded with allow_pickle=False) for numbers. Never pickle: unpickling sandbox output
would run the student's code in the grader."""
from __future__ import annotations

import io
import json
import math
import sys
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from .syntax_trees import in_turn

MAX_ARRAYS = 4096  # arrays in one blob (plus the '__json__' member)
MAX_ELEMENTS = 50_000_000  # elements in one array
MAX_BLOB_BYTES = 256 * 1024 * 1024  # one blob, and the declared size of all its members together
MAX_JSON_DEPTH = 100  # nesting of '__json__'; encode never goes past 64 (20 levels x 3 + 4)


MAX_DEPTH = 20  # levels of nested tuples, lists and dicts in one value


@dataclass(frozen=True)
class TensorValue:
    """A tensor, read by `plain`: the grader's own copy (exact torch.Tensor, on the CPU, float16/32/64 where it
    was another floating type), the tensor's dtype and whether it required gradients. Its numbers become an
    array only in `encode`, with PyTorch's Python hooks off (`Tensor.numpy` is an exercise's forbidden call)."""
    tensor: Any
    dtype: str
    requires_grad: bool

    def array(self) -> np.ndarray:
        import torch

        with torch._C.DisableTorchFunction():  # a notebook's TorchFunctionMode left on is not asked
            return np.array(self.tensor.numpy(), copy=True)


_NUMPY_SCALARS = frozenset(np.sctypeDict.values())  # numpy's own scalar types: no student code in them


def _is_numpy_scalar(v) -> bool:
    kind = type(v)
    return any(kind is t for t in _NUMPY_SCALARS)  # by identity: a student's metaclass is never asked to hash


def type_name(kind: type) -> str:
    """A class's name, read from the type itself (a metaclass's own `__name__` is never asked)."""
    return type.__dict__["__name__"].__get__(kind)


def plain(value: Any, depth: int = 0) -> Any:
    """`value` as the grader's own exact types: None, bool, int, float, str, numpy's scalars, tuple, list, dict
    (str keys), ndarray (a copy), TensorValue, Unsupported. It runs none of the student's code: types are
    compared by identity, subclasses read through their base class's own accessors, and tensors with PyTorch's
    Python hooks off, so nothing of the student's runs after the case's own scopes have ended (a result that
    computed itself when read ran PyTorch's label smoothing, fused attention or softmax unwatched, and a
    `requires_grad` property filled a tensor after the memory was measured). `encode` accepts only these types."""
    if depth > MAX_DEPTH:
        return Unsupported("nested too deeply")
    kind = type(value)
    if _is_numpy_scalar(value):  # numpy's string scalars as strings, as before (vocab[np.argmax(p)])
        return str.__str__(value) if issubclass(kind, str) else value
    if value is None or kind is bool or kind is int or kind is float or kind is str or kind is TensorValue \
            or kind is Unsupported:
        return value
    if issubclass(kind, int) and not issubclass(kind, bool):  # a subclass: its number (int.__int__ runs no override)
        return int.__int__(value)
    if issubclass(kind, float):
        return float.__float__(value)
    if issubclass(kind, str):
        return str.__str__(value)
    if issubclass(kind, tuple):
        return tuple(plain(x, depth + 1) for x in tuple.__iter__(value))
    if issubclass(kind, list):
        return [plain(x, depth + 1) for x in list.__iter__(value)]
    if issubclass(kind, dict):
        return {_plain_key(k): plain(x, depth + 1) for k, x in dict.items(value)}
    if issubclass(kind, np.ndarray):  # a subclass is read as the array it is, never through its own properties
        return np.array(np.ndarray.view(value, np.ndarray), copy=True)
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(kind, torch.Tensor):
        return _tensor_value(torch, value)
    return Unsupported(type_name(kind))


def _plain_key(key) -> str:
    """A dict key as a string, from its plain value (str() of the student's own key would run its __str__)."""
    return key if type(key) is str else str(plain(key, MAX_DEPTH - 2))


def _tensor_value(torch, value) -> TensorValue | Unsupported:
    """A tensor (a subclass too) read by PyTorch's own accessors with its Python hooks off: no __torch_function__,
    no __torch_dispatch__, no property of the student's runs. A sparse or quantized tensor is read as its values,
    complex32 as complex64; one with no values to read (meta, nested) is sent as unsupported, named, so the
    exercise fails with what came back instead of the whole run ending in the runner."""
    base = torch._C.TensorBase
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        try:
            requires_grad = bool(base.requires_grad.__get__(value))
            t = base.detach(value)
            dtype = str(base.dtype.__get__(t))
            unreadable = _no_values(torch, t)
            if unreadable:
                return Unsupported(unreadable)
            t = base.clone(t)
            if type(t) is not torch.Tensor:
                t = base.as_subclass(t, torch.Tensor)
            t = _strided_values(torch, base.cpu(t))
        except Exception as err:  # noqa: BLE001 - a tensor PyTorch itself cannot copy: named, never a crash
            return Unsupported(f"a tensor that could not be read ({type_name(type(err))}: {str(err)[:200]})")
    return TensorValue(t, dtype, requires_grad)


def _no_values(torch, t) -> str:
    """Why tensor `t` has no values to send ('' when it has)."""
    if t.is_meta:
        return f"a tensor on the meta device ({dtype_text(t)}, shape {tuple(t.shape)}): it holds no values"
    if t.is_nested:
        return "a nested tensor (rows of different lengths): return a padded tensor instead"
    return ""


def dtype_text(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _strided_values(torch, t):
    """`t` as an ordinary dense tensor numpy can hold: sparse made dense, quantized dequantized, complex32 widened,
    other floating types as float32."""
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.is_quantized:
        t = t.dequantize()
    if t.dtype == torch.complex32:
        t = t.to(torch.complex64)
    if t.dtype.is_floating_point and t.dtype not in (torch.float16, torch.float32, torch.float64):
        t = t.float()
    return t


def rebuilt(value: Any) -> Any:
    """`plain`'s result with tensors again (TensorValue -> torch.Tensor): what `loads` gives the judge, for a
    check run in the same process (a notebook's own check cell)."""
    if isinstance(value, TensorValue):
        return _tensor(value.array(), value.dtype)
    if type(value) is tuple:
        return tuple(rebuilt(x) for x in value)
    if type(value) is list:
        return [rebuilt(x) for x in value]
    if type(value) is dict:
        return {k: rebuilt(x) for k, x in value.items()}
    return value


def _tensor(array: np.ndarray, dtype: str):
    import torch

    t = torch.from_numpy(array.copy())
    kind = getattr(torch, dtype.replace("torch.", ""), None)
    if not isinstance(kind, torch.dtype):
        return t
    try:
        return t.to(kind)
    except (RuntimeError, TypeError):  # a quantized result stays its dequantized values
        return t


def encode(value: Any) -> tuple[str, dict[str, np.ndarray]]:
    """(JSON text, arrays) for `plain`'s types only: anything else is sent as unsupported, never read (a
    student's object here would run its code after the case's guard has ended)."""
    arrays: dict[str, np.ndarray] = {}

    def walk(v, depth=0):
        if depth > MAX_DEPTH:
            return {"__unsupported__": "nested too deeply"}
        kind = type(v)
        if v is None or kind is bool or kind is str:
            return v
        if kind is int or (_is_numpy_scalar(v) and isinstance(v, np.integer)):
            return {"__int__": str(int(v))}
        if kind is float or (_is_numpy_scalar(v) and isinstance(v, np.floating)):
            f = float(v)
            return {"__float__": repr(f)} if not math.isfinite(f) else f
        if kind is tuple or kind is list:
            return {"__seq__": kind.__name__, "items": [walk(x, depth + 1) for x in v]}
        if kind is dict:
            return {"__dict__": [[k if type(k) is str else "?", walk(x, depth + 1)] for k, x in v.items()]}
        if kind is Unsupported:
            return {"__unsupported__": v.what}
        if kind is np.ndarray or kind is TensorValue:
            if len(arrays) >= MAX_ARRAYS:
                return {"__unsupported__": "too many arrays"}
            key = f"a{len(arrays)}"
            if kind is TensorValue:
                try:
                    arr = v.array()
                except Exception as err:  # noqa: BLE001 - named for the student, never the end of the run
                    return {"__unsupported__": f"a {v.dtype} tensor numpy cannot hold ({type_name(type(err))})"}
                tag = {"__tensor__": key, "dtype": v.dtype, "requires_grad": v.requires_grad}
            else:
                arr, tag = v, {"__array__": key}
            # object and structured dtypes would need a pickle (or .npy format 3): loads refuses both
            if arr.dtype.hasobject or arr.dtype.names is not None or arr.size > MAX_ELEMENTS:
                return {"__unsupported__": f"array of dtype {arr.dtype} and size {arr.size}"}
            arrays[key] = np.array(arr, order="C", copy=True)  # keeps 0-d arrays 0-d (ascontiguousarray does not)
            return tag
        return {"__unsupported__": type_name(kind)}

    return json.dumps(walk(value)), arrays


def dumps(value: Any) -> bytes:
    """One self-contained blob: an .npz whose '__json__' entry holds the structure."""
    text, arrays = encode(value)
    buf = io.BytesIO()
    np.savez(buf, __json__=np.frombuffer(text.encode(), dtype=np.uint8), **arrays)
    return buf.getvalue()


class UnsafeBlob(ValueError):
    """A blob from the sandbox that dumps could not have written; refused before it is unpacked."""


class BlobTooLarge(UnsafeBlob):
    """A blob, or something inside it, past the limits above; refused before it is unpacked."""


def loads(blob: bytes, max_bytes: int = MAX_BLOB_BYTES) -> Any:
    """Inverse of dumps, for untrusted input: no pickle, unknown types become Unsupported.

    Bounded: the zip's directory and every array's header are checked before anything is read,
    so that a small hostile blob cannot make the trusted grader allocate gigabytes."""
    # Imported here, not at the top: this file is copied into the sandbox's kit (sandbox.KIT_FILES),
    # limits.py is not, and only loads (run by the grader, never in the sandbox) needs it.
    from .limits import json_depth

    arrays = _read_arrays(blob, max_bytes)
    text = arrays.pop("__json__", None)
    if text is None:
        raise UnsafeBlob("the sandbox's results have no '__json__' member")
    text = text.tobytes()
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise BlobTooLarge(f"the sandbox's results nest {depth:,} levels deep (limit {MAX_JSON_DEPTH})")
    structure = json.loads(text.decode())
    used: set[str] = set()

    def array(key: str) -> np.ndarray:
        # dumps names each array once: a blob that names one again would have the grader copy it for every
        # reference (a 7.6 MiB frame naming one array 2,000 times was 16 GB in the grader's memory)
        if key in used:
            raise UnsafeBlob(f"the sandbox's results name the array {key!r} more than once (dumps names each once)")
        used.add(key)
        return arrays[key]

    def build(node):
        if node is None or isinstance(node, (bool, str, float)):
            return node
        if isinstance(node, int):
            return node
        if isinstance(node, list):
            return [build(x) for x in node]
        if "__int__" in node:
            return int(node["__int__"])
        if "__float__" in node:
            return float(node["__float__"])
        if "__seq__" in node:
            items = [build(x) for x in node["items"]]
            return tuple(items) if node["__seq__"] == "tuple" else items
        if "__dict__" in node:
            return {k: build(v) for k, v in node["__dict__"]}
        if "__array__" in node:
            return array(node["__array__"])
        if "__tensor__" in node:
            return _tensor(array(node["__tensor__"]), node["dtype"])
        return Unsupported(node.get("__unsupported__", "?"))

    try:
        value = build(structure)
    except UnsafeBlob:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise UnsafeBlob(f"the sandbox's results are malformed ({type(err).__name__}: {err})") from err
    if unread := sorted(set(arrays) - used):
        raise UnsafeBlob(f"the sandbox's results hold arrays nothing names ({', '.join(unread[:3])}): dumps writes none")
    return value


def _read_arrays(blob: bytes, max_bytes: int) -> dict[str, np.ndarray]:
    """Every array in an .npz blob, by name, each checked (header, size, dtype) before it is read."""
    from .limits import zip_directory_problem

    if len(blob) > max_bytes:
        raise BlobTooLarge(f"the sandbox's results are {len(blob):,} bytes (limit {max_bytes:,})")
    problem = zip_directory_problem(blob, MAX_ARRAYS + 1)
    if problem:
        raise BlobTooLarge(f"the sandbox's results were refused: {problem}")
    try:
        return _read_members(zipfile.ZipFile(io.BytesIO(blob)), max_bytes)
    except zipfile.BadZipFile as err:
        raise UnsafeBlob(f"the sandbox's results are not a readable .npz ({err})") from err


def _read_members(zf: zipfile.ZipFile, max_bytes: int) -> dict[str, np.ndarray]:
    """The arrays of an open .npz, read (as np.load would, without pickle) once all are checked."""
    with zf:
        infos = zf.infolist()
        _check_members(infos, max_bytes)
        arrays = {}
        for info in infos:
            count = in_turn(_declared_count, zf, info)  # numpy parses each header as Python
            array = in_turn(_read_array, zf, info)
            if array.size != count:
                raise UnsafeBlob(f"member {info.filename!r} changed while it was read")
            arrays[info.filename.removesuffix(".npy")] = array
    return arrays


def _declared_count(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    with zf.open(info) as fh:
        return _check_header(info, fh)


def _read_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    with zf.open(info) as fh:  # opened here, so that reading again starts again
        return np.lib.format.read_array(fh, allow_pickle=False)


def _check_members(infos: list[zipfile.ZipInfo], max_bytes: int) -> None:
    """Raise unless the zip holds what np.savez writes: few stored members that fit in max_bytes."""
    from .limits import overlapping_members

    if len(infos) > MAX_ARRAYS + 1:
        raise BlobTooLarge(f"the sandbox's results hold {len(infos):,} arrays (limit {MAX_ARRAYS + 1:,})")
    declared = sum(i.file_size for i in infos)
    if declared > max_bytes:
        raise BlobTooLarge(f"the sandbox's results declare {declared:,} bytes (limit {max_bytes:,})")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise UnsafeBlob(f"member {info.filename!r} of the sandbox's results is compressed, or its sizes "
                             "disagree (np.savez stores members uncompressed)")
    overlap = overlapping_members(infos)
    if overlap:
        raise UnsafeBlob(f"members {overlap[0].filename!r} and {overlap[1].filename!r} of the sandbox's "
                         "results share the same bytes")


def _check_header(info: zipfile.ZipInfo, fh) -> int:
    """The element count an .npy member declares, after checking it is a plain array whose data
    fits inside the member (so reading it allocates no more than the blob's size)."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise UnsafeBlob(f"member {info.filename!r} is .npy version {version} (np.savez writes 1.0 or 2.0)")
    if dtype.hasobject:
        raise UnsafeBlob(f"member {info.filename!r} declares dtype {dtype} (objects are never sent back)")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise BlobTooLarge(f"member {info.filename!r} declares {count:,} elements (limit {MAX_ELEMENTS:,})")
    if count * dtype.itemsize > info.file_size:
        raise BlobTooLarge(f"member {info.filename!r} declares {count * dtype.itemsize:,} bytes of data "
                           f"but holds {info.file_size:,}")
    return count


class Unsupported:
    """A value the sandbox could not send back (never equal to anything expected)."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<unsupported value: {self.what}>"
