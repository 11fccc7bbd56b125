"""Collect a class's submissions, whatever shape they arrive in.

Accepted layouts of SUBMISSIONS:
* one folder per student: ``<student_id>/*.ipynb`` (any depth below it);
* one zip per student: ``<student_id>.zip`` holding the notebooks (any depth);
* nbgrader's tree: ``submitted/<student_id>/<assignment>/<notebook>.ipynb`` (pass the
  ``submitted`` folder or its parent).

Each notebook is matched to an assignment by its file name, tolerating the renames that
browsers and students make (``01_similarity_attention (1).ipynb``, ``Copy of ...``), then by
its leading number, then by the graded cells it contains.

Everything here is untrusted and bounded: a file past a limit below is reported in the
student's ``problems`` and skipped, the rest of the class is collected as usual, and
``collect`` raises for nothing a student can put in a file or a zip.
"""
from __future__ import annotations

import json
import re
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .limits import ZIP_TAIL_BYTES, json_depth, overlapping_members, zip_directory_problem

# ---- one notebook (real course notebooks: < 1 MiB, < 10 levels deep, < 150 cells)
MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024  # a notebook file, or a zip member's inflated size
MAX_JSON_DEPTH = 100  # nesting of JSON arrays/objects; json.loads recurses once per level
MAX_CELLS = 2_000  # cells in one notebook; nbgrader spends ~6 ms per cell, 100,000 take 10 min
MAX_SOURCE_CHARS = 2_000_000  # characters of cell source in one notebook, all cells together
# ---- one student (a folder or a zip)
MAX_STUDENT_FILES = 500  # members of a student's zip, or .ipynb files in a student's folder
MAX_STUDENT_BYTES = 200 * 1024 * 1024  # notebook bytes read for one student, zip or folder
MAX_COMPRESSION_RATIO = 200  # inflated / compressed size of a zip member; notebooks reach ~10

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_SKIPPED_NAMES = ("__MACOSX", ".ipynb_checkpoints")


@dataclass
class StudentSubmission:
    student_id: str
    notebooks: dict[str, bytes] = field(default_factory=dict)  # assignment -> notebook bytes
    problems: dict[str, str] = field(default_factory=dict)  # assignment or file -> what went wrong


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
        text = data.decode("utf-8")
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
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        return None, "JSON, but not a notebook (no list of cells)", False
    problem = _cells_problem(notebook["cells"])
    return (None, problem, True) if problem else (notebook, None, False)


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


def _too_large(size: int) -> str:
    return (f"the file is {_mib(size)} (limit {_mib(MAX_NOTEBOOK_BYTES)}): clear the cell outputs "
            "(Kernel > Restart & Clear Output), save and submit again")


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def _clean_name(name: str) -> str:
    stem = PurePosixPath(name).name
    stem = re.sub(r"\.ipynb$", "", stem, flags=re.I)
    stem = re.sub(r"^(copy of\s+)", "", stem, flags=re.I)
    stem = re.sub(r"(\s*\(\d+\)|[-_ ]copy\d*|-checkpoint)$", "", stem, flags=re.I)
    return stem.strip().lower().replace(" ", "_").replace("-", "_")


def _grade_ids(data: bytes) -> set[str]:
    """The nbgrader grade ids of a notebook's cells; empty for anything that is not a notebook."""
    notebook, _ = parse_notebook(data)
    return _ids_in(notebook) if notebook else set()


def _ids_in(notebook: dict) -> set[str]:
    ids = set()
    for cell in notebook["cells"]:
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if isinstance(grade_id, str) and grade_id:
            ids.add(grade_id)
    return ids


def match_assignment(name: str, data: bytes, assignments: dict[str, set[str]]) -> str | None:
    """The assignment a notebook file belongs to, or None."""
    return _match(name, lambda: _grade_ids(data), assignments)


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


def _add(sub: StudentSubmission, name: str, data: bytes, assignments: dict[str, set[str]]) -> None:
    """File one notebook under its assignment, or say in `problems` why not.

    A file past a limit is refused here, so nbgrader never sees it. A file that is merely not a
    notebook (bad JSON, not UTF-8) is kept when its name matches, and graded as unreadable."""
    notebook, problem, over_limit = _parse(data)
    if over_limit:
        sub.problems[name] = problem
        return
    a = _match(name, lambda: _ids_in(notebook) if notebook else set(), assignments)
    if a is None:
        sub.problems[name] = "not recognised as any assignment's notebook" + (f" ({problem})" if problem else "")
    elif a in sub.notebooks:
        sub.problems[name] = f"a second notebook for {a}; graded the first one found"
    else:
        sub.notebooks[a] = data


# --------------------------------------------------------------------------- one student
def _skipped(name: str) -> bool:
    return any(part in name for part in _SKIPPED_NAMES)


def _from_folder(student_id: str, folder: Path, assignments) -> StudentSubmission:
    """A student's notebooks from a folder, any depth; each file read with a bounded read."""
    sub = StudentSubmission(student_id)
    budget = MAX_STUDENT_BYTES
    paths = [p for p in sorted(folder.rglob("*.ipynb"))
             if not _skipped(str(p.relative_to(folder))) and not p.is_symlink() and p.is_file()]
    if len(paths) > MAX_STUDENT_FILES:
        sub.problems[folder.name] = (f"the folder holds {len(paths):,} notebooks (limit {MAX_STUDENT_FILES:,}); "
                                     f"read the first {MAX_STUDENT_FILES:,} in name order")
    for path in paths[:MAX_STUDENT_FILES]:
        size = path.stat().st_size
        if size > MAX_NOTEBOOK_BYTES:
            sub.problems[path.name] = _too_large(size)
            continue
        with path.open("rb") as fh:
            data = fh.read(min(MAX_NOTEBOOK_BYTES, budget) + 1)
        if _over_budget(sub, path.name, len(data), budget):
            break
        budget -= len(data)
        _add(sub, path.name, data, assignments)
    return sub


def _over_budget(sub: StudentSubmission, name: str, size: int, budget: int) -> bool:
    """True (and a problem recorded) when reading `name` went past the student's byte budget;
    a file over MAX_NOTEBOOK_BYTES on its own is left to _add, which names the limit."""
    if size <= budget or size > MAX_NOTEBOOK_BYTES:
        return False
    sub.problems[name] = (f"stopped reading: this student's notebooks add up to more than "
                          f"{_mib(MAX_STUDENT_BYTES)}; clear the outputs and submit again")
    return True


def _from_zip(student_id: str, archive: Path, assignments) -> StudentSubmission:
    """A student's notebooks from a zip, read into memory (nothing is extracted), after checking
    that its directory is small and honest: no zip bombs, no overlapping members."""
    sub = StudentSubmission(student_id)
    try:
        problem = _archive_problem(archive)
        if problem:
            sub.problems[archive.name] = f"zip refused: {problem}; zip only the notebooks, with an ordinary tool"
            return sub
        with zipfile.ZipFile(archive) as zf:
            problem = _members_problem(zf.infolist())
            if problem:
                sub.problems[archive.name] = f"zip refused: {problem}"
                return sub
            _read_members(sub, zf, assignments)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error):
        sub.problems[archive.name] = "not a readable zip file"
    return sub


def _archive_problem(archive: Path) -> str | None:
    """Why a zip's central directory is too big to list (checked before zipfile parses it)."""
    with archive.open("rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - ZIP_TAIL_BYTES))
        return zip_directory_problem(fh.read(), MAX_STUDENT_FILES)


def _notebook_members(infos: list[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
    return sorted((i for i in infos if not i.is_dir() and i.filename.lower().endswith(".ipynb")
                   and not _skipped(i.filename)), key=lambda i: i.filename)


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


def _read_members(sub: StudentSubmission, zf: zipfile.ZipFile, assignments) -> None:
    """Read each notebook member with a bounded read: the sizes in the directory are not trusted."""
    budget = MAX_STUDENT_BYTES
    for info in _notebook_members(zf.infolist()):
        problem = _member_problem(info)
        if problem:
            sub.problems[info.filename] = problem
            continue
        try:
            with zf.open(info) as fh:
                data = fh.read(min(MAX_NOTEBOOK_BYTES, budget) + 1)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError,
                zlib.error) as err:
            sub.problems[info.filename] = f"could not be read from the zip ({type(err).__name__}: {str(err)[:120]})"
            continue
        if _over_budget(sub, info.filename, len(data), budget):
            return
        budget -= len(data)
        _add(sub, info.filename, data, assignments)


# --------------------------------------------------------------------------- the class
def _safe_id(raw: str) -> str:
    """A student id for a folder or zip name: kept when plain, else accents dropped ('Zoé Li' ->
    'Zoe_Li') and any other odd character replaced by '_'."""
    if STUDENT_ID.match(raw):
        return raw
    plain = "".join(c for c in unicodedata.normalize("NFKD", raw) if not unicodedata.combining(c))
    return re.sub(r"[^A-Za-z0-9_.@-]", "_", plain).lstrip("._@-")[:64] or "student"


def _with_suffix(base: str, k: int) -> str:
    suffix = f"-{k}"
    return base[:64 - len(suffix)] + suffix


def _assign_ids(names: list[tuple[str, str]]) -> list[tuple[str, dict[str, str]]]:
    """Distinct student ids for (entry name, raw id) pairs, in order, each with the problems to
    report: a renamed id, or a suffix ('Zoe_Li-2') when an earlier entry already has the id.

    Deterministic: the earlier entry keeps the id. A suffix never takes an id that some entry
    would get on its own (a real 'alice-2/' keeps 'alice-2')."""
    bases = [_safe_id(raw) for _, raw in names]
    reserved = set(bases)
    owners: dict[str, int] = {}  # id -> index of the entry that has it
    result: list[tuple[str, dict[str, str]]] = []
    for (entry, raw), base in zip(names, bases):
        problems: dict[str, str] = {}
        sid = base
        if base in owners:
            k = 2
            while _with_suffix(base, k) in reserved or _with_suffix(base, k) in owners:
                k += 1
            sid = _with_suffix(base, k)
            _, first_problems = result[owners[base]]
            first = names[owners[base]][0]
            problems[entry] = (f"graded as student id {sid!r}, because {first!r} is already graded as {base!r}; "
                               "if both are the same student, merge them and grade again")
            first_problems[entry] = f"another submission, {entry!r}, is graded separately as student id {sid!r}"
        elif sid != raw:
            problems[entry] = f"student id {raw!r} renamed to {sid!r}"
        owners[sid] = len(result)
        result.append((sid, problems))
    return result


def _entries(root: Path) -> list[tuple[Path, str]]:
    """(path, raw student id) of every student folder and zip, in sorted order."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            found.append((entry, entry.name))
        elif entry.suffix.lower() == ".zip":
            found.append((entry, entry.stem))
    return found


def _collect_one(entry: Path, sid: str, assignments) -> StudentSubmission:
    """One student's submission; a failure to read it becomes a problem, never an exception."""
    try:
        if entry.is_dir():
            return _from_folder(sid, entry, assignments)
        return _from_zip(sid, entry, assignments)
    except Exception as err:  # noqa: BLE001 - one student's files never stop the class's collection
        return StudentSubmission(sid, problems={entry.name: f"could not be read ({type(err).__name__}: {str(err)[:200]})"})


def collect(submissions: Path, assignments: dict[str, set[str]]) -> list[StudentSubmission]:
    """Every student's notebooks, keyed by assignment. `assignments` maps name -> grade ids.

    Every folder and zip is graded under an id of its own (collisions get a suffix, reported in
    `problems`); files past the limits above are reported and skipped, never raised."""
    submissions = Path(submissions)
    if not submissions.is_dir():
        raise FileNotFoundError(f"{submissions} is not a folder of submissions (one sub-folder or zip per student)")
    root = submissions / "submitted" if (submissions / "submitted").is_dir() else submissions
    entries = _entries(root)
    students = []
    for (entry, _), (sid, problems) in zip(entries, _assign_ids([(e.name, raw) for e, raw in entries])):
        sub = _collect_one(entry, sid, assignments)
        sub.problems = problems | sub.problems
        students.append(sub)
    return students
