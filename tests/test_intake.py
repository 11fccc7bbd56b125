"""One intake for every layout of a class folder, read together, nothing skipped silently.

Built from an instructor's trial: a class folder holding student folders, zips, flat files named
as Canvas exports them, and nbgrader's submitted/ tree was graded as "2 students" (submitted/
switched the whole intake); nbgrader's timestamp.txt was dropped; a student with draft/ and
final/ was graded on the draft, and nothing said which file was graded. Real files on disk,
small notebooks with nbgrader grade ids, real zips and modification times.
"""
from __future__ import annotations

import json
import os
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from autograder.submissions import Intake, collect, collect_all, flat_name, parse_timestamp

A01, A02 = "01_similarity_attention", "02_dot_product_attention"
ASSIGNMENTS = {A01: {"softmax", "test_softmax"}, A02: {"attention", "test_attention"}}
IDS = {A01: ("softmax", "test_softmax"), A02: ("attention", "test_attention")}
UTC = timezone.utc


def notebook(assignment: str | None = A01, marker: str = "") -> bytes:
    """A small notebook with the assignment's nbgrader grade ids (none for assignment=None);
    `marker` goes into a markdown cell, to tell versions apart."""
    cells = [{"cell_type": "markdown", "metadata": {}, "source": marker}]
    cells += [{"cell_type": "code", "source": f"# {g}", "metadata": {"nbgrader": {"grade_id": g}}, "outputs": [],
               "execution_count": None} for g in IDS.get(assignment, ())]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def marker(data: bytes) -> str:
    return json.loads(data)["cells"][0]["source"]


def at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def write(path: Path, data: bytes | str, mtime: datetime | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    if mtime is not None:
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


def write_zip(path: Path, members: dict[str, tuple[bytes | str, tuple[int, ...]]],
              mtime: datetime | None = None) -> Path:
    """A real zip, uploaded at `mtime` (its file time); members: name -> (data, zip entry date as
    (Y, M, D, h, m, s))."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (data, date) in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=date), data)
    if mtime is not None:
        os.utime(path, (mtime.timestamp(), mtime.timestamp()))
    return path


# --------------------------------------------------------------------------- the instructor's class folder
T_ALICE_01 = at(2026, 11, 18, 8, 0)
T_ALICE_02 = datetime(2026, 11, 20, 14, 3, 11, 123456, tzinfo=UTC)  # nbgrader's timestamp.txt
T_BOB = at(2026, 11, 19, 10, 0)  # the zip's file time (its entries: an hour earlier)
T_CAROL = at(2026, 11, 21, 9, 30)  # nbgrader's timestamp.txt
T_DRAFT, T_FINAL = at(2026, 11, 19, 9, 0), at(2026, 11, 20, 14, 3)
T_GRACE_CANVAS, T_GRACE_FOLDER, T_GRACE_LATE = at(2026, 11, 17, 12, 0), at(2026, 11, 19, 12, 0), at(2026, 11, 22, 1, 0)
T_HEIDI, T_IVAN = at(2026, 11, 20, 23, 59), at(2026, 11, 20, 22, 0)


def mixed_class(root: Path) -> Path:
    """Every layout at once, as the instructor's trial had it, with junk of every kind."""
    # a student folder, with a checkpoint, junk, a notebook of no assignment, a refused notebook
    write(root / "alice" / f"{A01}.ipynb", notebook(A01, "alice 01"), T_ALICE_01)
    write(root / "alice" / ".ipynb_checkpoints" / f"{A01}-checkpoint.ipynb", notebook(A01, "checkpoint"))
    write(root / "alice" / ".DS_Store", b"\0\0\0\1Bud1")
    write(root / "alice" / "notes.txt", "my notes")
    write(root / "alice" / "scratch.ipynb", notebook(None, "scratch"))
    write(root / "alice" / "deep.ipynb", b"[" * 300 + b"]" * 300)
    # alice again, in nbgrader's tree (merged with her folder), and carol only there
    write(root / "submitted" / "alice" / A02 / f"{A02}.ipynb", notebook(A02, "alice 02"))
    write(root / "submitted" / "alice" / A02 / "timestamp.txt", "2026-11-20 14:03:11.123456 UTC\n")
    write(root / "submitted" / "carol" / A01 / f"{A01}.ipynb", notebook(A01, "carol 01"))
    write(root / "submitted" / "carol" / A01 / "timestamp.txt", "2026-11-21 09:30:00 UTC")
    # a zip per student, made on a Mac
    write_zip(root / "bob.zip", {
        f"bob/{A01}.ipynb": (notebook(A01, "bob 01"), (2026, 11, 19, 9, 0, 0)),
        f"bob/{A02} (1).ipynb": (notebook(A02, "bob 02"), (2026, 11, 19, 9, 0, 0)),
        "bob/README.md": ("read me", (2026, 11, 19, 9, 0, 0)),
        f"__MACOSX/bob/._{A01}.ipynb": (b"\0\5\26\7", (2026, 11, 19, 9, 0, 0)),
    }, T_BOB)
    # draft/ and final/: the final is newer, and after the draft in name order only by chance
    write(root / "dave" / "draft" / f"{A01}.ipynb", notebook(A01, "dave draft"), T_DRAFT)
    write(root / "dave" / "final" / f"{A01}.ipynb", notebook(A01, "dave final"), T_FINAL)
    # a student who submitted nothing
    (root / "erin").mkdir()
    # Canvas's export (one of them late), and a folder for the same student with a newer 01
    write(root / f"grace_123456_7890_{A01}.ipynb", notebook(A01, "grace canvas 01"), T_GRACE_CANVAS)
    write(root / f"grace_LATE_123456_7891_{A02}.ipynb", notebook(A02, "grace canvas 02"), T_GRACE_LATE)
    write(root / "grace" / f"{A01}.ipynb", notebook(A01, "grace folder 01"), T_GRACE_FOLDER)
    # plain <id>_<assignment> and <id>-<assignment> files (a browser's copy suffix too)
    write(root / f"heidi_{A02}.ipynb", notebook(A02, "heidi 02"), T_HEIDI)
    write(root / f"ivan-{A01} (1).ipynb", notebook(A01, "ivan 01"), T_IVAN)
    # the instructor's own files
    write(root / f"{A01}.ipynb", notebook(A01, "the release"))
    write(root / "grades.csv", "student,score\n")
    write(root / ".DS_Store", b"\0")
    write(root / "__MACOSX" / "._bob.zip", b"\0")
    return root


@pytest.fixture(scope="module")
def intake(tmp_path_factory) -> Intake:
    return collect_all(mixed_class(tmp_path_factory.mktemp("intake") / "class"), ASSIGNMENTS)


@pytest.fixture(scope="module")
def students(intake) -> dict:
    return {s.student_id: s for s in intake.students}


def test_every_student_of_every_layout_is_found(intake, students):
    assert sorted(students) == ["alice", "bob", "carol", "dave", "erin", "grace", "heidi", "ivan"]
    assert len(intake.students) == len(students)  # one submission per student: layouts merged
    got = {sid: {a: marker(data) for a, data in s.notebooks.items()} for sid, s in students.items()}
    assert got == {
        "alice": {A01: "alice 01", A02: "alice 02"},  # her folder and submitted/alice, merged
        "bob": {A01: "bob 01", A02: "bob 02"},
        "carol": {A01: "carol 01"},
        "dave": {A01: "dave final"},
        "erin": {},  # present, graded as missing
        "grace": {A01: "grace folder 01", A02: "grace canvas 02"},
        "heidi": {A02: "heidi 02"},
        "ivan": {A01: "ivan 01"},
    }


def test_collect_returns_the_same_students(tmp_path, students):
    found = collect(mixed_class(tmp_path / "class"), ASSIGNMENTS)
    assert [s.student_id for s in found] == ["alice", "bob", "dave", "erin", "grace", "heidi", "ivan", "carol"]
    assert {s.student_id: sorted(s.notebooks) for s in found} == {k: sorted(v.notebooks) for k, v in students.items()}


def test_each_graded_notebook_has_its_submission_time_and_where_it_came_from(students):
    times = {sid: s.timestamps for sid, s in students.items()}
    assert times == {
        "alice": {A01: T_ALICE_01, A02: T_ALICE_02}, "bob": {A01: T_BOB, A02: T_BOB}, "carol": {A01: T_CAROL},
        "dave": {A01: T_FINAL}, "erin": {}, "grace": {A01: T_GRACE_FOLDER, A02: T_GRACE_LATE},
        "heidi": {A02: T_HEIDI}, "ivan": {A01: T_IVAN},
    }
    assert all(t.tzinfo is not None and t.utcoffset().total_seconds() == 0 for s in times.values() for t in s.values())
    assert {sid: s.origins for sid, s in students.items()} == {
        "alice": {A01: f"alice/{A01}.ipynb (file time)",
                  A02: f"submitted/alice/{A02}/{A02}.ipynb (timestamp.txt)"},
        "bob": {A01: f"bob.zip/bob/{A01}.ipynb (the zip's file time)",
                A02: f"bob.zip/bob/{A02} (1).ipynb (the zip's file time)"},
        "carol": {A01: f"submitted/carol/{A01}/{A01}.ipynb (timestamp.txt)"},
        "dave": {A01: f"dave/final/{A01}.ipynb (file time)"},
        "erin": {},
        "grace": {A01: f"grace/{A01}.ipynb (file time)", A02: f"grace_LATE_123456_7891_{A02}.ipynb (file time)"},
        "heidi": {A02: f"heidi_{A02}.ipynb (file time)"},
        "ivan": {A01: f"ivan-{A01} (1).ipynb (file time)"},
    }


def test_the_newest_version_is_graded_and_both_are_named(students):
    assert students["dave"].problems == {A01: (
        f"graded dave/final/{A01}.ipynb (2026-11-20 14:03 UTC), "
        f"ignored dave/draft/{A01}.ipynb (older, 2026-11-19 09:00 UTC)")}
    assert students["grace"].problems == {A01: (  # a folder and a flat file: the folder's is newer
        f"graded grace/{A01}.ipynb (2026-11-19 12:00 UTC), "
        f"ignored grace_123456_7890_{A01}.ipynb (older, 2026-11-17 12:00 UTC)"),
        f"{A02} (late)": (  # Canvas's _LATE_ is kept: a mark and a note
        f"graded grace_LATE_123456_7891_{A02}.ipynb: Canvas marked this upload late ('_LATE_' in its name); "
        "its time is 2026-11-22 01:00 UTC (file time)")}
    assert {sid: s.late for sid, s in students.items() if s.late} == {"grace": {A02: students["grace"].late[A02]}}
    for sid in ("bob", "carol", "erin", "heidi", "ivan"):
        assert students[sid].problems == {}


def test_everything_not_graded_is_listed_with_why(intake, students):
    ignored = dict(intake.ignored)
    assert len(ignored) == len(intake.ignored)  # each path once
    expected = {
        f"{A01}.ipynb": "whose name names no student",
        ".DS_Store": "hidden file",
        "__MACOSX": "macOS metadata",
        "grades.csv": "not a notebook (.ipynb), a zip or a student's folder",
        "alice/.DS_Store": "hidden file",
        "alice/.ipynb_checkpoints": "Jupyter's autosave checkpoints",
        "alice/notes.txt": "not a notebook",
        "alice/scratch.ipynb": "not recognised as any assignment's notebook",
        "alice/deep.ipynb": "nests JSON 300 levels deep (limit 100)",
        "bob.zip/__MACOSX": "macOS metadata",
        "bob.zip/bob/README.md": "not a notebook",
        f"dave/draft/{A01}.ipynb": f"an older version of {A01} for student 'dave': graded dave/final/{A01}.ipynb "
                                   "(2026-11-20 14:03 UTC) instead",
        f"grace_123456_7890_{A01}.ipynb": f"an older version of {A01} for student 'grace': graded grace/{A01}.ipynb",
    }
    assert sorted(ignored) == sorted(expected)
    for path, words in expected.items():
        assert words in ignored[path], (path, ignored[path])
    # the refused and unmatched files are also in the student's own notes, for the status
    assert set(students["alice"].problems) == {"scratch.ipynb", "deep.ipynb"}
    assert "nests JSON 300 levels deep" in students["alice"].problems["deep.ipynb"]


# --------------------------------------------------------------------------- one layout at a time
def test_the_class_folder_can_itself_be_nbgrader_submitted_tree(tmp_path):
    root = mixed_class(tmp_path / "class") / "submitted"
    write(root / "carol" / A02 / f"{A02}.ipynb", notebook(A02, "carol 02"), at(2026, 11, 23, 8, 0))  # no timestamp.txt
    write(root / "zed" / A01 / "timestamp.txt", "2026-11-20 10:00:00 UTC")  # a timestamp, no notebook
    found = collect_all(root, ASSIGNMENTS)
    by_id = {s.student_id: s for s in found.students}
    assert sorted(by_id) == ["alice", "carol", "zed"]
    assert by_id["carol"].timestamps == {A01: T_CAROL, A02: at(2026, 11, 23, 8, 0)}
    assert by_id["carol"].origins == {A01: f"carol/{A01}/{A01}.ipynb (timestamp.txt)",
                                      A02: f"carol/{A02}/{A02}.ipynb (file time)"}
    assert by_id["alice"].timestamps == {A02: T_ALICE_02}
    assert by_id["zed"].notebooks == {}
    assert found.ignored == [(f"zed/{A01}/timestamp.txt", "nbgrader's timestamp.txt, with no notebook beside it")]


def test_nbgrader_submission_secret_is_kept_only_where_the_exchange_writes_it(tmp_path):
    """`nbgrader release_feedback` names a student's feedback with the submission secret `submit`
    wrote beside the notebooks; only that one is kept (128 hex digits), never one of the student's
    own files or one that is not a secret (test_exchange.py runs the whole exchange)."""
    secret = "ab" * 64
    root = mixed_class(tmp_path / "class") / "submitted"
    write(root / "carol" / A01 / "submission_secret.txt", secret + "\n")
    write(root / "alice" / A02 / "submission_secret.txt", "../../etc/passwd")              # not a secret
    write(root / "dan" / A01 / f"{A01}.ipynb", notebook(A01, "dan"))
    write(root / "dan" / A01 / "mine" / "submission_secret.txt", secret)                  # the student's own file
    found = collect_all(root, ASSIGNMENTS)
    by_id = {s.student_id: s for s in found.students}
    assert by_id["carol"].secrets == {A01: secret}
    assert by_id["alice"].secrets == {} and by_id["dan"].secrets == {}
    assert (f"dan/{A01}/mine/submission_secret.txt", "not a notebook") in found.ignored
    assert not any(path.endswith(f"carol/{A01}/submission_secret.txt") for path, _ in found.ignored)


def test_two_zips_of_one_student_and_timestamp_txt_inside_a_zip(tmp_path):
    """The zips' own file times decide (issue 23: a timestamp.txt inside a student's zip once did;
    it is the student's, a note): the second zip is newer, though its timestamp.txt says otherwise."""
    root = tmp_path / "class"
    write_zip(root / "kim_111_1_work.zip", {f"{A01}.ipynb": (notebook(A01, "kim first"), (2026, 11, 18, 9, 0, 0))},
              at(2026, 11, 18, 9, 0))
    write_zip(root / "kim_111_2_work.zip", {
        f"kim/{A01}/{A01}.ipynb": (notebook(A01, "kim second"), (2026, 11, 1, 0, 0, 0)),
        f"kim/{A01}/timestamp.txt": ("2026-11-01 16:45:00.5 UTC", (2026, 11, 1, 0, 0, 0)),
    }, at(2026, 11, 19, 16, 45))
    found = collect_all(root, ASSIGNMENTS)
    (kim,) = found.students
    assert kim.student_id == "kim" and marker(kim.notebooks[A01]) == "kim second"
    assert kim.timestamps == {A01: at(2026, 11, 19, 16, 45)}
    assert kim.origins == {A01: f"kim_111_2_work.zip/kim/{A01}/{A01}.ipynb (the zip's file time)"}
    stamp = f"kim_111_2_work.zip/kim/{A01}/timestamp.txt"
    assert kim.problems == {
        A01: f"graded kim_111_2_work.zip/kim/{A01}/{A01}.ipynb (2026-11-19 16:45 UTC), "
             f"ignored kim_111_1_work.zip/{A01}.ipynb (older, 2026-11-18 09:00 UTC)",
        stamp: "says 2026-11-01 16:45 UTC: not used, a date inside a student's zip is not the platform's record; "
               "the submission time is the zip's file time (2026-11-19 16:45 UTC)"}
    assert [p for p, _ in found.ignored] == [f"kim_111_1_work.zip/{A01}.ipynb", stamp]


def test_two_canvas_users_of_the_same_name_are_two_students(tmp_path):
    root = tmp_path / "class"
    write(root / f"lee_1001_1_{A01}.ipynb", notebook(A01, "lee one"))
    write(root / f"lee_2002_2_{A01}.ipynb", notebook(A01, "lee two"))
    write(root / f"lee_2002_3_{A02}.ipynb", notebook(A02, "lee two 02"))
    by_id = {s.student_id: s for s in collect(root, ASSIGNMENTS)}
    assert sorted(by_id) == ["lee", "lee-2"]
    assert marker(by_id["lee"].notebooks[A01]) == "lee one"
    assert {a: marker(d) for a, d in by_id["lee-2"].notebooks.items()} == {A01: "lee two", A02: "lee two 02"}
    assert by_id["lee-2"].problems[f"lee_2002_2_{A01}.ipynb"].startswith(
        f"graded as student id 'lee-2', because 'lee_1001_1_{A01}.ipynb' is already graded as 'lee'")


def test_an_nbgrader_course_folder_grades_only_submitted(tmp_path):
    root = tmp_path / "course"
    write(root / "submitted" / "carol" / A01 / f"{A01}.ipynb", notebook(A01, "carol 01"))
    for folder in ("source", "release"):
        write(root / folder / A01 / f"{A01}.ipynb", notebook(A01, folder))
    for folder in ("autograded", "feedback"):
        write(root / folder / "carol" / A01 / f"{A01}.ipynb", notebook(A01, folder))
    write(root / "gradebook.db", b"SQLite format 3\0")
    found = collect_all(root, ASSIGNMENTS)
    assert [s.student_id for s in found.students] == ["carol"]
    ignored = dict(found.ignored)
    assert sorted(ignored) == ["autograded", "feedback", "gradebook.db", "release", "source"]
    assert ignored["autograded"] == "nbgrader's autograded/ folder, not a student's (students are read from submitted/)"


def test_an_unreadable_timestamp_txt_falls_back_to_the_file_time(tmp_path):
    root = tmp_path / "class"
    write(root / "submitted" / "carol" / A01 / f"{A01}.ipynb", notebook(A01), at(2026, 11, 20, 7, 0))
    write(root / "submitted" / "carol" / A01 / "timestamp.txt", "yesterday, around noon")
    found = collect_all(root, ASSIGNMENTS)
    (carol,) = found.students
    assert carol.timestamps == {A01: at(2026, 11, 20, 7, 0)}
    assert carol.origins == {A01: f"submitted/carol/{A01}/{A01}.ipynb (file time)"}
    ((path, why),) = found.ignored
    assert path == f"submitted/carol/{A01}/timestamp.txt" and "not a time nbgrader wrote" in why
    assert carol.problems == {path: why}  # on carol's row too, where the instructor reads her submission time


def test_a_submitted_tree_others_can_write_is_said_on_its_rows(tmp_path):
    """A red team's: `nbgrader submit` leaves its folders writable by every user and nbgrader's own collect kept
    that, so a student rewrote a classmate's collected timestamp.txt (on time -> 1 day late) and notebook, and
    their own (late -> on time), and the run said "graded without problems". Each row of such a tree says so (its
    time stays nbgrader's: the file times are no safer there); a tree written for its collector alone says nothing."""
    root = tmp_path / "class"
    for student in ("carol", "dave", "erin"):
        write(root / "submitted" / student / A01 / f"{A01}.ipynb", notebook(A01), at(2026, 11, 20, 7, 0))
        write(root / "submitted" / student / A01 / "timestamp.txt", "2026-11-19 09:00:00.000000 UTC")
    os.chmod(root / "submitted" / "dave" / A01, 0o777)
    os.chmod(root / "submitted" / "erin" / A01 / f"{A01}.ipynb", 0o666)
    found = {s.student_id: s for s in collect_all(root, ASSIGNMENTS).students}
    assert found["carol"].timestamps == {A01: at(2026, 11, 19, 9, 0)} and not found["carol"].problems
    for student, what in (("dave", f"{A01} can be written by every user (mode 0777)"),
                          ("erin", f"{A01}.ipynb can be written by every user (mode 0666)")):
        assert found[student].timestamps == {A01: at(2026, 11, 19, 9, 0)}
        (why,) = found[student].problems.values()
        assert why.startswith(f"{what}: another user could have changed this submission or its time"), why


@pytest.mark.skipif(os.geteuid() != 0, reason="a file owned by another user needs root to make")
def test_a_timestamp_txt_owned_by_a_student_is_said_on_the_row(tmp_path):
    import shutil

    root = tmp_path / "class"
    write(root / "submitted" / "carol" / A01 / f"{A01}.ipynb", notebook(A01), at(2026, 11, 20, 7, 0))
    write(root / "submitted" / "carol" / A01 / "timestamp.txt", "2026-11-19 09:00:00.000000 UTC")
    shutil.chown(root / "submitted" / "carol" / A01 / "timestamp.txt", "nobody")
    (carol,) = collect_all(root, ASSIGNMENTS).students
    (why,) = carol.problems.values()
    assert why.startswith("timestamp.txt belongs to nobody, not to whoever collected the submissions"), why


# --------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("name, who", [
    (f"grace_123456_7890_{A01}.ipynb", ("canvas", "grace", "123456", f"{A01}.ipynb")),
    (f"smithjane_LATE_42_7_{A02}-1.ipynb", ("canvas", "smithjane", "42", f"{A02}-1.ipynb")),
    ("smithjane_late_42_7_Untitled.ipynb", ("canvas", "smithjane", "42", "Untitled.ipynb")),
    (f"Jane Smith_1234_assignsubmission_file_{A01}.ipynb", ("moodle", "Jane Smith", "1234", f"{A01}.ipynb")),
    (f"Attention 1_jsmith_attempt_2026-11-20-14-03-11_{A01}.ipynb",
     ("blackboard", "jsmith", "", f"{A01}.ipynb")),
    (f"alice_{A01}.ipynb", ("plain", "alice", "", f"{A01}.ipynb")),
    (f"mary-jane-{A02}.ipynb", ("plain", "mary-jane", "", f"{A02}.ipynb")),
    ("s1234567_01 Similarity Attention (2).ipynb", ("plain", "s1234567", "", f"{A01}.ipynb")),
    (f"{A01}.ipynb", None),  # no student in it
    ("alice_01.ipynb", None),  # the assignment part must be a whole assignment name
    ("notes.ipynb", None),
])
def test_flat_file_names(name, who):
    flat = flat_name(name, ASSIGNMENTS)
    assert (flat and (flat.platform, flat.student, flat.user, flat.file)) == who


@pytest.mark.parametrize("text, when", [
    ("2026-11-20 14:03:11.123456 UTC", datetime(2026, 11, 20, 14, 3, 11, 123456, tzinfo=UTC)),
    (b"2026-11-20 14:03:11 UTC\n", at(2026, 11, 20, 14, 3, 11)),
    ("2026-11-20T15:03:11+01:00", at(2026, 11, 20, 14, 3, 11)),
    ("2026-11-20 14:03:11", at(2026, 11, 20, 14, 3, 11)),  # no zone: UTC, as nbgrader reads it
    ("not a date", None), (b"\xff\xfe", None), ("", None), (b"2026-11-20 " + b"9" * 2000, None),
])
def test_parse_timestamp(text, when):
    assert parse_timestamp(text) == when


# --------------------------------------------------------------------------- versions, junk, odd files
def test_versions_saved_together_go_by_name_order(tmp_path):
    """`cp -r` gives draft/ and final/ times microseconds apart, in any order: within 2 s, the last
    in name order is graded, and the note says the times were the same."""
    root = tmp_path / "class"
    write(root / "dave" / "final" / f"{A01}.ipynb", notebook(A01, "final"), at(2026, 11, 20, 14, 3, 10))
    write(root / "dave" / "draft" / f"{A01}.ipynb", notebook(A01, "draft"), at(2026, 11, 20, 14, 3, 11))
    found = collect_all(root, ASSIGNMENTS)
    (dave,) = found.students
    assert marker(dave.notebooks[A01]) == "final"
    assert dave.problems == {A01: f"graded dave/final/{A01}.ipynb (2026-11-20 14:03 UTC), ignored "
                                  f"dave/draft/{A01}.ipynb (same time, earlier in name order, 2026-11-20 14:03 UTC)"}
    assert found.ignored == [(f"dave/draft/{A01}.ipynb", f"another version of {A01} for student 'dave': graded "
                                                        f"dave/final/{A01}.ipynb (2026-11-20 14:03 UTC) instead")]


def test_moodle_folders_and_files_of_one_user_are_one_student(tmp_path):
    root = tmp_path / "class"
    write(root / "Jane Smith_1234_assignsubmission_file_" / f"{A01}.ipynb", notebook(A01, "folder"))
    write(root / f"Jane Smith_1234_assignsubmission_file_{A02}.ipynb", notebook(A02, "flat"))
    (jane,) = collect(root, ASSIGNMENTS)
    assert jane.student_id == "Jane_Smith" and sorted(jane.notebooks) == [A01, A02]
    renamed = "student id 'Jane Smith' renamed to 'Jane_Smith'"
    assert jane.problems == {"Jane Smith_1234_assignsubmission_file_": renamed}


def test_junk_links_and_odd_files_are_listed_the_first_hundred_one_by_one(tmp_path):
    root = tmp_path / "class"
    write(root / "mallory" / f"{A01}.ipynb", notebook(A01))
    for i in range(150):
        write(root / "mallory" / "data" / f"f{i:03}.bin", b"x")
    (root / "mallory" / f"{A02}.ipynb").symlink_to(root / "mallory" / f"{A01}.ipynb")
    (root / "mallory" / "elsewhere").symlink_to(tmp_path)
    os.mkfifo(root / "mallory" / "pipe.ipynb")
    (root / "trent.ipynb").symlink_to(root / "mallory" / f"{A01}.ipynb")
    found = collect_all(root, ASSIGNMENTS)
    (mallory,) = found.students
    assert list(mallory.notebooks) == [A01] and mallory.problems == {}
    ignored = dict(found.ignored)
    assert ignored[f"mallory/{A02}.ipynb"] == ignored["mallory/elsewhere"] == ignored["trent.ipynb"] == \
        "a symbolic link: not followed"
    assert ignored["mallory/pipe.ipynb"] == "not a regular file"
    junk = [p for p in ignored if p.startswith("mallory/data/")]
    assert len(junk) == 100 - 3 and all(ignored[p] == "not a notebook" for p in junk)
    assert ignored["mallory"] == "53 more files in it not graded (not listed one by one)"


def test_a_platforms_download_of_the_whole_class_left_zipped_is_not_one_student(tmp_path):
    root = tmp_path / "class"
    write_zip(root / "submissions.zip", {
        f"grace_123456_7890_{A01}.ipynb": (notebook(A01, "grace"), (2026, 11, 19, 1, 0, 0)),
        f"heidi_234567_7891_{A01}.ipynb": (notebook(A01, "heidi"), (2026, 11, 19, 2, 0, 0)),
    })
    found = collect_all(root, ASSIGNMENTS)
    (sub,) = found.students
    assert sub.student_id == "submissions" and sub.notebooks == {}
    why = ("zip not read: it holds the notebooks of 2 students as a learning platform names them ('grace', 'heidi'): "
           "unzip it into the class folder and grade again")
    assert sub.problems == {"submissions.zip": why} and found.ignored == [("submissions.zip", why)]


def test_a_notebook_handed_in_only_as_an_export_is_named_in_the_students_row(tmp_path):
    """An instructor's walkthrough: a student who handed in Jupyter's HTML (or .py) export of the notebook
    was 'missing' with no note, and one whose only file was a Canvas-named PDF had no row at all. The
    export is nothing to grade, but the row says what came in and what to ask for; beside the real notebook
    it is only listed."""
    root = tmp_path / "class"
    write(root / "alice" / f"{A01}.html", "<html>a notebook, exported</html>")
    write(root / "alice" / f"{A01}.py", "# exported\n")
    write(root / f"carol_{A01}.html", "<html></html>")  # the plain flat layout
    write(root / f"erin_77_88_{A01}.pdf", b"%PDF-1.4")  # as Canvas names it
    write(root / "dan" / f"{A01}.html", "<html></html>")
    write(root / "dan" / f"{A01}.ipynb", notebook(A01))
    write_zip(root / "frank.zip", {f"frank/{A02}.py": ("# exported", (2026, 11, 20, 10, 0, 0)),
                                   f"frank/{A01}.ipynb": (notebook(A01), (2026, 11, 20, 10, 0, 0))})
    write(root / "gina" / "homework.html", "<html></html>")  # names no assignment: only listed
    found = collect_all(root, ASSIGNMENTS)
    subs = {s.student_id: s for s in found.students}
    ignored = dict(found.ignored)

    assert not subs["alice"].notebooks
    assert set(subs["alice"].problems) == {f"{A01}.html", f"{A01}.py"}
    assert "an HTML export of 01_similarity_attention, not the notebook" in subs["alice"].problems[f"{A01}.html"]
    assert "a Python script export" in subs["alice"].problems[f"{A01}.py"]
    assert "ask the student for the .ipynb file" in ignored[f"alice/{A01}.py"]
    for who, name in (("carol", f"carol_{A01}.html"), ("erin", f"erin_77_88_{A01}.pdf")):
        assert not subs[who].notebooks and "not the notebook" in subs[who].problems[name], who
    assert subs["dan"].notebooks and not subs["dan"].problems  # the real one graded; the export only listed
    assert ignored[f"dan/{A01}.html"] == f"a copy of {A01} in another format: dan/{A01}.ipynb (file time) is graded"
    assert set(subs["frank"].notebooks) == {A01} and f"{A02}.py" in subs["frank"].problems
    assert ignored["gina/homework.html"] == "not a notebook" and not subs["gina"].problems


def test_checking_an_export_names_the_file_to_check(tmp_path):
    """`attn-course check 01_similarity_attention.html` said 'unreadable notebook: not valid JSON'."""
    from autograder.selfcheck import self_check

    path = write(tmp_path / f"{A01}.html", "<html>exported</html>")
    with pytest.raises(ValueError, match=rf"is an HTML export of {A01}, not the notebook.*attn-course check {A01}.ipynb"):
        self_check(path)
