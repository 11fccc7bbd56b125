"""nbgrader's exchange, end to end around `attn-course grade` (issue 26): the instructor releases,
the student fetches and submits with nbgrader's own commands, the instructor collects, grades the
collected submitted/ tree with `attn-course grade`, and hands the feedback back with `nbgrader
release_feedback`; the student's `nbgrader fetch_feedback` gets it. This needs nbgrader's
submission secret carried from the collected submission into the grading course's feedback/."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from .conftest import solved_notebook
from .layout import REPO

A01 = "01_similarity_attention"
COURSE_ID = "attn"


def _nbgrader(*args: str, cwd: Path, env: dict, course_root: Path | None = None, exchange: Path) -> str:
    command = [str(Path(sys.executable).parent / "nbgrader"), *args, f"--Exchange.root={exchange}",
               f"--CourseDirectory.course_id={COURSE_ID}"]
    if course_root is not None:
        command.append(f"--CourseDirectory.root={course_root}")
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"nbgrader {args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


@pytest.mark.slow
def test_release_submit_collect_grade_and_hand_back_through_nbgrader_exchange(course, tmp_path):
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)                       # nbgrader's exchange is writable by every user
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_CONFIG_DIR", "JUPYTER_CONFIG_PATH")}
    env.update(JUPYTER_DATA_DIR=str(tmp_path / "student-data"),   # the student's nbgrader cache lives here
               JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")

    # the instructor: the course's student release, released to the exchange
    teaching = tmp_path / "teaching"
    release = teaching / "release" / A01
    release.mkdir(parents=True)
    shutil.copy2(REPO / "notebooks" / A01 / f"{A01}.ipynb", release / f"{A01}.ipynb")
    _nbgrader("release_assignment", A01, "--force", cwd=teaching, env=env, course_root=teaching, exchange=exchange)

    # the student: fetch, solve, submit (nbgrader writes the timestamp and the submission secret)
    home = tmp_path / "student"
    home.mkdir()
    _nbgrader("fetch_assignment", A01, cwd=home, env=env, exchange=exchange)
    nbformat.write(solved_notebook(course, A01), home / A01 / f"{A01}.ipynb")
    _nbgrader("submit", A01, cwd=home, env=env, exchange=exchange)

    # the instructor: collect into submitted/<student>/<assignment>/, then grade that tree
    _nbgrader("collect", A01, cwd=teaching, env=env, course_root=teaching, exchange=exchange)
    [student_folder] = (teaching / "submitted").iterdir()
    assert (student_folder / A01 / "submission_secret.txt").is_file()
    out = tmp_path / "grading"
    graded = subprocess.run([sys.executable, "-m", "course_tools.cli", "grade", str(teaching / "submitted"),
                             "--out", str(out), "--assignment", A01],
                            cwd=REPO, env={**env, "ATTN_COURSE_ROOT": str(REPO)}, capture_output=True, text=True,
                            timeout=900)
    assert graded.returncode == 0, graded.stdout[-3000:] + graded.stderr[-3000:]
    feedback = out / "course" / "feedback" / student_folder.name / A01
    assert (feedback / "submission_secret.txt").read_text() == \
           (student_folder / A01 / "submission_secret.txt").read_text()

    # hand back through the exchange, and the student fetches it
    _nbgrader("release_feedback", A01, cwd=out, env=env, course_root=out / "course", exchange=exchange)
    _nbgrader("fetch_feedback", A01, cwd=home, env=env, exchange=exchange)
    [page] = (home / A01 / "feedback").glob(f"*/{A01}.html")
    html = page.read_text()
    assert "17.0 / 17.0" in html or "17 / 17" in html, html[:2000]
    assert "BEGIN HIDDEN TESTS" not in html and "autograder.checks" not in html
