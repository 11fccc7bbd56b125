"""A real term, graded for real: two folders into one output, a roster, a manual grade made in the
gradebook (as formgrader does), a late student with a due date, regrading exactly what is asked.
The gradebook is the one truth: grades.csv, grades_wide.csv and the report are rebuilt from it
after every run."""
from __future__ import annotations

import csv
import os
from datetime import datetime, timezone

import nbformat
import pytest

from autograder.grade import grade

from .conftest import inject, solved_notebook

pytestmark = pytest.mark.slow

A01 = "01_similarity_attention"


def _rows(out) -> dict[tuple[str, str], dict]:
    return {(r["student_id"], r["notebook"]): r for r in csv.DictReader((out / "grades.csv").open())}


HANDED_IN = datetime(2025, 11, 30, 12, 0, tzinfo=timezone.utc).timestamp()  # before the term's due date, all past


def _write(folder, student, nb) -> None:
    (folder / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / student / f"{A01}.ipynb")
    os.utime(folder / student / f"{A01}.ipynb", (HANDED_IN, HANDED_IN))


@pytest.fixture(scope="module")
def term(course, tmp_path_factory):
    """Monday's folder (ann, ben), Friday's folder (cat, late), a roster with dan who never submits."""
    root = tmp_path_factory.mktemp("term")
    good = solved_notebook(course, A01)
    wrong = inject(solved_notebook(course, A01), {"dot_similarity": "def dot_similarity(E):\n    return E.T @ E"})
    monday, friday, out = root / "monday", root / "friday", root / "out"
    _write(monday, "ann", good)
    _write(monday, "ben", wrong)
    _write(friday, "cat", good)
    late = friday / "submitted" / "lou" / A01  # nbgrader's tree, with its timestamp.txt
    late.mkdir(parents=True)
    nbformat.write(good, late / f"{A01}.ipynb")
    (late / "timestamp.txt").write_text("2025-12-03 10:00:00.000000 UTC")
    roster = root / "roster.csv"
    roster.write_text("id,first_name,last_name\nann,Ann,A\nben,Ben,B\ncat,Cat,C\nlou,Lou,L\ndan,Dan,D\n")
    due = {A01: datetime(2025, 12, 1, 23, 59, tzinfo=timezone.utc)}
    first = grade(monday, out, progress=False, workers=2, roster=roster, due=due, assignments=[A01],
                  late_penalty="zero")
    second = grade(friday, out, progress=False, workers=2, assignments=[A01])
    return {"out": out, "first": first, "second": second, "root": root, "good": good}


def test_second_folder_keeps_the_first_and_the_roster(term):
    rows = _rows(term["out"])
    assert {s for s, n in rows if n == A01} == {"ann", "ben", "cat", "lou", "dan"}
    assert rows["ann", A01]["status"] == "ok" and rows["ann", A01]["score"] == "17"
    assert rows["ben", A01]["score"] == "16"
    assert rows["dan", A01]["status"].startswith("missing")
    wide = {r["student_id"]: r for r in csv.DictReader((term["out"] / "grades_wide.csv").open())}
    assert set(wide) == {"ann", "ben", "cat", "lou", "dan"} and wide["ann"][A01] == "17"
    assert "dan" in (term["out"] / "report.html").read_text() or len(wide) == 5


def test_late_student_gets_the_policys_penalty_with_due_and_time(term):
    rows = _rows(term["out"])
    lou, cat = rows["lou", A01], rows["cat", A01]
    assert lou["submitted"].startswith("2025-12-03T10:00:00") and lou["due"].startswith("2025-12-01T23:59:00")
    assert float(lou["seconds_late"]) == 34 * 3600 + 60  # 1 day 10 h 1 min after the due date
    assert float(lou["late_penalty"]) == float(lou["score"]) == 17  # penalty "zero": all points taken
    assert cat["seconds_late"] == "0" and cat["late_penalty"] == "0"
    wide = {r["student_id"]: r for r in csv.DictReader((term["out"] / "grades_wide.csv").open())}
    assert wide["lou"][A01] == "0" and wide["cat"][A01] == "17"


def test_only_notebooks_in_play_count(term):
    """Nothing of 02-07 was handed out or given a due date: no row is 'missing' them, no total counts
    them; dan (roster only) is missing 01 alone."""
    rows = _rows(term["out"])
    assert {n for _, n in rows} == {A01}
    wide = {r["student_id"]: r for r in csv.DictReader((term["out"] / "grades_wide.csv").open())}
    assert wide["dan"]["max_total"] == "17" and wide["dan"]["total"] == "0"
    assert [r.student_id for r in term["second"] if r.notebook == A01] == ["cat", "dan", "lou"]  # dan listed too


def test_changing_the_late_policy_needs_no_force(term):
    """The penalty is applied when the grades are written: a plain run with another policy changes the
    CSVs, the gradebook (what formgrader shows) and lou's feedback page, and regrades nothing."""
    from nbgrader.api import Gradebook

    out = term["out"]
    record = out / "jobs" / f"lou--{A01}" / "verdicts.json"
    stamp = record.stat().st_mtime_ns
    feedback = out / "feedback" / "lou" / f"{A01}.html"
    assert "-17" in feedback.read_text()
    for policy, penalty, shown in [("per-day:10", 3.4, "-3.4"), ("none", 0.0, None), ("zero", 17.0, "-17")]:
        results = grade(term["root"] / "friday", out, progress=False, workers=1, assignments=[A01],
                        late_penalty=policy)
        lou = next(r for r in results if r.student_id == "lou")
        assert lou.late_penalty == penalty and _rows(out)["lou", A01]["late_penalty"] == f"{penalty:g}", policy
        with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
            assert gb.find_submission_notebook(A01, A01, "lou").late_submission_penalty == penalty, policy
        page = feedback.read_text()
        assert (shown in page) if shown else ("Late submission penalty" not in page), policy
        assert "Handed in 2025-12-03 10:00 UTC; due 2025-12-01 23:59 UTC: <strong>1 day 10 h late</strong>" in page
        assert (f"{penalty:g} points taken for lateness" if penalty else "no points taken") in page, policy
    on_time = (out / "feedback" / "cat" / f"{A01}.html").read_text()
    assert "due 2025-12-01 23:59 UTC: on time." in on_time
    assert record.stat().st_mtime_ns == stamp, "changing the policy regraded the notebook"


def test_a_bad_policy_is_refused_with_what_is_accepted():
    from autograder.lateness import LatePolicy, PolicyError

    for bad in ("half", "per-day:0", "per-day:x", "per-day:150"):
        with pytest.raises(PolicyError, match="per-day:P"):
            LatePolicy.parse(bad)
    policy = LatePolicy.parse("per-day:25")
    assert policy.penalty(10, 20, 1) == 5 and policy.penalty(10, 20, 86401) == 10  # a day or part of one
    assert policy.penalty(10, 20, 0) == 0 and LatePolicy.parse("zero").penalty(7, 20, 5) == 7


def test_manual_grade_shows_in_the_csv_after_the_next_run(term):
    from nbgrader.api import Gradebook

    out = term["out"]
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:  # what formgrader's "manual grade" does
        grade_ = gb.find_grade("test_dot_similarity", A01, A01, "ben")
        grade_.manual_score = grade_.max_score
        gb.db.commit()
    grade(term["root"] / "monday", out, progress=False, assignments=[A01])  # nothing to regrade
    assert _rows(out)["ben", A01]["score"] == "17"


def test_student_and_force_regrade_exactly_what_is_asked(term):
    out = term["out"]
    ann = out / "jobs" / f"ann--{A01}" / "verdicts.json"
    ben = out / "jobs" / f"ben--{A01}" / "verdicts.json"
    ann_stamp, ben_stamp = ann.stat().st_mtime_ns, ben.stat().st_mtime_ns
    results = grade(term["root"] / "monday", out, progress=False, students=["ann"], force=True, assignments=[A01])
    assert {r.student_id for r in results} == {"ann"}
    assert ann.stat().st_mtime_ns != ann_stamp, "--force did not regrade ann"
    assert ben.stat().st_mtime_ns == ben_stamp, "ben was regraded without being asked"
