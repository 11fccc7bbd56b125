"""Taking a student out of a graded class (`attn-course remove-student OUT ID ...`).

A student graded by mistake (the folder above the class folder graded as students `week1` and
`week1-late`, a test account, a student who left) stayed in every table and export: the gradebook is the
one truth, and nothing took anyone out of it. This takes them out of nbgrader's gradebook and moves
everything the grader kept of theirs (saved records, feedback pages, nbgrader's autograded and submitted
copies) into OUT/removed/<student>/<time>/, so nothing is lost, then rewrites the tables, the report and
the feedback pages. Without --yes it only says what it would do.
"""
from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import folder_lock
from .grade import read_roster_ids
from .lms import ExportError, grading_output, rewrite_outputs, settled_course


class RemovalError(ValueError):
    """A removal that cannot be done as asked: the message says why and what to give instead."""


@dataclass
class Removal:
    """What a removal moved (or would move, without --yes), per student, and where it went."""

    out: Path
    done: bool
    moved: dict[str, list[str]] = field(default_factory=dict)  # student -> the folders of theirs, relative to OUT
    kept_at: dict[str, Path] = field(default_factory=dict)  # student -> OUT/removed/<student>/<time>
    on_roster: list[str] = field(default_factory=list)  # removed, but the last roster names them: back as missing


def _their_folders(out: Path, student: str) -> list[Path]:
    """Everything the grader keeps of one student's, in OUT and its nbgrader course."""
    places = [out / "students", out / "feedback", out / "course" / "autograded", out / "course" / "submitted",
              out / "course" / "feedback"]
    return [p / student for p in places if (p / student).exists()]


def remove_students(out: Path, students: list[str], yes: bool = False) -> Removal:
    """Take `students` out of the class graded into `out` (see the module's docstring); RemovalError when one
    of them is not in its gradebook (with the closest id), or nothing was named."""
    from nbgrader.api import Gradebook

    if not students:
        raise RemovalError("name the students to remove: attn-course remove-student OUT ID [ID ...]")
    try:
        out = grading_output(out)
    except ExportError as err:
        raise RemovalError(str(err)) from None
    with folder_lock.held(out):
        course = settled_course(out)
        with Gradebook(course.db_url) as gb:
            known = sorted(s.id for s in gb.students)
        _refuse_unknown(students, known, out)
        removal = Removal(out, yes, {s: [str(p.relative_to(out)) for p in _their_folders(out, s)] for s in students})
        roster = read_roster_ids(course) or set()
        removal.on_roster = sorted(s for s in students if s in roster)
        if not yes:
            return removal
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        with Gradebook(course.db_url) as gb:
            for student in students:
                gb.remove_student(student)
        for student in students:
            removal.kept_at[student] = _keep(out, student, stamp)
        rewrite_outputs(course, out)
    return removal


def _refuse_unknown(students: list[str], known: list[str], out: Path) -> None:
    unknown = [s for s in students if s not in known]
    if unknown:
        hints = [f"{s!r}" + (f" (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(s, known, n=1))
                              else "") for s in unknown]
        raise RemovalError(f"not in the gradebook of {out}: {', '.join(hints)}; the students there: "
                           f"{', '.join(known[:20])}{' ...' if len(known) > 20 else ''}")


def _keep(out: Path, student: str, stamp: str) -> Path:
    """Move the student's folders under OUT/removed/<student>/<stamp>/, each at its path relative to OUT."""
    kept = out / "removed" / student / stamp
    for folder in _their_folders(out, student):
        target = kept / folder.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), str(target))
    kept.mkdir(parents=True, exist_ok=True)
    return kept
