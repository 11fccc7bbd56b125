"""Unit tests for how autograder/submissions.py names things: which assignment a submitted file is
(match_assignment: its name, tolerating renames, then its leading number, then the graded cells
it holds, then the graded functions its code defines), the file part of learning platforms' export names, and student ids (clean-up,
transliteration, collisions). Table-driven; no notebook is graded, nothing is slow.
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone

import pytest

from autograder import submissions
from autograder.submissions import STUDENT_ID, _distinct_ids, _match, _safe_id, collect_all, flat_name, match_assignment

NAMES = ["01_similarity_attention", "02_queries_keys_values", "03_multi_head_attention", "04_positional_encoding",
         "05_masked_cross_attention", "06_transformer_translator", "07_attention_at_scale"]
ASSIGNMENTS = {name: {f"{name[:2]}_{part}" for part in ("answer_a", "test_a", "answer_b", "test_b")} for name in NAMES}
A01, A02, A07 = NAMES[0], NAMES[1], NAMES[6]


def notebook(*grade_ids: str) -> bytes:
    """A notebook whose code cells carry these nbgrader grade ids."""
    cells = [{"cell_type": "code", "source": "", "metadata": {"nbgrader": {"grade_id": g}}, "outputs": []}
             for g in grade_ids]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


# --------------------------------------------------------------------------- by name
BY_NAME = [
    ("exact", f"{A01}.ipynb", A01),
    ("in a folder", f"alice/final/{A02}.ipynb", A02),
    ("upper case", "01_Similarity_Attention.IPYNB", A01),
    ("spaces", "07 Attention At Scale.ipynb", A07),
    ("hyphens", "01-similarity-attention.ipynb", A01),
    ("browser copy", f"{A01} (2).ipynb", A01),
    ("browser copy without a space", f"{A01}(1).ipynb", A01),
    ("Google Drive copy", f"Copy of {A01}.ipynb", A01),
    ("Drive copy of a browser copy", f"copy of {A01} (1).ipynb", A01),
    ("Jupyter copy", f"{A01}-Copy1.ipynb", A01),
    ("macOS copy", f"{A01} copy.ipynb", A01),
    ("underscore copy", f"{A01}_copy2.ipynb", A01),
    ("checkpoint", f"{A01}-checkpoint.ipynb", A01),
    # Not the name, but its leading number is one assignment's.
    ("number only", "01.ipynb", A01),
    ("number without its zero", "1.ipynb", A01),
    ("number with more zeros", "007_scale.ipynb", A07),
    ("number and other words", "2_qkv_homework.ipynb", A02),
    ("twice a browser copy", f"{A01} (1) (2).ipynb", A01),
    ("Windows copy", f"{A01} - Copy.ipynb", A01),
    ("double extension", f"{A01}.ipynb.ipynb", A01),
    ("Blackboard export, unparsed", f"{A01}_jsmith_attempt_2026-11-20-14-03-11_{A01}.ipynb", A01),
    # Nothing to go by.
    ("no such number", "10_extra_credit.ipynb", None),
    ("no number", "homework.ipynb", None),
    ("the words without the number", "similarity_attention.ipynb", None),
    ("Canvas export, unparsed", f"smithjane_123456_7890_{A01}.ipynb", None),  # flat_name reads it first: below
]


@pytest.mark.parametrize("name, want", [(n, w) for _, n, w in BY_NAME], ids=[i for i, _, _ in BY_NAME])
def test_a_file_is_matched_by_its_name(name, want):
    assert match_assignment(name, b"", ASSIGNMENTS) == want


def test_a_copy_of_a_copy_is_matched_by_its_name():
    assert match_assignment(f"Copy of Copy of {A01}.ipynb", b"", ASSIGNMENTS) == A01


def test_the_name_decides_before_the_notebook_is_read():
    def never():
        raise AssertionError("the grade ids were computed although the name decided")

    assert _match(f"Copy of {A02} (3).ipynb", never, ASSIGNMENTS) == A02
    assert _match("2_anything.ipynb", never, ASSIGNMENTS) == A02
    assert match_assignment(f"{A02}.ipynb", notebook("03_answer_a", "03_test_a", "03_answer_b"), ASSIGNMENTS) == A02


# --------------------------------------------------------------------------- by the graded cells
@pytest.mark.parametrize("data, want", [
    (notebook("03_answer_a", "03_test_a"), NAMES[2]),
    (notebook("03_answer_a", "03_test_a", "04_answer_a", "04_test_a", "04_answer_b"), NAMES[3]),  # the most shared
    (notebook("03_answer_a"), None),  # one shared id is not enough
    (notebook("03_answer_a", "04_answer_a", "05_answer_a"), None),
    (notebook("unknown_a", "unknown_b"), None),
    (notebook(), None),
    (b"\xff\xfe not a notebook", None),
    (b'{"cells": "not a list"}', None),
    (b"[" * 10_000, None),  # refused before it is parsed
], ids=["two ids", "most ids win", "one id", "one id each", "unknown ids", "no ids", "not UTF-8", "no cells", "deep"])
def test_a_file_named_otherwise_is_matched_by_its_graded_cells(data, want):
    assert match_assignment("homework.ipynb", data, ASSIGNMENTS) == want


def code_notebook(*sources: str) -> bytes:
    """A notebook of plain code cells: no nbgrader metadata at all (a tool dropped it, or code pasted anew)."""
    cells = [{"cell_type": "code", "source": s, "metadata": {}, "outputs": []} for s in sources]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


@pytest.mark.parametrize("data, want", [
    (code_notebook("import numpy as np", "def 03_answer_a(x):\n    return x", "def 03_answer_b(x): pass"), None),
    (code_notebook("def answer(x):\n    return x"), None),
], ids=["not identifiers", "unknown name"])
def test_only_names_that_are_identifiers_and_graded_count(data, want):
    assert match_assignment("homework.ipynb", data, ASSIGNMENTS) == want


def test_a_renamed_notebook_without_cell_metadata_is_matched_by_the_functions_it_defines():
    """A notebook whose cells lost their nbgrader metadata, renamed: its answers still define the graded
    functions (the answer cells' grade ids are their names). Matched, it is graded (and flagged as not the
    assignment's notebook); unmatched, the student got 'missing' for a notebook they handed in."""
    assignments = {A01: {"softmax", "test_softmax", "normalize_rows", "test_normalize_rows"},
                   A02: {"SelfAttention", "test_self_attention", "attention", "test_attention"}}
    pasted = code_notebook("import numpy as np", "def normalize_rows(S):\n    return S",
                           "# my answer\ndef softmax(x, axis=-1):\n    return x", "print(softmax([1]))")
    assert match_assignment("my homework.ipynb", pasted, assignments) == A01
    cls = code_notebook("import torch", "class SelfAttention(torch.nn.Module):\n    pass", "async def attention(): pass")
    assert match_assignment("week two.ipynb", cls, assignments) == A02
    nested = code_notebook("if True:\n    def softmax(x): return x\n    def normalize_rows(S): return S")
    assert match_assignment("homework.ipynb", nested, assignments) is None  # only what a cell defines at its top


def test_a_scratch_notebook_defining_the_functions_never_displaces_the_real_one(tmp_path):
    """Known only by the functions it defines, a notebook is graded when the student handed in nothing else
    for that assignment; beside the real notebook (even older), it is listed as not graded, with why."""
    real = notebook("01_answer_a", "01_test_a")
    scratch = code_notebook("def 01_x(): pass", "def softmax(x): return x\ndef normalize_rows(S): return S")
    assignments = {A01: {"01_answer_a", "01_test_a", "softmax", "normalize_rows"}, A02: {"attention", "test_attention"}}
    (tmp_path / "alice").mkdir()
    (tmp_path / "bob").mkdir()
    (tmp_path / "alice" / f"{A01}.ipynb").write_bytes(real)
    (tmp_path / "alice" / "scratch.ipynb").write_bytes(scratch)
    os.utime(tmp_path / "alice" / f"{A01}.ipynb", (1_000_000_000, 1_000_000_000))  # the real one is older
    (tmp_path / "bob" / "my homework.ipynb").write_bytes(scratch)
    found = collect_all(tmp_path, assignments)
    by_id = {s.student_id: s for s in found.students}
    assert by_id["alice"].notebooks == {A01: real}
    assert "alice/scratch.ipynb" in dict(found.ignored), found.ignored
    assert f"{A01}'s own notebook from alice is graded instead" in dict(found.ignored)["alice/scratch.ipynb"]
    assert by_id["bob"].notebooks == {A01: scratch}


def test_two_candidates_by_number_are_decided_by_the_graded_cells():
    """Two assignments start with 1: the number decides nothing, the cells do (or nothing does)."""
    assignments = {"01_part_one": {"p1_a", "p1_b"}, "01_part_two": {"p2_a", "p2_b"}, "02_other": {"o_a", "o_b"}}
    assert match_assignment("1_attention.ipynb", notebook("p2_a", "p2_b"), assignments) == "01_part_two"
    assert match_assignment("1_attention.ipynb", notebook("o_a"), assignments) is None
    assert match_assignment("1_attention.ipynb", b"", assignments) is None
    assert match_assignment("01_part_one (1).ipynb", notebook("p2_a", "p2_b"), assignments) == "01_part_one"


# --------------------------------------------------------------------------- learning platforms' names
LMS = [
    ("Blackboard", f"{A01}_jsmith_attempt_2026-11-20-14-03-11_{A01}.ipynb", "jsmith", A01),
    ("Blackboard, renamed file", f"Attention 2_jsmith_attempt_2026-11-20-14-03-11_Copy of {A02}.ipynb", "jsmith", A02),
    ("Blackboard, no file part", f"{A07}_jsmith_attempt_2026-11-20-14-03-11.ipynb", "jsmith", A07),
    ("Canvas", f"smithjane_123456_7890_{A01}.ipynb", "smithjane", A01),
    ("Canvas late, resubmitted", f"smithjane_LATE_123456_7890_{A02}-1.ipynb", "smithjane", A02),
    ("Canvas, student's own name", "smithjane_123456_7890_hw2.ipynb", "smithjane", None),
    ("Moodle", f"Jane Smith_12345_assignsubmission_file_{A01} (1).ipynb", "Jane Smith", A01),
    ("plain, underscore", f"alice_{A01}.ipynb", "alice", A01),
    ("plain, mixed case and spaces", "s1234567-01 Similarity Attention (2).ipynb", "s1234567", A01),
]


@pytest.mark.parametrize("name, who, want", [(n, s, w) for _, n, s, w in LMS], ids=[i for i, _, _, _ in LMS])
def test_a_platform_s_export_name_gives_the_student_and_then_the_assignment(name, who, want):
    """What collect does with a file at the top of the class folder: flat_name says whose it is and
    which of its parts the student named; that part is what is matched (the whole name if none)."""
    flat = flat_name(name, ASSIGNMENTS)
    assert flat is not None and flat.student == who
    assert match_assignment(flat.file or name, b"", ASSIGNMENTS) == want


def test_a_canvas_file_the_student_named_freely_is_matched_by_its_cells():
    flat = flat_name("smithjane_123456_7890_hw2.ipynb", ASSIGNMENTS)
    assert match_assignment(flat.file, notebook("05_answer_a", "05_test_b"), ASSIGNMENTS) == NAMES[4]


# --------------------------------------------------------------------------- two files, one assignment
def test_of_two_files_for_one_assignment_the_newer_is_graded_and_both_are_named(tmp_path):
    (tmp_path / "alice").mkdir()
    older, newer = tmp_path / "alice" / f"{A01}.ipynb", tmp_path / "alice" / f"Copy of {A01} (1).ipynb"
    older.write_bytes(notebook("01_answer_a"))
    newer.write_bytes(notebook("01_answer_b"))
    times = {older: datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc),
             newer: datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)}
    for path, when in times.items():
        os.utime(path, (when.timestamp(), when.timestamp()))
    found = collect_all(tmp_path, ASSIGNMENTS)
    (alice,) = found.students
    assert alice.notebooks == {A01: notebook("01_answer_b")} and alice.timestamps == {A01: times[newer]}
    assert alice.problems == {A01: f"graded alice/Copy of {A01} (1).ipynb (2026-11-20 10:00 UTC), ignored "
                                   f"alice/{A01}.ipynb (older, 2026-11-20 09:00 UTC)"}
    assert [path for path, _ in found.ignored] == [f"alice/{A01}.ipynb"]


# --------------------------------------------------------------------------- student ids
@pytest.mark.parametrize("raw, sid", [
    ("alice", "alice"), ("s1234567", "s1234567"), ("jane.doe@uni.edu", "jane.doe@uni.edu"), ("a-b_c", "a-b_c"),
    ("Zoé Li", "Zoe_Li"), ("Zoë Li", "Zoe_Li"), ("José Núñez", "Jose_Nunez"), ("François", "Francois"),
    ("Ǆemal", "DZemal"), ("ﬁona", "fiona"),  # compatibility characters decompose too
    ("o'brien", "o_brien"), ("x y", "x_y"), ("a/b", "a_b"), ("..hidden", "hidden"), ("_x", "x"), ("@x", "x"),
    ("李雷", "LiLei"), ("王小明", "WangXiaoMing"), ("Иван Петров", "Ivan_Petrov"), ("Ørsted", "Orsted"),
    ("straße", "strasse"), ("Zoe\u0301 Li", "Zoe_Li"),  # other scripts transliterated; decomposed accents too
    ("", "student"), ("...", "student"),
    ("a" * 80, "a" * 64), ("é" * 70, "e" * 64),
], ids=repr)
def test_a_student_id_is_cleaned_and_transliterated(raw, sid):
    assert _safe_id(raw) == sid


@pytest.mark.parametrize("raw", ["Ørsted", "Łukasz", "straße", "\x00null", "tab\there", "emoji 🎓", "-" * 100,
                                 "🎓" * 10, "a" * 63 + "é", "..\\..\\etc", "CON", " leading space", "ü" * 200])
def test_a_cleaned_id_is_always_a_valid_one(raw):
    sid = _safe_id(raw)
    assert STUDENT_ID.match(sid) and sid == _safe_id(raw) and _safe_id(sid) == sid


FOLDERS = "folders and zips"


def test_ids_that_collide_after_clean_up_get_a_suffix_and_both_are_told():
    got = _distinct_ids([(FOLDERS, "Zoé Li", "Zoé Li"), (FOLDERS, "Zoë Li", "Zoë Li")])
    assert [sid for sid, _ in got] == ["Zoe_Li", "Zoe_Li-2"]
    assert got[0][1] == {"Zoé Li": "student id 'Zoé Li' renamed to 'Zoe_Li'",
                         "Zoë Li": "another submission, 'Zoë Li', is graded separately as student id 'Zoe_Li-2'"}
    assert got[1][1] == {"Zoë Li": "graded as student id 'Zoe_Li-2', because 'Zoé Li' is already graded as 'Zoe_Li'; "
                                   "if both are the same student, keep one: move the notebooks you want graded into 'Zoé Li' and "
                                   "remove 'Zoë Li' (an unzipped copy beside its zip, say), then grade again"}


@pytest.mark.parametrize("items, ids", [
    ([(FOLDERS, "alice", "alice"), (FOLDERS, "alice.zip", "alice")], ["alice", "alice-2"]),
    ([(FOLDERS, "alice", "alice"), (FOLDERS, "alice.zip", "alice"), (FOLDERS, "alice-2", "alice-2")],
     ["alice", "alice-3", "alice-2"]),  # a real alice-2 keeps its id, even when it comes later
    ([(FOLDERS, "a", "alice"), (FOLDERS, "b", "alice"), (FOLDERS, "c", "alice")], ["alice", "alice-2", "alice-3"]),
    ([(FOLDERS, "alice", "alice"), ("nbgrader's submitted/", "alice", "alice")], ["alice", "alice"]),  # merged
    ([("nbgrader's submitted/", "alice", "alice"), (FOLDERS, "alice", "alice"), (FOLDERS, "alice.zip", "alice")],
     ["alice", "alice", "alice-2"]),
    ([(FOLDERS, "李雷", "李雷"), (FOLDERS, "韩梅梅", "韩梅梅"), (FOLDERS, "student", "student")],
     ["LiLei", "HanMeiMei", "student"]),  # transliterated: each keeps a name of their own
    ([(FOLDERS, "王小明", "王小明"), (FOLDERS, "WangXiaoMing", "WangXiaoMing")], ["WangXiaoMing", "WangXiaoMing-2"]),
    ([(FOLDERS, "Ørsted", "Ørsted"), ("nbgrader's submitted/", "Orsted", "Orsted")], ["Orsted", "Orsted-2"]),
    ([("canvas files", "王小明_1_2_x.ipynb", "王小明"), (FOLDERS, "WangXiaoMing", "WangXiaoMing")],
     ["WangXiaoMing", "WangXiaoMing-2"]),  # two names, two layouts, one id once cleaned: never merged
    ([(FOLDERS, "Zoe\u0301 Li", "Zoe\u0301 Li"), ("nbgrader's submitted/", "Zoé Li", "Zoé Li")], ["Zoe_Li", "Zoe_Li"]),
], ids=["two entries", "a real suffix is reserved", "three entries", "two layouts share", "merged then split",
        "non-latin names", "a name and its transliteration", "two names across layouts", "a platform and a folder",
        "one name, composed or not"])
def test_student_ids_are_distinct_within_a_layout_and_shared_across_layouts(items, ids):
    assert [sid for sid, _ in _distinct_ids(items)] == ids
    assert _distinct_ids(items) == _distinct_ids(list(items))  # deterministic


def test_a_suffix_keeps_a_long_id_within_64_characters():
    base = "x" * 64
    got = _distinct_ids([(FOLDERS, "one", base), (FOLDERS, "two", base + "y")])
    assert [sid for sid, _ in got] == [base, "x" * 62 + "-2"]
    assert all(STUDENT_ID.match(sid) for sid, _ in got)


def test_the_limits_the_names_rely_on():
    assert STUDENT_ID.match("a" * 64) and not STUDENT_ID.match("a" * 65) and not STUDENT_ID.match("-a")
    assert submissions.MAX_JSON_DEPTH == 100
