"""Move values out of the sandbox without trusting it: JSON for structure, an .npz of plain
arrays (loaded with allow_pickle=False) for numbers. Never pickle: unpickling sandbox output
would run the student's code in the grader."""
from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

MAX_ARRAYS = 4096
MAX_ELEMENTS = 50_000_000


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
            if arr.dtype == object or arr.size > MAX_ELEMENTS:
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


def loads(blob: bytes) -> Any:
    """Inverse of dumps, for untrusted input: no pickle, unknown types become Unsupported."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
        structure = json.loads(bytes(npz["__json__"]).decode())
        arrays = {k: npz[k] for k in npz.files if k != "__json__"}

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

    return build(structure)


class Unsupported:
    """A value the sandbox could not send back (never equal to anything expected)."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<unsupported value: {self.what}>"
