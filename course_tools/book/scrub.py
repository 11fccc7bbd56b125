"""Turn a solution notebook into a book chapter: every trace of the grader removed.

A solution notebook is an nbgrader source notebook. Before Sphinx sees it, a copy goes through
`scrub_notebook`, which removes

* hidden-test blocks (``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``) and nbgrader's mark
  schemes (``BEGIN MARK SCHEME`` ... ``END MARK SCHEME``);
* the solution markers (``### BEGIN SOLUTION`` / ``### END SOLUTION`` lines in code,
  ``<!-- BEGIN SOLUTION -->`` / ``<!-- END SOLUTION -->`` in markdown), keeping what is between
  them: an exercise cell reads as worked code;
* nbdev-style directives (``#| export``, ``#| default_exp <module>``, any ``#| ...`` line);
* every statement that imports the grader (``from autograder.checks import nb06``) or uses a name
  such an import bound (``nb06.check("make_masks", make_masks)``);
* nbgrader's cell metadata and the grader's cell tags (``grader-skip``);
* widget outputs (tqdm's progress bars): replaced by text (a progress bar's last state, read from
  the widget state saved with the notebook, else the output's own text/plain fallback), and the
  notebook's widget state is dropped, so the page loads no widget manager (nor require.js) from a CDN.

A test cell left empty is dropped. `find_plumbing` says what is left of the grader in a notebook;
the book build refuses to publish a chapter for which it finds anything.
"""
from __future__ import annotations

import ast
import copy
import json
import re

import nbformat

__all__ = ["PLUMBING", "ScrubError", "find_plumbing", "scrub_code", "scrub_markdown", "scrub_notebook"]

GRADER_MODULES = ("autograder", "nbgrader")
GRADER_TAGS = {"grader-skip"}
INSTALL_TAG = "colab-install"  # course_tools.colab.TAG (not imported: the book stands alone)
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

_MARK = r"^\s*(?:#+|//+|%+|<!--|=+)?\s*{what}\s*(?:-->|=+)?\s*$"  # nbgrader's: ### X, <!-- X -->, === X ===
_BLOCKS = [(re.compile(_MARK.format(what=f"BEGIN {name}")), re.compile(_MARK.format(what=f"END {name}")))
           for name in ("HIDDEN TESTS", "MARK SCHEME")]
_MARKERS = re.compile(_MARK.format(what=r"(?:BEGIN|END) SOLUTION"))
_DIRECTIVE = re.compile(r"^\s*#\s*\|")  # nbdev / Quarto cell directives: #| export, #| default_exp x
_GRADER_COMMENT = re.compile(r"^\s*#.*\bautograder\b")  # a comment line about the import

# What must never reach a reader: (name, pattern), searched in every cell's source and outputs
# and in the notebook's metadata.
PLUMBING: list[tuple[str, re.Pattern]] = [
    ("the grader's package", re.compile(r"\bautograder\b")),
    ("nbgrader", re.compile(r"nbgrader", re.I)),
    ("a hidden-test marker", re.compile(r"(?:BEGIN|END) HIDDEN TESTS")),
    ("a solution marker", re.compile(r"(?:BEGIN|END) SOLUTION")),
    ("a mark scheme", re.compile(r"(?:BEGIN|END) MARK SCHEME")),
    ("an export directive", re.compile(r"^\s*#\s*\|", re.M)),
    ("a grade id", re.compile(r"\bgrade_id\b")),
    ("a grader tag", re.compile(r"grader-skip")),
    ("a widget output", re.compile(r"application/vnd\.jupyter\.widget")),
]


class ScrubError(ValueError):
    """A notebook still holds something of the grader after scrubbing."""


# --------------------------------------------------------------------------- lines
def _drop_blocks(lines: list[str]) -> list[str]:
    """Lines without the hidden-test / mark-scheme blocks (markers included). An unclosed block
    runs to the end of the cell, as nbgrader reads it."""
    kept, inside = [], None
    for line in lines:
        if inside is None:
            for begin, end in _BLOCKS:
                if begin.match(line):
                    inside = end
                    break
            else:
                kept.append(line)
        elif inside.match(line):
            inside = None
    return kept


def _drop_markers(lines: list[str]) -> list[str]:
    return [line for line in lines if not _MARKERS.match(line)]


# --------------------------------------------------------------------------- the grader's statements
def _is_grader_module(name: str | None) -> bool:
    return bool(name) and name.split(".")[0] in GRADER_MODULES


def _grader_names(tree: ast.AST) -> set[str]:
    """Names bound by importing the grader anywhere in the cell (`nb06`, `autograder`, ...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if _is_grader_module(a.name)}
        elif isinstance(node, ast.ImportFrom) and _is_grader_module(node.module):
            names |= {a.asname or a.name for a in node.names}
    return names


def _uses_grader(node: ast.AST, names: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Import) and any(_is_grader_module(a.name) for a in sub.names):
            return True
        if isinstance(sub, ast.ImportFrom) and _is_grader_module(sub.module):
            return True
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and re.search(r"\bautograder\b", sub.value):
            return True  # importlib.import_module("autograder.checks")
    return False


def _is_compound(stmt: ast.AST) -> bool:
    return isinstance(getattr(stmt, "body", None), list)


def _grader_lines(stmts: list, names: set[str]) -> tuple[set[int], bool]:
    """(1-based lines to delete, whether every statement of `stmts` goes). A simple statement that
    touches the grader goes whole; a compound one goes whole when its header does or when all of
    its body does, else only the statements inside it that do. A part after the body (`else`,
    `except`, `finally`) is thinned the same way, but never emptied: left whole instead, for
    `find_plumbing` to report, rather than turned into code that does not parse."""
    drop: set[int] = set()
    gone = 0
    for stmt in stmts:
        lines = set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        if not _is_compound(stmt):
            if _uses_grader(stmt, names):
                drop |= lines
                gone += 1
            continue
        header = copy.copy(stmt)
        for part in ("body", "orelse", "finalbody", "handlers"):
            if hasattr(header, part):
                setattr(header, part, [])
        body_drop, body_gone = _grader_lines(stmt.body, names)
        if _uses_grader(header, names) or body_gone:
            drop |= lines
            gone += 1
            continue
        drop |= body_drop
        for part in ("orelse", "finalbody", "handlers"):
            part_drop, part_gone = _grader_lines(getattr(stmt, part, None) or [], names)
            if not part_gone:
                drop |= part_drop
    return drop, bool(stmts) and gone == len(stmts)


def _parseable(source: str) -> str:
    """The cell with IPython's magics and shell lines turned into `pass` (same line numbers)."""
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", line) for line in source.split("\n"))


def _drop_grader_statements(source: str) -> str:
    try:
        tree = ast.parse(_parseable(source))
    except SyntaxError:
        # not Python (a cell magic's body, a sketch): line by line
        names = set()
        for line in source.split("\n"):
            m = re.match(r"\s*from\s+(\S+)\s+import\s+(.+)$", line)
            if m and _is_grader_module(m.group(1)):
                names |= {part.split(" as ")[-1].strip(" ()") for part in m.group(2).split(",")}
        lines = source.split("\n")
        keep = [line for line in lines
                if not re.search(r"\b(?:auto|nb)grader\b", line)
                and not any(re.search(rf"\b{re.escape(n)}\b", line) for n in names if n)]
        return "\n".join(keep)
    names = _grader_names(tree)
    drop, _ = _grader_lines(tree.body, names)
    lines = source.split("\n")
    return "\n".join(line for i, line in enumerate(lines, 1)
                     if i not in drop and not _GRADER_COMMENT.match(line))


# --------------------------------------------------------------------------- cells
def _tidy(lines: list[str]) -> str:
    """Joined, without the blank lines left at the top or the bottom (the rest as written)."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return "\n".join(lines)


def scrub_code(source: str) -> str:
    """A code cell's source as a reader sees it (empty when nothing but the grader was there)."""
    lines = _drop_blocks(source.split("\n"))
    lines = [line for line in _drop_markers(lines) if not _DIRECTIVE.match(line)]
    return _tidy(_drop_grader_statements("\n".join(lines)).split("\n"))


def scrub_markdown(source: str) -> str:
    lines = _drop_markers(_drop_blocks(source.split("\n")))
    return _tidy(lines)


def _widget_text(view: dict, state: dict) -> str | None:
    """A tqdm progress bar's last state as text ('reverse: 100%|##########| 400/400 [...]'), read from
    the widget state saved with the notebook; None for any other widget."""
    import html

    model = state.get(str(view.get("model_id")), {})
    children = [state.get(str(c).removeprefix("IPY_MODEL_"), {}) for c in model.get("state", {}).get("children", [])]
    names = [c.get("model_name") for c in children]
    if model.get("model_name") != "HBoxModel" or len(children) != 3 or names[0] != "HTMLModel" \
            or names[2] != "HTMLModel" or names[1] not in ("FloatProgressModel", "IntProgressModel"):
        return None
    left, bar, right = (c.get("state", {}) for c in children)
    value, top = bar.get("value") or 0, bar.get("max") or 0
    filled = max(0, min(10, round(10 * value / top))) if top else 0
    text = f"{html.unescape(str(left.get('value', '')))}|{'█' * filled}{' ' * (10 - filled)}|{html.unescape(str(right.get('value', '')))}"
    return text.replace("\u2007", " ")


def _scrub_outputs(outputs: list, widget_state: dict) -> list:
    kept = []
    for out in outputs:
        data = out.get("data")
        if data is not None and WIDGET_VIEW in data:
            # the widget's saved last state as text where it is a progress bar, else its text/plain
            # fallback; nothing else of the widget (its model id) stays
            text = _widget_text(data.pop(WIDGET_VIEW), widget_state)
            if text is not None:
                data["text/plain"] = text
            if not data:
                continue
            out.setdefault("metadata", {}).pop(WIDGET_VIEW, None)
        kept.append(out)
    return kept


def _clean_cell_metadata(metadata: dict) -> None:
    """nbgrader's metadata and the grader's tags out of a cell's metadata (in place)."""
    metadata.pop("nbgrader", None)
    tags = [t for t in metadata.get("tags", []) if t not in GRADER_TAGS]
    if tags:
        metadata["tags"] = tags
    else:
        metadata.pop("tags", None)


def _clean_notebook_metadata(metadata: dict) -> None:
    metadata.pop("nbgrader", None)
    metadata.pop("widgets", None)  # ipywidgets' saved state: myst-nb would load a widget manager for it


def scrub_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A scrubbed copy of `nb` (the argument is left alone)."""
    nb = copy.deepcopy(nb)
    widget_state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    cells = []
    for cell in nb.cells:
        if INSTALL_TAG in cell.metadata.get("tags", []):
            continue  # Colab's install cell: the book says how to open a chapter in Colab
        _clean_cell_metadata(cell.metadata)
        if cell.cell_type == "code":
            cell.source = scrub_code(cell.source)
            cell.outputs = _scrub_outputs(cell.get("outputs", []), widget_state)
        elif cell.cell_type in ("markdown", "raw"):
            cell.source = scrub_markdown(cell.source)
        if not cell.source.strip():
            continue  # a test cell that held only the grader's checks
        cells.append(cell)
    nb.cells = cells
    _clean_notebook_metadata(nb.metadata)
    return nb


# --------------------------------------------------------------------------- verification
def _texts(nb: nbformat.NotebookNode):
    """(where, text) for everything of a notebook that can end up on a page or in a download."""
    yield "notebook metadata", json.dumps(nb.metadata)
    for i, cell in enumerate(nb.cells):
        yield f"cell {i} ({cell.cell_type}) source", cell.source
        yield f"cell {i} metadata", json.dumps(cell.metadata)
        for j, out in enumerate(cell.get("outputs", [])):
            shown = {k: v for k, v in out.items() if k != "data"}
            shown["data"] = {k: v for k, v in out.get("data", {}).items() if not k.startswith("image/")}
            shown["mimetypes"] = list(out.get("data", {}))
            yield f"cell {i} output {j}", json.dumps(shown)


def find_plumbing(nb: nbformat.NotebookNode) -> list[str]:
    """What of the grader is left in `nb`: '<where>: <what> (<the text>)' lines, empty when none."""
    found = []
    for where, text in _texts(nb):
        for what, pattern in PLUMBING:
            m = pattern.search(text)
            if m:
                snippet = text[max(0, m.start() - 40):m.end() + 40].replace("\n", "\\n")
                found.append(f"{where}: {what} ({snippet!r})")
    return found
