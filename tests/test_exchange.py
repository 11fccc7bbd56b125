"""nbgrader's exchange, end to end around `attn-course grade` (issue 26): the instructor releases,
the student fetches and submits with nbgrader's own commands, the instructor collects, grades the
collected submitted/ tree with `attn-course grade`, and hands the feedback back with `nbgrader
release_feedback`; the student's `nbgrader fetch_feedback` gets it. This needs nbgrader's
submission secret carried from the collected submission into the grading course's feedback/."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
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
    exchange.chmod(0o1777)                      # writable by every user; no one renames what another made
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

    # hand back through the exchange, typed in the course checkout as the README says (nbgrader reads the
    # checkout's nbgrader_config.py too, whose folders are under build/nbgrader/: it released nothing), and the
    # student fetches it
    _nbgrader("release_feedback", A01, cwd=REPO, env=env, course_root=out / "course", exchange=exchange)
    _nbgrader("fetch_feedback", A01, cwd=home, env=env, exchange=exchange)
    [page] = (home / A01 / "feedback").glob(f"*/{A01}.html")
    html = page.read_text()
    assert "17.0 / 17.0" in html or "17 / 17" in html, html[:2000]
    assert "BEGIN HIDDEN TESTS" not in html and "autograder.checks" not in html


def _at(minutes: float) -> str:
    """A submission time as `nbgrader submit` writes it, `minutes` after twelve minutes ago: a folder made now may
    claim a time up to exchange.CLOCK_SLACK (15 minutes) before it was made, no earlier."""
    when = datetime.now(timezone.utc) - timedelta(minutes=12) + timedelta(minutes=minutes)
    return when.strftime("%Y-%m-%d %H:%M:%S.%f")


def _submit(inbound: Path, owner: str, named: str, when: str, marker: str) -> None:
    """A folder in the exchange's inbound as `nbgrader submit` writes it, made by user `owner`."""
    folder = inbound / f"{named}+{A01}+{when} UTC+{marker}"
    folder.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(marker)])
    nbformat.write(nb, folder / f"{A01}.ipynb")
    (folder / "timestamp.txt").write_text(f"{when} UTC")
    shutil.chown(folder, owner)
    for path in folder.iterdir():
        shutil.chown(path, owner)


def _collect(tmp_path: Path, teaching: Path, exchange: Path, *options: str) -> subprocess.CompletedProcess:
    """The course's collect (the JupyterHub's settings) of A01 into `teaching`, as the instructor runs it."""
    (teaching / "nbgrader_config.py").write_text(
        f"exec(open({str(REPO / 'deploy' / 'jupyterhub' / 'jupyter' / 'nbgrader_config.py')!r}).read())\n")
    env = {**os.environ, "ATTN_HUB_EXCHANGE": str(exchange), "ATTN_HUB_COURSE_ID": COURSE_ID,
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config")}
    env.pop("JUPYTER_CONFIG_PATH", None)
    return subprocess.run([str(Path(sys.executable).parent / "nbgrader"), "collect", A01, *options,
                           f"--CourseDirectory.root={teaching}"], cwd=teaching, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by two other users need root to make")
def test_collect_never_takes_a_submission_another_user_made_in_a_students_name(tmp_path):
    """The inbound is writable by every user: 'nobody' made daemon+01+<later time>+x holding a blank notebook.
    nbgrader's collect only warned ('cheating attempt?') and took it as daemon's newest, graded 0 for him.
    With the course's settings (the JupyterHub's here) collect takes daemon's own newest instead, and says why;
    so too for a symbolic link to a folder of bin's, the newest of bin's (a link is its maker's, whatever it names).
    A red team: a folder another user made for a student with none of their own (sys) was taken as theirs (a
    classmate's work handed in, or a forged one, in the name of one who never handed in); it is not collected now,
    and the escape sequences in its name, which cleared the instructor's terminal, are printed as escapes."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    daemons = _at(1)
    _submit(inbound, "daemon", "daemon", daemons, "daemon's own")
    _submit(inbound, "nobody", "daemon", _at(2), "forged")
    _submit(inbound, "nobody", "nobody", _at(0), "nobody's own")
    _submit(inbound, "bin", "bin", _at(1), "bin's own")
    work = tmp_path / "bins-work"  # a folder of bin's (a working copy, say), named by another's link
    work.mkdir()
    shutil.chown(work, "bin")
    (inbound / f"bin+{A01}+{_at(3)} UTC+link").symlink_to(work)
    _submit(inbound, "nobody", "sys", _at(0.5), "forged \x1b]0;PWNED\x07\x1b[2J")  # sys has none of their own
    _submit(inbound, "root", "adm", _at(0.5), "put in by hand")  # by the instructor collecting (root here)
    done = _collect(tmp_path, teaching, exchange)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    collected = {s: nbformat.read(teaching / "submitted" / s / A01 / f"{A01}.ipynb", as_version=4).cells[0].source
                 for s in ("daemon", "nobody", "adm", "bin")}
    assert collected == {"daemon": "daemon's own", "nobody": "nobody's own", "adm": "put in by hand",
                         "bin": "bin's own"}, collected
    assert not (teaching / "submitted" / "sys").exists()
    assert "claims to be sys's submission but is owned by nobody: not collected" in done.stderr, done.stderr[-3000:]
    assert "sys has no submission of" in done.stderr, done.stderr[-3000:]
    assert "check_owner = False" not in done.stderr, "advised only where one account owns every folder" 
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr, done.stderr[-3000:]
    assert "forged \\x1b]0;PWNED\\x07\\x1b[2J" in done.stderr, done.stderr[-3000:]
    assert (teaching / "submitted" / "daemon" / A01 / "timestamp.txt").read_text() == f"{daemons} UTC"
    assert "claims to be daemon's submission but is owned by nobody: not collected" in done.stderr, done.stderr[-3000:]
    assert "claims to be bin's submission but is not a folder of its own" in done.stderr, done.stderr[-3000:]


def test_the_courses_collect_settings_name_the_owner_checked_collect():
    """Both places an instructor collects from: the checkout (its nbgrader_config.py) and the JupyterHub."""
    from traitlets.config.loader import PyFileConfigLoader

    for folder in (REPO, REPO / "deploy" / "jupyterhub" / "jupyter"):
        config = PyFileConfigLoader("nbgrader_config.py", path=str(folder)).load_config()
        assert config.ExchangeFactory.collect == "autograder.exchange.OwnerCheckedCollect", folder


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission owned by another user needs root to make")
def test_collect_dates_a_submission_no_earlier_than_its_folder_was_made(tmp_path):
    """A red team's open point: the time is what the student's own process wrote, so daemon could make today a
    folder named, and a timestamp.txt saying, a week ago (before the due date). The folder's ctime, which no
    user sets back, now bounds it; a claim within the clocks' slack is kept as it is."""
    from autograder.exchange import CLOCK_SLACK

    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    week_ago = (datetime.now(timezone.utc) - timedelta(days=7)).strftime("%Y-%m-%d %H:%M:%S.%f")
    _submit(inbound, "daemon", "daemon", week_ago, "made today, dated a week ago")
    bins = _at(0)
    _submit(inbound, "bin", "bin", bins, "made today, dated 12 minutes ago")  # within the slack
    # a red team's: the folder's name says now, the timestamp.txt inside it a week ago (the grader reads the file)
    nobodys = _at(1)
    _submit(inbound, "nobody", "nobody", nobodys, "named now, stamped a week ago")
    stamp = next(inbound.glob("nobody+*")) / "timestamp.txt"
    stamp.write_text(f"{week_ago} UTC")
    # and a folder whose name holds no time at all: once, the whole collect stopped on it
    _submit(inbound, "sys", "sys", "x", "no time in the name")
    before = datetime.now(timezone.utc)
    done = _collect(tmp_path, teaching, exchange)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    stamp = (teaching / "submitted" / "daemon" / A01 / "timestamp.txt").read_text()
    dated = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f %Z").replace(tzinfo=timezone.utc)
    assert before - CLOCK_SLACK <= dated <= datetime.now(timezone.utc), stamp  # the folder's time: today
    assert f"claims to have been submitted at {week_ago[:19]}" in done.stderr and "but it was last changed at " \
        in done.stderr, done.stderr[-3000:]
    assert (teaching / "submitted" / "bin" / A01 / "timestamp.txt").read_text() == f"{bins} UTC"
    assert (teaching / "submitted" / "nobody" / A01 / "timestamp.txt").read_text() == f"{nobodys} UTC"
    assert (teaching / "submitted" / "sys" / A01).is_dir() and "its name holds no submission time" in done.stderr


def test_a_folder_is_dated_by_the_last_change_of_anything_in_it(tmp_path):
    """A folder made before the due date (named and stamped then) whose notebook is rewritten after it keeps the
    folder's own ctime: the notebook's, later, is what dates it."""
    import time

    from autograder.exchange import changed_at

    folder = tmp_path / f"daemon+{A01}+2026-01-01 00:00:00.000000 UTC+x"
    folder.mkdir()
    notebook = folder / f"{A01}.ipynb"
    notebook.write_text("{}")
    time.sleep(1.1)  # past any file system's timestamp granularity
    notebook.write_text('{"cells": []}')  # rewritten in place: the folder's own ctime does not move
    made, written = os.lstat(folder).st_ctime, os.lstat(notebook).st_ctime
    assert written > made
    assert changed_at(str(folder)) == datetime.fromtimestamp(written, timezone.utc).replace(tzinfo=None)
    # links are not followed (the course's copy takes none): a link to / had collect walk the whole disk
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / "everything").symlink_to("/")
    (folder / "elsewhere").symlink_to(outside)
    linked = os.lstat(folder / "elsewhere").st_ctime
    time.sleep(1.1)
    (outside / "later.ipynb").write_text("{}")
    assert changed_at(str(folder)) == datetime.fromtimestamp(linked, timezone.utc).replace(tzinfo=None)


def test_a_folder_too_large_to_look_at_whole_is_dated_now(tmp_path, monkeypatch):
    """Red team 14: the dating walk stopped, silently, after MAX_ENTRIES entries; 20,000 empty files made before the
    due date, then a notebook written late in a folder walked after them, and the hand-in was dated on time (17/17).
    A folder that is not all looked at is dated when collect looks."""
    from autograder import exchange

    monkeypatch.setattr(exchange, "MAX_ENTRIES", 50)
    import time

    folder = tmp_path / "daemon+x+2026-01-01 00:00:00.000000 UTC+x"
    (folder / "z").mkdir(parents=True)
    for n in range(60):  # more than MAX_ENTRIES beside z: the walk's limit is reached before z is looked into
        (folder / f"{n}.pyc").write_text("")
    early = exchange.changed_at(str(folder))
    time.sleep(1.1)  # past any file system's timestamp granularity
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    (folder / "z" / "late.ipynb").write_text("{}")
    dated = exchange.changed_at(str(folder))
    assert dated >= before and dated >= early, (dated, before)
    monkeypatch.setattr(exchange, "MAX_ENTRIES", 20_000)
    assert exchange.changed_at(str(folder)) <= datetime.now(timezone.utc).replace(tzinfo=None)


def test_a_folder_a_thousand_deep_is_dated_and_copied_without_recursion(tmp_path):
    """A red team's: 1,100 nested folders in a student's own inbound folder ended the whole collect with a bare
    RecursionError (os.walk recursed), before anyone's submission was collected."""
    folder = tmp_path / f"daemon+{A01}+2026-01-01 00:00:00.000000 UTC+x"
    (folder / "notes").mkdir(parents=True)
    (folder / f"{A01}.ipynb").write_text("{}")
    _nest(folder, 1100)  # os.makedirs (and rmtree) recurse too: made and removed a level at a time
    try:
        _copied_deep(folder, tmp_path)
    finally:
        _unnest(folder, 1100)


def _nest(folder: Path, levels: int) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    os.close(fd)


def _unnest(folder: Path, levels: int) -> None:
    fds = [os.open(folder, os.O_RDONLY | os.O_DIRECTORY)]
    for _ in range(levels):
        fds.append(os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    os.unlink("bottom.txt", dir_fd=fds[-1])
    while len(fds) > 1:
        os.close(fds.pop())
        os.rmdir("d", dir_fd=fds[-1])
    os.close(fds[0])


def _copied_deep(folder: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from autograder.exchange import MAX_DEPTH, changed_at, copy_own_files

    assert changed_at(str(folder)) is not None
    said = []
    log = SimpleNamespace(warning=lambda *args: said.append(args[0] % args[1:]))
    settings = SimpleNamespace(max_dir_size=1000, max_file_size=100000, ignore=[], include=["*"], groupshared=False)
    copy_own_files(str(folder), str(tmp_path / "copy"), settings, log)
    assert (tmp_path / "copy" / f"{A01}.ipynb").read_text() == "{}"
    depth = sum(1 for _ in (tmp_path / "copy").rglob("d"))
    assert depth == MAX_DEPTH and any(f"more than {MAX_DEPTH} folders deep" in line for line in said), said


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_collect_copies_a_students_own_files_never_what_their_links_name(tmp_path):
    """A red team's: in her own inbound folder 'nobody' replaced her notebook with a link to daemon's collected one
    (which she cannot read) and added links to the instructor's secret and to her folder itself. nbgrader's copytree
    followed them as the instructor: she was graded 17/17 on daemon's notebook, the secret came back in her
    feedback, and the loop stopped the whole collect ("Too many levels of symbolic links"), daemon's newer
    submission never collected. Links, FIFOs and the like are now left out, named; the copies are writable by the
    instructor alone (nbgrader submit's folders are writable by all, and copytree kept that)."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    (teaching / "submitted" / "daemon" / A01).mkdir(parents=True)
    theirs = teaching / "submitted" / "daemon" / A01 / f"{A01}.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("daemon's first")]), theirs)
    (teaching / "submitted" / "daemon" / A01 / "timestamp.txt").write_text(f"{_at(0)} UTC")
    theirs.chmod(0o600)
    secret = teaching / "secret.txt"
    secret.write_text("sk-TOPSECRET-42")
    secret.chmod(0o600)
    _submit(inbound, "nobody", "nobody", _at(1), "nobody's own")
    hers = next(inbound.glob("nobody+*"))
    (hers / f"{A01}.ipynb").unlink()
    (hers / f"{A01}.ipynb").symlink_to(theirs)
    (hers / "secret.txt").symlink_to(secret)
    (hers / "loop").symlink_to(".")
    os.mkfifo(hers / "pipe")
    (hers / "notes").mkdir()
    (hers / "notes" / "plain.txt").write_text("her own words")
    for path in (hers / "notes", hers / "notes" / "plain.txt"):
        shutil.chown(path, "nobody")
    for path in (hers, hers / "notes"):
        path.chmod(0o777)  # as `nbgrader submit` leaves them
    _submit(inbound, "daemon", "daemon", _at(2), "daemon's newer")
    done = _collect(tmp_path, teaching, exchange, "--update")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    got = teaching / "submitted" / "nobody" / A01
    assert sorted(p.name for p in got.rglob("*")) == ["notes", "plain.txt", "timestamp.txt"], list(got.rglob("*"))
    assert (got / "notes" / "plain.txt").read_text() == "her own words"
    for name in (f"{A01}.ipynb", "secret.txt", "loop"):
        assert f"{hers / name}: not collected (a symbolic link)" in done.stderr, done.stderr[-3000:]
    assert f"{hers / 'pipe'}: not collected (not a regular file)" in done.stderr
    assert nbformat.read(theirs, as_version=4).cells[0].source == "daemon's newer"  # the rest of the class: collected
    for path in [got, *got.rglob("*")]:
        assert path.stat().st_mode & 0o7777 == (0o755 if path.is_dir() else 0o644), (path, oct(path.stat().st_mode))


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_one_submission_that_cannot_be_collected_never_stops_the_others(tmp_path):
    """nbgrader's collect stopped at the first folder it could not copy (one too big here): every student after it,
    in its order, was not collected. Now each is, the one that failed is named, and collect still fails."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    for user in ("bin", "daemon", "nobody"):
        _submit(inbound, user, user, _at(1), f"{user}'s own")
    big = next(inbound.glob("bin+*")) / "data.bin"
    big.write_bytes(os.urandom(600_000))
    shutil.chown(big, "bin")
    done = _collect(tmp_path, teaching, exchange, "--CourseDirectory.max_dir_size=500")
    assert done.returncode != 0
    assert "bin+" in done.stderr and "not collected (Directory size is too big" in done.stderr, done.stderr[-3000:]
    assert "1 submission(s) could not be collected" in done.stderr
    assert not (teaching / "submitted" / "bin" / A01).exists()  # never half of it
    for user in ("daemon", "nobody"):
        assert nbformat.read(teaching / "submitted" / user / A01 / f"{A01}.ipynb", as_version=4).cells[0].source \
            == f"{user}'s own"


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_a_folder_dated_in_the_future_in_a_classmates_name_never_blocks_their_own(tmp_path):
    """A red team's: before daemon handed anything in, 'nobody' made daemon+01+2099-01-01+x holding a blank notebook,
    taken as daemon's (daemon had no folder of his own yet). daemon then handed in; `collect --update` refused the
    forgery but said "No newer submission to collect": 2099 was later than his real time. A claimed time later than
    anything in the folder changed is the folder's own time."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    _submit(inbound, "nobody", "daemon", "2099-01-01 00:00:00.000000", "forged")
    first = _collect(tmp_path, teaching, exchange)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "later than anything in it changed" in first.stderr, first.stderr[-3000:]
    _submit(inbound, "daemon", "daemon", _at(12), "daemon's own")
    again = _collect(tmp_path, teaching, exchange, "--update")
    assert again.returncode == 0, again.stderr[-3000:]
    got = nbformat.read(teaching / "submitted" / "daemon" / A01 / f"{A01}.ipynb", as_version=4).cells[0].source
    assert got == "daemon's own", again.stderr[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_a_newer_submission_that_cannot_be_collected_leaves_the_one_collected_before(tmp_path):
    """A reviewer's: nbgrader removes a student's collected folder before copying their newer submission; when that
    copy failed (too big), the student had none left and was graded as missing. The earlier copy is put back."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    empty = _collect(tmp_path, teaching, exchange)  # nothing handed in yet: nbgrader's own warning, once
    assert empty.returncode == 0 and "No submissions of '01_similarity_attention'" in empty.stderr, empty.stderr
    _submit(inbound, "bin", "bin", _at(1), "bin's first")
    _submit(inbound, "daemon", "daemon", _at(1), "daemon's first")
    first = _collect(tmp_path, teaching, exchange)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stderr.count("Processing 2 submissions") == 1 and "Processing 1 submissions" not in first.stderr
    _submit(inbound, "bin", "bin", _at(5), "bin's second, too big")
    big = next(p for p in inbound.glob("bin+*") if "too big" in p.name) / "data.bin"
    big.write_bytes(os.urandom(600_000))
    shutil.chown(big, "bin")
    again = _collect(tmp_path, teaching, exchange, "--update", "--CourseDirectory.max_dir_size=500")
    assert again.returncode != 0 and "the copy collected before is kept" in again.stderr, again.stderr[-3000:]
    kept = nbformat.read(teaching / "submitted" / "bin" / A01 / f"{A01}.ipynb", as_version=4).cells[0].source
    assert kept == "bin's first"
    assert sorted(p.name for p in (teaching / "submitted" / "bin").iterdir()) == [A01]  # nothing left aside


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_collect_without_update_names_the_students_whose_newer_submission_it_left(tmp_path):
    """An instructor's first week (finding 4): a student handed in again, `nbgrader collect` without --update kept
    the copy collected before, logged one INFO line and exited 0, and the grade run reported the old score as clean.
    The course's collect says it as a WARNING naming the student; --update collects it (and says nothing)."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    _submit(inbound, "bin", "bin", _at(1), "bin's first")
    _submit(inbound, "daemon", "daemon", _at(1), "daemon's first")
    first = _collect(tmp_path, teaching, exchange)
    assert first.returncode == 0 and "NOT COLLECTED" not in first.stderr, first.stderr[-3000:]
    _submit(inbound, "bin", "bin", _at(5), "bin's second")
    again = _collect(tmp_path, teaching, exchange)
    assert again.returncode == 0, again.stderr[-3000:]
    warning = next((line for line in again.stderr.splitlines() if "NOT COLLECTED" in line), "")
    assert "WARNING" in warning and "1 student(s) handed in 01_similarity_attention again" in warning, again.stderr
    assert "bin (collected: " in warning and "daemon" not in warning and "--update" in warning, warning
    kept = nbformat.read(teaching / "submitted" / "bin" / A01 / f"{A01}.ipynb", as_version=4).cells[0].source
    assert kept == "bin's first"
    updated = _collect(tmp_path, teaching, exchange, "--update")
    assert updated.returncode == 0 and "NOT COLLECTED" not in updated.stderr, updated.stderr[-3000:]
    got = nbformat.read(teaching / "submitted" / "bin" / A01 / f"{A01}.ipynb", as_version=4).cells[0].source
    assert got == "bin's second"
    assert "NOT COLLECTED" not in _collect(tmp_path, teaching, exchange).stderr  # nothing newer left


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder owned by another user needs root to make")
def test_collect_refuses_an_exchange_a_student_could_have_replaced(tmp_path):
    """A red team: the hub's exchange was made 777 without the sticky bit (the README's recipe then, and nbgrader's
    own), so a student renamed the course's folder away and put her own inbound in its place; classmates submitted
    into it, and she hid one, framed another with a planted notebook and re-dated a third: collect saw nothing wrong.
    Collect now refuses such an exchange, and a course or inbound folder another user owns, saying what to do; and
    it never copies a file another user put into a student's folder (nbgrader submit leaves it writable by all)."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    _submit(inbound, "daemon", "daemon", _at(1), "daemon's own")
    planted = next(inbound.iterdir()) / "planted.ipynb"
    planted.write_text("{}")
    shutil.chown(planted, "nobody")

    def collect() -> subprocess.CompletedProcess:
        return _collect(tmp_path, teaching, exchange)

    exchange.chmod(0o777)
    done = collect()
    assert done.returncode != 0 and "lets every user rename what is in it" in done.stderr, done.stderr[-3000:]
    assert "chmod +t" in done.stderr and not (teaching / "submitted").exists()
    exchange.chmod(0o1777)
    shutil.chown(inbound.parent, "nobody")
    done = collect()
    assert done.returncode != 0 and "is owned by nobody, not by you or root" in done.stderr, done.stderr[-3000:]
    shutil.chown(inbound.parent, "root")
    done = collect()
    assert done.returncode == 0, done.stderr[-3000:]
    collected = teaching / "submitted" / "daemon" / A01
    assert (collected / f"{A01}.ipynb").is_file() and not (collected / "planted.ipynb").exists()
    assert "planted.ipynb: not collected (made by nobody, not by the student whose submission this is)" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="a submission owned by another user needs root to make")
def test_collect_warns_of_an_inbound_where_students_can_rename_one_anothers_folders(tmp_path):
    """Red team 14: nbgrader makes the inbound 733; a student who learnt a classmate's folder name renamed it away
    (never collected, without a word). Collect says so, with the fix (the sticky bit)."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    _submit(inbound, "daemon", "daemon", _at(1), "daemon's own")
    inbound.chmod(0o733)
    done = _collect(tmp_path, teaching, exchange)
    assert done.returncode == 0 and "lets every user rename or remove what is in it" in done.stderr, done.stderr
    assert f"chmod +t {inbound}" in done.stderr, done.stderr
    inbound.chmod(0o1733)
    again = _collect(tmp_path, teaching, exchange, "--update")
    assert again.returncode == 0 and "lets every user rename" not in again.stderr, again.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="submissions owned by other users need root to make")
def test_one_change_of_many_students_folders_at_once_is_named_and_kept_only_on_the_instructors_word(tmp_path):
    """A red team (12): an administrator's `chmod -R g+w inbound/*` after the due date set every folder's ctime to then,
    and collect dated every on-time submission at the chmod (0/17 under a zero late policy), blaming the students.
    Red team 13: keeping such a crowd's claimed times by itself let three colluding students (or one, with folders
    owned by uids no account has) date a late submission on time. Now collect names the moment and the option; the
    instructor who made the change names it, and the submissions already collected are collected again, dated as
    their names claim."""
    exchange, teaching = tmp_path / "exchange", tmp_path / "teaching"
    inbound = exchange / COURSE_ID / "inbound"
    inbound.mkdir(parents=True)
    teaching.mkdir()
    claimed = {who: _at(-10 - k) for k, who in enumerate(("daemon", "bin", "sys"))}  # 22+ minutes ago: on time
    for who, when in claimed.items():
        _submit(inbound, who, who, when, f"{who}'s own")
    for folder in inbound.iterdir():  # the administrator's chmod, now: every folder's ctime is now
        for path in (folder, *folder.iterdir()):
            path.chmod(path.stat().st_mode | 0o020)
    changed = max(os.lstat(p).st_ctime for folder in inbound.iterdir() for p in (folder, *folder.iterdir()))
    done = _collect(tmp_path, teaching, exchange)
    assert done.returncode == 0, done.stderr[-3000:]
    for who, when in claimed.items():  # dated by the change, as students changing their own folders together would be
        assert (teaching / "submitted" / who / A01 / "timestamp.txt").read_text() != f"{when} UTC", who
    assert "3 submissions' folders (3 students) were all changed at about" in done.stderr, done.stderr[-3000:]
    option = re.search(r"--OwnerCheckedCollect\.inbound_changed_at='([^']+)'", done.stderr)
    assert option, done.stderr[-3000:]
    assert abs(datetime.fromisoformat(option.group(1)).replace(tzinfo=timezone.utc).timestamp() - changed) < 1
    again = _collect(tmp_path, teaching, exchange, f"--OwnerCheckedCollect.inbound_changed_at={option.group(1)}")
    assert again.returncode == 0, again.stderr[-3000:]
    for who, when in claimed.items():
        assert (teaching / "submitted" / who / A01 / "timestamp.txt").read_text() == f"{when} UTC", who
        assert nbformat.read(teaching / "submitted" / who / A01 / f"{A01}.ipynb", as_version=4).cells[0].source \
            == f"{who}'s own"
    assert "3 submission(s) of" in again.stderr and "keep the times their names claim" in again.stderr, again.stderr
    assert "Dating again: daemon" in again.stderr, again.stderr[-3000:]
    refused = _collect(tmp_path, teaching, exchange, "--OwnerCheckedCollect.inbound_changed_at=yesterday")
    assert refused.returncode != 0 and "is no moment" in refused.stderr, refused.stderr[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="files owned by another user need root to make")
def test_a_classmate_who_writes_into_a_students_folder_never_redates_it(tmp_path):
    """Red team 13: `nbgrader submit` leaves a submission folder writable by all; a student who knew a classmate's
    folder name made and removed one file in it after the due date, and collect dated the on-time classmate then
    (0/17). Only what the folder's owner put in it dates it; an empty folder, by its own time."""
    import time

    from autograder.exchange import changed_at

    inbound = tmp_path / "inbound"
    inbound.mkdir()
    _submit(inbound, "daemon", "daemon", _at(0), "daemon's own")
    folder = next(inbound.iterdir())
    folder.chmod(0o777)
    handed_in = changed_at(str(folder))
    time.sleep(1.1)  # past any file system's timestamp granularity
    stray = folder / "x"  # nobody's, made and removed: the folder's own ctime is now
    stray.write_text("")
    shutil.chown(stray, "nobody")
    planted = folder / "planted.ipynb"  # and one left there, never collected
    planted.write_text("{}")
    shutil.chown(planted, "nobody")
    stray.unlink()
    assert os.lstat(folder).st_ctime > handed_in.replace(tzinfo=timezone.utc).timestamp()
    assert changed_at(str(folder)) == handed_in
    empty = tmp_path / "empty"
    empty.mkdir()
    assert changed_at(str(empty)) == datetime.fromtimestamp(os.lstat(empty).st_ctime, timezone.utc).replace(tzinfo=None)
