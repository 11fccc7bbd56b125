"""The course the grader is handed: its folder, its assignments, and nbgrader course directories.

A course folder (found with `CourseFolder.find`, the way git finds its root) holds the reference
notebooks in solutions/; the grader turns them into nbgrader course directories of its own
(`prepare_source_course`), each with a small nbgrader_config.py that loads the shared settings
of this package (`autograder/nbgrader_config.py`) and sets its own root.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import nbformat
from filelock import FileLock

from attention_course.paths import CourseNotFound, find_course_root, is_course

__all__ = ["CourseFolder", "CourseNotFound", "assignments", "is_course", "exported_module", "notebook_path",
           "prepare_grading_course", "prepare_source_course", "select", "settle_course_config", "solutions_dir", "tool_env",
           "write_course_config"]

NBGRADER_CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"  # this package's shared settings
EXPORT = "#| export"
DEFAULT_EXP = "#| default_exp"
SOLUTION_DELIMITERS = ("### BEGIN SOLUTION", "### END SOLUTION")
PRIVATE = ("solutions", ".git", "tests", "build", "autograder", "course_tools")  # never seen by student code


@dataclass(frozen=True)
class CourseFolder:
    """A course checkout: reference notebooks (solutions/), the student release (notebooks/), data/."""

    root: Path

    @classmethod
    def find(cls, start: str | Path | None = None) -> CourseFolder:
        """The course at or above `start` ($ATTN_COURSE_ROOT or the current folder when None)."""
        return cls(find_course_root(start))

    @property
    def solutions(self) -> Path:
        return self.root / "solutions"

    @property
    def notebooks(self) -> Path:
        return self.root / "notebooks"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def private(self) -> list[Path]:
        """Folders of the course that student code must never see (answers, tests, other gradings)."""
        return [self.root / name for name in PRIVATE]


def package_dir(name: str) -> Path | None:
    """The folder a package is imported from here (a checkout, or site-packages), or None."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def hash_python_sources(h, root: Path) -> None:
    """Feed every .py file under `root` (its path below root, then its bytes) into the hash `h`, in a fixed order:
    what the grader's version and its judging code are fingerprinted from."""
    for path in sorted(Path(root).rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")


def library_dir() -> Path:
    """The folder of the student-facing library as this Python imports it (a checkout or site-packages)."""
    found = package_dir("attention_course")
    if found is None:
        raise ModuleNotFoundError("the attention_course library is not installed: `pip install .` in the course folder")
    return found


def solutions_dir(solutions: str | Path | None = None) -> Path:
    """`solutions` as given, else the solutions/ folder of the course found from the current folder."""
    return Path(solutions) if solutions is not None else CourseFolder.find().solutions


def assignments(root: str | Path | None = None) -> list[str]:
    """Assignment names (folders of solutions/ holding a notebook of the same name), sorted."""
    root = solutions_dir(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no solutions folder at {root}: run from the course folder, "
                                f"or set ATTN_COURSE_ROOT to it")
    return sorted(p.name for p in root.iterdir() if (p / f"{p.name}.ipynb").is_file())


def select(solutions: str | Path | None = None, only: list[str] | None = None) -> list[str]:
    """The assignments in `solutions`, or just those in `only` (an unknown name is an error)."""
    known = assignments(solutions)
    unknown = sorted(set(only or []) - set(known))
    if unknown:
        raise ValueError(f"unknown notebook(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return [a for a in known if only is None or a in only]


def notebook_path(assignment: str, root: str | Path | None = None) -> Path:
    return solutions_dir(root) / assignment / f"{assignment}.ipynb"


def exported_module(nb) -> tuple[str | None, list[str]]:
    """(module named by ``#| default_exp``, the sources of the ``#| export`` cells with the export
    marker and the solution delimiters removed) of a notebook."""
    module, chunks = None, []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = cell.source.splitlines()
        for line in lines:
            if line.startswith(DEFAULT_EXP):
                module = line[len(DEFAULT_EXP):].strip()
        if not any(line.strip() == EXPORT for line in lines):
            continue
        kept = [line for line in lines
                if line.strip() != EXPORT and not line.startswith(DEFAULT_EXP)
                and line.strip() not in SOLUTION_DELIMITERS]
        chunks.append("\n".join(kept).strip("\n"))
    return module, chunks


def reference_module(nb_path: Path) -> str | None:
    """The library module a solution notebook exports (hidden from student code while it is graded)."""
    module, chunks = exported_module(nbformat.read(nb_path, as_version=4))
    return module if chunks else None


@lru_cache(maxsize=256)
def _module_of(nb_path: Path, _mtime: float) -> str | None:
    return reference_module(nb_path)


def modules_from(source: Path, *folders: Path) -> list[str]:
    """The library modules exported by the notebook `source` and by every notebook after it (in
    the course's order) found beside it or in `folders`: none of them may be imported while the
    notebook `source` is graded (they hold this notebook's answers, or later ones built on them)."""
    name = Path(source).parent.name
    paths = {Path(source)}
    for folder in (Path(source).parent.parent, *folders):
        if Path(folder).is_dir():
            paths |= {p / f"{p.name}.ipynb" for p in Path(folder).iterdir()
                      if p.name >= name and (p / f"{p.name}.ipynb").is_file()}
    found = (_module_of(p, p.stat().st_mtime) for p in sorted(paths, key=lambda p: p.parent.name))
    return list(dict.fromkeys(m for m in found if m))


# --------------------------------------------------------------------------- nbgrader
def bin_dir() -> str:
    return str(Path(sys.executable).parent)


def tool_env(extra: dict | None = None) -> dict:
    """Environment for nbgrader subprocesses: this venv's bin first (nbgrader shells out to `alembic`)."""
    env = dict(os.environ)
    env["PATH"] = bin_dir() + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONHASHSEED", "0")
    env.update(extra or {})
    return env


def _config_lines(course: Path, db_url: str | None = None) -> list[str]:
    """The lines of a course's nbgrader_config.py that say where things are: the shared settings, its root, its
    gradebook, and its folders: nbgrader also reads the nbgrader_config.py of the folder it is started in, and the
    course checkout's keeps its folders under build/nbgrader/ (`nbgrader release_feedback ...
    --CourseDirectory.root=build/grading/course`, typed in the checkout as the README says, released nothing)."""
    place = _place_lines(course, db_url)
    return [*place[:2], *_FOLDER_SETTINGS, *place[2:]]


def _place_lines(course: Path, db_url: str | None) -> list[str]:
    """The lines naming the shared settings, the root and the gradebook (rewritten when a folder moves)."""
    lines = [f"exec(open({str(NBGRADER_CONFIG)!r}).read())", f"c.CourseDirectory.root = {str(course)!r}"]
    return lines + ([f"c.CourseDirectory.db_url = {db_url!r}"] if db_url else [])


COURSE_FOLDERS = ("source", "release", "submitted", "autograded", "feedback")  # nbgrader's own names, in a course
_FOLDER_SETTINGS = tuple(f"c.CourseDirectory.{kind}_directory = {kind!r}" for kind in COURSE_FOLDERS)


def write_course_config(course: Path, db_url: str | None = None) -> Path:
    """An nbgrader_config.py for a course directory: the shared settings plus its root."""
    course.mkdir(parents=True, exist_ok=True)
    path = course / "nbgrader_config.py"
    path.write_text("\n".join(_config_lines(course, db_url)) + "\n")
    return path


class CourseMoved(ValueError):
    """A grading course whose nbgrader settings cannot be pointed at its new place: the message says why."""


_PLACE_LINES = ("exec(open(", "c.CourseDirectory.root =", "c.CourseDirectory.db_url =")


def settle_course_config(course: Path, db_url: str) -> str | None:
    """Point a grading course's nbgrader_config.py at where it is now (its root and gradebook), when it
    names another place: a grading folder copied or moved (`cp -a OUT OUT2`) would otherwise grade into
    the old one. Returns the old root when the file was rewritten, None when it already named this place;
    CourseMoved when the file is missing or not the one `write_course_config` made."""
    config = Path(course) / "nbgrader_config.py"
    try:
        lines = config.read_text().splitlines()
    except OSError as err:
        raise CourseMoved(f"{config} cannot be read ({err.strerror}): this grading folder cannot be used here; "
                          f"grade the class into a new folder") from None
    mine = _place_lines(Path(course), db_url)
    old_root = next((line.split("=", 1)[1].strip() for line in lines if line.startswith(_PLACE_LINES[1])), None)
    if old_root is None or not lines or not lines[0].startswith(_PLACE_LINES[0]):
        raise CourseMoved(f"{config} does not name its course root as `attn-course grade` writes it, so it cannot "
                          f"be pointed at {course}: grade the class into a new folder")
    # a folder setting the file has (an instructor's own, say) is kept; one it lacks (a grading folder made before
    # they were written) is added
    folders = [line for line in _FOLDER_SETTINGS if not any(old.startswith(line.split("=")[0]) for old in lines)]
    if [line for line in lines if line.startswith(_PLACE_LINES)] == mine and not folders:
        return None
    rest = [line for line in lines if not line.startswith(_PLACE_LINES)]
    tmp = config.with_suffix(".tmp")
    tmp.write_text("\n".join([*mine[:2], *folders, *mine[2:], *rest]) + "\n")
    os.replace(tmp, config)
    return old_root.strip("'\"")


def nbgrader(course: Path, *args: str, timeout: float | None = None, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run `nbgrader ARGS` in a course directory (its own process)."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    result = subprocess.run(cmd, cwd=course, env=tool_env(env), capture_output=True, text=True,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed (exit {result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def prepare_source_course(course: Path, solutions: str | Path | None = None, db_url: str | None = None,
                          only: list[str] | None = None) -> list[str]:
    """Copy solutions/ into `course/source` and generate the release (which fills the gradebook)."""
    solutions = solutions_dir(solutions)
    names = select(solutions, only)
    write_course_config(course, db_url)
    for a in names:
        target = course / "source" / a
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        shutil.copy2(notebook_path(a, solutions), target / f"{a}.ipynb")
        nbgrader(course, "generate_assignment", a, "--force")
    return names


# --------------------------------------------------------------------------- prepared courses, reused
READY = "ready"  # written last in a prepared entry: its presence means the entry is complete
KEEP_UNUSED_SECONDS = 30 * 24 * 3600  # entries nobody used for this long are removed


def cache_home() -> Path:
    """The grader's caches: $XDG_CACHE_HOME/attention-course, else ~/.cache/attention-course."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser().resolve() / "attention-course"


CACHE_ENV = "ATTN_CHECK_CACHE"  # where `attn-course check` keeps prepared assignments (default: ~/.cache/attention-course/check)


def cache_root() -> Path:
    """$ATTN_CHECK_CACHE, else $XDG_CACHE_HOME/attention-course/check, else ~/.cache/attention-course/check."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().resolve()
    return cache_home() / "check"


def prepared_courses_dir() -> Path:
    """Where prepared grading courses are kept (courses/ in `cache_home`). They hold the reference
    notebooks: student code never sees this folder (the sandbox hides it)."""
    return cache_home() / "courses"


def _entry_key(notebooks: dict[str, bytes]) -> str:
    """Everything generate_assignment's output depends on: the notebooks, the versions of nbgrader
    and of the notebook libraries under it, and the shared settings it runs with."""
    from importlib.metadata import version

    tools = " ".join(f"{p} {version(p)}" for p in ("nbgrader", "nbconvert", "nbformat"))
    digest = hashlib.sha256(f"{tools}\n".encode())
    digest.update(NBGRADER_CONFIG.read_bytes())
    for name, data in notebooks.items():
        digest.update(f"\n{name} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()[:32]


def _private_to_me(root: Path) -> bool:
    """The cache is used only where nobody else can write: owned by this user, no group/other write."""
    info = root.stat()
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _remove(entry: Path) -> None:
    """Out of the way first (renamed, so no reader finds half an entry), then deleted."""
    trash = entry.with_name(f".trash-{entry.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        entry.rename(trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _prune(root: Path, keep: Path) -> None:
    for entry in root.iterdir():
        try:
            if entry != keep and time.time() - entry.stat().st_mtime > KEEP_UNUSED_SECONDS:
                entry.unlink() if entry.is_file() else _remove(entry)  # a lock file, or an entry
        except OSError:
            pass


def _prepared_entry(solutions: Path, names: list[str]) -> Path:
    """The cached result of prepare_source_course for these notebooks: made once (in a folder
    aside, from the very bytes the key was computed from, then renamed into place, so a half-made
    entry is never used). OSError where the cache cannot be used."""
    notebooks = {name: notebook_path(name, solutions).read_bytes() for name in names}
    root = prepared_courses_dir()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not _private_to_me(root):
        raise PermissionError(f"{root} is writable by others: not used")
    entry = root / _entry_key(notebooks)
    if (entry / READY).is_file():
        os.utime(entry)  # in use
        return entry
    with FileLock(root / f".lock-{entry.name}"):  # another process making this entry: wait for it, then use it
        if (entry / READY).is_file():
            return entry
        return _make_entry(root, entry, notebooks, names)


def _make_entry(root: Path, entry: Path, notebooks: dict[str, bytes], names: list[str]) -> Path:
    """generate_assignment run once, in a folder aside, on a copy of the hashed notebooks."""
    staging = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        copied = staging / "solutions"
        for name, data in notebooks.items():
            (copied / name).mkdir(parents=True)
            (copied / name / f"{name}.ipynb").write_bytes(data)
        prepare_source_course(staging / "course", copied, f"sqlite:///{staging / 'gradebook.db'}", names)
        (staging / READY).write_text("\n".join(names) + "\n")
        if entry.exists() and not (entry / READY).is_file():
            _remove(entry)  # a broken entry (no READY): replaced
        try:
            staging.rename(entry)
        except OSError:  # another process made it first: theirs is as good
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _prune(root, entry)
    return entry


def prepare_grading_course(course: Path, db_path: Path, solutions: str | Path | None = None,
                           only: list[str] | None = None) -> list[str]:
    """`prepare_source_course` for a new grading folder, reused: the source, the release and the
    gradebook that generate_assignment makes for these exact notebooks are kept (see
    `prepared_courses_dir`) and copied, so a second grading folder costs a copy, not an nbgrader
    run per notebook. A gradebook that exists already is never replaced (it may hold grades):
    then, or where the cache cannot be written, nbgrader runs as before."""
    solutions = solutions_dir(solutions)
    names = select(solutions, only)
    db_url = f"sqlite:///{db_path}"
    if Path(db_path).exists():
        return prepare_source_course(course, solutions, db_url, names)
    entry = None
    try:
        entry = _prepared_entry(solutions, names)
        write_course_config(course, db_url)
        for name in names:
            for part in ("source", "release"):
                target = course / part / name
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(entry / "course" / part / name, target)
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry / "gradebook.db", db_path)
    except OSError:  # no usable cache, or a damaged entry: nbgrader prepares this folder itself
        if entry is not None:
            _remove(entry)
        Path(db_path).unlink(missing_ok=True)
        return prepare_source_course(course, solutions, db_url, names)
    return names
