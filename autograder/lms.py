"""A graded class in the layouts learning platforms import (`attn-course export OUT --to ...`).

The grades come from the gradebook of the grading output OUT, through `grade.write_outputs`: it
rewrites OUT's grades.csv, grades_wide.csv, report and feedback pages from the gradebook now, so a
grade or comment typed in formgrader since the last `attn-course grade` run is in the export and
in those files alike. A
notebook's points are its final score, max(score - late_penalty, 0), as in grades_wide.csv.

* canvas: Canvas's gradebook import CSV (what Canvas's own gradebook export looks like): the
  columns Student, ID, SIS User ID, SIS Login ID, Section, one column per notebook, and a
  "Points Possible" row. Canvas ties a row to a student by ID (the Canvas user id), then SIS
  User ID, SIS Login ID, then the name, and asks about rows it cannot tie. The user id is read
  from the Canvas file name the notebook was graded from (``<name>_<user id>_<submission
  id>_<file>``); with Canvas's gradebook export as a roster (`canvas_roster`), a student is
  found there by that user id, else by their student id as ID / SIS id / login, else by name,
  and the row gets the roster's columns and the assignment's header as Canvas wrote it
  (``01_similarity_attention (1234)``: that assignment; a plain name is matched to an assignment
  of that title or makes a new one, worth the Points Possible).
* gradescope: one Gradescope autograder ``results.json`` per graded notebook (score, tests with
  score / max_score / status / output), DEST/<student>/<notebook>/results.json.
* prairielearn: one PrairieLearn external grader ``results.json`` per graded notebook (gradable,
  score from 0 to 1, tests with points / max_points / message), same layout.
* moodle: Moodle's grade import CSV: Student ID, First name, Last name, Email address (from the
  roster given to `attn-course grade --roster`), one column per notebook; Moodle's import asks
  which column identifies the user (map "Email address" to email) and which grade item each
  column fills.

A notebook the grader itself failed on (grader incident, error) is never exported as a grade: its
cell is left empty and no JSON is written, and it is listed. A missing notebook scores 0 in the
CSVs, as in grades_wide.csv, and has no JSON (there is no submission). Every CSV cell goes through
`exports.safe_row`.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import tempfile
import threading
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from anyascii import anyascii

from .exports import safe_row
from .lateness import how_late
from .outcomes import GRADERS_OWN, Status
from .submissions import STUDENT_ID, flat_name

if TYPE_CHECKING:
    from .grade import Course, NotebookResult

FORMATS = ("canvas", "gradescope", "prairielearn", "moodle")
NOT_GRADABLE = (Status.UNREADABLE, Status.WRONG_NOTEBOOK)  # PrairieLearn's "invalid, not gradable"
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"  # the first cell of that row, as Canvas's export writes it
MOODLE_COLUMNS = ["Student ID", "First name", "Last name", "Email address"]
MESSAGE_CHARS = 4000  # of one message in a JSON result (PrairieLearn takes 1 MB a file)
GRADING_OUTPUT = "give the folder `attn-course grade SUBMISSIONS --out OUT` wrote (it holds gradebook.db and course/)"
CANVAS_EXPORT = "give Canvas's own gradebook export (Grades > Export > Export Entire Gradebook)"


class ExportError(ValueError):
    """Input an export cannot use: the message says what is wrong and what to give instead."""


@dataclass
class Exported:
    dest: Path  # the file or folder written
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # for the instructor to know
    problems: list[str] = field(default_factory=list)  # students not tied to a platform user, grades held back


# --------------------------------------------------------------------------- the class
def grading_output(out: Path) -> Path:
    """`out` checked to be a grading output (its course/ folder is taken for it); ExportError otherwise."""
    out = Path(out)
    if not out.is_dir():
        raise ExportError(f"{out} {'is not a folder' if out.exists() else 'does not exist'}: {GRADING_OUTPUT}")
    if out.name == "course" and (out.parent / "gradebook.db").is_file():
        out = out.parent
    missing = [name for name in ("gradebook.db", "course/source", "course/release") if not (out / name).exists()]
    if missing:
        raise ExportError(f"{out} is not a grading output (it has no {', '.join(missing)}): {GRADING_OUTPUT}")
    return out.resolve()


def class_grades(out: Path) -> tuple[list[NotebookResult], dict[str, dict[str, str]]]:
    """Every student x notebook in play, from the gradebook now (manual grades included), and each
    student's first_name, last_name and email as the gradebook knows them."""
    from nbgrader.api import Gradebook

    out = grading_output(out)
    course = settled_course(out)
    results = rewrite_outputs(course, out)
    with Gradebook(course.db_url) as gb:
        people = {s.id: {"first_name": s.first_name or "", "last_name": s.last_name or "", "email": s.email or ""}
                  for s in gb.students}
    return results, people


def settled_course(out: Path) -> "Course":
    """The grading course of the grading output `out`, its nbgrader settings pointed here first (a copied
    or moved folder: its own gradebook, never the old place's; said when they were), ready to write the
    gradebook (a changed late penalty, feedback pages again)."""
    from .grade import Course

    course = Course(out / "course")
    moved = course.settle()
    if moved:
        print(moved, flush=True)
    course.lock = threading.Lock()
    return course


def rewrite_outputs(course: "Course", out: Path) -> list[NotebookResult]:
    """grades.csv, grades_wide.csv, the report and the feedback pages from the gradebook now, for the
    notebooks of the last grade run."""
    from .grade import in_play, write_outputs

    return write_outputs(course, out, in_play(course, _last_run_notebooks(out)))


def _last_run_notebooks(out: Path) -> list[str]:
    """The notebooks of the last grade run (OUT/results.json): those asked for by name stay in play."""
    try:
        return sorted({r["notebook"] for r in json.loads((out / "results.json").read_text()) if isinstance(r["notebook"], str)})
    except (OSError, ValueError, TypeError, KeyError):
        return []


SCORE_DIGITS = 6  # a score in results.json: 13.6 / 17 is 0.8, not 0.7999999999999999 (float noise); 8.8 / 12 is 0.733333


def points(x: float) -> str:
    return f"{round(x, 2):g}"


def _table(results: list[NotebookResult]) -> tuple[list[str], dict[str, float], dict[str, dict[str, NotebookResult]]]:
    """(notebooks, {notebook: max score}, {student: {notebook: result}})."""
    notebooks = sorted({r.notebook for r in results})
    tops = {r.notebook: r.max_score for r in results}
    by_student: dict[str, dict[str, NotebookResult]] = {}
    for r in results:
        by_student.setdefault(r.student_id, {})[r.notebook] = r
    return notebooks, tops, by_student


def _cell(r: NotebookResult | None) -> str:
    """A notebook's points in a CSV: empty when held back, 0 when there is no result."""
    if r is None:
        return "0"
    return "" if r.held_back() else points(r.final_score())


def _held_back(results: list[NotebookResult]) -> list[str]:
    return [f"{r.student_id} {r.notebook}: not exported ({r.status_text}); grade it again, then export"
            for r in sorted(results, key=lambda r: (r.student_id, r.notebook)) if r.status in GRADERS_OWN]


def _write_csv(rows: list[list[str]], path: Path) -> None:
    """Atomically, every cell through safe_row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", newline="", encoding="utf-8", dir=path.parent, delete=False,
                                     suffix=".tmp") as fh:
        writer = csv.writer(fh)
        for row in rows:
            writer.writerow(safe_row(row))
    os.chmod(fh.name, 0o644)
    os.replace(fh.name, path)


# --------------------------------------------------------------------------- Canvas
@dataclass
class CanvasRoster:
    students: list[dict[str, str]]  # the student rows, by column name
    headers: dict[str, str]  # assignment title -> its column header in Canvas's export ('title (id)')


def read_canvas_roster(path: Path) -> CanvasRoster:
    """Canvas's gradebook export: its student rows and its assignments' headers; ExportError when it is not one."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise ExportError(f"--canvas-roster: {path} cannot be read ({err.strerror or err}): {CANVAS_EXPORT}") from None
    except UnicodeDecodeError:
        raise ExportError(f"--canvas-roster: {path} is not UTF-8 text: {CANVAS_EXPORT}") from None
    first = text.splitlines()[0] if text else ""
    rows = list(csv.reader(io.StringIO(text), delimiter=";" if first.count(";") > first.count(",") else ","))
    header = [c.strip() for c in rows[0]] if rows else []
    missing = [c for c in ("Student", "ID") if c not in header]
    if missing:
        raise ExportError(f"--canvas-roster: {path} is not a Canvas gradebook export: it has no {' and no '.join(missing)} "
                          f"column (found: {', '.join(header) or 'no header'}); {CANVAS_EXPORT}")
    students = []
    for row in rows[1:]:
        cells = dict(zip(header, (c.strip() for c in row), strict=False))  # short rows: missing cells
        if "Points Possible" not in cells.get("Student", "") and cells.get("ID", "").isdigit():
            students.append(cells)  # not the Points Possible row, nor the "Manual Posting" one
    headers = {}
    for h in header:
        m = re.fullmatch(r"(.*)\s\((\d+)\)", h)  # Canvas's 'title (id)', as its importer reads it
        if m:
            headers.setdefault(m.group(1), h)
    return CanvasRoster(students, headers)


def canvas_owner(source_file: str) -> tuple[str, str]:
    """(the name, the Canvas user id) in the name of the file a notebook was graded from (``smithjohn_345678_...``:
    ('smithjohn', '345678')); ('', '') when not a Canvas name. `source_file` is NotebookResult.source_file: '<path in
    the class folder> (<where its time came from>)'."""
    head, sep, _ = source_file.rpartition(" (")
    parts = PurePosixPath(head if sep else source_file).parts
    if not parts:
        return "", ""
    top = parts[0]
    suffix = next((s for s in (".ipynb", ".zip") if top.lower().endswith(s)), "")
    found = flat_name(top, {}, suffix=suffix)
    return (found.student, found.user) if found is not None and found.platform == "canvas" and found.user else ("", "")


def canvas_user_id(source_file: str) -> str:
    """The Canvas user id in the name of the file a notebook was graded from ('' when not a Canvas name)."""
    return canvas_owner(source_file)[1]


def _handed_in(results: list[NotebookResult]) -> bool:
    """Whether a student handed in anything here (a row of theirs is more than the 0s of missing notebooks)."""
    return any(r.status is not Status.MISSING for r in results)


def _name_key(name: str) -> str:
    """'Smith, Jane', 'smithjane', 'Smith Jane' -> 'smithjane' (how Canvas names its files)."""
    return re.sub(r"[^a-z0-9]", "", anyascii(unicodedata.normalize("NFC", name)).lower())


def _names_of(person: dict[str, str]) -> list[str]:
    """A gradebook student's names as Canvas may write them: 'Last, First' (its Student column), 'First Last'."""
    first, last = person.get("first_name", "").strip(), person.get("last_name", "").strip()
    return [n for n in (f"{last}, {first}", f"{first} {last}") if first and last] or [n for n in (last, first) if n]


def match_canvas(students: dict[str, list[NotebookResult]], roster: list[dict[str, str]],
                 people: dict[str, dict[str, str]] | None = None) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """({student: their roster row}, {student: why none}). A student is found by the Canvas user id
    of their files, else by their id, or the email the class roster gave them (`people`), as ID, SIS User ID or
    SIS Login ID, else by name (their id, or the names the gradebook has for them from the class roster); a row
    that fits two students, or two rows that fit one, tie nobody."""
    people = people or {}
    by_uid = {row["ID"]: row for row in roster}
    index = _roster_index(roster)
    found: dict[str, dict[str, str]] = {}
    why: dict[str, str] = {}
    by_file: set[str] = set()  # tied by the Canvas user id of their own files (no guess)
    for sid in sorted(students):
        uid = next((u for r in students[sid] if (u := canvas_user_id(r.source_file))), "")
        if uid:
            fits = {uid: by_uid[uid]} if uid in by_uid else {}
            if not fits:
                why[sid] = f"Canvas user {uid}, from the name of the file graded, is not in the roster"
                continue
            by_file.add(sid)
        else:
            fits = _roster_rows_fitting(sid, index, people)
            if len(fits) != 1:
                why[sid] = ("no roster row has this id or their email as ID, SIS User ID or SIS Login ID, nor this id or "
                            "their name as Student" if not fits else
                            f"several roster rows fit ({', '.join(sorted(fits))}): not guessed")
                continue
        [row] = fits.values()
        found[sid] = row
    claimed: dict[str, list[str]] = {}
    for sid, row in found.items():
        claimed.setdefault(row["ID"], []).append(sid)
    for uid, sids in claimed.items():
        if len(sids) > 1:
            owners = [sid for sid in sids if sid in by_file]
            if len(owners) == 1 and not any(_handed_in(students[sid]) for sid in sids if sid != owners[0]):
                # graded from a file of that very Canvas user; the others (fitting by id or name) handed in nothing:
                # the same person under another id (a roster of institutional ids for a Canvas download)
                sids = [sid for sid in sids if sid != owners[0]]
                for sid in sids:
                    del found[sid]
                    why[sid] = (f"the roster row of Canvas user {uid} fits them too, but {owners[0]} was graded from a "
                                f"Canvas file of that user")
                continue
            for sid in sids:
                del found[sid]
                why[sid] = f"the roster row of Canvas user {uid} fits {', '.join(sids)}: not guessed"
    return found, why


RosterIndex = tuple[dict[str, dict[str, dict[str, str]]], dict[str, dict[str, dict[str, str]]]]


def _roster_index(roster: list[dict[str, str]]) -> RosterIndex:
    """({ID, SIS User ID or SIS Login ID, lower case: {Canvas user id: row}}, {name key of Student: {...}})."""
    by_id: dict[str, dict[str, dict[str, str]]] = {}
    by_name: dict[str, dict[str, dict[str, str]]] = {}
    for row in roster:
        for column in ("ID", "SIS User ID", "SIS Login ID"):
            if row.get(column):
                by_id.setdefault(row[column].lower(), {})[row["ID"]] = row
        by_name.setdefault(_name_key(row.get("Student", "")), {})[row["ID"]] = row
    return by_id, by_name


def _roster_rows_fitting(sid: str, index: RosterIndex, people: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """{Canvas user id: roster row} of the rows that fit student `sid` without a Canvas file of theirs: their id or
    the email the class roster gave them as ID, SIS User ID or SIS Login ID, else their id as Student, else the names
    the gradebook has for them."""
    by_id, by_name = index
    email = people.get(sid, {}).get("email", "").strip().lower()
    fits = by_id.get(sid.lower()) or (by_id.get(email, {}) if email else {}) or by_name.get(_name_key(sid), {})
    for name in [] if fits else _names_of(people.get(sid, {})):
        fits = by_name.get(_name_key(name), {})
        if fits:
            break
    return fits


def canvas_csv(results: list[NotebookResult], path: Path, roster: CanvasRoster | None = None,
               people: dict[str, dict[str, str]] | None = None) -> Exported:
    """Canvas's gradebook import CSV at `path`; every student has a row (one not tied to a Canvas user
    has an empty ID, and Canvas asks about it on import) and is listed in `problems`, but for one who handed
    in nothing whose row Canvas would tie, by name, to a Canvas user that a student who did hand in has a row
    for (by the user id of their Canvas files) or fits (`_withheld`): that 0 could replace their grade, so it
    is not written, and is listed."""
    notebooks, tops, by_student = _table(results)
    people = people or {}
    found, why = match_canvas({s: list(nbs.values()) for s, nbs in by_student.items()}, roster.students, people) \
        if roster is not None else ({}, {})
    index = _roster_index(roster.students) if roster is not None else ({}, {})
    headers = [roster.headers.get(n, n) if roster is not None else n for n in notebooks]
    rows = [CANVAS_COLUMNS + headers, [POINTS_POSSIBLE, "", "", "", ""] + [points(tops[n]) for n in notebooks]]
    done = Exported(path, [path])
    owners = {sid: next((o for r in nbs.values() if (o := canvas_owner(r.source_file))[1]), ("", ""))
              for sid, nbs in by_student.items()}
    names = {}
    for sid in by_student:
        person = people.get(sid, {})
        names[sid] = ", ".join(p for p in (person.get("last_name"), person.get("first_name")) if p) or sid
    claims = _graded_claims(by_student, found, owners, index, people)
    for sid in sorted(by_student):
        row = found.get(sid)
        if row is not None:
            who = [row.get(c, "") for c in CANVAS_COLUMNS]
        else:
            uid, name = owners[sid][1], names[sid]
            withheld = "" if uid or _handed_in(list(by_student[sid].values())) else \
                _withheld(sid, name, claims, index, people, roster)
            if withheld:
                done.problems.append(withheld)
                continue
            who = [name, uid, "", "", ""]
            if roster is not None:
                done.problems.append(f"{sid}: not tied to a row of the Canvas roster ({why[sid]}); Canvas matches its "
                                     f"row by {f'user id {uid}' if uid else f'the name {name!r}'} or asks whom it is for")
            elif not uid:
                done.problems.append(f"{sid}: no Canvas user id (not graded from a Canvas file name); Canvas matches "
                                     f"the row by the name {name!r} or asks: give --canvas-roster to tie it")
        rows.append(who + [_cell(by_student[sid].get(n)) for n in notebooks])
    _write_csv(rows, path)
    if roster is not None:
        reached: set[str] = set()  # the Canvas users a row of the file goes to: by its ID, else by its name
        for row in rows[2:]:
            reached |= {row[1]} if row[1] else set(index[1].get(_name_key(row[0]), {}))
        absent = sorted(row.get("Student", row["ID"]) for row in roster.students if row["ID"] not in reached)
        if absent:
            done.notes.append(f"{len(absent)} roster student(s) have no row in this file (none has their Canvas user "
                              f"id or their name), so Canvas leaves their grades as they are, unless you tie to them "
                              f"a row it asks about: {'; '.join(absent)}")
        new = [n for n in notebooks if n not in roster.headers]
        if new:
            done.notes.append(f"not among the roster's assignments (Canvas fills an assignment of that title or makes "
                              f"a new one): {', '.join(new)}")
    done.problems += _held_back(results)
    return done


def _graded_claims(by_student: dict[str, dict[str, NotebookResult]], found: dict[str, dict[str, str]],
                   owners: dict[str, tuple[str, str]], index: RosterIndex,
                   people: dict[str, dict[str, str]]) -> dict[str, tuple[str, str]]:
    """{Canvas user id: (a student who handed in something, how they claim that user)}: by the row tied to them,
    by the user id of their Canvas files; and, for one tied to no row and graded from no Canvas file, by the roster
    rows that fit them (not guessed, but theirs perhaps). `index` is empty without a Canvas roster, where a Canvas
    file's name part ('smithjohn') stands for its user's name too (`_name_key`: 'Smith, John')."""
    claims: dict[str, tuple[str, str]] = {}
    for sid in sorted(by_student):
        if not _handed_in(list(by_student[sid].values())):
            continue
        file_name, uid = owners[sid]
        if sid in found:
            claims.setdefault(found[sid]["ID"], (sid, "tied to that user"))
        elif uid:
            claims.setdefault(uid, (sid, "graded from a Canvas file of that user"))
        else:
            for fit in _roster_rows_fitting(sid, index, people):
                claims.setdefault(fit, (sid, "not tied, but that user's roster row fits them too"))
        if file_name and uid:
            claims.setdefault("name:" + _name_key(file_name), (sid, f"graded from a Canvas file of user {uid}, named "
                                                                    f"{file_name!r}"))
    return claims


def _withheld(sid: str, name: str, claims: dict[str, tuple[str, str]], index: RosterIndex,
              people: dict[str, dict[str, str]], roster: CanvasRoster | None) -> str:
    """The problems line for a student who handed in nothing whose 0 row is not written, or '' to write it: the row
    (named `name`, no ID) goes by name to a Canvas user some student who handed in something claims (`claims`)."""
    reached = set(index[1].get(_name_key(name), {})) | set(_roster_rows_fitting(sid, index, people))
    taken = [(uid, claims[uid]) for uid in sorted(reached) if uid in claims]
    if not taken and "name:" + _name_key(name) in claims:
        taken = [("", claims["name:" + _name_key(name)])]
    if not taken:
        return ""
    uid, (other, how) = taken[0]
    student = next((r.get("Student", "") for r in (roster.students if roster else []) if r["ID"] == uid), "")
    user = f"Canvas user {uid}{f' ({student})' if student else ''}" if uid else "the Canvas user of that name"
    advice = (f"their ids differ only in case: if this is one student, rename the folder or file to {sid} (or correct "
              f"the roster's id) and grade again" if sid.casefold() == other.casefold() else
              f"if {sid} and {other} are one student under two ids (a roster of other ids than the Canvas files' "
              f"names), grade the Canvas download without --roster and export with --canvas-roster, or give the "
              f"roster their id as the files name them")
    return (f"{sid}: no row written (they handed in nothing here, a 0): Canvas would give a row named {name!r} to "
            f"{user}, whose grade is {other}'s ({how}); that 0 could replace it. {advice[0].upper()}{advice[1:]}")


# --------------------------------------------------------------------------- Gradescope, PrairieLearn
def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + " [...]"


def _summary(r: NotebookResult, comments: Comments = ()) -> str:
    lines = [f"{r.notebook}: {r.final_score():g} / {r.max_score:g}"]
    if r.status is not Status.OK:
        lines.append(r.status_text)
    if r.late_penalty:
        lines.append(f"{how_late(r.seconds_late)} (due {r.due}): {r.late_penalty:g} points taken")
    if comments:
        lines.append("Comments from your instructor:")
        lines += [f"  {cell}: {text}" for cell, text in comments]
    return _clip("\n".join(lines))


Comments = tuple[tuple[str, str], ...]  # (answer cell, comment typed in formgrader) for one notebook


def class_comments(out: Path) -> dict[tuple[str, str], Comments]:
    """(student, notebook) -> the comments typed in formgrader on that notebook's answer cells (the HTML feedback
    pages show them; Gradescope's and PrairieLearn's results carry them in their message)."""
    from nbgrader.api import Gradebook

    found: dict[tuple[str, str], list[tuple[str, str]]] = {}
    with Gradebook(settled_course(grading_output(out)).db_url) as gb:
        for assignment in gb.assignments:
            for submission in assignment.submissions:
                for notebook in submission.notebooks:
                    for comment in notebook.comments:
                        text = (comment.manual_comment or "").strip()
                        if text:
                            found.setdefault((submission.student.id, notebook.name), []).append((comment.name, text))
    return {key: tuple(sorted(pairs)) for key, pairs in found.items()}


def _late(r: NotebookResult) -> str:
    return f"{how_late(r.seconds_late) or 'late'} (due {r.due}): the late policy takes {r.late_penalty:g} points"


EXTRA_CREDIT = "extra credit given by the instructor, on top of the test's points"
JSON_RESULTS_NEXT = ("these are the files {platform}'s own autograder writes ({path}), one per student and notebook: "
                     "{platform} has no upload for a folder of them. Hand each one back from an autograder that copies "
                     "the submitter's file there, or import the final scores of grades_wide.csv with {platform}'s own "
                     "score import")


def gradescope_result(r: NotebookResult, comments: Comments = ()) -> dict:
    """Gradescope's autograder results.json for one graded notebook: the top-level score (the final
    one) overrides the sum of the tests, which show each test cell and the late penalty."""
    tests = [{"name": c.grade_id, "score": c.earned(), "max_score": c.max_score,
              "status": "passed" if c.earned() >= c.max_score else "failed", "output": _clip(c.message),
              "tags": [c.exercise]} for c in r.cells]
    tests += [{"name": f"{c.grade_id}: extra credit", "score": c.extra_credit, "max_score": 0.0,
               "output": EXTRA_CREDIT, "tags": [c.exercise]} for c in r.cells if c.extra_credit]
    if r.late_penalty:
        tests.append({"name": "late penalty", "score": -r.late_penalty, "max_score": 0.0, "output": _late(r)})
    return {"score": round(r.final_score(), SCORE_DIGITS), "output": _summary(r, comments), "output_format": "text", "test_output_format": "text",
            "test_name_format": "text", "tests": tests,
            "extra_data": {"student_id": r.student_id, "notebook": r.notebook, "max_score": r.max_score,
                           "late_penalty": r.late_penalty, "status": r.status.value}}


def prairielearn_result(r: NotebookResult, comments: Comments = ()) -> dict:
    """PrairieLearn's external grader results.json for one graded notebook: score from 0 to 1 (the
    final score over the notebook's points); an unreadable or wrong notebook is not gradable."""
    if r.status in NOT_GRADABLE:
        return {"gradable": False, "format_errors": [_clip(r.status_text)], "message": _summary(r, comments)}
    tests = [{"name": c.grade_id, "description": f"exercise {c.exercise}", "points": c.earned(),
              "max_points": c.max_score, "message": _clip(c.message)} for c in r.cells]
    tests += [{"name": f"{c.grade_id}: extra credit", "description": f"exercise {c.exercise}", "points": c.extra_credit,
               "max_points": 0.0, "message": EXTRA_CREDIT} for c in r.cells if c.extra_credit]
    if r.late_penalty:
        tests.append({"name": "late penalty", "description": "the class's late policy", "points": -r.late_penalty,
                      "max_points": 0.0, "message": _late(r)})
    score = min(max(r.final_score() / r.max_score, 0.0), 1.0) if r.max_score > 0 else 0.0
    return {"gradable": True, "score": round(score, SCORE_DIGITS), "message": _summary(r, comments), "tests": tests}


def json_results(results: list[NotebookResult], dest: Path, make,
                 comments: dict[tuple[str, str], Comments] | None = None) -> Exported:
    """make(result, its comments) as DEST/<student>/<notebook>/results.json for every graded notebook; a missing one
    has none, a held-back one none (an earlier export's file is removed), each listed."""
    comments = comments or {}
    done = Exported(dest)
    missing: list[str] = []
    for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
        if not STUDENT_ID.match(r.student_id):
            refused = f"{r.student_id!r}: not written, the student id cannot name a folder"
            done.problems += [] if refused in done.problems else [refused]
            continue
        target = dest / r.student_id / r.notebook / "results.json"
        if r.status is Status.MISSING or r.status in GRADERS_OWN:
            missing.extend([f"{r.student_id} {r.notebook}"] if r.status is Status.MISSING else [])
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(make(r, comments.get((r.student_id, r.notebook), ())), indent=1),  # ASCII: a
                       encoding="utf-8")  # student's message's C1 controls and bidi overrides as escapes, never raw
        os.replace(tmp, target)
        done.written.append(target)
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        done.notes.append(f"{len(missing)} notebook{'s' if len(missing) != 1 else ''} not submitted, no results.json "
                          f"for them: {shown}")
    if make is prairielearn_result:
        done.notes += _prairielearn_differences(results)
    done.problems += _held_back(results) + _same_but_for_case(results)
    return done


def _same_but_for_case(results: list[NotebookResult]) -> list[str]:
    """Student ids that differ only in case ('alice' and 'Alice'): two students here, two folders of results.json
    in the export, but one folder on a disk that ignores case (macOS's, a Windows share), where one student's
    files would overwrite the other's."""
    by_folded: dict[str, set[str]] = {}
    for r in results:
        by_folded.setdefault(r.student_id.casefold(), set()).add(r.student_id)
    return [f"{' and '.join(sorted(ids))}: student ids that differ only in case, whose folders are one on a disk that "
            f"ignores case (macOS, Windows): upload from this machine, or rename one student's folder and grade again"
            for ids in by_folded.values() if len(ids) > 1]


def _prairielearn_differences(results: list[NotebookResult]) -> list[str]:
    """Where PrairieLearn's results say something the other exports do not (a walkthrough found both unsaid): a
    score is a fraction from 0 to 1, so extra credit above a notebook's points is capped; an unreadable or wrong
    notebook is 'not gradable', with no score, where the others write a 0."""
    said = []
    capped = [f"{r.student_id} {r.notebook} ({r.final_score():g} / {r.max_score:g})" for r in results
              if r.status not in NOT_GRADABLE and r.max_score > 0 and r.final_score() > r.max_score]
    if capped:
        said.append(f"extra credit capped at the notebook's points (PrairieLearn's score goes from 0 to 1; the other "
                    f"exports keep it): {', '.join(capped)}")
    invalid = [f"{r.student_id} {r.notebook}" for r in results if r.status in NOT_GRADABLE]
    if invalid:
        said.append(f"not gradable in PrairieLearn, with no score (the file is no notebook of this course; the other "
                    f"exports write 0): {', '.join(invalid)}")
    return said


# --------------------------------------------------------------------------- Moodle
def moodle_csv(results: list[NotebookResult], path: Path, people: dict[str, dict[str, str]] | None = None) -> Exported:
    """Moodle's grade import CSV at `path`: one row per student, the email address to map users by."""
    notebooks, _, by_student = _table(results)
    people = people or {}
    rows = [MOODLE_COLUMNS + notebooks]
    done = Exported(path, [path])
    shared: dict[str, str] = {}  # email (case folded) -> the first student with it
    for sid in sorted(by_student):
        person = people.get(sid, {})
        email = (person.get("email") or "").casefold()
        if email and email in shared:  # Moodle maps users by email: both rows would go to one account
            done.problems.append(f"{sid}: the same email as {shared[email]} ({person.get('email')}): Moodle would give "
                                 f"both grades to one account; give each student their own in the roster")
        shared.setdefault(email, sid)
        if not person.get("email"):
            done.problems.append(f"{sid}: no email address in the gradebook; map Moodle users by 'Student ID' if "
                                 "the ids are Moodle usernames or ID numbers, or give `attn-course grade` a --roster "
                                 "with an email column")
        rows.append([sid, person.get("first_name", ""), person.get("last_name", ""), person.get("email", "")]
                    + [_cell(by_student[sid].get(n)) for n in notebooks])
    _write_csv(rows, path)
    done.notes.append("on import, map 'Email address' to the users' email and each notebook column to its grade "
                      "item (made beforehand with the notebook's points as its maximum)")
    above = [f"{r.student_id} {r.notebook} ({r.final_score():g} / {r.max_score:g})" for r in results
             if not r.held_back() and r.max_score > 0 and r.final_score() > r.max_score]
    if above:  # Moodle refuses (or caps) a grade over its item's maximum unless the site allows unlimited grades
        done.notes.append("above the notebook's points with extra credit, which Moodle refuses or caps at the grade "
                          "item's maximum unless the site allows unlimited grades (Grades settings: 'Unlimited "
                          "grades'): give those items a higher maximum, or allow unlimited grades, before importing: "
                          + ", ".join(above))
    done.problems += _held_back(results)
    return done


# --------------------------------------------------------------------------- the command
def default_dest(out: Path, to: str) -> Path:
    return out / "lms" / (f"{to}.csv" if to in ("canvas", "moodle") else to)


WRITTEN_UNDER_THE_ID = {  # what each format writes for a student graded who is not on the roster
    "canvas": ("their grades are written in a row of the CSV (with the Canvas user id of their file, if any; a line "
               "above says so if it is tied to no row of the Canvas roster)"),
    "moodle": "their row of the CSV is written under this id (Moodle ties it by its email address, if the gradebook has one)",
    "gradescope": "their results.json files are written under this id",
    "prairielearn": "their results.json files are written under this id",
}


def _not_on_the_roster(out: Path, results: list, to: str = "gradescope") -> list[str]:
    """The problems line for each student graded who is not on the class's last roster (none without one), saying
    what format `to` writes for them, and the roster id theirs differs from only in case, if one does."""
    from .grade import Course, differ_in_case, read_roster_ids

    roster = read_roster_ids(Course(out / "course"))
    strangers = sorted({r.student_id for r in results if r.status is not Status.MISSING} - (roster or set()))
    twins = differ_in_case(strangers, roster)
    return [f"{sid}: not on the class roster (graded all the same): {WRITTEN_UNDER_THE_ID[to]}; "
            + (f"the roster has {twins[sid]}, which differs from it only in case (ids are exact: rename the folder "
               f"or file, or correct the roster's id, and grade again); " if sid in twins else "")
            + "check whose folder or file this is before handing them on" for sid in strangers] if roster else []


def _made_with_other_tests(out: Path, results: list) -> list[str]:
    """The problems line for each exported grade made with earlier hidden tests or grader code (graded_by_other_tests)."""
    from .grade import graded_by_other_tests

    return [f"{line}: graded with earlier hidden tests or grader code (a solution or the grader changed since); grade "
            "the folder that holds this file again, then export again" for line in
            graded_by_other_tests(out, sorted({r.notebook for r in results}))]


def export(out: Path, to: str, dest: Path | None = None, canvas_roster: Path | None = None) -> Exported:
    """The class graded into `out`, in the layout of `to` (FORMATS), at `dest` (default OUT/lms/...)."""
    if to not in FORMATS:
        raise ExportError(f"--to {to!r}: not a format this exports; give one of {', '.join(FORMATS)}")
    if canvas_roster is not None and to != "canvas":
        raise ExportError(f"--canvas-roster is for --to canvas only (not {to}): leave it out")
    roster = read_canvas_roster(canvas_roster) if canvas_roster is not None else None
    out = grading_output(out)
    dest = Path(dest) if dest is not None else default_dest(out, to)
    csv_file = to in ("canvas", "moodle")
    if csv_file and dest.is_dir():
        dest = dest / f"{to}.csv"
    elif not csv_file and dest.exists() and not dest.is_dir():
        raise ExportError(f"--dest {dest}: a file; {to} writes a folder of results.json files: give a folder")
    from . import folder_lock

    with folder_lock.held(out):  # export writes the tables, the report and feedback pages too: never beside a `grade`
        results, people = class_grades(out)
        comments = class_comments(out) if not csv_file else {}
    if not results:
        raise ExportError(f"{out}: the gradebook has no student and no notebook in play yet: grade the class first")
    if to == "canvas":
        done = canvas_csv(results, dest, roster, people)
    elif to == "moodle":
        done = moodle_csv(results, dest, people)
    else:
        done = json_results(results, dest, gradescope_result if to == "gradescope" else prairielearn_result, comments)
    done.problems += _not_on_the_roster(out, results, to)  # Canvas and Moodle tie students to users: these rows, by id
    done.problems += _made_with_other_tests(out, results)
    if to in ("canvas", "moodle"):
        return done
    done.notes.append(JSON_RESULTS_NEXT.format(platform="Gradescope" if to == "gradescope" else "PrairieLearn",
                                               path="/autograder/results/results.json" if to == "gradescope" else
                                               "/grade/results/results.json"))
    if comments:
        done.notes.append(f"the comments typed in formgrader are in each file's {'output' if to == 'gradescope' else 'message'} "
                          f"({sum(map(len, comments.values()))} on {len(comments)} notebooks), as on the feedback pages")
    return done
