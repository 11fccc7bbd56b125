"""Grading for "Attention, step by step": the engine. Handed a course (``course.CourseFolder``),
it runs student code in the sandbox, judges the returned values outside it with the checks that
compare student code with the reference, and keeps the grades in nbgrader's gradebook. It imports
the learners' library (for the reference), never the tools (``course_tools``)."""

import sys as _sys
from importlib.abc import MetaPathFinder as _MetaPathFinder
from importlib.util import spec_from_file_location as _spec_from_file_location
from pathlib import Path as _Path

LIBRARY = _Path(__file__).resolve().parent.parent / "attention_course"  # shipped beside this package


class _LibraryBesideTheGrader(_MetaPathFinder):
    """Finds `attention_course` beside this package (its checkout, or the install both came in),
    ahead of PYTHONPATH: the reference the checks compare with, and the library the sandbox shows, are
    the ones these checks were written for. A stale copy named on PYTHONPATH once supplied the expected
    values, and an honest student lost the points of every function it disagreed on."""

    def find_spec(self, name, path=None, target=None):
        if name != "attention_course":
            return None  # submodules follow the package's __path__
        return _spec_from_file_location(name, LIBRARY / "__init__.py", submodule_search_locations=[str(LIBRARY)])


def _pin_library() -> None:
    if not (LIBRARY / "__init__.py").is_file() or any(isinstance(f, _LibraryBesideTheGrader) for f in _sys.meta_path):
        return
    loaded = _sys.modules.get("attention_course")
    if loaded is not None and _Path(getattr(loaded, "__file__", "") or "").resolve().parent != LIBRARY:
        for name in [n for n in _sys.modules if n == "attention_course" or n.startswith("attention_course.")]:
            del _sys.modules[name]  # imported from another copy before the grader: imported again from ours
    _sys.meta_path.insert(0, _LibraryBesideTheGrader())


_pin_library()
