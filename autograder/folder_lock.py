"""One `attn-course grade` at a time in a grading folder. Two runs into the same --out (a second
terminal, a cron job beside the instructor) rewrote each other's copy of the runner's modules while a
sandbox started from it, raced on the gradebook and on grades.csv; the second run is refused at once,
saying which run holds the folder, instead of either of them grading on a folder the other changes.

The lock is an flock on a file in the folder: the kernel lets go of it when its process ends, however
it ends, so a killed run never leaves the folder locked. It is taken on a read-only descriptor (flock
needs no write access), so the teaching assistants sharing a grading folder lock the same file whoever
made it; filelock opens its file for writing, which another account's file refuses. Beside it, a note
of who holds it, for the message. On a file system without locks (NFS without its lock service) the
run goes on unlocked, and says so.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

LOCK_NAME = ".attn-course-grade.lock"
HOLDER_NAME = ".attn-course-grade.holder.json"


class FolderInUse(ValueError):
    """Another grading run holds this grading folder (the message says which, and what to do)."""


class FolderNotWritable(ValueError):
    """The grading folder cannot be made or written by this user (the message says what to give instead)."""


@contextmanager
def held(out: Path) -> Iterator[None]:
    """Hold grading folder `out` for the block, or raise FolderInUse at once. A folder this made and
    the block left with nothing but the lock in it is removed again: a run stopped before it wrote
    anything leaves no folder."""
    made = not out.exists()
    with _writable(out):
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o664)
    locked = _locked(fd, out)  # FolderInUse: the descriptor is closed, nothing of the holder's touched
    try:
        if locked:
            with _writable(out):
                _note_holder(out)
        yield
    finally:
        if locked:
            (out / HOLDER_NAME).unlink(missing_ok=True)
        if locked and made and {p.name for p in out.iterdir()} <= {LOCK_NAME}:  # held: no other run is inside
            (out / LOCK_NAME).unlink(missing_ok=True)
            out.rmdir()
        os.close(fd)  # the lock goes with the descriptor


def _locked(fd: int, out: Path) -> bool:
    """Take the lock on `fd` (True), or go on unlocked where the file system has no locks (False);
    FolderInUse when another run holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FolderInUse(_in_use_message(out)) from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        print(f"grader: {out} is on a file system without locks ({err.strerror}): nothing stops a second run "
              "into it meanwhile; run one at a time", file=sys.stderr)
        return False
    return True


@contextmanager
def _writable(out: Path) -> Iterator[None]:
    """FolderNotWritable, saying what to do, for a write into `out` refused (not ours to write, or a read-only
    file system): grading needs a folder of one's own (a new one, with --out), exporting from it or taking
    students out needs write access to this one."""
    import getpass

    try:
        yield
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise FolderNotWritable(
            f"{out} cannot be written by {getpass.getuser()} ({err.strerror}: {err.filename}): grading needs a "
            f"folder you can write (a new one: `--out ~/grading`); exporting from it, or changing it, needs write "
            f"access to it from its owner") from None


def _note_holder(out: Path) -> None:
    """Who holds the folder, for the message a second run gets (replaced whole: never half written)."""
    note = out / f"{HOLDER_NAME}.{os.getpid()}"
    note.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "command": " ".join(sys.argv)}))
    os.replace(note, out / HOLDER_NAME)


def _in_use_message(out: Path) -> str:
    try:
        who = json.loads((out / HOLDER_NAME).read_text())
        by = (f"process {who['pid']} on {who['host']}, since {who['since']} UTC"
              + (f": `{who['command']}`" if who.get("command") else ""))
    except (OSError, ValueError, KeyError, TypeError):
        by = "a process that has not said which yet"
    return (f"{out} is being graded into by another run ({by}). Two runs in one grading folder would rewrite "
            "each other's files: wait for that one to finish (its table comes at the end), or grade into "
            "another --out.")
