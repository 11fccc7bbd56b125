"""Run as a script (`make venv` does), it copies itself into the running Python's site-packages as
`sitecustomize.py`, which Python imports when any process of that environment starts (the grader,
its sandboxes, nbgrader, Jupyter).

It makes one import lazy: rfc3987-syntax, which jsonschema imports (when installed) to check the
"iri" format, compiles three Lark grammars at import, 0.8 s in every process that imports nbformat,
and nearly none of them ever checks an IRI. Here `rfc3987_syntax` is a stand-in whose
`is_valid_syntax` imports the real package the first time it is called, so a check of that format
gives what it always gave.

And in the `attn-course` command only, it leaves out of the path (and of the PYTHONPATH its children
inherit) any PYTHONPATH folder holding another copy of the course's packages, with a note on stderr:
the command runs the course this environment was made for. A second, older checkout named on
PYTHONPATH otherwise supplied the whole grader, its references and its notebooks, silently. Only the
standard library is used: this runs before anything else.

And where this environment's `bin` is not on PATH at all (`.venv/bin/nbgrader ...`, not activated), it
puts it first, as activating would: nbgrader finds `alembic` when it makes a gradebook.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

LAZY = "rfc3987_syntax"
COMMAND = "attn-course"  # the console script whose course must be this environment's
COURSE_PACKAGES = ("course_tools", "autograder", "attention_course")


@functools.cache
def _real_module() -> types.ModuleType:
    """The real package, imported once, in place of the stand-in (which stays with those holding it)."""
    stand_in = sys.modules.pop(LAZY, None)
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _LazyFinder)]
    try:
        return importlib.import_module(LAZY)
    except BaseException:
        if stand_in is not None:
            sys.modules[LAZY] = stand_in
        raise


def is_valid_syntax(term: str, value: str) -> bool:
    """rfc3987_syntax.is_valid_syntax, the real one imported on the first call."""
    return _real_module().is_valid_syntax(term, value)


class _StandIn(types.ModuleType):
    """`rfc3987_syntax` until something reads a name jsonschema does not use: then the real one."""

    is_valid_syntax = staticmethod(is_valid_syntax)

    def __getattr__(self, name: str):
        if name.startswith("__"):  # the import system asks for __path__ and the like: not a use
            raise AttributeError(name)
        return getattr(_real_module(), name)


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module) -> None:
        pass


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Answers `import rfc3987_syntax` with the stand-in, where the real package is installed."""

    def find_spec(self, name, path=None, target=None):
        if name != LAZY or importlib.machinery.PathFinder.find_spec(name) is None:
            return None
        return importlib.machinery.ModuleSpec(name, _StandInLoader())


def install() -> None:
    """Copy this file into the running Python's site-packages as sitecustomize.py (`make venv`, Binder)."""
    import shutil
    import sysconfig

    shutil.copyfile(__file__, f"{sysconfig.get_paths()['purelib']}/sitecustomize.py")


def _holds_the_course(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name, "__init__.py")) for name in COURSE_PACKAGES)


def _installed_root(leave_out: set[str]) -> str | None:
    """The folder this environment's own `course_tools` is in (the checkout of an editable install, or
    site-packages), found with the PYTHONPATH copies out of the path; found, not imported."""
    kept = sys.path[:]
    sys.path[:] = [p for p in kept if os.path.realpath(p or ".") not in leave_out]
    try:
        spec = importlib.util.find_spec(COURSE_PACKAGES[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = kept
    origin = spec.origin if spec is not None else None
    return os.path.dirname(os.path.dirname(os.path.realpath(origin))) if origin else None


def leave_other_copies_out(argv: list[str], environ=os.environ, stderr=sys.stderr) -> list[str]:
    """For `attn-course`: PYTHONPATH folders holding another copy of the course are taken off sys.path
    and off PYTHONPATH, and named on stderr. Returns them (none where the install is not found)."""
    if not argv or os.path.basename(argv[0]) != COMMAND:
        return []
    # an empty entry (`PYTHONPATH=$PYTHONPATH:/x` with nothing before) is the current folder to Python: a red team
    # ran the grader from inside an older clone so, and its grader and library graded the class (14/17 for 17/17)
    entries = [e or "." for e in environ.get("PYTHONPATH", "").split(os.pathsep)] \
        if environ.get("PYTHONPATH") else []
    holding = {os.path.realpath(e) for e in entries if _holds_the_course(e)}
    installed = _installed_root(holding) if holding else None
    others = sorted(holding - {installed}) if installed else []
    if others:
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") not in others]
        kept = [e for e in entries if os.path.realpath(e) not in others]
        if kept:
            environ["PYTHONPATH"] = os.pathsep.join(kept)
        else:
            environ.pop("PYTHONPATH", None)
        for other in others:
            print(f"{COMMAND}: PYTHONPATH names another copy of the course, {other}: left out. This command runs "
                  f"the course installed in its environment ({installed}); to run that copy, use an environment "
                  "made for it (`make venv` in its folder).", file=stderr)
    return others


def own_tools_on_path(environ=os.environ) -> bool:
    """Put this environment's `bin` first on PATH where it is not on it at all (a command typed as
    `.venv/bin/nbgrader ...`, the environment not activated): nbgrader shells out to `alembic` when it makes a
    gradebook, and `attn-course` to `jupyter`, which then come from here. Returns whether PATH was changed."""
    own = os.path.join(sys.prefix, "bin")
    entries = environ.get("PATH", os.defpath).split(os.pathsep)  # unset: the search path a process would use
    if sys.prefix == sys.base_prefix or not os.path.isdir(own) or any(
            e and os.path.realpath(e) == os.path.realpath(own) for e in entries):
        return False
    environ["PATH"] = os.pathsep.join([own, *[e for e in entries if e]])
    return True


if __name__ == "__main__":
    install()
else:
    if not any(isinstance(finder, _LazyFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _LazyFinder())
    leave_other_copies_out(getattr(sys, "argv", []))
    own_tools_on_path()
