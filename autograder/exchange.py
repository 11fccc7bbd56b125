"""nbgrader's `collect`, with the owner check enforced. The exchange's inbound folder is writable by
every user (mode 733): a student can create `bob+<assignment>+<later time>+x/` holding a blank notebook,
and nbgrader's own collect only logs "claims to be submitted by bob but is owned by mallory; cheating
attempt?" and copies it as Bob's newest submission (graded 0 / 17, "without problems").

Here a submission whose folder is owned by another user than the one it names is never collected: the
student's newest own submission is collected instead (nbgrader's due-date rule applied to their own),
and the refusal is logged as an error naming the folder and its owner. Where the exchange cannot tell
owners apart (every submission owned by one account, as when all students' servers run as one user),
nothing is refused and nbgrader's warning stands, with a line saying why.

Configured for the course's collect by `c.ExchangeFactory.collect` (the checkout's nbgrader_config.py,
the JupyterHub's deploy/jupyterhub/jupyter/nbgrader_config.py).
"""
from __future__ import annotations

import glob
import os

from nbgrader.exchange.default.collect import ExchangeCollect

try:
    import pwd
except ImportError:  # pragma: no cover - Windows: no owners to check (nbgrader checks none there either)
    pwd = None


def owner_of(path: str) -> str:
    """The user name owning `path` ('uid N' when the system has no name for it)."""
    uid = os.stat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's ExchangeCollect; a submission whose folder another user owns is never collected."""

    def copy_files(self):
        if pwd is not None and self.check_owner and self.src_records and self._owners_tell_users_apart():
            self.src_records = [r for r in map(self._own_record, self.src_records) if r is not None]
        super().copy_files()

    def _owners_tell_users_apart(self) -> bool:
        """Whether any submission in the inbound (any student, any assignment) is owned by the user it names:
        if none is, every server writes as one account, and owners say nothing."""
        for path in glob.glob(os.path.join(self.inbound_path, "*+*+*")):
            if os.path.basename(path).rsplit("+", 3)[0] == owner_of(path):
                return True
        self.log.warning("No submission in %s is owned by the user it names (all servers write as one account?): "
                         "owners cannot be checked here, so nbgrader's own warnings stand.", self.inbound_path)
        return False

    def _own_record(self, record: dict) -> dict | None:
        """`record`, or the newest of the same student's own submissions when another user made it."""
        student = record["username"]
        path = os.path.join(self.inbound_path, record["filename"])
        if owner_of(path) == student:
            return record
        self.log.error("%s claims to be %s's submission but is owned by %s: not collected (anyone can write into "
                       "the exchange's inbound; only the student's own folders are theirs).", path, student,
                       owner_of(path))
        pattern = os.path.join(self.inbound_path, glob.escape(f"{student}+{self.coursedir.assignment_id}+") + "*")
        own = [self._path_to_record(p) for p in glob.glob(pattern) if owner_of(p) == student]
        if self.duedate is not None and self.before_duedate:
            own = [r for r in own if r["timestamp"] <= self.duedate] or own
        if not own:
            self.log.error("%s has no submission of %s of their own in the exchange.", student,
                           self.coursedir.assignment_id)
            return None
        return self._sort_by_timestamp(own)[0]
