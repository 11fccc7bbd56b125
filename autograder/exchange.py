"""nbgrader's `collect`, with the owner check enforced. The exchange's inbound folder is writable by
every user (mode 733): a student can create `bob+<assignment>+<later time>+x/` holding a blank notebook,
and nbgrader's own collect only logs "claims to be submitted by bob but is owned by mallory; cheating
attempt?" and copies it as Bob's newest submission (graded 0 / 17, "without problems").

Here a submission in a student's name whose folder another user owns (or that is not a folder at all:
a symbolic link to one of the student's own folders) is never collected when that student has a folder
of their own in the inbound: their newest own submission is collected instead (nbgrader's due-date rule
applied to their own), and the refusal is logged as an error naming the folder and its owner. A student
with no folder of their own (all servers write as one account, or the instructor put a file in by hand)
keeps nbgrader's behaviour and warning: owners say nothing there.

A submission's time is the one `nbgrader submit` wrote, in the student's own process, into the folder's
name and its `timestamp.txt`: a student can make a folder today named for last week. The kernel's record
of when the folder or a file in it last changed (their ctimes, which no user can set back) bounds it: a claimed time earlier
than that by more than `CLOCK_SLACK` is replaced, in the record collect decides with and in the collected
`timestamp.txt`, by the folder's own time, and the refusal is logged as an error naming both times.

Configured for the course's collect by `c.ExchangeFactory.collect` (the checkout's nbgrader_config.py,
the JupyterHub's deploy/jupyterhub/jupyter/nbgrader_config.py).
"""
from __future__ import annotations

import glob
import os
import stat
from datetime import datetime, timedelta, timezone

from nbgrader.exchange.default.collect import ExchangeCollect

try:
    import pwd
except ImportError:  # pragma: no cover - Windows: no owners to check (nbgrader checks none there either)
    pwd = None


def owner_of(path: str) -> str | None:
    """The user name owning folder `path` ('uid N' when the system has no name for it); None when it is
    not a real folder (a symbolic link is its maker's, whatever it points at) or cannot be read."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        return f"uid {info.st_uid}"


# How far a submission's claimed time may lie before the time its folder was last changed: a copy of a large
# notebook, and the clocks of the student's server and the exchange's file server, which may differ a little.
CLOCK_SLACK = timedelta(minutes=15)
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # what `nbgrader submit` writes (its default timestamp_format)


def changed_at(path: str) -> datetime | None:
    """When the kernel last changed folder `path` or anything in it (the latest ctime: set at each entry made or
    removed, each file written, never set back by a user; a folder made before the due date, its notebook
    rewritten after it, is dated by the notebook), links followed to what they name, as nbgrader's copy follows
    them; naive UTC as nbgrader's parsed timestamps; None when the folder cannot be read."""
    times: list[float] = []
    seen: set[str] = set()

    def note(entry: str) -> None:
        for look in (os.lstat, os.stat):  # the link itself, and the file or folder it names
            try:
                times.append(look(entry).st_ctime)
            except OSError:
                continue

    note(path)
    if not times:
        return None
    for folder, dirs, files in os.walk(path, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:  # a link back up: walked once
            dirs[:] = []
            continue
        seen.add(real)
        for name in dirs + files:
            note(os.path.join(folder, name))
    return datetime.fromtimestamp(max(times), timezone.utc).replace(tzinfo=None)


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's ExchangeCollect; a submission whose folder another user owns is never collected as a
    student's who has folders of their own, and none is dated earlier than its folder was made."""

    def _path_to_record(self, path):
        made = changed_at(path)
        try:
            record = super()._path_to_record(path)
        except Exception:  # noqa: BLE001 - a name that is no time (anyone can write in the inbound): never the whole collect
            name = os.path.basename(path)
            self.log.error("%s: its name holds no submission time; dated by the file system instead (%s UTC).",
                           path, made)
            record = {"username": name.rsplit("+", 3)[0], "filename": name, "timestamp": made or datetime.min}
        if made is not None and record["timestamp"] is not None and record["timestamp"] < made - CLOCK_SLACK:
            self.log.error("%s claims to have been submitted at %s UTC, but it was last changed at %s UTC: dated "
                           "%s UTC (the time a student's own process writes is not taken over the file system's).",
                           path, record["timestamp"], made, made)
            record["timestamp"] = made
        self._dated = {**getattr(self, "_dated", {}), os.path.basename(path): record["timestamp"]}
        return record

    def do_copy(self, src, dest, log=None):
        super().do_copy(src, dest, log)
        when = getattr(self, "_dated", {}).get(os.path.basename(src))
        if when is not None:  # what the grader reads as the submission time: the one decided here, never the
            # timestamp.txt the student's process wrote (it may say another time than the folder's name)
            with open(os.path.join(dest, "timestamp.txt"), "w") as fh:
                fh.write(when.replace(tzinfo=timezone.utc).strftime(TIMESTAMP_FORMAT))

    def copy_files(self):
        if pwd is not None and self.check_owner and self.src_records:
            owners = self._owners()
            self.src_records = [r for r in (self._own_record(r, owners) for r in self.src_records) if r is not None]
        super().copy_files()

    def _owners(self) -> dict[str, str | None]:
        """Each inbound entry (any student, any assignment) -> its owner (None: not a real folder)."""
        return {os.path.basename(p): owner_of(p) for p in glob.glob(os.path.join(self.inbound_path, "*+*+*"))}

    def _own_record(self, record: dict, owners: dict[str, str | None]) -> dict | None:
        """`record`, or the newest of the same student's own submissions when another user made it."""
        student = record["username"]
        owner = owners.get(record["filename"])
        if owner == student:
            return record
        has_own = any(name.rsplit("+", 3)[0] == student and who == student for name, who in owners.items())
        if not has_own and owner is not None:
            return record  # owners cannot vouch here (one account for all, a file put in by hand): nbgrader warns
        path = os.path.join(self.inbound_path, record["filename"])
        self.log.error("%s claims to be %s's submission but is %s: not collected (anyone can write into the "
                       "exchange's inbound; only the student's own folders are theirs).", path, student,
                       f"owned by {owner}" if owner else "not a folder of its own (a link, or unreadable)")
        prefix = f"{student}+{self.coursedir.assignment_id}+"
        own = [self._path_to_record(os.path.join(self.inbound_path, name)) for name, who in owners.items()
               if name.startswith(prefix) and who == student]
        if self.duedate is not None and self.before_duedate:
            own = [r for r in own if r["timestamp"] <= self.duedate] or own
        if not own:
            self.log.error("%s has no submission of %s of their own in the exchange.", student,
                           self.coursedir.assignment_id)
            return None
        return self._sort_by_timestamp(own)[0]
