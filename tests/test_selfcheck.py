"""`attn-course check` in seconds, with the instructor's verdicts, and the same report behind
JupyterLab's Validate button: the prepared-assignment cache (reused, rebuilt, atomic), check
and grade_one agreeing per test cell, the release stubs nbgrader would generate, the lab
config that hides nbgrader's instructor tools, and a real `attn-course lab` server answering
the Validate button's request."""
from __future__ import annotations

import asyncio
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
from html import unescape
from pathlib import Path

import nbformat
import pytest

from autograder import selfcheck
from autograder.course import assignments, notebook_path
from course_tools import cli, labcheck
from course_tools.net import free_port

from .conftest import autograde, inject, solved_notebook
from .layout import REPO, SOLUTIONS

A01 = "01_similarity_attention"
WRONG_COSINE = "def cosine_similarity(E):\n    return E @ E.T"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)"
COSINE_HINT = "forgets to normalize"
SOFTMAX_HINT = "softmax without subtracting the max"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "check-cache"
    monkeypatch.setenv(selfcheck.CACHE_ENV, str(folder))
    return folder


def _with_stub(nb, course, graded: str):
    """`nb` with the answer cell `graded` back to the release's stub (not attempted)."""
    stub = next(c.source for c in course.release(A01).cells if c.metadata.get("nbgrader", {}).get("grade_id") == graded)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == graded:
            cell.source = stub
    return nb


def _mixed_notebook(course, folder: Path) -> Path:
    """01 with two catalogued mistakes and one exercise not attempted."""
    nb = inject(solved_notebook(course, A01), {"cosine_similarity": WRONG_COSINE, "softmax": WRONG_SOFTMAX})
    nb = _with_stub(nb, course, "dot_similarity")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{A01}.ipynb"
    nbformat.write(nb, path)
    return path


# --------------------------------------------------------------------------- the cache (no sandbox)
def _solutions_copy(tmp_path: Path) -> Path:
    root = tmp_path / "solutions"
    shutil.copytree(SOLUTIONS / A01, root / A01)
    return root


def test_prepared_entry_is_reused_then_rebuilt_when_the_solution_changes(tmp_path, cache):
    solutions = _solutions_copy(tmp_path)
    first = selfcheck.prepare(A01, solutions)
    assert first.cached and first.folder.parent == cache and first.folder.name.startswith(f"{A01}-")
    assert first.source_path.read_bytes() == notebook_path(A01, solutions).read_bytes()
    assert (first.folder / "kit" / "autograder" / "runner.py").is_file()
    assert "raise NotImplementedError()" in first.stubs["normalize_rows"]
    stamp = (first.folder / selfcheck.READY).stat().st_mtime_ns

    again = selfcheck.prepare(A01, solutions)
    assert again.folder == first.folder and again.stubs == first.stubs
    assert (again.folder / selfcheck.READY).stat().st_mtime_ns == stamp, "a ready entry was built again"

    os.utime(first.folder, (time.time() - 2 * selfcheck.PRUNE_AFTER_SECONDS,) * 2)  # an hour-old entry ...
    nb = nbformat.read(notebook_path(A01, solutions), as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("an instructor's edit"))
    nbformat.write(nb, notebook_path(A01, solutions))
    changed = selfcheck.prepare(A01, solutions)
    assert changed.folder != first.folder and changed.source_path.read_bytes() == notebook_path(A01, solutions).read_bytes()
    assert not first.folder.exists(), "... of an older solution is pruned"
    assert sorted(p.name for p in cache.iterdir()) == [changed.folder.name]


def test_concurrent_checks_share_one_entry(tmp_path, cache, monkeypatch):
    """Two checks building the same entry at once: one rename wins, both use the complete entry."""
    solutions = _solutions_copy(tmp_path)
    barrier = threading.Barrier(2, timeout=60)
    build = selfcheck._build_entry

    def slow_build(*args):
        stubs = build(*args)
        barrier.wait()  # both have built aside before either renames
        return stubs
    monkeypatch.setattr(selfcheck, "_build_entry", slow_build)
    found, errors = [], []

    def one():
        try:
            found.append(selfcheck.prepare(A01, solutions))
        except Exception as err:  # noqa: BLE001
            errors.append(err)
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(found) == 2
    assert found[0].folder == found[1].folder and found[0].stubs == found[1].stubs
    assert [p.name for p in cache.iterdir()] == [found[0].folder.name], "a staging folder was left behind"


def test_a_broken_entry_is_replaced(tmp_path, cache):
    solutions = _solutions_copy(tmp_path)
    entry = selfcheck.prepare(A01, solutions)
    (entry.folder / "stubs.json").unlink()
    fixed = selfcheck.prepare(A01, solutions)
    assert fixed.folder == entry.folder and fixed.stubs == entry.stubs
    assert [p.name for p in cache.iterdir()] == [entry.folder.name]


def test_an_unwritable_cache_prepares_in_a_temporary_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(selfcheck.CACHE_ENV, str(blocker / "check"))
    prepared = selfcheck.prepare(A01, _solutions_copy(tmp_path))
    try:
        assert not prepared.cached and prepared.source_path.is_file() and prepared.stubs
    finally:
        shutil.rmtree(prepared.folder)


def test_the_entry_depends_on_the_graders_code(monkeypatch):
    key = selfcheck._entry_key(A01, b"{}")
    monkeypatch.setattr(selfcheck, "grader_version", lambda: "another grader")
    assert selfcheck._entry_key(A01, b"{}") != key


# --------------------------------------------------------------------------- the lab config (no server)
def test_lab_config_hides_the_instructor_tools_and_keeps_validate():
    folder = labcheck.config_dir()
    server = json.loads((folder / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert server["course_tools.labcheck"] is True
    assert {name for name, on in server.items() if not on} == set(labcheck.DISABLED_SERVER_EXTENSIONS)
    page = json.loads((folder / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert {name for name, off in page.items() if off} == set(labcheck.DISABLED_LAB_PLUGINS)
    assert labcheck.NBGRADER_VALIDATE_PLUGIN in page, "nbgrader's Validate button would show beside ours"
    built = labcheck.data_dir() / "labextensions" / labcheck.OUR_LAB_EXTENSION
    package = json.loads((built / "package.json").read_text())
    assert package["name"] == labcheck.OUR_LAB_EXTENSION and (built / package["jupyterlab"]["_build"]["load"]).is_file()


def test_prebuilt_lab_extension_is_built_from_its_source():
    """The committed build records the hash of the source it was built from: an edit to the source
    without `make labextension` fails here (CI has no Node to build it)."""
    from course_tools import labextension_stamp

    assert labextension_stamp.recorded() == labextension_stamp.current(), \
        "course_tools/labextension/ changed since its build: run `make labextension` and commit the result"


def test_lab_command_starts_jupyter_with_the_student_config(monkeypatch):
    calls = []
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append(cmd))
    monkeypatch.setattr(cli.os, "chdir", lambda folder: None)  # the server would start there; this process stays
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/somewhere/else")
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(REPO))
    assert cli.main(["lab", "--no-browser"]) == 0
    assert calls and calls[0][-1] == "--no-browser"
    assert os.environ["JUPYTER_CONFIG_PATH"].split(os.pathsep) == [str(labcheck.config_dir()), "/somewhere/else"]
    assert os.environ["JUPYTER_PATH"].split(os.pathsep)[0] == str(labcheck.data_dir())
    assert calls[0][4] == f"--notebook-dir={REPO / 'notebooks'}"

    for own in (["--notebook-dir=/my-work"], ["--notebook-dir", "/my-work"], ["--ServerApp.root_dir=/my-work"]):
        calls.clear()
        assert cli.main(["lab", *own]) == 0
        assert calls[0][4:] == own, "a folder of the student's own replaces notebooks/"


def test_validate_answer_is_the_report_escaped_in_nbgraders_dialog_shape():
    report = ("01_similarity_attention: 15 / 17 points\n"
              "  PASS  normalize_rows        3/3\n"
              "  FAIL  cosine_similarity     0/2\n"
              "        test_cosine_similarity: got <script>alert(1)</script> & more\n"
              "  TODO  dot_similarity        0/1")
    answer = labcheck.validate_answer(report)
    assert answer["success"] is True
    [entry] = answer["value"]["failed"]
    html = entry["error"]
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in html
    assert '<span class="attn-pass">PASS</span>  normalize_rows' in html
    assert '<span class="attn-fail">FAIL</span>' in html and '<span class="attn-todo">TODO</span>' in html
    body = html.split('<span class="attn-check-report">', 1)[1]
    assert unescape(re.sub(r"<[^>]+>", "", body)) == report  # the text is the report, verbatim


# --------------------------------------------------------------------------- grading (slow)
@pytest.mark.slow
def test_release_stubs_are_what_generate_assignment_writes(course, cache):
    for a in assignments():
        release = {c.metadata["nbgrader"]["grade_id"]: c.source for c in course.release(a).cells
                   if c.metadata.get("nbgrader", {}).get("solution")}
        assert selfcheck.prepare(a).stubs == release, a


@pytest.mark.slow
def test_check_agrees_with_grade_one(course, tmp_path, cache):
    """The instructor's grader (nbgrader autograde, gradebook) and `check` on a notebook with two
    mistakes and an exercise left undone: the same points, messages and status per test cell,
    the same verdict per exercise, the same report."""
    path = _mixed_notebook(course, tmp_path / "me")
    mine, verdicts = selfcheck.self_check(path)
    graded = autograde(course, A01, path.read_bytes())
    stubs = {c.metadata["nbgrader"]["grade_id"]: c.source for c in course.release(A01).cells
             if c.metadata.get("nbgrader", {}).get("solution")}
    assert [(c.grade_id, c.exercise, c.score, c.max_score, c.message) for c in mine.cells] == \
           [(c.grade_id, c.exercise, c.score, c.max_score, c.message) for c in graded.cells]
    assert (mine.score, mine.max_score, mine.status) == (graded.score, graded.max_score, graded.status)
    assert verdicts == selfcheck.verdicts_of(graded, path.read_bytes(), stubs)
    assert verdicts["cosine_similarity"] == verdicts["softmax"] == "fail"
    assert verdicts["dot_similarity"] == "not attempted" and verdicts["normalize_rows"] == "pass"
    assert selfcheck.format_report(mine, verdicts) == selfcheck.format_report(graded, verdicts)


@pytest.mark.slow
def test_check_command_exit_status(course, tmp_path, cache, capsys):
    good = tmp_path / "good" / f"{A01}.ipynb"
    good.parent.mkdir()
    nbformat.write(solved_notebook(course, A01), good)
    assert cli.main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{A01}: 17 / 17 points") and "FAIL" not in out and out.count("PASS") == 6

    assert cli.main(["check", str(_mixed_notebook(course, tmp_path / "bad"))]) == 1
    out = capsys.readouterr().out
    assert "FAIL  cosine_similarity" in out and COSINE_HINT in out and SOFTMAX_HINT in out
    assert "TODO  dot_similarity" in out and "Traceback" not in out

    stray = tmp_path / "Untitled.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), stray)
    assert cli.main(["check", str(stray)]) == 2
    assert "is not one of the course notebooks" in capsys.readouterr().err


@pytest.mark.slow
def test_validate_handler_runs_the_check(course, tmp_path, cache):
    """What the Validate button's request runs (labcheck.run_check, its own process), answered in
    the shape nbgrader's dialog shows: the report, PASS / FAIL / TODO and the hints, no traceback."""
    good = tmp_path / "good" / f"{A01}.ipynb"
    good.parent.mkdir()
    nbformat.write(solved_notebook(course, A01), good)
    report = asyncio.run(labcheck.run_check(good))
    assert report.startswith(f"{A01}: 17 / 17 points") and "PASS  softmax" in report and "FAIL" not in report

    report = asyncio.run(labcheck.run_check(_mixed_notebook(course, tmp_path / "bad")))
    assert "PASS  normalize_rows" in report and "FAIL  softmax" in report and "TODO  dot_similarity" in report
    assert SOFTMAX_HINT in report and COSINE_HINT in report and "Traceback" not in report
    answer = json.dumps(labcheck.validate_answer(report))
    assert "Traceback" not in answer and SOFTMAX_HINT in answer


def _request(url: str, token: str, method: str = "GET", data: bytes | None = None) -> tuple[int, str]:
    if data is None and method == "POST":
        data = b""
    req = urllib.request.Request(url, method=method, data=data, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


class _LabServer:
    """`attn-course lab` for real, on `root`, as a context manager: its base URL and token."""

    def __init__(self, root: Path, tmp_path: Path, cache: Path, env: dict | None = None):
        self.root, self.tmp_path, self.cache, self.env = root, tmp_path, cache, env or {}
        self.port, self.token = free_port(), "attn-test-token"
        self.base = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> _LabServer:
        env = {**os.environ, selfcheck.CACHE_ENV: str(self.cache), "JUPYTER_RUNTIME_DIR": str(self.tmp_path / "runtime"),
               **self.env}
        env.pop("JUPYTER_CONFIG_PATH", None)
        self.log = self.tmp_path / "server.log"
        self.server = subprocess.Popen(
            [sys.executable, "-m", "course_tools.cli", "lab", "--no-browser", "--allow-root", f"--port={self.port}",
             f"--ServerApp.token={self.token}", f"--notebook-dir={self.root}", "--ServerApp.open_browser=False"],
            env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("w"), start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                if self.request("/api/status")[0] == 200:
                    return self
            except OSError:
                pass
            if self.server.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                pytest.fail(f"attn-course lab did not answer:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def request(self, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else b"" if method == "POST" else None
        return _request(f"{self.base}{path}", self.token, method, data)

    def __exit__(self, *exc) -> None:
        self.server.terminate()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


def _poll(lab: _LabServer, job_id: str, until, seconds: float = 240) -> dict:
    """GET the check's status twice a second until `until(status)` holds."""
    deadline = time.monotonic() + seconds
    while True:
        code, body = lab.request(f"/attn-course/check/{job_id}")
        assert code == 200, body
        status = json.loads(body)
        if until(status):
            return status
        assert time.monotonic() < deadline, f"the check never reached the state asked for: {status}"
        time.sleep(0.5)


@pytest.mark.slow
def test_lab_server_answers_the_validate_button(course, tmp_path, cache):
    """`attn-course lab` for real: our Validate button's requests (POST /attn-course/check, then GET
    its status until done) and nbgrader's (POST /assignments/validate?path=..., after GET
    /nbgrader_version) get the check's report; formgrader and the assignment list are gone,
    server and lab side; a path outside the notebook folder is refused."""
    root = tmp_path / "notebooks"
    _mixed_notebook(course, root / A01)
    nbformat.write(nbformat.v4.new_notebook(), root / "Untitled.ipynb")
    with _LabServer(root, tmp_path, cache) as lab:
        code, body = lab.request("/attn-course/check", "POST", {"path": f"{A01}/{A01}.ipynb"})
        assert code == 202, body
        status = _poll(lab, json.loads(body)["id"], lambda st: st["state"] not in ("waiting", "running"))
        assert status["state"] == "done", status
        html = status["report_html"]
        assert '<span class="attn-fail">FAIL</span>  softmax' in html and SOFTMAX_HINT in html
        assert '<span class="attn-todo">TODO</span>  dot_similarity' in html and "Traceback" not in html
        assert status["cells"] and status["elapsed"] > 0, "the check's progress never reached the server"
        code, body = lab.request("/attn-course/check", "POST", {"path": "../../etc/passwd"})
        assert code == 403, body
        assert lab.request("/attn-course/check", "POST", {})[0] == 400
        assert lab.request(f"/attn-course/check/{'0' * 32}")[0] == 404

        status, body = lab.request("/nbgrader_version?version=0.9.6")
        assert status == 200 and json.loads(body)["success"] is True
        status, body = lab.request(f"/assignments/validate?path={A01}/{A01}.ipynb", "POST")
        assert status == 200, body
        answer = json.loads(body)
        assert answer["success"] is True
        html = answer["value"]["failed"][0]["error"]
        assert '<span class="attn-fail">FAIL</span>  softmax' in html and SOFTMAX_HINT in html
        assert '<span class="attn-pass">PASS</span>  normalize_rows' in html
        assert '<span class="attn-todo">TODO</span>  dot_similarity' in html and "Traceback" not in html

        status, body = lab.request("/assignments/validate?path=Untitled.ipynb", "POST")
        assert status == 200 and "is not one of the course notebooks" in body and "Traceback" not in body
        assert lab.request("/assignments/validate?path=../../etc/passwd", "POST")[0] == 403
        assert lab.request("/assignments/validate", "POST")[0] == 400

        assert lab.request("/formgrader")[0] == 404
        assert lab.request("/assignments")[0] == 404
        assert lab.request("/courses")[0] == 404
        assert lab.request("/formgraders")[0] == 404
        status, page = lab.request("/lab")
        assert status == 200
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        assert set(config["disabledExtensions"]) == set(labcheck.DISABLED_LAB_PLUGINS)
        federated = {e["name"] for e in config["federated_extensions"]}
        assert labcheck.OUR_LAB_EXTENSION in federated, "our Validate button is not loaded"
        assert "@jupyter/nbgrader" in federated  # its other plugins are off one by one


LOOPING_SOFTMAX = "def softmax(x, axis=-1):\n    while True:\n        pass"


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["", "namespaces", "none"])  # "": the default, bubblewrap where it works
def test_validate_shows_the_running_exercise_and_cancel_stops_the_sandbox(course, tmp_path, cache, sandbox):
    """A loop in softmax: the check's status names softmax and counts its seconds while it runs
    (not two minutes of "Validating..."), and Cancel stops the check and every process it started,
    the sandbox included, long before the cell's time limit: in every sandbox the check can use."""
    import psutil

    root = tmp_path / "notebooks"
    nb = inject(solved_notebook(course, A01), {"softmax": LOOPING_SOFTMAX})
    (root / A01).mkdir(parents=True)
    nbformat.write(nb, root / A01 / f"{A01}.ipynb")
    with _LabServer(root, tmp_path, cache, {"ATTN_SANDBOX": sandbox}) as lab:
        code, body = lab.request("/attn-course/check", "POST", {"path": f"{A01}/{A01}.ipynb"})
        assert code == 202, body
        job_id = json.loads(body)["id"]
        # softmax's cell has run 3 s (the sandbox's start-up counts as its own phase, however slow the machine)
        status = _poll(lab, job_id, lambda st: "softmax" in (st.get("what") or "") and (st.get("seconds") or 0) >= 3
                       or st["state"] != "running" and st["state"] != "waiting")
        assert status["state"] == "running" and "softmax" in status["what"], status
        started = [p for p in psutil.Process(lab.server.pid).children(recursive=True)]
        assert any("autograder.runner" in " ".join(p.cmdline()) or "autograder.sandbox" in " ".join(p.cmdline())
                   or p.name() in ("bwrap", "unshare") for p in started if p.is_running()), [p.cmdline() for p in started]

        code, body = lab.request(f"/attn-course/check/{job_id}", "DELETE")
        assert code == 200, body
        stopped = json.loads(body)
        assert stopped["state"] == "cancelled", stopped
        deadline = time.monotonic() + 30
        while (alive := [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, f"still running after Cancel: {[p.cmdline() for p in alive]}"
        assert _poll(lab, job_id, lambda st: True)["state"] == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["", "namespaces", "none"])  # "": the default, bubblewrap where it works
def test_a_killed_check_takes_its_sandbox_along(course, tmp_path, cache, sandbox):
    """SIGKILL the check mid-cell (a closed terminal, the OOM killer): nothing it started lives on.
    No handler can run on SIGKILL; the kernel ends the sandbox (bubblewrap's --die-with-parent, the
    parent-death signal the grader sets on unshare and on the bare runner). Without that, the
    namespaces and none sandboxes looped on, orphaned."""
    import psutil

    path = tmp_path / A01 / f"{A01}.ipynb"
    path.parent.mkdir()
    nbformat.write(inject(solved_notebook(course, A01), {"softmax": LOOPING_SOFTMAX}), path)
    env = {**os.environ, selfcheck.CACHE_ENV: str(cache), "ATTN_SANDBOX": sandbox, "ATTN_COURSE_ROOT": str(REPO)}
    check = subprocess.Popen([sys.executable, "-m", "course_tools.cli", "check", str(path), "--progress", "json"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in check.stderr:        # softmax's cell has run 3 s: the loop is inside the sandbox
            news = json.loads(line) if line.startswith("{") else {}
            if "softmax" in (news.get("what") or "") and news.get("seconds", 0) >= 3:
                break
        else:
            pytest.fail(f"the check ended before softmax's loop ran (exit {check.wait()}): {line}")
        started = psutil.Process(check.pid).children(recursive=True)
        assert started, "the check started no sandbox"
        check.kill()
        check.wait()
        deadline = time.monotonic() + 30
        while (alive := [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, f"still running after the check was killed: {[p.cmdline() for p in alive]}"
    finally:
        if check.poll() is None:
            check.kill()
