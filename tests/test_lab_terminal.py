"""Lab's terminal, as a student opens it from `make lab` (issue 24, item 7): the notebooks tell
them to run `attn-course check` there, so the course's tools must be on its PATH (a login shell
resets PATH on Debian and Ubuntu), and it must open in the folder the file browser shows (the
server resolved that folder against its own working folder, the repository root). The server is
started from the repository root with its output in a file (not a terminal), as `make lab` run in
the background does; a terminal is opened through the server's own API and asked where it is."""
from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from course_tools.net import free_port

from .layout import REPO
from .test_browser import LAB_START_S, _lab_env, _stop_lab

pytestmark = pytest.mark.slow
A01 = "01_similarity_attention"


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """`attn-course lab` started from the repository root: (base url, token)."""
    home = tmp_path_factory.mktemp("lab-terminal")
    port, token = free_port(), secrets.token_hex(16)
    env = _lab_env(home)
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"  # the venv's tools only through `attn-course lab` itself
    env.pop("ATTN_COURSE_ROOT", None)
    command = [str(Path(sys.executable).parent / "attn-course"), "lab", "--no-browser", "--allow-root",
               f"--ServerApp.token={token}", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               "--ServerApp.ip=127.0.0.1", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log = (home / "lab.log").open("wb")
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + LAB_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{(home / 'lab.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in {LAB_START_S} s")
            time.sleep(0.5)
        yield base, token
    finally:
        _stop_lab(proc, base, token)
        log.close()


def _open_terminal(base: str, token: str, cwd: str) -> str:
    """POST /api/terminals as Lab's launcher does (`cwd`: the file browser's folder); the name."""
    request = urllib.request.Request(f"{base}/api/terminals?token={token}", method="POST",
                                     data=json.dumps({"cwd": cwd}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())["name"]


async def _ask(base: str, token: str, name: str, command: str, marker: str, seconds: float = 60) -> str:
    """Type `command` into the terminal; what it printed up to `marker`."""
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(f"{base.replace('http', 'ws')}/terminals/websocket/{name}?token={token}")
    await ws.write_message(json.dumps(["stdin", command + "\r"]))
    seen, deadline = "", time.monotonic() + seconds
    while marker not in seen and time.monotonic() < deadline:
        message = await asyncio.wait_for(ws.read_message(), timeout=deadline - time.monotonic())
        if message is None:
            break
        kind, *rest = json.loads(message)
        if kind == "stdout":
            seen += rest[0]
    ws.close()
    return seen


@pytest.mark.parametrize("browser_folder, expected", [("", REPO / "notebooks"), (A01, REPO / "notebooks" / A01)])
def test_the_terminal_opens_where_the_file_browser_is_and_finds_attn_course(lab_server, browser_folder, expected):
    base, token = lab_server
    name = _open_terminal(base, token, browser_folder)
    # the marker is computed by the shell, so the echoed command line never contains it
    said = asyncio.run(_ask(base, token, name, 'echo "WHERE=$(pwd)"; echo "TOOL=$(command -v attn-course)"; '
                                               'echo "END-$((40 + 2))"', "END-42"))
    lines = dict(line.strip().split("=", 1) for line in said.replace("\r", "\n").splitlines()
                 if line.strip().startswith(("WHERE=", "TOOL=")))
    assert lines.get("WHERE") == str(expected), said[-1500:]
    tool = lines.get("TOOL", "")
    assert tool and Path(tool).parent == Path(sys.executable).parent, said[-1500:]
    assert os.access(tool, os.X_OK)
