"""Reruns an instructor makes, graded for real: a plain run after an override (`--force --student S
--assignment A`) keeps the override's grade and time, whatever folder of files graded before it reads
(and a file never seen before is still graded); a Canvas `_LATE_` upload keeps its recorded time on a
rerun without --due; the summary counts only notebooks graded, and names the missing ones apart; a
grading folder copied elsewhere (`cp -a OUT OUT2`, the original then moved away) grades into itself."""
from __future__ import annotations

import contextlib
import csv
import io
import os
import shutil
import subprocess
from datetime import datetime, timezone

import nbformat
import pytest

from autograder.grade import grade
from course_tools import cli

from .conftest import inject, solved_notebook
from .layout import REPO

pytestmark = pytest.mark.slow

A01, A02 = "01_similarity_attention", "02_queries_keys_values"
ON_TIME = datetime(2025, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()
LATE = datetime(2025, 12, 3, 12, 0, tzinfo=timezone.utc).timestamp()
AGAIN = datetime(2025, 12, 8, 12, 0, tzinfo=timezone.utc).timestamp()  # a new download of everything
LATER = datetime(2025, 12, 10, 12, 0, tzinfo=timezone.utc).timestamp()  # a third upload, never seen before
DUE = {A01: datetime(2025, 12, 1, 23, 59, tzinfo=timezone.utc)}
WRONG = {"dot_similarity": "def dot_similarity(E):\n    return E.T @ E"}  # 16 / 17
BLANK = {"dot_similarity": "def dot_similarity(E):\n    raise NotImplementedError()"}  # 16 / 17 too


def _put(path, nb, when=ON_TIME) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    os.utime(path, (when, when))


def _rows(out) -> dict[tuple[str, str], dict]:
    return {(r["student_id"], r["notebook"]): r for r in csv.DictReader((out / "grades.csv").open())}


def _graded(folder, out, **options) -> str:
    """grade() as `attn-course grade` runs it; what it printed."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        grade(folder, out, workers=2, **options)
    return buffer.getvalue()


# --------------------------------------------------------------------------- 1. an override stays
@pytest.fixture(scope="module")
def override(course, tmp_path_factory):
    """week1/ (ann solved, ben one mistake), week1-late/ (ann's newer upload, one mistake), week1/ again
    (ann's late grade kept), then the instructor's override: ann's on-time file graded instead. After it,
    plain runs of week1-late/, of a new download of everything (ann's late file, a new file time) and of
    week1/; then ann uploads a third notebook, never seen before. Each step's rows and console kept."""
    root = tmp_path_factory.mktemp("override")
    good, wrong = solved_notebook(course, A01), inject(solved_notebook(course, A01), WRONG)
    week1, late, again, third, out = (root / name for name in ("week1", "late", "again", "third", "out"))
    _put(week1 / "ann" / f"{A01}.ipynb", good)
    _put(week1 / "ben" / f"{A01}.ipynb", wrong)
    _put(late / "ann" / f"{A01}.ipynb", wrong, LATE)
    _put(again / "ann" / f"{A01}.ipynb", wrong, AGAIN)
    _put(again / "ben" / f"{A01}.ipynb", wrong, AGAIN)
    _put(third / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), BLANK), LATER)
    said = {}
    for step, folder, options in [
            ("first", week1, dict(due=DUE, late_penalty="per-day:10")), ("late", late, {}), ("week1", week1, {}),
            ("override", week1, dict(force=True, students=["ann"], assignments=[A01])),
            ("late-again", late, {}), ("download", again, {}), ("week1-again", week1, {}), ("third", third, {})]:
        said[step] = _graded(folder, out, **options)
        said[step + "-rows"] = _rows(out)
    return said


def test_a_plain_rerun_after_an_override_keeps_its_grade_and_time(override):
    said = override
    assert said["week1-rows"]["ann", A01]["score"] == "16"  # the newer (late) grade, kept over week1's file
    forced = said["override-rows"]["ann", A01]
    assert forced["score"] == "17" and forced["submitted"] == "2025-11-30T12:00:00Z" and forced["late_penalty"] == "0"
    for step in ("late-again", "download", "week1-again"):
        row = said[step + "-rows"]["ann", A01]
        assert (row["score"], row["submitted"], row["late_penalty"]) == ("17", "2025-11-30T12:00:00Z", "0"), \
            f"{step}: the plain rerun replaced the override: {row}"
        assert said[step + "-rows"] == said["override-rows"], step
        assert "(0 graded now" in said[step], said[step]


def test_a_file_held_back_by_an_override_is_listed_with_how_to_grade_it(override):
    said = override["late-again"]
    assert "kept the grade set with --force (1;" in said and "1 kept: set with --force" in said
    line = next(x for x in said.splitlines() if x.strip().startswith(f"ann {A01}:"))
    assert f"ann/{A01}.ipynb" in line and f"--force --student ann --assignment {A01}" in line


def test_a_new_upload_after_an_override_is_graded(override):
    row = override["third-rows"]["ann", A01]
    assert row["score"] == "16" and row["submitted"] == "2025-12-10T12:00:00Z", row  # never seen before: graded
    assert "(1 graded now" in override["third"]


# --------------------------------------------------------------------------- 1b. Canvas's _LATE_, rerun
def test_a_canvas_late_upload_keeps_its_time_on_a_rerun_without_due(course, tmp_path):
    """The due date is kept in the gradebook: a rerun without --due, or an override, reads Canvas's
    _LATE_ mark against it as the first run did (the file's own time is before the due date)."""
    subs, out = tmp_path / "canvas", tmp_path / "out"
    _put(subs / f"doejohn_LATE_102_9002_{A01}.ipynb", solved_notebook(course, A01))
    _put(subs / f"smithjane_101_9001_{A01}.ipynb", solved_notebook(course, A01))
    _graded(subs, out, due=DUE)
    first = _rows(out)
    assert first["doejohn", A01]["submitted"] == "2025-12-01T23:59:01Z"
    rerun = _graded(subs, out)
    assert _rows(out) == first and "handed in again unchanged" not in rerun and "(0 graded now, 2 reused" in rerun
    _graded(subs, out, force=True, students=["doejohn"], assignments=[A01])
    assert _rows(out)["doejohn", A01]["submitted"] == "2025-12-01T23:59:01Z"

    # an extension makes the upload on time: its row no longer says only that Canvas marked it late (an
    # instructor's walkthrough read "late" in the notes beside a 0 penalty)
    late_note = f"{A01} (late): graded doejohn_LATE_102_9002_{A01}.ipynb: Canvas marked this upload late"
    assert late_note in _rows(out)["doejohn", A01]["notes"] and "extension" not in _rows(out)["doejohn", A01]["notes"]
    assert cli.main(["extend", str(out), "doejohn", A01, "--days", "2"]) == 0
    row = _rows(out)["doejohn", A01]
    assert row["late_penalty"] == "0" and late_note in row["notes"], row
    assert "on time all the same: their own due date (an extension) is 2025-12-03 23:59 UTC" in row["notes"], row


# --------------------------------------------------------------------------- 3. the summary's counts
def test_the_summary_counts_notebooks_graded_and_names_the_missing_apart(course, tmp_path):
    """ann and ben hand in 01 and 02, cat only 01: five notebooks graded, cat's 02 missing (not 'graded')."""
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student, names in {"ann": [A01, A02], "ben": [A01, A02], "cat": [A01]}.items():
        for name in names:
            _put(subs / student / f"{name}.ipynb", solved_notebook(course, name))
    first, second = _graded(subs, out), _graded(subs, out)
    assert "3 students: 5 notebooks (5 graded now, 0 reused from earlier runs), 1 missing (no notebook handed in)" \
        in first, first
    assert "3 students: 5 notebooks (0 graded now, 5 reused from earlier runs), 1 missing" in second, second
    assert _rows(out)["cat", A02]["status"].startswith("missing")
    # a folder of next week's notebooks that cat is not in: cat's missing 02 is still this run's problem (an
    # instructor's walkthrough: "all graded without problems", exit 0, with cat's 0 in grades_wide.csv)
    week2 = tmp_path / "week2"
    for student in ("ann", "ben"):
        _put(week2 / student / f"{A02}.ipynb", solved_notebook(course, A02))
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        assert cli.main(["grade", str(week2), "--out", str(out), "--workers", "2"]) == 1
    said = buffer.getvalue()
    assert "2 students: 2 notebooks (0 graded now, 2 reused from earlier runs), 1 missing" in said, said
    assert "cat      02_queries_keys_values   0 / 14   missing" in said and "1 missing; see the status and notes columns" in said, said


# --------------------------------------------------------------------------- 4. a copied grading folder
def test_a_copied_grading_folder_grades_into_itself_with_the_original_moved_away(course, tmp_path):
    subs, out, copy, gone = tmp_path / "subs", tmp_path / "out", tmp_path / "elsewhere" / "out2", tmp_path / "gone"
    _put(subs / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(subs, out)
    copy.parent.mkdir()
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    out.rename(gone)  # the original, moved away: anything that still reads or writes it fails or recreates it
    before = {p: p.stat().st_mtime_ns for p in gone.rglob("*") if p.is_file()}
    _put(subs / "cat" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    said = _graded(subs, copy)
    rows = _rows(copy)
    assert rows["cat", A01]["score"] == "16" and rows["cat", A01]["status"] == "ok", rows["cat", A01]
    assert rows["ann", A01]["score"] == "17" and "(1 graded now, 1 reused" in said
    assert f"{copy} was graded as {out} before (copied or moved)" in said
    assert (copy / "feedback" / "cat" / f"{A01}.html").is_file()
    assert not out.exists(), "grading the copy wrote into the original's place"
    assert {p: p.stat().st_mtime_ns for p in gone.rglob("*") if p.is_file()} == before
    assert not any(str(out) in p.read_text(errors="replace") for p in copy.rglob("*.py"))
    assert cli.grading_course(copy) == (copy / "course").resolve()  # formgrader opens the copy's own gradebook


def test_export_of_a_copied_grading_folder_says_it_now_names_the_copy(course, tmp_path, capsys):
    subs, out, copy = tmp_path / "subs", tmp_path / "out", tmp_path / "copy"
    _put(subs / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(subs, out)
    subprocess.run(["cp", "-a", str(out), str(copy)], check=True)
    capsys.readouterr()
    assert cli.main(["export", str(copy), "--to", "gradescope"]) == 0
    assert f"{copy} was graded as {out} before (copied or moved)" in capsys.readouterr().out
    assert cli.main(["export", str(copy), "--to", "gradescope"]) == 0
    assert "was graded as" not in capsys.readouterr().out  # said once, when it happened


def test_a_course_config_that_cannot_be_pointed_here_is_a_clear_error(tmp_path):
    from autograder.course import CourseMoved, settle_course_config

    course = tmp_path / "out" / "course"
    course.mkdir(parents=True)
    with pytest.raises(CourseMoved, match="cannot be read .*grade the class into a new folder"):
        settle_course_config(course, f"sqlite:///{tmp_path / 'out' / 'gradebook.db'}")
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    with pytest.raises(CourseMoved, match="does not name its course root"):
        settle_course_config(course, f"sqlite:///{tmp_path / 'out' / 'gradebook.db'}")


def test_an_override_on_a_folder_without_the_notebook_takes_no_grade_away(course, tmp_path):
    """`--force --student ann --assignment 01` run on week 2's folder, where ann handed in 02 only: her 01
    was graded again as 'missing' over the 17 / 17 week 1 gave it. The grade stands, and the run says why."""
    week1, week2, out = tmp_path / "week1", tmp_path / "week2", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(week2 / "ann" / f"{A02}.ipynb", solved_notebook(course, A02))
    _graded(week1, out)
    said = _graded(week2, out, force=True, students=["ann"], assignments=[A01])
    row = _rows(out)[("ann", A01)]
    assert (row["score"], row["status"]) == ("17", "ok"), row
    assert "nothing to regrade (1;" in said and f"ann {A01}: no notebook for it in" in said, said


def test_a_forced_regrade_of_a_new_download_keeps_each_notebooks_first_time(course, tmp_path):
    """`--force` after a new download of the class (every file dated the day of the download, after the due
    date): each unchanged notebook is regraded at the time it was first handed in, not made late."""
    week1, again, out = tmp_path / "week1", tmp_path / "again", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(again / "ann" / f"{A01}.ipynb", solved_notebook(course, A01), AGAIN)
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    first = _rows(out)[("ann", A01)]
    _graded(again, out, force=True)
    row = _rows(out)[("ann", A01)]
    assert (row["submitted"], row["late_penalty"], row["score"]) == (first["submitted"], "0", "17"), row


# --------------------------------------------------------------------------- 5. the instructor changes the grading
UNSTABLE = {"softmax": "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)"}
STABILITY_CHECK, SWAPPED = 'nb01.check(\\"softmax_stability\\", softmax)', 'nb01.check(\\"softmax\\", softmax)'


def test_a_hidden_test_fixed_in_solutions_regrades_everyone_against_the_fix(course, tmp_path):
    """An instructor's walkthrough: the stability test ran the plain softmax check by mistake, so an unstable
    softmax kept its 2 points; fixed in solutions/, the next run said "graded now" for everyone and still
    graded against the grading folder's old copy of the notebook (even with --force)."""
    solutions = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions" / A01, solutions / A01)
    source = solutions / A01 / f"{A01}.ipynb"
    fixed = source.read_text()
    assert fixed.count(STABILITY_CHECK) == 1
    source.write_text(fixed.replace(STABILITY_CHECK, SWAPPED))
    week1, out = tmp_path / "week1", tmp_path / "out"
    _put(week1 / "bob" / f"{A01}.ipynb", inject(solved_notebook(course, A01), UNSTABLE))
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    first = _graded(week1, out, solutions=solutions)
    assert "changed in" not in first
    buggy = {k: float(r["score"]) for k, r in _rows(out).items()}
    assert buggy[("bob", A01)] == buggy[("ann", A01)] == 17, buggy  # the bug: the unstable softmax passes
    source.write_text(fixed)
    said = _graded(week1, out, solutions=solutions)
    assert f"changed in {solutions} since this folder was prepared: {A01}" in said, said
    assert "(2 graded now, 0 reused" in said, said
    rows = _rows(out)
    assert float(rows[("bob", A01)]["score"]) == 15 and float(rows[("ann", A01)]["score"]) == 17, rows
    assert "softmax without subtracting the max" in (out / "feedback" / "bob" / f"{A01}.html").read_text()
    again = _graded(week1, out, solutions=solutions)  # nothing changed since: nothing made again
    assert "changed in" not in again and "(0 graded now, 2 reused" in again, again


def test_a_hidden_test_fixed_after_the_late_uploads_names_the_late_grades_it_did_not_make_again(course, tmp_path):
    """An instructor's walkthrough: a hidden test changed after week1/ and week1-late/ were graded; grading week1/
    again regraded its own files, and the late uploads' grades (made with the old test) stayed, unsaid, and were
    exported. They are now listed on the console, and export holds them as problems, until the late folder is
    graded again."""
    from autograder import lms

    solutions = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions" / A01, solutions / A01)
    source = solutions / A01 / f"{A01}.ipynb"
    fixed = source.read_text()
    source.write_text(fixed.replace(STABILITY_CHECK, SWAPPED))
    week1, late, out = tmp_path / "week1", tmp_path / "week1-late", tmp_path / "out"
    _put(week1 / "bob" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(late / "bob" / f"{A01}.ipynb", inject(solved_notebook(course, A01), UNSTABLE), LATE)
    _graded(week1, out, solutions=solutions, due=DUE)
    _graded(late, out, solutions=solutions)
    assert float(_rows(out)[("bob", A01)]["score"]) == 17  # the bug: the unstable softmax passes
    source.write_text(fixed)
    said = _graded(week1, out, solutions=solutions)
    assert "NOT GRADED AGAIN, made with earlier hidden tests or grader code (1;" in said, said
    assert f"\n  bob {A01}: bob/{A01}.ipynb (file time; in week1-late)" in said, said
    assert float(_rows(out)[("bob", A01)]["score"]) == 17
    problems = lms.export(out, "canvas").problems
    assert [p for p in problems if "earlier hidden tests" in p] == [
        f"bob {A01}: bob/{A01}.ipynb (file time; in week1-late): graded with earlier hidden tests or grader code (a "
        "solution or the grader changed since); grade the folder that holds this file again, then export again"], problems
    again = _graded(late, out, solutions=solutions)
    assert "NOT GRADED AGAIN" not in again and float(_rows(out)[("bob", A01)]["score"]) == 15, again
    assert not [p for p in lms.export(out, "moodle").problems if "earlier hidden tests" in p]


def test_a_student_regrade_says_the_others_of_its_own_folder_were_left_out_by_student(course, tmp_path):
    """An instructor's first week (finding 7): after a hidden test was fixed, `grade week1/ --student carol` listed
    the other week1 students' grades as NOT GRADED AGAIN with "grade the folder that holds each file again", for files
    in the very folder it had just read. --student left them out, not the folder: the run now says so; a grade made
    from another folder (week1-late/) keeps the old advice."""
    solutions = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions" / A01, solutions / A01)
    source = solutions / A01 / f"{A01}.ipynb"
    fixed = source.read_text()
    source.write_text(fixed.replace(STABILITY_CHECK, SWAPPED))
    week1, late, out = tmp_path / "week1", tmp_path / "week1-late", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(week1 / "bob" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(late / "cy" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)
    _graded(week1, out, solutions=solutions, due=DUE)
    _graded(late, out, solutions=solutions)
    source.write_text(fixed)
    said = _graded(week1, out, solutions=solutions, students=["ann"])
    assert ("NOT GRADED AGAIN, made with earlier hidden tests or grader code, left out by --student (1; their files "
            f"are in this folder: grade it again without --student, before exporting):\n  bob {A01}: bob/{A01}.ipynb "
            "(file time; in week1)\n") in said, said
    assert ("NOT GRADED AGAIN, made with earlier hidden tests or grader code (1; a run grades the files of its own "
            f"folder: grade the folder that holds each file again, e.g. the late uploads', before exporting):\n  cy "
            f"{A01}: cy/{A01}.ipynb (file time; in week1-late)\n") in said, said
    again = _graded(week1, out, solutions=solutions)  # the whole folder: bob made again; cy's is late's to make
    assert "left out by --student" not in again and f"bob {A01}" not in again.split("NOT GRADED AGAIN", 1)[-1], again


def test_grades_saved_by_other_grading_code_are_made_again_and_said(course, tmp_path, monkeypatch):
    """A tolerance loosened in autograder/checks/ (the instructor's walkthrough) reached no one: every grade
    was reused, as its notebook and solution had not changed. Grades remember the code that judged them."""
    import autograder.grade as grading

    week1, out = tmp_path / "week1", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(week1 / "ben" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    assert "(2 graded now" in _graded(week1, out)
    assert "(0 graded now, 2 reused" in _graded(week1, out)
    monkeypatch.setattr(grading, "judge_digest", lambda: b"another version of checks/nb01.py")
    said = _graded(week1, out)
    assert "(2 graded now, 0 reused" in said and "graded again: 2 notebooks whose saved grade was made by other " \
        "grading code" in said, said
    assert "(0 graded now, 2 reused" in _graded(week1, out)


def test_a_score_set_by_hand_is_shown_and_said_when_its_notebook_is_graded_again(course, tmp_path):
    """An instructor's walkthrough: a score set by hand on ben's first notebook silently stood over his corrected
    resubmission (nbgrader keeps a manual score through every autograde), and no table said a person typed it."""
    from nbgrader.api import Gradebook

    week1, again, out = tmp_path / "week1", tmp_path / "again", tmp_path / "out"
    _put(week1 / "ben" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(week1, out)
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        cell = gb.find_grade("test_dot_similarity", A01, A01, "ben")
        assert (cell.auto_score, cell.max_score) == (0, 1)
        cell.manual_score = 0.5
        gb.db.commit()
    _put(again / "ben" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)  # the corrected notebook
    said = _graded(again, out)
    assert "a score set by hand kept over a notebook graded now (1; look at it again in formgrader, where it can be " \
        f"emptied):\n  ben {A01}: test_dot_similarity 0.5 of 1 (the grader's: 1)\n" in said, said
    rows = _rows(out)
    assert float(rows[("ben", A01)]["score"]) == 16.5
    assert "set by hand in formgrader: test_dot_similarity 0.5 of 1 (the grader's: 1)" in rows[("ben", A01)]["notes"]
    assert rows[("ann", A01)]["notes"] == ""
    assert "set by hand" not in _graded(again, out)  # said when graded again, not at every run


def test_scores_and_extra_credit_set_by_hand_show_apart_in_the_report_feedback_and_exports(course, tmp_path):
    """An instructor's walkthrough: the report never said a grade was set by hand (bob's 18 looked like the grader's),
    its exercise table counted 3 + 2 extra credit of 3 as full marks over a failed test, and the feedback page and
    the Gradescope and PrairieLearn files said "5 / 3 points"."""
    import json

    from nbgrader.api import Gradebook

    from autograder import lms

    week1, out = tmp_path / "week1", tmp_path / "out"
    _put(week1 / "ben" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(week1, out)
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        gb.find_grade("test_dot_similarity", A01, A01, "ben").extra_credit = 2  # 0 of 1, and 2 extra
        gb.find_grade("test_softmax", A01, A01, "ann").extra_credit = 1.5  # full marks, and 1.5 extra
        gb.db.commit()
    _graded(week1, out)  # nothing graded again: the tables, report and pages written from the gradebook
    report = (out / "report.html").read_text()
    assert f"{A01}: set by hand in formgrader: test_dot_similarity extra credit 2" in report, report
    assert report.count('<span class="muted">set by hand</span>') == 2
    assert '<td>dot_similarity</td><td class="num">2</td><td class="num">50%</td><td class="num">1</td>' \
        '<td class="num">1</td>' in report, report  # one of two with full marks: ben's failed test, extra credit apart
    page = (out / "feedback" / "ann" / f"{A01}.html").read_text()
    assert "test_softmax</code> — softmax\n — 3 / 3 points + 1.5 extra credit" in page, page
    page = (out / "feedback" / "ben" / f"{A01}.html").read_text()  # a reviewer: "1 / 1 points + 1 extra credit", ✓
    assert "test_dot_similarity</code> — dot_similarity\n — 0 / 1 points + 2 extra credit" in page, page
    assert '<li class="failed"><span class="mark">✗</span>\n              <a href="#test_dot_similarity">' in page
    lms.export(out, "gradescope")
    tests = json.loads((out / "lms" / "gradescope" / "ben" / A01 / "results.json").read_text())["tests"]
    assert {t["name"]: (t["score"], t["max_score"]) for t in tests if "dot_similarity" in t["name"]} == \
        {"test_dot_similarity": (0.0, 1.0), "test_dot_similarity: extra credit": (2.0, 0.0)}, tests
    lms.export(out, "prairielearn")
    tests = json.loads((out / "lms" / "prairielearn" / "ann" / A01 / "results.json").read_text())["tests"]
    assert {t["name"]: (t["points"], t["max_points"]) for t in tests if t["name"].split(":")[0] == "test_softmax"} == \
        {"test_softmax": (3.0, 3.0), "test_softmax: extra credit": (1.5, 0.0)}, tests


def test_an_override_stays_an_override_when_other_grading_code_grades_its_file_again(course, tmp_path, monkeypatch):
    """A review: after a grader change the overridden file was graded again as a plain grade, and the next plain run
    of the late folder put the late file's 16 back over the instructor's choice of the on-time 17."""
    import autograder.grade as grading

    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(late / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG), LATE)
    _graded(week1, out)
    _graded(late, out)
    _graded(week1, out, force=True, students=["ann"], assignments=[A01])
    assert _rows(out)["ann", A01]["score"] == "17"
    monkeypatch.setattr(grading, "judge_digest", lambda: b"another version of the grader")
    assert "graded again: 1 notebook" in _graded(week1, out)
    said = _graded(late, out)
    assert _rows(out)["ann", A01]["score"] == "17", said  # the override's file, still chosen
    assert "kept the grade set with --force (1;" in said, said


def test_a_solution_that_adds_a_graded_cell_mid_term_is_refused_before_anything_changes(course, tmp_path):
    """A review: the refresh deleted the grading folder's source and release, nbgrader then refused the new cell,
    and every later run failed (with the grading settings gone from its nbgrader_config.py)."""
    import json

    from autograder.grade import SolutionCellsChanged

    solutions = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions" / A01, solutions / A01)
    week1, out = tmp_path / "week1", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(week1, out, solutions=solutions)
    config = (out / "course" / "nbgrader_config.py").read_text()
    source = solutions / A01 / f"{A01}.ipynb"
    nb = json.loads(source.read_text())
    test = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "test_dot_similarity")
    extra = json.loads(json.dumps(test))
    extra["metadata"]["nbgrader"]["grade_id"] = "test_dot_similarity_again"
    extra.pop("id", None)
    nb["cells"].append(extra)
    source.write_text(json.dumps(nb))
    with pytest.raises(SolutionCellsChanged, match="new: test_dot_similarity_again; gone: none"):
        _graded(week1, out, solutions=solutions)
    assert (out / "course" / "nbgrader_config.py").read_text() == config
    shutil.copy2(REPO / "solutions" / A01 / f"{A01}.ipynb", source)  # put back: the folder grades as before
    assert "(0 graded now, 1 reused" in _graded(week1, out, solutions=solutions)


def test_a_copy_of_an_older_folder_never_replaces_the_newer_grade(course, tmp_path):
    """An instructor's walkthrough: week1/ (ann one mistake, on time), late/ (ann's fix, late), then a copy of
    week1/ (`cp -r`: every file dated the day of the copy). Ann's older notebook, graded before, came back with
    the newest file time and replaced her late fix's grade (15.3 to 5.5, "4 days late"). It is now kept out,
    said why, and the late fix's grade, time and file stand."""
    week1, late, copy, out = tmp_path / "week1", tmp_path / "late", tmp_path / "week1-copy", tmp_path / "out"
    _put(week1 / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ben" / f"{A01}.ipynb", solved_notebook(course, A01))
    _put(late / "ann" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    _graded(late, out)
    before = _rows(out)[("ann", A01)]
    assert before["submitted"].startswith("2025-12-03") and before["late_penalty"] not in ("", "0"), before
    shutil.copytree(week1, copy)
    for path in copy.rglob("*.ipynb"):
        os.utime(path, (AGAIN, AGAIN))
    said = _graded(copy, out)
    after = _rows(out)[("ann", A01)]
    assert {k: after[k] for k in ("score", "submitted", "late_penalty", "source_file")} == \
        {k: before[k] for k in ("score", "submitted", "late_penalty", "source_file")}, (before, after)
    # the copy's notebook is timed as the first run saw it (the grade's record keeps the time of every notebook
    # found): an older file than the one graded, as when week1/ itself is graded again
    assert "ann 01_similarity_attention: ann/01_similarity_attention.ipynb (file time in an earlier grading run), " \
           "handed in 2025-11-30 12:00:00 UTC, is older than the submission graded earlier" in said, said
    assert "--force --student ann --assignment 01_similarity_attention" in said
    forced = _graded(copy, out, force=True, students=["ann"], assignments=[A01])  # the instructor's choice stands
    assert _rows(out)[("ann", A01)]["score"] != before["score"], forced


def test_a_newer_upload_that_is_no_notebook_takes_no_grade_away(course, tmp_path):
    """An upload gone wrong (not JSON) after a graded notebook: its row mixed the earlier score and time with the
    new file's 'unreadable' status. The earlier grade now stands whole, the console and the row's notes say
    which file could not be read and what to do; a readable newer upload after it is graded as usual."""
    week1, late, fixed, out = (tmp_path / name for name in ("week1", "late", "fixed", "out"))
    _put(week1 / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ben" / f"{A01}.ipynb", solved_notebook(course, A01))
    broken = late / "ann" / f"{A01}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [')
    os.utime(broken, (LATE, LATE))
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    before = _rows(out)[("ann", A01)]
    said = _graded(late, out)
    row = _rows(out)[("ann", A01)]
    assert {k: row[k] for k in ("score", "submitted", "status", "source_file")} == \
        {k: before[k] for k in ("score", "submitted", "status", "source_file")}, (before, row)
    assert "late/ann/01_similarity_attention.ipynb" in row["notes"] and "cannot be read" in row["notes"], row
    assert "cannot be read" in said and "never replaces the grade of a notebook that could" in said, said
    _graded(late, out, force=True, students=["ann"], assignments=[A01])  # --force too: its score stayed beside
    forced = _rows(out)[("ann", A01)]                                     # an 'unreadable' status
    assert {k: forced[k] for k in ("score", "submitted", "status", "source_file")} == \
        {k: before[k] for k in ("score", "submitted", "status", "source_file")}, (before, forced)
    _put(fixed / "ann" / f"{A01}.ipynb", solved_notebook(course, A01), AGAIN)
    _graded(fixed, out)
    row = _rows(out)[("ann", A01)]
    assert row["score"] == "17" and row["submitted"].startswith("2025-12-08") and "cannot be read" not in row["notes"]


def test_an_older_upload_that_is_no_notebook_is_noted_beside_the_late_grade(course, tmp_path):
    """An instructor's first week: fay handed in on time a broken file, then a good one late. Graded in that order
    of folders (week1-late/ first here), the broken on-time file was forgotten (no note anywhere: what decides
    whether to waive the penalty); its console line offered --force, which left a score of 17 beside an
    'unreadable' status. Now the row's notes name it, and --force keeps the readable notebook's grade."""
    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    _put(late / "fay" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)
    broken = week1 / "fay" / f"{A01}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [')
    on_time = datetime(2025, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()
    os.utime(broken, (on_time, on_time))
    _graded(late, out, due=DUE, late_penalty="per-day:10")
    before = _rows(out)[("fay", A01)]
    assert float(before["late_penalty"]) > 0, before
    for force in ({}, {"force": True, "students": ["fay"], "assignments": [A01]}):
        said = _graded(week1, out, **force)
        row = _rows(out)[("fay", A01)]
        assert {k: row[k] for k in ("score", "late_penalty", "status", "source_file")} == \
            {k: before[k] for k in ("score", "late_penalty", "status", "source_file")}, (force, before, row)
        assert "an earlier upload, week1/fay/01_similarity_attention.ipynb" in row["notes"], row
        assert "cannot be read" in said and "--force --student fay" not in said, said


def test_a_broken_on_time_upload_is_named_beside_the_late_grade_that_replaces_it(course, tmp_path):
    """The same, in the README's order (an instructor's walkthrough): week1/ with hal's broken on-time file, then
    week1-late/ with a good late one. The late grade replaced the 'unreadable' row and nothing anywhere said the
    on-time file had been broken; the row's notes say so now, and how to waive the penalty."""
    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    broken = week1 / "hal" / f"{A01}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [')
    on_time = datetime(2025, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()
    os.utime(broken, (on_time, on_time))
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    first = _rows(out)[("hal", A01)]  # its time and due date are in the row too (both were empty)
    assert first["status"].startswith("unreadable") and first["submitted"].startswith("2025-11-30T12:00"), first
    assert first["due"] and first["seconds_late"] == "0", first
    _put(late / "hal" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)
    _graded(late, out)
    row = _rows(out)[("hal", A01)]
    assert row["score"] == "17" and float(row["late_penalty"]) > 0, row
    assert "an upload of theirs that could not be read, hal/01_similarity_attention.ipynb" in row["notes"], row
    assert "handed in 2025-11-30 12:00 UTC on time, came before this notebook" in row["notes"], row
    assert "attn-course extend" in row["notes"], row
    _graded(late, out)  # reused: the note stays
    assert "could not be read" in _rows(out)[("hal", A01)]["notes"]
    _graded(late, out, force=True, students=["hal"], assignments=[A01])  # graded again (a reviewer: the note went)
    assert "on time, came before this notebook" in _rows(out)[("hal", A01)]["notes"]


def test_a_broken_late_upload_graded_first_is_not_called_earlier(course, tmp_path):
    """A reviewer: the late folder graded first with a broken file, then the on-time folder with a good notebook; the
    note called the broken late file "an earlier upload" and advised waiving a penalty there is none of."""
    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    broken = late / "ivy" / f"{A01}.ipynb"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"cells": [')
    os.utime(broken, (LATE, LATE))
    _graded(late, out, due=DUE, late_penalty="per-day:10")
    _put(week1 / "ivy" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(week1, out)
    row = _rows(out)[("ivy", A01)]
    assert row["score"] == "17" and float(row["late_penalty"]) == 0, row
    assert "late, came after this notebook" in row["notes"] and "extend" not in row["notes"], row


def test_an_exercise_refused_for_academic_honesty_is_named_in_the_tables(course, tmp_path):
    """A built-in doing an exercise cost its points, said only in the student's feedback: grades.csv (status ok,
    review empty) and the report's attention list showed nothing. The row's notes and the report name it now,
    on a rerun that reuses the grade too."""
    week1, out = tmp_path / "week1", tmp_path / "out"
    borrowed = {"softmax": "def softmax(x, axis=-1):\n    import torch\n"
                           "    return torch.softmax(torch.as_tensor(x), dim=axis).numpy()"}
    _put(week1 / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), borrowed))
    _put(week1 / "ben" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    for _ in range(2):  # graded, then reused
        _graded(week1, out)
        rows = _rows(out)
        assert "not accepted: softmax (it calls a library's softmax" in rows[("ann", A01)]["notes"], rows[("ann", A01)]
        assert "not accepted" not in rows[("ben", A01)]["notes"]  # a wrong answer is no refusal
        report = (out / "report.html").read_text()
        assert "01_similarity_attention: not accepted: softmax" in report


# --------------------------------------------------------------------------- 5. a copy dates every file today
def test_a_copy_of_the_class_folder_is_timed_by_what_the_first_run_saw(course, tmp_path):
    """An instructor's walkthrough: `cp -r mini mini-copy` dated both of s10's files today. Tied in time, the
    older notebook (never graded: the newer one was) won on name order and was graded, "4 days late", 8.5 for
    15; grading the original folder again could not undo it. The first run's record keeps the time of every
    notebook it found, so the copy's files are timed as they were seen: the newer one is still the newest."""
    subs, copy, out = tmp_path / "mini", tmp_path / "mini-copy", tmp_path / "out"
    _put(subs / "s10" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG), ON_TIME)  # the draft
    _put(subs / "s10" / f"{A01} (1).ipynb", solved_notebook(course, A01),
         datetime(2025, 12, 1, 20, 0, tzinfo=timezone.utc).timestamp())  # the final one, on time
    _graded(subs, out, due=DUE, late_penalty="per-day:10")
    first = _rows(out)["s10", A01]
    assert (first["score"], first["late_penalty"], first["submitted"]) == ("17", "0", "2025-12-01T20:00:00Z"), first
    for path in (subs / "s10").iterdir():  # as `cp -r` copies: contents, and today's date
        (copy / "s10").mkdir(parents=True, exist_ok=True)
        (copy / "s10" / path.name).write_bytes(path.read_bytes())
    said = _graded(copy, out)
    row = _rows(out)["s10", A01]
    assert (row["score"], row["late_penalty"], row["submitted"]) == ("17", "0", "2025-12-01T20:00:00Z"), (row, said)
    assert "(0 graded now" in said, said


def test_a_late_fix_beside_a_new_download_of_the_graded_notebook_is_graded(course, tmp_path):
    """An instructor's walkthrough: week1-late/ held a new download of tanakayuki's graded notebook (dated the day
    of the download) beside their real late fix (Canvas's _LATE_, two days before): the fix was set aside as
    "an older version" and its late grade never given. The downloaded notebook is timed as the first run saw it."""
    week1, late, out = tmp_path / "week1", tmp_path / "week1-late", tmp_path / "out"
    graded = inject(solved_notebook(course, A01), WRONG)  # 16 / 17
    _put(week1 / f"tanakayuki_201007_206007_{A01}.ipynb", graded, ON_TIME)
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    assert _rows(out)["tanakayuki", A01]["score"] == "16"
    _put(late / f"tanakayuki_201007_206007_{A01}.ipynb", graded, AGAIN)  # downloaded again: a new file time
    _put(late / f"tanakayuki_LATE_201007_206099_{A01}-1.ipynb", solved_notebook(course, A01), LATE)
    said = _graded(late, out)
    row = _rows(out)["tanakayuki", A01]
    assert row["score"] == "17" and row["submitted"] == "2025-12-03T12:00:00Z", (row, said)
    assert float(row["late_penalty"]) == pytest.approx(3.4), row  # 2 days late (per-day:10, whole days up)


def test_a_late_fix_that_lowers_the_grade_and_a_comment_kept_over_it_are_said(course, tmp_path):
    """An instructor's walkthrough: erin's corrected notebook, 1.5 days late, replaced her on-time 16 with 15.3
    (-1.7 for lateness) and the comment written about her old bug stood under the fixed code; the console said
    neither. Both are listed now, with how to keep the earlier grade."""
    from nbgrader.api import Gradebook

    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    _put(week1 / "erin" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(week1 / "ann" / f"{A01}.ipynb", solved_notebook(course, A01))
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        comment = gb.find_comment("dot_similarity", A01, A01, "erin")
        comment.manual_comment = "E.T @ E compares features, not words: see the shapes"
        gb.db.commit()
    _put(late / "erin" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)  # the fix, 1.5 days after the due date
    _put(late / "ann" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)  # the same notebook, downloaded again
    said = _graded(late, out)
    assert "a newer submission's grade replaced a higher one (1; to keep the earlier grade, grade the folder that " \
        f"holds its file again with --force --student ID --assignment NAME):\n  erin {A01}: 16 -> " in said, said
    assert "taken for lateness; now erin/" in said and "in late)" in said and "in week1)" in said, said
    assert f"a comment written by hand kept over a notebook graded now (1; it was written about the notebook graded " \
        f"before: look at it again in formgrader):\n  erin {A01}: dot_similarity\n" in said, said
    assert "ann" not in said.split("a newer submission's grade")[1].split("\n\n")[0]
    assert "replaced a higher one" not in _graded(late, out)  # said when it happens, not at every run


def test_the_lowered_grade_line_starts_from_the_score_set_by_hand(course, tmp_path):
    """erin's on-time 16 was raised to 17 by hand in formgrader; her late fix then scored 17 - 3.4 (two days late). The line that
    a newer grade replaced a higher one said 16 -> 13.6 (results.json, written before the hand score): the grade she
    lost is the 17 the instructor gave."""
    from nbgrader.api import Gradebook

    week1, late, out = tmp_path / "week1", tmp_path / "late", tmp_path / "out"
    _put(week1 / "erin" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _graded(week1, out, due=DUE, late_penalty="per-day:10")
    assert _rows(out)["erin", A01]["score"] == "16"
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        lost = [g for g in gb.find_submission_notebook(A01, A01, "erin").grades if g.score < g.max_score]
        assert len(lost) == 1, [(g.name, g.score) for g in lost]
        lost[0].manual_score = lost[0].max_score
        gb.db.commit()
    _put(late / "erin" / f"{A01}.ipynb", solved_notebook(course, A01), LATE)
    said = _graded(late, out)
    assert f"replaced a higher one (1; to keep the earlier grade, grade the folder that holds its file again with " \
        f"--force --student ID --assignment NAME):\n  erin {A01}: 17 -> 13.6, 3.4 taken for lateness" in said, said


# --------------------------------------------------------------------------- a regrade the grader cannot do
def _no_worker(course, subs, todo, finish, limits, salt, solutions, progress):
    """A remote grader with no worker to grade: every notebook handed to it is the grader's incident."""
    from autograder.grade import NotebookResult
    from autograder.outcomes import Status

    for sub in subs:
        for assignment in todo(sub):
            finish(sub, assignment, NotebookResult(sub.student_id, assignment, 0.0, 0.0, Status.INCIDENT,
                                                   detail="the cluster has no workers"))
    return 0


def test_a_forced_regrade_the_grader_fails_keeps_the_saved_grade_and_the_next_run_grades_it(course, tmp_path):
    """An instructor's walkthrough: `--force --student` on a cluster with no worker to grade recorded a grader
    incident over the student's good grade: grades_wide.csv and every export then had an empty cell, while the
    message said "not graded and not saved". The grade saved before stands (noted on its row, the run's summary
    counting the problem), and the next run grades the notebook again."""
    folder, out = tmp_path / "class", tmp_path / "out"
    _put(folder / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _graded(folder, out)
    assert _rows(out)["ann", A01]["score"] == "16"

    results = grade(folder, out, workers=2, force=True, students=["ann"], remote=_no_worker, progress=False)
    row = _rows(out)["ann", A01]
    assert row["score"] == "16" and row["status"] == "ok", row
    assert "a later run could not grade this notebook (grader incident: the cluster has no workers); this grade, " \
           "made before, stands until a run grades it" in row["notes"], row["notes"]
    assert "a later run could not grade this notebook" in (out / "report.html").read_text()  # who needs attention
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    assert wide["ann"][A01] == "16", wide  # exported, not an empty cell
    (ann,) = [r for r in results if r.student_id == "ann"]
    assert cli.outcome([ann])[0] == 1, "the run's summary still counts the grader's failure"
    said = _graded(folder, out)  # a plain rerun: graded again, the note gone
    assert "(1 graded now" in said, said
    row = _rows(out)["ann", A01]
    assert row["score"] == "16" and "could not grade" not in row["notes"], row


def test_a_failure_on_a_new_file_is_never_covered_by_the_grade_of_an_older_one(course, tmp_path):
    """A reviewer's: the grade kept over a failure must be a grade of the very file that failed. A fixed notebook the
    grader failed on was shown 'ok' at the old file's 16 and exported; a first hand-in it failed on, 'missing' and 0.
    Both are held back again, as any failure of the grader's is."""
    folder, out = tmp_path / "class", tmp_path / "out"
    _put(folder / "ann" / f"{A01}.ipynb", inject(solved_notebook(course, A01), WRONG))
    _put(folder / "ben" / f"{A02}.ipynb", solved_notebook(course, A02))  # ben: no notebook 01 yet
    _graded(folder, out, assignments=[A01])
    assert _rows(out)["ann", A01]["score"] == "16" and _rows(out)["ben", A01]["status"].startswith("missing")
    _put(folder / "ann" / f"{A01}.ipynb", solved_notebook(course, A01), LATER)  # her fixed notebook
    _put(folder / "ben" / f"{A01}.ipynb", solved_notebook(course, A01), LATER)  # his first
    grade(folder, out, workers=2, remote=_no_worker, progress=False, assignments=[A01])
    rows = _rows(out)
    wide = {r["student_id"]: r for r in csv.DictReader((out / "grades_wide.csv").open())}
    for student in ("ann", "ben"):
        assert rows[student, A01]["status"].startswith("grader incident"), rows[student, A01]
        assert wide[student][A01] == "", wide[student]  # held back: never the older file's grade, never a 0
