"""Move values out of the sandbox without trusting it: JSON for structure, an .npz of plain
arrays (loaded with allow_pickle=False) for numbers. Never pickle: unpickling sandbox output
would run the student's code in the grader."""
from __future__ import annotations

import io
import json
import math
import zipfile
from typing import Any

import numpy as np

from .syntax_trees import in_turn

MAX_ARRAYS = 4096  # arrays in one blob (plus the '__json__' member)
MAX_ELEMENTS = 50_000_000  # elements in one array
MAX_BLOB_BYTES = 256 * 1024 * 1024  # one blob, and the declared size of all its members together
MAX_JSON_DEPTH = 100  # nesting of '__json__'; encode never goes past 64 (20 levels x 3 + 4)


def encode(value: Any) -> tuple[str, dict[str, np.ndarray]]:
    """(JSON text, arrays) for nested tuples/lists/dicts of arrays, tensors, numbers, strings."""
    arrays: dict[str, np.ndarray] = {}

    def walk(v, depth=0):
        if depth > 20:
            return {"__unsupported__": "nested too deeply"}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)):
            return {"__int__": str(int(v))}
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return {"__float__": repr(f)} if not math.isfinite(f) else f
        if isinstance(v, (tuple, list)):
            return {"__seq__": type(v).__name__, "items": [walk(x, depth + 1) for x in v]}
        if isinstance(v, dict):
            return {"__dict__": [[str(k), walk(x, depth + 1)] for k, x in v.items()]}
        if isinstance(v, np.ndarray) or _is_tensor(v):
            if len(arrays) >= MAX_ARRAYS:
                return {"__unsupported__": "too many arrays"}
            key = f"a{len(arrays)}"
            if _is_tensor(v):
                dtype = str(v.dtype)
                t = v.detach().cpu()
                if t.dtype.is_floating_point and t.dtype not in _NUMPY_FLOATS():
                    t = t.float()
                arr = t.numpy()
                tag = {"__tensor__": key, "dtype": dtype, "requires_grad": bool(v.requires_grad)}
            else:
                arr, tag = v, {"__array__": key}
            # object and structured dtypes would need a pickle (or .npy format 3): loads refuses both
            if arr.dtype.hasobject or arr.dtype.names is not None or arr.size > MAX_ELEMENTS:
                return {"__unsupported__": f"array of dtype {arr.dtype} and size {arr.size}"}
            arrays[key] = np.array(arr, order="C", copy=True)  # keeps 0-d arrays 0-d (ascontiguousarray does not)
            return tag
        return {"__unsupported__": type(v).__name__}

    return json.dumps(walk(value)), arrays


def _is_tensor(v) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "detach") and hasattr(v, "dtype")


def _NUMPY_FLOATS():
    import torch

    return (torch.float16, torch.float32, torch.float64)


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
            return arrays[node["__array__"]]
        if "__tensor__" in node:
            import torch

            t = torch.from_numpy(arrays[node["__tensor__"]].copy())
            dtype = getattr(torch, node["dtype"].replace("torch.", ""), None)
            return t.to(dtype) if isinstance(dtype, torch.dtype) else t
        return Unsupported(node.get("__unsupported__", "?"))

    try:
        return build(structure)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise UnsafeBlob(f"the sandbox's results are malformed ({type(err).__name__}: {err})") from err


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
