"""Three packages, one direction of imports: course_tools -> autograder -> attention_course.

attention_course is the library learners import: no grader, no tools, no nbgrader, and no path
of the checkout (a course folder is found from the current folder, see attention_course/paths.py).
autograder is the grading engine, handed a course; course_tools ties them together (build, CLI,
demo, bench). Read from the source (every import, also those inside functions) and checked again
by importing the library in a fresh interpreter."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attention_course import paths

from .layout import REPO

PACKAGES = ("attention_course", "autograder", "course_tools")
# what each package may import, of the three (and of nbgrader's family)
ALLOWED = {
    "attention_course": {"attention_course"},
    "autograder": {"attention_course", "autograder"},
    "course_tools": {"attention_course", "autograder", "course_tools"},
}
NOTEBOOK_TOOLS = {"nbgrader", "nbformat", "nbconvert", "nbclient", "jupyter_server"}



def _parsed(path):
    """ast.parse of a source file. CPython 3.11.7 sometimes raises "AST constructor recursion depth mismatch" (a
    SystemError of its own, not the file's) deep in a long-lived test process: parsed again on a fresh thread, whose
    recursion count starts at 0."""
    import threading

    try:
        return ast.parse(path.read_text(), str(path))
    except SystemError:
        box = {}
        worker = threading.Thread(target=lambda: box.setdefault("tree", ast.parse(path.read_text(), str(path))))
        worker.start()
        worker.join()
        return box["tree"]

def imported_roots(package: str) -> dict[str, set[str]]:
    """{module file: top-level names it imports}, relative imports resolved to `package`."""
    found = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names = set()
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add(package if node.level else (node.module or "").split(".")[0])
        found[str(path.relative_to(REPO))] = names
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_go_one_way(package):
    wrong = {module: sorted((names & set(PACKAGES)) - ALLOWED[package])
             for module, names in imported_roots(package).items()}
    wrong = {m: n for m, n in wrong.items() if n}
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}: {wrong}"


def test_the_import_graph_has_no_cycle():
    """Package-level graph from the source: no cycle (the direction test above implies it; this
    one fails on its own if ALLOWED is ever loosened into a loop)."""
    graph = {p: set().union(*imported_roots(p).values()) & set(PACKAGES) - {p} for p in PACKAGES}

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    cycles = [p for p in PACKAGES if reaches(p, p)]
    assert not cycles, f"import cycle through {cycles}: {graph}"


def test_the_library_needs_no_notebook_tooling():
    used = {m: sorted(n & NOTEBOOK_TOOLS) for m, n in imported_roots("attention_course").items() if n & NOTEBOOK_TOOLS}
    assert not used, f"the learners' library must not need nbgrader or notebook tooling: {used}"


def test_the_library_imports_alone_outside_any_course(tmp_path):
    """Every module of attention_course imports in a fresh interpreter started outside any course,
    without pulling in the grader, the tools or nbgrader, and without looking for a course."""
    modules = sorted(p.stem for p in (REPO / "attention_course").glob("*.py") if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module('attention_course.' + m)\n"
            f"bad = sorted(k for k in sys.modules if k.split('.')[0] in {sorted({*PACKAGES[1:], *NOTEBOOK_TOOLS})!r})\n"
            "print(bad)\n")
    env = {k: v for k, v in os.environ.items() if k != paths.ROOT_ENV}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"importing the library loaded {done.stdout.strip()}"


def test_the_course_is_found_like_git_finds_its_root(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ROOT_ENV, raising=False)
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("")
    deep = course / "notebooks" / "06_transformer_translator"
    deep.mkdir(parents=True)
    assert paths.find_course_root(deep) == course.resolve()
    monkeypatch.chdir(deep)
    assert paths.find_course_root() == course.resolve()
    assert paths.course_file("models") == course.resolve() / "models"

    monkeypatch.chdir(tmp_path)
    with pytest.raises(paths.CourseNotFound, match="ATTN_COURSE_ROOT"):
        paths.find_course_root()
    monkeypatch.setenv(paths.ROOT_ENV, str(course))
    assert paths.find_course_root() == course.resolve()
    monkeypatch.setenv(paths.ROOT_ENV, str(tmp_path / "gone"))
    with pytest.raises(paths.CourseNotFound, match="not a folder"):
        paths.find_course_root()


def test_the_library_reads_the_course_it_is_run_in(tmp_path, monkeypatch):
    """The toy corpus and the shipped models come from the course found, not from the checkout
    the library was imported from."""
    from attention_course import checkpoints, data

    monkeypatch.delenv(paths.ROOT_ENV, raising=False)
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("")
    (course / "data" / "toy").mkdir(parents=True)
    for lang, line in (("en", "a dog runs ."), ("de", "ein hund rennt .")):
        (course / "data" / "toy" / f"train.{lang}").write_text(line + "\n")
    monkeypatch.chdir(course)
    assert data.load_toy("train", "en", "de") == [("a dog runs .", "ein hund rennt .")]
    assert data.TOY == course.resolve() / "data" / "toy"
    assert checkpoints.MODELS == course.resolve() / "models"
    assert checkpoints.shipped_models() == []


def test_the_library_imports_nothing_by_name_at_run_time():
    """The direction test reads import statements; a module named in a string (importlib,
    __import__, runpy, pkgutil.resolve_name) would slip past it. The library has no such call,
    and names no grader or tool module anywhere in its code."""
    import re

    dynamic = {"import_module", "__import__", "run_module", "resolve_name", "module_from_spec"}
    named = re.compile(r"^(autograder|course_tools|nbgrader)(\.|$)")
    found = []
    for path in sorted((REPO / "attention_course").rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in dynamic:
                    found.append(f"{path.name}:{node.lineno} calls {name}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and named.match(node.value):
                found.append(f"{path.name}:{node.lineno} names {node.value!r}")
    assert not found, f"the library must not reach the grader or the tools by name: {found}"


# --------------------------------------------------------------------------- inside autograder
# The grader's own modules, in layers: each imports only its own layer or those below it.
# sandbox side: what runs in (or starts) the sandbox and its settings; the judge: the trusted
# checks and verdicts; the class: gradebook, exports, the student's check; nbgrader's adapter on top.
GRADER_LAYERS = [
    {"autograder", "autograder.settings", "autograder.limits", "autograder.channel", "autograder.serialize", "autograder.memwatch",
     "autograder.timings", "autograder.syntax_trees", "autograder.keyrings", "autograder.printable",
     "autograder.runner", "autograder.forkserver", "autograder.sandbox", "autograder.checks", "autograder.folder_lock"},
    {"autograder.outcomes", "autograder.outputs", "autograder.honesty", "autograder.course",
     "autograder.trusted", "autograder.submissions", "autograder.exports", "autograder.lateness",
     "autograder.warm_sandbox"},
    {"autograder.grade", "autograder.report", "autograder.selfcheck", "autograder.lms"},
    {"autograder.cluster", "autograder.removal", "autograder.extensions"},  # above grade and lms (Dask workers; taking
    # students out; a student's extension)
    {"autograder.plugins", "autograder.nbgrader_config", "autograder.nbgrader_grading_config",
     "autograder.exchange"},
]


def _layer_of(module: str) -> int:
    for i, layer in enumerate(GRADER_LAYERS):
        if module in layer or any(module.startswith(m + ".") for m in layer if m != "autograder"):
            return i
    raise AssertionError(f"{module} is in no layer of GRADER_LAYERS: place it there")


def grader_imports() -> dict[str, set[str]]:
    """{autograder module: the autograder modules it imports}, imports inside functions included."""
    graph = {}
    for path in sorted((REPO / "autograder").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module.rsplit(".", 1)[0] if parts[-1] != "__init__" else module
        names = set()
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.startswith("autograder")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                if base.startswith("autograder"):
                    names.add(base)
                    names |= {f"{base}.{a.name}" for a in node.names
                              if (REPO / Path(*f"{base}.{a.name}".split("."))).with_suffix(".py").exists()}
        graph[module] = {n for n in names if n != module}
    return graph


def test_grader_modules_import_downwards_only():
    """No autograder module imports one of a higher layer (so no cycle, lazy imports included):
    grade -> selfcheck -> trusted -> plugins -> grade was one."""
    wrong = [f"{m} (layer {_layer_of(m)}) imports {n} (layer {_layer_of(n)})"
             for m, names in grader_imports().items() for n in sorted(names) if _layer_of(n) > _layer_of(m)]
    assert not wrong, "\n".join(wrong)


def test_grader_modules_have_no_cycle():
    graph = grader_imports()

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(n == goal or (n not in seen and n in graph and reaches(n, goal, seen | {n}))
                   for n in graph.get(start, ()))

    cycles = [m for m in graph if reaches(m, m)]
    assert not cycles, f"import cycles through {cycles}"
