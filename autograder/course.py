"""The course the grader is handed: its folder, its assignments, and nbgrader course directories.

A course folder (found with `CourseFolder.find`, the way git finds its root) holds the reference
notebooks in solutions/; the grader turns them into nbgrader course directories of its own
(`prepare_source_course`), each with a small nbgrader_config.py that loads the shared settings
of this package (`autograder/nbgrader_config.py`) and sets its own root.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from attention_course.paths import CourseNotFound, find_course_root, is_course

__all__ = ["CourseFolder", "CourseNotFound", "assignments", "is_course", "exported_module", "notebook_path",
           "prepare_source_course", "select", "solutions_dir", "tool_env", "write_course_config"]

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


def library_dir() -> Path:
    """The folder of the student-facing library as this Python imports it (a checkout or site-packages)."""
    spec = importlib.util.find_spec("attention_course")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the attention_course library is not installed: `pip install .` in the course folder")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


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


def write_course_config(course: Path, db_url: str | None = None) -> Path:
    """An nbgrader_config.py for a course directory: the shared settings plus its root."""
    course.mkdir(parents=True, exist_ok=True)
    lines = [
        f"exec(open({str(NBGRADER_CONFIG)!r}).read())",
        f"c.CourseDirectory.root = {str(course)!r}",
    ]
    if db_url:
        lines.append(f"c.CourseDirectory.db_url = {db_url!r}")
    path = course / "nbgrader_config.py"
    path.write_text("\n".join(lines) + "\n")
    return path


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
