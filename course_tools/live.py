"""`check()` from a cell of the notebook itself: the grader's own check of the notebook you are in.

    from course_tools.live import check
    check()            # every exercise: PASS / FAIL (why) / TODO, and the points
    check("softmax")   # one exercise's lines

Where the notebook is: on Colab, the live notebook as the browser holds it (asked from Colab's
front end: Colab's notebook is no file on the machine); in Jupyter, the notebook's saved file
(the server names it to its kernel; save first). The check itself is `attn-course check`, run in
a process of its own (`-`: the notebook's JSON on its standard input), so it is the same check as
the terminal's and the instructor's, sandboxed where the machine allows it and saying so where not.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

COLAB_TIMEOUT_S = 60  # to get the notebook from Colab's front end
GRADER_PYTHON = "ATTN_GRADER_PYTHON"  # the Python that has the grader, where it is not the kernel's (Colab's install cell)


class NoLiveNotebook(RuntimeError):
    """Neither Colab nor a Jupyter server that names the notebook: give its path instead."""


def live_notebook() -> tuple[bytes, str, str]:
    """(the notebook's JSON, its file name or "", where it came from, for the reader)."""
    try:
        from google.colab import _message  # only on Colab
    except ImportError:
        _message = None
    if _message is not None:
        answer = _message.blocking_request("get_ipynb", request="", timeout_sec=COLAB_TIMEOUT_S)
        if not isinstance(answer, dict) or not isinstance(answer.get("ipynb"), dict):
            raise NoLiveNotebook("Colab did not send the notebook: run the cell again")
        notebook = answer["ipynb"]
        name = str(notebook.get("metadata", {}).get("colab", {}).get("name", ""))
        return json.dumps(notebook).encode(), name, "this Colab notebook, as it is now (saved or not)"
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb") and Path(session).is_file():
        path = Path(session)
        return path.read_bytes(), path.name, f"{path.name} as last saved (save first: Ctrl+S)"
    raise NoLiveNotebook("this kernel does not know its notebook (not Colab, and no Jupyter server named it): "
                         "run `attn-course check PATH.ipynb` in a terminal, or check(path='PATH.ipynb')")


def check(exercise: str | None = None, path: str | Path | None = None) -> int:
    """Print the grader's report on this notebook (or on `path`); only `exercise`'s lines when given.
    Returns `attn-course check`'s exit status (0: full marks)."""
    if path is not None:
        data, name, where = Path(path).read_bytes(), Path(path).name, str(path)
    else:
        data, name, where = live_notebook()
    python = os.environ.get(GRADER_PYTHON) or sys.executable  # on Colab, the grader's own environment
    command = [python, "-m", "course_tools.cli", "check", "-", "--progress", "none"]
    if name:
        command += ["--name", name]
    print(f"checking {where} ...", flush=True)
    done = subprocess.run(command, input=data, capture_output=True, check=False)
    report = done.stdout.decode(errors="replace").rstrip()
    if done.returncode not in (0, 1) or not report:
        print(done.stderr.decode(errors="replace").strip() or f"the check stopped (exit {done.returncode})")
        return done.returncode or 2
    print(only(report, exercise) if exercise else report)
    return done.returncode


def only(report: str, exercise: str) -> str:
    """The report's first line, `exercise`'s verdict and reasons, and the closing notes."""
    lines = report.splitlines()
    kept, inside = [lines[0]], False
    for line in lines[1:]:
        verdict = line.startswith("  ") and not line.startswith("        ")
        if verdict:
            inside = line.split()[1:2] == [exercise]
        if inside or line.startswith("note:"):
            kept.append(line)
    if len(kept) == 1:
        kept.append(f"  (no exercise called {exercise!r} in this notebook)")
    return "\n".join(kept)
