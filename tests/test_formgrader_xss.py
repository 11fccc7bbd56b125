"""A student's active HTML never runs on formgrader's page (the instructor's Jupyter origin and session).

* The grader: the autograded notebook keeps the student's markdown, raw cells and HTML/markdown
  outputs only made inert (outputs.safe_markdown, safe_html; plugins.TrustedVerdicts), the course's
  cells and the scores as they were.
* formgrader: its exporter, built by nbgrader's FormgradeExtension from the course's config exactly as
  the server builds it, draws no student script or handler, even from a notebook an older grader wrote,
  and still shows text, a table and images, and its own scripts.
"""
from __future__ import annotations

import re
import types
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell

from autograder.course import write_course_config

from .conftest import autograde, cell_scores, solved_notebook
from .layout import REPO

A01 = "01_similarity_attention"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
ATTACKS = [  # each marked XSS-n: found inside a tag or a script on the page, it is live
    "<script>alert('XSS-1')</script>",
    "<img src=x onerror=\"alert('XSS-2')\">",
    "<a href=\"javascript:alert('XSS-3')\">click</a>",
    "<iframe src=\"javascript:alert('XSS-4')\"></iframe>",
    "<svg onload=\"alert('XSS-5')\"></svg>",
    "<!--><img src=x onerror=\"alert('XSS-6')\">-->",
    "<a href=\"jav&#x61;script:alert('XSS-7')\">entity</a>",
]
MARKDOWN_LINK = "[link](javascript:alert('XSS-8'))"  # markdown, not HTML: bleach alone leaves it
ORDINARY_MD = ("ORDINARY-TEXT-7 with **bold** and $x^2$\n\n| left | right |\n|---|---|\n| CELL-A | CELL-B |\n\n"
               f"![figure](data:image/png;base64,{PNG})\n\n")
ORDINARY_HTML = f"<b>BOLD-HTML</b><table><tr><td>HTML-CELL</td></tr></table><img src=\"data:image/png;base64,{PNG}\">"
HOSTILE_MD = ORDINARY_MD + "\n\n".join(ATTACKS) + "\n"
STUDENTS_MARKDOWN = ["| head | score |\n|:-:|--:|\n| $x$ | 1 |", "![plot](plot.png)",
                     '<img src="attachment:image.png" width=300>', '<img src="figures/attn.png">',
                     "<font color=red>careful</font>", '<table><tr><td style="text-align: center">x</td></tr></table>']
HOSTILE_HTML = ORDINARY_HTML + "".join(ATTACKS)


def live_attacks(text: str) -> list[str]:
    """The attack markers a browser would find in a tag or a script (text shown escaped is harmless)."""
    return sorted(set(re.findall(r"<[^>]*(XSS-\d)", text) + re.findall(r"<script[^>]*>[^<]*(XSS-\d)", text)))


def active_html(text: str) -> list[str]:
    """Tags and attributes that would run something, wherever they come from."""
    tags = re.findall(r"<(?:script|iframe|svg)\b", text, re.I)
    return tags + re.findall(r"<[a-z][^>]*\s(?:on\w+\s*=|(?:href|src)\s*=\s*[\"']?\s*jav)", text, re.I)


# --------------------------------------------------------------------------- the functions, no grading
@pytest.mark.parametrize("attack", [*ATTACKS, MARKDOWN_LINK])
def test_safe_markdown_makes_each_attack_inert(attack):
    from autograder.outputs import is_safe_html, render_markdown, safe_html, safe_markdown

    cleaned = safe_markdown("An answer.\n\n" + attack)
    assert is_safe_html(render_markdown(cleaned))
    assert not live_attacks(render_markdown(cleaned)) and not active_html(render_markdown(cleaned))
    assert not active_html(safe_html(attack) or "")


def test_ordinary_content_and_the_courses_markdown_stay_as_they_are():
    from autograder.outputs import safe_html, safe_markdown

    assert safe_markdown(ORDINARY_MD) == ORDINARY_MD and safe_html(ORDINARY_HTML) == ORDINARY_HTML
    assert safe_markdown("`<pad>` and the <pad> token") == "`<pad>` and the <pad> token"
    for honest in STUDENTS_MARKDOWN:  # what students write; each once came back as its source, or lost a picture
        assert safe_markdown(honest) == honest
    cells = [c for path in sorted((REPO / "notebooks").glob("*/*.ipynb"))
             for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
    assert cells
    assert [c.source for c in cells if safe_markdown(c.source) != c.source] == []


# --------------------------------------------------------------------------- formgrader's own exporter
def formgrader_exporter(course: Path, monkeypatch):
    """The exporter formgrader's SubmissionHandler draws with, built as the server extension builds it."""
    from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension

    monkeypatch.chdir(course)  # formgrader reads nbgrader_config.py from its working folder
    extension = FormgradeExtension()
    extension.root_dir = str(course)
    extension.initialize([])
    webapp = types.SimpleNamespace(settings={"base_url": "/"})
    extension.init_tornado_settings(webapp)
    return webapp.settings["nbgrader_exporter"]


def formgrader_page(course: Path, notebook: Path, monkeypatch) -> str:
    """The submission's page as formgrader serves it (SubmissionHandler.get's resources)."""
    resources = {"assignment_id": A01, "notebook_id": A01, "submission_id": "sub", "index": 0, "total": 1,
                 "base_url": "/", "student": "mallory", "last_name": "", "first_name": "", "notebook_path": "x"}
    html, _ = formgrader_exporter(course, monkeypatch).from_filename(str(notebook), resources=resources)
    return html


def assert_inert_and_shown(page: str, benign: str) -> None:
    """No student script or handler on the page; the ordinary content is; formgrader's scripts all are."""
    assert live_attacks(page) == []
    assert len(active_html(page)) == len(active_html(benign))  # formgrader's own scripts, no more
    assert page.count("<script") == benign.count("<script") > 0
    for shown in ("ORDINARY-TEXT-7", "<table", "CELL-A", "BOLD-HTML", "HTML-CELL", f"data:image/png;base64,{PNG}"):
        assert shown in page, shown


def test_formgrader_draws_an_older_graders_notebook_inert(tmp_path, monkeypatch):
    """An autograded notebook holding the student's HTML untouched (as graders before this one wrote)."""
    course = tmp_path / "course"
    write_course_config(course, f"sqlite:///{tmp_path / 'gradebook.db'}")
    old = new_notebook(cells=[
        new_markdown_cell(HOSTILE_MD + MARKDOWN_LINK),
        new_raw_cell("".join(ATTACKS)),
        new_code_cell("show()", execution_count=1, outputs=[
            new_output("display_data", data={"text/plain": "t", "text/html": HOSTILE_HTML}),
            new_output("display_data", data={"text/markdown": HOSTILE_MD, "application/javascript": "alert('XSS-9')",
                                             "image/svg+xml": "<svg onload=\"alert('XSS-10')\"></svg>"}),
            new_output("display_data", data={"image/png": PNG}, metadata={"image/png": {"width": "1 onerror=alert('XSS-11')"}}),
        ])])
    benign = new_notebook(cells=[new_markdown_cell(ORDINARY_MD), new_code_cell("show()", execution_count=1, outputs=[
        new_output("display_data", data={"text/plain": "t", "text/html": ORDINARY_HTML})])])
    (course / "autograded").mkdir()
    nbformat.write(old, course / "autograded" / "old.ipynb")
    nbformat.write(benign, course / "autograded" / "benign.ipynb")
    page = formgrader_page(course, course / "autograded" / "old.ipynb", monkeypatch)
    assert_inert_and_shown(page, formgrader_page(course, course / "autograded" / "benign.ipynb", monkeypatch))
    assert "XSS-9" not in page and "XSS-10" not in page


# --------------------------------------------------------------------------- graded for real
@pytest.mark.slow
def test_grader_writes_no_active_html_and_formgrader_draws_none(course, monkeypatch):
    """A solved notebook 01 with the attacks in a markdown cell and in a saved text/html output, graded
    for real: the same scores as without them, an autograded notebook without active HTML, and
    formgrader's page of it without a live attack, ordinary content shown."""
    clean = solved_notebook(course, A01)
    nb = solved_notebook(course, A01)
    nb.cells.insert(3, new_markdown_cell(HOSTILE_MD))
    plain = next(c for c in nb.cells if c.cell_type == "code" and "nbgrader" not in c.metadata)
    plain.execution_count = 3
    plain.outputs = [new_output("display_data", data={"text/plain": "t", "text/html": HOSTILE_HTML})]
    hostile, reference = autograde(course, A01, nb, "mallory"), autograde(course, A01, clean, "alice")
    assert hostile.status == reference.status == "ok", (hostile.detail, reference.detail)
    assert cell_scores(hostile) == cell_scores(reference)

    written = course.root / "autograded" / "mallory" / A01 / f"{A01}.ipynb"
    graded = nbformat.read(written, as_version=4)
    students = [c for c in graded.cells if c.cell_type == "markdown" and "ORDINARY-TEXT-7" in c.source]
    htmls = [o.data["text/html"] for c in graded.cells if c.cell_type == "code"
             for o in c.outputs if "text/html" in o.get("data", {})]
    assert len(students) == 1 and len(htmls) == 1
    for text in (students[0].source, htmls[0]):
        assert active_html(text) == [] and live_attacks(text) == [], text
    assert "CELL-A" in students[0].source and "HTML-CELL" in htmls[0]
    others = {c.source for c in nb.cells if c.cell_type == "markdown" and "ORDINARY-TEXT-7" not in c.source}
    assert not others - {c.source for c in graded.cells}, "the course's markdown cells are unchanged"

    page = formgrader_page(course.root, written, monkeypatch)
    benign = formgrader_page(course.root, course.root / "autograded" / "alice" / A01 / f"{A01}.ipynb", monkeypatch)
    assert live_attacks(page) == [] and len(active_html(page)) == len(active_html(benign))
    assert page.count("<script") == benign.count("<script") > 0
    for shown in ("ORDINARY-TEXT-7", "CELL-A", "BOLD-HTML", "HTML-CELL", f"data:image/png;base64,{PNG}"):
        assert shown in page, shown


def test_formgrader_keeps_its_own_score_boxes_and_draws_a_pasted_picture_without_error(tmp_path, monkeypatch):
    """Formgrader binds each score box by its grade id: a student's heading `## test_softmax` (nbconvert gave it
    that id) or `<h3 id=...>` came first on the page, and the instructor's score was never saved; a
    `<div class="nbgrader_cell">` with a `full-credit` link made a control of the student's. And a pasted
    picture (Jupyter keeps it as a cell attachment, which the graded copy drops) made nbconvert raise: the
    autograde failed ('nbgrader autograde failed', 0, never graded) and formgrader showed an error page."""
    from autograder.outputs import safe_markdown

    pasted = "My figure:\n\n![image.png](attachment:image.png)"
    assert safe_markdown(pasted) == pasted  # no attachment kept: no error, the cell as written
    course = tmp_path / "course"
    write_course_config(course, f"sqlite:///{tmp_path / 'gradebook.db'}")
    posing = ("## test_softmax\n\n<h3 id=\"test_softmax_stability\">x</h3>\n\n<div class=\"nbgrader_cell\">"
              "<a class=\"btn btn-success full-credit\" href=\"#\">Looks right</a></div>\n\n"
              "<div class=\"alert alert-info\">a note</div>")
    (course / "autograded").mkdir()
    nbformat.write(new_notebook(cells=[new_markdown_cell(posing), new_markdown_cell(pasted)]),
                   course / "autograded" / "posing.ipynb")
    page = formgrader_page(course, course / "autograded" / "posing.ipynb", monkeypatch)
    assert 'id="test_softmax' not in page and "nbgrader_cell\"><a" not in page and "full-credit" not in page
    assert 'class="alert alert-info"' in page and "My figure" in page
