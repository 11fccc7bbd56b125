"""Unit tests for autograder/serialize.py, the boundary for what comes back out of the sandbox.

What the module promises (its docstrings): values go out as JSON for structure plus an .npz of
plain arrays, and come back unchanged (types, dtypes, shapes); what the sandbox could not send
becomes `Unsupported`; `loads` is for untrusted input: it never unpickles, and a blob that dumps
could not have written, or that is past a limit, is refused (`UnsafeBlob`, `BlobTooLarge`)
before anything big is allocated. All blobs here are small and built in memory; nothing is slow.
"""
from __future__ import annotations

import importlib
import io
import json
import math
import pickle
import struct
import zipfile

import numpy as np
import pytest
import torch

from autograder import serialize
from autograder.checks import core
from autograder.serialize import BlobTooLarge, UnsafeBlob, Unsupported


# --------------------------------------------------------------------------- builders
def npy(header: dict, data: bytes = b"", version: tuple[int, int] = (1, 0)) -> bytes:
    """An .npy member with exactly this header (numpy's own writer) followed by `data`."""
    buf = io.BytesIO()
    if version == (1, 0):
        np.lib.format.write_array_header_1_0(buf, header)
    else:
        np.lib.format.write_array_header_2_0(buf, header)
    return buf.getvalue() + data


def u8(data: bytes) -> bytes:
    """`data` as a 1-d uint8 .npy member (how dumps stores '__json__')."""
    return npy({"shape": (len(data),), "fortran_order": False, "descr": "|u1"}, data)


def npz(members: dict[str, bytes]) -> bytes:
    """An uncompressed zip of these members, as np.savez writes one."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def blob_of(structure, **arrays: bytes) -> bytes:
    """A blob whose '__json__' is `structure` (JSON-encoded unless already bytes), plus raw members."""
    text = structure if isinstance(structure, bytes) else json.dumps(structure).encode()
    return npz({"__json__.npy": u8(text), **{f"{k}.npy": v for k, v in arrays.items()}})


def patched(blob: bytes, signature: bytes, offset: int, fmt: str, value: int) -> bytes:
    """`blob` with one field of its (last) zip record starting with `signature` overwritten."""
    out = bytearray(blob)
    at = out.rfind(signature)
    assert at >= 0
    struct.pack_into(fmt, out, at + offset, value)
    return bytes(out)


CENTRAL_HEADER, END_OF_DIRECTORY = b"PK\x01\x02", b"PK\x05\x06"
GOOD_MEMBER = npy({"shape": (2,), "fortran_order": False, "descr": "<f8"}, np.array([1.0, 2.0]).tobytes())


def test_the_builders_make_blobs_loads_accepts():
    """The hand-built blobs below differ from this one only in what each test breaks."""
    got = serialize.loads(blob_of({"__array__": "a0"}, a0=GOOD_MEMBER))
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.0]


# --------------------------------------------------------------------------- round trips
def same(got, want) -> bool:
    """Equal in value and in type, all the way down (NaN equals NaN; -0.0 is not 0.0)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return got == want and math.copysign(1, got) == math.copysign(1, want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want, strict=True))
    if isinstance(want, dict):
        return list(got) == list(want) and all(same(got[k], want[k]) for k in want)
    return got == want


def dumps(value):
    """What the sandbox sends: the result read by `plain` (inside the case's guard), then `serialize.dumps`."""
    return serialize.dumps(serialize.plain(value))

@pytest.mark.parametrize("value", [
    None, True, False, 0, 1, -1, 2**70, -2**70, 0.5, -0.0, 1e308, 5e-324, float("nan"), float("inf"), float("-inf"),
    "", "text", "ünïcödé ✓ 漢字", "\udcff lone surrogate", 'quote " and [brackets] {braces} \\ backslash',
    [], (), [1, "a", None], (1, (2, (3,))), [[], ()], {}, {"a": 1, "b": [2, (3,)]}, {"z": 1, "a": 2, "m": 3},
], ids=repr)
def test_plain_values_round_trip_with_their_types(value):
    assert same(serialize.loads(dumps(value)), value)


@pytest.mark.parametrize("value, want", [
    (np.int8(-3), -3), (np.uint64(2**64 - 1), 2**64 - 1), (np.float32(2.5), 2.5), (np.float16(-0.0), -0.0),
    (np.float64("nan"), float("nan")), ({1: "a", (1, 2): "b"}, {"1": "a", "(1, 2)": "b"}),
    (np.str_("cat"), "cat"),  # vocab[np.argmax(p)]: a string, as it always was (a review found it unsupported)
], ids=repr)
def test_numpy_scalars_become_python_numbers_and_keys_become_strings(value, want):
    assert same(serialize.loads(dumps(value)), want)


def test_non_finite_floats_are_tagged_so_the_json_is_strict():
    """NaN and infinities never appear as bare (non-standard) JSON tokens: each is tagged."""
    text, arrays = serialize.encode([float("nan"), float("inf"), -float("inf"), 1.5])
    assert arrays == {}

    def refuse(token):
        raise AssertionError(f"bare {token} in the JSON")

    assert json.loads(text, parse_constant=refuse)["items"][:3] == [{"__float__": "nan"}, {"__float__": "inf"},
                                                                    {"__float__": "-inf"}]


ARRAYS = {
    "bool": np.array([True, False, True]),
    "int8": np.arange(-3, 3, dtype=np.int8), "int16": np.arange(6, dtype=np.int16).reshape(2, 3),
    "int32": np.array([-2**31, 2**31 - 1], dtype=np.int32), "int64": np.array([-2**63, 2**63 - 1]),
    "uint8": np.array([0, 255], dtype=np.uint8), "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "float16": np.array([0.1, -65504, np.inf], dtype=np.float16), "float32": np.array([1 / 3], dtype=np.float32),
    "float64": np.array([[np.pi, -0.0], [np.nan, 5e-324]]), "complex128": np.array([1 + 2j, -1j]),
    "0-d": np.array(7.0), "empty": np.zeros((0, 3), dtype=np.int32), "3-d": np.arange(24.0).reshape(2, 3, 4),
    "fortran": np.asfortranarray(np.arange(6).reshape(2, 3)), "view": np.arange(10)[::3],
    "big-endian": np.arange(3, dtype=">i4"), "unicode": np.array(["ab", "ç"]),
    "datetime": np.array(["2026-11-20"], dtype="datetime64[D]"),
}


@pytest.mark.parametrize("name", ARRAYS)
def test_arrays_round_trip_with_dtype_shape_and_values(name):
    a = ARRAYS[name]
    got = serialize.loads(dumps(a))
    assert type(got) is np.ndarray and got.dtype == a.dtype and got.shape == a.shape
    assert np.array_equal(got, a, equal_nan=a.dtype.kind in "fc")
    if a.dtype.kind == "f":
        assert np.signbit(got).tolist() == np.signbit(a).tolist()  # -0.0 stays -0.0
    assert not np.shares_memory(got, a)


TENSORS = {
    "float16": torch.tensor([0.1, -2.5], dtype=torch.float16),
    "bfloat16": torch.tensor([1 / 3, -1e30, 7.0], dtype=torch.bfloat16),  # numpy has no bfloat16: via float32
    "float32": torch.tensor([[1 / 3, -0.0]]), "float64": torch.tensor([1 / 3], dtype=torch.float64),
    "float8": torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
    "int8": torch.tensor([-128, 127], dtype=torch.int8), "int64": torch.tensor([2**62]),
    "uint8": torch.tensor([255], dtype=torch.uint8),
    "bool": torch.tensor([True, False]), "complex64": torch.tensor([1 + 2j]),
    "0-d": torch.tensor(3), "empty": torch.zeros(0, 4), "4-d": torch.arange(24).reshape(1, 2, 3, 4),
    "transposed": torch.arange(6).reshape(2, 3).t(), "requires grad": torch.ones(2, requires_grad=True) * 2,
}


@pytest.mark.parametrize("name", TENSORS)
def test_tensors_round_trip_with_dtype_shape_and_exact_values(name):
    t = TENSORS[name]
    got = serialize.loads(dumps(t))
    assert isinstance(got, torch.Tensor) and got.dtype == t.dtype and got.shape == t.shape
    assert torch.equal(got.float() if got.dtype == torch.float8_e4m3fn else got,
                       t.detach().float() if t.dtype == torch.float8_e4m3fn else t.detach())


def test_a_nested_outcome_round_trips():
    """The shape of what runner.py sends: per check, a list of outcome tuples."""
    value = {"nb01.softmax": [("value", np.arange(3.0)), ("error", "ValueError", "bad axis"), ("missing",),
                              ("notimpl", "softmax"), ("value", (torch.ones(2, 2), {"k": [np.int64(4), None]}))],
             "#cell-errors": {"3": {"type": "NameError", "message": "name 'x' is not defined", "line": 2}}}
    got = serialize.loads(dumps(value))
    assert list(got) == list(value)
    outcomes = got["nb01.softmax"]
    assert all(type(o) is tuple for o in outcomes) and [o[0] for o in outcomes] == [o[0] for o in value["nb01.softmax"]]
    assert np.array_equal(outcomes[0][1], np.arange(3.0)) and outcomes[1:4] == value["nb01.softmax"][1:4]
    tensor, inner = outcomes[4][1]
    assert torch.equal(tensor, torch.ones(2, 2)) and inner == {"k": [4, None]}
    assert got["#cell-errors"] == value["#cell-errors"]


# --------------------------------------------------------------------------- what cannot be sent
def deep(levels: int):
    value: object = "bottom"
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("value, what", [
    ({1, 2}, "set"), (b"bytes", "bytes"), (object(), "object"), (lambda: 0, "function"),
    (np.array([{}, 1], dtype=object), "array of dtype object and size 2"),
], ids=["set", "bytes", "object", "function", "object array"])
def test_what_cannot_be_sent_becomes_unsupported_named_and_equal_to_nothing(value, what):
    got = serialize.loads(dumps({"k": value}))["k"]
    assert isinstance(got, Unsupported) and got.what == what and what in repr(got)
    assert not np.any(got == value) and got != Unsupported(what)


def test_nesting_past_20_levels_is_cut_off_there():
    got = serialize.loads(dumps(deep(25)))
    for _ in range(21):
        assert isinstance(got, list)
        got = got[0]
    assert isinstance(got, Unsupported) and got.what == "nested too deeply"
    assert serialize.loads(dumps(deep(20))) == deep(20)


def test_array_limits_apply_when_encoding(monkeypatch):
    """Past MAX_ARRAYS arrays, or MAX_ELEMENTS elements, a value becomes Unsupported (not an error)."""
    with monkeypatch.context() as m:
        m.setattr(serialize, "MAX_ARRAYS", 3)
        m.setattr(serialize, "MAX_ELEMENTS", 10)
        blob = dumps([np.zeros(10), torch.zeros(2), np.zeros(11), np.zeros(1), np.zeros(1)])
    got = serialize.loads(blob)
    assert [type(x) for x in got] == [np.ndarray, torch.Tensor, Unsupported, np.ndarray, Unsupported]
    assert got[2].what == "array of dtype float64 and size 11" and got[4].what == "too many arrays"


# --------------------------------------------------------------------------- hostile blobs: not a blob
@pytest.mark.parametrize("blob", [b"", b"PK", b"\x93NUMPY\x01\x00", b"{}", b"x" * 1000, pickle.dumps({"a": 1})],
                         ids=["empty", "zip magic only", "npy magic only", "json", "junk", "pickle"])
def test_what_is_not_an_npz_is_refused(blob):
    with pytest.raises(UnsafeBlob, match=r"not a readable \.npz"):
        serialize.loads(blob)


def test_every_truncation_of_a_real_blob_is_refused():
    blob = dumps({"x": np.arange(5), "t": torch.ones(2)})
    for n in range(len(blob)):
        with pytest.raises(UnsafeBlob, match=r"not a readable \.npz"):
            serialize.loads(blob[:n])


def test_a_flipped_byte_in_an_array_is_caught_by_the_zip_checksum():
    blob = dumps(np.arange(5))
    at = blob.find(np.arange(5).tobytes())
    with pytest.raises(UnsafeBlob, match="Bad CRC-32 for file 'a0.npy'"):
        serialize.loads(blob[:at] + b"\x01" + blob[at + 1:])


def test_a_blob_without_structure_is_refused():
    with pytest.raises(UnsafeBlob, match="no '__json__' member"):
        serialize.loads(npz({"a0.npy": GOOD_MEMBER}))


# --------------------------------------------------------------------------- hostile blobs: headers
def test_an_npy_version_dumps_never_writes_is_refused():
    member = bytearray(GOOD_MEMBER)
    member[6:8] = b"\x03\x00"  # the version bytes after the magic string
    with pytest.raises(UnsafeBlob, match=r"member 'a0.npy' is \.npy version \(3, 0\)"):
        serialize.loads(blob_of({"__array__": "a0"}, a0=bytes(member)))


def test_a_wrong_npy_magic_string_is_refused_before_reading():
    """numpy's own header check; a ValueError (UnsafeBlob is one too) that names the problem."""
    member = b"\x93NUMPX" + GOOD_MEMBER[6:]
    with pytest.raises(ValueError, match="magic string is not correct"):
        serialize.loads(blob_of({"__array__": "a0"}, a0=member))


def test_version_2_headers_are_read():
    member = npy({"shape": (2,), "fortran_order": False, "descr": "<f8"}, np.array([1.0, 2.0]).tobytes(), (2, 0))
    assert serialize.loads(blob_of({"__array__": "a0"}, a0=member)).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("header, data, words", [
    # Zero-byte elements: only the element count can catch it (the data fits, in 0 bytes).
    ({"shape": (10**12,), "fortran_order": False, "descr": "|V0"}, b"",
     "member 'a0.npy' declares 1,000,000,000,000 elements (limit 50,000,000)"),
    ({"shape": (10**6, 10**6), "fortran_order": False, "descr": "<f8"}, bytes(16),
     "member 'a0.npy' declares 1,000,000,000,000 elements"),
    ({"shape": (serialize.MAX_ELEMENTS + 1,), "fortran_order": False, "descr": "|V0"}, b"",
     "declares 50,000,001 elements (limit 50,000,000)"),
    # Within the element limit, but more data than the member holds: reading would allocate it.
    ({"shape": (1000,), "fortran_order": False, "descr": "<f8"}, bytes(16),
     "member 'a0.npy' declares 8,000 bytes of data but holds"),
    ({"shape": (100, 50), "fortran_order": True, "descr": "<i4"}, bytes(4), "declares 20,000 bytes of data but holds"),
], ids=["count of empty elements", "count of a 2-d array", "one past the limit", "data past the member",
        "fortran data past the member"])
def test_a_header_claiming_a_huge_array_is_refused_before_it_is_read(header, data, words):
    with pytest.raises(BlobTooLarge, match=words.replace("(", r"\(").replace(")", r"\)")):
        serialize.loads(blob_of({"__array__": "a0"}, a0=npy(header, data)))


def test_the_element_limit_itself_is_allowed():
    member = npy({"shape": (serialize.MAX_ELEMENTS,), "fortran_order": False, "descr": "|V0"})
    assert serialize.loads(blob_of({"__array__": "a0"}, a0=member)).shape == (serialize.MAX_ELEMENTS,)


def test_a_zip_directory_claiming_more_members_than_allowed_is_refused_before_it_is_listed():
    blob = dumps(np.zeros(2))
    for offset in (8, 10):  # entries on this disk, entries in all
        blob = patched(blob, END_OF_DIRECTORY, offset, "<H", 5000)
    with pytest.raises(BlobTooLarge, match=r"it lists 5,000 members \(limit 4,097\)"):
        serialize.loads(blob)


def test_members_declaring_more_than_max_bytes_are_refused_before_reading():
    blob = patched(dumps(np.zeros(2)), CENTRAL_HEADER, 24, "<I", 2**31)  # a0.npy's uncompressed size
    with pytest.raises(BlobTooLarge, match=f"declare [0-9,]+ bytes \\(limit {serialize.MAX_BLOB_BYTES:,}\\)"):
        serialize.loads(blob)


def test_a_member_whose_sizes_disagree_is_refused():
    blob = dumps(np.zeros(2))
    at = blob.rfind(CENTRAL_HEADER)
    size = struct.unpack_from("<I", blob, at + 24)[0]
    with pytest.raises(UnsafeBlob, match="member 'a0.npy' .* is compressed, or its sizes disagree"):
        serialize.loads(patched(blob, CENTRAL_HEADER, 24, "<I", size + 1))


def test_a_blob_past_max_bytes_is_refused_unread():
    blob = dumps(np.zeros(100))
    with pytest.raises(BlobTooLarge, match=f"are {len(blob):,} bytes \\(limit 100\\)"):
        serialize.loads(blob, max_bytes=100)


# --------------------------------------------------------------------------- hostile blobs: structure
def test_json_nesting_is_bounded_before_it_is_parsed():
    at_limit = b"[" * serialize.MAX_JSON_DEPTH + b"]" * serialize.MAX_JSON_DEPTH
    assert serialize.loads(blob_of(at_limit)) is not None
    past = b"[" * (serialize.MAX_JSON_DEPTH + 1) + b"]" * (serialize.MAX_JSON_DEPTH + 1)
    with pytest.raises(BlobTooLarge, match=r"nest 101 levels deep \(limit 100\)"):
        serialize.loads(blob_of(past))
    with pytest.raises(BlobTooLarge, match=r"nest 100,000 levels deep"):
        serialize.loads(blob_of(b"{\"a\":" * 100_000))  # not even valid JSON: refused before it is parsed


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = "[" * 500 + '\\"{'
    assert serialize.loads(blob_of(json.dumps([text]).encode())) == [text]


@pytest.mark.parametrize("structure, what", [
    ({"__pickle__": "gASVCAAAAAAAAACMAW6ULg=="}, "?"), ({"__module__": "os", "__call__": "system"}, "?"),
    ({"__unsupported__": "generator"}, "generator"), ({}, "?"),
], ids=["pickle tag", "call tag", "unsupported tag", "empty object"])
def test_unknown_type_tags_become_unsupported(structure, what):
    got = serialize.loads(blob_of({"__dict__": [["k", structure]]}))["k"]
    assert isinstance(got, Unsupported) and got.what == what


def test_an_array_named_twice_is_refused_before_a_copy_is_made(monkeypatch):
    """A red team's frame named one 8 MiB array 2,000 times as a tensor: each reference was copied (16 GB in the
    grader's memory, which the kernel killed, and the class with it). dumps names each array once."""
    copies = []
    monkeypatch.setattr(serialize, "_tensor", lambda array, dtype: copies.append(array) or array)
    many = {"__seq__": "list", "items": [{"__tensor__": "a0", "dtype": "float32"}] * 2000}
    with pytest.raises(UnsafeBlob, match="name the array 'a0' more than once"):
        serialize.loads(blob_of(many, a0=GOOD_MEMBER))
    assert len(copies) == 1
    with pytest.raises(UnsafeBlob, match="more than once"):
        serialize.loads(blob_of([{"__array__": "a0"}, {"__tensor__": "a0", "dtype": "float32"}], a0=GOOD_MEMBER))


def test_an_array_nothing_names_is_refused():
    with pytest.raises(UnsafeBlob, match=r"arrays nothing names \(a1\)"):
        serialize.loads(blob_of([{"__array__": "a0"}], a0=GOOD_MEMBER, a1=GOOD_MEMBER))


def test_a_tensor_dtype_name_is_looked_up_never_called():
    """'dtype' names a torch attribute; anything that is not a torch.dtype (torch.load, ...) is ignored."""
    for name in ("torch.load", "save", "__class__", "torch.float64"):
        got = serialize.loads(blob_of({"__tensor__": "a0", "dtype": name}, a0=GOOD_MEMBER))
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64 and got.tolist() == [1.0, 2.0]


def test_a_string_that_is_not_utf8_is_refused():
    with pytest.raises(UnicodeDecodeError, match="'utf-8' codec can't decode byte 0xff"):
        serialize.loads(blob_of(b'"\xff"'))


@pytest.mark.parametrize("structure, error, words", [
    ({"__float__": "hello"}, ValueError, "could not convert string to float"),
    ({"__int__": "12x"}, ValueError, "invalid literal for int"),
    ({"__int__": "1" * 5000}, ValueError, "Exceeds the limit"),  # no quadratic-time parse of a huge number
    (b"1" * 5000, ValueError, "Exceeds the limit"),
], ids=["float", "int", "huge int", "huge bare int"])
def test_numbers_that_do_not_parse_are_refused(structure, error, words):
    with pytest.raises(error, match=words):
        serialize.loads(blob_of(structure))


def test_bare_json_numbers_and_constants_are_read_as_numbers():
    """dumps never writes them, but they are plain data: accepted, nothing else."""
    got = serialize.loads(blob_of(b"[1, -2.5, NaN, Infinity, -Infinity]"))
    assert got[:2] == [1, -2.5] and math.isnan(got[2]) and got[3:] == [math.inf, -math.inf]


MALFORMED = {
    "missing array": {"__array__": "a7"},
    "the json member as an array": {"__array__": "__json__"},
    "unhashable array key": {"__array__": ["a0"]},
    "sequence without items": {"__seq__": "list"},
    "dict entry of one": {"__dict__": [["k"]]},
    "dict of a number": {"__dict__": 5},
    "list as a dict key": {"__dict__": [[["k"], 1]]},
    "tensor without a dtype": {"__tensor__": "a0"},
    "tensor dtype of a number": {"__tensor__": "a0", "dtype": 5},
    "int of a list": {"__int__": [1]},
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_structure_raises_an_ordinary_exception(name):
    """What the trusted grader relies on (trusted._judge_run catches Exception): no crash, no hang."""
    with pytest.raises(Exception) as caught:
        serialize.loads(blob_of(MALFORMED[name], a0=GOOD_MEMBER))
    assert type(caught.value).__module__ == "builtins" or isinstance(caught.value, UnsafeBlob)


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_structure_is_refused_as_unsafe(name):
    with pytest.raises(UnsafeBlob):
        serialize.loads(blob_of(MALFORMED[name], a0=GOOD_MEMBER))


# --------------------------------------------------------------------------- pickle: never
class _CreatesFile:
    """Unpickling this calls open(path, 'x'): the file exists afterwards if anything unpickled it."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "x")


def _object_array(path) -> np.ndarray:
    a = np.empty(1, dtype=object)
    a[0] = _CreatesFile(path)
    return a


def _structured_array(path) -> np.ndarray:
    a = np.zeros(1, dtype=[("n", "<f8"), ("o", "O")])
    a[0] = (1.0, _CreatesFile(path))
    return a


def _close_files(value) -> None:
    """Close the files the control's unpickling opened (wherever they sit in the unpickled value)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            _close_files(item)
    elif hasattr(value, "close"):
        value.close()


def _refusal(load) -> Exception | None:
    """What `load()` raised (None if it returned): read only after the file has been looked for."""
    try:
        load()
    except Exception as err:  # noqa: BLE001 - any outcome is judged by the caller, after the file check
        return err
    return None


def _savez_blob(array: np.ndarray, tag: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, __json__=np.frombuffer(json.dumps(tag).encode(), dtype=np.uint8), a0=array)
    return buf.getvalue()


PICKLE_CARRIERS = {
    "object array": (_object_array, {"__array__": "a0"}, "declares dtype object"),
    "object array as a tensor": (_object_array, {"__tensor__": "a0", "dtype": "float32"}, "declares dtype object"),
    "structured array with an object field": (_structured_array, {"__array__": "a0"}, "objects are never sent back"),
}


@pytest.mark.parametrize("name", PICKLE_CARRIERS)
def test_a_pickle_inside_the_npz_is_never_unpickled(tmp_path, name):
    make, tag, words = PICKLE_CARRIERS[name]
    # The control: the same blob, read the way a careless grader would (np.load with pickles
    # allowed), runs the payload: the file appears. So the payload is live.
    control = tmp_path / "control"
    with np.load(io.BytesIO(_savez_blob(make(control), tag)), allow_pickle=True) as z:
        _close_files(z["a0"].tolist())  # reading the member unpickled it
    assert control.exists()
    target = tmp_path / "target"
    refusal = _refusal(lambda: serialize.loads(_savez_blob(make(target), tag)))
    assert not target.exists(), "serialize.loads unpickled the payload"
    assert isinstance(refusal, UnsafeBlob) and words in str(refusal)


def test_a_bare_pickle_blob_is_never_unpickled(tmp_path):
    control, target = tmp_path / "control", tmp_path / "target"
    pickle.loads(pickle.dumps(_CreatesFile(control))).close()
    assert control.exists()
    refusal = _refusal(lambda: serialize.loads(pickle.dumps(_CreatesFile(target))))
    assert not target.exists(), "serialize.loads unpickled the payload"
    assert isinstance(refusal, UnsafeBlob) and "not a readable .npz" in str(refusal)


def test_loads_never_calls_the_unpickler(monkeypatch):
    """Whatever the blob, the pickle module is not used: every way into it fails loudly here."""
    def forbidden(*args, **kwargs):
        raise AssertionError("serialize.loads unpickled something")

    for name in ("loads", "load", "Unpickler", "_loads", "_load", "_Unpickler"):
        if hasattr(pickle, name):
            monkeypatch.setattr(pickle, name, forbidden)
    blobs = [dumps({"a": np.arange(3), "t": torch.ones(1), "s": "x"}),
             _savez_blob(np.array([1, None], dtype=object), {"__array__": "a0"})]
    assert serialize.loads(blobs[0])["s"] == "x"
    with pytest.raises(UnsafeBlob):
        serialize.loads(blobs[1])


# --------------------------------------------------------------------------- dumps' output is loads' input
@pytest.mark.parametrize("value", [np.zeros(2, dtype=[("a", "<f8"), ("b", "O")]), np.zeros(2, dtype=[("名", "<f8")])],
                         ids=["object field", "non-latin-1 field name"])
@pytest.mark.filterwarnings("ignore:Stored array in format 3.0")
def test_whatever_dumps_writes_loads_reads(value):
    serialize.loads(dumps({"odd": value, "fine": 1}))


@pytest.mark.parametrize("module", ["nb01", "nb02", "nb03", "nb04", "nb05", "nb06", "nb07", "nb08"])
def test_every_reference_output_survives_the_trip_unchanged(module):
    """What the course's own implementations return on every hidden case comes back through
    serialize and still compares equal to itself: nothing a correct answer returns is Unsupported."""
    checks = importlib.import_module(f"autograder.checks.{module}")
    for name, ex in checks.check.exercises.items():
        for case in core.cases_of(ex):
            out = case.run(ex.reference)
            back = serialize.loads(dumps(("value", out)))[1]
            assert "unsupported value" not in repr(back), (name, case.description)
            difference = core.compare(core.derived(case, out), core.derived(case, back), ex.rtol, ex.atol)
            assert difference is None, (name, case.description, difference)
