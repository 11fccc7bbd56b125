"""`attn-course export OUT --to canvas|gradescope|prairielearn|moodle` (autograder/lms.py).

Each layout is checked against what its platform documents or its importer reads:
* Canvas's gradebook import (Canvas's own export, and its importer, lib/gradebook_importer.rb in
  instructure/canvas-lms): a header Student, ID, SIS User ID, SIS Login ID, Section, then one
  column per assignment ('title (id)' names an existing one, a plain title is matched by title
  or made), a row whose first cell holds 'Points Possible', then one row per student, tied by
  the Canvas user id in the ID column;
* Gradescope's autograder results.json (gradescope-autograders.readthedocs.io, specs): a
  top-level score overriding the tests' total, tests with name, score, max_score, status
  passed|failed, output;
* PrairieLearn's external grader results (prairielearn.readthedocs.io, externalGrading):
  gradable, score from 0 to 1, tests with name, points, max_points, message; format_errors when
  not gradable;
* Moodle's CSV grade import (docs.moodle.org, Grade import): a header row, a column to identify
  users by (email), one column per grade item.

Unit level on NotebookResult lists (late penalty, held-back and missing notebooks, formula cells);
one slow test grades a Canvas-named class for real, enters a manual grade in the gradebook as
formgrader does, and exports through the command without grading again.
"""
from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder import lms
from autograder.grade import CellResult, NotebookResult
from autograder.outcomes import Status
from course_tools import cli

A01, A02 = "01_similarity_attention", "02_queries_keys_values"
DUE = "2026-12-01T23:59:00Z"


def _cells(*scores: tuple[str, float, float, str]) -> list[CellResult]:
    return [CellResult(gid, gid.removeprefix("test_"), s, top, message) for gid, s, top, message in scores]


@pytest.fixture
def results() -> list[NotebookResult]:
    """Four students x two notebooks: two graded from Canvas file names (one late with a per-day
    penalty, one late under 'zero' with 02 missing), a folder student with a grader incident and an
    unreadable notebook, and a roster student whose id would start a spreadsheet formula."""
    smith = "smithjane_101_9001_01_similarity_attention.ipynb (file time)"
    return [
        NotebookResult("smithjane", A01, 17.0, 17.0, cells=_cells(("test_dot_similarity", 3, 3, ""),
                                                                   ("test_softmax", 14, 14, "")), source_file=smith),
        NotebookResult("smithjane", A02, 10.0, 12.0, late_penalty=1.2, seconds_late=3600.0, due=DUE,
                       cells=_cells(("test_attention", 10, 10, ""),
                                    ("test_scores", 0, 2, "=HYPERLINK(\"http://x\") gave a wrong result")),
                       source_file="smithjane_101_9002_02_queries_keys_values.ipynb (file time)"),
        NotebookResult("doejohn", A01, 15.0, 17.0, late_penalty=15.0, seconds_late=60.0, due=DUE,
                       cells=_cells(("test_dot_similarity", 1, 3, "ValueError: shapes"), ("test_softmax", 14, 14, "")),
                       source_file="doejohn_LATE_102_9003_01_similarity_attention.ipynb (file time)"),
        NotebookResult("doejohn", A02, 0.0, 12.0, Status.MISSING, detail="no notebook for this assignment was submitted"),
        NotebookResult("zed", A01, 0.0, 17.0, Status.INCIDENT, detail="the sandbox could not start",
                       source_file="zed/01_similarity_attention.ipynb (file time)"),
        NotebookResult("zed", A02, 0.0, 12.0, Status.UNREADABLE, detail="not a notebook (bad JSON)",
                       source_file="zed/02_queries_keys_values.ipynb (file time)"),
        NotebookResult("@SUM(A1)", A01, 17.0, 17.0, cells=_cells(("test_softmax", 17, 17, ""))),
        NotebookResult("@SUM(A1)", A02, 12.0, 12.0, cells=_cells(("test_attention", 12, 12, ""))),
    ]


PEOPLE = {"smithjane": {"first_name": "Jane", "last_name": "Smith", "email": "jane@example.edu"},
          "doejohn": {"first_name": "John", "last_name": "Doe", "email": "john@example.edu"},
          "zed": {"first_name": "", "last_name": "", "email": ""}}


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _canvas_rows(path: Path) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(header, Points Possible row, {Student: row}), read as Canvas's importer reads them."""
    header, *rest = _rows(path)
    # GradebookImporter#header?: row[0] holds "Student", row[1] "ID"; SIS User ID and SIS Login ID
    # next, and the last student-information column is "Section" (then the assignments)
    assert "Student" in header[0] and "ID" in header[1]
    assert header[2:5] == ["SIS User ID", "SIS Login ID", "Section"]
    [points_row] = [r for r in rest if "Points Possible" in r[0]]
    assert points_row[:5] == [lms.POINTS_POSSIBLE, "", "", "", ""]
    assert all(len(r) == len(header) for r in rest)
    return header, points_row, {r[0]: r for r in rest if "Points Possible" not in r[0]}


# --------------------------------------------------------------------------- Canvas
def test_canvas_without_roster_ties_students_by_the_user_id_of_their_canvas_files(results, tmp_path):
    done = lms.canvas_csv(results, tmp_path / "canvas.csv", people=PEOPLE)
    header, points_row, rows = _canvas_rows(tmp_path / "canvas.csv")
    assert header == lms.CANVAS_COLUMNS + [A01, A02]  # plain titles: Canvas matches them by title, or makes them
    assert points_row[5:] == ["17", "12"]
    smith, doe = rows["Smith, Jane"], rows["Doe, John"]  # named as Canvas sorts names (its importer also matches those)
    assert smith[1] == "101" and smith[5:] == ["17", "8.8"]  # 10 - 1.2 late
    assert doe[1] == "102" and doe[5:] == ["0", "0"]  # all taken for lateness; 02 missing: 0, as in grades_wide.csv
    assert rows["zed"][1:] == ["", "", "", "", "", "0"]  # the incident held back (empty), the unreadable notebook 0
    assert rows["'@SUM(A1)"][5:] == ["17", "12"]  # a formula-like id written as text
    problems = "\n".join(done.problems)
    assert "zed: no Canvas user id" in problems and "@SUM(A1): no Canvas user id" in problems
    assert f"zed {A01}: not exported (grader incident" in problems
    assert "smithjane" not in problems and "doejohn" not in problems


def _roster(tmp_path: Path, delimiter: str = ",") -> Path:
    """Canvas's gradebook export: the header, the Manual Posting and Points Possible rows, students, the test student."""
    rows = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", f"{A01} (555)", "Quiz 1 (556)",
             "Current Score", "Final Score"],
            ["", "", "", "", "", "Manual Posting", "", "", ""],
            [lms.POINTS_POSSIBLE, "", "", "", "", "17.00", "5.00", "(read only)", "(read only)"],
            ["Smith, Jane", "101", "S0101", "jsmith", "Section 1", "", "4.00", "", ""],
            ["Zed, Zoe", "104", "S0104", "zed", "Section 2", "", "", "", ""],
            ["Absent, Ann", "105", "S0105", "aabsent", "Section 1", "", "", "", ""],
            ["Student, Test", "106", "", "", "Section 1", "", "", "", ""]]
    path = tmp_path / "canvas-export.csv"
    with path.open("w", newline="", encoding="utf-8-sig") as fh:  # Canvas writes a byte-order mark
        csv.writer(fh, delimiter=delimiter).writerows(rows)
    return path


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_canvas_with_its_roster_fills_ids_sections_and_assignment_ids(results, tmp_path, delimiter):
    roster = lms.read_canvas_roster(_roster(tmp_path, delimiter))
    assert [r["ID"] for r in roster.students] == ["101", "104", "105", "106"]
    done = lms.canvas_csv(results, tmp_path / "canvas.csv", roster, PEOPLE)
    header, points_row, rows = _canvas_rows(tmp_path / "canvas.csv")
    assert header[5:] == [f"{A01} (555)", A02]  # the roster's own header: that very assignment
    assert rows["Smith, Jane"][:5] == ["Smith, Jane", "101", "S0101", "jsmith", "Section 1"]
    assert rows["Zed, Zoe"][:5] == ["Zed, Zoe", "104", "S0104", "zed", "Section 2"]  # by SIS Login ID
    assert rows["Zed, Zoe"][5:] == ["", "0"]
    assert rows["Doe, John"][1] == "102"  # not in the roster: listed, still a row, with its Canvas id
    problems = "\n".join(done.problems)
    assert "doejohn: not tied to a row of the Canvas roster (Canvas user 102" in problems
    assert "@SUM(A1): not tied" in problems and "smithjane" not in problems and "zed:" not in problems
    notes = "\n".join(done.notes)
    assert "Absent, Ann" in notes and "Student, Test" in notes and A02 in notes


def test_canvas_roster_matching_by_name_and_refusing_to_guess():
    roster = [{"Student": "Smith, Jane", "ID": "1"}, {"Student": "Lee, Kim", "ID": "2"},
              {"Student": "Lee, Kim", "ID": "3"}, {"Student": "Ørsted, Hans", "ID": "4", "SIS Login ID": "hco"}]
    ours = {"smithjane": [NotebookResult("smithjane", A01, 1, 2)], "leekim": [NotebookResult("leekim", A01, 1, 2)],
            "Orsted_Hans": [NotebookResult("Orsted_Hans", A01, 1, 2)], "HCO": [NotebookResult("HCO", A01, 1, 2)]}
    found, why = lms.match_canvas(ours, roster)
    assert found["smithjane"]["ID"] == "1"
    assert "several roster rows fit (2, 3)" in why["leekim"]
    # the name and the login both point at Canvas user 4, for two of our students: neither is guessed
    assert "Orsted_Hans" in why and "HCO" in why and "fits HCO, Orsted_Hans" in why["HCO"]


def test_canvas_roster_matching_by_the_names_of_the_class_roster():
    """An id that is no Canvas id (dave, from a folder name) is tied by the names the class roster gave the
    gradebook: the export wrote "Brown, Dave" in its Student column and still said dave was tied to no row."""
    roster = [{"Student": "Brown, Dave", "ID": "7"}, {"Student": "Hopper, Grace", "ID": "8"}]
    ours = {"dave": [NotebookResult("dave", A01, 1, 2)], "g.h": [NotebookResult("g.h", A01, 1, 2)],
            "nobody": [NotebookResult("nobody", A01, 1, 2)]}
    people = {"dave": {"first_name": "Dave", "last_name": "Brown"}, "g.h": {"first_name": "Grace", "last_name": "Hopper"}}
    found, why = lms.match_canvas(ours, roster, people)
    assert (found["dave"]["ID"], found["g.h"]["ID"]) == ("7", "8") and "nobody" in why, (found, why)
    assert lms.match_canvas(ours, roster)[0] == {}  # by the ids alone, nothing fits: the names did it


def test_canvas_roster_matching_by_the_email_of_the_class_roster():
    """An instructor's walkthrough: Canvas named gina "Green, Georgina" with her email as SIS Login ID, the class
    roster gave her the same email, and she was exported tied to no row (and the row listed as having no grades)."""
    roster = [{"Student": "Green, Georgina", "ID": "9", "SIS Login ID": "Gina@Uni.example"}]
    ours = {"gina": [NotebookResult("gina", A01, 1, 2)]}
    people = {"gina": {"first_name": "Gina", "last_name": "Green", "email": "gina@uni.example"}}
    assert lms.match_canvas(ours, roster, people)[0]["gina"]["ID"] == "9"
    assert "gina" in lms.match_canvas(ours, roster, {"gina": {"first_name": "Gina", "last_name": "Green"}})[1]


def _split_class() -> tuple[list[NotebookResult], dict[str, dict[str, str]], lms.CanvasRoster]:
    """An instructor's first week (finding 1): a Canvas download graded with a roster of institutional ids. Each
    Canvas student is two: smithjohn (graded from smithjohn_345678_...) and the roster's jsmith (missing, 0); a folder
    Alice/ and the roster's alice (missing) likewise. The Canvas gradebook export ties 345678 to the login jsmith."""
    missing = dict(status=Status.MISSING, detail="no notebook for this assignment was submitted")
    results = [
        NotebookResult("Alice", A01, 17.0, 17.0, source_file=f"Alice/{A01}.ipynb (file time)"),
        NotebookResult("alice", A01, 0.0, 17.0, **missing),
        NotebookResult("doejane", A01, 13.0, 17.0, source_file=f"doejane_456789_9013_{A01}.ipynb (file time)"),
        NotebookResult("jdoe", A01, 0.0, 17.0, **missing),
        NotebookResult("jsmith", A01, 0.0, 17.0, **missing),
        NotebookResult("smithjohn", A01, 17.0, 17.0, source_file=f"smithjohn_345678_9012_{A01}.ipynb (file time)"),
    ]
    people = {"alice": {"first_name": "Alice", "last_name": "Test", "email": "alice@u.example"},
              "jsmith": {"first_name": "John", "last_name": "Smith", "email": "jsmith@u.example"},
              "jdoe": {"first_name": "Jane", "last_name": "Doe", "email": "jdoe@u.example"}}
    roster = lms.CanvasRoster([
        {"Student": "Smith, John", "ID": "345678", "SIS User ID": "S001", "SIS Login ID": "jsmith", "Section": "Sec 1"},
        {"Student": "Doe, Jane", "ID": "456789", "SIS User ID": "S002", "SIS Login ID": "jdoe", "Section": "Sec 1"},
        {"Student": "Test, Alice", "ID": "567890", "SIS User ID": "S003", "SIS Login ID": "alice", "Section": "Sec 1"},
        {"Student": "Away, Al", "ID": "678901", "SIS User ID": "S004", "SIS Login ID": "al", "Section": "Sec 1"},
    ], {A01: f"{A01} (99001)"})
    return results, people, roster


def test_canvas_never_writes_a_0_row_for_a_canvas_user_a_graded_student_has_a_row_for(tmp_path):
    """The export wrote "Smith, John",,,,,0 beside smithjohn,345678,...,17: one person, two rows, and Canvas could
    settle on the 0; and its note said the roster students' grades were 'left as they are' while the file held a 0
    row under each of their names. Now the student graded from that Canvas user's file is tied to the row, the 0 of
    the id that handed in nothing is not written (listed), and the note names only the users no row goes to."""
    results, people, roster = _split_class()
    done = lms.canvas_csv(results, tmp_path / "canvas.csv", roster, people)
    _, _, rows = _canvas_rows(tmp_path / "canvas.csv")
    assert rows["Smith, John"] == ["Smith, John", "345678", "S001", "jsmith", "Sec 1", "17"], rows
    assert rows["Doe, Jane"] == ["Doe, Jane", "456789", "S002", "jdoe", "Sec 1", "13"], rows
    assert "Test, Alice" not in rows, rows  # alice's 0: Alice (17, a folder) fits Test, Alice too: not guessed
    assert rows["Alice"][1:] == ["", "", "", "", "17"], rows
    assert len(rows) == 3, rows
    problems = "\n".join(done.problems)
    for sid, user in (("jsmith", "345678 (Smith, John)"), ("jdoe", "456789 (Doe, Jane)"), ("alice", "567890 (Test, Alice)")):
        assert f"{sid}: no row written (they handed in nothing here, a 0): Canvas would give a row named" in problems
        assert f"Canvas user {user}" in problems, problems
    assert not [p for p in done.problems if p.startswith(("smithjohn:", "doejane:"))], problems  # tied, no question
    [left] = [n for n in done.notes if "as they are" in n]
    assert left.startswith("2 roster student(s) have no row in this file") and left.endswith(": Away, Al; Test, Alice")
    # without Canvas's roster, a Canvas file's name part is its user's name: no "Smith, John" 0 beside smithjohn's row
    done = lms.canvas_csv(results, tmp_path / "plain.csv", people=people)
    _, _, rows = _canvas_rows(tmp_path / "plain.csv")
    assert "Smith, John" not in rows and "Doe, Jane" not in rows and rows["smithjohn"][1] == "345678", rows
    assert "jsmith: no row written" in "\n".join(done.problems)


def test_the_not_on_the_roster_line_says_what_each_format_writes_and_a_case_twin(tmp_path):
    """The Canvas and Moodle exports said "their results.json files are written under this id" (finding 8); and a
    folder Alice/ beside the roster's alice said nothing of the case (finding 2)."""
    course = tmp_path / "course"
    course.mkdir()
    (course / "roster-ids.json").write_text('["alice", "bob"]')
    results = [NotebookResult("Alice", A01, 17.0, 17.0), NotebookResult("zed", A01, 3.0, 17.0),
               NotebookResult("bob", A01, 0.0, 17.0, Status.MISSING)]
    said = {to: lms._not_on_the_roster(tmp_path, results, to) for to in lms.FORMATS}
    for to in ("canvas", "moodle"):
        assert all("results.json" not in line and "row of the CSV" in line for line in said[to]), said[to]
    for to in ("gradescope", "prairielearn"):
        assert "zed: not on the class roster (graded all the same): their results.json files are written under " \
               "this id; check whose folder or file this is before handing them on" in said[to], said[to]
    alice = [line for line in said["moodle"] if line.startswith("Alice:")][0]
    assert "the roster has 'alice', which differs from it only in case" in alice, alice
    assert all("only in case" not in line for line in said["moodle"] if line.startswith("zed:"))


@pytest.mark.parametrize("source, uid", [
    ("smithjane_101_9001_01_similarity_attention.ipynb (file time)", "101"),
    ("doejohn_LATE_102_9003_01 (1).ipynb (file time)", "102"),
    ("smithjane_101_9001_work.zip/inner/01_similarity_attention.ipynb (the zip's file time)", "101"),
    ("zed/01_similarity_attention.ipynb (file time)", ""),
    ("smithjane_101_9001_01_similarity_attention.ipynb (file time; in week1-late)", "101"),  # the class folder named
    ("submitted/ann/01_similarity_attention/01_similarity_attention.ipynb (timestamp.txt)", ""),
    ("Jane Smith_12345_assignsubmission_file_01.ipynb (file time)", ""),  # Moodle's participant id: not Canvas's
    ("", ""),
])
def test_canvas_user_id_comes_from_the_platforms_prefix_of_the_file_graded(source, uid):
    assert lms.canvas_user_id(source) == uid


@pytest.mark.parametrize("text, message", [
    ("id,first_name\nann,Ann\n", "no Student and no ID column (found: id, first_name)"),
    ("Student,Section\nSmith,S1\n", "no ID column"),
    ("", "found: no header"),
])
def test_a_roster_that_is_not_canvass_export_is_refused_saying_what_to_give(tmp_path, text, message):
    path = tmp_path / "roster.csv"
    path.write_text(text)
    with pytest.raises(lms.ExportError, match="Export Entire Gradebook") as err:
        lms.read_canvas_roster(path)
    assert message in str(err.value)
    with pytest.raises(lms.ExportError, match="cannot be read"):
        lms.read_canvas_roster(tmp_path / "nowhere.csv")


# --------------------------------------------------------------------------- Gradescope, PrairieLearn
def _loaded(dest: Path) -> dict[tuple[str, str], dict]:
    return {(p.parent.parent.name, p.parent.name): json.loads(p.read_text()) for p in dest.glob("*/*/results.json")}


def test_a_students_control_characters_are_never_raw_in_the_json_exports(results, tmp_path):
    """A red team: an exception message with an 8-bit CSI (U+009B) and a right-to-left override came into Gradescope's
    and PrairieLearn's results.json raw (JSON escapes only C0 controls), and `cat` of the file cleared the screen."""
    results[1].cells[1].message = "\x9b2J\x9bHall checks passed \u202eRLO \x1b]0;PWNED\x07 Zoë"
    for make, folder in ((lms.gradescope_result, "gs"), (lms.prairielearn_result, "pl")):
        lms.json_results(results, tmp_path / folder, make)
        text = (tmp_path / folder / "smithjane" / A02 / "results.json").read_text(encoding="utf-8")
        assert text.isascii() and "all checks passed" in text, text
        assert "Zoë" in json.dumps(json.loads(text), ensure_ascii=False), text  # a name comes back as it was


def test_gradescope_results_per_graded_notebook(results, tmp_path):
    done = lms.json_results(results, tmp_path / "gs", lms.gradescope_result)
    found = _loaded(tmp_path / "gs")
    # none for a missing or held-back notebook, nor for an id that cannot name a folder (listed)
    assert set(found) == {("smithjane", A01), ("smithjane", A02), ("doejohn", A01), ("zed", A02)}
    assert len(done.written) == 4 and done.notes[0].endswith(f"1 notebook not submitted, no results.json for them: doejohn {A02}")
    for result in found.values():
        assert isinstance(result["score"], float) and isinstance(result["output"], str)
        assert result["output_format"] == result["test_output_format"] == result["test_name_format"] == "text"
        for test in result["tests"]:
            assert isinstance(test["name"], str) and isinstance(test["output"], str)
            assert isinstance(test["score"], (int, float)) and isinstance(test["max_score"], (int, float))
            assert test.get("status", "passed") in ("passed", "failed")
        assert sum(t["score"] for t in result["tests"]) == pytest.approx(result["score"])  # the breakdown adds up
    late = found["smithjane", A02]
    assert late["score"] == pytest.approx(8.8)
    assert [t["status"] for t in late["tests"][:2]] == ["passed", "failed"]
    assert late["tests"][1]["output"].startswith("=HYPERLINK")  # JSON text: kept as it is, shown as text
    assert late["tests"][-1] == {"name": "late penalty", "score": -1.2, "max_score": 0.0,
                                 "output": f"1 h late (due {DUE}): the late policy takes 1.2 points"}
    assert late["extra_data"] == {"student_id": "smithjane", "notebook": A02, "max_score": 12.0,
                                  "late_penalty": 1.2, "status": "ok"}
    assert found["doejohn", A01]["score"] == 0.0 and found["zed", A02]["score"] == 0.0
    assert done.problems == ["'@SUM(A1)': not written, the student id cannot name a folder", 
        f"zed {A01}: not exported (grader incident: the sandbox could not start); grade it again, then export"]


def test_prairielearn_results_score_from_0_to_1(results, tmp_path):
    lms.json_results(results, tmp_path / "pl", lms.prairielearn_result)
    found = _loaded(tmp_path / "pl")
    for result in found.values():
        assert isinstance(result["gradable"], bool) and isinstance(result["message"], str)
        if result["gradable"]:
            assert isinstance(result["score"], float) and 0.0 <= result["score"] <= 1.0
            for test in result["tests"]:
                assert {"name", "description", "points", "max_points", "message"} <= set(test)
                assert all(isinstance(test[k], str) for k in ("name", "description", "message"))
                assert all(isinstance(test[k], (int, float)) for k in ("points", "max_points"))
    assert found["smithjane", A02]["score"] == pytest.approx(8.8 / 12)
    assert found["smithjane", A02]["tests"][-1]["points"] == -1.2
    assert found["smithjane", A01]["score"] == 1.0 and found["doejohn", A01]["score"] == 0.0
    unreadable = found["zed", A02]  # not gradable: no points lost, no attempt used
    assert unreadable["gradable"] is False and "score" not in unreadable
    assert unreadable["format_errors"] == ["unreadable notebook: not a notebook (bad JSON)"]


def test_prairielearn_says_where_it_differs_from_the_other_exports(results, tmp_path):
    """An instructor's walkthrough: 18 / 17 (extra credit typed in formgrader) became 1.0 in PrairieLearn and 18 in
    Canvas, and an unreadable notebook a 0 in Canvas and 'not gradable' in PrairieLearn, with nothing said."""
    results[0].score = 18.0  # 17 points and 1 of extra credit
    done = lms.json_results(results, tmp_path / "pl", lms.prairielearn_result)
    assert any(n.startswith("extra credit capped at the notebook's points") and f"smithjane {A01} (18 / 17)" in n
               for n in done.notes), done.notes
    assert any(n.startswith("not gradable in PrairieLearn") and f"zed {A02}" in n for n in done.notes), done.notes
    plain = lms.json_results(results[2:4], tmp_path / "pl2", lms.prairielearn_result)  # neither: nothing said
    assert not [n for n in plain.notes if "capped" in n or "not gradable" in n], plain.notes
    gradescope = lms.json_results(results, tmp_path / "gs", lms.gradescope_result)
    assert not [n for n in gradescope.notes if "PrairieLearn" in n]


def test_a_notebook_held_back_now_loses_an_earlier_exports_file(results, tmp_path):
    lms.json_results(results, tmp_path / "gs", lms.gradescope_result)
    smith = tmp_path / "gs" / "smithjane" / A01 / "results.json"
    assert smith.exists()
    results[0].status = Status.INCIDENT
    lms.json_results(results, tmp_path / "gs", lms.gradescope_result)
    assert not smith.exists()


def test_a_student_id_that_cannot_name_a_folder_is_listed_not_written(tmp_path):
    done = lms.json_results([NotebookResult("../up", A01, 1, 2)], tmp_path / "gs", lms.gradescope_result)
    assert not done.written and "'../up': not written" in done.problems[0]
    assert not (tmp_path / "up").exists()


# --------------------------------------------------------------------------- Moodle
def test_moodle_csv_identifies_users_by_email(results, tmp_path):
    done = lms.moodle_csv(results, tmp_path / "moodle.csv", PEOPLE)
    header, *rows = _rows(tmp_path / "moodle.csv")
    assert header == lms.MOODLE_COLUMNS + [A01, A02]
    by_id = {r[0]: r for r in rows}
    assert by_id["smithjane"] == ["smithjane", "Jane", "Smith", "jane@example.edu", "17", "8.8"]
    assert by_id["zed"][4:] == ["", "0"]  # held back: no grade given
    assert by_id["'@SUM(A1)"][3:] == ["", "17", "12"]
    problems = "\n".join(done.problems)
    assert "zed: no email address" in problems and "@SUM(A1): no email address" in problems
    assert "smithjane" not in problems
    assert not any("unlimited grades" in note for note in done.notes)


def test_moodle_csv_says_which_grades_are_above_the_items_maximum(results, tmp_path):
    """Extra credit past a notebook's points: Moodle refuses or caps such a grade on import unless the site allows
    unlimited grades; PrairieLearn's export said so, Moodle's did not (an instructor's first week)."""
    results[0].score, results[0].cells[0].extra_credit = 18.0, 1.0
    done = lms.moodle_csv(results, tmp_path / "moodle.csv", PEOPLE)
    assert _rows(tmp_path / "moodle.csv")[1:][[r[0] for r in _rows(tmp_path / "moodle.csv")[1:]].index("smithjane")][4] \
        == "18"
    [note] = [note for note in done.notes if "unlimited grades" in note]
    assert f"smithjane {A01} (18 / 17)" in note and "doejohn" not in note


# --------------------------------------------------------------------------- the command's arguments
def test_bad_arguments_say_what_is_wrong_and_what_to_give(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "nowhere"), "--to", "canvas"]) == 2
    assert "does not exist: give the folder `attn-course grade SUBMISSIONS --out OUT` wrote" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path), "--to", "canvas"]) == 2
    assert "is not a grading output (it has no gradebook.db, course/source" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path), "--to", "blackboard"]) == 2
    err = capsys.readouterr().err
    assert "--to 'blackboard': not a format this exports; give one of canvas, gradescope, prairielearn, moodle" in err
    assert "exporting" not in err, err  # refused before the work is announced (an instructor's walkthrough)
    assert cli.main(["export", str(tmp_path), "--to", "moodle", "--canvas-roster", "x.csv"]) == 2
    assert "--canvas-roster is for --to canvas only" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path)]) == 2  # --to is required
    assert "--to" in capsys.readouterr().err


# --------------------------------------------------------------------------- a real class, through the command
@pytest.mark.slow
def test_a_graded_canvas_class_exports_with_a_manual_grade_and_a_late_penalty(course, tmp_path, capsys):
    """Three Canvas uploads graded for real (one late by Canvas's mark, per-day:10), a manual grade
    entered in the gradebook afterwards as formgrader does, and no grading since: every export reads
    the gradebook, so the manual grade is in it (results.json, written by the grade run, has not)."""
    from nbgrader.api import Gradebook

    from autograder.grade import grade

    from .conftest import inject, solved_notebook

    subs, out = tmp_path / "canvas", tmp_path / "out"
    subs.mkdir()
    good = solved_notebook(course, A01)
    wrong = inject(solved_notebook(course, A01), {"dot_similarity": "def dot_similarity(E):\n    return E.T @ E"})
    nbformat.write(good, subs / f"smithjane_101_9001_{A01}.ipynb")
    nbformat.write(good, subs / f"doejohn_LATE_102_9002_{A01}.ipynb")
    nbformat.write(wrong, subs / f"roeeli_103_9003_{A01}.ipynb")
    due = {A01: datetime(2030, 1, 1, 23, 59, tzinfo=timezone.utc)}  # Canvas's _LATE_ makes doejohn late anyway
    graded = {r.student_id: r for r in grade(subs, out, progress=False, workers=2, due=due, late_penalty="per-day:10")}
    assert graded["roeeli"].score == 16 and graded["doejohn"].late_penalty == pytest.approx(1.7)
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        manual = gb.find_grade("test_dot_similarity", A01, A01, "roeeli")
        manual.manual_score = manual.max_score
        gb.find_comment("dot_similarity", A01, A01, "roeeli").manual_comment = "Right idea; E @ E.T compares words"
        gb.db.commit()
    assert {r["student_id"]: r["score"] for r in json.loads((out / "results.json").read_text())}["roeeli"] == 16

    roster = _roster(tmp_path)
    with roster.open("a", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([["Doe, John", "102", "S0102", "jdoe", "Section 1", "", "", "", ""],
                                  ["Roe, Eli", "103", "S0103", "eroe", "Section 2", "", "", "", ""]])
    assert cli.main(["export", str(out), "--to", "canvas", "--canvas-roster", str(roster)]) == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert f"canvas: 1 file -> {out / 'lms' / 'canvas.csv'}" in printed and "Absent, Ann" in printed
    header, points_row, rows = _canvas_rows(out / "lms" / "canvas.csv")
    assert header[5:] == [f"{A01} (555)"] and points_row[5:] == ["17"]
    assert rows["Smith, Jane"][1:] == ["101", "S0101", "jsmith", "Section 1", "17"]
    assert rows["Doe, John"][1:] == ["102", "S0102", "jdoe", "Section 1", "15.3"]  # 17 - 10% for a day late
    assert rows["Roe, Eli"][1:] == ["103", "S0103", "eroe", "Section 2", "17"]  # the manual grade

    assert cli.main(["export", str(out), "--to", "gradescope", "--dest", str(tmp_path / "gs")]) == 0
    printed = capsys.readouterr().out
    assert f"gradescope: 3 files -> {tmp_path / 'gs'}" in printed and "comments typed in formgrader" in printed
    gs = _loaded(tmp_path / "gs")
    assert gs["roeeli", A01]["score"] == 17 and gs["doejohn", A01]["score"] == pytest.approx(15.3)
    assert gs["doejohn", A01]["tests"][-1]["name"] == "late penalty"
    assert all(t["status"] == "passed" for t in gs["roeeli", A01]["tests"])  # the manual grade, cell by cell
    # the instructor's comment, which only the HTML page carried (a walkthrough found it missing here)
    assert "Comments from your instructor:\n  dot_similarity: Right idea; E @ E.T compares words" in \
        gs["roeeli", A01]["output"]
    assert "Comments from your instructor" not in gs["doejohn", A01]["output"]

    assert cli.main(["export", str(out), "--to", "prairielearn", "--dest", str(tmp_path / "pl")]) == 0
    pl = _loaded(tmp_path / "pl")
    assert pl["roeeli", A01]["score"] == 1.0 and pl["doejohn", A01]["score"] == pytest.approx(15.3 / 17)
    assert "dot_similarity: Right idea" in pl["roeeli", A01]["message"]

    assert cli.main(["export", str(out / "course"), "--to", "moodle"]) == 1  # no emails in this gradebook
    captured = capsys.readouterr()
    assert "3 to look at before importing" in captured.err and "roeeli: no email address" in captured.err
    assert {r["Student ID"]: r[A01] for r in csv.DictReader((out / "lms" / "moodle.csv").open())} == \
        {"smithjane": "17", "doejohn": "15.3", "roeeli": "17"}

    # the manual score taken back (formgrader's field emptied): every output, the student's page included,
    # returns to the automatic score (the page once kept "Score: 17 / 17")
    page = out / "feedback" / "roeeli" / f"{A01}.html"
    assert "(Score: 17 / 17)" in page.read_text()
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        gb.find_grade("test_dot_similarity", A01, A01, "roeeli").manual_score = None
        gb.db.commit()
    assert cli.main(["export", str(out), "--to", "gradescope", "--dest", str(tmp_path / "gs2")]) == 0
    assert _loaded(tmp_path / "gs2")["roeeli", A01]["score"] == 16
    assert "(Score: 16 / 17)" in page.read_text()


def test_ids_that_differ_only_in_case_are_named_by_the_folder_exports(tmp_path):
    """A red team's: 'alice' and 'Alice' are two students (ids keep their case: renaming one split a student across
    runs), written to two folders that a disk ignoring case makes one. The export says so."""
    results = [NotebookResult("alice", A01, 17, 17), NotebookResult("Alice", A01, 3, 17), NotebookResult("bob", A01, 5, 17)]
    for make in (lms.gradescope_result, lms.prairielearn_result):
        done = lms.json_results(results, tmp_path / make.__name__, make)
        (problem,) = [p for p in done.problems if "differ only in case" in p]
        assert problem.startswith("Alice and alice: student ids that differ only in case"), problem
    assert not [p for p in lms.json_results(results[2:], tmp_path / "one", lms.gradescope_result).problems if "case" in p]


def test_moodle_names_two_students_with_one_email(tmp_path):
    """Two roster rows with one email (a family's, a placeholder) are two students to grade, but Moodle maps users by
    email: the export names them (the roster used to be refused whole)."""
    results = [NotebookResult("ann", A01, 17, 17), NotebookResult("ben", A01, 3, 17), NotebookResult("cat", A01, 9, 17)]
    people = {"ann": {"email": "home@uni.example"}, "ben": {"email": "Home@uni.example"}, "cat": {"email": "c@uni.example"}}
    done = lms.moodle_csv(results, tmp_path / "moodle.csv", people)
    (problem,) = [p for p in done.problems if "the same email" in p]
    assert problem.startswith("ben: the same email as ann (Home@uni.example): Moodle would give both grades to one "
                              "account"), problem
