"""Where a course's files live: its folder is found the way git finds its root.

The library never locates itself from its own `__file__`: a `pip install .` copy lives in
site-packages, far from any course. The course folder is the one given; else `$ATTN_COURSE_ROOT`;
else the nearest folder at or above the current one that holds `solutions/` and
`nbgrader_config.py` (a notebook's kernel starts in its own folder, inside the course).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

ROOT_ENV = "ATTN_COURSE_ROOT"


class CourseNotFound(FileNotFoundError):
    """No course folder at or above the starting folder, and none named by $ATTN_COURSE_ROOT."""


def is_course(folder: Path) -> bool:
    """A course folder holds the reference notebooks (solutions/) and nbgrader's config."""
    return (folder / "solutions").is_dir() and (folder / "nbgrader_config.py").is_file()


def find_course_root(start: str | Path | None = None) -> Path:
    """The nearest course folder at or above `start`; without `start`, $ATTN_COURSE_ROOT when set,
    else the nearest at or above the current folder. CourseNotFound says what to do."""
    if start is None and os.environ.get(ROOT_ENV):
        root = Path(os.environ[ROOT_ENV]).expanduser().resolve()
        if not root.is_dir():  # trusted as named: the grader's sandbox shows only data/ of a course
            raise CourseNotFound(f"${ROOT_ENV} is {root}, which is not a folder: point it at the course "
                                 f"folder (the one holding solutions/ and nbgrader_config.py), or unset it")
        return root
    here = Path(start if start is not None else Path.cwd()).expanduser().resolve()
    for folder in (here, *here.parents):
        if is_course(folder):
            return folder
    raise CourseNotFound(f"no course folder at or above {here} (one holds solutions/ and nbgrader_config.py): "
                         f"run from inside the course checkout, or set ${ROOT_ENV} to it")


def course_file(*parts: str) -> Path:
    """A path inside the course folder, e.g. course_file("models") or course_file("data", "toy")."""
    return find_course_root().joinpath(*parts)


def lazy_paths(module: str, table: dict[str, Callable[[], Path]]) -> Callable[[str], Path]:
    """A module `__getattr__` serving the names in `table` (e.g. MODELS) as paths of the course found
    when they are asked for. Outside any course, an AttributeError that says why (so hasattr works)."""

    def __getattr__(name: str) -> Path:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        try:
            return table[name]()
        except CourseNotFound as err:
            raise AttributeError(f"{module}.{name} is a path in the course folder, and none was found: {err}") from err

    return __getattr__
