"""Manual grading in nbgrader's formgrader, on the gradebook `attn-course grade` wrote.

* The feedback page's settings reach the feedback exporter alone: formgrader renders a submission
  with its own 'formgrade' template (with ours it failed: TemplateNotFound, "Sorry, the formgrader
  encountered an error").
* `attn-course formgrader OUT` refuses, saying what to give, a folder that is not a grading output,
  points a copied one's settings at the copy, and starts `jupyter server` on the grading course with
  formgrader on.
* A student's picture from another host is fetched neither by formgrader's page nor by the feedback
  page (a tracking pixel): the browser is told so (a Content-Security-Policy).
* A student's link followed from either page sends its host no Referer (the page's address).
* Without an exchange folder formgrader says so once, not at every page.
* End to end in a real browser (Debian's chromium, as in test_browser.py): a class of three is
  graded, formgrader is started with the command, a submission opened from the list of
  submissions, a manual grade, extra credit and a comment entered; they are in the gradebook, in
  grades.csv and grades_wide.csv after the next grading run, and survive a forced regrade (whose
  feedback page then shows the comment).
"""
from __future__ import annotations

import base64
import csv
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autograder.course import write_course_config
from autograder.grade import grade
from course_tools import cli
from course_tools.net import free_port

from . import test_browser
from .layout import REPO
from .setups import A01, class_of_three
from .test_browser import _lab_env, _need_browser, _stop_lab, screenshot, visible_text

browser, page = test_browser.browser, test_browser.page  # the same fixtures: headless chromium, one page per test

FAILED_TEST = "test_normalize_rows"  # 0 / 2 for the student "mistake" (normalize_rows divides by the total)
EXTRA_ON = "test_contextualize"  # passed (2 / 2): extra credit on top
COMMENT = "Each row must be divided by its own sum (axis=1); half the points for the idea."
SERVER_START_S = 120


# --------------------------------------------------------------------------- settings, no browser
def test_feedback_settings_reach_the_feedback_exporter_alone(tmp_path):
    """formgrader's exporter keeps its 'formgrade' template; feedback's gets ours, its folder and filter."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.converters import GenerateFeedback
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.server_extensions.formgrader.formgrader import FormgradeExtension
    from traitlets.config.loader import PyFileConfigLoader

    from autograder.plugins import FeedbackExporter

    write_course_config(tmp_path / "course")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path / "course")).load_config()
    formgrade = FormgradeExtension().build_extra_config()
    formgrade.merge(config)  # the course's file is read over the extension's own settings
    assert HTMLExporter(config=formgrade).template_name == "formgrade"

    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    exporter = converter.exporter_class(parent=converter, config=converter.config)
    assert isinstance(exporter, FeedbackExporter)
    assert exporter.template_name == "feedback"
    assert [Path(p).name for p in exporter.extra_template_basedirs] == ["templates"]
    assert Path(exporter.extra_template_basedirs[0]).parent.name == "autograder"
    assert exporter.filters == {"markdown2html": "autograder.plugins.markdown2html"}


# --------------------------------------------------------------------------- the command, no server
def formgrader_error(capsys, out: Path) -> str:
    assert cli.main(["formgrader", str(out)]) == 2
    return capsys.readouterr().err


def test_formgrader_says_what_to_give_when_out_is_not_a_grading_output(tmp_path, capsys):
    err = formgrader_error(capsys, tmp_path / "nowhere")
    assert "does not exist" in err and "attn-course grade SUBMISSIONS --out OUT" in err
    (tmp_path / "file").write_text("")
    assert "is not a folder" in formgrader_error(capsys, tmp_path / "file")
    err = formgrader_error(capsys, tmp_path)
    assert "is not a grading output" in err and "gradebook.db" in err and "attn-course formgrader OUT" in err
    graded = tmp_path / "graded"
    write_course_config(graded / "course", f"sqlite:///{graded / 'gradebook.db'}")
    (graded / "gradebook.db").write_bytes(b"")
    assert f"the grading output in it: {graded}" in formgrader_error(capsys, tmp_path)


def test_formgrader_on_a_copied_grading_output_opens_the_copy_and_says_so(tmp_path, capsys, monkeypatch):
    """A copy (or a move) still names the old folder in its nbgrader settings: formgrader would show and
    write the old gradebook. Its settings are pointed at the copy first, as `grade` and `export` do."""
    old, new = tmp_path / "old", tmp_path / "new"
    write_course_config(old / "course", f"sqlite:///{old / 'gradebook.db'}")
    (old / "gradebook.db").write_bytes(b"")
    shutil.copytree(old, new)
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append(cmd))
    monkeypatch.setattr(cli.os, "chdir", lambda folder: calls.append(folder))
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    assert cli.main(["formgrader", str(new), "--no-browser"]) == 0
    said = capsys.readouterr().out
    assert f"{new} was graded as {old} before (copied or moved)" in said
    assert cli._recorded_root(new / "course") == (new / "course").resolve()
    assert cli._recorded_root(old / "course") == (old / "course").resolve()  # the old one is left as it was
    assert calls[0] == (new / "course").resolve()
    assert cli.main(["formgrader", str(new), "--no-browser"]) == 0  # once settled, nothing more to say
    assert "was graded as" not in capsys.readouterr().out


def test_formgrader_on_a_copied_grading_output_it_cannot_rewrite_says_what_to_do(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    write_course_config(old / "course", f"sqlite:///{old / 'gradebook.db'}")
    (old / "gradebook.db").write_bytes(b"")
    shutil.copytree(old, new)
    config = new / "course" / "nbgrader_config.py"
    config.write_text(config.read_text().replace("c.CourseDirectory.root =", "c.CourseDirectory.other ="))
    err = formgrader_error(capsys, new)
    assert "does not name its course root" in err and "grade the class into a new folder" in err


def test_formgrader_starts_jupyter_server_in_the_grading_course(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    write_course_config(out / "course", f"sqlite:///{out / 'gradebook.db'}")
    (out / "gradebook.db").write_bytes(b"")
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append(cmd))
    monkeypatch.setattr(cli.os, "chdir", lambda folder: calls.append(folder))
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # _formgrader puts this venv's bin first
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)  # _formgrader hands the server its token here
    assert cli.main(["formgrader", str(out / "course"), "--port", "8899", "--no-browser", "--allow-root"]) == 0
    [folder, cmd] = calls
    assert folder == (out / "course").resolve()
    assert cmd[:3] == [sys.executable, "-m", "jupyter_server"]
    assert f"--ServerApp.root_dir={folder}" in cmd and "--ServerApp.port=8899" in cmd and "--no-browser" in cmd
    assert "--ServerApp.port_retries=0" in cmd and "--allow-root" in cmd
    assert cmd[cmd.index("--ServerApp.jpserver_extensions") + 1] == "nbgrader.server_extensions.formgrader=True"
    token = os.environ["JUPYTER_TOKEN"]  # the server's environment: only its own user reads it
    assert len(token) >= 32 and not any(token in a or "token" in a.lower() for a in cmd), cmd  # /proc shows argv to all
    assert f"http://127.0.0.1:8899/formgrader?token={token}" in capsys.readouterr().out
    assert cli.main(["formgrader", str(out), "--port", "0"]) == 2
    assert "--port 0" in capsys.readouterr().err


# --------------------------------------------------------------------------- in the browser
class Tracker:
    """A host elsewhere that counts the pictures browsers ask it for (a student's 'tracking pixel'), at
    127.0.0.1; it also serves pages (`pages`, uncounted) at http://localhost:PORT/pages/NAME, another
    origin: a feedback page put on a web server, or a control page without the rule."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.followed: dict[str, str | None] = {}  # a student's link followed -> the Referer it came with
        self.pages: dict[str, bytes] = {}
        tracker = self

        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                page = tracker.pages.get(self.path.removeprefix("/pages/"))
                if self.path.startswith("/link-"):
                    tracker.followed[self.path] = self.headers.get("Referer")
                    page = b"<p>a student's page</p>"
                elif page is None and self.path != "/favicon.ico":  # the browser's own ask of a page's server
                    tracker.asked.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif" if page is None else "text/html; charset=utf-8")
                self.end_headers()
                self.wfile.write(base64.b64decode("R0lGODlhAQABAAAAACwAAAAAAQABAAACAkQBADs=") if page is None else page)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def page(self, name: str, html: bytes) -> str:
        """`html` served by this host under another origin (localhost, not 127.0.0.1): its address."""
        self.pages[name] = html
        return f"http://localhost:{self.server.server_port}/pages/{name}"

    def pictures(self, tag: str) -> str:
        """A markdown cell's text with a picture from this host in both spellings a student has."""
        return f"Look: ![a plot]({self.url}/{tag}-markdown.gif)\n\n<img src=\"{self.url}/{tag}-html.gif\" alt=\"a plot\">\n"

    def link(self, tag: str) -> str:
        """A markdown cell's text with a link to this host (followed: recorded with its Referer)."""
        return f"More in [my notes {tag}]({self.url}/link-{tag})\n"


@pytest.fixture(scope="module")
def tracker():
    found = Tracker()
    yield found
    found.server.shutdown()


@pytest.fixture(scope="module")
def graded(tracker):
    """Three students' notebook 01 (solved, one mistake, blank), graded for real: (submissions, out).
    The student "mistake" also put pictures from another host (`tracker`) in a markdown cell of theirs."""
    _need_browser()  # no browser: do not spend half a minute grading
    for folder, notebooks in class_of_three():
        subs, out = folder / "submissions", folder / "out"
        mistake = json.loads(notebooks["mistake"].read_text())
        mistake["cells"].append({"cell_type": "markdown", "metadata": {}, "source": tracker.pictures("page")})
        mistake["cells"].append({"cell_type": "markdown", "metadata": {}, "source": tracker.link("page")})
        notebooks["mistake"].write_text(json.dumps(mistake))
        results = {r.student_id: r for r in grade(subs, out, progress=False, workers=2, assignments=[A01])}
        failed = {c.grade_id: c.score for c in results["mistake"].cells if c.score < c.max_score}
        assert FAILED_TEST in failed and failed[FAILED_TEST] == 0, failed
        yield subs, out, results["mistake"].score


def _wait_for_url(log: Path, proc: subprocess.Popen) -> str:
    """The formgrader address the command printed before it started the server."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"http://\S+/formgrader\?token=\w+", log.read_text(errors="replace"))
        if found:
            return found.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    pytest.fail(f"`attn-course formgrader` printed no address:\n{log.read_text(errors='replace')[-3000:]}")


def _wait_for_server(base: str, token: str, log: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"formgrader exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    pytest.fail(f"formgrader did not answer in {SERVER_START_S} s:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture
def formgrader(graded, tmp_path):
    """`attn-course formgrader OUT` on a free port, as an instructor starts it: the URL it printed."""
    _, out, _ = graded
    command = [str(Path(sys.executable).parent / "attn-course"), "--course", str(REPO), "formgrader", str(out),
               "--no-browser", "--port", str(free_port()), *(["--allow-root"] if os.geteuid() == 0 else [])]
    log_path = tmp_path / "formgrader.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, cwd=tmp_path, env=_lab_env(tmp_path / "jupyter"), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = _wait_for_url(log_path, proc)
    base, token = url.split("/formgrader?token=")
    try:
        _wait_for_server(base, token, log_path, proc)
        yield url
    finally:
        _stop_lab(proc, base, token)


@pytest.mark.slow
def test_formgrader_pages_take_mathjax_from_the_server_not_a_cdn(graded, formgrader):
    """An instructor's walkthrough offline: formgrader's submission page loaded MathJax from a CDN; unreachable, its
    script stopped at `MathJax.loaded` before binding formgrader's keys (Tab, Esc, Ctrl-.), and math showed as TeX."""
    from course_tools.formgrader_offline import CDN

    base, token = formgrader.split("/formgrader?token=")
    with urllib.request.urlopen(f"{base}/formgrader/api/submitted_notebooks/{A01}/{A01}?token={token}") as answer:
        submission = json.load(answer)[0]["id"]
    with urllib.request.urlopen(f"{base}/formgrader/submissions/{submission}/?token={token}") as answer:
        page = answer.read()
    assert CDN not in page and b"cdnjs" not in page
    local = re.search(rb'<script src="([^"]*/static/jupyter_server_mathjax/MathJax\.js[^"]*)"', page)
    assert local, page[:3000]
    with urllib.request.urlopen(f"{base.split('/', 3)[0]}//{base.split('/', 3)[2]}{local.group(1).decode()}"
                                f"&token={token}") as answer:
        assert answer.status == 200 and b"MathJax" in answer.read(2000)


@pytest.mark.slow
def test_formgrader_without_an_exchange_says_so_once_not_at_every_page(graded, formgrader, tmp_path):
    """A class graded from an LMS's zip has no exchange folder: nbgrader's formgrader lists the exchange for each
    page it serves and logged "CRITICAL Unwritable directory, please contact your instructor" each time (15 times
    in two minutes of an instructor's walkthrough). It is said once, as a warning naming what is off."""
    from nbgrader.exchange.default.exchange import Exchange
    from nbgrader.utils import check_directory

    root = Exchange().root
    if check_directory(root, write=True, execute=True):
        pytest.skip(f"this machine has an exchange at nbgrader's default {root}")
    base, token = formgrader.split("/formgrader?token=")
    for _ in range(3):
        for page in ("manage_assignments", "manage_students", f"api/submitted_notebooks/{A01}/{A01}"):
            with urllib.request.urlopen(f"{base}/formgrader/{page}?token={token}") as answer:
                assert answer.status == 200, page
    log = (tmp_path / "formgrader.log").read_text(errors="replace")
    assert "Unwritable directory" not in log, log[-3000:]
    assert log.count(f"No exchange folder at {root}") == 1, log[-3000:]


def _saved(page, kind: str, field, value: str) -> None:
    """Type `value` into a formgrader field and leave it, as a person does; wait for formgrader's save."""
    with page.expect_response(lambda r: f"/formgrader/api/{kind}/" in r.url and r.request.method == "PUT") as answer:
        field.fill(value)
        field.blur()
    assert answer.value.ok, f"formgrader did not save the {kind}: HTTP {answer.value.status}"


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
def test_manual_grade_in_formgrader_reaches_gradebook_and_exports(graded, formgrader, page, tmp_path):
    from nbgrader.api import Gradebook
    from playwright.sync_api import expect

    subs, out, auto = graded
    page.goto(formgrader, wait_until="domcontentloaded")
    expect(page.get_by_text(A01).first).to_be_visible()  # Manage Assignments lists the notebook
    base = formgrader.split("/formgrader?")[0]
    page.goto(f"{base}/formgrader/gradebook/{A01}/{A01}", wait_until="domcontentloaded")
    expect(page.locator("a.name-hidden")).to_have_count(3)  # the list arrives after the page: one row a student
    page.locator("#toggle_names").click()  # the list shows "Submission #n" until names are shown
    page.get_by_role("link", name="mistake", exact=True).click()

    score = page.locator(f"input.score[id='{FAILED_TEST}']")
    expect(score).to_be_visible()  # the submission is shown: no "formgrader encountered an error"
    assert "encountered an error" not in visible_text(page)
    # formgrader's script binds the fields once it has fetched the grades and comments: typed before
    # that, a value is never saved
    page.wait_for_function("() => window.formgrader && formgrader.grades && formgrader.grades.loaded"
                           " && formgrader.comments && formgrader.comments.loaded")
    _saved(page, "grade", score, "1.5")
    _saved(page, "grade", page.locator(f"input.extra-credit[id='{EXTRA_ON}_extra_credit']"), "1")
    _saved(page, "comment", page.locator("textarea[id='normalize_rows-comment']"), COMMENT)
    page.reload(wait_until="domcontentloaded")
    expect(page.locator(f"input.score[id='{FAILED_TEST}']")).to_have_value("1.5")
    expect(page.locator("textarea[id='normalize_rows-comment']")).to_have_value(COMMENT)
    screenshot(page, tmp_path, "formgrader-manual-grade.png")

    expected = auto + 1.5 + 1
    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        assert gb.find_grade(FAILED_TEST, A01, A01, "mistake").manual_score == 1.5
        assert gb.find_grade(EXTRA_ON, A01, A01, "mistake").extra_credit == 1
        assert gb.find_comment("normalize_rows", A01, A01, "mistake").manual_comment == COMMENT
        assert gb.find_submission_notebook(A01, A01, "mistake").score == expected

    # the next grading run (nothing to grade again) writes the tables from the gradebook
    grade(subs, out, progress=False, workers=2, assignments=[A01])
    _assert_exported(out, expected)
    # a forced regrade keeps the manual grade (nbgrader keeps manual scores), and its feedback shows the comment
    grade(subs, out, progress=False, workers=1, assignments=[A01], students=["mistake"], force=True)
    _assert_exported(out, expected)
    assert COMMENT in (out / "feedback" / "mistake" / f"{A01}.html").read_text()


@pytest.mark.slow
def test_a_students_picture_from_another_host_is_never_fetched_by_formgrader_or_feedback(graded, formgrader, page,
                                                                                      tracker):
    """A picture from another host in a student's cell would tell that host when, and from where, the
    instructor opened the submission (or the student read the feedback page, put on a web server): the
    browser is told not to fetch it. The same browser fetches it from a page without the rule."""
    from playwright.sync_api import expect

    _, out, _ = graded
    base, token = formgrader.split("/formgrader?token=")
    page.goto(f"{base}/formgrader/submissions/{_submission_id(out, 'mistake')}?token={token}", wait_until="load")
    expect(page.locator(f"input.score[id='{FAILED_TEST}']")).to_be_visible()
    expect(page.get_by_text("Look:").first).to_be_visible()  # the student's cell is on the page
    feedback = (out / "feedback" / "mistake" / f"{A01}.html").read_bytes()
    page.goto(tracker.page("feedback.html", feedback), wait_until="load")
    expect(page.get_by_text("Look:").first).to_be_visible()
    page.wait_for_timeout(500)
    assert tracker.asked == [], f"a student's picture was fetched from another host: {tracker.asked}"

    page.goto(tracker.page("control.html", tracker.pictures("control").split("\n\n")[1].encode()), wait_until="load")
    assert tracker.asked == ["/control-html.gif"]  # without the rule the very same tag is fetched


@pytest.mark.slow
def test_a_students_link_followed_from_formgrader_or_feedback_tells_its_host_no_page(graded, formgrader, page,
                                                                                   tracker):
    """A student's link, clicked by the instructor in formgrader or by a student on a feedback page put on a web
    server, would send its host the page's address (a Referer: formgrader's, with its token where the
    instructor opened it so). The browser is told to send none; from a page without the rule the same click
    sends one."""
    _, out, _ = graded
    base, token = formgrader.split("/formgrader?token=")
    opened = [(f"{base}/formgrader/submissions/{_submission_id(out, 'mistake')}?token={token}", "/link-page")]
    feedback = (out / "feedback" / "mistake" / f"{A01}.html").read_text()
    assert "/link-page" in feedback
    opened.append((tracker.page("feedback-link.html", feedback.replace("/link-page", "/link-feedback").encode()),
                   "/link-feedback"))
    control = f'<meta charset="utf-8"><p><a href="{tracker.url}/link-control">my notes control</a></p>'
    opened.append((tracker.page("control-link.html", control.encode()), "/link-control"))
    for address, path in opened:
        page.goto(address, wait_until="load")
        with page.expect_navigation(url=f"{tracker.url}{path}"):
            page.locator(f"a[href='{tracker.url}{path}']").first.click()
        assert path in tracker.followed, f"the click on {address} did not reach the link's host"
    assert tracker.followed["/link-page"] is None, f"formgrader sent {tracker.followed['/link-page']}"
    assert tracker.followed["/link-feedback"] is None, f"the feedback page sent {tracker.followed['/link-feedback']}"
    assert tracker.followed["/link-control"], "without the rule the very same click sends the page's address"


def _submission_id(out: Path, student: str) -> str:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
        return gb.find_submission_notebook(A01, A01, student).id


def _assert_exported(out: Path, score: float) -> None:
    [row] = [r for r in _rows(out / "grades.csv") if r["student_id"] == "mistake" and r["notebook"] == A01]
    assert float(row["score"]) == score, row
    [wide] = [r for r in _rows(out / "grades_wide.csv") if r["student_id"] == "mistake"]
    assert float(wide[A01]) == score, wide


def test_a_token_given_among_jupyters_options_leaves_the_command_line_too(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_course_config(out / "course", f"sqlite:///{out / 'gradebook.db'}")
    (out / "gradebook.db").write_bytes(b"")
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append(cmd))
    monkeypatch.setattr(cli.os, "chdir", lambda folder: None)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    monkeypatch.delenv("JUPYTER_TOKEN", raising=False)
    for given in (["--IdentityProvider.token=s3cret-of-mine"], ["--ServerApp.token", "s3cret-of-mine"],
                  ["--ServerApp.token=s3cret-of-mine", "--NotebookApp.token", "s3cret-of-mine"]):
        assert cli.main(["formgrader", str(out), "--port", "8899", "--no-browser", *given]) == 0
        assert os.environ["JUPYTER_TOKEN"] == "s3cret-of-mine" and not any("s3cret" in a for a in calls[-1])
    monkeypatch.delenv("JUPYTER_TOKEN")
    assert cli.main(["formgrader", str(out), "--port", "8899", "--no-browser", "--IdentityProvider.token="]) == 0
    assert "--IdentityProvider.token=" in calls[-1] and "JUPYTER_TOKEN" not in os.environ  # no login: as asked
