"""A student's extension (`attn-course extend OUT ID NOTEBOOK --days N`): their own due date for one notebook.

nbgrader keeps extensions in its gradebook (a submission's `extension`, added to the assignment's due date),
and every lateness the grader writes comes from there: grades.csv, the penalties, the report, the feedback
pages and the exports. formgrader has no field for it, and nbgrader no command: this is the one. An
extension replaces the one before (nbgrader's rule: they do not add up); `--days 0` takes it back.

nbgrader keeps an extension on a submission, so one given before the student has handed anything in waits in
lateness.PENDING (beside the gradebook) and is given when their notebook is first graded (`give_pending`, run before the
tables are written).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from . import folder_lock
from .lateness import set_pending as _set_pending
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
                waiting = False
            except MissingEntry:  # nothing handed in yet: kept until their notebook is graded
                waiting = True
            if waiting:
                extended = due + timedelta(days=days, hours=hours) if (days or hours) else None
            else:
                gb.grant_extension(notebook, student, hours=hours, days=days)
                extended = gb.find_submission(notebook, student).duedate if (days or hours) else None
        # one given now replaces one that waited; one that waits makes their row 'not handed in yet' until then
        _set_pending(out, student, notebook, days * 24 + hours if waiting else 0)
        rewrite_outputs(course, out)
    return Extension(student, notebook, due, extended, pending=waiting)


def describe(done: Extension) -> str:
    """The console line for a granted (or taken back) extension."""
    if done.extended_to is None:
        return f"{done.student} {done.notebook}: no extension now (due {_when(done.due)}, as for everyone)"
    waits = ("; nothing of theirs is graded yet: it is given when their notebook is (until then their row says 'not "
             "handed in yet' before their own due date, 'missing' after it)" if done.pending else "")
    return (f"{done.student} {done.notebook}: due {_when(done.extended_to)} for them (the class's: {_when(done.due)}); "
            f"an extension given again replaces this one{waits}")


def _when(moment: datetime | None) -> str:
    return "never (no due date)" if moment is None else moment.strftime("%Y-%m-%d %H:%M UTC")
