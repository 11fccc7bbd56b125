"""JupyterLab for students: a **Validate** button that runs `attn-course check`, with progress and Cancel.

A Jupyter server extension (enabled by the config in course_tools/jupyter_config/, which `attn-course lab`
puts first on JUPYTER_CONFIG_PATH) and a small lab extension of ours (prebuilt, in
course_tools/jupyter_data/labextensions/, which `attn-course lab` puts on JUPYTER_PATH; its source
is course_tools/labextension/, rebuilt with `make labextension`).

The button saves the notebook and POSTs its path to `/attn-course/check`: this module starts
`attn-course check --progress json` on it (the instructor's sandbox and hidden checks, in its own
process) and answers with a job id. The dialog asks `GET /attn-course/check/<id>` twice a second:
which exercise runs, for how long of its limit, the time in all; at the end the report, PASS /
FAIL / TODO per exercise with the known mistake's hint, never a traceback. `DELETE` on the job (the
dialog's Cancel) stops the check, and the check stops its sandbox.

nbgrader's own Validate button is turned off in that Lab; its URL (`/assignments/validate`) is still
answered here with the same report, in the one shape nbgrader's dialog shows (a "failed" entry whose
`error` is set as innerHTML), for a Lab that has nbgrader's button and not ours.

The same config disables, server and lab side, nbgrader's instructor tools: formgrader,
create assignment, and the assignment and course lists (which only show exchange errors
to a student working outside JupyterHub).
"""
from __future__ import annotations

import asyncio
import html
import json
import os
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

CHECK_URL = "attn-course/check"  # our Validate button: POST {path} starts a check, GET/DELETE <id> follow or stop it
VALIDATE_URL = "assignments/validate"  # what nbgrader's Validate button POSTs to (path=<notebook>)
VERSION_URL = "nbgrader_version"  # what it asks first (the lab extension's version must match)
CHECK_SECONDS = 600  # past this the check is stopped (the sandbox's own notebook limit is 300 s)
STOP_SECONDS = 30  # a cancelled check has this long to stop its sandbox before it is killed
KEPT_JOBS = 20  # finished checks remembered (the dialog reads each one once)

NBGRADER_VALIDATE_PLUGIN = "@jupyter/nbgrader:validate-assignment"  # nbgrader's Validate button: ours replaces it
# server extensions, lab plugins: what `attn-course lab` turns off (jupyter_config/ holds the same)
DISABLED_SERVER_EXTENSIONS = (
    "nbgrader.server_extensions.formgrader",
    "nbgrader.server_extensions.assignment_list",
    "nbgrader.server_extensions.course_list",
    "nbgrader.server_extensions.validate_assignment",  # replaced by this module
)
DISABLED_LAB_PLUGINS = (
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:assignment-list",
    "@jupyter/nbgrader:course-list",
    "@jupyter/nbgrader:menu",  # its entries open the tools above
    NBGRADER_VALIDATE_PLUGIN,
)
OUR_LAB_EXTENSION = "@attention-course/validate"  # the Validate button with progress and Cancel

MARKS = {"PASS": "pass", "FAIL": "fail", "TODO": "todo", "GONE": "fail"}  # GONE: no answer cell for it
_VERDICT_LINE = re.compile(r"^(  )(PASS|FAIL|TODO|GONE)(  .*)$")
STYLE = (
    "<style>"
    "#validation-message > div:nth-child(1), #validation-message > div:nth-child(2) { display: none; }"
    "#validation-message .attn-check-report { white-space: pre-wrap; }"
    "#validation-message .attn-pass { color: var(--jp-success-color1, #388e3c); font-weight: bold; }"
    "#validation-message .attn-fail { color: var(--jp-error-color1, #d32f2f); font-weight: bold; }"
    "#validation-message .attn-todo { color: var(--jp-warn-color1, #f57c00); font-weight: bold; }"
    "</style>"
)


def config_dir() -> Path:
    """The Jupyter config folder `attn-course lab` adds: this package's jupyter_config/ (installed with
    it, so a course folder needs no copy)."""
    return Path(__file__).resolve().parent / "jupyter_config"


def data_dir() -> Path:
    """The Jupyter data folder `attn-course lab` adds: it holds our prebuilt lab extension."""
    return Path(__file__).resolve().parent / "jupyter_data"


def _first_on(variable: str, folder: Path, environ) -> str:
    rest = [p for p in environ.get(variable, "").split(os.pathsep) if p and p != str(folder)]
    return os.pathsep.join([str(folder)] + rest)


def lab_environment(environ: dict | None = None) -> dict[str, str]:
    """The environment variables `attn-course lab` sets: our config folder first on
    JUPYTER_CONFIG_PATH and our data folder first on JUPYTER_PATH (the user's own still apply, below)."""
    environ = os.environ if environ is None else environ
    return {"JUPYTER_CONFIG_PATH": _first_on("JUPYTER_CONFIG_PATH", config_dir(), environ),
            "JUPYTER_PATH": _first_on("JUPYTER_PATH", data_dir(), environ)}


# --------------------------------------------------------------------------- the answer
def report_html(report: str) -> str:
    """The report as the dialog shows it: escaped, each PASS / FAIL / TODO / GONE coloured."""
    lines = []
    for line in report.splitlines():
        m = _VERDICT_LINE.match(line)
        if m:
            lines.append(f'{m.group(1)}<span class="attn-{MARKS[m.group(2)]}">{m.group(2)}</span>'
                         f"{html.escape(m.group(3))}")
        else:
            lines.append(html.escape(line))
    return STYLE + '<span class="attn-check-report">' + "\n".join(lines) + "</span>"


def validate_answer(report: str) -> dict:
    """The JSON nbgrader's Validate dialog expects, carrying `report` (see the module's doc)."""
    return {"success": True, "value": {"failed": [{"source": "", "error": report_html(report)}]}}


def _check_command(notebook: Path) -> list[str]:
    return [sys.executable, "-m", "course_tools.cli", "check", "--progress", "json", str(notebook)]


@dataclass
class CheckJob:
    """One `attn-course check` started from Lab: the news it streams while it runs, then its report."""

    notebook: Path
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    state: str = "waiting"  # waiting (for the check before it) | running | done | cancelled | failed
    started: float = field(default_factory=time.monotonic)
    progress: dict = field(default_factory=dict)  # cell, cells, what, seconds, limit: as `check` last said
    report: str = ""
    message: str = ""
    proc: asyncio.subprocess.Process | None = None
    cancelled: bool = False

    def status(self) -> dict:
        """What the dialog shows now (JSON)."""
        answer = {"id": self.id, "state": self.state, "elapsed": round(time.monotonic() - self.started, 1),
                  **self.progress}
        if self.state == "done":
            answer["report_html"] = report_html(self.report)
        elif self.state == "failed":
            answer["message"] = self.message
        return answer

    @property
    def finished(self) -> bool:
        return self.state in ("done", "cancelled", "failed")

    async def run(self, lock: asyncio.Lock, timeout: float = CHECK_SECONDS, log=None) -> None:
        """Wait for the check before it (one sandbox at a time), then check; never raises."""
        async with lock:
            if self.cancelled:
                self.state = "cancelled"
                return
            self.state = "running"
            try:
                self.report = await self._check(timeout)
                self.state = "cancelled" if self.cancelled else "done"
            except Exception as err:  # noqa: BLE001 - the student gets a sentence, the log the details
                if log is not None:
                    log.error("attn-course check failed on %s: %s", self.notebook, err)
                self.state, self.message = "failed", CRASHED.format(name=self.notebook.name)

    async def _check(self, timeout: float) -> str:
        from autograder.course import CourseFolder

        env = dict(os.environ, ATTN_COURSE_ROOT=str(CourseFolder.find().root))
        self.proc = await asyncio.create_subprocess_exec(
            *_check_command(self.notebook), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=str(self.notebook.parent), env=env, start_new_session=True)
        out = asyncio.ensure_future(self.proc.stdout.read())
        err = asyncio.ensure_future(self._read_news(self.proc.stderr))
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self._stop()
            await asyncio.gather(out, err)
            return (f"The check did not finish within {timeout:g} s and was stopped. Try again; if it happens "
                    f"again, run `attn-course check {self.notebook.name}` in a terminal.")
        out_text, err_text = (await out).decode(errors="replace").strip(), (await err).strip()
        if self.cancelled:
            return ""
        if self.proc.returncode in (0, 1) and out_text:  # 0: full marks, 1: points missing
            return out_text
        if self.proc.returncode == 2 and err_text and "Traceback" not in err_text:  # a bad notebook path or name
            return err_text
        raise CheckCrashed(f"attn-course check {self.notebook} exited with {self.proc.returncode}:\n"
                           f"{err_text[-4000:]}")

    async def _read_news(self, stream: asyncio.StreamReader) -> str:
        """Keep the latest progress line; return everything else `check` wrote on stderr."""
        other = []
        async for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            try:
                news = json.loads(line) if line.startswith("{") else None
            except ValueError:
                news = None
            if isinstance(news, dict):
                self.progress = {key: news.get(key) for key in ("cell", "cells", "what", "seconds", "limit")}
            else:
                other.append(line)
        return "\n".join(other)

    async def cancel(self) -> None:
        """Stop the check (it stops its sandbox), or make sure it never starts."""
        self.cancelled = True
        if self.proc is not None and self.proc.returncode is None:
            await self._stop()
        if self.state == "waiting":
            self.state = "cancelled"

    async def _stop(self) -> None:
        """SIGTERM (the check then stops its sandbox and exits), SIGKILL to its group if it takes too long."""
        try:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), STOP_SECONDS)
        except ProcessLookupError:
            pass
        except TimeoutError:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            await self.proc.wait()


async def run_check(notebook: Path, timeout: float = CHECK_SECONDS) -> str:
    """`attn-course check NOTEBOOK` in its own process; what it has to say, never a traceback."""
    return await CheckJob(notebook, state="running")._check(timeout)


class CheckCrashed(RuntimeError):
    """The check itself failed (a bug, not the student's): logged for the instructor."""


CRASHED = ("The check itself failed on this notebook (not your code's fault). Run "
           "`attn-course check {name}` in a terminal to see more, and tell your instructor.")


# --------------------------------------------------------------------------- the server extension
def _handlers():
    from jupyter_server.base.handlers import APIHandler, JupyterHandler
    from nbgrader.server_extensions.validate_assignment.handlers import NbGraderVersionHandler
    from tornado import web

    def notebook_path(handler, path) -> Path:
        """The notebook named by a request, inside the server's root folder (else 400 / 403)."""
        if not isinstance(path, str) or not path:
            raise web.HTTPError(400, "give the notebook's path")
        root = Path(handler.settings["attn_check_root"]).resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root):
            raise web.HTTPError(403, "Access denied: path outside allowed directory")
        return target

    def check_lock(handler) -> asyncio.Lock:
        return handler.settings.setdefault("attn_check_lock", asyncio.Lock())  # one check at a time: each runs a sandbox

    class JobsHandler(APIHandler):
        """POST /attn-course/check {"path": NOTEBOOK}: start a check; answers its first status (with its id)."""

        @web.authenticated
        async def post(self):
            job = CheckJob(notebook_path(self, (self.get_json_body() or {}).get("path")))
            jobs: dict[str, CheckJob] = self.settings.setdefault("attn_check_jobs", {})
            for old in [j for j in jobs.values() if j.finished][:-KEPT_JOBS or None]:
                jobs.pop(old.id, None)
            jobs[job.id] = job
            tasks: set = self.settings.setdefault("attn_check_tasks", set())
            task = asyncio.ensure_future(job.run(check_lock(self), log=self.log))
            tasks.add(task)  # a reference until it ends (the loop keeps only weak ones)
            task.add_done_callback(tasks.discard)
            self.set_status(202)
            self.finish(json.dumps(job.status()))

    class JobHandler(APIHandler):
        """GET /attn-course/check/ID: where the check is; DELETE: stop it (answers once it has stopped)."""

        def job(self, job_id: str) -> CheckJob:
            job = self.settings.get("attn_check_jobs", {}).get(job_id)
            if job is None:
                raise web.HTTPError(404, "no such check (the server was restarted?): press Validate again")
            return job

        @web.authenticated
        async def get(self, job_id: str):
            self.finish(json.dumps(self.job(job_id).status()))

        @web.authenticated
        async def delete(self, job_id: str):
            job = self.job(job_id)
            await job.cancel()
            self.finish(json.dumps(job.status()))

    class CheckHandler(JupyterHandler):
        """POST /assignments/validate?path=NOTEBOOK (relative to the server's root folder): nbgrader's button."""

        @web.authenticated
        async def post(self):
            path = self.get_argument("path", None)
            if path is None:
                path = (self.get_json_body() or {}).get("path")
            job = CheckJob(notebook_path(self, path))
            await job.run(check_lock(self), log=self.log)
            report = job.report if job.state == "done" else job.message
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(validate_answer(report)))

    return [(CHECK_URL + "/?", JobsHandler), (CHECK_URL + "/([0-9a-f]{32})", JobHandler),
            (VALIDATE_URL, CheckHandler), (VERSION_URL, NbGraderVersionHandler)]


def _jupyter_server_extension_points():
    return [{"module": "course_tools.labcheck"}]


def _load_jupyter_server_extension(serverapp):
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    web_app.settings["attn_check_root"] = serverapp.root_dir
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, url), handler) for url, handler in _handlers()])
    serverapp.log.info("attention-course: the Validate button runs `attn-course check` (%s)", CHECK_URL)


load_jupyter_server_extension = _load_jupyter_server_extension  # the older name, for older servers
