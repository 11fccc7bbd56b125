"""A static honesty pass over a whole submission (every code cell), run by the trusted grader.

For each graded exercise it follows the code the exercise's definition reaches (its body and,
transitively, the notebook's top-level functions, classes and variables it names) and reports
what that code may not use: the built-in the exercise re-implements, under any spelling the
syntax tree reveals (attribute, import alias, module-level alias, constant getattr), PyTorch's
private entry points (torch.ops, torch._C), the course's reference module or the grader itself.
Anything that switches off the grader's runtime check is forbidden; anything that cannot be
decided from the source (names built at run time, frames, gc, threads, ...) is flagged for a
human ("review"), never failed. Nothing is run: only the syntax tree is read.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import itertools
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterable, Iterator

from .checks.core import MODEL_LIBRARIES, Advised
from .syntax_trees import in_turn

FORBIDDEN, REVIEW = "forbidden", "review"


@dataclass(frozen=True)
class Rules:
    """What one graded exercise may not use."""

    graded: str  # the graded function/class name, e.g. "scaled_dot_product_attention"
    banned: dict[str, str]  # attribute/function names -> why (student-facing)
    reference_module: str  # e.g. "attention_course.attention": importing it, or names from it, is forbidden


@dataclass(frozen=True)
class Finding:
    """One thing the pass found, with where it is and a sentence saying why it matters."""

    severity: str  # "forbidden" (certain) | "review" (flag for a human)
    exercises: tuple[str, ...]  # graded names it affects; () = not attributable to one exercise
    cell: int  # index into the `cells` passed to scan
    line: int  # 1-based line in that cell
    code: str  # the offending source line, stripped, at most 200 chars
    reason: str


WORK_BUDGET = 1_000_000  # steps of reading one notebook: the course's largest solution takes ~1/50 of it
TOO_COMPLEX = ("the notebook is too complex for the grader's reading (its code took more than the "
               "{limit:,} steps of work the grader gives one notebook): a person should read it")
# Past the budget no exercise of the notebook is counted until a person has read it: padding that only
# spends the budget must not switch the static pass off (the course's largest notebook uses ~1/50 of it).
TOO_COMPLEX_HELD = (TOO_COMPLEX + "; until then none of its exercises is counted (the instructor gives the points "
                    "in formgrader once they have read it)")


@dataclass
class Budget:
    """The work one scan may do, counted in steps (syntax nodes visited, alias bindings looked at, names
    of the dotted paths built), not in seconds: the same notebook takes the same steps on any machine.
    A notebook built to make the pass slow spends it and is left to a person instead of read further."""

    limit: int = WORK_BUDGET
    spent: int = 0
    cell: int = 0  # the code cell being read, named when the budget runs out

    def spend(self, steps: int = 1) -> None:
        """Count `steps`; past the limit the scan stops (TooComplex)."""
        self.spent += steps
        if self.spent > self.limit:
            raise TooComplex(self.cell)


class TooComplex(Exception):
    """The scan's work budget ran out while reading code cell `cell`."""

    def __init__(self, cell: int):
        super().__init__(f"work budget spent in code cell {cell}")
        self.cell = cell


# --------------------------------------------------------------------------- rules
def _banned_names(func: Any) -> set[str]:
    """The names a forbidden callable is reached by: a layer's method by its class, a special method by its own
    name, anything else by its name. A class that is everyone's (torch.Tensor: Tensor.__array__ is numpy's way in)
    or private (_BatchNorm: its forward is not reached by the name `forward` alone) is never banned by name: the
    guard at run time refuses the call itself (an honest isinstance(mask, torch.Tensor), or a LayerNorm's
    super().forward(x), lost their points)."""
    qual = str(getattr(func, "__qualname__", "") or "")
    name = str(getattr(func, "__name__", "") or "")
    owner = qual.split(".")[0] if "." in qual and "<locals>" not in qual else ""
    if owner and hasattr(func, "__code__"):
        if name.startswith("__") and name.endswith("__") and name not in _PROTOCOL:
            return {name}  # Tensor.__array__ -> "__array__"
        if owner.startswith("_") or owner in _EVERYONES:
            return set()
        return {owner}  # nn.MultiheadAttention.forward -> "MultiheadAttention"
    return {name} if name else set()


_EVERYONES = frozenset({"Tensor", "Module", "Parameter"})  # classes every answer names
_PROTOCOL = frozenset({"__init__", "__call__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__",
                       "__getattr__", "__getattribute__"})  # every object has them: reached by the class


def _course_module(exercise: Any) -> str:
    """The course module holding the exercise's reference (markers and grader-side references
    fall back to the module its reference guard protects)."""
    module = str(getattr(exercise.reference, "__module__", "") or "")
    if module.startswith("attention_course"):
        return module
    guarded = [str(getattr(f, "__module__", "")) for f, _ in exercise.forbidden]
    course = [m for m in guarded if m.startswith("attention_course")]
    return max(set(course), key=course.count) if course else module


def rules_for(exercise: Any) -> Rules:
    """Rules from a core.Exercise: its forbidden built-ins by name, plus a library's function of the
    exercise's own name (torch.softmax for `softmax`), and its reference module."""
    banned: dict[str, str] = {}
    for func, why in exercise.forbidden:
        if str(getattr(func, "__module__", "") or "").startswith("attention_course"):
            continue  # the reference guard: covered by reference_module
        if getattr(why, "runtime_only", False):
            continue  # refused by what the call is given (core.OnNumbers), which no name tells
        for name in _banned_names(func):
            banned.setdefault(name, why)
    banned.setdefault(exercise.graded, f"it uses a library's own {exercise.graded}, which this exercise asks "
                                       f"you to write yourself")
    return Rules(exercise.graded, banned, _course_module(exercise))


def rules_for_exercises(exercises: Iterable[Any]) -> list[Rules]:
    """One Rules per graded name (exercises sharing a graded function are merged)."""
    return _merge([rules_for(ex) for ex in exercises])


def _merge(rules: Iterable[Rules]) -> list[Rules]:
    merged: dict[str, Rules] = {}
    for r in rules:
        old = merged.get(r.graded)
        merged[r.graded] = r if old is None else Rules(r.graded, {**r.banned, **old.banned}, old.reference_module)
    return list(merged.values())


# --------------------------------------------------------------------------- messages
_ADVICE = ("remove it and write that part yourself with basic operations (matrix products, sums, exp, "
           "your own softmax), as the exercise describes")
_PRIVATE = ("it calls {path}, a private entry point into PyTorch's C++ kernels: it reaches built-ins without "
            "their public names, so the grader cannot accept it; " + _ADVICE)
_REFERENCE = ("it uses the course's reference implementation ({ref}), which is the answer key; remove that "
              "import and write the exercise yourself")
_REFERENCE_UNUSED = ("it imports the course's reference implementation ({ref}), the answer key, though the graded code "
                     "does not use it (its names are not available while your code is graded); remove that import")
_GRADER = ("it imports the grader's own code ({path}); a submission may not use the grader: remove it and "
           "write the code yourself")
_MODEL_LIBRARY = ("it uses {path}, from Hugging Face's transformers: a library of ready-made models whose "
                  "attention, normalisation layers, masks and losses are what the exercises ask you to write; your "
                  "{graded} reaches it, so it is not yours: remove it and write that part yourself")
_SWITCH_OFF = ("it calls {path}, which switches off the grader's check that your code does not call the "
               "built-ins it re-implements; remove it")
_RAW_THREAD = ("it starts a thread with {path}, which carries none of the grader's check that your code does not "
               "call the built-ins it re-implements (threading.Thread's threads do); compute the result in your "
               "function")
_PRIVATE_TORCH = ("it uses {path}, a private PyTorch function; an instructor will check that it is not a "
                  "built-in this exercise asks you to write (public tensor operations are always fine)")
_REVIEW_NOTE = ("; an instructor will look at it by hand: this finding takes no points by itself (a check your "
                "code failed still does; if your code does not need it, remove it)")
_STAR_ONLY = ("this exercise asks for your own implementation of {graded}, but nothing in your notebook defines "
              "{graded}: the only place it can come from is `{how}`, a library's own {graded} (and where that "
              "library is not installed, nothing named {graded} exists at all); write {graded} yourself in its "
              "answer cell and remove that import")
_UNREADABLE = ("the notebook's kernel (IPython) can run this cell, but the grader cannot read it as Python, "
               "so nothing in it was checked" + _REVIEW_NOTE.replace("if your code does not need it, remove it",
                                                                     "write it as plain Python"))
_DYNAMIC = ("it looks up an attribute whose name is computed at run time ({how}), so the grader cannot tell "
            "what it reaches" + _REVIEW_NOTE.replace("if your code does not need it, remove it", "write the name out"))


# --------------------------------------------------------------------------- IPython syntax
_CODE_MAGICS = {"time", "timeit", "prun", "capture", "debug"}  # their argument / body is Python
# Cell magics whose body the kernel does not run as code (shown in the browser only): nothing to read.
_INERT_CELL_MAGICS = {"html", "markdown", "latex", "svg", "javascript", "js"}
# Everything else on a cell's first `%%` line (bash, sh, script, python3, perl, a name made by %alias_magic
# or a student's own register_cell_magic, ...) runs its body where the grader cannot read it: reviewed.
_SHELL_MAGICS = {"sx", "system", "bash", "sh", "script"}  # line magics that run a shell, like `!`
# Line magics that change how IPython reads later cells or makes new magics: what those cells run is not
# what they say (autocall turns `exec "..."` into exec("..."); %alias_magic t time makes %%t a %%time)
_READING_MAGICS = {
    "autocall": "it switches on IPython's autocall, which runs a later line like `f x` as `f(x)`, so the grader "
                "cannot read what those cells run",
    "config": "it changes the kernel's settings (%config), which can change how IPython reads and runs later "
              "cells",
    "alias_magic": "it makes a new name for a magic (%alias_magic), so later cells that use it cannot be read "
                   "by the grader",
    "alias": "it makes a shell command into a magic (%alias), which runs a program the grader cannot read",
}
_INERT_CONFIG = re.compile(r"^\s*InlineBackend\.\w+\s*=")  # %config InlineBackend.figure_format = 'retina'
_MAGIC = re.compile(r"^(\s*)(%{1,2}|!)\s*(\w*)(.*)$")
_ASSIGNED_MAGIC = re.compile(r"^(\s*)([\w\s,()\[\].*]+?)\s*=\s*[%!].*$")
_HELP = re.compile(r"^(\s*)\?*[\w.\[\]()]+\?{1,2}\s*$|^(\s*)\?{1,2}[\w.]+\s*$")


def _neutralise(source: str) -> tuple[str | None, list[str]]:
    """Python source with IPython syntax blanked line by line (line numbers kept), or None when the
    cell is not Python (%%bash, %%html, ...); plus the magics that run or write code elsewhere."""
    lines, notes = source.split("\n"), []
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        name = _MAGIC.match(lines[first]).group(3)
        if name in ("writefile", "file"):
            return None, ["%%" + name]
        if name in _INERT_CELL_MAGICS:
            return None, []
        if name not in _CODE_MAGICS:
            return None, ["%%" + name]
        # %%timeit's first line (after its options) is setup code, run once before the body
        lines[first] = _strip_options(_MAGIC.match(lines[first]).group(4)) if name == "timeit" else ""
    out = []
    for ln in lines:
        m = _MAGIC.match(ln)
        if m and not (m.group(2) == "%" and not m.group(3)):
            indent, kind, name, rest = m.groups()
            if kind.startswith("%") and name in _CODE_MAGICS and rest.strip():
                out.append(indent + _strip_options(rest))
                continue
            if kind.startswith("%") and name in ("run", "load", "writefile", "file"):
                notes.append("%" + name)
            elif (kind == "!" or (kind == "%" and name in _SHELL_MAGICS)) and \
                    not _reads_only(rest if kind == "%" else name + rest):
                notes.append("!" if kind == "!" else "%" + name)
            elif kind == "%" and name in _READING_MAGICS and not (name == "config" and _INERT_CONFIG.match(rest)):
                notes.append("%" + name)
            out.append(indent + "pass")
        elif _ASSIGNED_MAGIC.match(ln):
            m2 = _ASSIGNED_MAGIC.match(ln)
            shell = re.search(r"=\s*(?:!|%\s*(?:sx|system)\b)(.*)$", ln)  # `files = !ls`: a shell command
            if shell and not _reads_only(shell.group(1)):
                notes.append("!")
            out.append(f"{m2.group(1)}{m2.group(2)} = None")
        elif _HELP.match(ln):
            out.append(re.match(r"^\s*", ln).group(0) + "pass")
        else:
            out.append(ln)
    return "\n".join(out), notes


# Shell commands that only look (`!ls`, `!nvidia-smi`, `!pip list`): no finding. Any other shell line, and
# every %%bash / %%sh / %%script cell, is left to a person: a shell can write a Python file the notebook then
# imports (or one that shadows an installed module in the working folder), which no scan can read.
_LOOKING = {"ls", "pwd", "nvidia-smi", "nproc", "free", "df", "du", "uname", "whoami", "date", "which", "wc",
            "head", "tail", "cat", "echo", "hostname", "lscpu", "env", "printenv", "tree", "file", "stat"}
_LOOKING_PIP = re.compile(r"^(pip3?|python3?\s+-m\s+pip)\s+(list|show|freeze|--version)\b")
# `!pip install sacrebleu` (Colab users add such cells): packages by name from the index, nothing the notebook
# wrote (no path, URL or requirements file); it writes no module of the notebook's own, so no finding.
_PIP_INSTALL_NAMES = re.compile(r"^(pip3?|python3?\s+-m\s+pip)\s+install"
                                r"(\s+(-q+|-U|--quiet|--upgrade|--user|--no-deps|--no-cache-dir))*"
                                r"(\s+[A-Za-z0-9][A-Za-z0-9_.\-]*(\[[A-Za-z0-9_,\-]+\])?(==[A-Za-z0-9_.]+)?)+$")


# after a pipe: they read what comes in and write nothing (not sort or uniq: `sort -o F` and `uniq IN OUT` write)
_FILTERS = {"head", "tail", "grep", "wc", "cut"}


def _reads_only(command: str) -> bool:
    """Whether a shell line only reads: a command from _LOOKING (or pip list/show/freeze), perhaps piped into
    filters that only read (`!pip list | grep torch`, `!nvidia-smi | head`), with no redirection, chaining,
    substitution or Python variable expansion. `env` only bare: with arguments it runs a command of its own."""
    command = command.strip()
    if not command or "||" in command or re.search(r"[>;&`$<{]", command):
        return False
    first, *filters = [stage.strip() for stage in command.split("|")]
    if not first or not all(stage and stage.split()[0] in _FILTERS for stage in filters):
        return False
    if filters and _PIP_INSTALL_NAMES.match(first):
        return False
    name = first.split()[0]
    looking = name in _LOOKING and (name != "env" or first == name)
    return looking or bool(_LOOKING_PIP.match(first) or _PIP_INSTALL_NAMES.match(first))


def _strip_options(rest: str) -> str:
    """A code magic's argument without its leading options (`-n1 -r 3 f(x)` -> `f(x)`)."""
    return re.sub(r"^\s*(-\w+(\s+\d+)?\s+)*", "", rest).strip()


def _parse(source: str) -> tuple[ast.Module | None, list[str]]:
    """The cell's syntax tree read as IPython will run it, or None when it is not Python (%%bash, ...)
    or does not compile even after IPython's transformations (a plain syntax error: it fails when run)."""
    reading = _read(source)
    return reading.tree, reading.notes


@dataclass(frozen=True)
class _Reading:
    """How the pass reads one cell: its tree (None: nothing to read), the magics that run code elsewhere,
    and whether IPython can run it though the pass could not read it (left to a person)."""

    tree: ast.Module | None
    notes: list[str]
    unreadable: bool = False
    broken: bool = False  # Python, but no reading parses (a syntax error, or a line only autocall runs)


def _read(source: str, budget: Budget | None = None) -> _Reading:
    """The first of the cell's readings that parses: as written, with IPython syntax blanked, then as
    IPython's input transformations leave it (prompts and a common indent stripped, escapes expanded).
    IPython's transformations are paid for from `budget` (TooComplex past it); without one, a cell they
    would take too long over is left unread (IPython may run it: a person reads it)."""
    notes: list[str] = []
    try:
        for text in _readings(source, notes, budget):
            if text is None:
                return _Reading(None, notes)
            try:
                return _Reading(in_turn(ast.parse, text), notes)
            except SyntaxError:
                continue
            except (ValueError, RecursionError, MemoryError):
                return _Reading(None, notes, unreadable=_ipython_compiles(source, budget))
    except _TooCostly:
        return _Reading(None, notes, unreadable=True)
    return _Reading(None, notes, broken=True)


# IPython's autocall (prefilter, one-line cells only): `f x` runs as `f(x)`, `f a, b` as `f(a, b)`
_AUTOCALL = re.compile(r"^\s*([A-Za-z_][\w.]*)\s+(?![\s=(\[{,;:+\-*/%<>&|^~!.@])(.+?)\s*$")
_AUTOCALLED = ("with autocall switched on (this notebook does), IPython runs this line as `{call}`, which the "
               "grader cannot otherwise read as Python")


def _autocalled(source: str) -> ast.Module | None:
    """A one-line cell as IPython runs it when autocall is on (`exec "..."` -> exec("...")), None when the
    cell is not such a line or its call does not parse either."""
    text = source.strip()
    m = _AUTOCALL.match(text) if "\n" not in text else None
    if not m:
        return None
    try:
        return in_turn(ast.parse, "\n" * _blank_start(source) + f"{m.group(1)}({m.group(2)})")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _readings(source: str, notes: list[str], budget: Budget | None = None) -> Iterator[str | None]:
    """The cell's candidate Python texts, most literal first (line numbers kept wherever IPython keeps
    them); None when the cell is not Python. Magics that run code elsewhere are added to `notes`."""
    yield source
    yield _noted(_neutralise(source), notes)
    ipython = _ipython()
    if ipython is None:
        return
    text = _noted(_neutralise(_with_blank_start(source, _cleaned(ipython, source))), notes)
    yield text
    if text is not None:
        yield _with_blank_start(source, _transform(ipython, text, budget))
    yield _with_blank_start(source, _transform(ipython, source, budget))
    words = source.strip().split(None, 1)
    if "\n" not in source.strip() and words and words[0] in _line_magics():  # automagic: `time f(x)`
        yield _noted(_neutralise("%" + source.strip()), notes)


def _noted(neutralised: tuple[str | None, list[str]], notes: list[str]) -> str | None:
    """The text of a _neutralise result, its notes added to `notes` once."""
    text, found = neutralised
    notes += [n for n in found if n not in notes]
    return text


def _ipython() -> Any:
    """IPython's input transformer (what InteractiveShell.run_cell reads a cell with), None without IPython."""
    global _TRANSFORMER
    if _TRANSFORMER is None:
        try:
            from IPython.core.inputtransformer2 import TransformerManager
        except ImportError:
            return None
        _TRANSFORMER = TransformerManager()
    return _TRANSFORMER


_TRANSFORMER: Any = None
_LINE_MAGICS: set[str] = set()


def _line_magics() -> set[str]:
    """The names of IPython's own line magics, which a one-line cell runs without its % (automagic)."""
    if not _LINE_MAGICS:
        try:
            from IPython.core import magics
        except ImportError:
            return set()
        for name in dir(magics):  # the package loads its classes lazily
            item = getattr(magics, name, None)
            table = getattr(item, "magics", None)
            if isinstance(item, type) and isinstance(table, dict):
                _LINE_MAGICS.update(table.get("line", ()))
    return _LINE_MAGICS


class _TooCostly(Exception):
    """IPython's transformations of a cell would cost more than a whole notebook's budget (no budget given)."""


# A line IPython's token transformers expand: an escape at its start (! !! % %% ? ?? / , ;), `x = !cmd` or
# `x = %magic`, or help at its end. transform_cell expands one per round and tokenizes the whole cell again
# each round, up to 500 rounds: 495 autocall escapes in a 1.9 MB cell held a grading thread for 11 minutes.
_EXPANDED_LINE = re.compile(r"^[ \t]*[!%?/,;]|=[ \t]*[!%]|\?[ \t]*$", re.M)
_TRANSFORM_ROUNDS = 500  # IPython's TRANSFORM_LOOP_LIMIT


def _transform_steps(text: str) -> int:
    """What IPython's transform_cell of `text` costs, in the budget's steps: one step per 100 characters
    tokenized, the whole cell once per round."""
    rounds = 1 + min(_TRANSFORM_ROUNDS, len(_EXPANDED_LINE.findall(text)))
    return rounds * (len(text) // 100 + 1)


def _transform(ipython: Any, text: str, budget: Budget | None = None) -> str:
    """IPython's transform_cell of `text`, paid for first (see _read); the text itself when IPython cannot
    transform it."""
    steps = _transform_steps(text)
    if budget is not None:
        budget.spend(steps)
    elif steps > WORK_BUDGET:
        raise _TooCostly
    try:
        return ipython.transform_cell(text)
    except Exception:  # noqa: BLE001 - IPython would fail on it too: nothing runs
        return text


def _with_blank_start(source: str, text: str) -> str:
    """IPython's transformed text with the blank lines it dropped from the cell's start put back, so that
    line numbers stay the cell's."""
    return "\n" * (_blank_start(source) - _blank_start(text)) + text


def _blank_start(text: str) -> int:
    """How many blank lines a text starts with."""
    rows = text.split("\n")
    return next((i for i, ln in enumerate(rows) if ln.strip()), 0)


def _cleaned(ipython: Any, source: str) -> str:
    """The cell after IPython's clean-up transformations only (prompts, a common indent), which keep lines."""
    lines = source.splitlines(keepends=True)
    for transform in ipython.cleanup_transforms:
        lines = transform(lines)
    return "".join(lines)


def _ipython_compiles(source: str, budget: Budget | None = None) -> bool:
    """Whether IPython's own reading of the cell parses (it runs) when the pass met an error reading it."""
    ipython = _ipython()
    if ipython is None:
        return True
    text = _transform(ipython, source, budget)  # its cost counted (or refused) outside the catch-all below
    try:
        compile(text, "<cell>", "exec", ast.PyCF_ONLY_AST)
    except SyntaxError:
        return False
    except Exception:  # noqa: BLE001 - too deep or too big for the pass; IPython may still run it
        return True
    return True


def top_level_names(source: str) -> set[str]:
    """The names a cell binds at module level (assignments, imports, def, class, for targets, also inside
    if/try/with blocks), not those local to its functions or comprehensions: what later cells can use."""
    tree, _ = _parse(source)
    if tree is None:
        return set()
    names, declared, _ = _bound_in(tree.body)
    return names | declared


# --------------------------------------------------------------------------- units
@dataclass(eq=False)
class _Unit:
    """A module-level statement (a compound statement's header is its own unit)."""

    cell: int
    node: ast.AST  # where it is (lineno)
    parts: tuple[ast.AST, ...]  # what to walk
    binds: frozenset[str] = frozenset()


def _stores(node: ast.AST | None) -> set[str]:
    """Names a target expression binds."""
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _walrus(parts: Iterable[ast.AST]) -> set[str]:
    """Names bound by := outside nested functions."""
    found = set()
    for part in parts:
        for n in _walk_same_function(part):
            if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
                found.add(n.target.id)
    return found


def _walk_same_function(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk that does not enter nested functions, lambdas or classes."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(child)


def _globals_set(func: ast.AST) -> set[str]:
    """Module-level names a function assigns through `global`."""
    declared = {name for n in ast.walk(func) if isinstance(n, ast.Global) for name in n.names}
    if not declared:
        return set()
    stored = {n.id for n in ast.walk(func) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    stored |= {n.name for n in ast.walk(func) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return declared & stored


def _units(cell: int, body: list[ast.stmt]) -> Iterator[_Unit]:
    """Flatten a cell's module-level statements into units."""
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.While)):
            yield _Unit(cell, stmt, (stmt.test,), frozenset(_walrus([stmt.test])))
            yield from _units(cell, stmt.body)
            yield from _units(cell, stmt.orelse)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            yield _Unit(cell, stmt, (stmt.target, stmt.iter), frozenset(_stores(stmt.target) | _walrus([stmt.iter])))
            yield from _units(cell, stmt.body)
            yield from _units(cell, stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            names = set().union(*(_stores(i.optional_vars) for i in stmt.items))
            yield _Unit(cell, stmt, tuple(stmt.items), frozenset(names | _walrus(stmt.items)))
            yield from _units(cell, stmt.body)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            yield from _units(cell, stmt.body)
            for h in stmt.handlers:
                yield _Unit(cell, h, (h.type,) if h.type else (), frozenset({h.name} if h.name else ()))
                yield from _units(cell, h.body)
            yield from _units(cell, stmt.orelse)
            yield from _units(cell, stmt.finalbody)
        elif isinstance(stmt, ast.Match):
            yield _Unit(cell, stmt, (stmt.subject,), frozenset(_walrus([stmt.subject])))
            for case in stmt.cases:
                caps = {n.name for n in ast.walk(case.pattern) if getattr(n, "name", None)} | \
                       {n.rest for n in ast.walk(case.pattern) if getattr(n, "rest", None)}
                yield _Unit(cell, case.pattern, (case.pattern,) + ((case.guard,) if case.guard else ()), frozenset(caps))
                yield from _units(cell, case.body)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:  # one unit per alias: using one name reaches only its import
                if alias.name == "*":
                    yield _Unit(cell, stmt, (stmt,), frozenset())
                    continue
                bound = alias.asname or alias.name.split(".")[0]
                yield _Unit(cell, stmt, (ast.copy_location(_single_import(stmt, alias), stmt),), frozenset({bound}))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield _Unit(cell, stmt, (stmt,), frozenset({stmt.name} | _globals_set(stmt)))
        else:
            targets = []
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets = [stmt.target]
            names = set().union(set(), *(_stores(t) for t in targets))
            yield _Unit(cell, stmt, (stmt,), frozenset(names | _walrus([stmt])))


def _single_import(stmt: ast.Import | ast.ImportFrom, alias: ast.alias) -> ast.stmt:
    if isinstance(stmt, ast.Import):
        return ast.Import(names=[alias])
    return ast.ImportFrom(module=stmt.module, names=[alias], level=stmt.level)


def _from_module(stmt: ast.ImportFrom) -> str:
    return "." * (stmt.level or 0) + (stmt.module or "")


def _chain(node: ast.AST) -> tuple[ast.AST, list[str]]:
    """`a.b.c` -> (a, ["b", "c"])."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return node, attrs[::-1]


def _root_name(node: ast.AST) -> str | None:
    """The name at the root of an attribute / subscript / call chain (`x` in `x.a[0].b`)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


# --------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class _Fact:
    """Something a unit's code does that a rule may care about."""

    kind: str  # "path" | "attr" | "dynattr" | "review"
    node: ast.AST
    path: str = ""  # "path": the dotted name reached from an import (torch.nn.functional.softmax)
    how: str = ""  # how it is spelled, for messages
    attr: str = ""  # "attr": an attribute looked up on an object that is not a module
    values: tuple[str, ...] | None = None  # "dynattr": the names it can take, None = unknown
    text: str = ""  # "review": the reason
    binding_only: bool = False  # "path" from `import a.b` (binds only `a`): not a use of a.b
    anywhere: bool = False  # "review": matters even outside the exercises' code


_BUILTIN_DYNAMIC = {"getattr", "setattr", "delattr", "hasattr"}
_EXEC = {"exec", "eval", "compile", "__import__", "breakpoint"}
_DUNDERS = {"__dict__", "__globals__", "__code__", "__subclasses__", "__builtins__", "__closure__",
            "__defaults__", "__kwdefaults__", "__getattribute__", "__torch_function__", "__torch_dispatch__",
            "__bases__", "__mro__"}
_FRAMES = {"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "gi_frame", "cr_frame",
           "f_trace"}
_SWITCHES = {"sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
             "threading.setprofile_all_threads", "threading.settrace_all_threads", "_thread.setprofile"}
# raw thread starts: their threads carry no profile hook, so the grader's check of the built-ins is not in them
_RAW_THREAD_STARTS = {"_thread.start_new_thread", "_thread.start_new", "threading._start_new_thread"}
_REVIEW_MODULES = {
    "gc": "it uses gc, which can reach and change the grader's own objects",
    "inspect": "it uses inspect, which can reach the grader's frames and objects",
    "ctypes": "it uses ctypes, which can change the interpreter's memory",
    "importlib": "it imports modules by computed names (importlib)",
    "pydoc.locate": "it looks up an object by a name built at run time (pydoc.locate)",
    "logging.config": "it can look up objects by names built at run time (logging.config's resolvers)",
    # more lookups of an object by a name built at run time (a red team named PyTorch's attention with
    # traitlets' import_item, unseen): IPython's and traitlets' import_item, string formatting's field lookup
    # ('{0.nn.functional}'.format(torch)) and a template engine's attribute lookup
    **{module: f"it looks up an object by a name built at run time ({module})"
       for module in ("traitlets.import_item", "traitlets.utils.importstring", "IPython.utils.importstring",
                      "string.Formatter", "jinja2")},
    "_imp": "it uses _imp, the interpreter's own import machinery (a module made afresh from it is out of the "
            "grader's watch)",
    "_frozen_importlib": "it uses the interpreter's own import machinery (_frozen_importlib)",
    # where imports are looked for: a module the notebook wrote can then shadow or add to what is installed
    **{f"sys.{name}": f"it changes where Python looks for modules (sys.{name}), so an import can load a file "
                      "the notebook wrote, which the grader cannot read"
       for name in ("path", "meta_path", "path_hooks", "path_importer_cache")},
    "site.addsitedir": "it changes where Python looks for modules (site.addsitedir), so an import can load a "
                       "file the notebook wrote, which the grader cannot read",
    "builtins": "it changes Python's built-ins (builtins)",
    "sys.modules": "it changes the table of imported modules (sys.modules)",
    "sys._getframe": "it reads the interpreter's frames (sys._getframe)",
    "sys._current_frames": "it reads the interpreter's frames (sys._current_frames)",
    "sys.monitoring": "it uses sys.monitoring, which can interfere with the grader's checks",
    "torch.overrides": "it uses torch.overrides, which can intercept PyTorch calls (and the grader's check)",
    "torch.utils._python_dispatch": "it uses PyTorch's dispatcher modes, which can intercept PyTorch calls",
    # compiled code: its graph runs where the grader cannot see which of PyTorch's functions it came from
    **{module: f"it compiles or loads compiled PyTorch code ({module}), in which the grader cannot see which "
               "functions run (TorchScript is refused while an exercise is checked)"
       for module in ("torch.jit", "torch.compile", "torch.export", "torch.fx", "torch.package", "torch.compiler")},
    "os.write": "it writes to a raw file descriptor (os.write), which can forge the grader's output",
    "os.dup2": "it redirects file descriptors (os.dup2), which can forge the grader's output",
    "os.fdopen": "it opens a raw file descriptor (os.fdopen), which can forge the grader's output",
    "base64": "it decodes hidden text (base64)",
    "codecs": "it decodes hidden text (codecs)",
    "marshal": "it loads code objects (marshal)",
    # a library file run as a script: the reference's code compiled anew, past the runtime guard's identity check
    "runpy": "it runs a module's file as a script (runpy), which can load the course's answers anew",
    "pkgutil": "it loads modules by computed names (pkgutil)",
    "zipimport": "it imports code from archives (zipimport)",
    "types.FunctionType": "it builds functions from code objects (types.FunctionType)",
    "types.CodeType": "it builds code objects (types.CodeType)",
    "operator.attrgetter": "it looks attributes up by name at run time (operator.attrgetter)",
    "operator.methodcaller": "it calls methods by name at run time (operator.methodcaller)",
    # F9: other routes to a raw descriptor (the grader's results channel is one)
    "os.dup": "it duplicates raw file descriptors (os.dup), which can forge the grader's output",
    "os.pwrite": "it writes to a raw file descriptor (os.pwrite), which can forge the grader's output",
    "os.writev": "it writes to a raw file descriptor (os.writev), which can forge the grader's output",
    "os.sendfile": "it writes to a raw file descriptor (os.sendfile), which can forge the grader's output",
    "os.listdir": "it lists folders, /proc/self/fd among them (the process's descriptors, the grader's channel too)",
    "os.scandir": "it lists folders, /proc/self/fd among them (the process's descriptors, the grader's channel too)",
    "io.FileIO": "it opens raw file descriptors (io.FileIO), which can forge the grader's output",
    "socket.fromfd": "it opens a raw file descriptor as a socket, which can forge the grader's output",
    "fcntl": "it inspects raw file descriptors (fcntl)",
    "mmap": "it maps memory or files directly (mmap)",
    # F6: work done in another process, where the grader's check of the built-ins cannot follow
    "subprocess": "it starts another program (subprocess), which the grader's check cannot follow",
    "pty": "it starts another program (pty), which the grader's check cannot follow",
    **{f"os.{name}": f"it starts another process (os.{name}), which the grader's check cannot follow"
       for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp", "spawnl", "spawnle",
                    "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "execl", "execle",
                    "execlp", "execlpe", "execv", "execve", "execvp", "execvpe")},
    # F8: names resolved at run time by a deserialiser, like a computed getattr or __import__
    **{module: f"it deserialises objects ({module}), which looks functions up by names stored in data "
               "(like a getattr with a computed name)"
       for module in ("pickle", "_pickle", "cloudpickle", "dill", "joblib", "shelve", "copyreg", "jsonpickle",
                      "yaml.load", "yaml.unsafe_load", "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all",
                      "yaml.full_load_all", "yaml.Loader", "yaml.UnsafeLoader", "yaml.FullLoader", "torch.load",
                      "torch.serialization", "numpy.load")},
}
_THREADS = ("threading", "_thread", "multiprocessing", "concurrent.futures", "concurrent", "asyncio.to_thread")
_STAR_SUSPECT = ("torch", "scipy", "sklearn", "tensorflow", "keras", "jax")
_PRIVATE_ENTRY = {"_C", "_VF", "_ops"}


@dataclass
class _Scope:
    node: ast.AST
    kind: str  # "function" | "class" | "comp"
    locals: set[str] = field(default_factory=set)
    globals: set[str] = field(default_factory=set)
    imports: dict[str, list[str]] = field(default_factory=dict)


def _arg_names(args: ast.arguments) -> set[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def _bound_in(body: Iterable[ast.AST]) -> tuple[set[str], set[str], dict[str, list[str]]]:
    """(locals, globals, local imports) of a function or class body, not counting nested scopes."""
    names, declared, imports = set(), set(), defaultdict(list)
    todo = list(body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
            todo.extend(n.decorator_list)
            continue
        if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            names |= {w.target.id for w in ast.walk(n) if isinstance(w, ast.NamedExpr) and isinstance(w.target, ast.Name)}
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            (declared if isinstance(n, ast.Global) else names).update(n.names)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                if a.name == "*":
                    continue
                bound = a.asname or a.name.split(".")[0]
                names.add(bound)
                imports[bound].append(_import_path(n, a))
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.add(n.name)
        todo.extend(ast.iter_child_nodes(n))
    return names - declared, declared, dict(imports)


def _import_path(stmt: ast.AST, alias: ast.alias) -> str:
    """The dotted name an import alias binds: `import a.b` -> a, `import a.b as x` -> a.b, `from a import b` -> a.b."""
    if isinstance(stmt, ast.Import):
        return alias.name if alias.asname else alias.name.split(".")[0]
    return f"{_from_module(stmt)}.{alias.name}"


class _Walker:
    """Walks one unit with Python's scoping rules and records the module-level names it reads
    (to follow the code it reaches) and the facts the rules look at."""

    def __init__(self, notebook: "_Notebook", unit: _Unit):
        self.nb, self.unit = notebook, unit
        self.scopes: list[_Scope] = []
        self.refs: set[str] = set()
        self.facts: list[_Fact] = []
        self.in_annotation = False  # a type hint names a class without calling it

    def run(self) -> "_Walker":
        for part in self.unit.parts:
            self.visit(part)
        return self

    # ---------------------------------------------------------------- names
    def _lookup(self, name: str) -> tuple[str, list[str]]:
        """("local", import paths) or ("global", import paths) for a name read here."""
        innermost = True
        for scope in reversed(self.scopes):
            if scope.kind == "class" and not innermost:
                continue
            innermost = False
            if name in scope.globals:
                break
            if name in scope.locals:
                return "local", scope.imports.get(name, [])
        return "global", self.nb.global_paths(name)

    def _root(self, node: ast.AST) -> tuple[list[str], str]:
        """(import paths, kind) of the object at the root of a chain; kind: module|self|student|other."""
        if isinstance(node, ast.Name):
            where, paths = self._lookup(node.id)
            if paths:
                return paths, "module"
            if node.id in ("self", "cls") and where == "local":
                return [], "self"
            if where == "global" and node.id in self.nb.student_names:
                return [], "student"
            return [], "other"
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "super" and self._lookup("super")[1] == []:
                return [], "self"
            module = self._import_call(node)
            if module:
                return [module], "module"
        return [], "other"

    def _import_call(self, node: ast.Call) -> str | None:
        """The module of `importlib.import_module("m")` / `__import__("m")` with a constant name."""
        if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
            return None
        func = node.func
        if isinstance(func, ast.Name) and func.id == "__import__":
            return node.args[0].value.split(".")[0] if not node.keywords and len(node.args) == 1 else node.args[0].value
        base, attrs = _chain(func)
        paths, _ = self._root(base) if attrs else ([], "")
        if any(f"{p}.{'.'.join(attrs)}" == "importlib.import_module" for p in paths):
            return node.args[0].value
        return None

    # ---------------------------------------------------------------- facts
    def _fact(self, kind: str, node: ast.AST, **kw) -> None:
        self.nb.budget.spend(1 + str(kw.get("path", "")).count("."))
        if not (self.in_annotation and kind in ("path", "attr")):
            self.facts.append(_Fact(kind, node, **kw))

    def _review(self, node: ast.AST, text: str, anywhere: bool = True) -> None:
        self._fact("review", node, text=text, anywhere=anywhere)

    def _use(self, node: ast.AST, base: ast.AST, attrs: list[str], how: str) -> None:
        """Record an attribute chain `base.attrs` (or its getattr spelling)."""
        paths, kind = self._root(base)
        for p in paths:
            self._fact("path", node, path=".".join([p, *attrs]), how=how)
        if kind == "other" and attrs:
            self._fact("attr", node, attr=attrs[0], how=how)
        if kind != "module" and isinstance(base, ast.Name) and base.id == "bytes" and attrs[:1] == ["fromhex"]:
            self._review(node, "it decodes hidden text (bytes.fromhex)")
        if isinstance(base, ast.Constant) and isinstance(base.value, bytes) and attrs[:1] == ["decode"]:
            self._review(node, "it decodes hidden text (a bytes literal's .decode())")
        for a in attrs:
            if a in _DUNDERS:
                self._review(node, f"it uses {a}, which can reach or change the grader's objects")
            elif a in _FRAMES:
                self._review(node, f"it reads interpreter frames ({a})")
            elif a in ("setprofile", "settrace") and kind != "module":
                self._fact("path", node, path=f"sys.{a}", how=how)

    # ---------------------------------------------------------------- visiting
    def visit(self, node: ast.AST | None) -> None:
        if node is None:
            return
        self.nb.budget.spend()
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method:
            method(node)
        else:
            self.generic(node)

    def generic(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        where, _ = self._lookup(node.id)
        if where == "global":
            self.refs.add(node.id)
            if node.id not in self.nb.student_names and not self.nb.global_paths(node.id):
                self._builtin_name(node)

    def _builtin_name(self, node: ast.Name) -> None:
        if node.id in _EXEC:
            self._review(node, f"it runs code built at run time ({node.id})")
        elif node.id == "__builtins__":
            self._review(node, "it changes Python's built-ins (__builtins__)")
        elif node.id in ("globals", "vars", "locals"):
            self._review(node, f"it reads or changes namespaces through {node.id}()", anywhere=node.id == "globals")
        elif node.id == "get_ipython":
            self._review(node, "it drives the notebook's kernel from code (get_ipython)")
        elif node.id == "chr":
            self._review(node, "it builds text from character codes (chr)", anywhere=False)
        elif node.id in _BUILTIN_DYNAMIC:  # not called directly (called directly: _dynamic)
            self._review(node, f"it passes {node.id} around, so the names it looks up cannot be read",
                         anywhere=False)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base, attrs = _chain(node)
        self._use(node, base, attrs, _snippet(node))
        self.visit(base)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and self._lookup("open") == ("global", []) \
                and func.id not in self.nb.student_names and node.args and _writes_python(self, node):
            self._review(node, "it writes a Python file (a module the notebook can then import), whose code the "
                               "grader cannot read")
        if isinstance(func, ast.Name) and func.id in _BUILTIN_DYNAMIC and self._lookup(func.id) == ("global", []) \
                and func.id not in self.nb.student_names and len(node.args) >= 2:
            self._dynamic(node, func.id)
            for child in [*node.args, *node.keywords]:
                self.visit(child)
            return
        module = self._import_call(node)
        if module:
            self._fact("path", node, path=module, how=_snippet(node))
        self.generic(node)

    def _dynamic(self, node: ast.Call, func: str) -> None:
        """getattr(obj, name) and friends: a constant name is an attribute; a computed one is reviewed."""
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            self._use(node, node.args[0], [name.value], _snippet(node))
            return
        if func == "setattr" and _own_numbered_attribute(node):
            return  # setattr(self, f"norm{i}", ...): an attribute of one's own, never a way to anything (a fairness audit)
        values = self._strings(name)  # computed names are reviewed, never failed
        self._fact("dynattr", node, values=None if values is None else tuple(sorted(values)), how=_snippet(node))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._fact("path", node, path=a.name, how=_snippet(node), binding_only=not a.asname and "." in a.name)
            self._not_installed(node, a.name)

    def _not_installed(self, node: ast.AST, module: str) -> None:
        """An import of a top-level module the grader's environment does not have: a file the notebook
        wrote itself (open(...).write, %%bash, !cat > ...), whose code the grader cannot read."""
        top = module.split(".")[0]
        if module == "google.colab" or module.startswith("google.colab."):
            return  # the platform's own module, on Colab (which the course supports), not the notebook's file
        if top and not module.startswith(".") and not _installed(top):
            self._review(node, f"it imports {top}, a module that is not installed where the grader runs (a "
                               f"package the course does not use, or a Python file the notebook wrote itself), so the "
                               f"grader cannot read its code, and code that needs it fails when graded")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _from_module(node)
        self._not_installed(node, module)
        for a in node.names:
            if a.name == "*":
                self._fact("path", node, path=module, how=_snippet(node))
                if module.split(".")[0] in _STAR_SUSPECT:
                    self._review(node, f"it imports every name from {module}, so the grader cannot tell which "
                                       f"names are the library's")
                continue
            self._fact("path", node, path=f"{module}.{a.name}", how=_snippet(node))

    def _function(self, node: ast.AST, args: ast.arguments, body: list[ast.AST]) -> None:
        self.visit_all(args.defaults + [d for d in args.kw_defaults if d])
        local, declared, imports = _bound_in(body)
        self.scopes.append(_Scope(node, "function", local | _arg_names(args), declared, imports))
        self.visit_all(body)
        self.scopes.pop()

    def visit_all(self, nodes: Iterable[ast.AST | None]) -> None:
        for n in nodes:
            self.visit(n)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.visit_all(node.decorator_list)
        every = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        every += [a for a in (node.args.vararg, node.args.kwarg) if a]
        self._annotations([a.annotation for a in every] + [node.returns])
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self._review(node, f"it defines {node.name}, which intercepts PyTorch calls (and the grader's check)")
        self._function(node, node.args, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def _annotations(self, nodes: list[ast.AST | None]) -> None:
        self.in_annotation, before = True, self.in_annotation
        self.visit_all(nodes)
        self.in_annotation = before

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        self._annotations([node.annotation])
        self.visit(node.value)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node, node.args, [node.body])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.visit_all([*node.decorator_list, *node.bases, *node.keywords])
        local, declared, imports = _bound_in(node.body)
        self.scopes.append(_Scope(node, "class", local, declared, imports))
        self.visit_all(node.body)
        self.scopes.pop()

    def _comprehension(self, node: ast.AST, elts: list[ast.AST]) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # evaluated in the enclosing scope
        targets = set().union(*(_stores(g.target) for g in gens))
        self.scopes.append(_Scope(node, "comp", targets))
        for i, g in enumerate(gens):
            if i:
                self.visit(g.iter)
            self.visit_all(g.ifs)
        self.visit_all(elts)
        self.scopes.pop()

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node, [node.key, node.value])

    # ---------------------------------------------------------------- strings
    def _strings(self, node: ast.AST, depth: int = 0) -> set[str] | None:
        """Every value a string expression can take, when the source says (literals, +, f-strings of
        literals, a loop variable over literals), else None."""
        self.nb.budget.spend()
        if depth > 8:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._strings(node.left, depth + 1), self._strings(node.right, depth + 1)
            if left is None or right is None or len(left) * len(right) > 64:
                return None
            return {a + b for a, b in itertools.product(left, right)}
        if isinstance(node, ast.JoinedStr):
            parts = [self._strings(v.value if isinstance(v, ast.FormattedValue) and v.format_spec is None
                                   and v.conversion == -1 else v, depth + 1) for v in node.values]
            if any(p is None for p in parts) or _product_size(parts) > 64:
                return None
            return {"".join(combo) for combo in itertools.product(*parts)}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return self._union([self._strings(e, depth + 1) for e in node.elts])
        if isinstance(node, ast.Name):
            return self._name_strings(node.id, depth + 1)
        return None

    def _union(self, sets: list[set[str] | None]) -> set[str] | None:
        if any(s is None for s in sets):
            return None
        return set().union(*sets)

    def _name_strings(self, name: str, depth: int) -> set[str] | None:
        for scope in reversed(self.scopes):
            if scope.kind == "comp":
                gens = [g for g in scope.node.generators if name in _stores(g.target)]
                if gens:
                    return self._union([self._iter_strings(g.target, g.iter, name, depth) for g in gens])
            elif scope.kind == "function":
                if name in scope.globals:
                    break
                if name in _arg_names(scope.node.args):
                    return None
                if name in scope.locals:
                    body = scope.node.body if isinstance(scope.node.body, list) else [scope.node.body]
                    sites = [n for b in body for n in self._walked(b) if _binds(n, name)]
                    return self._sites_strings(sites, name, depth)
        return self._sites_strings([u.node for u in self.nb.bindings.get(name, [])], name, depth)

    def _walked(self, node: ast.AST) -> Iterator[ast.AST]:
        """_walk_same_function, each node paid for."""
        for n in _walk_same_function(node):
            self.nb.budget.spend()
            yield n

    def _sites_strings(self, sites: list[ast.AST], name: str, depth: int) -> set[str] | None:
        """The values a name takes at the statements that bind it: literal loops and assignments only."""
        found: list[set[str] | None] = []
        for n in sites:
            if isinstance(n, (ast.For, ast.AsyncFor)) and name in _stores(n.target):
                found.append(self._iter_strings(n.target, n.iter, name, depth))
            elif isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                found.append(self._strings(n.value, depth))
            else:
                found.append(None)
        return self._union(found) if found else None

    def _iter_strings(self, target: ast.AST, iterable: ast.AST, name: str, depth: int) -> set[str] | None:
        if isinstance(target, ast.Name) and isinstance(iterable, (ast.Tuple, ast.List, ast.Set)):
            return self._strings(iterable, depth)
        return None


_INSTALLED: dict[str, bool] = {}


def _installed(top: str) -> bool:
    """Whether a top-level module can be imported in the grader's environment (nothing is imported)."""
    if top not in _INSTALLED:
        try:
            found = top in sys.modules or top in sys.builtin_module_names or \
                importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        _INSTALLED[top] = found
    return _INSTALLED[top]


def _writes_python(walker: "_Walker", call: ast.Call) -> bool:
    """`open(<a name ending .py>, <a mode that writes>)`, the name and mode as far as the source says."""
    names = walker._strings(call.args[0])
    mode_node = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    modes = walker._strings(mode_node) if mode_node is not None else {"r"}
    writes = modes is None or any(c in m for m in modes for c in "wax+")
    return writes and names is not None and any(n.rstrip().endswith((".py", ".pth")) for n in names)


def _product_size(parts: list[set[str] | None]) -> int:
    size = 1
    for p in parts:
        size *= len(p or ())
    return size


def _binds(node: ast.AST, name: str) -> bool:
    """True when a statement or expression (not counting what is nested in it) binds `name`."""
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return name in _stores(node.target)
    if isinstance(node, ast.Assign):
        return any(name in _stores(t) for t in node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)):
        return name in _stores(node.target)
    if isinstance(node, ast.withitem):
        return name in _stores(node.optional_vars)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)):
        return node.name == name
    return False


def _snippet(node: ast.AST, limit: int = 100) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - a message detail only
        return ""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------- the notebook
_UNIT_STEPS = 4  # a statement's own bookkeeping (its bindings, walrus targets, mutations), in steps
_CYCLE_PASSES = 2  # how often one alias route may pass a name of a cycle


class _Notebook:
    """Every cell's units, which module-level names each binds, and the code each reaches."""

    def __init__(self, cells: list[str], budget: Budget | None = None):
        self.sources = cells
        self.budget = budget if budget is not None else Budget()
        self.units: list[_Unit] = []
        self.notes: list[tuple[int, str]] = []
        self.unreadable: list[int] = []  # cells IPython runs that the pass could not read
        self.autocalled: list[tuple[int, str]] = []  # one-line cells only autocall runs: (cell, the call)
        readings = []
        for i, source in enumerate(cells):
            self.budget.cell = i
            reading = _read(source, self.budget)
            readings.append(reading)
            self.notes += [(i, n) for n in reading.notes]
            self.unreadable += [i] if reading.unreadable else []
        # autocall switched on anywhere (cells run in any order): a one-line cell that no reading parses
        # but that autocall runs as a call is read as that call, and left to a person
        autocall = any(n in ("%autocall", "%config") for _, n in self.notes)
        for i, reading in enumerate(readings):
            self.budget.cell = i
            tree = reading.tree
            if tree is None and reading.broken and autocall:
                tree = _autocalled(cells[i])
                if tree is not None:
                    self.autocalled.append((i, _snippet(tree.body[0])))
            if tree is not None:
                for unit in _units(i, tree.body):
                    self.budget.spend(_UNIT_STEPS)
                    self.units.append(unit)
        self.bindings: dict[str, list[_Unit]] = defaultdict(list)
        for u in self.units:
            for name in u.binds:
                self.bindings[name].append(u)
        self._paths: dict[str, list[str]] = {}
        self._aliases: dict[str, list[tuple[str | None, str]]] = {}
        self.student_names = {n for n, us in self.bindings.items()
                               if any(not _is_import(u) for u in us)}
        self.walks = {id(u): self._walk(u) for u in self.units}
        self.mutations, self.patches = self._mutations()

    def _walk(self, unit: _Unit) -> _Walker:
        """The unit's walk; code nested too deeply to follow is left for a human."""
        self.budget.cell = unit.cell
        walker = _Walker(self, unit)
        try:
            return walker.run()
        except RecursionError:
            walker.facts.append(_Fact("review", unit.node, text="it is nested too deeply for the grader to read",
                                      anywhere=True))
            return walker

    def global_paths(self, name: str) -> list[str]:
        """Dotted names a module-level name stands for: its imports, and `x = <import>.attr` aliases
        followed to any depth. Each name is resolved once per notebook (see _resolve)."""
        self.budget.spend()
        if name not in self._paths:
            self._resolve(name)
        return self._paths[name]

    def _alias_of(self, name: str) -> list[tuple[str | None, str]]:
        """What each binding of `name` makes it, in order: (None, an import's dotted name) or
        (base name, ".attr" suffix) for `name = base.attr`."""
        if name not in self._aliases:
            found: list[tuple[str | None, str]] = []
            for u in self.bindings.get(name, []):
                self.budget.spend()
                part = u.parts[0] if u.parts else None
                if isinstance(part, (ast.Import, ast.ImportFrom)):
                    found.append((None, _import_path(part, part.names[0])))
                elif isinstance(part, ast.Assign) and len(part.targets) == 1 and isinstance(part.targets[0], ast.Name):
                    base, attrs = _chain(part.value)
                    if isinstance(base, ast.Name) and base.id != name:
                        found.append((base.id, "".join("." + a for a in attrs)))
            self._aliases[name] = found
        return self._aliases[name]

    def _resolve(self, start: str) -> None:
        """Resolve `start` and every unresolved name its aliases lead to, a strongly connected group at a
        time (Tarjan's algorithm, without recursion): a group's bases are resolved before it, so a name
        outside any alias cycle costs one look at each of its bindings, however long the chain."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        at: dict[str, int] = {}  # where each name sits on `stack`
        frames = [(start, 0)]
        while frames:
            name, i = frames.pop()
            if i == 0:
                index[name] = low[name] = len(index)
                at[name] = len(stack)
                stack.append(name)
            child = self._next_unresolved(name, i, index, low)
            if child is not None:
                frames += [(name, child[1]), (child[0], 0)]
                continue
            if low[name] == index[name]:
                group = stack[at[name]:]
                del stack[at[name]:]
                self._settle(group)
            if frames:
                parent = frames[-1][0]
                low[parent] = min(low[parent], low[name])

    def _next_unresolved(self, name: str, i: int, index: dict[str, int],
                         low: dict[str, int]) -> tuple[str, int] | None:
        """(base, where to go on) of `name`'s next alias base not yet visited, from its i-th binding on;
        bases still being resolved (a cycle) lower `name`'s link."""
        aliases = self._alias_of(name)
        while i < len(aliases):
            base, i = aliases[i][0], i + 1
            self.budget.spend()
            if base is None or base in self._paths:
                continue
            if base not in index:
                return base, i
            low[name] = min(low[name], index[base])
        return None

    def _settle(self, group: list[str]) -> None:
        """Record the paths of one group of names whose bases outside the group are resolved."""
        if len(group) == 1:
            name = group[0]
            paths = [tail if base is None else p + tail
                     for base, tail in self._alias_of(name) for p in ([""] if base is None else self._paths[base])]
            self._paths[name] = self._charged(paths)
            return
        members = set(group)
        for name in group:
            self._paths[name] = self._charged(self._cycle_paths(name, members))

    def _cycle_paths(self, name: str, members: set[str]) -> list[str]:
        """A name's paths inside an alias cycle: every alias route from it that passes each name at most
        twice (cells can be run again, so a cycle's attributes can pile up; once around is followed).
        Rare in real code; the budget bounds what a contrived cycle costs."""
        found: list[str] = []
        todo: list[tuple[str, tuple[str, ...], str]] = [(name, (name,), "")]
        while todo:
            here, route, suffix = todo.pop()
            self.budget.spend(len(route))
            for base, tail in self._alias_of(here):
                if base is None:
                    found.append(tail + suffix)
                elif base not in members:
                    found += [p + tail + suffix for p in self._paths[base]]
                elif route.count(base) < _CYCLE_PASSES:
                    todo.append((base, route + (base,), tail + suffix))
        return found

    def _charged(self, paths: list[str]) -> list[str]:
        """`paths` without repeats, each paid for by its length in names."""
        for p in paths:
            self.budget.spend(1 + p.count("."))
        return list(dict.fromkeys(paths))

    def _mutations(self) -> tuple[dict[str, list[_Unit]], list[_Unit]]:
        """Units that change a module-level object in place (`x.a = ...`, `setattr(x, ...)`,
        `x.append(...)`), by that object's name; those that patch an imported module (reached by all)."""
        mutations: dict[str, list[_Unit]] = defaultdict(list)
        patches = []
        for u in self.units:
            for root, is_store in _mutated_roots(u):
                if self.global_paths(root) and root not in self.student_names:
                    if is_store:
                        patches.append(u)
                elif root in self.bindings:
                    mutations[root].append(u)
        return mutations, patches

    def reach(self, graded: str, stops: Iterable[str] = ()) -> dict[int, _Unit]:
        """The units the graded name's code reaches, by id; not through the names in `stops` (the graded
        functions it calls, which their own exercises judge: one refusal, one penalty)."""
        start = self.bindings.get(graded, [])
        if not start:
            return {}
        seen: dict[int, _Unit] = {}
        followed: set[str] = set(stops) - {graded}  # a name's units are queued once, however many units read it
        todo = list(start) + list(self.patches)
        while todo:
            u = todo.pop()
            self.budget.spend()
            if id(u) in seen:
                continue
            seen[id(u)] = u
            for name in self.walks[id(u)].refs - followed:
                followed.add(name)
                todo += self.bindings.get(name, []) + self.mutations.get(name, [])
        return seen


def _is_import(unit: _Unit) -> bool:
    return bool(unit.parts) and isinstance(unit.parts[0], (ast.Import, ast.ImportFrom))


def _mutated_roots(unit: _Unit) -> Iterator[tuple[str, bool]]:
    """(name, is_store) of the module-level objects a unit changes in place."""
    node = unit.node
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    for t in targets:
        for el in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
            if isinstance(el, (ast.Attribute, ast.Subscript)):
                root = _root_name(el)
                if root:
                    yield root, True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        if isinstance(call.func, ast.Name) and call.func.id in ("setattr", "delattr") and call.args:
            root = _root_name(call.args[0])
            if root:
                yield root, True
        elif isinstance(call.func, ast.Attribute):
            root = _root_name(call.func.value)
            if root:
                yield root, False


def _student_attributes(units: list[_Unit]) -> set[str]:
    """Attribute names the exercise's own code defines (methods, class attributes, self.x = ...):
    `obj.name` with one of these may well be the student's own."""
    names = set()
    for u in units:
        for part in u.parts:
            for n in ast.walk(part):
                if isinstance(n, ast.ClassDef):
                    for item in n.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                            names.add(item.name)
                        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                            names |= set().union(*(_stores(t) for t in targets))
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                    names.add(n.attr)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        n.func.attr in ("register_buffer", "register_parameter", "register_module", "add_module") \
                        and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                    names.add(n.args[0].value)
    return names


# --------------------------------------------------------------------------- judging facts
_course_cache: dict[str, str | None] = {}


def _course_origin(path: str) -> str | None:
    """The module that defines the course object `path` names (a re-export resolves to its source)."""
    if path in _course_cache:
        return _course_cache[path]
    parts, origin = path.split("."), None
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except SystemError:  # the interpreter's (another thread's parse), never "not a module": not cached
            raise
        except Exception:  # noqa: BLE001 - not a module (or not importable): try the parent
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        if obj is not None:
            origin = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
        break
    _course_cache[path] = origin
    return origin


def _reference_names(module: str) -> set[str]:
    """Names of the objects the reference module defines itself."""
    try:
        mod = importlib.import_module(module)
    except SystemError:
        raise
    except Exception:  # noqa: BLE001
        return set()
    return {n for n, v in vars(mod).items() if getattr(v, "__module__", None) == module}


def _uses_reference(path: str, ref: str, ref_names: set[str]) -> bool:
    if not ref or not path.startswith("attention_course"):
        return False
    if path == ref or path.startswith(ref + "."):
        return True
    parts = path.split(".")
    if parts[-1] == ref.rsplit(".", 1)[-1] or any(p in ref_names for p in parts):
        origin = _course_origin(path)
        return origin is not None and (origin == ref or origin.startswith(ref + "."))
    return False


def _private_entry(path: str) -> bool:
    parts = path.split(".")
    if parts[0] != "torch":
        return False
    return any(p in _PRIVATE_ENTRY for p in parts) or any(a == "torch" and b == "ops" for a, b in zip(parts, parts[1:], strict=False))


def _private_torch(path: str) -> bool:
    parts = path.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _module_review(path: str) -> str | None:
    for prefix, text in _REVIEW_MODULES.items():
        if path == prefix or path.startswith(prefix + "."):
            return text
    if path.split(".")[0] == "torch" and any(p in ("TorchFunctionMode", "TorchDispatchMode") for p in path.split(".")):
        return "it uses a PyTorch mode that intercepts PyTorch calls (and the grader's check)"
    return None


def _is_thread(path: str) -> bool:
    return any(path == t or path.startswith(t + ".") for t in _THREADS)


@dataclass(frozen=True)
class _Hit:
    severity: str
    exercise: str | None
    cell: int
    line: int
    reason: str


def _reachable_hits(rule: Rules, fact: _Fact, exempt: set[str]) -> Iterator[tuple[str, str]]:
    """(severity, reason) of one fact in code the exercise reaches."""
    if fact.kind == "path" and not fact.binding_only:
        if _private_entry(fact.path):
            yield FORBIDDEN, _PRIVATE.format(path=fact.path)
            return
        if fact.path.split(".")[0] in MODEL_LIBRARIES:
            yield FORBIDDEN, _MODEL_LIBRARY.format(path=fact.path, graded=rule.graded)
            return
        course = fact.path.startswith("attention_course.")  # judged by the reference rule instead
        banned = [] if course else [p for p in fact.path.split(".")[1:] if p in rule.banned]
        if banned:
            yield FORBIDDEN, _with_spelling(rule.banned[banned[0]], fact)
        elif _private_torch(fact.path):
            yield REVIEW, _PRIVATE_TORCH.format(path=fact.path)
    elif fact.kind == "attr" and fact.attr in rule.banned and fact.attr not in exempt:
        yield FORBIDDEN, _with_spelling(rule.banned[fact.attr], fact)
    elif fact.kind == "dynattr":
        suspect = set(rule.banned) | _DUNDERS | _FRAMES | {"setprofile", "settrace"}
        hidden = sorted(set(fact.values or ()) & suspect)
        if fact.values is None:
            yield REVIEW, _DYNAMIC.format(how=f"`{fact.how}`")
        elif hidden:
            why = rule.banned.get(hidden[0], "it can reach or switch off the grader's own objects")
            yield REVIEW, f"it builds the name {hidden[0]!r} at run time (`{fact.how}`): {why}" + _REVIEW_NOTE
    elif fact.kind == "review" and not fact.anywhere:
        yield REVIEW, fact.text + _REVIEW_NOTE


def _own_numbered_attribute(node: ast.Call) -> bool:
    """setattr(self, f"<name>{...}", value): setting an attribute of the object being written, whose name starts with
    a plain word (so never a special one, such as __class__). Setting reaches nothing: what is set is read as code."""
    target, name = node.args[0], node.args[1]
    if not (isinstance(target, ast.Name) and target.id == "self" and isinstance(name, ast.JoinedStr) and name.values):
        return False
    head = name.values[0]
    return isinstance(head, ast.Constant) and isinstance(head.value, str) and re.match(r"[A-Za-z]", head.value) is not None


def _with_spelling(why: str, fact: _Fact) -> str:
    """The exercise's `why`, with how it was spelled when that is not plain, and what to do."""
    how = fact.how
    plain = how.endswith(fact.path.rsplit(".", 1)[-1]) and "getattr" not in how and "import" not in how
    shown = "" if plain or not how else f" (written `{how}`)"
    return f"{why}{shown}" + ("" if isinstance(why, Advised) else f"; {_ADVICE}")


def _canonical(path: str) -> str:
    """`path` with a module reached through another module's attribute written as that module's own name:
    logging.threading.Thread -> threading.Thread, queue.threading._start_new_thread -> threading._start_new_thread
    (the thread rules matched the literal path only). Module dictionaries only, of modules already imported
    here: no attribute hook runs and nothing is imported."""
    import types

    parts = path.split(".")
    obj, canonical = sys.modules.get(parts[0]), None
    for i, part in enumerate(parts[1:], start=1):
        if not isinstance(obj, types.ModuleType):
            break
        obj = vars(obj).get(part)
        name = getattr(obj, "__name__", None) if isinstance(obj, types.ModuleType) else None
        if isinstance(name, str) and name != ".".join(parts[:i + 1]):
            canonical = (name, i + 1)
    return path if canonical is None else ".".join([canonical[0], *parts[canonical[1]:]])


def _anywhere_hits(rules: list[Rules], fact: _Fact, refs: dict[str, tuple[str, set[str]]],
                   reached_by: tuple[str, ...] = ()) -> Iterator[tuple[str, tuple[str, ...] | None, str]]:
    """(severity, exercises or None = by reach, reason) of a fact wherever it is in the notebook."""
    if fact.kind == "path":
        path = _canonical(fact.path)
        top = path.split(".")[0]
        if top == "autograder":
            yield FORBIDDEN, tuple(r.graded for r in rules), _GRADER.format(path=path)
            return
        hit = tuple(r.graded for r in rules if _uses_reference(path, r.reference_module, refs[r.graded][1]))
        if hit:  # forbidden where the answer key is used; an unused import only flagged
            ref = next(r.reference_module for r in rules if r.graded == hit[0])
            used = tuple(g for g in hit if g in reached_by)
            if used:
                yield FORBIDDEN, used, _REFERENCE.format(ref=ref)
            else:
                yield REVIEW, None, _REFERENCE_UNUSED.format(ref=ref) + _REVIEW_NOTE
        if path in _SWITCHES:
            yield FORBIDDEN, tuple(r.graded for r in rules if r.banned), _SWITCH_OFF.format(path=path)
            return
        if path in _RAW_THREAD_STARTS:
            yield FORBIDDEN, tuple(r.graded for r in rules if r.banned), _RAW_THREAD.format(path=path)
            return
        text = _module_review(path)
        if text:
            yield REVIEW, None, text + _REVIEW_NOTE
        elif _is_thread(path):
            yield REVIEW, None, ("it runs code in another thread or process, which the grader's check of the "
                                 "built-ins you call may not follow" + _REVIEW_NOTE)
    elif fact.kind == "review" and fact.anywhere:
        yield REVIEW, None, fact.text + _REVIEW_NOTE


def scan(cells: list[str], rules: list[Rules], budget: Budget | None = None,
         stops: dict[str, Iterable[str]] | None = None) -> list[Finding]:
    """Every finding in a submission: `cells` is every code cell's source in notebook order, `rules`
    the notebook's exercises (rules sharing a graded name are merged). A notebook whose reading spends
    the work `budget` (the grader's, WORK_BUDGET, by default) is flagged for a person instead, and none of
    its exercises counts until then (a finding of every exercise)."""
    budget = budget if budget is not None else Budget()
    try:
        return _scan(cells, _merge(rules), budget, stops or {})
    except TooComplex as err:
        where = (err.cell, 1, _first_line(cells, err.cell))
        return [Finding(FORBIDDEN, (), *where, TOO_COMPLEX_HELD.format(limit=budget.limit)),
                Finding(REVIEW, (), *where, TOO_COMPLEX.format(limit=budget.limit))]


def _first_line(cells: list[str], cell: int) -> str:
    """A cell's first non-blank line, stripped, at most 200 chars (a finding's `code`)."""
    source = cells[cell] if 0 <= cell < len(cells) else ""
    return next((ln.strip()[:200] for ln in source.split("\n") if ln.strip()), "")


def _scan(cells: list[str], rules: list[Rules], budget: Budget, stops: dict[str, Iterable[str]]) -> list[Finding]:
    """scan's work, within `budget` (TooComplex past it)."""
    nb = _Notebook(cells, budget)
    reach = {r.graded: nb.reach(r.graded, stops.get(r.graded, ())) for r in rules}
    refs = {r.graded: (r.reference_module, _reference_names(r.reference_module) if r.reference_module else set())
            for r in rules}
    hits: list[_Hit] = []
    for r in rules:
        exempt = _student_attributes(list(reach[r.graded].values()))
        for u in reach[r.graded].values():
            for fact in nb.walks[id(u)].facts:
                for severity, reason in _reachable_hits(r, fact, exempt):
                    hits.append(_Hit(severity, r.graded, u.cell, _line(fact.node, u), reason))
    for u in nb.units:
        reached_by = tuple(r.graded for r in rules if id(u) in reach[r.graded])
        for fact in nb.walks[id(u)].facts:
            for severity, exercises, reason in _anywhere_hits(rules, fact, refs, reached_by):
                for ex in (exercises if exercises is not None else reached_by) or (None,):
                    hits.append(_Hit(severity, ex, u.cell, _line(fact.node, u), reason))
    for r in rules:  # a graded name the student never binds can only come from a library's star import
        if nb.bindings.get(r.graded):
            continue
        for u in nb.units:
            stmt = u.parts[0] if u.parts else None
            if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names) \
                    and _from_module(stmt).split(".")[0] in _STAR_SUSPECT and _may_export(_from_module(stmt), r.graded):
                hits.append(_Hit(FORBIDDEN, r.graded, u.cell, _line(stmt, u),
                                 _STAR_ONLY.format(graded=r.graded, how=_snippet(stmt))))
    for cell, magic in nb.notes:
        hits.append(_Hit(REVIEW, None, cell, _magic_line(cells[cell], magic), _note_reason(magic) + _REVIEW_NOTE))
    hits += [_Hit(REVIEW, None, cell, 1, _UNREADABLE) for cell in nb.unreadable]
    hits += [_Hit(REVIEW, None, cell, _blank_start(cells[cell]) + 1, _AUTOCALLED.format(call=call) + _REVIEW_NOTE)
             for cell, call in nb.autocalled]
    return _findings(hits, cells)


def _may_export(module: str, name: str) -> bool:
    """Whether `from module import *` may bind `name`. Decided only for a module the grader has already
    imported (nothing a student names is imported here); any other may (scipy.special has a softmax)."""
    loaded = sys.modules.get(module)
    if loaded is None:
        return True
    public = getattr(loaded, "__all__", None)
    return name in public if isinstance(public, (list, tuple)) else (hasattr(loaded, name) and not name.startswith("_"))


def _line(node: ast.AST, unit: _Unit) -> int:
    return getattr(node, "lineno", None) or getattr(unit.node, "lineno", 1) or 1


def _note_reason(magic: str) -> str:
    """Why a magic (or shell line) noted while reading a cell is left to a person."""
    name = magic.lstrip("%!")
    if magic == "!" or (magic.startswith("%") and not magic.startswith("%%") and name in _SHELL_MAGICS):
        return ("it runs a shell command, which can write files (a Python module the notebook then imports, "
                "say) that the grader cannot read")
    if magic.startswith("%%") and magic not in ("%%writefile", "%%file"):
        return (f"it runs this cell with the cell magic {magic}, so the grader cannot read the cell as Python "
                "(only %%time, %%timeit, %%capture, %%prun and %%debug cells, whose body is Python, and display "
                "cells such as %%html or %%markdown are read)")
    if magic.startswith("%") and name in _READING_MAGICS:
        return _READING_MAGICS[name]
    return f"it uses {magic}, which runs or writes code the grader cannot read"


def _magic_line(source: str, magic: str) -> int:
    rows = source.split("\n")
    for i, ln in enumerate(rows, 1):
        if ln.lstrip().startswith(magic):
            return i
    for i, ln in enumerate(rows, 1):  # `files = !ls`, or a one-line automagic without its %
        if magic.lstrip("%") and magic.lstrip("%") in ln:
            return i
    return 1


def _findings(hits: list[_Hit], cells: list[str]) -> list[Finding]:
    """Merge hits at the same place with the same reason; drop reviews a forbidden already covers."""
    grouped: dict[tuple[str, int, int, str], set[str]] = defaultdict(set)
    for h in hits:
        grouped[(h.severity, h.cell, h.line, h.reason)].update([h.exercise] if h.exercise else [])
    forbidden_at: dict[tuple[int, int], set[str]] = defaultdict(set)
    for (severity, cell, line, _), exs in grouped.items():
        if severity == FORBIDDEN:
            forbidden_at[(cell, line)] |= exs
    out, split = [], {}
    for (severity, cell, line, reason), exs in grouped.items():
        if severity == REVIEW and exs and exs <= forbidden_at[(cell, line)]:
            continue
        lines = split[cell] if cell in split else split.setdefault(cell, cells[cell].split("\n"))
        code = lines[line - 1].strip()[:200] if 0 < line <= len(lines) else ""
        out.append(Finding(severity, tuple(sorted(exs)), cell, line, code, reason))
    return sorted(out, key=lambda f: (f.cell, f.line, f.severity, f.reason))
