"""Collect a class's submissions, whatever shapes they arrive in, all from one class folder.

Every layout below is read, together, from the class folder (the folder passed to ``collect``):
* one folder per student: ``<student_id>/**/*.ipynb`` (any depth below it; an empty folder is a
  student who submitted nothing);
* one zip per student: ``<student_id>.zip`` holding the notebooks (any depth);
* nbgrader's tree: ``submitted/<student_id>/<assignment>/<notebook>.ipynb`` with the
  ``timestamp.txt`` nbgrader's exchange wrote in the assignment folder (the ``submitted`` folder
  inside the class folder, or the class folder itself being such a tree, a folder named
  ``submitted``: then each student is a student folder, as above);
* files at the top of the class folder named as learning platforms export them (see
  ``flat_name``): Canvas ``smithjane_123456_7890_<file>.ipynb`` (``smithjane_LATE_123456_7890_...``),
  Moodle ``Jane Smith_12345_assignsubmission_file_<file>.ipynb`` (also as a folder),
  Blackboard ``<assignment>_<user>_attempt_2026-11-20-14-03-11_<file>.ipynb``, and a plain
  ``<student_id>_<assignment>.ipynb`` / ``<student_id>-<assignment>.ipynb`` where the assignment
  part is a known assignment's name. Zips named in any of these ways hold that student's notebooks.
  (A zip holding several platform users' files, the platform's download of the whole class left
  zipped, is not read as one student's: it is reported, to be unzipped into the class folder.)

Student ids: a name that is not already a plain id is written in ASCII letters (``Иван Петров/`` ->
``Ivan_Petrov``, ``王小明`` -> ``WangXiaoMing``, ``Ørsted`` -> ``Orsted``). Within one layout every folder,
zip or platform user is a student of its own (ids that collide after clean-up get a suffix,
reported); the same name from two layouts (``alice/``, ``submitted/alice/`` and
``alice_01_similarity_attention.ipynb``) is one student, merged, but two different names that
clean up to the same id are never merged, whatever their layouts (``Ørsted/`` and
``submitted/Orsted/``: ``Orsted`` and ``Orsted-2``, both told).

Owner and submission time come only from what the platform wrote, never from what the student
put in a name or a file:
* the owner of a platform's file is read from the fixed prefix the platform writes (leftmost: the
  part after it is the name the student gave their file, and a second owner block in that part is
  named in both students' ``problems``, never obeyed);
* the submission time is nbgrader's ``timestamp.txt`` where nbgrader's exchange wrote it
  (``submitted/<student>/<assignment>/timestamp.txt``, for the notebooks under that assignment
  folder), else the modification time of the file in the class folder: the notebook, or the zip
  holding it. A ``timestamp.txt`` anywhere else (a student's own folder, a platform's folder of the
  student's files, inside a zip) and the dates of a zip's entries are the student's: named in their
  ``problems`` when they would have told a different story, never used as a time;
* Canvas's ``_LATE_`` is lateness: the notebook graded from such an upload has a ``late`` mark (and
  a note); given the due dates (``collect_all(..., due=...)``), its recorded time is never on time.

Each notebook is matched to an assignment by its file name, tolerating the renames that
browsers and students make (``01_similarity_attention (1).ipynb``, ``Copy of ...``), then by
its leading number, then by the graded cells it contains. When a student has several versions of
one assignment (``draft/`` and ``final/``, two zips, a folder and a flat file), the newest is
graded and both are named in the student's ``problems`` (versions of the same time: the last in
name order; several from one zip: the one dated last inside it, which decides only among that
zip's own files).

Nothing is skipped silently: ``collect_all`` returns every file it did not grade (not a notebook,
checkpoints, ``__MACOSX``, hidden, unmatched, refused, older versions) with the reason.
A notebook handed in only in another format (Jupyter's HTML, PDF or .py export of it) is named in
its student's ``problems``, so their "missing" row says what came in and what to ask for.

Everything here is untrusted and bounded: a file past a limit below is reported in the
student's ``problems`` and skipped, the rest of the class is collected as usual, and
``collect`` raises for nothing a student can put in a file or a zip.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import stat
import struct
import unicodedata
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Callable

from anyascii import anyascii

from .limits import ZIP_TAIL_BYTES, json_depth, overlapping_members, zip_directory_problem

# ---- one notebook (real course notebooks: < 1 MiB, < 10 levels deep, < 150 cells)
MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024  # a notebook file, or a zip member's inflated size
MAX_JSON_DEPTH = 100  # nesting of JSON arrays/objects; json.loads recurses once per level
MAX_CELLS = 2_000  # cells in one notebook; nbgrader spends ~6 ms per cell, 100,000 take 10 min
MAX_SOURCE_CHARS = 2_000_000  # characters of cell source in one notebook, all cells together
# ---- one student (a folder, a zip, or one platform user's files at the top of the class folder)
MAX_STUDENT_FILES = 500  # members of a student's zip, or .ipynb files in a student's folder
MAX_STUDENT_BYTES = 200 * 1024 * 1024  # notebook bytes read for one student, zip or folder
MAX_COMPRESSION_RATIO = 200  # inflated / compressed size of a zip member; notebooks reach ~10
MAX_FOLDER_ENTRIES = 20 * MAX_STUDENT_FILES  # files and folders looked at in one student's folder
MAX_LISTED = 100  # ignored files listed one by one per student folder or zip; the rest are counted
MAX_TIMESTAMP_BYTES = 1024  # nbgrader's timestamp.txt holds ~30
SAME_TIME = timedelta(seconds=2)  # versions this close count as saved together (zip dates: 2 s steps)
ZONE_SLACK = timedelta(hours=14)  # a zip entry's date is the zipping machine's local time, in any zone
AFTER_DUE = timedelta(seconds=1)  # a late upload whose own time is not after its due date: recorded this late

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
TIMESTAMP_FILE = "timestamp.txt"  # nbgrader's record of the submission time, beside the notebooks
SECRET_FILE = "submission_secret.txt"  # nbgrader's submit writes it: release_feedback names the feedback with it
_SECRET = re.compile(r"[0-9a-f]{16,256}")  # nbgrader's is 128 hex digits (secrets.token_hex(64))
_NBGRADER_FOLDERS = ("source", "release", "autograded", "feedback")  # beside submitted/: not students
_SKIPPED_NAMES = ("__MACOSX", ".ipynb_checkpoints")
_MACOSX = "macOS metadata (made by the Finder's Compress), not a submission"
_CHECKPOINTS = "Jupyter's autosave checkpoints, not the saved notebook"


@dataclass
class StudentSubmission:
    student_id: str
    notebooks: dict[str, bytes] = field(default_factory=dict)  # assignment -> notebook bytes
    problems: dict[str, str] = field(default_factory=dict)  # assignment or file -> what went wrong
    timestamps: dict[str, datetime] = field(default_factory=dict)  # assignment -> submitted (aware, UTC)
    origins: dict[str, str] = field(default_factory=dict)  # assignment -> "path in class folder (time source)"
    late: dict[str, str] = field(default_factory=dict)  # assignment -> why the platform says it is late
    secrets: dict[str, str] = field(default_factory=dict)  # assignment -> nbgrader's submission secret, when it had one
    # path in the class folder -> why the grader could not read it (permissions, I/O): the grader's problem,
    # never the student's "nothing handed in"
    unread: dict[str, str] = field(default_factory=dict)
    # assignment -> {sha256 of a version's bytes: its time (ISO, UTC)}, for every version found (graded or not):
    # kept in the grade's record, so a copy of the folder (every file dated today) is timed by what was seen
    hand_ins: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class Intake:
    students: list[StudentSubmission]
    ignored: list[tuple[str, str]]  # (path relative to the class folder, why it was not graded)
# --------------------------------------------------------------------------- one notebook
def parse_notebook(data: bytes) -> tuple[dict | None, str | None]:
    """(notebook, None) or (None, why it cannot be graded), never raising, whatever `data` is.

    Cheap checks first (size, encoding, nesting) so that json.loads only ever sees a bounded
    document. Lenient otherwise: any JSON object with a list of cells is a notebook."""
    notebook, problem, _ = _parse(data)
    return notebook, problem


def _parse(data: bytes) -> tuple[dict | None, str | None, bool]:
    """parse_notebook, plus whether the problem is a broken limit (refused before grading) rather
    than an unreadable file (left for the grader to report as 'unreadable notebook')."""
    if len(data) > MAX_NOTEBOOK_BYTES:
        return None, _too_large(len(data)), True
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (some Windows editors write one) is no problem
    except UnicodeDecodeError:
        return None, "not UTF-8 text (is it really a .ipynb?)", False
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        return None, (f"the notebook nests JSON {depth:,} levels deep (limit {MAX_JSON_DEPTH}): "
                      "is it really a notebook?"), True
    try:
        notebook = json.loads(text)
    except (ValueError, RecursionError) as err:
        return None, f"not valid JSON ({str(err)[:120]})", False
    if _SURROGATE_ESCAPE.search(text):  # a lone surrogate (\ud800) no UTF-8 file can hold: U+FFFD instead
        notebook = _encodable(notebook)
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        return None, "JSON, but not a notebook (no list of cells)", False
    problem = _cells_problem(notebook["cells"])
    return (None, problem, True) if problem else (notebook, None, False)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _encodable(value):
    """A parsed notebook with every string made writable as UTF-8 (outcomes.encodable); bounded by the
    depth check made before parsing."""
    from .outcomes import encodable

    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        return {encodable(k): _encodable(v) for k, v in value.items()}
    return value


def _cells_problem(cells: list) -> str | None:
    """Why a notebook has more cells, or more source, than any course notebook could, or None."""
    if len(cells) > MAX_CELLS:
        return (f"the notebook has {len(cells):,} cells (limit {MAX_CELLS:,}): "
                "submit the course notebook, not a generated one")
    chars = sum(_source_chars(c) for c in cells)
    if chars > MAX_SOURCE_CHARS:
        return (f"the notebook's cells hold {chars:,} characters of source (limit {MAX_SOURCE_CHARS:,}): "
                "submit the course notebook, not a generated one")
    return None


def _source_chars(cell) -> int:
    """Characters of a cell's source, whether a string or a list of strings (nbformat allows both)."""
    source = cell.get("source") if isinstance(cell, dict) else None
    if isinstance(source, str):
        return len(source)
    if isinstance(source, list):
        return sum(len(s) for s in source if isinstance(s, str))
    return 0


TOO_LARGE = "the file is "  # how the reason for a notebook too large to read starts


def _too_large(size: int) -> str:
    return (f"{TOO_LARGE}{_mib(size)} (limit {_mib(MAX_NOTEBOOK_BYTES)}): clear the cell outputs "
            "(Kernel > Restart & Clear Output), save and submit again")


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def _clean_name(name: str) -> str:
    stem = PurePosixPath(name).name
    stem = re.sub(r"\.ipynb$", "", stem, flags=re.I)
    stem = re.sub(r"^(copy of\s+)+", "", stem, flags=re.I)
    stem = re.sub(r"(\s*\(\d+\)|[-_ ]copy\d*|-checkpoint)$", "", stem, flags=re.I)
    return stem.strip().lower().replace(" ", "_").replace("-", "_")


def _ids_in(notebook: dict) -> set[str]:
    ids = set()
    for cell in notebook["cells"]:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if isinstance(grade_id, str) and grade_id:
            ids.add(grade_id)
    return ids


_DEFINED = re.compile(r"^(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)", re.MULTILINE)


def _names_in(notebook: dict) -> set[str]:
    """What tells a notebook's assignment: its cells' grade ids and the functions and classes its code cells
    define at their top level (the answer cells' grade ids are the graded names). The second is what is left
    of a notebook whose cell metadata a tool dropped, or whose code was pasted into a new one."""
    names = _ids_in(notebook)
    for cell in notebook["cells"]:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source")
            source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else source
            if isinstance(source, str):
                names.update(_DEFINED.findall(source))
    return names


def match_assignment(name: str, data: bytes, assignments: dict[str, set[str]]) -> str | None:
    """The assignment a notebook file belongs to, or None."""
    def names() -> set[str]:
        notebook, _ = parse_notebook(data)
        return _names_in(notebook) if notebook else set()
    return _match(name, names, assignments)


def _match(name: str, grade_ids, assignments: dict[str, set[str]]) -> str | None:
    """match_assignment, with the grade ids computed only when the name does not decide."""
    clean = _clean_name(name)
    if clean in assignments:
        return clean
    number = re.match(r"^(\d+)", clean)
    if number:
        hits = [a for a in assignments if re.match(rf"^0*{int(number.group(1))}_", a)]
        if len(hits) == 1:
            return hits[0]
    ids = grade_ids()
    best = max(assignments, key=lambda a: len(ids & assignments[a]), default=None)
    if best and len(ids & assignments[best]) >= 2:
        return best
    return None


_EXPORTS = {".html": "an HTML export", ".htm": "an HTML export", ".pdf": "a PDF export", ".py": "a Python script export",
            ".md": "a Markdown export", ".txt": "a text copy", ".json": "a JSON copy", ".tex": "a LaTeX export",
            ".rst": "a reStructuredText export", ".docx": "a Word copy"}


def _export_suffix(name: str) -> str | None:
    lower = name.lower()
    return next((s for s in _EXPORTS if lower.endswith(s)), None)


def export_of(name: str, assignments: dict[str, set[str]]) -> tuple[str, str] | None:
    """(assignment, why) when `name` is a copy of an assignment's notebook in another format (what
    Jupyter's File > Save and Export as writes: ``01_similarity_attention.html``, ``.py``, ``.pdf``;
    ``... .ipynb.txt`` from a browser): nothing in it can be graded, and the student who handed in only
    that has handed in no notebook, which their row says."""
    suffix = _export_suffix(name)
    if suffix is None:
        return None
    stem = name[:-len(suffix)]
    a = _match(stem if stem.lower().endswith(".ipynb") else stem + ".ipynb", set, assignments)
    if a is None:
        return None
    return a, (f"{_EXPORTS[suffix]} of {a}, not the notebook: nothing in it can be graded; ask the student for "
               f"the .ipynb file")


# --------------------------------------------------------------------------- submission times
def _open_to_others(paths: list[Path]) -> str | None:
    """Why files of nbgrader's submitted/ tree (a timestamp.txt, a notebook, their folders up to submitted/) are
    not the collecting instructor's record: one that others may write (`nbgrader submit` leaves its folders so,
    and nbgrader's own collect copied that: any student could rewrite a classmate's notebook or timestamp.txt),
    or a file owned by someone else than the grader, root or the owner of submitted/. None when all are fine."""
    try:
        trusted = {os.geteuid(), 0, os.lstat(paths[-1]).st_uid}
    except OSError:
        return None  # read as usual: what cannot be read is said there
    for path in paths:
        try:
            info = os.lstat(path)
        except OSError:
            continue  # a timestamp.txt that is not there
        if info.st_mode & stat.S_IWOTH and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX):
            return f"{path.name} can be written by every user (mode {stat.S_IMODE(info.st_mode):04o})"
        if not stat.S_ISDIR(info.st_mode) and info.st_uid not in trusted:
            return f"{path.name} belongs to {_user_name(info.st_uid)}, not to whoever collected the submissions"
    return None


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def parse_timestamp(raw: bytes | str) -> datetime | None:
    """The time in nbgrader's timestamp.txt ('2026-11-20 14:03:11.123456 UTC'), aware and in UTC,
    or None for anything unreadable. A time without a zone is read as UTC, as nbgrader does."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_TIMESTAMP_BYTES:
            return None
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    text = raw.strip().lstrip("\ufeff")
    if not text or len(text) > 100:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # dateutil warns about zone names it does not know
            when = _timestamp_parser()(text)
    except Exception:  # noqa: BLE001 - whatever the parser raises, the file is unreadable
        return None
    if not isinstance(when, datetime):
        return None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


@functools.lru_cache(maxsize=1)
def _timestamp_parser():
    """nbgrader's own parser (imported only when a timestamp.txt is found: ~2 s), else dateutil's."""
    try:
        from nbgrader.utils import parse_utc
        return parse_utc
    except Exception:  # noqa: BLE001 - nbgrader missing or broken: fall back
        pass
    try:
        from dateutil.parser import parse
        return parse
    except ImportError:
        return lambda text: datetime.fromisoformat(text.replace(" UTC", "+00:00"))


def _file_time(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


def _zip_time(info: zipfile.ZipInfo) -> datetime | None:
    """A zip member's date: the extended-timestamp field (UTC) when the zip has one, else the DOS
    date, which carries no time zone and is read as UTC; None for an impossible date."""
    extra = info.extra
    at = 0
    while at + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, at)
        body = extra[at + 4:at + 4 + size]
        if tag == 0x5455 and len(body) >= 5 and body[0] & 1:
            try:
                return datetime.fromtimestamp(struct.unpack_from("<i", body, 1)[0], timezone.utc)
            except (ValueError, OverflowError, OSError):
                break
        at += 4 + size
    try:
        return datetime(*info.date_time, tzinfo=timezone.utc)
    except (ValueError, TypeError):
        return None


def _when(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


# --------------------------------------------------------------------------- names of files at the top
@dataclass(frozen=True)
class FlatName:
    """Who a file at the top of the class folder belongs to, read from its name."""
    platform: str  # "canvas", "moodle", "blackboard" or "plain"
    student: str  # the raw student id (before clean-up)
    user: str  # the platform's user id ("" when the name has none)
    file: str  # the name to match an assignment with (the student's original file name)
    late: bool = False  # the platform marked the upload late (Canvas's _LATE_)


# The platforms' fixed prefixes, read leftmost (non-greedy): what follows the prefix is the name the
# student gave their file, and may itself look like a prefix (another student's).
_CANVAS = re.compile(r"^(?P<name>[^_]+?)(?P<late>_late)?_(?P<uid>\d+)_(?P<sub>\d+)_(?P<file>.+)$", re.I)
_MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_[a-z]+_(?P<file>.*)$", re.I)
# A Moodle folder's name ends with the platform's block (no file part): read from the right, because the
# full name before it is the student's own (editable in their profile) and may carry a classmate's block.
_MOODLE_FOLDER = re.compile(r"^(?P<name>.+)_(?P<uid>\d+)_assignsubmission_[a-z]+_(?P<file>)$", re.I)
_MOODLE_BLOCK = re.compile(r"(?=_(\d+)_assignsubmission_[a-z]+_)", re.I)  # overlapping: blocks may share their '_'


def _two_moodle_owners(name: str) -> bool:
    """Whether a file's name holds Moodle owner blocks of two users (one user's twice is a re-upload of a
    file Moodle named: it is theirs)."""
    return len(set(_MOODLE_BLOCK.findall(name))) > 1
_BLACKBOARD = re.compile(r"^.+?_(?P<name>[^_]+)_attempt_\d{4}(?:-\d\d){5}(?:_(?P<file>.+))?$")
_PLATFORMS = (("canvas", _CANVAS), ("moodle", _MOODLE), ("blackboard", _BLACKBOARD))
_COPIES = re.compile(r"(\s*\(\d+\)|[-_ ]copy\d*)+$", re.I)  # what browsers and file managers append


TWO_MOODLE_OWNERS = ("its name holds two users' Moodle owner blocks ('<full name>_<id>_assignsubmission_...'): a student's "
                     "full name or file name imitates another student's, and whose upload it is cannot be told from "
                     "the name, so it is graded as nobody's. Look the upload up on Moodle, rename it there as its "
                     "uploader's ('<full name>_<id>_assignsubmission_file_<file>') and run again")


def flat_name(name: str, assignments, suffix: str = ".ipynb") -> FlatName | None:
    """The owner of a notebook (or zip, or folder) at the top of the class folder, from its name:

    * Canvas: ``<name>_<user id>_<submission id>_<file>``, or ``<name>_LATE_<user id>_...``
      (the name has no '_'; both ids are digits);
    * Moodle: ``<full name>_<user id>_assignsubmission_<plugin>_<file>`` (a folder: the same without
      ``<file>``, read from the right: the full name is the student's to edit);
    * Blackboard: ``<assignment>_<user>_attempt_<YYYY-MM-DD-hh-mm-ss>[_<file>]``;
    * plain: ``<student id>_<assignment>`` or ``<student id>-<assignment>``, the assignment part
      being a known assignment's name (any case, '_', '-' or ' ' between words, browser copy
      suffixes such as ' (1)' allowed).
    `name` is the file name without `suffix`; None when it follows none of these.

    The owner is read from the platform's prefix only: each pattern is matched leftmost, and when
    several platforms' patterns match (the student's part of the name looks like another
    platform's prefix), the one whose prefix ends first is the platform's own."""
    stem = name[:-len(suffix)] if suffix and name.lower().endswith(suffix) else name
    found = []
    for platform, pattern in _PLATFORMS:
        m = (_MOODLE_FOLDER if platform == "moodle" and not suffix else pattern).match(stem)
        if m and m.group("name").strip():
            prefix_end = m.start("file") if m.group("file") is not None else len(stem)
            found.append((prefix_end, platform, m))
    if found:
        _, platform, m = min(found, key=lambda f: f[0])
        groups = m.groupdict()
        file = (groups.get("file") or "") + (suffix if groups.get("file") else "")
        return FlatName(platform, m.group("name").strip(), groups.get("uid") or "", file, bool(groups.get("late")))
    plain = _COPIES.sub("", stem)
    for a in sorted(assignments, key=len, reverse=True):
        words = r"[-_ ]+".join(re.escape(w) for w in re.split(r"[-_ ]+", a) if w)
        m = re.fullmatch(rf"(?P<name>.*?[^-_ ])[-_ ]+{words}", plain, re.I)
        if m:
            return FlatName("plain", m.group("name"), "", a + suffix)
    return None


# --------------------------------------------------------------------------- student ids
def _safe_id(raw: str) -> str:
    """A student id for a folder or zip name: kept when plain, else transliterated to ASCII
    ('Zoé Li' -> 'Zoe_Li', 'Иван Петров' -> 'Ivan_Petrov', '王小明' -> 'WangXiaoMing', 'Ørsted' ->
    'Orsted') and any other odd character replaced by '_'. Transliterated rather than stripped,
    so that a name in another script keeps an id that says whose it is (stripped, every Cyrillic
    or Chinese name became 'student', 'student-2', ...)."""
    if STUDENT_ID.match(raw):
        return raw
    plain = anyascii(unicodedata.normalize("NFC", raw))
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", plain).lstrip("._@-")[:64] or "student"


def student_id_for(raw: str) -> str:
    """The student id a folder or zip named `raw` is graded as (a roster's ids are read the same way)."""
    return _safe_id(raw)


def _same_name(raw: str) -> str:
    """A raw name as compared across layouts: macOS writes 'é' decomposed, a zip or an LMS composed."""
    return unicodedata.normalize("NFC", raw)


def _with_suffix(base: str, k: int) -> str:
    suffix = f"-{k}"
    return base[:64 - len(suffix)] + suffix


def _distinct_ids(items: list[tuple[str, str, str]]) -> list[tuple[str, dict[str, str]]]:
    """A student id for each (layout, entry name, raw id), in order, each with the problems to
    report. An entry shares the id of an earlier entry of another layout with the same name: one
    student, merged (alice/ and submitted/alice/, '王小明/' and Canvas's '王小明_...'). Otherwise it
    gets its cleaned-up id, or a suffix ('Zoe_Li-2') when an earlier entry has that id already: one
    of the same layout (alice/ and alice.zip, 'Zoé Li/' and 'Zoë Li/'), or one of another layout
    under another name ('Ørsted/' and 'submitted/Orsted/'): two names are never merged, only
    graded separately and both told. Deterministic: the earlier entry keeps the id. A suffix never
    takes an id that any entry, of any layout, would get on its own (a real 'alice-2/' keeps 'alice-2')."""
    bases = [_safe_id(raw) for _, _, raw in items]
    reserved = set(bases)
    taken: dict[tuple[str, str], int] = {}  # (layout, id) -> index of the entry that has it
    holder: dict[str, int] = {}  # id -> index of the first entry that has it
    by_name: dict[str, list[int]] = {}  # a raw name -> indices of the entries that carry it
    result: list[tuple[str, dict[str, str]]] = []
    for k, ((layout, entry, raw), base) in enumerate(zip(items, bases, strict=True)):
        problems: dict[str, str] = {}
        sid = next((result[j][0] for j in by_name.get(_same_name(raw), []) if items[j][0] != layout
                    and (layout, result[j][0]) not in taken), None)
        if sid is None and base not in holder:
            sid = base
        if sid is None:
            sid = _free_suffix(base, reserved, holder)
            first = holder[base]
            problems[entry] = (f"graded as student id {sid!r}, because {items[first][1]!r} is already graded as "
                               f"{base!r}; if both are the same student, keep one: move the notebooks you want graded into "
                               f"{items[first][1]!r} and remove {entry!r} (an unzipped copy beside its zip, say), "
                               f"then grade again")
            result[first][1][entry] = f"another submission, {entry!r}, is graded separately as student id {sid!r}"
        elif sid != raw:
            problems[entry] = f"student id {raw!r} renamed to {sid!r}"
        taken[layout, sid] = k
        holder.setdefault(sid, k)
        by_name.setdefault(_same_name(raw), []).append(k)
        result.append((sid, problems))
    return result


def _free_suffix(base: str, reserved: set[str], used) -> str:
    """`base` with the first suffix ('-2', '-3', ...) that no entry has or would get on its own."""
    k = 2
    while _with_suffix(base, k) in reserved or _with_suffix(base, k) in used:
        k += 1
    return _with_suffix(base, k)


# --------------------------------------------------------------------------- what is never a submission
def _skip_reason(path: str, is_dir: bool = False) -> tuple[str, str] | None:
    """(the leading part of `path` to report, why) when `path` is, or is inside, something that is
    never a submission: __MACOSX, .ipynb_checkpoints, a hidden file or folder. Else None."""
    parts = PurePosixPath(path).parts
    for i, part in enumerate(parts):
        head = "/".join(parts[:i + 1])
        if part == "__MACOSX":
            return head, _MACOSX
        if part == ".ipynb_checkpoints":
            return head, _CHECKPOINTS
        if part.startswith("."):
            return head, "hidden " + ("file" if i == len(parts) - 1 and not is_dir else "folder")
    return None


def _skipped(name: str) -> bool:
    return _skip_reason(name) is not None


def _over_budget(sub: StudentSubmission, name: str, size: int, budget: int) -> bool:
    """True (and a problem recorded) when reading `name` went past the student's byte budget;
    a file over MAX_NOTEBOOK_BYTES on its own is left to the parser, which names the limit."""
    if size <= budget or size > MAX_NOTEBOOK_BYTES:
        return False
    sub.problems[name] = (f"stopped reading: this student's notebooks add up to more than "
                          f"{_mib(MAX_STUDENT_BYTES)}; clear the outputs and submit again")
    return True


# --------------------------------------------------------------------------- zips, checked before reading
def _archive_problem(archive: Path) -> str | None:
    """Why a zip's central directory is too big to list (checked before zipfile parses it)."""
    with archive.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - ZIP_TAIL_BYTES))
        return zip_directory_problem(fh.read(), MAX_STUDENT_FILES)


def _notebook_members(infos: list[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
    return sorted((i for i in infos if not i.is_dir() and i.filename.lower().endswith(".ipynb")
                   and not _skipped(i.filename)), key=lambda i: i.filename)


def _no_notebook_in(infos: list[zipfile.ZipInfo]) -> str:
    """Why a zip gave nothing to grade, for its student's notes: without it an empty zip was a
    student marked missing with nothing said about the zip they did upload."""
    files = [i for i in infos if not i.is_dir()]
    held = ("it is empty" if not files else
            f"it holds {len(files):,} other file{'s' if len(files) > 1 else ''}, listed among the files not graded")
    return f"nothing graded from this zip: no notebook (.ipynb) in it ({held}); zip the .ipynb files and upload again"


def _members_problem(infos: list[zipfile.ZipInfo]) -> str | None:
    """Why a whole archive is refused: too many members, overlapping members (a zip bomb), or
    notebooks that declare more than the student's byte budget. Sizes come from the directory."""
    if len(infos) > MAX_STUDENT_FILES:
        return f"it holds {len(infos):,} members (limit {MAX_STUDENT_FILES:,}); zip only the notebooks"
    overlap = overlapping_members(infos)
    if overlap:
        return (f"members {overlap[0].filename!r} and {overlap[1].filename!r} share the same bytes "
                "(a zip bomb, or a damaged archive); zip the notebooks again with an ordinary tool")
    declared = sum(i.file_size for i in _notebook_members(infos))
    if declared > MAX_STUDENT_BYTES:
        return (f"its notebooks declare {_mib(declared)} uncompressed (limit {_mib(MAX_STUDENT_BYTES)}); "
                "clear the outputs and zip again")
    return None


def _member_problem(info: zipfile.ZipInfo) -> str | None:
    """Why one notebook member is not read: too big, or compressed suspiciously well."""
    if info.file_size > MAX_NOTEBOOK_BYTES:
        return _too_large(info.file_size)
    if info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
        return (f"it inflates {info.compress_size:,} bytes to {info.file_size:,} (more than "
                f"{MAX_COMPRESSION_RATIO}:1): not a notebook, or a zip bomb")
    return None


# --------------------------------------------------------------------------- the class
_ENTRIES = "folders and zips"  # layouts, for student ids: entries of one layout never merge
_SUBMITTED = "nbgrader's submitted/"
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error)


@dataclass
class _Source:
    """Where one student's files are, as found: a folder, a zip, or a platform user's files."""
    layout: str
    label: str  # the entry named in messages about its student id
    raw_id: str
    items: list[tuple[str, Path, str]] = field(default_factory=list)  # (folder/zip/file, path, name to match)


@dataclass
class _Version:
    path: str  # relative to the class folder
    when: datetime  # from what the platform wrote (see the module's docstring)
    source: str  # where `when` came from: timestamp.txt, file time, the zip's file time
    data: bytes
    late: str = ""  # why the platform says the upload is late ("" when it does not)
    archive: str = ""  # the zip it came from, relative to the class folder ("" when none)
    inner: datetime | None = None  # its entry's date inside that zip: orders that zip's own files only
    secret: str = ""  # nbgrader's submission_secret.txt of its assignment folder (nbgrader's submitted/ only)


def _newest(versions: list[_Version]) -> _Version:
    """The version to grade: the newest; of versions within SAME_TIME of it, the last in name order
    ("final/" after "draft/", "(2)" after "(1)"): copied folders get near-equal times in any order.
    When those all come from one zip, the one dated last inside it (the student's choice among the
    files of their own upload; a date inside a zip never decides between two uploads)."""
    latest = max(v.when for v in versions)
    tied = [v for v in versions if latest - v.when <= SAME_TIME]
    if _one_zip(tied):
        return max(tied, key=lambda v: (v.inner or datetime.min.replace(tzinfo=timezone.utc), v.path))
    return max(tied, key=lambda v: v.path)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _one_zip(versions: list[_Version]) -> bool:
    return len({v.archive for v in versions}) == 1 and bool(versions[0].archive)


class _Lister:
    """The junk of one folder or zip, for the ignored list: MAX_LISTED files one by one, then a count."""

    def __init__(self, intake: _Intake, where: str):
        self.intake, self.where, self.seen, self.more = intake, where, set(), 0

    def add(self, path: str, why: str) -> None:
        if path in self.seen:
            return
        self.seen.add(path)
        if len(self.seen) <= MAX_LISTED:
            self.intake.ignore(path, why)
        else:
            self.more += 1

    def close(self) -> None:
        if self.more:
            self.intake.ignore(self.where, f"{self.more:,} more files in it not graded (not listed one by one)")


class _Intake:
    """One pass over a class folder; see collect_all."""

    def __init__(self, root: Path, assignments: dict[str, set[str]], due: dict[str, datetime] | None = None,
                 known: Callable[[str, str], dict[str, datetime]] | None = None):
        self.root, self.assignments, self.known = root, assignments, known
        self.due = {a: _utc(when) for a, when in (due or {}).items()}
        self.ignored: list[tuple[str, str]] = []
        self.sources: list[_Source] = []
        self.users: dict[tuple[str, str, str], _Source] = {}  # platform user -> their files
        self.students: dict[str, StudentSubmission] = {}
        self.versions: dict[tuple[str, str], list[_Version]] = {}  # (student, assignment) -> versions
        # ... and those known only by the functions they define (no grade id, no name): graded only when the
        # student handed in nothing else for that assignment (a scratch notebook never displaces the real one)
        self.by_code: dict[tuple[str, str], list[tuple[_Version, str]]] = {}
        self.stamps: dict[object, datetime | None] = {}  # nbgrader's assignment folder -> its timestamp.txt
        self.marks: dict[Path, str] = {}  # an upload at the top -> why its platform says it is late
        self.exported: dict[str, list[tuple[str, str, str]]] = {}  # student -> (assignment, path, why) of other formats
        # (uploader, upload, the other platform user its student-chosen name carries)
        self.claims: list[tuple[tuple[str, str, str], Path, FlatName, FlatName]] = []

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def ignore(self, path: str, why: str) -> None:
        self.ignored.append((path, why))

    def problem(self, sub: StudentSubmission, key: str, path: str, why: str) -> None:
        """A file of this student's not graded: said in their problems (status) and the ignored list."""
        if sub.problems.get(key, why) != why:
            key = path  # two files of the same name (merged layouts): keep both
        sub.problems[key] = why
        self.ignore(path, why)

    @staticmethod
    def note(sub: StudentSubmission, key: str, text: str) -> None:
        """Something the instructor should know about this student's files (their row's notes)."""
        k, n = key, 1
        while sub.problems.get(k, text) != text:
            n += 1
            k = f"{key} ({n})"
        sub.problems[k] = text

    # ---- finding the students
    def run(self) -> Intake:
        self.scan(self.root, _ENTRIES)
        shared = self.shared_moodle_names()
        ids = _distinct_ids([(s.layout, s.label, s.raw_id) for s in self.sources])
        owners: dict[int, str] = {}  # id(source) -> its student id
        for source, (sid, problems) in zip(self.sources, ids, strict=True):
            sub = self.students.setdefault(sid, StudentSubmission(sid))
            sub.problems.update(problems)
            if id(source) in shared:
                sub.problems[source.label] = shared[id(source)]
            owners[id(source)] = sid
            self.read(sub, source)
        self.name_claims(owners)
        self.choose_versions()
        return Intake(list(self.students.values()), sorted(self.ignored))

    def scan(self, folder: Path, layout: str) -> None:
        """Sort the entries of the class folder (or of its submitted/) into sources and junk."""
        submitted = folder / "submitted"
        nbgrader_course = layout == _ENTRIES and submitted.is_dir() and not submitted.is_symlink()
        for entry in sorted(folder.iterdir()):
            rel, name = self.rel(entry), entry.name
            skip = _skip_reason(name, entry.is_dir())
            if skip:
                self.ignore(rel, skip[1])
            elif entry.is_symlink():
                self.ignore(rel, "a symbolic link: not followed")
            elif entry.is_dir() and nbgrader_course and name == "submitted":
                self.scan(entry, _SUBMITTED)
            elif entry.is_dir() and nbgrader_course and name in _NBGRADER_FOLDERS:
                self.ignore(rel, f"nbgrader's {name}/ folder, not a student's (students are read from submitted/)")
            elif entry.is_dir():  # a student's folder; a platform's name (Moodle) says whose
                self.add(layout, entry, "folder", flat_name(name, {}, suffix=""), name)
            elif entry.is_file() and _two_moodle_owners(name):
                self.ignore(rel, TWO_MOODLE_OWNERS)
            elif entry.is_file() and name.lower().endswith(".zip"):
                self.add(layout, entry, "zip", flat_name(name, self.assignments, suffix=".zip"), entry.stem)
            elif entry.is_file() and name.lower().endswith(".ipynb"):
                flat = flat_name(name, self.assignments)
                if flat is None:
                    self.ignore(rel, "a notebook beside the students' folders whose name names no student: name it "
                                     "<student>_<assignment>.ipynb, or put it in a folder named after the student")
                else:
                    self.add(layout, entry, "file", flat, name)
            elif entry.is_file() and (flat := self.flat_export(name)) is not None:
                self.add(layout, entry, "export", flat, name)  # only a student's copy in another format, maybe
            elif entry.is_file():
                self.ignore(rel, "not a notebook (.ipynb), a zip or a student's folder")
            else:
                self.ignore(rel, "not a regular file or folder")

    def flat_export(self, name: str) -> FlatName | None:
        """The owner of a file at the top that is an assignment's notebook in another format, from its name."""
        suffix = _export_suffix(name)
        flat = flat_name(name, self.assignments, suffix=suffix) if suffix else None
        if flat is None or export_of(flat.file or name, self.assignments) is None:
            return None
        return flat

    def add(self, layout: str, path: Path, kind: str, flat: FlatName | None, raw: str) -> None:
        if flat is None:
            self.sources.append(_Source(layout, path.name, raw, [(kind, path, path.name)]))
            return
        user = (flat.platform, flat.student, flat.user)
        if user not in self.users:  # a platform user's files are one student; two users, two students
            self.users[user] = _Source(f"{flat.platform} files", path.name, flat.student)
            self.sources.append(self.users[user])
        self.users[user].items.append((kind, path, flat.file or path.name))
        if flat.late:
            self.marks[path] = f"{flat.platform.capitalize()} marked this upload late ('_LATE_' in its name)"
        if flat.platform != "plain" and flat.file:  # the student's part of the name: does it name someone else?
            other = flat_name(flat.file, {}, suffix={"zip": ".zip", "file": ".ipynb"}.get(kind, ""))
            if other is not None and (other.student != flat.student
                                      or (other.user and flat.user and other.user != flat.user)):
                self.claims.append((user, path, flat, other))

    def shared_moodle_names(self) -> dict[int, str]:
        """Moodle users who share a full name (which each owner may edit: a red team took a classmate's, and with
        it the classmate's id, roster row and email): each is graded under its name and Moodle user id, neither
        under the bare name, so the roster ties neither by guess. {id(source): the note for its row}."""
        by_name: dict[str, dict[str, _Source]] = {}
        for (platform, student, user), source in self.users.items():
            if platform == "moodle" and user:
                by_name.setdefault(_safe_id(student), {})[user] = source
        notes = {}
        for name, sources in by_name.items():
            if len(sources) < 2:
                continue
            users = ", ".join(sorted(sources, key=int))
            for user, source in sources.items():
                source.raw_id = f"{source.raw_id}-{user}"
                notes[id(source)] = (f"Moodle users {users} share the full name behind {name!r}, which each of them "
                                     f"can change: graded as {_safe_id(source.raw_id)!r} (the name and Moodle user id "
                                     f"{user}), and tied to no roster row by name; find whose it is on Moodle, then "
                                     "give it that student's id (rename its folder) and grade again")
        return notes

    def name_claims(self, owners: dict[int, str]) -> None:
        """An upload whose student-chosen name carries another student's platform name: it stays
        its uploader's (the platform's prefix says whose it is); both students' rows say so."""
        for user, path, flat, other in self.claims:
            uploader = owners[id(self.users[user])]
            who = repr(other.student) + (f", user {other.user}" if other.user else "")
            self.note(self.students[uploader], path.name,
                      f"the name the student gave this upload, {flat.file!r}, carries another student's "
                      f"{other.platform} name ({who}): taken as {uploader!r}'s, as the platform's own prefix says")
            named = self.users.get((other.platform, other.student, other.user))
            sid = owners[id(named)] if named is not None else _safe_id(other.student)
            if sid != uploader and sid in self.students:
                self.note(self.students[sid], path.name,
                          f"another student's upload (graded as {uploader!r}) names this student in the name its "
                          "student gave it: not taken as theirs")

    # ---- reading them
    def read(self, sub: StudentSubmission, source: _Source) -> None:
        budget = [MAX_STUDENT_BYTES, 0]  # bytes left, files read: for a platform user's loose files
        for kind, path, match_name in source.items:
            late = self.marks.get(path, "")
            try:
                if kind == "folder":
                    exchange = path.parent.name == "submitted" and path.parent in (self.root, self.root / "submitted")
                    self.read_folder(sub, path, exchange, late)
                elif kind == "zip":
                    self.read_zip(sub, path, late)
                elif kind == "export":
                    self.export(sub, self.rel(path), match_name)
                else:
                    self.read_file(sub, path, match_name, budget, late=late)
            except OSError as err:  # the file is there, the grader cannot read it
                self.unreadable(sub, path, err)
            except Exception as err:  # noqa: BLE001 - one student's files never stop the class's collection
                why = f"could not be read ({type(err).__name__}: {str(err)[:200]})"
                self.problem(sub, path.name, self.rel(path), why)

    def export(self, sub: StudentSubmission, path: str, name: str) -> bool:
        """A student's file that is an assignment's notebook in another format: kept aside until their
        notebooks are chosen (`choose_versions` says it in their row where it is all they handed in)."""
        found = export_of(PurePosixPath(name).name, self.assignments)
        if found is None:
            return False
        self.exported.setdefault(sub.student_id, []).append((found[0], path, found[1]))
        return True

    def unreadable(self, sub: StudentSubmission, path: Path, err: OSError) -> None:
        """A file or folder of this student's that the grader cannot read: their missing notebooks are the
        grader's incident, not a 0 (StudentSubmission.unread)."""
        why = _unread_why(err)
        sub.unread[self.rel(path)] = why
        self.problem(sub, path.name, self.rel(path), why)

    def read_file(self, sub: StudentSubmission, path: Path, match_name: str, budget: list[int],
                  time: tuple[datetime, str] | None = None, late: str = "", secret: str = "") -> bool:
        """Offer one notebook file, read with a bounded read; False once the student's budget is spent."""
        rel = self.rel(path)
        budget[1] += 1
        if budget[1] > MAX_STUDENT_FILES:
            self.problem(sub, path.name, rel, f"not read: this student has more than {MAX_STUDENT_FILES:,} notebooks")
            return True
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            self.problem(sub, path.name, rel, _too_large(size))
            return True
        with path.open("rb") as fh:
            data = fh.read(min(MAX_NOTEBOOK_BYTES, budget[0]) + 1)
        if _over_budget(sub, path.name, len(data), budget[0]):
            self.ignore(rel, sub.problems[path.name])
            return False
        budget[0] -= len(data)
        when, source = time or (_file_time(path), "file time")
        self.offer(sub, path.name, match_name, rel, _Version(rel, when, source, data, late, secret=secret))
        return True

    def read_folder(self, sub: StudentSubmission, folder: Path, exchange: bool = False, late: str = "") -> None:
        """A student's notebooks from a folder, any depth, with the time of each; the rest listed.
        `exchange`: the folder is a student's in nbgrader's submitted/ tree, where the exchange wrote
        <assignment>/timestamp.txt; any other timestamp.txt is the student's own (a note)."""
        listed = _Lister(self, self.rel(folder))
        notebooks, stamps, seen, pending = [], [], 0, [folder]
        while pending and seen <= MAX_FOLDER_ENTRIES:  # depth first, in name order, without recursion
            here = pending.pop()
            try:
                with os.scandir(here) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as err:
                self.unreadable(sub, here, err)
                continue
            folders = []
            for entry in entries[:MAX_FOLDER_ENTRIES + 1 - seen]:
                seen += 1
                path, is_dir = here / entry.name, entry.is_dir(follow_symlinks=False)
                skip = _skip_reason(entry.name, is_dir)
                if skip:
                    listed.add(self.rel(path), skip[1])
                elif entry.is_symlink():
                    listed.add(self.rel(path), "a symbolic link: not followed")
                elif is_dir:
                    folders.append(path)
                elif not entry.is_file(follow_symlinks=False):
                    listed.add(self.rel(path), "not a regular file")
                elif entry.name.lower().endswith(".ipynb"):
                    notebooks.append(path)
                elif entry.name == TIMESTAMP_FILE:
                    stamps.append(path)
                elif entry.name == SECRET_FILE and exchange and here.parent == folder:
                    pass  # nbgrader's, beside the assignment's notebooks: read with them (folder_secret)
                elif not self.export(sub, self.rel(path), entry.name):
                    listed.add(self.rel(path), "not a notebook")
            pending.extend(reversed(folders))
        if seen > MAX_FOLDER_ENTRIES:
            self.problem(sub, folder.name, self.rel(folder), f"stopped looking after {MAX_FOLDER_ENTRIES:,} files and "
                                                             "folders in this folder; the rest were not read")
        notebooks.sort()
        tops = {_top(folder, p) for p in notebooks} if exchange else set()
        for path in stamps:
            if exchange and path.parent.parent == folder:  # where nbgrader's exchange writes it
                if path.parent not in tops:
                    listed.add(self.rel(path), "nbgrader's timestamp.txt, with no notebook beside it")
                continue
            listed.add(self.rel(path), "a timestamp.txt among the student's own files, not one nbgrader's exchange "
                                       "wrote: not the submission time (the notebooks' file times are)")
            said = _read_stamp(path)
            if said is not None:
                self.note(sub, self.rel(path), f"says {_when(said)}: not used, a timestamp.txt among the student's own "
                                               "files is not the platform's record; the file times are")
        if len(notebooks) > MAX_STUDENT_FILES:
            sub.problems[folder.name] = (f"the folder holds {len(notebooks):,} notebooks "
                                         f"(limit {MAX_STUDENT_FILES:,}); read the first {MAX_STUDENT_FILES:,} "
                                         "in name order")
            for path in notebooks[MAX_STUDENT_FILES:]:
                listed.add(self.rel(path), f"not read: past the first {MAX_STUDENT_FILES:,} notebooks of the folder")
        budget = [MAX_STUDENT_BYTES, 0]
        for k, path in enumerate(notebooks[:MAX_STUDENT_FILES]):
            top = _top(folder, path) if exchange else None
            try:
                offered = self.read_file(sub, path, path.name, budget, self.folder_time(path, top, sub), late,
                                         self.folder_secret(top))
            except OSError as err:  # this one file: the folder's other notebooks are still read
                self.unreadable(sub, path, err)
                continue
            if not offered:
                for rest in notebooks[k + 1:MAX_STUDENT_FILES]:
                    listed.add(self.rel(rest), f"not read: past the student's {_mib(MAX_STUDENT_BYTES)} of notebooks")
                break
        listed.close()

    def folder_secret(self, top: Path | None) -> str:
        """nbgrader's submission secret in the assignment folder `top` of its submitted/ tree ("" when
        there is none or it is not one nbgrader wrote): `nbgrader release_feedback` needs it."""
        path = top / SECRET_FILE if top is not None else None
        if path is None or not path.is_file() or path.is_symlink():
            return ""
        try:
            with path.open("rb") as fh:
                raw = fh.read(257).decode("ascii", errors="replace").strip()
        except OSError as err:  # the notebook beside it is still graded; its feedback cannot go back by the exchange
            self.ignore(self.rel(path), _unread_why(err))
            return ""
        return raw if _SECRET.fullmatch(raw) else ""

    def folder_time(self, path: Path, top: Path | None, sub: StudentSubmission | None = None) -> tuple[datetime, str]:
        """A notebook's submission time: the timestamp.txt nbgrader's exchange wrote in its
        assignment folder `top` (None outside nbgrader's submitted/ tree), else the file's time (said
        on the student's row too when their timestamp.txt could not be read: `sub`)."""
        if top is not None and top not in self.stamps:
            stamp, when = top / TIMESTAMP_FILE, None
            try:
                notebooks = sorted(top.glob("*.ipynb"))[:MAX_STUDENT_FILES]
            except OSError:
                notebooks = [path]
            open_to_others = _open_to_others([stamp, *notebooks, top, top.parent, top.parent.parent])
            if open_to_others and sub is not None:  # said on the row; the time is still nbgrader's (the file times
                # that could replace it are no safer there: any user who can write the folder can set them too)
                self.note(sub, self.rel(top), f"{open_to_others}: another user could have changed this submission or "
                                              f"its time; check it, and `chmod -R go-w` the submitted folder (the "
                                              f"course's collect writes it for you alone)")
            if stamp.is_file() and not stamp.is_symlink():
                try:
                    raw = _head(stamp, MAX_TIMESTAMP_BYTES + 1)
                    when = parse_timestamp(raw)
                    problem = None if when else f"not a time nbgrader wrote ({raw[:60]!r})"
                except OSError as err:  # a stamp the grader cannot read: the notebook is still graded, by its file time
                    when, problem = None, _unread_why(err)
                if problem:
                    why = f"{problem}: the notebooks' file times are used instead"
                    self.ignore(self.rel(stamp), why)
                    if sub is not None:
                        self.note(sub, self.rel(stamp), why)
            self.stamps[top] = when
        when = self.stamps.get(top) if top is not None else None
        return (when, TIMESTAMP_FILE) if when else (_file_time(path), "file time")

    def read_zip(self, sub: StudentSubmission, archive: Path, late: str = "") -> None:
        """A student's notebooks from a zip, read into memory (nothing is extracted), after checking
        that its directory is small and honest: no zip bombs, no overlapping members."""
        rel = self.rel(archive)
        try:
            problem = _archive_problem(archive)
            if problem:
                self.problem(sub, archive.name, rel,
                             f"zip refused: {problem}; zip only the notebooks, with an ordinary tool")
                return
            with zipfile.ZipFile(archive) as zf:
                infos = zf.infolist()
                problem = _members_problem(infos)
                if problem:
                    self.problem(sub, archive.name, rel, f"zip refused: {problem}")
                    return
                self.read_members(sub, archive, zf, infos, late)
        except PermissionError as err:  # the grader's account cannot open it: not the student's broken zip
            self.unreadable(sub, archive, err)
        except _ZIP_ERRORS:
            self.problem(sub, archive.name, rel, "not a readable zip file")

    def read_members(self, sub: StudentSubmission, archive: Path, zf: zipfile.ZipFile,
                     infos: list[zipfile.ZipInfo], late: str = "") -> None:
        """Read each notebook member with a bounded read: the sizes in the directory are not trusted.
        Its time is the zip's file time; what the zip says of time (a timestamp.txt in it, the
        entries' dates) is the student's, named in their notes where it tells another story."""
        rel = self.rel(archive)
        listed = _Lister(self, rel)
        notebooks = _notebook_members(infos)
        users = sorted({(f.student, f.user) for f in (flat_name(PurePosixPath(i.filename).name, {}) for i in notebooks)
                        if f is not None})
        if len(users) > 1:  # not one student's zip: the platform's download of the whole class
            self.problem(sub, archive.name, rel, f"zip not read: it holds the notebooks of {len(users)} students as a "
                         f"learning platform names them ({', '.join(repr(u) for u, _ in users[:3])}"
                         f"{', ...' if len(users) > 3 else ''}): unzip it into the class folder and grade again")
            return
        if not notebooks:
            self.problem(sub, archive.name, rel, _no_notebook_in(infos))
        uploaded = _file_time(archive)
        stamps: dict[PurePosixPath, zipfile.ZipInfo] = {}
        for info in sorted(infos, key=lambda i: i.filename):
            skip = _skip_reason(info.filename, info.is_dir())
            if skip:
                listed.add(f"{rel}/{skip[0]}", skip[1])
            elif info.is_dir() or info.filename.lower().endswith(".ipynb"):
                continue
            elif PurePosixPath(info.filename).name == TIMESTAMP_FILE:
                stamps[PurePosixPath(info.filename).parent] = info
            elif not self.export(sub, f"{rel}/{info.filename}", info.filename):
                listed.add(f"{rel}/{info.filename}", "not a notebook")
        beside = {PurePosixPath(i.filename).parent for i in notebooks}
        for folder, info in stamps.items():
            path = f"{rel}/{info.filename}"
            if folder not in beside:
                listed.add(path, "nbgrader's timestamp.txt, with no notebook beside it")
                continue
            listed.add(path, "a timestamp.txt inside a student's zip: not the submission time (the zip's file time "
                             "is), named in the student's notes")
            said = _zip_stamp(zf, info)
            if said is not None:
                self.note(sub, path, f"says {_when(said)}: not used, a date inside a student's zip is not the "
                                     f"platform's record; the submission time is the zip's file time ({_when(uploaded)})"
                                     + (f"; {late}" if late else ""))
        budget = MAX_STUDENT_BYTES
        for k, info in enumerate(notebooks):
            path = f"{rel}/{info.filename}"
            problem = _member_problem(info)
            if problem:
                self.problem(sub, info.filename, path, problem)
                continue
            try:
                with zf.open(info) as fh:
                    data = fh.read(min(MAX_NOTEBOOK_BYTES, budget) + 1)
            except _ZIP_ERRORS as err:
                self.problem(sub, info.filename, path,
                             f"could not be read from the zip ({type(err).__name__}: {str(err)[:120]})")
                continue
            if _over_budget(sub, info.filename, len(data), budget):
                self.ignore(path, sub.problems[info.filename])
                for rest in notebooks[k + 1:]:
                    listed.add(f"{rel}/{rest.filename}",
                               f"not read: past the student's {_mib(MAX_STUDENT_BYTES)} of notebooks")
                break
            budget -= len(data)
            inner = _zip_time(info)
            if inner is not None and (late or inner - uploaded > ZONE_SLACK):
                self.note(sub, path, f"dated {_when(inner)} inside the zip: not used, the submission time is the zip's "
                                     f"file time ({_when(uploaded)})" + (f"; {late}" if late else ""))
            self.offer(sub, info.filename, info.filename, path,
                       _Version(path, uploaded, "the zip's file time", data, late, rel, inner))
        listed.close()

    # ---- one notebook, and the versions of one assignment
    def offer(self, sub: StudentSubmission, key: str, match_name: str, path: str, version: _Version) -> None:
        """File one notebook as a version of its assignment, or say why not.

        A file past a limit is refused here, so nbgrader never sees it. A file that is merely not a
        notebook (bad JSON, not UTF-8) is kept when its name matches, and graded as unreadable."""
        notebook, problem, over_limit = _parse(version.data)
        if over_limit:
            self.problem(sub, key, path, problem)
            return
        a = _match(match_name, lambda: _ids_in(notebook) if notebook else set(), self.assignments)
        if a is None and notebook:
            a = _match(match_name, lambda: _names_in(notebook), self.assignments)
            if a is not None:
                self.by_code.setdefault((sub.student_id, a), []).append((version, key))
                return
        if a is None:
            why = "not recognised as any assignment's notebook" + (f" ({problem})" if problem else "")
            self.problem(sub, key, path, why)
            return
        self.versions.setdefault((sub.student_id, a), []).append(version)

    def choose_versions(self) -> None:
        """Grade the newest version of each assignment; name the others in problems and ignored.
        A version its platform marked late is late: marked, noted, and (due dates given) recorded
        after its due date whatever its file's time. A notebook known only by the functions it defines
        is a version only where the student handed in nothing else for the assignment."""
        for (sid, a), found in self.by_code.items():
            if (sid, a) not in self.versions:
                self.versions[(sid, a)] = [version for version, _ in found]
                continue
            for version, key in found:
                self.problem(self.students[sid], key, version.path,
                             f"its cells carry no nbgrader marks, and only the functions it defines are {a}'s; "
                             f"{a}'s own notebook from {sid} is graded instead")
        for (sid, a), versions in self.versions.items():
            sub = self.students[sid]
            versions = [self.as_seen_before(sid, a, v) for v in versions]
            sub.hand_ins[a] = {}
            for v in versions:
                sub.hand_ins[a].setdefault(_digest(v.data), v.when.isoformat())
            best = _newest(versions)
            sub.notebooks[a] = best.data
            sub.timestamps[a] = best.when
            if best.secret:
                sub.secrets[a] = best.secret
            sub.origins[a] = f"{best.path} ({best.source})"
            if best.late:
                self.mark_late(sub, a, best)
            others = sorted((v for v in versions if v is not best), key=lambda v: (v.when, v.path), reverse=True)
            if not others:
                continue
            graded = f"{best.path} ({_when(best.when)})"
            by_date_inside = _one_zip([v for v in versions if best.when - v.when <= SAME_TIME])
            notes = []
            for v in others:
                older = best.when - v.when > SAME_TIME
                inside = not older and by_date_inside and v.inner != best.inner
                why = "older" if older else "same upload, dated earlier inside it" if inside else \
                    "same time, earlier in name order"
                notes.append(f"{v.path} ({why}, {_when(v.when)})")
                self.ignore(v.path, f"{'an older' if older else 'another'} version of {a} for student {sid!r}: "
                                    f"graded {graded} instead")
            sub.problems[a] = f"graded {graded}, ignored " + ", ".join(notes)
        for sid, copies in self.exported.items():  # a notebook in another format: the row says so where it is all
            sub = self.students[sid]
            for a, path, why in copies:
                if a in sub.notebooks:
                    self.ignore(path, f"a copy of {a} in another format: {sub.origins[a]} is graded")
                else:
                    self.problem(sub, PurePosixPath(path).name, path, why)

    def as_seen_before(self, sid: str, a: str, v: _Version) -> _Version:
        """`v`, timed as an earlier grading run saw the same notebook when that was earlier than its file time
        here (a copy of the class folder, or a new download, dates every file today: an older version, never
        graded, became the newest and was graded with a late penalty; a re-downloaded notebook pushed a late
        fix aside as 'older'). A time the platform wrote (timestamp.txt) stands as it is."""
        if self.known is None or v.source == TIMESTAMP_FILE:
            return v
        seen = self.known(sid, a).get(_digest(v.data))
        if seen is None or v.when - seen <= SAME_TIME:
            return v
        return dataclasses.replace(v, when=seen, source=f"{v.source} in an earlier grading run")

    def mark_late(self, sub: StudentSubmission, a: str, best: _Version) -> None:
        note = f"{best.late}; its time is {_when(best.when)} ({best.source})"
        due = self.due.get(a)
        if due is not None and best.when <= due:
            sub.timestamps[a] = due + AFTER_DUE
            note += (f", not after the due date ({_when(due)}): recorded as "
                     f"{sub.timestamps[a]:%Y-%m-%d %H:%M:%S} UTC, late as the platform says")
        sub.late[a] = note
        self.note(sub, f"{a} (late)", f"graded {best.path}: {note}")


def _top(folder: Path, path: Path) -> Path | None:
    """The folder right below `folder` that holds `path` (nbgrader's assignment folder), if any."""
    parts = path.relative_to(folder).parts
    return folder / parts[0] if len(parts) > 1 else None


def _head(path: Path, size: int) -> bytes:
    """The first bytes of a file (a bounded read: a student's 'timestamp' may be any size)."""
    with path.open("rb") as fh:
        return fh.read(size)


def _read_stamp(path: Path) -> datetime | None:
    return parse_timestamp(_head(path, MAX_TIMESTAMP_BYTES + 1))


def _unread_why(err: OSError) -> str:
    """Why a file of a student's was not read, when the grader's account could not open it (never theirs)."""
    return f"could not be read by the account grading ({err.strerror or type(err).__name__})"


def _zip_stamp(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> datetime | None:
    """The time a timestamp.txt inside a zip says (for a note), or None."""
    if info.file_size > MAX_TIMESTAMP_BYTES or _member_problem(info) is not None:
        return None
    try:
        with zf.open(info) as fh:
            return parse_timestamp(fh.read(MAX_TIMESTAMP_BYTES + 1))
    except _ZIP_ERRORS:
        return None


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)


def collect_all(submissions: Path, assignments: dict[str, set[str]],
                due: dict[str, datetime] | None = None,
                known: Callable[[str, str], dict[str, datetime]] | None = None) -> Intake:
    """Every student of a class folder, whatever the layouts in it (see the module's docstring),
    with their notebooks keyed by assignment, and every file that was not graded, with why.
    `assignments` maps name -> grade ids; `due` (optional) maps name -> due date (a time without a
    zone is UTC, as nbgrader reads it): an upload its platform marked late is then never recorded
    as on time. `known(student, assignment)` (optional): the times earlier grading runs saw that student's
    notebooks at, by sha256 of their bytes; a notebook timed by its file is timed by the earlier of the two.

    Files past the limits above are reported and skipped, never raised; a student whose folder,
    zip or files hold no notebook is still a student (graded as missing)."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of submissions (one sub-folder or zip per student)")
    return _Intake(submissions, assignments, due, known).run()


def collect(submissions: Path, assignments: dict[str, set[str]],
            due: dict[str, datetime] | None = None) -> list[StudentSubmission]:
    """collect_all's students: every student's notebooks, keyed by assignment."""
    return collect_all(submissions, assignments, due).students
