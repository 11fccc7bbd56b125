"""The grading core end to end, through real nbgrader: the demo class, grades.csv, feedback
without hidden tests, the submission layouts, and the student self-check."""
from __future__ import annotations

import csv
import os
import re
import shutil
import zipfile

import nbformat
import pytest

from autograder.grade import CSV_COLUMNS, grade
from autograder.outcomes import Status
from autograder.sandbox import isolation_mode
from autograder.selfcheck import format_report, self_check
from course_tools.demo import run_demo

from .conftest import inject, solved_notebook

pytestmark = pytest.mark.slow
A01 = "01_similarity_attention"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    results, problems = run_demo(out)
    return out, results, problems


def test_demo_class_scores_as_designed(demo):
    out, results, problems = demo
    assert problems == []
    by = {(r.student_id, r.notebook): r for r in results}
    for (student, _notebook), r in by.items():
        assert r.max_score > 0
        if student == "full-marks":
            assert r.score == r.max_score
        if student == "blank":
            assert r.score == 0
    assert by[("typical-mistake", A01)].score == by[("typical-mistake", A01)].max_score - 2


def test_grades_csv_has_one_row_per_student_and_notebook(demo):
    out, results, _ = demo
    rows = list(csv.DictReader((out / "graded" / "grades.csv").open()))
    assert list(rows[0]) == CSV_COLUMNS
    students = {r.student_id for r in results}
    assert {"full-marks", "blank", "typical-mistake"} <= students and len(students) >= 6
    assert len(rows) == len(results) == len(students) * len({r.notebook for r in results})
    honest = [row for row in rows if row["student_id"] in ("full-marks", "blank", "typical-mistake")]
    assert all(row["status"] == "ok" for row in honest)
    # a blank notebook is 'ok' at 0 (nothing went wrong), and said so where the console and the report say it
    assert all(row["notes"].startswith("blank: handed in, but no exercise attempted") == (row["student_id"] == "blank")
               for row in honest), honest


def test_class_report_has_pictures_and_mistakes(demo):
    out, _, _ = demo
    page = (out / "graded" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 3
    assert "softmax without subtracting the max" in page  # the typical mistake, recognised
    # the browser's rule behind the escaping: nothing runs or is fetched (the pictures still draw under it:
    # test_browser.test_class_report_shows_the_per_exercise_picture), links leave without a Referer
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert policy and "default-src 'none'" in policy.group(1) and "img-src data:" in policy.group(1), page[:600]
    assert '<meta name="referrer" content="no-referrer">' in page


def test_feedback_never_shows_hidden_tests(demo):
    out, _, _ = demo
    pages = list((out / "graded" / "feedback").glob("*/*.html"))
    assert len(pages) >= 3
    for page in pages:
        html = page.read_text()
        assert "HIDDEN TESTS" not in html and "autograder.checks" not in html, page
        assert "most recent call last" not in html and "----> " not in html, page
    mistake = (out / "graded" / "feedback" / "typical-mistake" / f"{A01}.html").read_text()
    assert "softmax without subtracting the max" in mistake  # the named mistake reaches the student


def test_gradebook_is_nbgraders(demo):
    from nbgrader.api import Gradebook

    out, results, _ = demo
    with Gradebook(f"sqlite:///{out / 'graded' / 'gradebook.db'}") as gb:
        sub = gb.find_submission(A01, "full-marks")
        assert sub.score == sub.max_score == next(r.max_score for r in results if r.notebook == A01)


def test_submission_layouts_and_broken_files(course, tmp_path):
    """Folder with a renamed notebook, a zip, nbgrader's submitted/ tree, corrupt JSON: all graded or
    reported, and one broken student never stops the others."""
    good = nbformat.writes(solved_notebook(course, A01)).encode()
    root = tmp_path / "class"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / f"{A01} (1).ipynb").write_bytes(good)
    with zipfile.ZipFile(root / "bob.zip", "w") as zf:
        zf.writestr(f"homework/{A01}.ipynb", good)
    (root / "carol").mkdir()
    (root / "carol" / f"{A01}.ipynb").write_text('{"cells": [ this is not json')
    (root / "dave").mkdir()
    (root / "dave" / "notes.txt").write_text("forgot the notebook")
    results = grade(root, tmp_path / "out", progress=False)
    r = {(x.student_id, x.notebook): x for x in results}
    top = r[("alice", A01)].max_score
    assert r[("alice", A01)].score == top and r[("alice", A01)].status == "ok"
    assert r[("bob", A01)].score == top
    assert r[("carol", A01)].score == 0 and r[("carol", A01)].status is Status.UNREADABLE
    assert r[("dave", A01)].status is Status.MISSING
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert {row["student_id"] for row in rows} == {"alice", "bob", "carol", "dave"}
    # carol gets a page to say why her grade is 0 (nbgrader never saw her file, and made none); the report links it
    page = (tmp_path / "out" / "feedback" / "carol" / f"{A01}.html").read_text()
    assert f"0 / {top:g}" in page and "could not be read as a notebook" in page and "not valid JSON" in page
    assert f"attn-course check {A01}.ipynb" in page and "<script" not in page
    assert f"feedback/carol/{A01}.html" in (tmp_path / "out" / "report.html").read_text()
    assert not (tmp_path / "out" / "feedback" / "dave").exists()  # nothing handed in: nothing to hand back

    # nbgrader's own submitted/ tree
    tree = tmp_path / "nbgrader-course" / "submitted" / "erin" / A01
    tree.mkdir(parents=True)
    (tree / f"{A01}.ipynb").write_bytes(good)
    results = grade(tmp_path / "nbgrader-course", tmp_path / "out2", progress=False)
    erin = next(x for x in results if x.notebook == A01)
    assert erin.student_id == "erin" and erin.score == erin.max_score


def test_self_check_says_pass_fail_and_not_attempted(course, tmp_path):
    nb = inject(solved_notebook(course, A01), {
        "cosine_similarity": "def cosine_similarity(E):\n    return E @ E.T",
    })
    for cell in nb.cells:  # leave one exercise untouched: the release stub
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "dot_similarity":
            cell.source = next(c.source for c in course.release(A01).cells
                               if c.metadata.get("nbgrader", {}).get("grade_id") == "dot_similarity")
    path = tmp_path / f"{A01}.ipynb"
    nbformat.write(nb, path)
    result, verdicts = self_check(path)
    assert verdicts["normalize_rows"] == "pass"
    assert verdicts["cosine_similarity"] == "fail"
    assert verdicts["dot_similarity"] == "not attempted"
    report = format_report(result, verdicts)
    assert "FAIL  cosine_similarity" in report and "forgets to normalize" in report
    assert "TODO  dot_similarity" in report


def test_self_check_prints_a_students_escape_sequences_as_escapes(course, tmp_path):
    """A red team: an exception message with a title, a cleared screen and 8-bit CSI drew "all checks passed" on the
    terminal of an instructor checking a suspicious notebook with `attn-course check`."""
    payload = "\\x1b]0;PWNED\\x07\\x9b2Jall checks passed \\u202eRLO"
    nb = inject(solved_notebook(course, A01), {"softmax": f"def softmax(x, axis=-1):\n    raise RuntimeError('{payload}')"})
    path = tmp_path / f"{A01}.ipynb"
    nbformat.write(nb, path)
    result, verdicts = self_check(path)
    report = format_report(result, verdicts)
    assert verdicts["softmax"] == "fail" and "PWNED" in report, report
    assert not any(ch in report for ch in "\x1b\x07\x9b\u202e"), report
    assert "\\x1b]0;PWNED\\x07\\x9b2J" in report, report


def test_self_check_tells_the_student_what_the_instructor_will_read_by_hand(course, tmp_path):
    """A review flag (here a thread, which the runtime check may not follow) was in the instructor's table only:
    `attn-course check` now lists it, with where it is and why."""
    nb = solved_notebook(course, A01)
    nb.cells.insert(3, nbformat.v4.new_code_cell("import threading\nthreading.Thread(target=print).start()"))
    path = tmp_path / f"{A01}.ipynb"
    nbformat.write(nb, path)
    result, verdicts = self_check(path)
    assert result.review and result.score == result.max_score, result.review
    report = format_report(result, verdicts)
    assert "for your instructor to look at by hand" in report, report
    listed = [line for line in report.splitlines() if line.startswith("  - cell ")]
    assert len(listed) == len(re.findall(r"cell \d+, line \d+: ", result.review)) >= 1, report
    assert "another thread" in report and "threading.Thread(target=print).start()" in report, report


def test_grading_is_resumable_and_idempotent(course, tmp_path):
    """Interrupt a batch (one student's saved result lost, the CSV half-written), run it again:
    the same table and gradebook, and only the unfinished student is graded again."""
    from nbgrader.api import Gradebook

    good = nbformat.writes(solved_notebook(course, A01)).encode()
    mistake = nbformat.writes(inject(solved_notebook(course, A01), {
        "dot_similarity": "def dot_similarity(E):\n    return E.T @ E"})).encode()
    root = tmp_path / "class"
    for sid, data in (("ann", good), ("ben", mistake)):
        (root / sid).mkdir(parents=True)
        (root / sid / f"{A01}.ipynb").write_bytes(data)
    out = tmp_path / "out"
    first = grade(root, out, progress=False)
    table = (out / "grades.csv").read_text()

    shutil.rmtree(out / "students" / "ben")               # ben was being graded when it stopped
    (out / "grades.csv").write_text(table[: len(table) // 2])  # and the table is half written
    ann_job = out / "jobs" / f"ann--{A01}" / "verdicts.json"
    ann_stamp = ann_job.stat().st_mtime_ns
    second = grade(root, out, progress=False)
    assert (out / "grades.csv").read_text() == table
    assert [(r.student_id, r.notebook, r.score) for r in second] == [(r.student_id, r.notebook, r.score) for r in first]
    assert ann_job.stat().st_mtime_ns == ann_stamp, "a finished student was graded again"
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        assert gb.find_submission(A01, "ann").score == 17
        assert gb.find_submission(A01, "ben").score == 16


def test_benchmark_grades_the_same_class_both_ways(tmp_path):
    """`attn-course bench --cluster` on a small class: the three graders (plain nbgrader, the pool, a Dask
    LocalCluster) finish and give every notebook the same score; the ratios are computed, not asserted."""
    from course_tools.bench import benchmark

    report = benchmark(3, tmp_path / "bench", ["01_similarity_attention"], cluster=True)
    assert report["same_scores_on_cluster"], report
    assert report["cluster_over_pool"] == pytest.approx(
        report["attn_course_grade_cluster_seconds"] / report["attn_course_grade_seconds"], rel=0.02, abs=0.01)
    assert report["graded_notebooks"] == 3 and report["all_as_designed"], report
    assert report["same_scores_as_plain_nbgrader"], report.get("score_disagreements")
    assert list(report["plain_nbgrader_seconds_per_notebook"]) == ["01_similarity_attention"]
    ratio = report["plain_nbgrader_serial_seconds"] / report["attn_course_grade_seconds"]  # both rounded to 0.1 s
    assert report["speedup"] == pytest.approx(ratio, rel=0.02, abs=0.01)
    assert report["plain_nbgrader_serial_seconds"] == round(sum(report["plain_nbgrader_seconds_per_notebook"].values()), 1)
    assert report["workers"] == (os.cpu_count() or 1) and report["sandbox"] == isolation_mode()
    phases = report["attn_course_grade_seconds_per_notebook_by_phase"]  # where the time went
    assert set(phases) == {"sandbox", "judging", "nbgrader_autograde_and_feedback", "report_csvs_feedback_folder"}
    assert all(seconds >= 0 for seconds in phases.values()), phases  # judging nb01 may take under 5 ms: 0.0
    runs, graded = report["attn_course_grade_phase_runs"], report["graded_notebooks"]  # every phase ran, counted
    assert runs["sandbox"] >= graded and runs["trusted"] == runs["nbgrader"] == graded and runs["outputs"] == 1, runs
    busy = sum(phases.values()) * report["graded_notebooks"]  # phases of several threads: at most workers x wall
    assert busy <= report["workers"] * report["attn_course_grade_seconds"] + 0.1 * len(phases), (busy, report)
