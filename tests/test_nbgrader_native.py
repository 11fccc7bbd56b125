"""nbgrader's own commands, run as an instructor would: from the repository's course root, and
formgrader's Autograde (`nbgrader autograde --student`) on the grading course. Student code runs
in the sandbox and is judged outside, as with `attn-course grade`; nothing is deleted."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .conftest import solved_notebook
from .layout import REPO

pytestmark = pytest.mark.slow

A01 = "01_similarity_attention"


def _nbgrader(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _score(db: Path, student: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gb:
        return float(gb.find_submission(A01, student).score)


def test_formgraders_autograde_runs_the_trusted_path(course, tmp_path):
    """`nbgrader autograde --student` on the grading course (what formgrader's button runs):
    graded in the sandbox, the right score, the autograded notebook kept."""
    from autograder.grade import Course

    grading = Course(tmp_path / "course").setup(only=[A01])
    for student, nb in (("alice", solved_notebook(course, A01)), ("bob", course.release(A01))):
        folder = grading.root / "submitted" / student / A01
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{A01}.ipynb")
        done = _nbgrader(grading.root, "autograde", A01, "--student", student, "--force")
        assert done.returncode == 0, done.stderr[-2000:]
        assert (grading.root / "autograded" / student / A01 / f"{A01}.ipynb").exists()
    assert _score(grading.db_path, "alice") == 17
    assert _score(grading.db_path, "bob") == 0


def test_the_repository_is_an_nbgrader_course_root(course, tmp_path):
    """generate_assignment, autograde, generate_feedback and export from the repository's own
    nbgrader_config.py (a copy of the course folder, so the checkout is left alone; the shared
    settings come from the installed grader, not from the course folder)."""
    root = tmp_path / "repo"
    (root / "solutions").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    shutil.copytree(REPO / "solutions" / A01, root / "solutions" / A01)  # no autograder/: the installed grader's

    done = _nbgrader(root, "generate_assignment", A01, "--force")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (root / "build" / "nbgrader" / "release" / A01 / f"{A01}.ipynb").exists()
    submitted = root / "build" / "nbgrader" / "submitted" / "carol" / A01
    submitted.mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), submitted / f"{A01}.ipynb")
    for step in (("autograde", A01), ("generate_feedback", A01), ("export", "--to", str(tmp_path / "grades.csv"))):
        done = _nbgrader(root, *step)
        assert done.returncode == 0, (step, done.stderr[-2000:])
    assert _score(root / "build" / "nbgrader" / "gradebook.db", "carol") == 17
    assert (root / "build" / "nbgrader" / "feedback" / "carol" / A01 / f"{A01}.html").exists()
    rows = list(csv.DictReader((tmp_path / "grades.csv").open()))
    assert [(r["student_id"], float(r["score"])) for r in rows if r["assignment"] == A01] == [("carol", 17.0)]
