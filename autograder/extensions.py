"""A student's extension (`attn-course extend OUT ID NOTEBOOK --days N`): their own due date for one notebook.

nbgrader keeps extensions in its gradebook (a submission's `extension`, added to the assignment's due date),
and every lateness the grader writes comes from there: grades.csv, the penalties, the report, the feedback
pages and the exports. formgrader has no field for it, and nbgrader no command: this is the one. An
extension replaces the one before (nbgrader's rule: they do not add up); `--days 0` takes it back.

nbgrader keeps an extension on a submission, so one given before the student has handed anything in waits in
PENDING (beside the gradebook) and is given when their notebook is first graded (`give_pending`, run before the
tables are written).
"""
from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from . import folder_lock
from .lms import ExportError, grading_output, rewrite_outputs, settled_course


class ExtensionError(ValueError):
    """An extension that cannot be given as asked: the message says why and what to do instead."""


@dataclass
class Extension:
    student: str
    notebook: str
    due: datetime | None  # the assignment's due date (UTC), None when it has none
    extended_to: datetime | None  # the student's own, None when no extension is left
    pending: bool = False  # nothing of theirs graded yet: given when their notebook first is


PENDING = "extensions-pending.json"  # beside the gradebook: {student: {notebook: hours}} for notebooks not graded yet


def grant(out: Path, student: str, notebook: str, days: float = 0.0, hours: float = 0.0) -> Extension:
    """Give `student` `days` + `hours` more for `notebook` in the class graded into `out`, then rewrite its
    tables, report and feedback pages: the new lateness and penalty show at once, without grading again."""
    from nbgrader.api import Gradebook, MissingEntry

    if days < 0 or hours < 0:
        raise ExtensionError("an extension is a time after the due date: give --days and --hours of 0 or more")
    try:
        out = grading_output(out)
    except ExportError as err:
        raise ExtensionError(str(err)) from None
    with folder_lock.held(out):
        course = settled_course(out)
        with Gradebook(course.db_url) as gb:
            try:
                assignment = gb.find_assignment(notebook)
            except MissingEntry:
                names = ", ".join(sorted(a.name for a in gb.assignments))
                raise ExtensionError(f"no notebook {notebook!r} in {out}; its notebooks: {names}") from None
            known = {s.id for s in gb.students}
            if student not in known:
                close = difflib.get_close_matches(student, sorted(known), n=3, cutoff=0.5) or \
                    sorted(k for k in known if student.lower() in k.lower())[:3]
                hint = f"; did you mean {' or '.join(close)}?" if close else ""
                raise ExtensionError(f"no student {student!r} in {out}{hint} (the ids are those of grades.csv's "
                                     "student_id column)")
            if assignment.duedate is None:  # nbgrader would store it, then fail on every later read of the class
                raise ExtensionError(f"{notebook} has no due date in {out}, so there is nothing to extend: give it one "
                                     f"first (attn-course grade ... --due {notebook}=DATE)")
            due = assignment.duedate
            try:
                gb.find_submission(notebook, student)
            except MissingEntry:  # nothing handed in yet: kept until their notebook is graded
                _set_pending(out, student, notebook, days * 24 + hours)
                extended = due + timedelta(days=days, hours=hours) if (days or hours) else None
                return Extension(student, notebook, due, extended, pending=True)
            gb.grant_extension(notebook, student, hours=hours, days=days)
            extended = gb.find_submission(notebook, student).duedate if (days or hours) else None
        _set_pending(out, student, notebook, 0)  # one given now replaces one that waited
        rewrite_outputs(course, out)
    return Extension(student, notebook, due, extended)


def _read_pending(out: Path) -> dict[str, dict[str, float]]:
    try:
        found = json.loads((out / PENDING).read_text())
    except (OSError, ValueError):
        return {}
    return {s: {n: float(h) for n, h in nbs.items() if isinstance(h, (int, float))}
            for s, nbs in found.items() if isinstance(nbs, dict)} if isinstance(found, dict) else {}


def _set_pending(out: Path, student: str, notebook: str, hours: float) -> None:
    """Keep (hours > 0) or drop the extension waiting for `student`'s `notebook`."""
    pending = _read_pending(out)
    if hours > 0:
        pending.setdefault(student, {})[notebook] = hours
    elif notebook in pending.get(student, {}):
        del pending[student][notebook]
    else:
        return
    pending = {s: nbs for s, nbs in pending.items() if nbs}
    tmp = out / (PENDING + ".tmp")
    tmp.write_text(json.dumps(pending, indent=1, sort_keys=True))
    os.replace(tmp, out / PENDING)


def give_pending(db_url: str, out: Path) -> list[str]:
    """Give each waiting extension whose notebook the gradebook now holds; 'student notebook' for each given."""
    from nbgrader.api import Gradebook, MissingEntry

    pending, given = _read_pending(out), []
    if not pending:
        return given
    with Gradebook(db_url) as gb:
        for student, notebooks in pending.items():
            for notebook, hours in notebooks.items():
                try:
                    gb.find_submission(notebook, student)
                except MissingEntry:
                    continue
                gb.grant_extension(notebook, student, hours=hours)
                given.append((student, notebook))
    for student, notebook in given:
        _set_pending(out, student, notebook, 0)
    return [f"{student} {notebook}" for student, notebook in given]


def describe(done: Extension) -> str:
    """The console line for a granted (or taken back) extension."""
    if done.extended_to is None:
        return f"{done.student} {done.notebook}: no extension now (due {_when(done.due)}, as for everyone)"
    waits = ("; nothing of theirs is graded yet: it is given when their notebook is (their row says 'missing' until "
             "then)" if done.pending else "")
    return (f"{done.student} {done.notebook}: due {_when(done.extended_to)} for them (the class's: {_when(done.due)}); "
            f"an extension given again replaces this one{waits}")


def _when(moment: datetime | None) -> str:
    return "never (no due date)" if moment is None else moment.strftime("%Y-%m-%d %H:%M UTC")
