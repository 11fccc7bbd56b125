"""Attacks on the intake and the exports, by a student who controls only what they upload (issue 23).

* The student names the owner: the part of a platform's export name the student chose (their file's
  own name) carries a second owner block; the grader must read the owner from the platform's fixed
  prefix only, so a classmate's notebook is never replaced by the attacker's upload.
* The student dates the submission: dates inside a submitted zip (entry dates, a timestamp.txt that
  looks like nbgrader's) are notes, never the submission time; Canvas's `_LATE_` mark is lateness.
* Spreadsheet formulas: names of files inside a zip, notes, ids and review text reach grades.csv;
  no cell written from them may start like a formula in Excel or LibreOffice.

Real files on disk, real zips and modification times; the last test grades with real nbgrader.
"""
from __future__ import annotations

import csv
import json
import os
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autograder.grade import CSV_COLUMNS, NotebookResult, note_submission, write_csv, write_wide_csv
from autograder.outcomes import Status
from autograder.submissions import TWO_MOODLE_OWNERS, collect_all, flat_name

A01, A02 = "01_similarity_attention", "02_dot_product_attention"
ASSIGNMENTS = {A01: {"softmax", "test_softmax"}, A02: {"attention", "test_attention"}}
IDS = {A01: ("softmax", "test_softmax"), A02: ("attention", "test_attention")}
UTC = timezone.utc
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def notebook(assignment: str | None = A01, marker: str = "") -> bytes:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": marker}]
    cells += [{"cell_type": "code", "source": f"# {g}", "metadata": {"nbgrader": {"grade_id": g}}, "outputs": [],
               "execution_count": None} for g in IDS.get(assignment, ())]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def touch(path: Path, when: datetime) -> Path:
    os.utime(path, (when.timestamp(), when.timestamp()))
    return path


def write(path: Path, data: bytes | str, mtime: datetime) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return touch(path, mtime)


def write_zip(path: Path, members: dict[str, tuple[bytes | str, tuple[int, ...]]], mtime: datetime) -> Path:
    """A real zip, saved (uploaded) at `mtime`; members: name -> (data, entry date as (Y, M, D, h, m, s))."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (data, date) in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=date), data)
    return touch(path, mtime)


def notes_of(sub) -> str:
    return "\n".join(f"{k}: {v}" for k, v in sub.problems.items())


# --------------------------------------------------------------------------- F3: the student names the owner
DATE = "2026-11-20-10-00-00"
ATTACKS = [  # (the platform's name for mallory's upload, what the student chose, owner as the platform wrote)
    ("blackboard", f"Attention 1_mallory_attempt_{DATE}_x_victim_attempt_2026-12-01-00-00-00_{A01}.zip"),
    ("blackboard", f"Attention 1_mallory_attempt_{DATE}_victim_attempt_2026-12-01-00-00-00_{A01}.ipynb"),
    ("blackboard", f"Attention 1_mallory_attempt_{DATE}_Victim V_222_assignsubmission_file_{A01}.ipynb"),
    ("blackboard", f"Attention 1_mallory_attempt_{DATE}_victim_222_333_{A01}.ipynb"),
    ("canvas", f"mallory_111_444_victim_222_333_{A01}.ipynb"),
    ("canvas", f"mallory_LATE_111_444_x_victim_attempt_2026-12-01-00-00-00_{A01}.ipynb"),
    ("canvas", f"mallory_111_444_Victim V_222_assignsubmission_file_{A01}.zip"),
    ("moodle", f"mallory_111_assignsubmission_file_x_victim_attempt_2026-12-01-00-00-00_{A01}.ipynb"),
    ("moodle", f"mallory_111_assignsubmission_file_victim_222_333_{A01}.ipynb"),
    ("moodle", f"mallory_111_assignsubmission_file_Victim V_222_assignsubmission_file_{A01}.ipynb"),
]


@pytest.mark.parametrize("platform, name", ATTACKS, ids=[f"{p}-{i}" for i, (p, _) in enumerate(ATTACKS)])
def test_the_owner_is_read_from_the_platforms_prefix_only(platform, name):
    suffix = ".zip" if name.endswith(".zip") else ".ipynb"
    flat = flat_name(name, ASSIGNMENTS, suffix=suffix)
    assert flat is not None and (flat.platform, flat.student) == (platform, "mallory"), flat


def test_a_classmates_notebook_is_never_replaced_by_an_upload_that_names_them(tmp_path):
    """Blackboard's export: the victim's honest notebook, and mallory's zip whose chosen name carries the
    victim's owner block, holding a blank notebook dated (inside the zip and on disk) after the victim's."""
    root = tmp_path / "class"
    honest = notebook(A01, "victim's own work")
    write(root / f"Attention 1_victim_attempt_2026-11-20-09-00-00_{A01}.ipynb", honest, at(2026, 11, 20, 9, 0))
    write(root / f"Attention 1_mallory_attempt_2026-11-20-08-00-00_{A02}.ipynb", notebook(A02, "mallory 02"),
          at(2026, 11, 20, 8, 0))
    attack = f"Attention 1_mallory_attempt_{DATE}_x_victim_attempt_2026-12-01-00-00-00_{A01}.zip"
    write_zip(root / attack, {f"{A01}.ipynb": (notebook(A01, "blank"), (2026, 12, 1, 0, 0, 0))},
              at(2026, 11, 20, 10, 0))
    found = collect_all(root, ASSIGNMENTS)
    by_id = {s.student_id: s for s in found.students}
    assert sorted(by_id) == ["mallory", "victim"]
    victim, mallory = by_id["victim"], by_id["mallory"]
    assert victim.notebooks == {A01: honest}  # the classmate keeps their own notebook, byte for byte
    assert victim.timestamps == {A01: at(2026, 11, 20, 9, 0)}
    assert json.loads(mallory.notebooks[A01])["cells"][0]["source"] == "blank"  # the attacker's file stays theirs
    assert sorted(mallory.notebooks) == [A01, A02]
    assert not any(path.startswith("Attention 1_victim") for path, _ in found.ignored)
    # the conflict is named, on both rows
    assert attack in notes_of(mallory) and "'victim'" in notes_of(mallory)
    assert attack in notes_of(victim) and "not taken as theirs" in notes_of(victim)


def test_two_uploads_of_one_student_are_both_named_and_neither_is_a_classmates(tmp_path):
    root = tmp_path / "class"
    write(root / f"victim_222_333_{A01}.ipynb", notebook(A01, "victim"), at(2026, 11, 20, 9, 0))
    write(root / f"mallory_111_444_{A01}.ipynb", notebook(A01, "mallory first"), at(2026, 11, 20, 8, 0))
    write(root / f"mallory_111_445_victim_222_333_{A01}.ipynb", notebook(A01, "mallory second"), at(2026, 11, 20, 10, 0))
    by_id = {s.student_id: s for s in collect_all(root, ASSIGNMENTS).students}
    assert json.loads(by_id["victim"].notebooks[A01])["cells"][0]["source"] == "victim"
    assert json.loads(by_id["mallory"].notebooks[A01])["cells"][0]["source"] == "mallory second"
    both = by_id["mallory"].problems[A01]
    assert f"mallory_111_445_victim_222_333_{A01}.ipynb" in both and f"mallory_111_444_{A01}.ipynb" in both


# --------------------------------------------------------------------------- F4: the student dates the submission
DUE = at(2026, 11, 20, 23, 59)


def late_class(root: Path) -> Path:
    """grace uploaded a zip late (Canvas says so, and the file is dated after the due date); inside it,
    a timestamp.txt and entry dates from before the due date."""
    write_zip(root / "grace_LATE_123456_7891_work.zip", {
        f"grace/{A01}/{A01}.ipynb": (notebook(A01, "grace"), (2026, 11, 19, 12, 0, 0)),
        f"grace/{A01}/timestamp.txt": ("2026-11-19 12:00:00.000000 UTC", (2026, 11, 19, 12, 0, 0)),
    }, at(2026, 11, 22, 1, 0))
    write(root / f"heidi_234567_7892_{A01}.ipynb", notebook(A01, "heidi"), at(2026, 11, 20, 20, 0))
    return root


def test_a_late_upload_stays_late_whatever_its_zip_says(tmp_path):
    found = collect_all(late_class(tmp_path / "class"), ASSIGNMENTS)
    by_id = {s.student_id: s for s in found.students}
    grace = by_id["grace"]
    assert grace.timestamps == {A01: at(2026, 11, 22, 1, 0)}  # the upload's own time, after the due date
    assert grace.timestamps[A01] > DUE
    assert "Canvas" in grace.late[A01] and "late" in grace.late[A01]
    notes = notes_of(grace)
    assert "late" in notes and "2026-11-19 12:00 UTC" in notes  # the in-archive date: a note only
    assert "(timestamp.txt)" not in grace.origins[A01] and "entry date" not in grace.origins[A01]
    assert by_id["heidi"].late == {} and by_id["heidi"].timestamps == {A01: at(2026, 11, 20, 20, 0)}


def test_a_late_upload_never_comes_out_on_time_even_when_its_file_time_is_early(tmp_path):
    """The platform said late; the file on disk says before the due date (copied with an old time):
    with the due date known, the recorded time is after it, and the note says why."""
    root = late_class(tmp_path / "class")
    touch(root / "grace_LATE_123456_7891_work.zip", at(2026, 11, 20, 12, 0))
    found = collect_all(root, ASSIGNMENTS, due={A01: DUE})
    grace = next(s for s in found.students if s.student_id == "grace")
    assert grace.timestamps[A01] > DUE
    assert "due date" in grace.late[A01] and "due date" in notes_of(grace)


def test_dates_inside_a_zip_never_decide_which_version_is_newest(tmp_path):
    """A flat file uploaded at 10:00, and a zip uploaded at 09:00 whose entry says 2027: the file is newer."""
    root = tmp_path / "class"
    write(root / f"kim_111_2_{A01}.ipynb", notebook(A01, "kim file"), at(2026, 11, 20, 10, 0))
    write_zip(root / "kim_111_1_work.zip", {
        f"{A01}.ipynb": (notebook(A01, "kim zip"), (2027, 1, 1, 0, 0, 0)),
        "timestamp.txt": ("2027-01-01 00:00:00 UTC", (2027, 1, 1, 0, 0, 0)),
    }, at(2026, 11, 20, 9, 0))
    found = collect_all(root, ASSIGNMENTS)
    (kim,) = found.students
    assert json.loads(kim.notebooks[A01])["cells"][0]["source"] == "kim file"
    assert kim.timestamps == {A01: at(2026, 11, 20, 10, 0)}
    assert "2027-01-01 00:00 UTC" in notes_of(kim)  # named, not used


def test_a_timestamp_txt_among_a_students_own_files_is_not_the_submission_time(tmp_path):
    """A student's folder (an unzipped upload, a Moodle folder) is not nbgrader's exchange: a
    timestamp.txt in it is a note; only nbgrader's submitted/<student>/<assignment>/timestamp.txt counts."""
    root = tmp_path / "class"
    write(root / "zoe" / A01 / f"{A01}.ipynb", notebook(A01, "zoe"), at(2026, 11, 22, 3, 0))
    write(root / "zoe" / A01 / "timestamp.txt", "2026-11-19 08:00:00 UTC", at(2026, 11, 22, 3, 0))
    moodle = root / "Yan Li_4321_assignsubmission_file_"
    write(moodle / A01 / f"{A01}.ipynb", notebook(A01, "yan"), at(2026, 11, 22, 4, 0))
    write(moodle / A01 / "timestamp.txt", "2026-11-19 08:00:00 UTC", at(2026, 11, 22, 4, 0))
    write(root / "submitted" / "ann" / A01 / f"{A01}.ipynb", notebook(A01, "ann"), at(2026, 11, 22, 5, 0))
    write(root / "submitted" / "ann" / A01 / "timestamp.txt", "2026-11-19 08:00:00 UTC", at(2026, 11, 22, 5, 0))
    write(root / "submitted" / "ann" / A01 / "deep" / A02 / f"{A02}.ipynb", notebook(A02, "ann"), at(2026, 11, 22, 5, 0))
    write(root / "submitted" / "ann" / A01 / "deep" / A02 / "timestamp.txt", "2020-01-01 00:00:00 UTC",
          at(2026, 11, 22, 5, 0))
    by_id = {s.student_id: s for s in collect_all(root, ASSIGNMENTS).students}
    assert by_id["zoe"].timestamps == {A01: at(2026, 11, 22, 3, 0)}
    assert by_id["Yan_Li"].timestamps == {A01: at(2026, 11, 22, 4, 0)}
    assert "2026-11-19 08:00 UTC" in notes_of(by_id["zoe"]) and "2026-11-19 08:00 UTC" in notes_of(by_id["Yan_Li"])
    # nbgrader's exchange wrote ann's; the one the student put deeper in her folder is not nbgrader's
    assert by_id["ann"].timestamps == {A01: at(2026, 11, 19, 8, 0), A02: at(2026, 11, 19, 8, 0)}


# --------------------------------------------------------------------------- F5: spreadsheet formulas
HOSTILE = ['=HYPERLINK("http://x","y")', "=cmd|' /C calc'!A0", "+SUM(1,2)", "-2+3+cmd|' /C calc'!A0",
           "@SUM(1)", "\t=1+1", "\r=1+1"]


def hostile_class(root: Path) -> Path:
    members = {f"{name}.ipynb": (notebook(None, name), (2026, 11, 19, 12, 0, 0)) for name in HOSTILE}
    members[f"{A01}.ipynb"] = (notebook(A01, "ok"), (2026, 11, 19, 12, 0, 0))
    write_zip(root / "mallory_111_444_=SUM(1+2).zip", members, at(2026, 11, 20, 8, 0))
    write(root / "=1+2" / f"{A02}.ipynb", notebook(A02, "renamed"), at(2026, 11, 20, 8, 0))
    return root


def rows_of(path: Path) -> list[list[str]]:
    with path.open(newline="") as fh:
        return list(csv.reader(fh))


def assert_no_formula(rows: list[list[str]]) -> None:
    for row in rows:
        for cell in row:
            assert not cell.startswith(FORMULA_STARTS), (cell, row)


def test_no_cell_of_the_exports_starts_like_a_formula(tmp_path):
    found = collect_all(hostile_class(tmp_path / "class"), ASSIGNMENTS)
    results = []
    for sub in found.students:
        for a in (A01, A02):
            r = NotebookResult(sub.student_id, a, 1.5, 3.0, Status.OK, timestamp="2026-11-20T08:00:00Z")
            note_submission(r, sub, a)
            results.append(r)
    results.append(NotebookResult("=2+5", A01, 0.0, 3.0, Status.OK, review="-exec('x'); =HYPERLINK(\"http://x\")",
                                  notes=["@import", "=1"], source_file="+cmd|' /C calc'!A0"))
    write_csv(results, tmp_path / "grades.csv")
    write_wide_csv(results, tmp_path / "grades_wide.csv")
    table, wide = rows_of(tmp_path / "grades.csv"), rows_of(tmp_path / "grades_wide.csv")
    assert table[0] == CSV_COLUMNS and len(table) == len(results) + 1
    assert any(HOSTILE[0] in cell for row in table for cell in row)  # the text is kept, made inert
    assert_no_formula(table)
    assert_no_formula(wide)
    # the grader's own numbers stay numbers
    by = {(row[0], row[1]): dict(zip(CSV_COLUMNS, row, strict=True)) for row in table[1:]}
    assert by["mallory", A01]["score"] == "1.5" and by["mallory", A01]["max_score"] == "3"
    assert by["'=2+5", A01]["review"] == "'-exec('x'); =HYPERLINK(\"http://x\")"
    assert {row[0] for row in wide[1:]} == {"mallory", "1_2", "'=2+5"}
    assert all(row[-2:] == [row[-2], "6"] for row in wide[1:])


@pytest.mark.parametrize("text, cell", [
    ("=1+1", "'=1+1"), ("+1+cmd", "'+1+cmd"), ("-1+cmd", "'-1+cmd"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\t=1", "\\x09=1"), ("\r=1", "\\x0d=1"), ("\n=1", "\\x0a=1"), (" =1+1", "' =1+1"), ("＝1+1", "'＝1+1"),
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"), ("x\udcff.ipynb", "x\\xff.ipynb"),  # controls shown as escapes
    ("alice", "alice"), ("", ""), ("1.5", "1.5"), ("-0.5", "-0.5"), ("1e+06", "1e+06"), ("+3", "+3"),
    ("2026-11-20T08:00:00Z", "2026-11-20T08:00:00Z"), ("ok", "ok"), (2.5, "2.5"), (None, ""),
])
def test_safe_cell(text, cell):
    from autograder.exports import safe_cell

    assert safe_cell(text) == cell


# --------------------------------------------------------------------------- end to end, with real nbgrader
@pytest.mark.slow
def test_a_late_upload_gets_nbgraders_late_penalty_and_the_table_is_inert(course, tmp_path):
    import nbformat

    from autograder.grade import grade

    from .conftest import solved_notebook

    good = nbformat.writes(solved_notebook(course, A01)).encode()
    root = tmp_path / "class"
    write_zip(root / "grace_LATE_123456_7891_work.zip", {
        f"grace/{A01}/{A01}.ipynb": (good, (2026, 11, 19, 12, 0, 0)),
        f"grace/{A01}/timestamp.txt": ("2026-11-19 12:00:00.000000 UTC", (2026, 11, 19, 12, 0, 0)),
        f'grace/{HOSTILE[0]}.ipynb': (notebook(None, "x"), (2026, 11, 19, 12, 0, 0)),
    }, at(2026, 11, 22, 1, 0))
    results = grade(root, tmp_path / "out", progress=False, assignments=[A01], due={A01: DUE}, late_penalty="zero")
    (r,) = [x for x in results if x.notebook == A01]
    assert r.student_id == "grace" and r.score == r.max_score > 0
    assert r.timestamp.startswith("2026-11-22T01:00") and r.late_penalty == r.score
    assert any("late" in n for n in r.notes) and any("2026-11-19 12:00 UTC" in n for n in r.notes)
    assert_no_formula(rows_of(tmp_path / "out" / "grades.csv"))
    assert_no_formula(rows_of(tmp_path / "out" / "grades_wide.csv"))


def test_dates_inside_one_zip_order_only_that_zips_own_files(tmp_path):
    """Two versions in one upload: the one dated last inside it is graded (the student's own choice
    among their own files), at the zip's file time; the other is named."""
    root = tmp_path / "class"
    write_zip(root / "lee.zip", {
        f"{A01}.ipynb": (notebook(A01, "first"), (2026, 11, 19, 9, 0, 0)),
        f"{A01} (1).ipynb": (notebook(A01, "second"), (2026, 11, 19, 10, 0, 0)),
    }, at(2026, 11, 19, 11, 0))
    (lee,) = collect_all(root, ASSIGNMENTS).students
    assert json.loads(lee.notebooks[A01])["cells"][0]["source"] == "second"
    assert lee.timestamps == {A01: at(2026, 11, 19, 11, 0)}
    assert lee.problems == {A01: f"graded lee.zip/{A01} (1).ipynb (2026-11-19 11:00 UTC), ignored "
                                 f"lee.zip/{A01}.ipynb (same upload, dated earlier inside it, 2026-11-19 11:00 UTC)"}


def test_a_moodle_full_name_carrying_a_classmates_block_takes_nothing_of_theirs(tmp_path):
    """Moodle lets students edit their full name: user 9999 named herself 'Bob Jones_4242_assignsubmission_file_x'.
    Her download folder was read leftmost as Bob's (user 4242), and her newer blank notebook replaced his:
    0 / 17, 'graded without problems'. A Moodle folder is now read from the right (the platform's block
    ends its name); a flat upload whose name holds two owner blocks is nobody's, and said so."""
    root = tmp_path / "class"
    honest = notebook(A01, "bob's own work")
    write(root / "Bob Jones_4242_assignsubmission_file_" / f"{A01}.ipynb", honest, at(2026, 11, 20, 9, 0))
    forged = "Bob Jones_4242_assignsubmission_file_x_9999_assignsubmission_file_"
    write(root / forged / f"{A01}.ipynb", notebook(A01, "blank"), at(2026, 11, 20, 10, 0))
    flat = f"Bob Jones_4242_assignsubmission_file_x_9999_assignsubmission_file_{A02}.ipynb"
    write(root / flat, notebook(A02, "blank 02"), at(2026, 11, 20, 10, 0))
    read = flat_name(forged, {}, suffix="")
    assert (read.platform, read.student, read.user) == ("moodle", "Bob Jones_4242_assignsubmission_file_x", "9999")
    found = collect_all(root, ASSIGNMENTS)
    by_raw = {s.student_id: s for s in found.students}
    [bob] = [s for sid, s in by_raw.items() if sid == "Bob_Jones"]
    [other] = [s for sid, s in by_raw.items() if sid != "Bob_Jones"]
    assert bob.notebooks == {A01: honest}, "a classmate's upload replaced Bob's notebook"
    assert json.loads(other.notebooks[A01])["cells"][0]["source"] == "blank"  # hers, graded as hers
    assert (flat, TWO_MOODLE_OWNERS) in found.ignored, found.ignored
    # a full name ending in a classmate's whole block: the two blocks share one '_' (a red team's second try)
    adjacent = tmp_path / "adjacent"
    write(adjacent / f"Bob Jones_4242_assignsubmission_file_{A01}.ipynb", honest, at(2026, 11, 20, 9, 0))
    forged_flat = f"Bob Jones_4242_assignsubmission_file_9999_assignsubmission_file_{A01}.ipynb"
    write(adjacent / forged_flat, notebook(A01, "blank"), at(2026, 11, 20, 10, 0))
    found = collect_all(adjacent, ASSIGNMENTS)
    [bob] = found.students
    assert bob.notebooks == {A01: honest} and (forged_flat, TWO_MOODLE_OWNERS) in found.ignored
    # a file Moodle named, handed in again by its owner: one user's two blocks, theirs
    again = tmp_path / "again"
    write(again / f"Bob Jones_4242_assignsubmission_file_Bob Jones_4242_assignsubmission_file_{A01}.ipynb",
          honest, at(2026, 11, 20, 9, 0))
    [bob] = collect_all(again, ASSIGNMENTS).students
    assert bob.student_id == "Bob_Jones" and bob.notebooks == {A01: honest}


def test_a_moodle_user_who_takes_a_classmates_full_name_takes_nothing_of_theirs(tmp_path):
    """A red team set a Moodle full name to a classmate's: with the smaller user id it got the classmate's id,
    roster row and email ('Bob_Jones'), and the real Bob's 17 went to 'Bob_Jones-2' with no email. Users who share
    a full name now each get the name and their Moodle user id, and neither the bare name."""
    for user in ("1001", "2002"):
        folder = tmp_path / f"Bob Jones_{user}_assignsubmission_file_"
        folder.mkdir()
        (folder / f"{A01}.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    (tmp_path / "Ann Lee_3003_assignsubmission_file_").mkdir()
    (tmp_path / "Ann Lee_3003_assignsubmission_file_" / f"{A01}.ipynb").write_text("{}")
    found = {s.student_id: s for s in collect_all(tmp_path, {A01: {f"{A01}.ipynb"}}).students}
    assert set(found) == {"Bob_Jones-1001", "Bob_Jones-2002", "Ann_Lee"}
    note = found["Bob_Jones-2002"].problems["Bob Jones_2002_assignsubmission_file_"]
    assert "Moodle users 1001, 2002 share the full name" in note and "tied to no roster row" in note


# --------------------------------------------------------------------------- names a terminal or a file cannot take
SPOOF = "\x1b[2J\x1b[3J\x1b[H\x1b]0;attn-course: all graded\x07\x1b]52;c;Y3VybA==\x07\x1b[8m"


@pytest.mark.slow
def test_a_file_name_not_utf8_or_full_of_escapes_stops_no_table_and_forges_no_console(course, tmp_path, capsys):
    """A red team: one student's file named with a byte that is not UTF-8 (`x\\xff.ipynb`, which any user can make)
    stopped grades.csv, the report and every feedback page of the whole class, every run ("'utf-8' codec can't
    encode", exit 2); a zip entry named with escape sequences cleared the instructor's screen and drew a forged table.
    Both names are now shown as escapes, and the class's tables are written."""
    import nbformat

    from autograder.grade import format_table, grade

    from .conftest import solved_notebook

    good = nbformat.writes(solved_notebook(course, A01)).encode()
    root = tmp_path / "class"
    write(root / "honest" / f"{A01}.ipynb", good, at(2026, 11, 20, 9, 0))
    write(root / "mallory" / f"{A01}.ipynb", good, at(2026, 11, 20, 10, 0))
    write(Path(os.fsdecode(bytes(root / "mallory") + b"/backup\xff.ipynb")), good, at(2026, 11, 20, 8, 0))
    write_zip(root / "zed.zip", {f"{A01}.ipynb": (good, (2026, 11, 20, 9, 0, 0)),
                                 f"{SPOOF}/{A01}.ipynb": (good, (2026, 11, 19, 9, 0, 0))}, at(2026, 11, 20, 9, 0))
    out = tmp_path / "out"
    results = grade(root, out, progress=True, assignments=[A01])
    said = capsys.readouterr().out + format_table(results)
    by = {r.student_id: r for r in results}
    assert by["honest"].score == by["mallory"].score == by["zed"].score == by["honest"].max_score > 0, by
    with (out / "grades.csv").open(newline="") as fh:
        rows = {r["student_id"]: r for r in csv.DictReader(fh)}
    assert "backup\\xff.ipynb" in rows["mallory"]["notes"], rows["mallory"]
    assert "\\x1b[2J" in rows["zed"]["notes"] and "\x1b" not in (out / "grades.csv").read_text(), rows["zed"]
    assert (out / "report.html").is_file() and "\x1b" not in said and "\udcff" not in said, said[-2000:]
    assert "\\x1b]0;attn-course: all graded\\x07" in said, said[-2000:]


def test_nothing_to_grade_shows_a_students_file_names_as_escapes():
    """A red team: a late folder whose only upload was a zip of one text file named with escape sequences; "nothing to
    grade" quoted the name raw, and the terminal drew "all 3 notebooks graded without problems"."""
    from autograder.grade import nothing_to_grade

    said = nothing_to_grade(Path("late"), [(f"mallory.zip/notes{SPOOF}.txt", "not a notebook")])
    assert "\x1b" not in said and "\x07" not in said and "notes\\x1b[2J" in said, said
