"""Typed outcomes (autograder/outcomes.py): a verdict carries the catalogued mistake's name as a
field, a notebook's status is an enum with a free-text detail and the submission notes apart, and
the report, grades.csv and the saved runs read those fields — never the English of a message."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from autograder import serialize, trusted
from autograder.checks import core, nb01
from autograder.grade import (
    CSV_COLUMNS,
    CellResult,
    NotebookResult,
    _load_result,
    _save_result,
    format_table,
    note_submission,
    write_csv,
)
from autograder.outcomes import Status, Verdict, status_from_text, status_text, summarize
from autograder.report import class_report, mistake_counts
from autograder.sandbox import Incident, JobResult
from autograder.submissions import StudentSubmission

A01 = "01_similarity_attention"
NO_MAX = nb01.SOFTMAX_MISTAKES[0]  # "softmax without subtracting the max"
SUM_RULE = nb01.SOFTMAX_MISTAKES[4]  # "the sum rule (x / x.sum) instead of softmax"
SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True))\n    return {scale}e / e.sum(axis=axis, keepdims=True)"


def _student(scale: str = ""):
    """A softmax as a student writes it (the course's own may not be called), scaled by `scale`."""
    return core.Mistake("", "", SOFTMAX.format(scale=scale)).build("softmax")


# --------------------------------------------------------------------------- verdicts
def test_a_verdict_with_its_mistake_round_trips_through_json_and_serialize():
    verdict = Verdict(False, "softmax gave a wrong result on: ...", cause="value", mistake=NO_MAX.name,
                      expected="[0.2 0.8]", received="[nan nan]")
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
    assert Verdict.from_dict(serialize.loads(serialize.dumps(verdict.to_dict()))) == verdict
    assert Verdict.from_dict({"passed": True}) == Verdict(True)  # every other field is optional


@pytest.mark.parametrize("payload", [
    {"passed": False, "message": "x", "mistake": 3},
    {"passed": False, "message": "x", "mistake": ["softmax without subtracting the max"]},
    {"passed": False, "message": "x", "mistake": {"name": "softmax without subtracting the max"}},
    {"passed": False, "message": "x", "mistake": None},
    {"passed": False, "message": "x", "expected": 1.5},
    {"passed": "yes", "message": "x"},
    {"passed": 1, "message": "x"},
    {"message": "x"},
    {"passed": False, "message": "x", "__class__": "Verdict"},
    ["passed", False],
    "passed",
])
def test_a_verdict_of_the_wrong_shape_is_refused(payload):
    with pytest.raises(ValueError):
        Verdict.from_dict(payload)


def test_a_hostile_blob_cannot_pass_for_a_verdict():
    """What the sandbox can send decodes to plain data; an array or an unsupported object where the
    mistake's name should be is refused, not turned into a string."""
    for mistake in (np.array([1, 2]), object()):
        blob = serialize.dumps({"passed": False, "message": "x", "mistake": mistake})
        with pytest.raises(ValueError):
            Verdict.from_dict(serialize.loads(blob))


def _softmax_cell() -> tuple[trusted.TestCell, trusted.CheckRef]:
    ref = trusted.CheckRef("nb01", "softmax", "softmax")
    return trusted.TestCell("test_softmax", 3.0, [ref]), ref


def _judged(outcomes) -> Verdict:
    """One test cell's verdict from outcomes as the sandbox would send them (through serialize)."""
    t, _ = _softmax_cell()
    job = trusted.Job(cells=[], test_cell_index={"test_softmax": 0})
    return trusted._judge_cell(t, serialize.loads(serialize.dumps(outcomes)), job, JobResult("bubblewrap"))


def _outcomes_of(impl, extra=()) -> dict:
    t, ref = _softmax_cell()
    ex = trusted.exercise(ref)
    return {ref.key: [core.run_case(ex, case, impl) + tuple(extra) for case in trusted.cases(ref)]}


def test_the_mistake_is_the_grader_s_diagnosis_whatever_the_sandbox_sends():
    """The mistake is diagnosed in the trusted process from the returned values: an outcome that also
    names a mistake (or carries a dict claiming one) changes nothing."""
    wrong = SUM_RULE.build("softmax")
    verdict = _judged(_outcomes_of(wrong))
    assert not verdict.passed and verdict.mistake == SUM_RULE.name and verdict.cause == "value"
    assert f"{core.KNOWN_MISTAKE}{SUM_RULE.name}." in verdict.message  # the student still reads it
    forged = _judged(_outcomes_of(wrong, extra=(NO_MAX.name, {"mistake": NO_MAX.name})))
    assert forged.mistake == SUM_RULE.name
    right = _judged(_outcomes_of(_student(), extra=(NO_MAX.name,)))
    assert right.passed and right.mistake == ""


def test_a_wrong_value_carries_expected_and_received_summaries():
    verdict = _judged(_outcomes_of(_student("2 * ")))
    assert not verdict.passed and verdict.mistake == ""
    assert verdict.expected and verdict.received and verdict.expected != verdict.received
    assert f"expected: {verdict.expected}" in verdict.message and f"received: {verdict.received}" in verdict.message


def test_a_shape_mismatch_summarises_the_shapes():
    found = core.difference(np.zeros((2, 3)), np.zeros((3, 2)))
    assert (found.expected, found.received) == ("shape (2, 3)", "shape (3, 2)")
    assert found.message == core.compare(np.zeros((2, 3)), np.zeros((3, 2)))


# --------------------------------------------------------------------------- statuses
def test_status_values_are_the_old_prefixes_and_free_text_is_refused():
    assert NotebookResult("s", A01, 0.0, 1.0, "ok").status is Status.OK
    assert NotebookResult("s", A01, 0.0, 1.0).status is Status.OK
    with pytest.raises(ValueError):
        NotebookResult("s", A01, 0.0, 1.0, "crash: the kernel died")
    assert status_text(Status.UNREADABLE, "not JSON") == "unreadable notebook: not JSON"
    assert Status.of_incident("memory") is Status.MEMORY and Status.of_incident("???") is Status.ERROR


def test_incidents_keep_the_status_column_as_it_was():
    job = trusted.Job(cells=[{"kind": "code", "source": "while True:\n    pass"},
                             {"kind": "record", "test": "test_softmax"}],
                      test_cell_index={"test_softmax": 1}, positions=[4, 5], answer_cells={"softmax": 0})
    run = JobResult("none: disabled by ATTN_SANDBOX=none", incidents=[
        Incident(0, "timeout", "the cell ran past its 3 s limit and was interrupted", points_kept=True),
        Incident(-1, "crash", "the process crashed (segmentation fault) outside any cell")])
    status, detail, others = trusted.incidents_status(run, job)
    assert status is Status.TIMEOUT and others == [Status.CRASH, Status.SANDBOX]
    assert status_text(status, detail) == (
        "timeout: the answer cell softmax (cell 4): the cell ran past its 3 s limit and was interrupted "
        "(the points it earned stand); crash: the process crashed (segmentation fault) outside any cell; "
        "sandbox: none: disabled by ATTN_SANDBOX=none")
    assert trusted.incidents_status(JobResult("bubblewrap"), job) == (Status.OK, "", [])
    assert summarize([]) == (Status.OK, "", [])


def test_a_submission_note_does_not_change_the_status():
    r = NotebookResult("zoe", A01, 3.0, 3.0)
    sub = StudentSubmission("zoe", problems={"Copy of 01.ipynb": f"a second notebook for {A01}; graded the first one found"},
                            origins={A01: f"zoe/{A01}.ipynb (file time)"})
    note_submission(r, sub, A01)
    assert r.status is Status.OK and r.status_text == "ok" and r.kinds == [Status.OK]
    assert r.notes == [f"Copy of 01.ipynb: a second notebook for {A01}; graded the first one found"]
    assert r.source_file == f"zoe/{A01}.ipynb (file time)"
    note_submission(r, sub, A01, "week1-late")  # week1/ and week1-late/ graded into one table: which folder it was
    assert r.source_file == f"zoe/{A01}.ipynb (file time; in week1-late)"



def test_a_note_about_one_notebook_stays_on_that_notebooks_row():
    """An instructor's walkthrough: notebook 01's Canvas late mark and its duplicate files were in the notes of
    the student's 02 row too. A note about another notebook (by its key: the notebook, '<notebook> (late)', or a
    file named for it) is left to that notebook's row; one about the student's files in general is on every row."""
    A02 = "02_queries_keys_values"
    sub = StudentSubmission("zoe", problems={
        A01: f"graded zoe/{A01} (1).ipynb, ignored zoe/{A01}.ipynb (older)",
        f"{A01} (late)": "graded ...: Canvas marked this upload late", f"{A01}.html": "an HTML export of 01",
        f"Copy of {A02}.ipynb": "a copy of 02", "zoe": "the folder's name was not a plain id: read as 'zoe'"})
    for notebook, kept in ((A01, {A01, f"{A01} (late)", f"{A01}.html", "zoe"}), (A02, {f"Copy of {A02}.ipynb", "zoe"})):
        r = NotebookResult("zoe", notebook, 0.0, 3.0)
        note_submission(r, sub, notebook, assignments=(A01, A02, "03_multi_head_attention"))
        assert {n.split(": ", 1)[0] for n in r.notes} == kept, (notebook, r.notes)
    missing = NotebookResult("zoe", "02_queries_keys_values", 0.0, 3.0, Status.MISSING, detail="no notebook")
    note_submission(missing, sub, "02_queries_keys_values")
    assert missing.status is Status.MISSING and missing.status_text == "missing: no notebook"


def test_grades_csv_writes_status_and_notes_in_their_own_columns(tmp_path):
    results = [NotebookResult("zoe", A01, 3.0, 3.0, notes=["a.ipynb: x", "b.ipynb: y"]),
               NotebookResult("al", A01, 1.0, 3.0, Status.TIMEOUT, detail="the checks of test_softmax: slow",
                              other_kinds=[Status.CRASH])]
    write_csv(results, tmp_path / "grades.csv")
    rows = {row["student_id"]: row for row in csv.DictReader((tmp_path / "grades.csv").open())}
    assert list(rows["zoe"]) == CSV_COLUMNS and CSV_COLUMNS[-1] == "notes"
    assert rows["zoe"]["status"] == "ok" and rows["zoe"]["notes"] == "a.ipynb: x; b.ipynb: y"
    assert rows["al"]["status"] == "timeout: the checks of test_softmax: slow" and rows["al"]["notes"] == ""
    assert "ok (a.ipynb: x; b.ipynb: y)" in format_table(results)  # the console table still shows them



def test_the_console_table_calls_a_blank_notebook_blank_as_the_report_does():
    """A notebook handed in with every exercise still the release's stub: "ok" for grades.csv (nothing went
    wrong running it) but "blank" in the console table, as in the report; one exercise attempted is not blank."""
    def notebook(student: str, causes: list[str], score: float = 0.0) -> NotebookResult:
        cells = [CellResult(f"test_{i}", f"ex{i}", score, 2.0, cause=cause) for i, cause in enumerate(causes)]
        return NotebookResult(student, A01, score * len(causes), 2.0 * len(causes), cells=cells)
    results = [notebook("untouched", ["notimpl", "notimpl"]), notebook("tried", ["notimpl", "value"]),
               notebook("done", ["", ""], score=2.0)]
    lines = {line.split()[0]: line for line in format_table(results).splitlines()[2:]}
    assert lines["untouched"].endswith("blank: handed in, but no exercise attempted"), lines["untouched"]
    assert lines["tried"].endswith("  ok") and lines["done"].endswith("  ok"), lines
    assert results[0].status_text == "ok"  # grades.csv's status column is unchanged


def test_a_timeout_set_right_by_hand_no_longer_says_the_test_scored_0():
    """An instructor gives the points of a test the grader timed out on: the status keeps what happened, but
    no longer says the test scored 0; an incident in another test keeps its words."""
    detail = ("the checks of test_softmax: ran past 60 s (this test scored 0); "
              "the checks of test_attention: ran past 60 s (this test scored 0)")
    cells = [CellResult("test_softmax", "softmax", 5.0, 5.0, by_hand=True), CellResult("test_attention", "a", 0.0, 4.0)]
    r = NotebookResult("al", A01, 5.0, 9.0, Status.TIMEOUT, cells=cells, detail=detail)
    assert r.status_text == ("timeout: the checks of test_softmax: ran past 60 s (the grader scored it 0; 5 of 5 set by "
                             "hand since); the checks of test_attention: ran past 60 s (this test scored 0)")
    cells[0].by_hand = False
    assert r.status_text == f"timeout: {detail}"

# --------------------------------------------------------------------------- the report
def _result(student: str, *cells: CellResult, **kwargs) -> NotebookResult:
    return NotebookResult(student, A01, sum(c.score for c in cells), sum(c.max_score for c in cells), cells=list(cells),
                          **kwargs)


def test_the_report_counts_mistakes_from_the_field_not_the_words(tmp_path):
    named = f"softmax gave a wrong result\n  {core.KNOWN_MISTAKE}{NO_MAX.name}.\n  Where to look: ..."
    reworded = "softmax is off: this looks like the classic overflow slip"
    results = [
        _result("a", CellResult("test_softmax", "softmax", 0, 3, named, mistake=NO_MAX.name),
                CellResult("test_softmax_stability", "softmax", 0, 2, named, mistake=NO_MAX.name)),
        _result("b", CellResult("test_softmax", "softmax", 0, 3, reworded, mistake=NO_MAX.name)),
        _result("c", CellResult("test_softmax", "softmax", 0, 3, f"{core.KNOWN_MISTAKE}{SUM_RULE.name}.\n")),
        _result("d", CellResult("test_softmax", "softmax", 3, 3), notes=["x.ipynb: renamed"]),
        _result("e", CellResult("test_softmax", "softmax", 0, 3), status=Status.CRASH, detail="kernel died"),
    ]
    assert mistake_counts(results) == {NO_MAX.name: 2}  # once per student; the words alone count nothing
    page = class_report(results, tmp_path / "report.html").read_text()
    assert f"<tr><td>{NO_MAX.name}</td><td>2</td></tr>" in page
    assert SUM_RULE.name not in page
    assert "<tr><td>crash</td><td>1</td></tr>" in page and "renamed" not in page  # a note is no incident


def test_the_report_names_who_needs_attention_and_links_every_student(tmp_path):
    """Per student: scores per notebook linked to the feedback, blank told from missing, lateness,
    incidents with the student, review flags; a hostile detail is escaped; the picture's alt text
    carries its numbers; the page declares its language."""
    from autograder.lateness import LatePolicy

    full = _result("ann", CellResult("test_softmax", "softmax", 3, 3), CellResult("test_dot", "dot", 2, 2))
    blank = _result("bo", CellResult("test_softmax", "softmax", 0, 3, "not written", cause="notimpl"),
                    CellResult("test_dot", "dot", 0, 2, "not written", cause="notimpl"))
    late = _result("cy", CellResult("test_softmax", "softmax", 3, 3), CellResult("test_dot", "dot", 0, 2, cause="value"),
                   late_penalty=0.3, seconds_late=2 * 3600, due="2026-12-01T23:59:00Z")
    crashed = _result("<b>dee</b>", CellResult("test_softmax", "softmax", 0, 3, cause="error"), status=Status.CRASH,
                      detail="the process died <script>alert(1)</script>", review="getattr(F, 'x' + 'y')")
    missing = NotebookResult("eve", A01, 0.0, 5.0, Status.MISSING, detail="no notebook")
    (tmp_path / "feedback" / "ann").mkdir(parents=True)
    (tmp_path / "feedback" / "ann" / f"{A01}.html").write_text("feedback")
    page = class_report([full, blank, late, crashed, missing], tmp_path / "report.html",
                        LatePolicy.parse("per-day:10")).read_text()
    assert '<html lang="en">' in page
    assert f'href="feedback/ann/{A01}.html"' in page and 'href="feedback/bo/' not in page  # only where one exists
    attention = page.split('id="attention"')[1].split('id="students"')[0]
    assert "ann" not in attention
    assert "blank (handed in, no exercise attempted)" in attention and "missing (nothing handed in)" in attention
    assert "2 h late (due 2026-12-01T23:59:00Z), 0.3 points taken" in attention
    assert "code flagged for review" in attention
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;dee&lt;/b&gt;" in page
    incidents = page.split("Which students, and what happened")[1]
    assert "&lt;b&gt;dee&lt;/b&gt;" in incidents and "the process died" in incidents
    assert "softmax: 4 students (0-20%: 2, 20-40%: 0, 40-60%: 0, 60-80%: 0, 80-100%: 2), mean 50%" in page
    assert "10% of the notebook&#39;s points per day" in page


# --------------------------------------------------------------------------- saved runs
def test_saved_runs_round_trip_the_new_fields(tmp_path):
    r = _result("a", CellResult("test_softmax", "softmax", 0, 3, "wrong", mistake=NO_MAX.name, expected="[1]",
                                received="[nan]"), status=Status.EXIT, detail="os._exit", notes=["n: 1"],
                other_kinds=[Status.SANDBOX])
    path = tmp_path / "a" / f"{A01}.json"
    _save_result(path, "fp", r)
    assert _load_result(path, "fp") == r
    assert _load_result(path) == r
    assert _load_result(path, "other") is None


def test_an_older_saved_run_is_read_gracefully(tmp_path):
    path = tmp_path / f"{A01}.json"
    old = {"student_id": "a", "notebook": A01, "score": 0, "max_score": 3,
           "status": "ok (Copy of 01.ipynb: a second notebook; graded the first one found)",
           "cells": [{"grade_id": "test_softmax", "exercise": "softmax", "score": 0.0, "max_score": 3.0,
                      "message": "wrong"}],
           "review": "", "sandbox": "bubblewrap", "late_penalty": 0.0, "timestamp": "", "source_file": ""}
    path.write_text(json.dumps({"fingerprint": "fp", "result": old}))
    r = _load_result(path)
    assert r.status is Status.OK and r.detail == "" and r.notes == ["Copy of 01.ipynb: a second notebook; graded the first one found"]
    assert r.cells[0].mistake == "" and r.cells[0].message == "wrong"
    assert _load_result(path, "fp") is None  # not reused in place of grading: grading again fills in the fields
    assert status_from_text("timeout: the checks of test_x: slow (this test scored 0); crash: x") == \
        (Status.TIMEOUT, "the checks of test_x: slow (this test scored 0); crash: x", [])
    assert status_from_text("unreadable notebook: not JSON") == (Status.UNREADABLE, "not JSON", [])


@pytest.mark.parametrize("change", [
    {"status": "crash!"}, {"status": 3}, {"notes": "a note"}, {"notes": [1]}, {"other_kinds": ["nope"]},
    {"score": "3"}, {"cells": [{"grade_id": "t", "exercise": "e", "score": 0, "max_score": 1, "mistake": 5}]},
    {"cells": {"t": 1}}, {"unknown": 1},
])
def test_a_damaged_saved_run_is_refused(tmp_path, change):
    r = _result("a", CellResult("test_softmax", "softmax", 0, 3, "wrong", mistake=NO_MAX.name))
    path = tmp_path / f"{A01}.json"
    _save_result(path, "fp", r)
    payload = json.loads(path.read_text())
    payload["result"].update(change)
    path.write_text(json.dumps(payload))
    assert _load_result(path) is None and _load_result(path, "fp") is None


def test_a_damaged_record_times_nothing_and_stops_nothing(tmp_path):
    """The times a grade's record keeps (of every notebook found for it) come from a file on disk: a damaged
    entry (not a string, not a time) is left out, never an exception that stops the class's intake."""
    from autograder import grade as grading

    path = grading._record_path(tmp_path, "bob", A01)
    path.parent.mkdir(parents=True)
    path.write_text('{"times": {"a": 5, "b": null, "c": "not a time", "d": "2025-12-01T20:00:00+00:00"}}')
    known = grading.known_times(tmp_path)("bob", A01)
    assert set(known) == {"c", "d"} and known["d"].isoformat() == "2025-12-01T20:00:00+00:00"
    assert known["c"].year == 9999  # unreadable: later than any file time, so it never decides
    path.write_text('{"times": [1, 2]}')
    assert grading.known_times(tmp_path)("bob", A01) == {}


def test_the_unreadable_notebooks_page_names_the_students_own_file(tmp_path):
    """The file name on the page of a notebook the grader could not read, from source_file, whose path and class
    folder may hold ' (' themselves (a review found 'week1 (copy)' misread)."""
    from autograder.report import unreadable_feedback

    for source, shown in ((f"carol/{A01} (1).ipynb (file time; in week1 (copy))", f"<code>{A01} (1).ipynb</code>"),
                          ("carol.zip/work/01.ipynb (the zip's file time)", "<code>01.ipynb</code>")):
        r = NotebookResult("carol", A01, 0.0, 17.0, Status.UNREADABLE, detail="not valid JSON", source_file=source)
        page = unreadable_feedback(r, tmp_path / "page.html").read_text()
        assert f"The file you handed in, {shown}," in page and "0 / 17" in page, page


def test_grades_csv_gives_a_notebook_not_due_yet_no_score_and_no_missing_status(tmp_path):
    """An instructor's first week (finding 9): a student given an extension before handing in had `score 0` and a
    status `missing: not handed in yet: due ...` in grades.csv (a filter on 'missing' or on the score counted a 0),
    while grades_wide.csv and the exports left the cell empty. Now an empty score and 'not handed in yet: due ...'."""
    from autograder.grade import write_wide_csv

    waiting = NotebookResult("gus", A01, 0.0, 14.0, Status.MISSING, detail="not handed in yet: due 2026-12-10T23:59:00Z",
                             not_yet=True, due="2026-12-10T23:59:00Z")
    gone = NotebookResult("al", A01, 0.0, 14.0, Status.MISSING, detail="no notebook for this assignment was submitted")
    write_csv([waiting, gone], tmp_path / "grades.csv")
    rows = {r["student_id"]: r for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert (rows["gus"]["score"], rows["gus"]["status"]) == ("", "not handed in yet: due 2026-12-10T23:59:00Z"), rows
    assert (rows["al"]["score"], rows["al"]["status"]) == ("0", "missing: no notebook for this assignment was submitted")
    write_wide_csv([waiting, gone], tmp_path / "grades_wide.csv")
    wide = {r["student_id"]: r for r in csv.DictReader((tmp_path / "grades_wide.csv").open())}
    assert (wide["gus"][A01], wide["al"][A01]) == ("", "0"), wide  # the two tables agree


def test_a_notebook_not_due_yet_has_no_score_and_is_not_called_missing(tmp_path):
    """An extension given before the student hands in: the exports leave it empty, and the console and the report's
    table said "0 / 14" and "missing" (an instructor's first week): now "- / 14" and "not handed in yet"."""
    waiting = NotebookResult("gus", A01, 0.0, 14.0, Status.MISSING, detail="not handed in yet: due 2026-12-10T23:59:00Z",
                             not_yet=True)
    gone = NotebookResult("al", A01, 0.0, 14.0, Status.MISSING, detail="no notebook")
    lines = {line.split()[0]: line for line in format_table([waiting, gone]).splitlines()[2:]}
    assert "- / 14" in lines["gus"] and "0 / 14" in lines["al"], lines
    assert "missing" not in lines["gus"] and "not handed in yet: due 2026-12-10T23:59:00Z" in lines["gus"], lines
    page = class_report([waiting, gone], tmp_path / "report.html").read_text()
    gus = page[page.index('id="student-gus"'):]
    gus = gus[:gus.index("</tr>")]
    assert "not handed in yet" in gus and "missing" not in gus, gus
    al = page[page.index('id="student-al"'):]
    assert "missing" in al[:al.index("</tr>")]
