"""`make book`: the course as a static site, with nothing of the grader in it, read offline.

* The scrubber on the real solution notebooks: no hidden test, solution marker, export directive,
  grader import or call, nbgrader metadata nor widget output is left, and every line of every
  reference solution and visible test still is. Then the same checks with each step of the scrubber
  turned off in turn, to show that these tests would catch a scrubber that skipped a pattern, and a
  notebook holding each pattern the course's notebooks do not use (yet).
* The book built once for the module by the function `make book` calls (in a temporary folder,
  with a repository set so the launch buttons are there too), then read as files and in headless
  Chromium, served from 127.0.0.1: the math is typeset by the site's own MathJax (no raw TeX left,
  no TeX error), every request a page makes goes to that server (any other is refused and fails the
  test), search finds "softmax", and no page shows any of the grader.

Chromium: Debian's /usr/bin/chromium driven by playwright, as tests/test_browser.py does (skips,
saying why, without it; never `playwright install`).
"""
from __future__ import annotations

import functools
import http.server
import json
import re
import threading
import urllib.parse
from pathlib import Path

import nbformat
import pytest

from autograder.course import assignments, notebook_path
from course_tools import book
from course_tools.book import scrub
from course_tools.book.scrub import PLUMBING, ScrubError, find_plumbing, scrub_code, scrub_notebook

from .layout import REPO, SOLUTIONS
from .test_browser import WAIT_MS, browser, screenshot, visible_text  # noqa: F401 - browser: a fixture

ASSIGNMENTS = assignments(SOLUTIONS)
REPOSITORY = "course-owner/attention-course@v2"
# what a reader must never see, beyond find_plumbing's own patterns (a second, independent list)
FORBIDDEN = ["autograder", "nbgrader", "BEGIN HIDDEN", "END HIDDEN", "BEGIN SOLUTION", "END SOLUTION",
             "#| export", "#| default_exp", "grade_id", "grader-skip", ".check(\""]
DELIMITERS = re.compile(r"^\s*(#+|<!--)\s*(BEGIN|END) (SOLUTION|HIDDEN TESTS)")


def _solution(name: str) -> nbformat.NotebookNode:
    return nbformat.read(notebook_path(name, SOLUTIONS), as_version=4)


def _dump(nb) -> str:
    """Everything of a notebook but its pictures, as text."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            for key in [k for k in out.get("data", {}) if k.startswith("image/")]:
                del out["data"][key]
    return json.dumps(nb, ensure_ascii=False)


def _leftovers(scrubbed: nbformat.NotebookNode) -> list[str]:
    """What of the grader is left in a scrubbed notebook (empty when nothing)."""
    text = _dump(scrubbed)
    left = [f"{word!r} is left" for word in FORBIDDEN if word in text]
    if re.search(r"\bnb0\d\.check\b", text):
        left.append("a call into the grader's checks is left")
    if "application/vnd.jupyter.widget" in text:
        left.append("a widget output (or the widgets' state) is left")
    if any("nbgrader" in c.metadata or "grader-skip" in c.metadata.get("tags", []) for c in scrubbed.cells):
        left.append("nbgrader metadata or a grader tag is left")
    return left + find_plumbing(scrubbed)


def _assert_clean(original: nbformat.NotebookNode, scrubbed: nbformat.NotebookNode) -> None:
    """Nothing of the grader left in `scrubbed`, and all of the worked code of `original` kept."""
    assert _leftovers(scrubbed) == []
    code = "\n".join(c.source for c in scrubbed.cells if c.cell_type == "code")
    prose = "\n".join(c.source for c in scrubbed.cells if c.cell_type == "markdown")
    for cell in original.cells:
        meta = cell.metadata.get("nbgrader", {})
        kept_in = code if cell.cell_type == "code" else prose
        hidden = False
        for line in cell.source.splitlines():
            if "BEGIN HIDDEN TESTS" in line:
                hidden = True
            if not hidden and line.strip() and not DELIMITERS.match(line) and not line.startswith("#|") \
                    and "autograder" not in line and (meta.get("solution") or meta.get("grade") or cell.cell_type != "code"):
                assert line in kept_in, f"the worked code / visible test / answer line {line!r} was lost"
            if "END HIDDEN TESTS" in line:
                hidden = False


# --------------------------------------------------------------------------- the scrubber, real notebooks
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_scrubber_removes_every_trace_of_the_grader_and_keeps_the_worked_code(name):
    original = _solution(name)
    assert find_plumbing(original), "the solution notebook should hold the grader's plumbing to begin with"
    scrubbed = scrub_notebook(original)
    _assert_clean(original, scrubbed)
    assert original.cells[0].source == scrubbed.cells[0].source  # the introduction is untouched
    assert any(c.metadata.get("nbgrader") for c in original.cells), "scrub_notebook must not change its argument"
    # exercise cells read as worked code: the solution is there, the markers are not
    for cell in original.cells:
        if cell.metadata.get("nbgrader", {}).get("solution") and cell.cell_type == "code":
            body = "\n".join(line for line in cell.source.splitlines()
                             if not DELIMITERS.match(line) and not line.startswith("#|")).strip()
            assert body in "\n".join(c.source for c in scrubbed.cells), f"{cell.metadata.nbgrader.grade_id}: solution lost"


def test_progress_bars_become_text_from_their_last_state():
    original = _solution("06_transformer_translator")
    assert "widgets" in original.metadata
    scrubbed = scrub_notebook(original)
    bars = [o for c in scrubbed.cells for o in c.get("outputs", [])
            if "it/s" in str(o.get("data", {}).get("text/plain", ""))]
    assert bars, "the toy training's progress bar is gone instead of shown as text"
    assert "100%" in bars[0]["data"]["text/plain"] and "█" in bars[0]["data"]["text/plain"]
    assert "widgets" not in scrubbed.metadata


# each step of the scrubber switched off: the checks above must then fail
_SKIPS = {
    "hidden-test blocks": ("_drop_blocks", lambda lines: lines),
    "solution markers": ("_drop_markers", lambda lines: lines),
    "export directives": ("_DIRECTIVE", re.compile(r"(?!)")),
    "grader imports and calls": ("_drop_grader_statements", lambda source: source),
    "nbgrader metadata and grader tags": ("_clean_cell_metadata", lambda metadata: None),
    "widget outputs": ("_scrub_outputs", lambda outputs, state: outputs),
    "widget state": ("_clean_notebook_metadata", lambda metadata: None),
}


@pytest.mark.parametrize("skipped", list(_SKIPS))
def test_the_scrubber_tests_fail_when_a_step_is_skipped(skipped, monkeypatch):
    attribute, replacement = _SKIPS[skipped]
    monkeypatch.setattr(scrub, attribute, replacement)
    caught = []
    for name in ("01_similarity_attention", "06_transformer_translator"):
        original = _solution(name)
        try:
            _assert_clean(original, scrub_notebook(original))
        except AssertionError as exc:
            caught.append(f"{name}: {exc}")
    # the patterns the course's notebooks do not use outside hidden tests (yet)
    caught += _leftovers(scrub_notebook(_synthetic()))
    assert caught, f"with the scrubber's {skipped} step off, the checks still passed"
    if skipped != "grader imports and calls":  # (in the real notebooks these sit inside hidden tests)
        with pytest.raises(ScrubError):  # ... and the build refuses to publish such a chapter
            book.chapters(SOLUTIONS)


def _synthetic() -> nbformat.NotebookNode:
    """A notebook holding each pattern of the grader, also those the course's notebooks do not use."""
    v4 = nbformat.v4
    cells = [
        v4.new_code_cell("#| default_exp thing\n#| export\nimport numpy as np"),
        v4.new_code_cell("# BEGIN SOLUTION\ndef f(x):\n    return 2 * x\n# END SOLUTION",
                         metadata={"nbgrader": {"grade_id": "f", "solution": True, "grade": False}}),
        v4.new_code_cell("import autograder\nimport autograder.checks as chk\nfrom autograder.checks import nb01 as mine\n"
                         "assert f(1) == 2\nmine.check(\n    'f',\n    f,\n)\nchk.nb01.check('f', f)\n"
                         "autograder.checks.nb01.check('f', f)"),
        v4.new_code_cell("try:\n    from autograder.checks import nb01\nexcept ImportError:\n    nb01 = None\n"
                         "if nb01 is not None:\n    nb01.check('f', f)\nprint('worked', f(3))"),
        v4.new_code_cell("### BEGIN HIDDEN TESTS\nfrom autograder.checks import nb01\nnb01.check('f', f)\n### END HIDDEN TESTS",
                         metadata={"nbgrader": {"grade_id": "test_f", "grade": True, "points": 1}}),
        v4.new_markdown_cell("Why?\n\n<!-- BEGIN SOLUTION -->\nBecause twice.\n<!-- END SOLUTION -->\n\n"
                             "=== BEGIN MARK SCHEME ===\nfull marks for 'twice'\n=== END MARK SCHEME ===",
                             metadata={"nbgrader": {"grade_id": "why", "solution": True}}),
        v4.new_code_cell("%time y = f(2)\n# the autograder imports its checks here\nimport importlib\n"
                         "checks = importlib.import_module('autograder.checks')\nprint(y)",
                         metadata={"tags": ["grader-skip", "keep-me"]}),
    ]
    bar = v4.new_output("display_data", data={"text/plain": "step: 0%| | 0/3",
                                             scrub.WIDGET_VIEW: {"model_id": "abc", "version_major": 2}})
    cells[-1].outputs = [bar]
    nb = v4.new_notebook(cells=cells)
    nb.metadata["widgets"] = {scrub.WIDGET_STATE: {"state": {"abc": {"model_name": "FloatProgressModel"}}}}
    nb.metadata["nbgrader"] = {"kernelspec": "x"}
    return nb


def test_every_pattern_of_the_grader_is_found_and_removed():
    nb = _synthetic()
    found = "\n".join(find_plumbing(nb))
    for what, _ in PLUMBING:
        assert what in found, f"find_plumbing does not see {what} in a notebook that has it"
    scrubbed = scrub_notebook(nb)
    assert find_plumbing(scrubbed) == [], find_plumbing(scrubbed)
    text = _dump(scrubbed)
    for word in FORBIDDEN + ["MARK SCHEME", "full marks", "mine.check", "chk."]:
        assert word not in text, word
    sources = [c.source for c in scrubbed.cells]
    assert sources[0] == "import numpy as np"
    assert sources[1] == "def f(x):\n    return 2 * x"
    assert sources[2] == "assert f(1) == 2"
    assert sources[3] == "print('worked', f(3))"  # the try/except and the if: only the grader's
    assert sources[4] == "Why?\n\nBecause twice."  # the hidden-test-only cell is dropped
    assert sources[5] == "%time y = f(2)\nimport importlib\nprint(y)"
    assert scrubbed.cells[5].metadata["tags"] == ["keep-me"]
    assert scrubbed.cells[5].outputs[0]["data"] == {"text/plain": "step: 0%| | 0/3"}
    assert len(scrubbed.cells) == 6


def test_a_grader_call_inside_worked_code_is_cut_out_not_the_code():
    source = "def g(x):\n    y = x + 1\n    nb01.check('g', g)\n    return y\nfrom autograder.checks import nb01"
    assert scrub_code(source) == "def g(x):\n    y = x + 1\n    return y"


# --------------------------------------------------------------------------- settings, Binder
def test_repository_setting():
    assert book.parse_repository(None) is None and book.parse_repository("  ") is None
    assert book.parse_repository("o/n") == book.Repository("o/n", "main")
    assert book.parse_repository("o/n@v1.2") == book.Repository("o/n", "v1.2")
    assert book.parse_repository("https://github.com/o/n.git@dev") == book.Repository("o/n", "dev")
    repo = book.parse_repository("o/n@v1")
    assert repo.colab("notebooks/01_a/01_a.ipynb") == \
        "https://colab.research.google.com/github/o/n/blob/v1/notebooks/01_a/01_a.ipynb"
    for bad in ("o", "o/n/extra", "o n/x"):
        with pytest.raises(ValueError):
            book.parse_repository(bad)


def test_binder_installs_the_course_pins_and_names_no_package_index():
    lines = [line.strip() for line in (REPO / "binder" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    nested = [line.split(None, 1)[1] for line in lines if line.startswith("-r ")]
    assert nested and all((REPO / "binder" / path).resolve().is_file() for path in nested)
    assert not [word for line in lines for word in line.split() if "://" in word], "no index or host named here"
    assert (REPO / "binder" / "runtime.txt").read_text().strip() == "python-3.11"


def test_without_a_repository_the_landing_page_says_how_to_upload_to_colab(tmp_path):
    source = tmp_path / "source"
    listed = book.stage(source, SOLUTIONS, None)
    assert [c.name for c in listed] == ASSIGNMENTS
    index = (source / "index.md").read_text()
    assert "File → Upload notebook" in index and "/content/attention-course/pyproject.toml" in index, \
        "a notebook uploaded alone stops in its first cell: the page says to bring the course along"
    assert "no install cell" in index, "the download button's notebook is for reading"
    assert not re.search(r"^\d+\. .*:$", index, re.M), "a curriculum blurb ends on a colon (its list cut off)"
    assert "colab.research.google.com/github" not in index
    first = nbformat.read(source / ASSIGNMENTS[0] / f"{ASSIGNMENTS[0]}.ipynb", as_version=4)
    assert "Open this chapter in Colab" not in _dump(first)
    assert json.loads((source / "book_settings.json").read_text())["repository"] is None
    svg = (source / "figures" / "architecture.svg").read_text()
    assert "<text" not in svg and "@font-face" not in svg, "the figure's words are drawn as paths: no font to load"
    assert not re.search(r'(?:href|src)="(?:https?:)?//|url\((?:https?:)?//', svg), "the figure loads nothing"


def test_the_book_warns_when_its_buttons_open_notebooks_that_install_another_repository(tmp_path):
    """A reader found `make book BOOK_REPOSITORY=...` gave Colab buttons whose notebooks stop in their first cell:
    those install the repository pyproject.toml names (none here)."""
    (tmp_path / "pyproject.toml").write_text("[project]\nversion = '1.0'\n[tool.attention-course]\nrepository = 'us/course'\n")
    assert book.launch_mismatch(None, tmp_path) == ""
    assert book.launch_mismatch(book.Repository("us/course", "main"), tmp_path) == ""
    said = book.launch_mismatch(book.Repository("someone/fork", "dev"), tmp_path)
    assert "someone/fork@dev" in said and "'us/course'" in said and "make build" in said
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'attention-course'\n")
    assert "name no repository" in book.launch_mismatch(book.Repository("someone/fork", "dev"), tmp_path)


# --------------------------------------------------------------------------- the built book
@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The book, built once by what `make book` runs (python -m course_tools.book), with a repository."""
    out = tmp_path_factory.mktemp("book")
    assert book.main(["--out", str(out), "--repository", REPOSITORY, "--solutions", str(SOLUTIONS)]) == 0
    return out / "html"


def _chapter(site: Path, name: str) -> Path:
    return site / name / f"{name}.html"


def test_the_book_has_a_page_per_chapter_in_order_and_a_landing_page(site):
    assert (site / "index.html").is_file() and (site / "search.html").is_file() and (site / "searchindex.js").is_file()
    for name in ASSIGNMENTS:
        assert _chapter(site, name).is_file(), name
    index = (site / "index.html").read_text()
    positions = [index.index(f'href="{name}/{name}.html"') for name in ASSIGNMENTS]
    assert positions == sorted(positions), "the chapters are not listed in order"
    assert "Curriculum" in index and "Attention from similarity" in index
    img = re.search(r'<img[^>]*architecture\.svg[^>]*>', index)
    assert img and "encoder" in img.group(0) and "decoder" in img.group(0), "the architecture figure and its alt text"
    assert (site / "_images" / "architecture.svg").is_file()


def test_no_file_of_the_site_holds_the_grader(site):
    for path in site.rglob("*"):
        if path.is_file() and path.suffix in (".html", ".js", ".ipynb", ".txt", ".json") and "mathjax" not in path.parts:
            text = path.read_text(errors="replace")
            for word in FORBIDDEN:
                assert word not in text, f"{path.relative_to(site)} holds {word!r}"


def test_pages_load_nothing_from_outside_and_link_colab(site):
    repo = book.parse_repository(REPOSITORY)
    for page in site.glob("**/*.html"):
        html = page.read_text()
        for tag, url in re.findall(r'<(script|link|img|iframe|source|embed)\b[^>]*?\b(?:src|href)="([^"]+)"', html):
            assert "://" not in url and not url.startswith("//"), f"{page.name}: <{tag}> loads {url}"
        assert "cdn" not in " ".join(re.findall(r'<script[^>]*>', html)).lower()
    assert (site / "_static" / "mathjax" / "MathJax.js").is_file()
    for name in ASSIGNMENTS:
        html = _chapter(site, name).read_text()
        assert repo.colab(f"notebooks/{name}/{name}.ipynb") in html, f"{name}: no Colab link to the student notebook"
        assert repo.colab(f"solutions/{name}/{name}.ipynb") in html, f"{name}: no Colab link to the solved notebook"
        assert "_static/mathjax/MathJax.js" in html


# --------------------------------------------------------------------------- in a browser
@pytest.fixture(scope="module")
def server(site):
    """The site on 127.0.0.1 (a port of its own), as a reader's static host serves it."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def reader(browser, server):  # noqa: F811 - browser: the fixture imported from test_browser
    """A page whose every request is checked: one to another host is refused and recorded."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(WAIT_MS)
    local = urllib.parse.urlsplit(server).netloc
    outside, seen = [], []

    def gate(route):
        url = route.request.url
        if urllib.parse.urlsplit(url).netloc == local:
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", gate)
    page = context.new_page()
    page.on("request", lambda request: seen.append(request.url))
    try:
        yield page, server, outside, seen
    finally:
        context.close()


def _typeset(page) -> dict:
    """Wait for MathJax's first typesetting to end; what it made of the page's math."""
    page.wait_for_function("() => window.MathJax && MathJax.Hub && MathJax.Hub.Register", timeout=WAIT_MS)
    page.evaluate("() => new Promise(done => MathJax.Hub.Register.StartupHook('End', done))")
    return page.evaluate(r"""() => {
        const article = document.querySelector('article') || document.body;
        const rendered = article.querySelectorAll('.MathJax, .MathJax_Display').length;
        const errors = article.querySelectorAll('.noError, .MathJax_Error, .MJX_Assistive_MathML merror, '
                                                + '.MJX_Assistive_MathML mtext[mathcolor="red"]').length;
        const prose = article.cloneNode(true);
        prose.querySelectorAll('pre, code, script, style, .MathJax, .MathJax_Display, .MathJax_Preview, '
                               + '.MJX_Assistive_MathML, .cell_output, .output').forEach(e => e.remove());
        return {rendered, errors, text: prose.textContent};
    }""")


def test_every_page_typesets_its_math_offline_and_shows_nothing_of_the_grader(reader, tmp_path):
    page, base, outside, seen = reader
    missing = []  # a file the site does not have: MathJax asked for a TeX font of \mathbb that the copy lacks
    page.on("response", lambda response: missing.append(response.url) if response.status >= 400 else None)
    for name in ["index", *ASSIGNMENTS]:
        path = "index.html" if name == "index" else f"{name}/{name}.html"
        page.goto(f"{base}/{path}", wait_until="load")
        math = _typeset(page)
        if name != "index":
            assert math["rendered"] > 5, f"{name}: MathJax typeset {math['rendered']} formulas"
        assert math["errors"] == 0, f"{name}: {math['errors']} TeX errors on the page"
        raw = re.findall(r"\$[^$\n]{1,80}\$|\\\(|\\\[|\\begin\{", math["text"])
        assert not raw, f"{name}: raw TeX on the page: {raw[:5]}"
        text = visible_text(page)
        for word in FORBIDDEN:
            assert word not in text, f"{name}: the page shows {word!r}"
        if name == "01_similarity_attention":
            assert "return S / S.sum(axis=1, keepdims=True)" in text  # the exercise, as worked code
            assert "Open this chapter in Colab" in text
            screenshot(page, tmp_path, "book-01.png")
        if name == "index":
            screenshot(page, tmp_path, "book-index.png")
    assert not outside, f"requests to other hosts: {sorted(set(outside))}"
    assert not missing, f"files the pages asked for that the site lacks: {sorted(set(missing))}"
    schemes = {urllib.parse.urlsplit(url).scheme for url in seen}
    assert schemes <= {"http", "about", "data", "blob"}, schemes
    fonts = [url for url in seen if urllib.parse.urlsplit(url).path.endswith(".woff")]
    assert fonts and all(url.startswith(base) for url in fonts), "MathJax's fonts come from the site itself"


def test_search_finds_softmax(reader, tmp_path):
    from playwright.sync_api import expect

    page, base, outside, _ = reader
    page.goto(f"{base}/search.html?q=softmax", wait_until="load")
    results = page.locator("#search-results ul.search li")
    # Sphinx adds the results one by one, then its summary ("... found N pages ..."): count after that
    expect(page.locator("#search-results .search-summary")).to_contain_text(re.compile(r"found (one|\d+) page"),
                                                                         timeout=WAIT_MS)
    assert results.count() >= 5, f"{results.count()} results for softmax"
    links = [results.nth(i).locator("a").first.get_attribute("href") for i in range(results.count())]
    assert any("01_similarity_attention" in (href or "") for href in links), links
    assert not outside, outside
    screenshot(page, tmp_path, "book-search.png")
