"""The grader's bounds on untrusted input, tested with the real attacks, small on disk.

Every call that parses an attack runs in a child process under a 2 GiB address-space limit and a
60 s timeout, so that a broken limit fails the test instead of taking the machine down:
* a 100,000-deep JSON notebook (RecursionError in collect);
* a 3,000-entry zip whose directory points at one member over and over (hours in collect);
* a 3 MB .npz that inflates to 3 GiB in the trusted grader;
* a 10 MB notebook of 100,000 markdown cells (ten minutes of nbgrader);
* student folders whose names sanitise to the same id ("Zoé Li", "Zoë Li"; alice/ and alice.zip).
"""
from __future__ import annotations

import io
import json
import resource
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from autograder import serialize
from autograder.limits import json_depth
from autograder.submissions import MAX_CELLS, MAX_JSON_DEPTH, MAX_SOURCE_CHARS, MAX_STUDENT_FILES, parse_notebook

REPO = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 2 * 2**30
TIMEOUT = 60
A01, A02 = "01_similarity_attention", "02_dot_product_attention"
ASSIGNMENTS = {A01: {"softmax", "test_softmax"}, A02: {"attention", "test_attention"}}


# --------------------------------------------------------------------------- harness
def _limit_child() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _bounded(code: str, *args: str) -> dict:
    """Run `code` in a child process (2 GiB, 60 s); it prints one JSON value as its last line."""
    env = {"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=TIMEOUT, preexec_fn=_limit_child, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def collect_bounded(folder: Path) -> dict[str, dict]:
    """collect(folder) in a bounded child: {student id: {"notebooks": [...], "problems": {...}}}."""
    return _bounded("""
        import json, sys
        from pathlib import Path
        from autograder.submissions import collect
        assignments = {k: set(v) for k, v in json.loads(sys.argv[2]).items()}
        subs = collect(Path(sys.argv[1]), assignments)
        print(json.dumps({s.student_id: {"notebooks": sorted(s.notebooks), "problems": s.problems} for s in subs}))
        """, str(folder), json.dumps({k: sorted(v) for k, v in ASSIGNMENTS.items()}))


def loads_bounded(blob_path: Path) -> dict:
    """serialize.loads(blob) in a bounded child: {"error": class name, "message": ...} or {"value": repr}."""
    return _bounded("""
        import json, sys
        from autograder import serialize
        blob = open(sys.argv[1], "rb").read()
        try:
            value = serialize.loads(blob)
        except Exception as err:
            print(json.dumps({"error": type(err).__name__, "message": str(err),
                              "refused": isinstance(err, serialize.UnsafeBlob)}))
        else:
            print(json.dumps({"value": repr(value)[:200]}))
        """, str(blob_path))


# --------------------------------------------------------------------------- builders
def notebook(grade_ids: tuple[str, ...] = ("softmax",), cells: list | None = None) -> bytes:
    """A small honest notebook: one code cell per grade id."""
    cells = cells if cells is not None else [
        {"cell_type": "code", "source": f"# {g}", "metadata": {"nbgrader": {"grade_id": g}}, "outputs": [],
         "execution_count": None} for g in grade_ids]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def honest_class(root: Path) -> Path:
    """Two honest classmates (a folder and a zip) beside whatever attack a test adds."""
    (root / "alice").mkdir(parents=True)
    (root / "alice" / f"{A01}.ipynb").write_bytes(notebook())
    with zipfile.ZipFile(root / "bob.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"bob/{A01}.ipynb", notebook())
        zf.writestr(f"bob/{A02} (1).ipynb", notebook(("attention",)))
    return root


def assert_honest_classmates(found: dict[str, dict]) -> None:
    assert found["alice"] == {"notebooks": [A01], "problems": {}}
    assert found["bob"] == {"notebooks": [A01, A02], "problems": {}}


def deflate_stream(head: bytes, zeros: int, block: int = 64 << 20) -> tuple[bytes, int]:
    """(raw deflate of head + `zeros` zero bytes, its CRC-32), built without holding the zeros:
    after a full flush every block of zeros compresses to the same bytes, so one is reused."""
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    parts = [c.compress(head) + c.flush(zlib.Z_FULL_FLUSH)]
    full, rest = divmod(zeros, block)
    zero_block = bytes(block)
    one = c.compress(zero_block) + c.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(full):
        parts.append(one)
        crc = zlib.crc32(zero_block, crc)
    parts.append(c.compress(bytes(rest)) + c.flush())
    return b"".join(parts), zlib.crc32(bytes(rest), crc)


def raw_zip(members: list[tuple[str, bytes, int, int, int]], entries: list[tuple[str, int, int]] | None = None) -> bytes:
    """A zip written by hand. members: (name, stored bytes, method, crc, uncompressed size), laid out
    one after another. entries: the central directory as (member name, member index, how many
    times); by default each member once."""
    local, offsets, meta = bytearray(), [], []
    for name, data, method, crc, size in members:
        offsets.append(len(local))
        raw = name.encode()
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size, len(raw), 0)
        local += raw + data
        meta.append((raw, method, crc, len(data), size))
    entries = entries or [(m[0], i, 1) for i, m in enumerate(members)]
    central = bytearray()
    count = 0
    for _, index, times in entries:
        raw, method, crc, csize, size = meta[index]
        for _ in range(times):
            central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, csize, size,
                                   len(raw), 0, 0, 0, 0, 0, offsets[index])
            central += raw
            count += 1
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, min(count, 0xFFFF), min(count, 0xFFFF), len(central),
                      len(local), 0)
    return bytes(local + central + end)


def npy(array_header: dict, data: bytes = b"") -> bytes:
    """An .npy file with exactly this header (shape, dtype, order) and these data bytes."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, array_header)
    return buf.getvalue() + data


def stored(name: str, data: bytes) -> tuple[str, bytes, int, int, int]:
    return name, data, zipfile.ZIP_STORED, zlib.crc32(data), len(data)


JSON_MEMBER = stored("__json__.npy", npy({"shape": (2,), "fortran_order": False, "descr": "|u1"}, b"{}"))


# --------------------------------------------------------------------------- parse_notebook
def test_parse_notebook_accepts_any_object_with_a_list_of_cells():
    nb, problem = parse_notebook(notebook(("softmax",)))
    assert problem is None and nb["cells"][0]["metadata"]["nbgrader"]["grade_id"] == "softmax"
    assert parse_notebook(b'{"cells": [], "whatever": {"x": 1}}') == ({"cells": [], "whatever": {"x": 1}}, None)


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe junk", "not UTF-8"),
    (b'{"cells": [ oops', "not valid JSON"),
    (b'[1, 2]', "no list of cells"),
    (b'{"cells": {}}', "no list of cells"),
    (b"[" * 100_000 + b"]" * 100_000, f"nests JSON 100,000 levels deep (limit {MAX_JSON_DEPTH})"),
    (notebook(cells=[{"cell_type": "markdown", "source": "x"}] * (MAX_CELLS + 1)), f"(limit {MAX_CELLS:,})"),
    (notebook(cells=[{"cell_type": "code", "source": ["x" * 1000] * 2001}]), f"(limit {MAX_SOURCE_CHARS:,})"),
    (b" " * (20 * 2**20 + 1), "the file is 20.0 MiB (limit 20.0 MiB)"),
])
def test_parse_notebook_says_what_is_wrong(data, words):
    nb, problem = parse_notebook(data)
    assert nb is None and words in problem


def test_json_depth_ignores_brackets_in_strings_and_escapes():
    assert json_depth(b'{"a": "[[[[\\"[[", "b": [1, {"c": "\\\\"}]}') == 3
    assert json_depth(b'"unterminated [[[[') == 0
    assert json_depth(b"[" * 100_000) == 100_000


# --------------------------------------------------------------------------- collect: attacks beside honest classmates
def test_deep_json_notebooks_are_reported_and_the_class_is_collected(tmp_path):
    root = honest_class(tmp_path / "class")
    (root / "mallory").mkdir()
    deep = b"[" * 100_000 + b"]" * 100_000
    (root / "mallory" / "notes.ipynb").write_bytes(deep)  # unmatched name: read for its grade ids
    (root / "mallory" / f"{A01}.ipynb").write_bytes(deep)
    found = collect_bounded(root)
    assert_honest_classmates(found)
    assert found["mallory"]["notebooks"] == []
    for name in ("notes.ipynb", f"{A01}.ipynb"):
        assert "nests JSON 100,000 levels deep (limit 100): is it really a notebook?" in found["mallory"]["problems"][name]


def overlapping_zip(entries: int) -> bytes:
    """A zip whose directory lists one 19 MiB notebook of zeros (~20 KB deflated) `entries` times."""
    member = f"{A01}.ipynb"
    head = b'{"cells": [], "padding": "'
    data, crc = deflate_stream(head, 19 * 2**20)
    return raw_zip([(member, data, zipfile.ZIP_DEFLATED, crc, len(head) + 19 * 2**20)], entries=[(member, 0, entries)])


def test_overlapping_zips_are_refused_before_reading(tmp_path):
    root = honest_class(tmp_path / "class")
    (root / "mallory.zip").write_bytes(overlapping_zip(3000))  # the audit's 244 KB zip: hours of inflating
    (root / "trudy.zip").write_bytes(overlapping_zip(400))  # under the member count: caught as overlapping
    assert (root / "mallory.zip").stat().st_size < 300_000
    found = collect_bounded(root)
    assert_honest_classmates(found)
    assert found["mallory"]["notebooks"] == found["trudy"]["notebooks"] == []
    assert found["mallory"]["problems"]["mallory.zip"].startswith("zip refused: it lists 3,000 members (limit 500)")
    problem = found["trudy"]["problems"]["trudy.zip"]
    assert problem.startswith("zip refused:") and "share the same bytes" in problem


def test_zip_with_too_many_members_is_refused(tmp_path):
    root = honest_class(tmp_path / "class")
    with zipfile.ZipFile(root / "mallory.zip", "w") as zf:
        for i in range(MAX_STUDENT_FILES + 1):
            zf.writestr(f"n{i}.ipynb", b"{}")
    found = collect_bounded(root)
    assert_honest_classmates(found)
    assert f"lists {MAX_STUDENT_FILES + 1:,} members (limit {MAX_STUDENT_FILES:,})" in found["mallory"]["problems"]["mallory.zip"]


def test_zip_declaring_too_much_and_zip_bomb_members_are_refused(tmp_path):
    root = honest_class(tmp_path / "class")
    head = b'{"cells": [], "padding": "'
    data, crc = deflate_stream(head, 19 * 2**20)
    members = [(f"n{i}.ipynb", data, zipfile.ZIP_DEFLATED, crc, len(head) + 19 * 2**20) for i in range(11)]
    (root / "mallory.zip").write_bytes(raw_zip(members))  # 11 x 19 MiB declared: over 200 MiB
    (root / "trudy.zip").write_bytes(raw_zip(members[:1] + [stored(f"{A02}.ipynb", notebook(("attention",)))]))
    found = collect_bounded(root)
    assert_honest_classmates(found)
    assert "declare 209.0 MiB uncompressed (limit 200.0 MiB)" in found["mallory"]["problems"]["mallory.zip"]
    assert found["trudy"]["notebooks"] == [A02]  # the honest member of a zip is still read
    assert "(more than 200:1): not a notebook, or a zip bomb" in found["trudy"]["problems"]["n0.ipynb"]


def test_notebook_of_100000_markdown_cells_is_refused_before_nbgrader(tmp_path):
    root = honest_class(tmp_path / "class")
    (root / "mallory").mkdir()
    cells = [{"cell_type": "markdown", "metadata": {}, "source": f"cell {i} " + "x" * 60} for i in range(100_000)]
    data = notebook(cells=cells)
    assert 9e6 < len(data) < 20 * 2**20
    (root / "mallory" / f"{A01}.ipynb").write_bytes(data)
    found = collect_bounded(root)
    assert_honest_classmates(found)
    assert found["mallory"]["notebooks"] == []
    assert "has 100,000 cells (limit 2,000)" in found["mallory"]["problems"][f"{A01}.ipynb"]


# --------------------------------------------------------------------------- student ids
def test_colliding_student_ids_are_all_graded_and_reported(tmp_path):
    root = honest_class(tmp_path / "class")
    for name in ("Zoé Li", "Zoë Li"):
        (root / name).mkdir()
        (root / name / f"{A01}.ipynb").write_bytes(notebook())
    with zipfile.ZipFile(root / "alice.zip", "w") as zf:
        zf.writestr(f"{A02}.ipynb", notebook(("attention",)))
    found = collect_bounded(root)
    assert sorted(found) == ["Zoe_Li", "Zoe_Li-2", "alice", "alice-2", "bob"]
    assert found["Zoe_Li"]["notebooks"] == found["Zoe_Li-2"]["notebooks"] == [A01]
    assert found["alice"]["notebooks"] == [A01] and found["alice-2"]["notebooks"] == [A02]
    assert found["Zoe_Li"]["problems"]["Zoé Li"] == "student id 'Zoé Li' renamed to 'Zoe_Li'"
    assert "'Zoë Li'" in found["Zoe_Li"]["problems"]["Zoë Li"]
    assert found["Zoe_Li-2"]["problems"]["Zoë Li"].startswith(
        "graded as student id 'Zoe_Li-2', because 'Zoé Li' is already graded as 'Zoe_Li'")
    assert found["alice-2"]["problems"]["alice.zip"].startswith(
        "graded as student id 'alice-2', because 'alice' is already graded as 'alice'")
    assert "'alice-2'" in found["alice"]["problems"]["alice.zip"]


def test_a_suffix_never_takes_a_real_students_id(tmp_path):
    root = tmp_path / "class"
    for name in ("bob", "bob-2", "bob.zip"):
        if name.endswith(".zip"):
            root.mkdir(exist_ok=True)
            with zipfile.ZipFile(root / name, "w") as zf:
                zf.writestr(f"{A01}.ipynb", notebook())
        else:
            (root / name).mkdir(parents=True)
            (root / name / f"{A01}.ipynb").write_bytes(notebook())
    found = collect_bounded(root)
    assert sorted(found) == ["bob", "bob-2", "bob-3"]
    assert found["bob-2"]["problems"] == {}
    assert "graded as student id 'bob-3'" in found["bob-3"]["problems"]["bob.zip"]


# --------------------------------------------------------------------------- serialize.loads
def test_npz_that_inflates_to_3_gib_is_refused_before_inflating(tmp_path):
    count = 3 * 2**30
    header = npy({"shape": (count,), "fortran_order": False, "descr": "|u1"})
    data, crc = deflate_stream(header, count)
    blob = raw_zip([JSON_MEMBER, ("a0.npy", data, zipfile.ZIP_DEFLATED, crc, len(header) + count)])
    assert len(blob) < 4 * 2**20
    (tmp_path / "bomb.npz").write_bytes(blob)
    outcome = loads_bounded(tmp_path / "bomb.npz")
    assert outcome["error"] == "BlobTooLarge", outcome
    declared = len(JSON_MEMBER[1]) + len(header) + count
    assert f"declare {declared:,} bytes (limit {serialize.MAX_BLOB_BYTES:,})" in outcome["message"]


@pytest.mark.parametrize("member, words", [
    (stored("a0.npy", npy({"shape": (10**10,), "fortran_order": False, "descr": "<f8"})),
     "declares 10,000,000,000 elements (limit 50,000,000)"),
    (stored("a0.npy", npy({"shape": (40_000_000,), "fortran_order": False, "descr": "<f8"}, bytes(64))),
     "declares 320,000,000 bytes of data but holds"),
    (stored("a0.npy", npy({"shape": (2,), "fortran_order": False, "descr": "|O"}, bytes(16))), "dtype object"),
    (("a0.npy", zlib.compress(npy({"shape": (1,), "fortran_order": False, "descr": "|u1"}, b"\0"))[2:-4],
      zipfile.ZIP_DEFLATED, zlib.crc32(npy({"shape": (1,), "fortran_order": False, "descr": "|u1"}, b"\0")),
      len(npy({"shape": (1,), "fortran_order": False, "descr": "|u1"}, b"\0"))), "is compressed"),
])
def test_npz_members_are_checked_before_they_are_read(tmp_path, member, words):
    (tmp_path / "bad.npz").write_bytes(raw_zip([JSON_MEMBER, member]))
    outcome = loads_bounded(tmp_path / "bad.npz")
    assert outcome.get("refused") and words in outcome["message"], outcome


def test_npz_with_deep_json_or_too_many_members_is_refused(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "deep.npz").write_bytes(raw_zip([stored("__json__.npy", npy(
        {"shape": (len(deep),), "fortran_order": False, "descr": "|u1"}, deep))]))
    outcome = loads_bounded(tmp_path / "deep.npz")
    assert outcome["error"] == "BlobTooLarge" and "nest 100,000 levels deep (limit 100)" in outcome["message"]
    tiny = npy({"shape": (0,), "fortran_order": False, "descr": "|u1"})
    many = [JSON_MEMBER] + [stored(f"a{i}.npy", tiny) for i in range(serialize.MAX_ARRAYS + 1)]
    (tmp_path / "many.npz").write_bytes(raw_zip(many))
    outcome = loads_bounded(tmp_path / "many.npz")
    assert outcome["error"] == "BlobTooLarge" and "4,098 members (limit 4,097)" in outcome["message"]
    (tmp_path / "overlap.npz").write_bytes(raw_zip([JSON_MEMBER], entries=[("__json__.npy", 0, 2)]))
    assert "share the same bytes" in loads_bounded(tmp_path / "overlap.npz")["message"]


def test_loads_honours_max_bytes():
    blob = serialize.dumps(np.zeros(1000))
    assert serialize.loads(blob, max_bytes=len(blob)).shape == (1000,)
    with pytest.raises(serialize.BlobTooLarge, match=f"are {len(blob):,} bytes \\(limit {len(blob) - 1:,}\\)"):
        serialize.loads(blob, max_bytes=len(blob) - 1)


def test_round_trips_are_unchanged():
    torch = pytest.importorskip("torch")
    value = {"ints": [1, -2**70, np.int64(3)], "floats": (0.5, float("nan"), float("inf"), np.float32(2.5)),
             "arrays": [np.arange(6, dtype=np.int16).reshape(2, 3), np.array(7.0), np.zeros((0, 3))],
             "tensors": [torch.ones(2, dtype=torch.bfloat16, requires_grad=True), torch.tensor(3)],
             "other": [None, True, "text", object()]}
    got = serialize.loads(serialize.dumps(serialize.plain(value)))  # as the sandbox sends a result: read, then sent
    assert got["ints"] == [1, -2**70, 3] and got["floats"][0] == 0.5 and np.isnan(got["floats"][1])
    assert isinstance(got["floats"], tuple) and got["floats"][2:] == (float("inf"), 2.5)
    assert [a.dtype for a in got["arrays"]] == [np.int16, np.float64, np.float64]
    assert got["arrays"][1].shape == () and got["arrays"][2].shape == (0, 3)
    assert got["tensors"][0].dtype == torch.bfloat16 and got["tensors"][1].item() == 3
    assert got["other"][:3] == [None, True, "text"] and isinstance(got["other"][3], serialize.Unsupported)


def test_the_deepest_value_dumps_writes_still_loads():
    value: object = 1
    for _ in range(30):
        value = {"k": value}  # encode stops at 20 levels: 64 levels of JSON, the most it writes
    text, _ = serialize.encode(value)
    assert json_depth(text.encode()) == 64
    got = serialize.loads(serialize.dumps(value))
    for _ in range(20):
        got = got["k"]
    assert isinstance(got["k"], serialize.Unsupported)
