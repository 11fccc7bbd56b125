"""One `attn-course grade` at a time in a grading folder. Two runs into the same --out (a second
terminal, a cron job beside the instructor) rewrote each other's copy of the runner's modules while a
sandbox started from it, raced on the gradebook and on grades.csv; the second run is refused at once,
saying which run holds the folder, instead of either of them grading on a folder the other changes.

The lock is filelock's (an flock on Unix: the kernel lets go of it when its process ends, however it
ends, so a killed run never leaves the folder locked). Beside it, a note of who holds it, for the message.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout

LOCK_NAME = ".attn-course-grade.lock"
HOLDER_NAME = ".attn-course-grade.holder.json"


class FolderInUse(ValueError):
    """Another grading run holds this grading folder (the message says which, and what to do)."""


@contextmanager
def held(out: Path) -> Iterator[None]:
    """Hold grading folder `out` for the block, or raise FolderInUse at once. A folder this made and
    the block left empty is removed again: a run refused before it wrote anything leaves no folder."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with _held(out):
            yield
    finally:
        if made and {p.name for p in out.iterdir()} <= {LOCK_NAME}:
            (out / LOCK_NAME).unlink(missing_ok=True)
            out.rmdir()


@contextmanager
def _held(out: Path) -> Iterator[None]:
    lock = FileLock(out / LOCK_NAME, blocking=False, thread_local=False, fallback_to_soft=False)
    try:
        lock.acquire()
    except Timeout:
        raise FolderInUse(_in_use_message(out)) from None
    holder = out / HOLDER_NAME
    try:
        holder.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                      "command": " ".join(sys.argv)}))
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


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
