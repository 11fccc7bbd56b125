"""An instructor's week, graded for real with the README's steps: the on-time folder, the late folder,
then the on-time folder again (a rerun keeps each student's newer submission and says so); a stray copy
of next week's notebook from one student (not put in play for the whole class, listed as not graded
with the reason); a student who is not on the roster (graded, and flagged on the console, in the notes
and in the report); an empty submissions folder (an error naming the folder and the layouts expected);
roster files with a wrong header, another separator, an empty or a repeated id (errors naming the line);
and PrairieLearn's score, rounded."""
from __future__ import annotations

import csv
import os
import zipfile
from datetime import datetime, timezone

import nbformat
import pytest

import autograder.grade
from autograder.grade import NotebookResult, grade
from autograder.lms import gradescope_result, prairielearn_result
from course_tools import cli

from .conftest import inject, solved_notebook
from .layout import NOTEBOOKS

A01, A02 = "01_similarity_attention", "02_queries_keys_values"
ON_TIME = datetime(2025, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()  # the week-1 uploads' file time
LATE = datetime(2025, 12, 3, 12, 0, tzinfo=timezone.utc).timestamp()  # the late uploads', after the due date
DUE = {A01: datetime(2025, 12, 1, 23, 59, tzinfo=timezone.utc)}  # past, whenever the suite runs
AGAIN = datetime(2025, 12, 8, 12, 0, tzinfo=timezone.utc).timestamp()  # week 2's download: everything, file times anew
NOT_YET = {A02: datetime(2099, 12, 8, 23, 59, tzinfo=timezone.utc)}  # a term's due-date file: 02 is not due yet
WRONG = {"dot_similarity": "def dot_similarity(E):\n    return E.T @ E"}  # one catalogued mistake: 16 / 17


def _put(folder, student, nb, when, name=A01) -> None:
    path = folder / student / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    os.utime(path, (when, when))


def _rows(out) -> dict[tuple[str, str], dict]:
    return {(r["student_id"], r["notebook"]): r for r in csv.DictReader((out / "grades.csv").open())}


@pytest.fixture(scope="module")
def week(course, tmp_path_factory):
    """week1/: ann (solved), ben (one mistake, and a stray copy of notebook 02), cat (solved); a roster
    of six (ann, ben, cat, and dan, eve, fay who hand in nothing); week1-late/: ann's newer upload (one
    mistake) and zed (not on the roster); then week1/ graded again, and with --assignment. Each run's
    console output is kept."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("week")
    good, wrong = solved_notebook(course, A01), inject(solved_notebook(course, A01), WRONG)
    week1, late, out = root / "week1", root / "week1-late", root / "out"
    _put(week1, "ann", good, ON_TIME)
    _put(week1, "ben", wrong, ON_TIME)
    _put(week1, "cat", good, ON_TIME)
    _put(week1, "ben", nbformat.read(NOTEBOOKS / A02 / f"{A02}.ipynb", as_version=4), ON_TIME, A02)
    _put(late, "ann", wrong, LATE)
    _put(late, "zed", good, LATE)
    roster = root / "roster.csv"
    roster.write_text("id,first_name\nann,Ann\nben,Ben\ncat,Cat\ndan,Dan\neve,Eve\nfay,Fay\n")
    dropped = root / "roster-week2.csv"  # fay dropped the class (she never handed anything in)
    dropped.write_text("id,first_name\nann,Ann\nben,Ben\ncat,Cat\ndan,Dan\neve,Eve\n")
    said = {}
    redownload = root / "week2"  # ann's late notebook again, unchanged, and ben's stray 02 again: one file each
    _put(redownload, "ann", wrong, AGAIN)
    _put(redownload, "ben", nbformat.read(NOTEBOOKS / A02 / f"{A02}.ipynb", as_version=4), AGAIN, A02)
    for step, folder, options in [("first", week1, dict(roster=roster, due=DUE)), ("late", late, {}),
                                  ("again", week1, {}), ("named", week1, dict(assignments=[A01])),
                                  ("redownload", redownload, dict(due=NOT_YET, roster=dropped))]:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            grade(folder, out, workers=2, **options)
        said[step] = buffer.getvalue()
        said[step + "-rows"] = _rows(out)
    return {"out": out, "said": said}


# --------------------------------------------------------------------------- 1. a rerun keeps the newer submission
@pytest.mark.slow
def test_rerunning_the_on_time_folder_keeps_the_late_resubmission_and_says_so(week):
    said = week["said"]
    assert said["first-rows"]["ann", A01]["score"] == "17"
    assert said["late-rows"]["ann", A01]["score"] == "16"  # the late upload replaced the on-time one
    again = said["again-rows"]["ann", A01]
    assert again["score"] == "16", "the rerun put ann's older on-time notebook back over her newer late one"
    assert again["submitted"].startswith("2025-12-03T12:00:00")
    assert "kept the newer submission graded earlier (1;" in said["again"]
    line = next(x for x in said["again"].splitlines() if x.strip().startswith(f"ann {A01}:"))
    assert f"ann/{A01}.ipynb" in line and "2025-11-30 12:00:00 UTC" in line and "2025-12-03 12:00:00 UTC" in line
    assert "--force --student ann" in line
    assert "1 kept: a grade of theirs over the file here" in said["again"]


# --------------------------------------------------------------------------- 2. a stray notebook is not in play
@pytest.mark.slow
def test_one_students_stray_notebook_is_not_everyones_zero_and_is_listed(week):
    said, out = week["said"], week["out"]
    for step in ("first", "late", "again"):
        assert {n for _, n in said[step + "-rows"]} == {A01}, step
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    assert A02 not in wide["ann"] and wide["ann"]["max_total"] == "17"
    first = said["first"]
    assert f"in play: {A01} (due 2025-12-01 23:59 UTC; handed in by 3 of 3 students here)" in first
    stray = next(x for x in first.splitlines() if x.strip().startswith(f"ben/{A02}.ipynb:"))
    assert "handed in by only 1 of the 6 students of the class (1 of 3 here)" in stray
    assert f"--due {A02}=DATE" in stray and f"--assignment {A02}" in stray


@pytest.mark.slow
def test_a_stray_notebook_tied_with_the_folders_only_other_one_and_not_yet_due_stays_out(week):
    """A later folder of two files, ann's 01 and ben's 02: a tie for 'most handed in' and one student in six
    for 02, which the due-date file dates in 2099. 02 stays out of play (the instructor review found it put
    in play, a column of zeros in every export, and kept there by every later run)."""
    said, out = week["said"], week["out"]
    assert {n for _, n in said["redownload-rows"]} == {A01}
    line = next(x for x in said["redownload"].splitlines() if x.strip().startswith(f"ben/{A02}.ipynb:"))
    assert "due 2099-12-08 23:59 UTC, not yet" in line and f"--assignment {A02}" in line
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    assert A02 not in wide["ann"] and wide["ann"]["max_total"] == "17"


@pytest.mark.slow
def test_a_notebook_downloaded_again_unchanged_keeps_its_grade_and_time(week):
    """Week 2's download holds ann's late 01 again, the same bytes with a new file time: graded as before,
    at its first submission time (the review saw 15.3 become 5.1, six days late, without a word)."""
    said = week["said"]
    row = said["redownload-rows"]["ann", A01]
    assert row["score"] == "16" and row["submitted"].startswith("2025-12-03T12:00:00"), row
    assert "(0 graded now" in said["redownload"], said["redownload"]


@pytest.mark.slow
def test_a_student_dropped_from_the_roster_who_handed_in_nothing_has_no_rows(week):
    """fay, on the first roster, never handed anything in and is not on week 2's: her rows of zeros (noted
    'not on the roster: graded all the same') made every run exit 1. Now she has no rows, and the run
    names her; zed, not on either roster but graded, keeps his rows and his flag."""
    said = week["said"]
    assert "fay" in {sid for sid, _ in said["first-rows"]} and "fay" not in {sid for sid, _ in said["redownload-rows"]}
    assert any(line.startswith("not on the roster and nothing handed in (1;") and line.endswith(": fay")
               for line in said["redownload"].splitlines()), said["redownload"]
    zed = said["redownload-rows"]["zed", A01]
    assert zed["score"] == "17" and "not on the roster" in zed["notes"]
    assert "dan" in {sid for sid, _ in said["redownload-rows"]}  # on the roster, nothing handed in: still missing


def test_a_folder_with_no_notebook_and_a_student_named_wrong_are_errors(tmp_path, course):
    """A folder of text files only, and --student with an id that is not in the folder (case differs): both
    graded nobody and exited 0; now each is an error naming what is wrong (the CLI exits 2)."""
    junk = tmp_path / "junk"
    (junk / "alice").mkdir(parents=True)
    (junk / "readme.txt").write_text("hello")
    (junk / "alice" / "notes.txt").write_text("my notes")
    with pytest.raises(autograder.grade.NothingToGrade, match="nothing to grade in"):
        grade(junk, tmp_path / "out1")
    folder = tmp_path / "week"
    _put(folder, "alice", solved_notebook(course, A01), ON_TIME)
    with pytest.raises(autograder.grade.NothingToGrade, match="no submission .* for 'Alice' \\(did you mean 'alice'\\?\\)"):
        grade(folder, tmp_path / "out2", students=["Alice"])


@pytest.mark.slow
def test_with_assignment_the_file_left_out_is_listed_as_not_graded(week):
    named = week["said"]["named"]
    assert "not graded (1 file;" in named
    line = next(x for x in named.splitlines() if x.strip().startswith(f"ben/{A02}.ipynb:"))
    assert f"this run grades only {A01} (--assignment)" in line and f"--assignment {A02}" in line


# --------------------------------------------------------------------------- 3. not on the roster
@pytest.mark.slow
def test_a_student_not_on_the_roster_is_graded_and_flagged(week):
    said, out = week["said"], week["out"]
    zed = _rows(out)["zed", A01]
    assert zed["score"] == "17" and "not on the roster" in zed["notes"]
    assert "not on the roster" not in _rows(out)["ann", A01]["notes"]
    assert any(x.startswith("not on the roster (1;") and "zed" in x for x in said["late"].splitlines())
    from autograder import report

    page = (out / "report.html").read_text()
    attention = page.split('id="attention"')[1].split("</table>")[0]
    assert "zed" in attention and getattr(report, "NOT_ON_ROSTER", "not on the roster") in attention
    assert "ann" not in attention.split("zed")[0].split("<tr")[-1]
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    assert wide["zed"][A01] == "17"  # graded and exported: never lost


def test_an_id_that_differs_from_a_roster_id_only_in_case_is_named_never_merged(course, tmp_path, capsys):
    """An instructor's first week (finding 2): a folder Alice/ and the roster id alice were two students, Alice 17
    "not on the roster" and alice missing with a 0, and nothing said why. They stay two (a grade under a wrong id is
    worse than a clear message), and the console's "not on the roster" line, the notes column, the report and the
    export name the roster id that differs only in case."""
    subs, out, roster = tmp_path / "subs", tmp_path / "out", tmp_path / "roster.csv"
    _put(subs, "Alice", solved_notebook(course, A01), ON_TIME)
    roster.write_text("id\nalice\nbob\n")
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--roster", str(roster),
                     "--assignment", A01]) == 1  # alice and bob: missing
    said = capsys.readouterr().out
    line = next(x for x in said.splitlines() if x.startswith("not on the roster (1;"))
    assert "Alice (the roster has 'alice': the ids differ only in case)" in line and "ids are exact" in line, line
    rows = _rows(out)
    assert rows["Alice", A01]["score"] == "17" and rows["alice", A01]["status"].startswith("missing"), rows
    assert "the roster has 'alice', which differs from this id only in case" in rows["Alice", A01]["notes"], rows
    assert "the roster has" not in rows["bob", A01]["notes"]
    attention = (out / "report.html").read_text().split('id="attention"')[1].split("</table>")[0]
    assert "the roster has &#39;alice&#39;, which differs from this id only in case" in attention, attention
    from autograder import lms

    problems = lms.export(out, "moodle").problems
    [alice] = [p for p in problems if p.startswith("Alice: not on the class roster")]
    assert "the roster has 'alice', which differs from it only in case" in alice, alice


# --------------------------------------------------------------------------- 4. an empty folder
@pytest.mark.parametrize("junk", [False, True])
def test_an_empty_submissions_folder_is_an_error_naming_it_and_the_layouts(tmp_path, capsys, junk):
    folder = tmp_path / "week1"
    folder.mkdir()
    if junk:
        (folder / "notes.txt").write_text("not a submission")
    code = cli.main(["grade", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code != 0
    assert f"nothing to grade in {folder}" in err
    assert "one sub-folder per student" in err and "submitted/<student_id>/<assignment>/" in err
    if junk:
        assert "notes.txt" in err
    else:
        assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- 5. roster problems
@pytest.mark.parametrize("text, message", [
    ("id\nann\nben\nann\n", "line 4 repeats student id 'ann' (first on line 2): keep one line per student"),
    ("id,first_name\nann,Ann\n,Ben\n", "line 3 has no student id"),
    ("student_id,name\nann,A\n", "needs a header row with an 'id' column (found: student_id, name) on line 1"),
    # a red team's: a last name from the LMS holding U+2028 added a roster row, bob's email on a phantom's line
    ("id,first_name,last_name,email\nbob,Bob,Jones,bob@uni.example\n"
     "mal,Mal,\"Lory\u2028zz-bob,Bob,Jones,bob@uni.example\",mal@uni.example\n",
     "line 3 holds a control character or line break inside a field (U+2028"),
    ("id,first_name\nann,\"An\nn\"\n", "line 3 holds a control character or line break inside a field (U+000A"),
    ("id\nann\nAnn\n=ann\n", "line 4 repeats student id 'ann' ('ann' on line 2 and '=ann' here both read as it) "
                               "(first on line 2)"),
])
def test_a_bad_roster_is_an_error_naming_the_line_and_what_to_do(tmp_path, capsys, never_grade, text, message):
    roster = tmp_path / "roster.csv"
    roster.write_text(text)
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    code = cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--roster", str(roster)])
    err = capsys.readouterr().err
    assert code == 2 and "--roster" in err and message in err, err
    assert not (tmp_path / "out").exists()
    from autograder.grade import RosterError, read_roster

    with pytest.raises(RosterError, match="roster.csv"):  # the same check when the roster reaches the gradebook
        read_roster(roster)


@pytest.mark.parametrize("text", ["ID;first_name;email\nann;Ann;a@x\nben;Ben;b@x\n",
                                  "Id,First_Name\nann,Ann\n\nben,Ben\n", "id\tfirst_name\nann\tAnn\nben\tBen\n"])
def test_a_roster_with_ID_semicolons_or_tabs_is_read(tmp_path, capsys, fake_grade, text):
    roster = tmp_path / "roster.csv"
    roster.write_text(text)
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    code = cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--roster", str(roster)])
    assert code == 0, capsys.readouterr().err
    assert fake_grade.calls[0][2]["roster"] == roster
    from autograder.grade import read_roster

    rows = read_roster(roster)  # what import_roster puts into the gradebook
    assert [r["id"] for r in rows] == ["ann", "ben"] and rows[0]["first_name"] == "Ann"


def test_a_roster_is_read_as_the_grader_reads_folders(tmp_path):
    """A red team's honest rosters: an id a folder of that name is graded under ('alice+cs@u.edu' is graded as
    'alice_cs@u.edu': refused before, it now reads the same), and a line break inside a column the grader never
    reads (an address) is the LMS's own business."""
    from autograder.grade import read_roster
    from autograder.submissions import student_id_for

    roster = tmp_path / "roster.csv"
    roster.write_text('id,first_name,address,email\nalice+cs@u.edu,Alice,"1 Main St\nSpringfield",a@u.edu\n'
                      'Zoé Li,Zoé,,z@u.edu\n', encoding="utf-8")
    rows = read_roster(roster)
    assert [r["id"] for r in rows] == ["alice_cs@u.edu", "Zoe_Li"] == [student_id_for("alice+cs@u.edu"),
                                                                        student_id_for("Zoé Li")]


# --------------------------------------------------------------------------- 6. exports' numbers
def test_prairielearn_and_gradescope_scores_are_rounded():
    r = NotebookResult("zed", A01, 17.0, 17.0, late_penalty=3.4)
    assert prairielearn_result(r)["score"] == 0.8
    assert repr(prairielearn_result(r)["score"]) == "0.8"
    r = NotebookResult("ann", A01, 16.0, 17.0, late_penalty=0.1 + 0.2)
    assert repr(gradescope_result(r)["score"]) == "15.7"


# --------------------------------------------------------------------------- files the grader cannot read
def test_a_notebook_the_grader_cannot_read_is_its_own_incident_never_a_missing_0(course):
    """An upload kept 0600 by another account (an LMS sync run as root, a TA's copy): it was graded
    "missing: no notebook was submitted" and exported as 0. It is the grader's incident: no score in any
    export, the paths and what to do in its detail, and graded once it can be read."""
    import shutil

    from autograder.grade import grade as grade_class

    from .setups import ordinary_user, run_as, scratch_dir

    user = ordinary_user()
    if user is None:
        pytest.skip("needs root and an ordinary user (`.ci/run` makes one)")
    base = scratch_dir()
    try:
        subs, out = base / "subs", base / "out"
        for student in ("ann", "bob", "cat"):
            (subs / student).mkdir(parents=True)
            nbformat.write(solved_notebook(course, A01), subs / student / f"{A01}.ipynb")
        with zipfile.ZipFile(subs / "dan.zip", "w") as zf:
            zf.writestr(f"{A01}.ipynb", nbformat.writes(solved_notebook(course, A01)))
        eve = subs / "submitted" / "eve" / A01
        eve.mkdir(parents=True)
        nbformat.write(solved_notebook(course, A01), eve / f"{A01}.ipynb")
        (eve / "timestamp.txt").write_text("2026-11-20 10:00:00.000000 UTC")
        for folder in (subs, *(p for p in subs.rglob("*") if p.is_dir())):
            folder.chmod(0o755)
        for file in (p for p in subs.rglob("*") if p.is_file()):
            file.chmod(0o644)
        (subs / "bob" / f"{A01}.ipynb").chmod(0o600)  # root's file: the ordinary user cannot open it
        (subs / "cat").chmod(0o700)  # root's folder: the ordinary user cannot list it
        (subs / "dan.zip").chmod(0o600)  # root's zip
        (eve / "timestamp.txt").chmod(0o600)  # nbgrader's stamp, unreadable: eve is graded by her file's time
        base.chmod(0o777)
        found = run_as(user, f"""
            from pathlib import Path
            from autograder.grade import grade
            rs = grade(Path({str(subs)!r}), Path({str(out)!r}), progress=False, workers=1, assignments=[{A01!r}])
            print(json.dumps({{r.student_id: [r.status.value, r.score, r.detail] for r in rs}}))
            """, sandbox="bubblewrap")
        assert found["ann"][:2] == ["ok", 17] and found["eve"][:2] == ["ok", 17], found
        for student, path in (("bob", f"bob/{A01}.ipynb"), ("cat", "cat"), ("dan", "dan.zip")):
            status, _, detail = found[student]
            assert status == "grader incident", found
            assert path in detail and "Permission denied" in detail and "not the student's" in detail, detail
        rows = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
        assert rows["bob"][A01] == "" and rows["cat"][A01] == "" and rows["ann"][A01] == "17", rows
        assert (rows["bob"]["total"], rows["bob"]["max_total"]) == ("0", "0"), rows  # an empty cell counts in neither

        notes = {r["student_id"]: r["notes"] for r in csv.DictReader((out / "grades.csv").open())}
        assert "timestamp.txt: could not be read by the account grading (Permission denied)" in notes["eve"], notes
        for path in (subs / "cat", subs / "bob" / f"{A01}.ipynb", subs / "dan.zip"):  # readable now: graded next run
            path.chmod(0o755 if path.is_dir() else 0o644)
        again = {r.student_id: r for r in grade_class(subs, out, progress=False, workers=1, assignments=[A01])}
        assert again["bob"].score == again["cat"].score == again["dan"].score == 17, again
        assert again["bob"].status.value == "ok"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_folder_above_the_class_folder_is_refused_before_it_makes_students_of_weeks(course, tmp_path, capsys):
    """An instructor gave `parent/` (holding week1/ and week1-late/) instead of `parent/week1/`: two students
    'week1' and 'week1-late' were graded, every enrolled student was missing, and the two strangers stayed
    in every table and export. With a roster in force (given now or kept from an earlier run), a folder none
    of whose students is on it is refused before anything is written."""
    from autograder.grade import NothingToGrade

    parent, out = tmp_path / "parent", tmp_path / "out"
    for week, student in (("week1", "ann"), ("week1", "ben"), ("week1-late", "cat")):
        (parent / week / student).mkdir(parents=True, exist_ok=True)
        nbformat.write(solved_notebook(course, A01), parent / week / student / f"{A01}.ipynb")
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nann\nben\ncat\n")
    with pytest.raises(NothingToGrade, match="Is .*parent the folder above the class folder"):
        grade(parent, out, progress=False, workers=1, roster=roster)
    assert not (out / "grades.csv").exists()
    assert {r.student_id for r in grade(parent / "week1", out, progress=False, workers=1, roster=roster)} == \
        {"ann", "ben", "cat"}
    assert cli.main(["grade", str(parent), "--out", str(out)]) == 2  # the roster kept from the first run
    err = capsys.readouterr().err
    assert "none of the 2 students found in" in err and "(week1, week1-late)" in err and "nothing was graded" in err
    with open(out / "grades_wide.csv") as fh:
        assert {row["student_id"] for row in csv.DictReader(fh)} == {"ann", "ben", "cat"}
    # a folder holding only a student who enrolled late (not on the roster yet) is a class folder: graded
    (tmp_path / "late-enrolled" / "dave").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), tmp_path / "late-enrolled" / "dave" / f"{A01}.ipynb")
    graded = {r.student_id: r for r in grade(tmp_path / "late-enrolled", out, progress=False, workers=1)}
    assert graded["dave"].score == 17 and any("not on the roster" in n for n in graded["dave"].notes), graded["dave"]


def test_before_the_due_date_a_notebook_not_handed_in_is_not_missing_yet(course, tmp_path, capsys):
    """Grading the early submissions two days before the due date made everyone else 'missing', with a 0
    in every table and export and exit status 1. Until the due date it is 'not handed in yet': no score,
    not a problem; once the due date has passed (here: moved into the past), it is missing as before."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    (subs / "ann").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), subs / "ann" / f"{A01}.ipynb")
    roster = tmp_path / "roster.csv"
    (subs / "ben").mkdir()
    (subs / "ben" / "notes.txt").write_text("to do")  # ben's folder, his notebook not in it yet
    roster.write_text("id\nann\nben\n")
    args = ["grade", str(subs), "--out", str(out), "--roster", str(roster), "--assignment", A01]
    assert cli.main([*args, "--due", f"{A01}=2099-12-01T23:59:00Z"]) == 0, capsys.readouterr().err
    said = capsys.readouterr()
    assert "2 students: 1 notebook (1 graded now, 0 reused from earlier runs), 1 not handed in yet (not due)" in said.out
    assert said.out.splitlines()[-1] == ("1 of 2 notebooks of 2 students graded without problems; 1 not handed "
                                         "in yet (before the due date)"), said.out
    report = (out / "report.html").read_text()
    assert f"{A01}: not handed in yet (due 2099-12-01T23:59:00Z)" in report and "0 missing, 1 not handed in yet" in report
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    # no 0 and not 'missing' before the due date, as in grades_wide.csv and the exports (was 'missing: not handed...')
    assert rows["ben"]["status"] == "not handed in yet: due 2099-12-01T23:59:00Z", rows["ben"]
    assert rows["ben"]["score"] == "", rows["ben"]
    assert rows["ben"]["due"] == "2099-12-01T23:59:00Z"
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    assert wide["ben"][A01] == "" and wide["ann"][A01] == "17"
    assert cli.main(["export", str(out), "--to", "moodle"]) == 1  # no e-mail addresses: listed, not a 0 for ben
    assert {r["Student ID"]: r[A01] for r in csv.DictReader((out / "lms" / "moodle.csv").open())}["ben"] == ""
    capsys.readouterr()

    assert cli.main([*args, "--due", f"{A01}=2020-12-01T23:59:00Z"]) == 1  # the due date has passed
    assert "1 missing" in capsys.readouterr().err
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows["ben"]["status"] == "missing: no notebook for this assignment was submitted", rows["ben"]
    assert {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}["ben"][A01] == "0"


def test_a_student_graded_by_mistake_is_taken_out_with_everything_kept_aside(course, tmp_path, capsys):
    """Students graded by mistake (a test account, the folder above the class folder graded as 'week1')
    stayed in every table and export, and nothing took them out. `remove-student` says what it would do,
    then, with --yes, takes them out of the gradebook and every output, keeping their files aside."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student in ("ann", "week1"):
        (subs / student).mkdir(parents=True)
        nbformat.write(solved_notebook(course, A01), subs / student / f"{A01}.ipynb")
    grade(subs, out, progress=False, workers=1, assignments=[A01])
    before = sorted(p.relative_to(out) for p in out.rglob("*") if "week1" in p.parts)
    assert before, "the grader kept nothing of week1's"

    assert cli.main(["remove-student", str(out), "week"]) == 2
    err = capsys.readouterr().err
    assert "not in the gradebook of" in err and "(did you mean 'week1'?)" in err, err
    assert cli.main(["remove-student", str(out), "week1"]) == 2  # no --yes: nothing changed
    said = capsys.readouterr()
    assert "week1: would be taken out of the gradebook" in said.out and "--yes" in said.err
    assert sorted(p.relative_to(out) for p in out.rglob("*") if "week1" in p.parts) == before

    assert cli.main(["remove-student", str(out), "week1", "--yes"]) == 0
    assert "week1: out of the gradebook; students/week1" in capsys.readouterr().out
    for table in ("grades.csv", "grades_wide.csv"):
        assert {r["student_id"] for r in csv.DictReader((out / table).open())} == {"ann"}, table
    assert "week1" not in (out / "report.html").read_text()
    [kept] = (out / "removed" / "week1").iterdir()
    assert (kept / "students" / "week1" / f"{A01}.json").is_file()  # nothing lost: kept aside
    assert (kept / "feedback" / "week1" / f"{A01}.html").is_file()
    assert cli.main(["export", str(out), "--to", "gradescope"]) == 0
    assert {p.name for p in (out / "lms" / "gradescope").iterdir()} == {"ann"}
    capsys.readouterr()

    # the next run over the same folder (their files still in it): left out, and said; an instructor's walkthrough
    # found them graded again and back in every export
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1"]) == 0
    said = capsys.readouterr().out
    assert said.count("not graded: taken out of this class with remove-student (1; ") == 1, said
    assert ": week1; to grade one of them again, name them: --student ID" in said, said
    assert {r["student_id"] for r in csv.DictReader((out / "grades.csv").open())} == {"ann"}
    # ... until the instructor names them
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--student", "week1"]) == 0
    assert {r["student_id"] for r in csv.DictReader((out / "grades.csv").open())} == {"ann", "week1"}
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1"]) == 0
    assert "taken out of this class" not in capsys.readouterr().out


def test_ctrl_c_while_grading_says_at_once_what_happens_then_what_was_kept(course, tmp_path, capsys, monkeypatch):
    """Ctrl-C in the middle of a class printed twenty lines of KeyboardInterrupt, after the notebooks in
    their sandboxes had finished. Now the stop is said at once, then what was kept; the next run grades all."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student in ("ann", "ben"):
        (subs / student).mkdir(parents=True)
        nbformat.write(solved_notebook(course, A01), subs / student / f"{A01}.ipynb")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as the instructor's Ctrl-C reaches the run

    monkeypatch.setattr(autograder.grade, "grade_one", interrupted)
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1"]) == 130
    err = capsys.readouterr().err
    assert "stopping (Ctrl-C): no other notebook is started" in err, err
    assert "interrupted (Ctrl-C). Every notebook graded so far is kept" in err and "Traceback" not in err, err
    monkeypatch.undo()
    assert {r.student_id: r.score for r in grade(subs, out, progress=False, workers=1)} == {"ann": 17, "ben": 17}


def test_an_extension_for_one_student_changes_their_lateness_everywhere_without_grading_again(course, tmp_path, capsys):
    """The README said "extensions given in formgrader", which has no such field (an instructor's walkthrough):
    `attn-course extend` gives one, and the penalty, the due column and the exports follow at once."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    two_days_late = datetime(2025, 12, 3, 20, 0, tzinfo=timezone.utc).timestamp()
    for student in ("ann", "ben"):
        (subs / student).mkdir(parents=True)
        nbformat.write(solved_notebook(course, A01), subs / student / f"{A01}.ipynb")
        os.utime(subs / student / f"{A01}.ipynb", (two_days_late, two_days_late))
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--due", f"{A01}=2025-12-01T23:59:00Z",
                     "--late-penalty", "per-day:10"]) == 0
    capsys.readouterr()

    def penalties():
        rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
        return {s: (float(r["late_penalty"]), r["due"][:16]) for s, r in rows.items()}

    assert penalties() == {"ann": (3.4, "2025-12-01T23:59"), "ben": (3.4, "2025-12-01T23:59")}  # 2 days late: 20%

    assert cli.main(["extend", str(out), "ann", A01, "--days", "3"]) == 0
    said = capsys.readouterr().out
    assert f"ann {A01}: due 2025-12-04 23:59 UTC for them (the class's: 2025-12-01 23:59 UTC)" in said, said
    assert penalties() == {"ann": (0.0, "2025-12-04T23:59"), "ben": (3.4, "2025-12-01T23:59")}
    assert {r["student_id"]: r[A01] for r in csv.DictReader((out / "grades_wide.csv").open())} == \
        {"ann": "17", "ben": "13.6"}
    page = (out / "feedback" / "ann" / f"{A01}.html").read_text()
    assert "(Score: 17 / 17)" in page
    # said where it shows (instructors' first weeks: only grades.csv's due column differed): ann's page, her row's
    # notes, her cell of the report; not ben's
    assert "(your own due date, an extension: the class's was 2025-12-01 23:59 UTC)" in page, page[:3000]
    assert "an extension" not in (out / "feedback" / "ben" / f"{A01}.html").read_text()
    notes = {r["student_id"]: r["notes"] for r in csv.DictReader((out / "grades.csv").open())}
    assert "extension: due 2025-12-04 23:59 UTC (the class's: 2025-12-01 23:59 UTC)" in notes["ann"], notes
    assert "extension" not in notes["ben"], notes
    report = (out / "report.html").read_text()
    ann = report[report.index('id="student-ann"'):]
    assert "extension: due 2025-12-04 23:59 UTC" in ann[:ann.index("</tr>")]

    assert cli.main(["extend", str(out), "ann", A01, "--days", "1"]) == 0  # replaces the first: still 1 day late
    assert penalties()["ann"] == (1.7, "2025-12-02T23:59")
    assert cli.main(["extend", str(out), "ann", A01]) == 0  # taken back
    assert "ann 01_similarity_attention: no extension now" in capsys.readouterr().out
    assert penalties()["ann"] == (3.4, "2025-12-01T23:59")
    assert "extension" not in {r["student_id"]: r["notes"] for r in csv.DictReader((out / "grades.csv").open())}["ann"]

    assert cli.main(["extend", str(out), "cat", A01, "--days", "2"]) == 2  # nobody of that id
    assert f"no student 'cat' in {out} (the ids are those of grades.csv" in capsys.readouterr().err
    assert cli.main(["extend", str(out), "anne", A01, "--days", "2"]) == 2  # a typo: the id it was meant to be
    assert "no student 'anne'" in (err := capsys.readouterr().err) and "did you mean ann?" in err, err
    assert cli.main(["extend", str(out), "ann", "01_similarity", "--days", "2"]) == 2
    assert f"no notebook '01_similarity' in {out}; its notebooks: " in capsys.readouterr().err

    # a class graded without a due date: nothing to extend, refused before nbgrader stores one (a review found the
    # stored extension broke every later export and grade of the class)
    undated = tmp_path / "undated"
    assert cli.main(["grade", str(subs), "--out", str(undated), "--workers", "1"]) == 0
    capsys.readouterr()
    assert cli.main(["extend", str(undated), "ann", A01, "--days", "2"]) == 2
    assert f"{A01} has no due date in {undated}" in capsys.readouterr().err
    assert cli.main(["export", str(undated), "--to", "gradescope"]) == 0


def test_gradescope_and_prairielearn_exports_name_a_student_not_on_the_roster(course, tmp_path, capsys):
    """An instructor's walkthrough: zed, not on the roster, was flagged by the Canvas and Moodle exports and passed
    silently into Gradescope's and PrairieLearn's files."""
    from autograder import lms

    subs, out, roster = tmp_path / "subs", tmp_path / "out", tmp_path / "roster.csv"
    roster.write_text("id\nann\n")
    for sid in ("ann", "zed"):
        (subs / sid).mkdir(parents=True)
        nbformat.write(solved_notebook(course, A01), subs / sid / f"{A01}.ipynb")
    cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--roster", str(roster)])
    capsys.readouterr()
    for to in ("gradescope", "prairielearn"):
        problems = lms.export(out, to).problems
        assert [p for p in problems if "roster" in p] == [
            "zed: not on the class roster (graded all the same): their results.json files are written under this id; "
            "check whose folder or file this is before handing them on"], (to, problems)


def test_an_extension_waiting_for_a_hand_in_makes_the_row_not_due_yet_instead_of_a_0(course, tmp_path, capsys):
    """An instructor's walkthrough: frank's extension, given before he handed in, put his own due date in the future,
    but his row still said missing against the class's due date, and every export sent him a 0."""
    subs, out, roster = tmp_path / "subs", tmp_path / "out", tmp_path / "roster.csv"
    roster.write_text("id\nann\nfrank\n")
    (subs / "ann").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), subs / "ann" / f"{A01}.ipynb")
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--roster", str(roster),
                     "--due", f"{A01}=2020-12-01T23:59:00Z"]) == 1  # frank: missing, the due date long past
    assert cli.main(["extend", str(out), "frank", A01, "--days", "36500"]) == 0  # his own due date: in 2120
    capsys.readouterr()
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    # an instructor's first week (finding 9): 'score 0' and 'missing: not handed in yet' there, never a 0 elsewhere
    assert rows["frank"]["status"] == "not handed in yet: due 2120-11-07T23:59:00Z", rows["frank"]
    assert rows["frank"]["score"] == "", rows["frank"]
    assert {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}["frank"][A01] == ""
    assert cli.main(["export", str(out), "--to", "moodle"]) == 1  # no e-mail addresses: listed, not a 0 for frank
    assert {r["Student ID"]: r[A01] for r in csv.DictReader((out / "lms" / "moodle.csv").open())}["frank"] == ""
    assert cli.main(["extend", str(out), "frank", A01, "--days", "0"]) == 0  # taken back: missing, a 0
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows["frank"]["status"] == "missing: no notebook for this assignment was submitted", rows["frank"]


def test_an_extension_given_before_the_student_hands_in_is_given_when_they_do(course, tmp_path, capsys):
    """An instructor's walkthrough: `extend` refused a student who had not handed in yet ("grade their notebook
    first"), so frank, ill until after the due date, could not be given his extension in time. It now waits, and
    his notebook, 1.5 days late, is on time for him when it is graded."""
    subs, late, out, roster = tmp_path / "subs", tmp_path / "late", tmp_path / "out", tmp_path / "roster.csv"
    roster.write_text("id\nann\nfrank\n")
    (subs / "ann").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), subs / "ann" / f"{A01}.ipynb")
    assert cli.main(["grade", str(subs), "--out", str(out), "--workers", "1", "--roster", str(roster),
                     "--due", f"{A01}=2025-12-01T23:59:00Z", "--late-penalty", "per-day:10"]) == 1  # frank: missing
    capsys.readouterr()
    assert cli.main(["extend", str(out), "frank", A01, "--days", "2"]) == 0
    said = capsys.readouterr().out
    assert f"frank {A01}: due 2025-12-03 23:59 UTC for them" in said and "nothing of theirs is graded yet" in said
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows["frank"]["status"].startswith("missing")
    (late / "frank").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), late / "frank" / f"{A01}.ipynb")
    when = datetime(2025, 12, 3, 12, 0, tzinfo=timezone.utc).timestamp()  # 1.5 days after the class's due date
    os.utime(late / "frank" / f"{A01}.ipynb", (when, when))
    assert cli.main(["grade", str(late), "--out", str(out), "--workers", "1"]) == 0
    rows = {r["student_id"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert (rows["frank"]["score"], rows["frank"]["late_penalty"], rows["frank"]["due"][:16]) == \
        ("17", "0", "2025-12-03T23:59"), rows["frank"]
    assert not (out / "extensions-pending.json").exists() or "frank" not in (out / "extensions-pending.json").read_text()
