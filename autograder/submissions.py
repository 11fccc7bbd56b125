"""Collect a class's submissions, whatever shape they arrive in.

Accepted layouts of SUBMISSIONS:
* one folder per student: ``<student_id>/*.ipynb`` (any depth below it);
* one zip per student: ``<student_id>.zip`` holding the notebooks (any depth);
* nbgrader's tree: ``submitted/<student_id>/<assignment>/<notebook>.ipynb`` (pass the
  ``submitted`` folder or its parent).

Each notebook is matched to an assignment by its file name, tolerating the renames that
browsers and students make (``01_similarity_attention (1).ipynb``, ``Copy of ...``), then by
its leading number, then by the graded cells it contains.
"""
from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


@dataclass
class StudentSubmission:
    student_id: str
    notebooks: dict[str, bytes] = field(default_factory=dict)  # assignment -> notebook bytes
    problems: dict[str, str] = field(default_factory=dict)  # assignment or file -> what went wrong


def _clean_name(name: str) -> str:
    stem = PurePosixPath(name).name
    stem = re.sub(r"\.ipynb$", "", stem, flags=re.I)
    stem = re.sub(r"^(copy of\s+)", "", stem, flags=re.I)
    stem = re.sub(r"(\s*\(\d+\)|[-_ ]copy\d*|-checkpoint)$", "", stem, flags=re.I)
    return stem.strip().lower().replace(" ", "_").replace("-", "_")


def _grade_ids(data: bytes) -> set[str]:
    try:
        nb = json.loads(data)
        return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "") for c in nb.get("cells", [])} - {""}
    except (ValueError, AttributeError, TypeError):
        return set()


def match_assignment(name: str, data: bytes, assignments: dict[str, set[str]]) -> str | None:
    """The assignment a notebook file belongs to, or None."""
    clean = _clean_name(name)
    if clean in assignments:
        return clean
    number = re.match(r"^(\d+)", clean)
    if number:
        hits = [a for a in assignments if re.match(rf"^0*{int(number.group(1))}_", a)]
        if len(hits) == 1:
            return hits[0]
    ids = _grade_ids(data)
    best = max(assignments, key=lambda a: len(ids & assignments[a]), default=None)
    if best and len(ids & assignments[best]) >= 2:
        return best
    return None


def _add(sub: StudentSubmission, name: str, data: bytes, assignments: dict[str, set[str]]) -> None:
    if len(data) > MAX_NOTEBOOK_BYTES:
        sub.problems[name] = f"file too large ({len(data) // 1024 // 1024} MiB)"
        return
    a = match_assignment(name, data, assignments)
    if a is None:
        sub.problems[name] = "not recognised as any assignment's notebook"
    elif a in sub.notebooks:
        sub.problems[name] = f"a second notebook for {a}; graded the first one found"
    else:
        sub.notebooks[a] = data


def _from_folder(student_id: str, folder: Path, assignments) -> StudentSubmission:
    sub = StudentSubmission(student_id)
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts or path.is_symlink():
            continue
        _add(sub, path.name, path.read_bytes(), assignments)
    return sub


def _from_zip(student_id: str, archive: Path, assignments) -> StudentSubmission:
    sub = StudentSubmission(student_id)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                name = info.filename
                if info.is_dir() or not name.lower().endswith(".ipynb") or "__MACOSX" in name \
                        or ".ipynb_checkpoints" in name:
                    continue
                if info.file_size > MAX_NOTEBOOK_BYTES:
                    sub.problems[name] = "file too large"
                    continue
                _add(sub, name, zf.read(info), assignments)  # read into memory: nothing is extracted
    except zipfile.BadZipFile:
        sub.problems[archive.name] = "not a readable zip file"
    return sub


def collect(submissions: Path, assignments: dict[str, set[str]]) -> list[StudentSubmission]:
    """Every student's notebooks, keyed by assignment. `assignments` maps name -> grade ids."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of submissions (one sub-folder or zip per student)")
    root = submissions / "submitted" if (submissions / "submitted").is_dir() else submissions
    students: dict[str, StudentSubmission] = {}
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            sid = entry.name
            sub = _from_folder(sid, entry, assignments)
        elif entry.suffix.lower() == ".zip":
            sid = entry.stem
            sub = _from_zip(sid, entry, assignments)
        else:
            continue
        if not STUDENT_ID.match(sid):
            safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", sid)[:64].lstrip("._-") or "student"
            sub.problems[entry.name] = f"student id {sid!r} renamed to {safe!r}"
            sub.student_id = sid = safe
        if sid in students:
            students[sid].problems[entry.name] = "a second submission for this student id was ignored"
            continue
        students[sid] = sub
    return list(students.values())
