"""End to end, in a real browser (headless Chromium from Debian, driven by Playwright):

* a student's day in JupyterLab: open notebook 01, Run All, see the visible test fail with
  NotImplementedError, type the `normalize_rows` answer into its cell, re-run it and its test, and
  see the error go;
* what a grading run shows a person: a student's feedback page (score, the test cells, the
  message naming their mistake) and the class report (its per-exercise picture drawn), opened from
  disk as an instructor would, with no traceback on screen;
* (placeholder) the in-Lab check.

Screenshots go to pytest's tmp_path and are copied to build/screenshots/ (or $ATTN_SCREENSHOTS)
for a human to look at. Needs /usr/bin/chromium (Debian's `chromium`; .ci/run installs it) and
the `playwright` package; skips, saying which is missing, otherwise. Never `playwright install`:
its browser downloads are not reachable from here.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.course import notebook_path
from course_tools.net import free_port

from .layout import NOTEBOOKS, REPO, SOLUTIONS

pytestmark = pytest.mark.slow

A01 = "01_similarity_attention"
CHROMIUM = Path("/usr/bin/chromium")
# --disable-background-networking & co: Chromium's own calls home are refused by this closed
# network (and would only slow it down); --no-sandbox: we run as root.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 90_000  # generous: CI shares two cores with the rest of the suite
LAB_START_S = 120
SHOTS = Path(os.environ.get("ATTN_SCREENSHOTS") or REPO / "build" / "screenshots")


# --------------------------------------------------------------------------- browser
def _need_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium; .ci/run does)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -r requirements.txt); "
                    "the browser itself is Debian's chromium, never `playwright install`")


@pytest.fixture(scope="module")
def browser():
    _need_browser()
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=30_000)  # static pages too: CI shares two cores
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(WAIT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot(page, tmp_path: Path, name: str, full_page: bool = False) -> Path:
    """A PNG in tmp_path, copied to SHOTS (build/screenshots/ by default) for a human to look at."""
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 1000, f"empty screenshot {path}"
    try:
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SHOTS / name)
    except OSError:
        pass  # a read-only checkout: tmp_path still has it
    return path


def visible_text(page) -> str:
    """What a person can read: the body's innerText (hidden elements left out)."""
    return page.locator("body").inner_text()


# --------------------------------------------------------------------------- JupyterLab
def lab_command(root_dir: Path, port: int, token: str) -> list[str]:
    """How the test starts JupyterLab: `attn-course lab`, as a student does (it turns on the
    course's check behind the Validate button and turns off the instructor's tools). The student's
    folder is outside the course here, so the course is named with --course."""
    return [str(Path(sys.executable).parent / "attn-course"), "--course", str(REPO), "lab", "--no-browser", "--allow-root",
            f"--ServerApp.token={token}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.root_dir={root_dir}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def _lab_env(home: Path) -> dict:
    """Lab's per-user state (settings, workspaces, runtime files) in the test's own folder, with the
    news / update notifications off: a toast must not cover the notebook."""
    settings = home / "settings"
    (settings / "@jupyterlab" / "apputils-extension").mkdir(parents=True)
    (settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ)
    env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
               PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""))
    return env


@pytest.fixture
def lab(tmp_path):
    """JupyterLab on a copy of notebook 01's student folder: (base url, token, root folder)."""
    _need_browser()  # no browser: do not even start Lab
    root = tmp_path / "student" / A01
    shutil.copytree(NOTEBOOKS / A01, root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    port, token = free_port(), secrets.token_hex(16)
    log = (tmp_path / "lab.log").open("wb")
    proc = subprocess.Popen(lab_command(root, port, token), cwd=root, env=_lab_env(tmp_path / "jupyter"),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + LAB_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in {LAB_START_S} s:\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token, root
    finally:
        _stop_lab(proc, base, token)
        log.close()


def _stop_lab(proc: subprocess.Popen, base: str, token: str) -> None:
    """Ask the server to shut down (it stops its kernels), then SIGTERM, then SIGKILL its group."""
    if proc.poll() is None:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST"),
                                   timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    try:  # anything left in the group this test started (a kernel the server did not stop)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _solution_cell(grade_id: str) -> str:
    """The reference answer of a solution cell, delimiters removed (what a student would type)."""
    from course_tools.demo import strip_solution_delimiters

    nb = nbformat.read(notebook_path(A01, SOLUTIONS), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return strip_solution_delimiters(cell.source).strip() + "\n"


def _code_cell(notebook, text: str):
    """The code cell whose editor shows `text` (a line near its top: CodeMirror draws what is in view)."""
    cell = notebook.locator(".jp-CodeCell").filter(has=notebook.page.locator(".cm-content", has_text=text))
    cell.first.scroll_into_view_if_needed()
    return cell.first


def _prompt(cell) -> str:
    return cell.locator(".jp-InputArea-prompt, .jp-InputPrompt").first.inner_text().strip()


def _wait_idle(page) -> None:
    """The kernel is idle and no cell is waiting ([*]) to run."""
    from playwright.sync_api import expect

    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                        ".jp-KernelStatus:has-text('Idle')").first).to_be_attached(timeout=WAIT_MS)
    page.wait_for_function(
        "() => ![...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')].some(p => p.textContent.includes('*'))",
        timeout=WAIT_MS)


def test_student_runs_notebook_01_and_fixes_an_exercise_in_lab(lab, page, tmp_path):
    from playwright.sync_api import expect

    base, token, _ = lab
    page.goto(f"{base}/lab/tree/{A01}.ipynb?token={token}", wait_until="domcontentloaded", timeout=WAIT_MS)
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first
    expect(notebook).to_be_visible(timeout=WAIT_MS)
    cells = len(nbformat.read(notebook_path(A01, NOTEBOOKS), as_version=4).cells)
    expect(notebook.locator(".jp-Cell")).to_have_count(cells, timeout=WAIT_MS)  # the whole notebook is in
    _wait_idle(page)  # the kernel has started

    # Run > Run All Cells, as a student would
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^\s*Run\s*$")).click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()
    answer = _code_cell(notebook, "def normalize_rows(S")
    test = _code_cell(notebook, "W1 = normalize_rows(S1)")
    expect(test.locator(".jp-OutputArea-output")).to_contain_text("NotImplementedError", timeout=WAIT_MS)
    _wait_idle(page)
    # the cells above ran for real: the hand-made similarity matrices are drawn
    expect(notebook.locator(".jp-OutputArea-output img").first).to_be_visible(timeout=WAIT_MS)
    assert "NotImplementedError" in test.locator(".jp-OutputArea-output").first.inner_text()
    before = _prompt(test)
    assert re.fullmatch(r"\[\d+\]:", before), f"the test cell did not run: prompt {before!r}"
    test.locator(".jp-OutputArea-output").first.scroll_into_view_if_needed()
    screenshot(page, tmp_path, "lab-01-run-all.png")

    # type the answer: click into the editor, select all, type the reference solution
    answer.locator(".jp-InputArea-editor .cm-content").click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(_solution_cell("normalize_rows"))
    editor = answer.locator(".jp-InputArea-editor .cm-content")
    expect(editor).to_contain_text("S.sum(axis=1, keepdims=True)")
    expect(editor).not_to_contain_text("NotImplementedError")

    # Shift+Enter runs the answer and moves to its test; Shift+Enter again runs the test
    page.keyboard.press("Shift+Enter")
    expect(test).to_have_class(re.compile(r"\bjp-mod-active\b"), timeout=WAIT_MS)
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        """([cell, before]) => {
               const p = cell.querySelector('.jp-InputPrompt');
               const t = p ? p.textContent.trim() : '';
               return /^\\[\\d+\\]:$/.test(t) && t !== before;
           }""", arg=[test.element_handle(), before], timeout=WAIT_MS)
    _wait_idle(page)
    test.scroll_into_view_if_needed()
    expect(test.locator(".jp-OutputArea-output")).to_have_count(0)  # the test passes silently
    expect(answer.locator(".jp-OutputArea-output")).to_have_count(0)
    assert re.fullmatch(r"\[\d+\]:", _prompt(answer)), f"the answer cell did not run: {_prompt(answer)!r}"
    screenshot(page, tmp_path, "lab-02-normalize_rows-solved.png")


# --------------------------------------------------------------------------- grading output
@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """A real, small grading run: alice solved notebook 01, bob made the demo's softmax mistake."""
    _need_browser()  # no browser: do not spend half a minute grading
    from autograder.grade import grade
    from course_tools.demo import DEMO_MISTAKES, find_mistake, solved, with_mistake

    root = tmp_path_factory.mktemp("browser-grading")
    release = nbformat.read(notebook_path(A01, NOTEBOOKS), as_version=4)
    full = solved(release, nbformat.read(notebook_path(A01, SOLUTIONS), as_version=4))
    module, graded, mistake, failing = DEMO_MISTAKES[A01]
    wrong = with_mistake(full, graded, find_mistake(module, graded, mistake))
    for student, nb in {"alice": full, "bob": wrong}.items():
        (root / "class" / student).mkdir(parents=True)
        nbformat.write(nb, root / "class" / student / f"{A01}.ipynb")
    results = grade(root / "class", root / "out", progress=False, workers=2, assignments=[A01])
    by_student = {r.student_id: r for r in results}
    assert set(by_student) == {"alice", "bob"}
    tests = [c.metadata["nbgrader"]["grade_id"] for c in release.cells
             if c.metadata.get("nbgrader", {}).get("grade") and not c.metadata["nbgrader"].get("solution")]
    return {"out": root / "out", "results": by_student, "mistake": mistake, "failing": failing, "tests": tests}


def _score_pattern(score: float, top: float) -> re.Pattern:
    return re.compile(rf"{score:g}(\.0+)?\s*/\s*{top:g}(\.0+)?")


@pytest.mark.parametrize("student", ["bob", "alice"])
def test_feedback_page_shows_score_tests_and_mistake(graded_class, page, tmp_path, student):
    from playwright.sync_api import expect

    result = graded_class["results"][student]
    html = graded_class["out"] / "feedback" / student / f"{A01}.html"
    assert html.is_file(), f"no feedback page at {html}"
    page.goto(html.as_uri(), wait_until="load")
    text = visible_text(page)
    assert _score_pattern(result.score, result.max_score).search(text), \
        f"score {result.score:g} / {result.max_score:g} not on the page"
    for test_id in graded_class["tests"]:
        expect(page.get_by_text(test_id, exact=True).first).to_be_visible()
    screenshot(page, tmp_path, f"feedback-{student}.png")  # the top: score and the list of tests
    named = f"This matches a known mistake: {graded_class['mistake']}."
    if student == "bob":
        assert result.score < result.max_score
        message = page.get_by_text(named).first
        expect(message).to_be_visible()
        for test_id in graded_class["failing"]:
            assert test_id in text
        message.scroll_into_view_if_needed()
        screenshot(page, tmp_path, f"feedback-{student}-mistake.png")
    else:
        assert result.score == result.max_score
        assert "known mistake" not in text
    assert "Traceback" not in text
    screenshot(page, tmp_path, f"feedback-{student}-full.png", full_page=True)


def test_class_report_shows_the_per_exercise_picture(graded_class, page, tmp_path):
    from playwright.sync_api import expect

    report = graded_class["out"] / "report.html"
    page.goto(report.as_uri(), wait_until="load")
    text = visible_text(page)
    assert A01 in text
    assert graded_class["mistake"] in text  # the most frequent recognised mistakes
    assert "Traceback" not in text
    pictures = page.locator("img")
    expect(pictures.first).to_be_visible()
    for i in range(pictures.count()):
        img = pictures.nth(i)
        img.scroll_into_view_if_needed()
        expect(img).to_be_visible()
        assert img.evaluate("i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0"), \
            f"picture {i} did not decode: {img.get_attribute('alt')}"
        box = img.bounding_box()
        assert box and box["width"] > 50 and box["height"] > 50, f"picture {i} is drawn at {box}"
    screenshot(page, tmp_path, "class-report.png", full_page=True)


# --------------------------------------------------------------------------- in-Lab check
def _open_with_softmax(lab, page, softmax: str):
    """Notebook 01, solved but for `softmax`, written into the student's folder and opened in Lab."""
    from playwright.sync_api import expect

    from course_tools.demo import solved, with_mistake

    base, token, root = lab
    release = nbformat.read(notebook_path(A01, NOTEBOOKS), as_version=4)
    nb = solved(release, nbformat.read(notebook_path(A01, SOLUTIONS), as_version=4))
    nbformat.write(with_mistake(nb, "softmax", softmax), root / f"{A01}.ipynb")
    page.goto(f"{base}/lab/tree/{A01}.ipynb?token={token}", wait_until="domcontentloaded", timeout=WAIT_MS)
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").first).to_be_visible(timeout=WAIT_MS)


def test_in_lab_check_shows_pass_fail_and_hints(lab, page, tmp_path):
    """The student presses Validate: the dialog shows the grader's own verdicts (PASS, FAIL with the
    known mistake's hint, TODO), no traceback; the instructor's tools are not in the student's Lab."""
    from playwright.sync_api import expect

    _open_with_softmax(lab, page, "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)\n")
    assert not page.locator(".lm-MenuBar-item", has_text=re.compile(r"^\s*Nbgrader\s*$")).count(), \
        "the instructor's Nbgrader menu is in the student's Lab"
    assert not page.locator(".validate-button").count(), "nbgrader's own Validate button shows beside ours"
    page.locator(".attn-validate-button").first.click()
    dialog = page.locator(".jp-Dialog", has_text="Validation Results")
    expect(dialog).to_be_visible(timeout=WAIT_MS)
    report = dialog.locator(".attn-check-report")
    expect(report).to_contain_text("points", timeout=WAIT_MS)
    text = report.inner_text()
    assert re.search(r"PASS\s+normalize_rows", text) and re.search(r"FAIL\s+softmax", text), text
    assert "This matches a known mistake: softmax without subtracting the max" in text, text
    assert "Traceback" not in dialog.inner_text()
    screenshot(page, tmp_path, "lab-validate.png")


def test_validate_shows_progress_and_cancel_stops_a_loop(lab, page, tmp_path):
    """A loop in softmax: the Validate dialog says which cell is running and counts its seconds, and
    its Cancel button stops the check at once, saying so (no two minutes of "Validating...")."""
    from playwright.sync_api import expect

    _open_with_softmax(lab, page, "def softmax(x, axis=-1):\n    while True:\n        pass\n")
    page.locator(".attn-validate-button").first.click()
    progress = page.locator(".jp-Dialog .attn-check-progress")
    # 10 s on one cell: the loop (no other cell of 01 takes that long; the first imports take ~3 s)
    expect(progress).to_contain_text(re.compile(r"Running: .*softmax.*\n?\s*\d\d s of its \d+ s limit · step \d+ of \d+"),
                                     timeout=2 * WAIT_MS)
    expect(progress).to_contain_text("in all")
    screenshot(page, tmp_path, "lab-validate-progress.png")
    page.locator(".jp-Dialog button", has_text="Cancel check").click()
    stopped = page.locator(".jp-Dialog", has_text="Check cancelled")
    expect(stopped).to_be_visible(timeout=WAIT_MS)
    expect(stopped).to_contain_text("nothing was graded")
    screenshot(page, tmp_path, "lab-validate-cancelled.png")
