"""Run as a script (`make venv` does), it copies itself into the running Python's site-packages as
`sitecustomize.py`, which Python imports when any process of that environment starts (the grader,
its sandboxes, nbgrader, Jupyter).

It makes one import lazy: rfc3987-syntax, which jsonschema imports (when installed) to check the
"iri" format, compiles three Lark grammars at import, 0.8 s in every process that imports nbformat,
and nearly none of them ever checks an IRI. Here `rfc3987_syntax` is a stand-in whose
`is_valid_syntax` imports the real package the first time it is called, so a check of that format
gives what it always gave. Only the standard library is used: this runs before anything else.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

LAZY = "rfc3987_syntax"


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


if __name__ == "__main__":
    install()
elif not any(isinstance(finder, _LazyFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _LazyFinder())
