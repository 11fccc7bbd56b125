"""JupyterLab for students: nbgrader's **Validate** button answers with `attn-course check`.

A Jupyter server extension (enabled by the config in course_tools/jupyter_config/, which `attn-course lab`
puts first on JUPYTER_CONFIG_PATH). nbgrader's lab extension already puts a "Validate" button
in every notebook's toolbar; it saves the notebook, POSTs its path to `/assignments/validate`
and shows the JSON answer in a "Validation Results" dialog. This module answers that URL
instead of nbgrader's validate_assignment server extension (disabled by the same config): it
runs `attn-course check` on the saved notebook (the instructor's sandbox and hidden checks, in
its own process) and returns its report, PASS / FAIL / TODO per exercise with the known
mistake's hint, never a traceback. No JavaScript of ours: nothing to build.

The report goes in the one shape nbgrader's dialog shows as preformatted HTML (a "failed"
entry, whose `error` is set as innerHTML): the report, escaped, in
`<span class="attn-check-report">`, with each verdict coloured; a `<style>` scoped to the
dialog hides nbgrader's own caption and the empty source block around it.

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
import sys
from pathlib import Path

VALIDATE_URL = "assignments/validate"  # what nbgrader's Validate button POSTs to (path=<notebook>)
VERSION_URL = "nbgrader_version"  # what it asks first (the lab extension's version must match)
CHECK_SECONDS = 600  # past this the check is stopped (the sandbox's own notebook limit is 300 s)

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
)
KEPT_LAB_PLUGIN = "@jupyter/nbgrader:validate-assignment"  # the Validate button

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


def lab_environment(environ: dict | None = None) -> dict[str, str]:
    """The environment variable `attn-course lab` sets: our config folder first on
    JUPYTER_CONFIG_PATH (the user's own configuration still applies, below it)."""
    environ = os.environ if environ is None else environ
    paths = [str(config_dir())] + [p for p in environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep)
                                   if p and p != str(config_dir())]
    return {"JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}


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


async def run_check(notebook: Path, timeout: float = CHECK_SECONDS) -> str:
    """`attn-course check NOTEBOOK` in its own process; what it has to say, never a traceback."""
    from autograder.course import CourseFolder

    env = dict(os.environ, ATTN_COURSE_ROOT=str(CourseFolder.find().root))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "course_tools.cli", "check", str(notebook),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(notebook.parent), env=env)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return f"The check did not finish within {timeout:g} s and was stopped. Try again; if it happens again, " \
               f"run `attn-course check {notebook.name}` in a terminal."
    out_text, err_text = out.decode(errors="replace").strip(), err.decode(errors="replace").strip()
    if proc.returncode in (0, 1) and out_text:  # 0: full marks, 1: points missing
        return out_text
    if proc.returncode == 2 and err_text and "Traceback" not in err_text:  # a bad notebook path or name
        return err_text
    raise CheckCrashed(f"attn-course check {notebook} exited with {proc.returncode}:\n{err_text[-4000:]}")


class CheckCrashed(RuntimeError):
    """The check itself failed (a bug, not the student's): logged for the instructor."""


CRASHED = ("The check itself failed on this notebook (not your code's fault). Run "
           "`attn-course check {name}` in a terminal to see more, and tell your instructor.")


# --------------------------------------------------------------------------- the server extension
def _handlers():
    from jupyter_server.base.handlers import JupyterHandler
    from nbgrader.server_extensions.validate_assignment.handlers import NbGraderVersionHandler
    from tornado import web

    class CheckHandler(JupyterHandler):
        """POST /assignments/validate?path=NOTEBOOK (relative to the server's root folder)."""

        @web.authenticated
        async def post(self):
            path = self.get_argument("path", None)
            if path is None:
                path = (self.get_json_body() or {}).get("path")
            if not isinstance(path, str) or not path:
                raise web.HTTPError(400, "give the notebook's path")
            root = Path(self.settings["attn_check_root"]).resolve()
            target = (root / path).resolve()
            if not target.is_relative_to(root):
                raise web.HTTPError(403, "Access denied: path outside allowed directory")
            lock = self.settings.setdefault("attn_check_lock", asyncio.Lock())
            async with lock:  # one check at a time: each runs a sandbox
                try:
                    report = await run_check(target)
                except Exception as err:  # noqa: BLE001 - the student gets a sentence, the log the details
                    self.log.error("attn-course check failed on %s: %s", target, err)
                    report = CRASHED.format(name=target.name)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(validate_answer(report)))

    return [(VALIDATE_URL, CheckHandler), (VERSION_URL, NbGraderVersionHandler)]


def _jupyter_server_extension_points():
    return [{"module": "course_tools.labcheck"}]


def _load_jupyter_server_extension(serverapp):
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    web_app.settings["attn_check_root"] = serverapp.root_dir
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [(url_path_join(base_url, url), handler) for url, handler in _handlers()])
    serverapp.log.info("attention-course: the Validate button runs `attn-course check`")


load_jupyter_server_extension = _load_jupyter_server_extension  # the older name, for older servers
