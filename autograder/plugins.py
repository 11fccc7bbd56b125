"""nbgrader preprocessors of our own, and what the feedback page needs (templates/feedback).

* ScrubHiddenTests, NameTestCells: feedback notebooks safe to hand out, test cells named.
* FeedbackExporter: the HTML exporter of feedback pages alone (formgrader keeps its own).
* TrustedVerdicts: autograde without running anything of the student's.
* student_outputs: the bounded copy of a student's outputs that feedback shows back to them.
* StudentHTML: formgrader's page without the student's active HTML (TrustedVerdicts makes it inert too).
* markdown2html: markdown with its math rendered here (matplotlib's mathtext, inline SVG):
  feedback pages load no script at all, MathJax included, and render math offline.
"""
from __future__ import annotations

import hashlib
import html
import re
import threading
import time

from jinja2 import BytecodeCache, pass_context
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter
from nbconvert.preprocessors import Preprocessor
from nbgrader.preprocessors import ClearHiddenTests, GetGrades, NbGraderPreprocessor
from traitlets import Bool, Unicode

from .outputs import (  # noqa: F401 - re-exported: the feedback tests and older configs name them here
    CELL_OUTPUT_LIMIT,
    FEEDBACK_OUTPUTS,
    NOTEBOOK_OUTPUT_LIMIT,
    TOO_LARGE,
    _is_count,
    page_outputs,
    safe_markdown,
    safe_raw,
    student_outputs,
)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class GetGradesApart(GetGrades):
    """nbgrader's GetGrades, with each cell's extra credit written beside its score (nbgrader's score holds both):
    the feedback page shows "0 / 1 points, + 2 extra credit" for a failed test, never a passed "1 / 1"."""

    def _get_score(self, cell, resources) -> None:
        super()._get_score(cell, resources)
        grade = self.gradebook.find_grade(cell.metadata["nbgrader"]["grade_id"], self.notebook_id,
                                          self.assignment_id, self.student_id)
        cell.metadata.nbgrader["extra_credit"] = float(grade.extra_credit or 0)


class ScrubHiddenTests(NbGraderPreprocessor):
    """Make a feedback notebook safe to hand to a student.

    Hidden-test regions are removed from test cells, and every error output is reduced to
    its exception type and message: a traceback quotes source lines, and those lines can be
    hidden tests or the grader's own checks. The message is written for the student.
    """

    def preprocess(self, nb, resources):
        clear = ClearHiddenTests(enforce_metadata=False)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            clear._remove_hidden_test_region(cell)
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    message = _ANSI.sub("", f"{output.ename}: {output.evalue}")
                    output.traceback = [message]
        return nb, resources


class NameTestCells(NbGraderPreprocessor):
    """Feedback: each test cell gets the name of the exercise it tests (cell metadata
    `attn_exercise`, shown by templates/feedback), the way grades.csv and the report name it."""

    def preprocess(self, nb, resources):
        from .grade import exercise_of

        graded = {c.metadata["nbgrader"]["grade_id"] for c in nb.cells
                  if c.metadata.get("nbgrader", {}).get("solution") and c.metadata["nbgrader"].get("grade_id")}
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution") and meta.get("grade_id"):
                cell.metadata["attn_exercise"] = exercise_of(meta["grade_id"], graded)
        return nb, resources


class FeedbackLateness(NbGraderPreprocessor):
    """Feedback: when the notebook was handed in, when it was due, and what lateness cost, from the
    gradebook (resources["attn_late"], shown under the page's title by templates/feedback)."""

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook, MissingEntry

        from .lateness import how_late

        info = resources.get("nbgrader", {})
        try:
            with Gradebook(info["db_url"]) as gb:
                sub = gb.find_submission(info["assignment"], info["student"])
                extended = sub.extension is not None and sub.extension.total_seconds() > 0 and sub.assignment.duedate
                late = {"submitted": _when(sub.timestamp), "due": _when(sub.duedate),
                        "late": how_late(float(sub.total_seconds_late or 0)),
                        "penalty": float(info.get("late_penalty") or 0),
                        "class_due": _when(sub.assignment.duedate) if extended else ""}  # their own date: an extension
        except (KeyError, MissingEntry):
            return nb, resources
        resources["attn_late"] = late
        return nb, resources


def _when(moment) -> str:
    """A gradebook time (naive UTC) as the page shows it: '2026-12-01 23:59 UTC' ('' when none)."""
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else ""


class FeedbackExporter(HTMLExporter):
    """The exporter of the feedback page (c.GenerateFeedback.exporter_class in nbgrader_config.py).

    An HTMLExporter that differs only by its name: the page's template, its folder and the
    markdown2html filter are configured under FeedbackExporter, so they reach feedback alone.
    Configured under HTMLExporter they reached every HTML exporter, formgrader's too, and
    formgrader could no longer show a submission (TemplateNotFound).

    It also skips HTMLExporter's last pass, which parses the finished page with BeautifulSoup's
    pure-Python parser to give images an alt text and Lab cells a tabindex: about 1.7 s a
    notebook, most of nbgrader's time per graded notebook. This template has no Lab cells, and
    the alt text is added by a pattern instead (tests/test_feedback.py).
    """

    def _create_environment(self):
        environment = super()._create_environment()
        environment.bytecode_cache = _COMPILED_TEMPLATES  # nbgrader makes an exporter per notebook
        return environment

    def from_notebook_node(self, nb, resources=None, **kw):
        langinfo = nb.metadata.get("language_info", {})
        lexer = langinfo.get("pygments_lexer", langinfo.get("name", None))
        self.register_filter("highlight_code", self.filters.get("highlight_code",
                                                                _CachedHighlight(pygments_lexer=lexer, parent=self)))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type", WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata,
                                                                       parent=self, resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return _IMAGE_WITHOUT_ALT.sub(f'<img alt="{NO_ALT_TEXT}"', html), resources


class _CachedHighlight(Highlight2HTML):
    """nbconvert's code highlighting, kept by cell source: the course's cells (and its solutions)
    recur on every student's page, and pygments takes most of a page's drawing time."""

    def __call__(self, source, language=None, metadata=None):
        key = (self.pygments_lexer, repr(self.extra_formatter_options), language,
               (metadata or {}).get("magics_language"), source)
        if key in _HIGHLIGHTED:
            return _HIGHLIGHTED[key]
        html_out = super().__call__(source, language, metadata)
        if len(source) <= CACHED_CELL_CHARS:
            _keep(_HIGHLIGHTED, key, html_out)
        return html_out


# What every student's page shows again, drawn once per grading process: formulas (by TeX), markdown
# cells and highlighted code cells (by source). Each holds at most CACHE_ENTRIES (then starts over);
# cells longer than CACHED_CELL_CHARS (a student's own, not the course's) are drawn every time.
_SVG_CACHE: dict[str, str | None] = {}
_MARKDOWN_CACHE: dict[str, str] = {}  # only cells drawn whole (no formula left as TeX for want of budget)
_HIGHLIGHTED: dict[tuple, str] = {}
CACHE_ENTRIES = 4096
CACHED_CELL_CHARS = 20_000


def _keep(cache: dict, key, value):
    """`cache[key] = value`, the cache emptied first when full (bounded memory); the value."""
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


class _TemplatesInMemory(BytecodeCache):
    """Jinja's compiled templates kept for the process (Jinja checks each against its source)."""

    def __init__(self):
        self._compiled: dict[str, bytes] = {}

    def load_bytecode(self, bucket) -> None:
        if bucket.key in self._compiled:
            bucket.bytecode_from_string(self._compiled[bucket.key])

    def dump_bytecode(self, bucket) -> None:
        self._compiled[bucket.key] = bucket.bytecode_to_string()


_COMPILED_TEMPLATES = _TemplatesInMemory()
NO_ALT_TEXT = "No description has been provided for this image"  # HTMLExporter's own words
_IMAGE_WITHOUT_ALT = re.compile(r"<img(?![^>]*\salt=)", re.IGNORECASE)


NOT_GRADED = {"passed": False, "message": "not graded"}  # a test cell the verdicts do not name


class TrustedVerdicts(NbGraderPreprocessor):
    """Stands in for nbgrader's Execute during `autograde`: nothing of the student's runs here.

    The verdict of every test cell was decided beforehand, outside the student's process, by
    comparing the values the student's code produced with the reference (autograder/trusted.py).
    This writes each verdict into its cell as nbgrader expects it — no output for a pass, an
    error output carrying the message for a fail — so nbgrader's own SaveAutoGrades records the
    points, and feedback and exports work unchanged.

    Every other code cell gets back the outputs the student submitted (bounded and filtered by
    `student_outputs` when the submission was normalized; nbgrader's ClearOutput empties
    `outputs` before this runs, so they travel in the cell's metadata): feedback shows them;
    nothing runs them. A markdown or raw cell of the student's keeps no active HTML (`_make_inert`):
    formgrader shows this notebook to the instructor.
    """

    verdicts_file = Unicode("", help="A JSON file of the verdicts, decided already (`attn-course grade` sets it "
                                     "per notebook); empty: run the notebook in the sandbox and judge it now"
                            ).tag(config=True)

    def preprocess(self, nb, resources):
        import json

        from nbformat.v4 import new_output

        from .outcomes import Verdict

        path = self.verdicts_file
        if path:  # `attn-course grade` decided the verdicts already
            with open(path) as fh:
                verdicts = json.load(fh)
        else:  # nbgrader's own autograde (formgrader's button, the command line): the same trusted path
            verdicts = self._verdicts_now(nb, resources)
        if not isinstance(verdicts, dict):
            raise ValueError("the verdicts are not a mapping of grade_id to verdict")
        for cell in nb.cells:
            kept = cell.metadata.pop(FEEDBACK_OUTPUTS, None)
            if cell.cell_type != "code":
                _make_inert(cell)
                continue
            cell.outputs = []
            cell.execution_count = None
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution"):
                verdict = Verdict.from_dict(verdicts.get(meta.get("grade_id"), NOT_GRADED))
                if not verdict.passed:
                    cell.outputs = [new_output("error", ename="Failed", evalue=verdict.message,
                                               traceback=[f"Failed: {verdict.message}"])]
                elif verdict.note:  # passed (stdout keeps the points): what the student should know
                    cell.outputs = [new_output("stream", name="stdout", text=f"Passed. {verdict.note}\n")]
            elif isinstance(kept, dict):
                cell.outputs, _ = student_outputs(kept.get("outputs"), NOTEBOOK_OUTPUT_LIMIT)
                count = kept.get("execution_count")
                cell.execution_count = count if _is_count(count) else None
        return nb, resources

    def _verdicts_now(self, nb, resources) -> dict:
        """Run the notebook in the sandbox and judge it outside, as `attn-course grade` does."""
        import os
        from pathlib import Path

        from .grade import verdicts_in_sandbox
        from .settings import Limits

        coursedir = self.config.CourseDirectory
        root = Path(coursedir.get("root") or os.getcwd())
        info = resources["nbgrader"]
        source = root / coursedir.get("source_directory", "source") / info["assignment"] / f"{info['notebook']}.ipynb"
        if not source.is_file():
            raise RuntimeError(f"the source notebook {source} is missing: the verdicts cannot be decided "
                               "(nothing was deleted; check CourseDirectory.source_directory)")
        hidden = [str(root / coursedir.get(key, default)) for key, default in
                  (("submitted_directory", "submitted"), ("autograded_directory", "autograded"),
                   ("feedback_directory", "feedback"), ("source_directory", "source"))]
        return verdicts_in_sandbox(source, nb, hidden + [str(root)], Limits.from_env())  # nbgrader's process: an edge


def _is_students(cell) -> bool:
    """A cell the student wrote: not one nbgrader puts back from the course (tests, locked cells)."""
    meta = cell.metadata.get("nbgrader", {})
    return not (meta.get("locked") or (meta.get("grade") and not meta.get("solution")))


def _make_inert(cell) -> None:
    """A student's markdown or raw cell with no active HTML (outputs.safe_markdown, safe_raw): the
    autograded notebook is what formgrader shows the instructor. Safe cells stay exactly as they are."""
    if not _is_students(cell) or not isinstance(cell.get("source"), str):
        return
    if cell.cell_type == "markdown":
        cell.source = safe_markdown(cell.source, cell.get("attachments"))
    elif cell.cell_type == "raw":
        cell.source = safe_raw(cell.source)


_ATTACHMENT = re.compile(r"attachment:([^\s)\"'>]+)")


def _kept_attachments_only(source: str, attachments) -> str:
    """Markdown whose `attachment:` pictures the cell no longer carries (a normalized notebook keeps none)
    point nowhere: nbconvert's page raises on them, and formgrader showed an error for the whole submission."""
    kept = attachments if isinstance(attachments, dict) else {}
    return _ATTACHMENT.sub(lambda m: m.group(0) if m.group(1) in kept else "#attachment-not-kept", source)


class StudentHTML(Preprocessor):
    """formgrader's exporter (c.HTMLExporter.preprocessors, nbgrader_config.py): every markdown and raw
    cell, and every output, made inert before the page is drawn, on the instructor's origin. It also
    covers autograded notebooks an older grader wrote; what is safe already is left as it is."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "markdown" and isinstance(cell.get("source"), str):
            cell.source = _kept_attachments_only(safe_markdown(cell.source, cell.get("attachments")),
                                                 cell.get("attachments"))
        elif cell.cell_type == "raw" and isinstance(cell.get("source"), str):
            cell.source = safe_raw(cell.source)
        elif cell.cell_type == "code":
            cell.outputs = page_outputs(cell.get("outputs"))
            if not _is_count(cell.get("execution_count")):
                cell.execution_count = None
        return cell, resources


# --------------------------------------------------------------------------- math, offline
# Feedback must render math without a network: MathJax is not installed anywhere in the
# environment (JupyterLab ships it only inside its webpack bundles), so each formula is drawn
# here with matplotlib's mathtext (a pinned dependency) as a small inline SVG. mathtext knows
# most of TeX's math; what it does not know is rewritten (_MATHTEXT), matrices and cases are
# laid out in HTML around it, and anything else is shown as its TeX source.
_MATH_LOCK = threading.Lock()  # matplotlib is not thread-safe; the grader runs feedback in threads
MATH_MAX_CHARS = 1_500  # longer formulas are shown as TeX (bounded parsing time)
MATH_RENDERS_PER_PAGE = 600  # new formulas drawn per page, and seconds spent drawing them;
MATH_SECONDS_PER_PAGE = 20.0  # past either, formulas are shown as TeX (a course page: ~1 s)
_MATHTEXT = [  # TeX that mathtext lacks -> what it has
    (re.compile(r"\\(?:big|Big|bigg|Bigg)[lrm]?(?![a-zA-Z])"), ""),
    (re.compile(r"\\le(?![a-zA-Z])"), r"\\leq"),
    (re.compile(r"\\ge(?![a-zA-Z])"), r"\\geq"),
    (re.compile(r"\\ne(?![a-zA-Z])"), r"\\neq"),
    (re.compile(r"\\[lr]Vert(?![a-zA-Z])"), r"\\Vert"),
    (re.compile(r"\\[lr]vert(?![a-zA-Z])"), "|"),
    (re.compile(r"\\[dt]frac(?![a-zA-Z])"), r"\\frac"),
    (re.compile(r"\\displaystyle(?![a-zA-Z])"), ""),
    (re.compile(r"\\(?:operatorname|textrm)(?![a-zA-Z])"), r"\\mathrm"),
]
_ENV = re.compile(r"\\begin\{(matrix|pmatrix|bmatrix|Bmatrix|vmatrix|Vmatrix|cases)\}(.*?)\\end\{\1\}", re.S)
def _mathtext(tex: str) -> str:
    tex = " ".join(tex.split())
    for pattern, replacement in _MATHTEXT:
        tex = pattern.sub(replacement, tex)
    return _underbrace(tex)


def _group(tex: str, start: int) -> int:
    """Index just past the brace group opening at `start` (-1 when unbalanced)."""
    depth = 0
    for i in range(start, len(tex)):
        if tex[i] == "{" and tex[i - 1:i] != "\\":
            depth += 1
        elif tex[i] == "}" and tex[i - 1:i] != "\\":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _underbrace(tex: str) -> str:
    r"""`\underbrace{A}_{B}` -> `\underset{B}{A}` (mathtext has no braces under formulas)."""
    while (at := tex.find("\\underbrace{")) >= 0:
        a_end = _group(tex, at + len("\\underbrace"))
        if a_end < 0:
            return tex
        a = tex[at + len("\\underbrace{"):a_end - 1]
        rest = tex[a_end:].lstrip()
        if rest.startswith("_{") and (b_end := _group(rest, 1)) > 0:
            tex = tex[:at] + "\\underset{" + rest[2:b_end - 1] + "}{" + a + "}" + rest[b_end:]
        else:
            tex = tex[:at] + "{" + a + "}" + tex[a_end:]
    return tex


def _draw(tex: str) -> str | None:
    """One formula (mathtext syntax, no dollars) as an inline SVG sized in em, or None."""
    import io

    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import MathTextParser

    size = 12.0
    with _MATH_LOCK, matplotlib.rc_context({"mathtext.fontset": "cm", "svg.fonttype": "path",
                                            "svg.hashsalt": "attn"}):
        try:
            prop = FontProperties(size=size)
            width, height, depth, *_ = MathTextParser("path").parse(f"${tex}$", dpi=72, prop=prop)
            if not (0 < width < 5000 and 0 < height < 2000):
                return None
            fig = Figure(figsize=(width / 72, height / 72))
            fig.text(0, depth / height, f"${tex}$", fontproperties=prop)
            buf = io.BytesIO()
            fig.savefig(buf, dpi=72, format="svg", transparent=True)
        except Exception:  # noqa: BLE001 - anything mathtext cannot draw is shown as TeX
            return None
    svg = buf.getvalue().decode()
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>|<!--.*?-->|<defs>\s*<style[^>]*>.*?</style>\s*</defs>"
                 r'|<g id="patch_1">.*?</g>', "", svg, flags=re.S)
    prefix = "m" + hashlib.sha1(tex.encode()).hexdigest()[:10] + "-"
    svg = re.sub(r'\bid="', 'id="' + prefix, svg)
    svg = re.sub(r'href="#', 'href="#' + prefix, svg)
    box = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    box_w, box_h = (float(box.group(1)), float(box.group(2))) if box else (width, height)
    em = lambda pt: f"{pt / size:.3f}em"
    size_attrs = (f'width="{em(box_w)}" height="{em(box_h)}" style="vertical-align: -{em(depth * box_h / height)}" '
                  f'role="img" aria-label="{html.escape(tex)}" focusable="false"')
    svg = re.sub(r'width="[^"]*" height="[^"]*"', lambda _: size_attrs, svg, count=1)
    return re.sub(r"\s+", " ", svg).replace("> <", "><").strip()


def _tex_shown(tex: str, display: bool) -> str:
    """A formula mathtext cannot draw, as its TeX source (escaped)."""
    dollars = "$$" if display else "$"
    return f'<code class="math-tex">{dollars}{html.escape(tex)}{dollars}</code>'


class _Budget:
    """The formulas one page may still draw, and for how long (those already drawn, for any
    page, are free): a student's page cannot hold the grader up with thousands of formulas."""

    def __init__(self, left: int = MATH_RENDERS_PER_PAGE, seconds: float = MATH_SECONDS_PER_PAGE):
        self.left, self.deadline = left, time.monotonic() + seconds
        self.refused = 0  # formulas shown as TeX because this page's budget was spent

    def svg(self, tex: str) -> str | None:
        if tex in _SVG_CACHE:
            return _SVG_CACHE[tex]
        if self.left <= 0 or time.monotonic() > self.deadline:
            self.refused += 1
            return None
        self.left -= 1
        return _keep(_SVG_CACHE, tex, _draw(tex))


def _environment(kind: str, body: str, budget: _Budget) -> str | None:
    rows = [r for r in re.split(r"\\\\", body) if r.strip()] or [""]
    cells = [[c.strip() for c in r.split("&")] for r in rows]
    columns = max(len(r) for r in cells)
    parts = []
    for row in cells:
        for c in row + [""] * (columns - len(row)):
            svg = budget.svg(c) if c else ""
            if svg is None:
                return None
            parts.append(f"<span>{svg}</span>")
    return (f'<span class="m-env m-{kind}"><span class="m-grid" style="grid-template-columns: repeat({columns}, auto)">'
            + "".join(parts) + "</span></span>")


def render_math(tex: str, display: bool, budget: _Budget | None = None) -> str:
    """HTML for one formula: SVG where mathtext can draw it, else its TeX source, escaped."""
    budget = budget or _Budget()
    source = tex.strip()
    wrap = ("<span class=\"math-display\">{}</span>" if display else "<span class=\"math-inline\">{}</span>")
    if not source or len(source) > MATH_MAX_CHARS:
        return _tex_shown(source, display)
    tex = _mathtext(source)
    pieces, at = [], 0
    for m in _ENV.finditer(tex):
        pieces.append(("tex", tex[at:m.start()]))
        pieces.append((m.group(1), m.group(2)))
        at = m.end()
    pieces.append(("tex", tex[at:]))
    out = []
    for kind, body in pieces:
        if kind == "tex":
            if not body.strip():
                continue
            part = budget.svg(body.strip())
        else:
            part = _environment(kind, body, budget)
        if part is None:
            return _tex_shown(source, display)
        out.append(part)
    return wrap.format("".join(out))


def _renderer_class():
    from nbconvert.filters.markdown_mistune import IPythonRenderer

    class OfflineMathRenderer(IPythonRenderer):
        """nbconvert's markdown renderer with math drawn here and no harmful links.

        SanitizeHTML (bleach) has already run over the markdown *source*, so `<`, `>` and `&`
        arrive as entities; math and code are unescaped before they are drawn or re-escaped,
        so `<pad>` shows as <pad>, not &lt;pad&gt;."""

        def __init__(self, budget: _Budget):
            super().__init__(escape=False, allow_harmful_protocols=False)
            self.budget = budget

        def block_math(self, body: str) -> str:
            return render_math(html.unescape(body), True, self.budget)

        def inline_math(self, body: str) -> str:
            return render_math(html.unescape(body), False, self.budget)

        def latex_environment(self, name: str, body: str) -> str:
            if name.rstrip("*") in ("equation", "displaymath"):
                return render_math(html.unescape(body), True, self.budget)
            return render_math(html.unescape(f"\\begin{{{name}}}{body}\\end{{{name}}}"), True, self.budget)

        def multiline_math(self, text: str) -> str:
            return render_math(html.unescape(text.strip().strip("$")), True, self.budget)

        def codespan(self, text: str) -> str:
            return super().codespan(html.unescape(text))

        def block_code(self, code: str, info=None) -> str:
            return super().block_code(html.unescape(code), info)

        def _embed_image_or_attachment(self, src: str) -> str:
            return "" if src.startswith("attachment:") else src  # normalized notebooks carry none

    return OfflineMathRenderer


@pass_context
def markdown2html(context, source: str) -> str:
    """The `markdown2html` filter of the feedback page (nbgrader_config.py): markdown to HTML,
    math drawn as SVG. A page draws at most MATH_RENDERS_PER_PAGE new formulas."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    if source in _MARKDOWN_CACHE:
        return _MARKDOWN_CACHE[source]
    resources = context.get("resources")
    budget = resources.get("attn_math_budget") if isinstance(resources, dict) else None
    if budget is None:
        budget = _Budget()
        if isinstance(resources, dict):
            resources["attn_math_budget"] = budget
    refused = budget.refused
    html_out = MarkdownWithMath(renderer=_renderer_class()(budget)).render(source)
    if budget.refused == refused and len(source) <= CACHED_CELL_CHARS:  # as any page would draw it
        _keep(_MARKDOWN_CACHE, source, html_out)
    return html_out
