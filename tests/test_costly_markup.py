"""A notebook's markdown and HTML are parsed by the grader itself (made inert for formgrader's page and the feedback),
in html5lib, whose work grows with the square of the nesting: a red team's 48,000 nested `<ul>` in one markdown cell
took two minutes a pass, a 2 MB cell hours, with every other student's grade waiting on the course's lock, and two
such HTML outputs took a student's own check seven minutes. Such markup is now never parsed: a note stands in its
place. A notebook whose cells list holds a string or null, or a source list a number, made the grader itself fail
("error": no 0, no export, graded again on every run); such cells are now no cells."""
from __future__ import annotations

import json

import nbformat
import pytest

from autograder import outputs
from autograder.outputs import NESTING_LIMIT, PARSE_LIMIT, TOO_LARGE
from autograder.outputs import too_costly as costly

from .conftest import autograde, failed_cells, solved_notebook

A01 = "01_similarity_attention"
DEEP = "<ul>" * 48_000


@pytest.mark.parametrize("markup, costly_", [
    (DEEP, True),  # longer than the limit
    ("<div>" * (NESTING_LIMIT + 1), True),  # short, too deep
    ("<div/>" * (NESTING_LIMIT + 1), True),  # `<div/>` opens a div all the same
    ("<b>x" * (NESTING_LIMIT + 1), True),
    ("<p>a" * 1500 + "<li>b" * 1500 + "<br>" * 1500, False),  # closed by the next of their kind, or void
    ("<table>" + "<tr><td>1</td><td>2</td></tr>" * 800 + "</table>", False),  # an 800-row table
    ("<table>" + "<tr><td>x" * 10_000, True),  # too many rows: html5lib slows down with each
    ("<svg>" + "<g></i>" * 6000, True),  # foreign content, stray end tags (a reviewer: 45 s)
    ("<svg>" + "<g></i>" * 45, True),  # nested all the same
    ("<div></i>" * 11_000, True),  # an end tag that closes nothing closes nothing (a reviewer: 9 s)
    ("<div title=\"<\">" * 50, True),  # a quoted "<" inside a tag
    ("1. `<bos> a b <eos>`\n" * 30, False),  # markdown code is text, not elements (notebook 06 prose)
    ("x" * (PARSE_LIMIT - 1), False),
])
def test_what_the_grader_will_not_parse(markup, costly_):
    assert bool(costly(markup)) is costly_


def _never_parsed(monkeypatch):
    def parse(*args, **kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(outputs, "render_markdown", parse)
    monkeypatch.setattr(outputs, "clean_html", parse)
    import bleach.html5lib_shim as shim
    monkeypatch.setattr(shim.BleachHTMLParser, "parseFragment", parse)


def test_costly_markup_is_never_parsed(monkeypatch):
    _never_parsed(monkeypatch)
    assert outputs.safe_markdown(DEEP).startswith("*[the grader does not show this markdown cell: 192,000 characters")
    assert outputs.safe_html(DEEP) is None and DEEP not in outputs.safe_raw(DEEP)
    html = {"output_type": "display_data", "data": {"text/html": DEEP, "text/plain": "<IPython.core.display.HTML>"}}
    shown, _ = outputs.student_outputs([html], outputs.NOTEBOOK_OUTPUT_LIMIT)
    assert [list(out["data"]) for out in shown] == [["text/plain"]]  # the HTML dropped unread, the text kept
    bigger = {"output_type": "display_data", "data": {"text/html": DEEP * 2}}  # past the cell's limit: not read either
    assert outputs.student_outputs([bigger], outputs.NOTEBOOK_OUTPUT_LIMIT)[0][0]["text"] == TOO_LARGE + "\n"


def test_a_notebook_with_deeply_nested_markup_is_graded_and_its_page_shows_a_note(course):
    nb = solved_notebook(course, A01)
    nb.cells.append(nbformat.v4.new_markdown_cell("<ul>" * 30_000))
    result = autograde(course, A01, nb)
    assert result.score == result.max_score == 17 and not failed_cells(result)
    graded = json.loads(next((course.root / "autograded").glob(f"{result.student_id}/{A01}/{A01}.ipynb")).read_text())
    shown = [c for c in graded["cells"] if "does not show this markdown cell" in "".join(c["source"])]
    assert len(shown) == 1 and "<ul><ul>" not in json.dumps(graded)


@pytest.mark.parametrize("junk", ["a string", None, 7, ["a", "list"]], ids=["string", "null", "number", "list"])
def test_cells_that_are_no_cells_are_left_out_and_the_notebook_graded(course, junk):
    nb = json.loads(nbformat.writes(solved_notebook(course, A01)))
    nb["cells"].append(junk)
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                        "source": ["x = 1\n", 2]})
    result = autograde(course, A01, json.dumps(nb).encode())
    assert result.status.value == "ok" and result.score == result.max_score == 17, (result.status, result.detail)
