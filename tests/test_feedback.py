"""The feedback page a student gets: their own outputs (bounded, sanitised), test cells named
with their exercise, long lines wrapped, math drawn offline (no script, no CDN), and still
no hidden test nor traceback."""
from __future__ import annotations

import re

import nbformat
import pytest
from nbformat.v4 import new_markdown_cell, new_output

from autograder.plugins import (
    CELL_OUTPUT_LIMIT,
    FEEDBACK_OUTPUTS,
    NO_ALT_TEXT,
    TOO_LARGE,
    markdown2html,
    render_math,
    student_outputs,
)
from autograder.trusted import normalize_submission
from course_tools.adversarial import MARKDOWN_SCRIPT

from .conftest import autograde, inject, solved_notebook

A01 = "01_similarity_attention"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)"
LONG = "wrap" * 1000  # one 4000-character line
ONE_PIXEL_PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


# --------------------------------------------------------------------------- outputs, unit
def test_student_outputs_keep_what_feedback_may_show():
    raw = [
        {"output_type": "stream", "name": "stdout", "text": ["hello ", "world\n"]},
        {"output_type": "display_data", "metadata": {"image/png": {"width": '1" onload="x'}},
         "data": {"text/plain": "fig", "image/png": "iVBORw0KGgo=\n", "application/javascript": "alert(1)",
                  "image/svg+xml": "<svg onload=alert(1)>", "application/vnd.jupyter.widget-view+json": {}}},
        {"output_type": "display_data", "data": {"image/png": 'AAAA" onerror="alert(1)'}},  # not base64: dropped
        {"output_type": "execute_result", "execution_count": 3, "data": {"text/plain": "42"}, "metadata": {}},
        {"output_type": "error", "ename": "ValueError", "evalue": "bad",
         "traceback": ["Traceback (most recent call last)", "  nb01.check('secret')"]},
        {"output_type": "update_display_data", "data": {"text/plain": "x"}},
        "not an output",
    ]
    kept, size = student_outputs(raw, 10**6)
    assert [o.output_type for o in kept] == ["stream", "display_data", "execute_result", "error"]
    assert kept[0].text == "hello world\n"
    assert set(kept[1].data) == {"text/plain", "image/png"} and kept[1].data["image/png"] == "iVBORw0KGgo="
    assert kept[1].metadata == {}
    assert kept[2].execution_count == 3
    assert kept[3].traceback == ["ValueError: bad"]
    assert 0 < size < 1000
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=kept)]))


def test_student_outputs_are_bounded():
    big = [{"output_type": "stream", "name": "stdout", "text": "x" * (CELL_OUTPUT_LIMIT + 1)}]
    kept, _ = student_outputs(big, 10**7)
    assert [o.text for o in kept] == [TOO_LARGE + "\n"]
    small = [{"output_type": "stream", "name": "stdout", "text": "x" * 1000}]
    assert student_outputs(small, 500)[0][0].text == TOO_LARGE + "\n"  # the notebook's budget is spent
    many = [{"output_type": "stream", "name": "stdout", "text": ""}] * 100_000
    assert student_outputs(many, 10**7)[0][0].text == TOO_LARGE + "\n"


def test_normalize_carries_outputs_in_metadata():
    """nbgrader's ClearOutput empties `outputs` before autograding: the student's travel in the
    cell's metadata, and TrustedVerdicts puts them back."""
    solution = {"grade_id": "f", "solution": True, "grade": False, "locked": False}
    source = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("def f(): ...", metadata={"nbgrader": solution})],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    student = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f(): return 1", metadata={"nbgrader": solution}, execution_count=4,
                                  outputs=[new_output("stream", name="stdout", text="hi\n")]),
        nbformat.v4.new_code_cell("x = 1", execution_count=5),
    ])
    normalized = normalize_submission(nbformat.from_dict(student), source)
    first, second = normalized.cells
    assert first.metadata[FEEDBACK_OUTPUTS] == {"outputs": [new_output("stream", name="stdout", text="hi\n")],
                                                "execution_count": 4}
    assert FEEDBACK_OUTPUTS not in second.metadata and first.outputs == second.outputs == []
    nbformat.validate(normalized)


# --------------------------------------------------------------------------- math, unit
def test_math_is_drawn_as_svg_without_script():
    inline = render_math("x^2", display=False)
    assert inline.startswith('<span class="math-inline"><svg') and 'aria-label="x^2"' in inline
    block = render_math(r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}", display=True)
    assert "math-display" in block and "m-cases" in block and "math-tex" not in block
    for html in (inline, block):
        assert "<script" not in html and not re.search(r"\son\w+=", html)


def test_math_mathtext_cannot_draw_is_shown_as_escaped_tex():
    html = render_math(r"\notamacro{<script>alert(1)</script>}", display=False)
    assert "math-tex" in html and "<script" not in html and "&lt;script&gt;" in html


def test_markdown_filter_unescapes_code_and_math_and_blocks_harmful_links():
    # SanitizeHTML (bleach) has escaped the markdown source before the filter sees it
    source = "`&lt;pad&gt;` and $y_{&lt;t}$ and [x](javascript:alert(1))"
    html = markdown2html({"resources": {}}, source)
    assert "<code>&lt;pad&gt;</code>" in html
    assert 'aria-label="y_{&lt;t}"' in html
    assert "javascript:" not in html


def test_a_markdown_cell_is_drawn_once_and_kept_only_when_drawn_whole():
    """Every page shows the course's markdown: drawn once, then reused; a cell drawn while a page's
    formula budget was spent (shown as TeX) is not kept, so the next page still draws it."""
    from autograder.plugins import _Budget

    source = r"A formula only this test draws: $\alpha_{kept} + \beta^{2}$"
    spent = markdown2html({"resources": {"attn_math_budget": _Budget(left=0)}}, source)
    assert "math-tex" in spent and "<svg" not in spent
    drawn = markdown2html({"resources": {}}, source)
    assert "<svg" in drawn and "math-tex" not in drawn
    assert markdown2html({"resources": {"attn_math_budget": _Budget(left=0)}}, source) == drawn


# --------------------------------------------------------------------------- one notebook, for real
@pytest.fixture(scope="module")
def page(course):
    """Notebook 01 solved, softmax wrong (it fails test_softmax_stability), with outputs, math and
    hostile HTML of the student's own; graded for real; the feedback page's HTML."""
    nb = inject(solved_notebook(course, A01), {"softmax": WRONG_SOFTMAX})
    plain = [c for c in nb.cells if c.cell_type == "code" and "nbgrader" not in c.metadata]
    plain[2].execution_count = 7
    plain[2].outputs = [
        new_output("stream", name="stdout", text=f"STUDENT-OUTPUT-42 {LONG}\n<script>alert('XSS-STREAM')</script>\n"),
        new_output("display_data", data={"text/plain": "html",
                                         "text/html": "<b>bold</b><script>alert('XSS-HTML')</script>"
                                                      "<img src=x onerror=\"alert('XSS-IMG')\">"}),
        new_output("display_data", data={"application/javascript": "alert('XSS-JS')"}),
        new_output("display_data", data={"text/plain": "<Figure>", "image/png": ONE_PIXEL_PNG}),
        new_output("error", ename="ValueError", evalue="STUDENT-ERROR <script>alert('XSS-ERR')</script>",
                   traceback=["Traceback (most recent call last)", "----> 1 nb01.check('x', y)"]),
    ]
    test_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_softmax")
    test_cell.outputs = [new_output("stream", name="stdout", text="STUDENT-TEST-CELL-OUTPUT\n")]
    nb.cells.insert(1, new_markdown_cell(
        "The square: $x^2$, and $$\\frac{a}{b} < c$$\n\n<script>document.title='XSS-MD'</script>\n\n" + MARKDOWN_SCRIPT))
    result = autograde(course, A01, nb, student="feedback-student")
    assert result.status == "ok", result.status
    assert {c.grade_id for c in result.cells if c.score < c.max_score} == {"test_softmax_stability"}
    html = (course.root / "feedback" / "feedback-student" / A01 / f"{A01}.html").read_text()
    return html


@pytest.mark.slow
def test_feedback_shows_the_students_outputs(page):
    assert "STUDENT-OUTPUT-42" in page and "STUDENT-ERROR" in page
    assert re.search(r"In(\W|&nbsp;)*\[7\]", page), "the execution count is kept"
    assert "STUDENT-TEST-CELL-OUTPUT" not in page, "a test cell shows its verdict only"


@pytest.mark.slow
def test_feedback_images_have_alt_text(page):
    """HTMLExporter's BeautifulSoup pass is skipped (plugins.FeedbackExporter): the alt text it
    added to every image still is, without one twice."""
    images = re.findall(r"<img\b[^>]*>", page)
    assert any(ONE_PIXEL_PNG in image for image in images), "the student's figure is shown"
    for image in images:
        assert image.count(" alt=") == 1, image
    assert f'alt="{NO_ALT_TEXT}"' in next(image for image in images if ONE_PIXEL_PNG in image)


@pytest.mark.slow
def test_feedback_names_test_cells_by_exercise(page):
    assert "Test cell" not in page
    assert re.search(r"test_softmax_stability</code>\s*—\s*softmax\s*—\s*0 / 2 points", page)
    assert re.search(r"test_normalize_rows_apple_in_sentence_2</code>\s*—\s*normalize_rows\s*—\s*1 / 1 points", page)
    assert "softmax without subtracting the max" in page  # the verdict's message reaches the student


@pytest.mark.slow
def test_feedback_wraps_and_loads_no_script(page):
    assert "pre-wrap" in page and "break-word" in page
    assert not re.search(r"<script[^>]*src=[\"']?https?:", page, re.I)
    assert "mathjax" not in page.lower() and "cdnjs" not in page
    assert "<script" not in page.lower(), "the page runs nothing"
    assert 'aria-label="x^2"' in page and "$x^2$" not in page  # drawn, offline


@pytest.mark.slow
def test_feedback_hides_tests_and_tracebacks_and_neutralises_html(page):
    for secret in ("nb01.check", "BEGIN HIDDEN", "HIDDEN TESTS", "most recent call last", "----> "):
        assert secret not in page, secret
    for attack in ("XSS-STREAM", "XSS-HTML", "XSS-ERR", "XSS-MD", "PWNED-SCRIPT"):  # shown as text, escaped, if at all
        assert not re.search(r"<script[^>]*>[^<]*" + attack, page), attack
    assert "XSS-JS" not in page
    assert not re.search(r"<img[^>]*onerror", page, re.I)
