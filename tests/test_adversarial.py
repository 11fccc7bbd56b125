"""The grader against 35 hostile, broken and bizarre submissions, graded for real in one
parallel batch: none earns a point it did not earn, none stops the batch, each gets its reason,
and the sandbox keeps every secret (solutions, gradebook, other students, hidden tests, network)."""
from __future__ import annotations

import csv
import re
import socket
from pathlib import Path

import nbformat
import pytest

from autograder.grade import grade
from autograder.outcomes import Status
from autograder.sandbox import Limits, is_isolated, isolation_mode
from course_tools import adversarial
from course_tools.adversarial import ASSIGNMENT, CATALOGUE, expected_score, status_as_designed

from .conftest import solved_notebook
from .layout import REPO

pytestmark = pytest.mark.slow

# Small limits, safe on a 2-core 24 GiB machine even if a limit failed: the memory hog grows in
# 256 MiB steps (to 2 GiB), the process burst is bounded at 400, loops end at the cell timeout.
LIMITS = Limits(cell_seconds=5, notebook_seconds=150, memory_bytes=2 * 2**30, processes=64)


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    if not is_isolated(isolation_mode()):
        pytest.skip(f"no namespace sandbox here ({isolation_mode()})")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    root = tmp_path_factory.mktemp("adversarial")
    out = root / "out"
    paths = adversarial.probe_paths(REPO, out, listener.getsockname()[1])
    chosen = adversarial.write_class(root / "class", solved_notebook(course, ASSIGNMENT), course.release(ASSIGNMENT), paths)
    chosen = chosen | _intake_attacks(root / "class", solved_notebook(course, ASSIGNMENT))
    out.mkdir()
    before = None
    try:
        from autograder.grade import Course
        Course(out / "course").setup()
        before = _fingerprints(out)
        results = grade(root / "class", out, progress=False, workers=2, limits=LIMITS)
    finally:
        listener.close()
    return {r.student_id: r for r in results if r.notebook == ASSIGNMENT}, chosen, out, paths, before


INTAKE = {  # student id -> what the grades table must say about them
    "deep-json": "nests JSON 100,000 levels deep",
    "overlap-zip": "share the same bytes",
    "huge-notebook": "has 100,000 cells (limit 2,000)",
}


def _intake_attacks(folder, solved) -> dict:
    """Submissions that attack the intake (refused, the batch goes on) and two students whose
    names collide once sanitised (both graded)."""
    from .test_limits import notebook, overlapping_zip

    (folder / "deep-json").mkdir()
    (folder / "deep-json" / f"{ASSIGNMENT}.ipynb").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    (folder / "overlap-zip.zip").write_bytes(overlapping_zip(400))
    cells = [{"cell_type": "markdown", "metadata": {}, "source": f"cell {i} " + "x" * 60} for i in range(100_000)]
    (folder / "huge-notebook").mkdir()
    (folder / "huge-notebook" / f"{ASSIGNMENT}.ipynb").write_bytes(notebook(cells=cells))
    for name in ("Zoé Li", "Zoë Li"):
        (folder / name).mkdir()
        nbformat.write(solved, folder / name / f"{ASSIGNMENT}.ipynb")
    return dict.fromkeys([*INTAKE, "Zoe_Li", "Zoe_Li-2"])


def test_intake_attacks_are_refused_and_colliding_names_both_graded(graded):
    results = graded[0]
    for student, words in INTAKE.items():  # refused by the intake: said in the notes; nothing to grade
        r = results[student]
        assert r.score == 0 and r.status is Status.MISSING and any(words in n for n in r.notes), (r.status_text, r.notes)
    for student in ("Zoe_Li", "Zoe_Li-2"):
        r = results[student]
        assert r.score == r.max_score, (r.status_text, [(c.grade_id, c.message[:100]) for c in r.cells if c.score < c.max_score])
        notes = "; ".join(r.notes)
        assert r.status is Status.OK and "Zoe_Li" in notes and ("Zoé Li" in notes or "Zoë Li" in notes), (r.status_text, notes)


def _fingerprints(out) -> dict[str, str]:
    """SHA-256 of every file a hostile submission might try to overwrite through the grader."""
    import hashlib

    files = [*sorted((REPO / "solutions").rglob("*.ipynb")), *sorted((REPO / "notebooks").rglob("*.ipynb")),
             *sorted((out / "course" / "release").rglob("*.ipynb")),
             *sorted((out / "course" / "source").rglob("*.ipynb"))]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.mark.parametrize("adversary", CATALOGUE, ids=lambda a: a.name)
def test_adversary_scores_exactly_what_it_earned(graded, adversary):
    results = graded[0]
    if adversary.name not in results:
        pytest.skip(f"{adversary.name} needs the {adversary.needs} sandbox (this run: {isolation_mode()})")
    r = results[adversary.name]
    assert r.score == expected_score(adversary, r.max_score), (r.status_text, [(c.grade_id, c.message[:120]) for c in r.cells if c.score < c.max_score])
    assert status_as_designed(adversary, r.status), r.status_text
    if adversary.status is Status.OK:
        assert r.status_text == "ok", r.status_text


def test_catalogue_is_large_and_complete():
    names = {a.name for a in CATALOGUE}
    assert len(CATALOGUE) >= 30
    for required in ("tamper-allclose", "tamper-transformers", "os-exit", "segfault", "hang", "sys-exit",
                     "memory", "processes", "flood", "duplicated-cells", "edited-points", "renamed-grade-ids",
                     "retyped-tests", "corrupt-json", "changed-kernelspec", "warnings", "imports-reference"):
        assert required in names


def test_honesty_violations_are_named(graded):
    results = graded[0]
    for name in ("imports-reference", "wraps-reference"):
        text = " ".join(c.message for c in results[name].cells)
        assert "reference" in text, text


def test_crashes_say_what_happened(graded):
    results = graded[0]
    assert "os._exit" in results["os-exit"].detail
    assert "segmentation fault" in results["segfault"].detail
    assert "ignored the interrupt" in results["hang"].detail


def test_nothing_was_written_outside_the_sandbox(graded):
    paths = graded[3]
    for place in ("repo_file", "out_file"):                   # the files the probes tried to create
        assert not Path(paths[place]).exists(), place


def test_batch_table_and_feedback_are_complete(graded):
    chosen, out = graded[1], graded[2]
    rows = [row for row in csv.DictReader((out / "grades.csv").open()) if row["notebook"] == ASSIGNMENT]
    assert {row["student_id"] for row in rows} == set(chosen)
    pages = list((out / "feedback").glob("*/*.html"))
    assert len(pages) >= len(chosen) - 4 - len(INTAKE)  # all but the unreadable ones (and crashes of nbgrader: none)
    for page in pages:
        html = page.read_text()
        for secret in ("HIDDEN TESTS", "nb01.check", "most recent call last"):
            at = html.find(secret)
            assert at < 0, (page.parent.name, secret, html[max(0, at - 300): at + 100])


def test_grader_files_unchanged_and_gradebook_whole(graded):
    """Symlinks, FIFOs and forged frames from inside reached nothing: solutions, releases and the
    grader's code are byte for byte the same, and the gradebook holds every student's grade."""
    import sqlite3

    results, chosen, out, _, before = graded
    assert _fingerprints(out) == before
    with sqlite3.connect(out / "gradebook.db") as db:
        students = {row[0] for row in db.execute("select id from student")}
        assert set(chosen) - {"corrupt-json", "not-utf8"} - set(INTAKE) <= students
    assert results["solved"].score == results["solved"].max_score


def test_sandbox_attacks_are_reported(graded):
    results = graded[0]
    if "giant-frame" in results:
        assert "MiB of results" in results["giant-frame"].detail
    forged = results["forges-frames"]  # frames out of the runner's order: that run's results are void
    assert forged.status is Status.CHANNEL and "out of the runner's order" in forged.detail, forged.status_text
    assert "was interrupted (the points it earned stand)" in results["slow-cell"].detail


def test_feedback_markdown_is_sanitised(graded):
    out = graded[2]
    html = (out / "feedback" / "markdown-script" / f"{ASSIGNMENT}.html").read_text()
    assert "<script>document.title" not in html
    assert not re.search(r"<img[^>]*onerror", html), "an event handler reached the feedback page"


@pytest.fixture(scope="module")
def honesty_batch(course, tmp_path_factory):
    """Notebook 02 graded for real: one honest student and one per honesty bypass, in one batch."""
    from course_tools.demo import with_mistake

    if not is_isolated(isolation_mode()):
        pytest.skip(f"no namespace sandbox here ({isolation_mode()})")
    root = tmp_path_factory.mktemp("honesty")
    solved = solved_notebook(course, adversarial.NB02)
    students = {"honest": solved} | {b.name: with_mistake(solved, "scaled_dot_product_attention", "#| export\n" + b.code)
                                     for b in adversarial.HONESTY_BYPASSES}
    for name, nb in students.items():
        (root / "class" / name).mkdir(parents=True)
        nbformat.write(nb, root / "class" / name / f"{adversarial.NB02}.ipynb")
    results = grade(root / "class", root / "out", progress=False, workers=2, limits=LIMITS)
    return {r.student_id: r for r in results if r.notebook == adversarial.NB02}


@pytest.mark.parametrize("bypass", adversarial.HONESTY_BYPASSES, ids=lambda b: b.name)
def test_honesty_bypass_scores_fairly(honesty_batch, bypass):
    honest, r = honesty_batch["honest"], honesty_batch[bypass.name]
    assert honest.score == honest.max_score and not honest.review, (honest.status_text, honest.review)
    want = r.max_score if bypass.expect == "full" else 0.0
    sdpa_cells = [c for c in r.cells if c.exercise == "scaled_dot_product_attention"]
    if bypass.expect == "zero":  # the graded exercise is lost, whatever depends on it may go too
        assert all(c.score == 0 for c in sdpa_cells), [(c.grade_id, c.message[:200]) for c in sdpa_cells]
    else:
        assert r.score == want, [(c.grade_id, c.message[:200]) for c in r.cells if c.score < c.max_score]
    assert bool(r.review) == bypass.review, r.review


def test_bubblewrap_is_used_where_installed():
    """Where `bwrap` exists (CI installs it), the allow-list sandbox must be the one that runs."""
    import os
    import shutil

    if os.environ.get("ATTN_SANDBOX"):
        pytest.skip(f"ATTN_SANDBOX={os.environ['ATTN_SANDBOX']} chooses the sandbox")
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed here (apt install bubblewrap)")
    assert isolation_mode() == "bubblewrap"
