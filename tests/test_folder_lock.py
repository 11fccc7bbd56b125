"""One grading run at a time in a grading folder: a second `attn-course grade` into the same --out is
refused at once, saying which run holds it, before it changes anything; a run that was killed holds
nothing. Two runs together once rewrote each other's copy of the runner's modules while a sandbox
started from it (the first run's warm sandboxes failed: "No module named 'autograder.channel'")."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from autograder import folder_lock
from course_tools import cli

from .setups import ordinary_user, run_as, scratch_dir

HOLD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from autograder import folder_lock
    with folder_lock.held(Path(sys.argv[1])):
        print("held", flush=True)
        time.sleep(600)
""")


@pytest.fixture
def other_run(tmp_path):
    """Another process holding tmp_path/'out', as a second grading run would; killed at the end."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), "attn-course", "grade"], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield out, proc
    proc.kill()
    proc.wait()


def test_a_second_run_into_a_held_folder_is_refused_before_it_changes_anything(tmp_path, capsys, other_run):
    out, proc = other_run
    subs = tmp_path / "submissions" / "ann"
    subs.mkdir(parents=True)
    before = sorted(p.name for p in out.iterdir())
    code = cli.main(["grade", str(subs.parent), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"is being graded into by another run (process {proc.pid} on " in err and "another --out" in err, err
    assert sorted(p.name for p in out.iterdir()) == before, "the refused run wrote into the folder"


def test_a_killed_run_holds_nothing(other_run):
    out, proc = other_run
    with pytest.raises(folder_lock.FolderInUse):
        with folder_lock.held(out):
            pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with folder_lock.held(out):  # the kernel let go of the killed process's lock
        assert (out / folder_lock.HOLDER_NAME).is_file()
    assert not (out / folder_lock.HOLDER_NAME).exists()


def test_a_folder_shared_by_two_accounts_is_locked_by_either(tmp_path):
    """Teaching assistants share a grading folder (group-writable): the lock file one of them made is
    another account's, read-only to the next. The lock needs no write access to it (filelock's did:
    PermissionError, exit 2, for every run after the first account's)."""
    user = ordinary_user()
    if user is None:
        pytest.skip("needs root and an ordinary user (`.ci/run` makes one)")
    base = scratch_dir()
    try:
        out = base / "grading"
        out.mkdir()
        with folder_lock.held(out):  # the first account's run (root here) made the lock file
            pass
        out.chmod(0o777)
        assert (out / folder_lock.LOCK_NAME).stat().st_uid == os.getuid()
        found = run_as(user, f"""
            from pathlib import Path
            from autograder import folder_lock
            with folder_lock.held(Path({str(out)!r})):
                print(json.dumps("held"))
            """)
        assert found == "held"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_folder_the_user_cannot_write_is_refused_with_what_to_give_instead():
    """An instructor's account running the README's `--out build/grading` in a checkout it cannot write:
    a traceback ending in PermissionError (exit 1) before; now exit 2 and what to do."""
    user = ordinary_user()
    if user is None:
        pytest.skip("needs root and an ordinary user (`.ci/run` makes one)")
    base = scratch_dir()
    try:
        (base / "root-owned").mkdir(mode=0o755)
        (base / "root-owned").chmod(0o755)
        (base / "subs" / "ann").mkdir(parents=True)
        (base / "subs").chmod(0o755)
        found = run_as(user, f"""
            from course_tools import cli
            import contextlib, io
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = cli.main(["grade", {str(base / 'subs')!r}, "--out", {str(base / 'root-owned' / 'grading')!r}])
            print(json.dumps([code, err.getvalue()]))
            """)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    code, err = found
    assert code == 2, err
    assert f"{base / 'root-owned' / 'grading'} cannot be written by {user} (Permission denied" in err, err
    assert "--out ~/grading" in err and "Traceback" not in err, err


def test_export_into_a_folder_a_grading_run_holds_is_refused(tmp_path, capsys, other_run):
    out, proc = other_run
    for name in ("gradebook.db", "course/source", "course/release"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).mkdir() if name.startswith("course/") else (out / name).write_bytes(b"")
    assert cli.main(["export", str(out), "--to", "moodle"]) == 2
    err = capsys.readouterr().err
    assert f"is being graded into by another run (process {proc.pid} on " in err, err
    assert not (out / "lms").exists()
