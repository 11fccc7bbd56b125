"""The README's instructor walkthrough (the bash block that opens "## For instructors"), run as
written: every command of the block, in its order, as bash, in a copy of the course, on a small
generated class handed in as a Canvas download.

* release: `make build` (narrowed to notebook 01 by the Makefile's BUILD_ARGS) writes the student
  notebook; the class is made from the release it wrote;
* collect and grade: three on-time uploads, a roster of four (one hands in nothing yet), the due
  date and late penalty of the block; the run exits 1 naming the missing student (before the block's
  due date, an example, it says "not handed in yet" and exits 0);
* review by hand: the formgrader command (`--no-browser` added, and `--allow-root` as root) is
  started in the background; once it answers, a submission is opened and a score typed over a
  test cell's is saved, through the requests formgrader's page sends; then the server is stopped;
* late work: a new download of everything, the missing student's `_LATE_` upload in it: only that
  notebook is graded, the rest reused; lateness and the penalty in grades.csv;
* export: canvas.csv with each student's Canvas id and final score (hand grade and penalty in);
* feedback: a page per student (the late one says how late and what it cost), the report, and
  every path the block's comments name.

The `.venv/bin/` of the commands is the venv running this test (the copy's .venv/bin is a link to
its bin). A command the test does not expect, or an exit status other than the one promised,
fails it; so does a wrong option (argparse's exit 2, or formgrader never answering).
"""
from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from .layout import REPO

A01 = "01_similarity_attention"
WRONG_NORMALIZE = "def normalize_rows(S):\n    return S / S.sum()\n"  # divides by the total: test_normalize_rows fails
HAND_SCORE = 1.5  # typed in formgrader over test_normalize_rows (0 / 2 automatically)
LATE_BY = timedelta(days=1, hours=10, minutes=1)
# A Canvas download: <name>_<user id>_<submission id>_<file>; the roster's ids are the names
ON_TIME = {"smithjane": ("101_9001", "solved"), "doejohn": ("102_9002", "mistake"), "roeeli": ("103_9003", "blank")}
LATE = {"leekim": ("LATE_104_9004", "solved")}  # hands in nothing on time, then late
ROSTER = "id,first_name,last_name\nsmithjane,Jane,Smith\ndoejohn,John,Doe\nroeeli,Eli,Roe\nleekim,Kim,Lee\n"
CANVAS = {"smithjane": ("Smith, Jane", "101"), "doejohn": ("Doe, John", "102"), "roeeli": ("Roe, Eli", "103"),
          "leekim": ("Lee, Kim", "104")}
# the copy is a fresh clone's working tree: what git ignores (.gitignore) is left out
NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".ipynb_checkpoints",
                                        ".pytest_cache", ".ruff_cache", "build", ".nbgrader", "gradebook.db",
                                        "node_modules", "runs", ".whl", "cache")
SERVER_START_S = 120


# --------------------------------------------------------------------------- the block
def readme_block(text: str | None = None) -> str:
    """The first bash block of the README's "## For instructors" section."""
    text = (REPO / "README.md").read_text() if text is None else text
    section = text.split("\n## For instructors\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"^```bash\n(.*?)^```$", section, re.S | re.M)
    assert found, "no ```bash block in the README's instructor section"
    return found.group(1)


def commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined as bash joins them; comment lines left out."""
    joined = block.replace("\\\n", " ")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def kind(command: str) -> str:
    words = shlex.split(command, comments=True)
    if words[0] == "make":
        return "make"
    if words[0] == ".venv/bin/attn-course":
        return words[1]
    return words[0]


def option(command: str, name: str) -> str:
    words = shlex.split(command, comments=True)
    assert name in words[:-1], f"`{command}` gives no {name}: the term this test checks needs one"
    return words[words.index(name) + 1]


def commented_paths(block: str) -> set[str]:
    """The course paths the block's comments name (what to hand out, import, hand back, read)."""
    comments = " ".join(line for line in block.splitlines() if line.lstrip().startswith("#"))
    return set(re.findall(r"(?:build|notebooks)/[\w./<>-]*\w/?", comments))


def test_the_block_is_a_whole_term_of_known_commands_and_options():
    """Without running anything: every step of a term is there, in order, and each option of each
    command is one its parser knows (what `attn-course CMD --help` lists)."""
    from course_tools import cli

    block = readme_block()
    steps = [kind(c) for c in commands(block)]
    assert steps == ["make", "grade", "formgrader", "grade", "export"], steps
    assert re.search(r"^build:", (REPO / "Makefile").read_text(), re.M)
    for command in commands(block):
        words = shlex.split(command, comments=True)
        if words[0] != ".venv/bin/attn-course":
            continue
        try:
            _, unknown = cli.parser().parse_known_args(words[1:])
        except SystemExit as stop:
            pytest.fail(f"`{command}`: attn-course refuses its arguments (exit {stop.code})")
        assert not unknown, f"`{command}`: unknown options {unknown}"
    assert {"notebooks/01_similarity_attention/", "build/grading/lms/canvas.csv", "build/grading/report.html",
            "build/grading/feedback/<student>/01_similarity_attention.html"} <= commented_paths(block)


# --------------------------------------------------------------------------- the class
def course_copy(dest: Path) -> Path:
    """The course as a fresh clone has it, with the venv `make venv` made: the one running this test
    (its bin, linked), stamped as installed so that make does not install again."""
    shutil.copytree(REPO, dest, ignore=NOT_IN_A_CLONE, symlinks=True)
    (dest / ".venv").mkdir()
    (dest / ".venv" / "bin").symlink_to(Path(sys.executable).parent, target_is_directory=True)
    (dest / ".venv" / ".installed").touch()  # newer than the copied requirements: `make` installs nothing
    return dest


def notebook_for(root: Path, how: str) -> nbformat.NotebookNode:
    """Notebook 01 as a student hands it in, from the release `make build` wrote in the copy."""
    from course_tools.demo import solved, with_mistake

    release = nbformat.read(root / "notebooks" / A01 / f"{A01}.ipynb", as_version=4)
    if how == "blank":
        return release
    nb = solved(release, nbformat.read(root / "solutions" / A01 / f"{A01}.ipynb", as_version=4))
    return with_mistake(nb, "normalize_rows", WRONG_NORMALIZE) if how == "mistake" else nb


def upload(root: Path, folder: Path, uploads: dict, when: datetime) -> None:
    """Canvas's download: one file per student, its time the time of the upload."""
    folder.mkdir(parents=True, exist_ok=True)
    for student, (ids, how) in uploads.items():
        path = folder / f"{student}_{ids}_{A01}.ipynb"
        nbformat.write(notebook_for(root, how), path)
        os.utime(path, (when.timestamp(), when.timestamp()))


# --------------------------------------------------------------------------- running
def environment(tmp: Path, root: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "BUILD_ARGS", "PYTHONPATH")}
    env.update(ATTN_COURSE_ROOT=str(root),  # the copy, whatever this shell names: never the checkout
               JUPYTER_CONFIG_DIR=str(tmp / "jupyter" / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "jupyter" / "runtime"))
    return env


def run(command: str, root: Path, env: dict, expect: int) -> str:
    proc = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    output = proc.stdout + proc.stderr
    assert proc.returncode == expect, f"`{command}` exited {proc.returncode}, not {expect}:\n{output[-4000:]}"
    return output


def api(base: str, token: str, path: str, data: dict | None = None) -> tuple[int, str]:
    """A formgrader request as its page sends it (PUT with a JSON body when `data`)."""
    request = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"token {token}"},
                                     method="PUT" if data is not None else "GET",
                                     data=json.dumps(data).encode() if data is not None else None)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, answer.read().decode()


def review_by_hand(command: str, root: Path, env: dict, log_path: Path) -> float:
    """The formgrader command, as a long-running server: wait until it answers, open doejohn's
    submission, save a score over test_normalize_rows, stop it. Returns the notebook's automatic score."""
    extra = " --no-browser" + (" --allow-root" if os.geteuid() == 0 else "")  # jupyter refuses root without it
    with log_path.open("wb") as log:
        proc = subprocess.Popen(["bash", "-c", command + extra], cwd=root, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = token = ""
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            text = log_path.read_text(errors="replace")
            found = re.search(r"(http://\S+)/formgrader\?token=(\w+)", text)
            if found and not base:
                base, token = found.groups()
            if base:
                try:
                    if api(base, token, "/api/status")[0] == 200:
                        break
                except (urllib.error.URLError, OSError):
                    pass
            assert proc.poll() is None, f"`{command}` exited {proc.returncode}:\n{text[-4000:]}"
            assert time.monotonic() < deadline, f"`{command}` did not answer in {SERVER_START_S} s:\n{text[-4000:]}"
            time.sleep(0.5)
        # an option jupyter server does not know is only warned about ("Unrecognized alias: ...")
        assert "Unrecognized" not in text, f"`{command}`: an option formgrader's server ignores:\n{text[-4000:]}"

        listed = json.loads(api(base, token, f"/formgrader/api/submitted_notebooks/{A01}/{A01}")[1])
        assert {s["student"] for s in listed} == set(ON_TIME), listed
        [doe] = [s for s in listed if s["student"] == "doejohn"]
        status, page = api(base, token, f"/formgrader/submissions/{doe['id']}/")
        assert status == 200 and "encountered an error" not in page and 'id="test_normalize_rows"' in page
        grades = json.loads(api(base, token, f"/formgrader/api/grades?submission_id={doe['id']}")[1])
        [cell] = [g for g in grades if g["name"] == "test_normalize_rows"]
        assert cell["auto_score"] == 0, cell
        saved = json.loads(api(base, token, f"/formgrader/api/grade/{cell['id']}", {"manual_score": HAND_SCORE})[1])
        assert saved["manual_score"] == HAND_SCORE, saved
        return doe["score"]
    finally:
        stop(proc, base, token)


def stop(proc: subprocess.Popen, base: str, token: str) -> None:
    """Ask the server to shut down, then end what is left of the process group this test started."""
    if proc.poll() is None and base:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                                          headers={"Authorization": f"token {token}"}),
                                   timeout=10).close()
            proc.wait(timeout=20)
        except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def rows(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------- the term
@pytest.mark.slow
def test_the_instructors_term_runs_as_written(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed: the walkthrough starts with `make build`")
    from autograder.lateness import LatePolicy

    block = readme_block()
    root = course_copy(tmp_path / "course")
    env = environment(tmp_path, root)
    graded: list[str] = []  # the outputs of the grade commands
    auto = None
    for command in commands(block):
        step = kind(command)
        if step == "make":
            # `make build` as written, narrowed by the Makefile's own BUILD_ARGS to the one notebook
            # this term hands out: all seven cost ~40 s of the 2 cores, for six the class never sees
            run(command, root, dict(env, BUILD_ARGS=f"--only {A01}"), expect=0)
            assert (root / "notebooks" / A01 / f"{A01}.ipynb").is_file()
        elif step == "grade":
            folder = root / shlex.split(command, comments=True)[2]
            if not graded:  # collect: the on-time uploads, and the roster the command names
                roster = root / option(command, "--roster")
                roster.write_text(ROSTER)
                due = datetime.fromisoformat(option(command, "--due").partition("=")[2])
                policy = LatePolicy.parse(option(command, "--late-penalty"))
                upload(root, folder, ON_TIME, due - timedelta(days=1))
                # leekim (roster) has handed in nothing: missing (exit 1) once the block's due date has
                # passed; before it, "not handed in yet" (exit 0): the block's date is an example
                not_due = due > datetime.now(timezone.utc)
                graded.append(run(command, root, env, expect=0 if not_due else 1))
            else:  # late work: a new download of everything, leekim's late upload in it
                upload(root, folder, ON_TIME, due - timedelta(days=1))
                upload(root, folder, LATE, due + LATE_BY)
                graded.append(run(command, root, env, expect=0))
        elif step == "formgrader":
            assert graded, "formgrader before anything was graded"
            auto = review_by_hand(command, root, env, tmp_path / "formgrader.log")
        elif step == "export":
            exported = run(command, root, env, expect=0)
        else:
            pytest.fail(f"a command this test does not know what to expect of: `{command}`")
    assert len(graded) == 2 and auto is not None, "the block lost a grading run or the review by hand"

    out = root / "build" / "grading"
    first, late = graded
    assert "3 graded now, 0 reused from earlier runs" in first and "4 students in the gradebook" in first
    leekim = r"- / 17\s+not handed in yet" if not_due else r"0 / 17\s+missing: no notebook"  # never 'missing' nor 0 early
    assert re.search(rf"leekim\s+01_similarity_attention\s+{leekim}", first), first[-3000:]
    assert "1 graded now, 3 reused from earlier runs" in late, late[-3000:]
    assert "1 day 10 h late" in late and "4 notebooks of 4 students graded without problems" in late

    table = {r["student_id"]: r for r in rows(out / "grades.csv")}
    assert set(table) == set(ON_TIME) | set(LATE) and {r["notebook"] for r in table.values()} == {A01}
    assert all(r["status"] == "ok" and r["due"] == due.strftime("%Y-%m-%dT%H:%M:%SZ") for r in table.values())
    assert table["smithjane"]["score"] == "17" and table["roeeli"]["score"] == "0"
    assert float(table["doejohn"]["score"]) == auto + HAND_SCORE  # the grade typed in formgrader
    on_time = [table[s] for s in ON_TIME]
    assert all(r["seconds_late"] == "0" and r["late_penalty"] == "0" for r in on_time)
    lee = table["leekim"]
    penalty = policy.penalty(17, 17, LATE_BY.total_seconds())
    assert float(lee["seconds_late"]) == LATE_BY.total_seconds()
    assert penalty > 0 and float(lee["late_penalty"]) == pytest.approx(penalty)
    assert lee["submitted"] == (due + LATE_BY).strftime("%Y-%m-%dT%H:%M:%SZ") and "_LATE_" in lee["notes"]
    wide = {r["student_id"]: r for r in rows(out / "grades_wide.csv")}
    assert float(wide["leekim"][A01]) == pytest.approx(17 - penalty)

    canvas = out / "lms" / "canvas.csv"
    assert str(canvas) in exported
    with canvas.open(newline="", encoding="utf-8") as fh:
        header, *body = list(csv.reader(fh))
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", A01]
    [points] = [r for r in body if "Points Possible" in r[0]]
    assert points[5] == "17"
    final = {r[0]: (r[1], float(r[5])) for r in body if r is not points}
    scores = {"smithjane": 17, "doejohn": auto + HAND_SCORE, "roeeli": 0, "leekim": pytest.approx(17 - penalty)}
    assert final == {CANVAS[s][0]: (CANVAS[s][1], score) for s, score in scores.items()}

    page = (out / "feedback" / "leekim" / f"{A01}.html").read_text()
    assert "1 day 10 h late" in page and f"{penalty:g} points taken for lateness" in page
    assert f"{auto + HAND_SCORE:g} / 17" in (out / "feedback" / "doejohn" / f"{A01}.html").read_text()
    assert "leekim" in (out / "report.html").read_text()
    for named in commented_paths(block):  # what the comments tell the reader to hand out, import, hand back, read
        for student in (set(ON_TIME) | set(LATE)) if "<student>" in named else {""}:
            assert (root / named.replace("<student>", student)).exists(), f"the block names {named}: not there"
