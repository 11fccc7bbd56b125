"""Runs INSIDE the sandbox: execute a student's notebook cells in order, and at each test cell
run the grader's cases on the student's implementations and write the outcomes to disk.

It never decides a grade. Everything it writes is data (see serialize.py) that the trusted
grader reads back and judges against the reference, so tampering here (patched asserts,
input transformers, a monkeypatched numpy) cannot earn a point.

Working directory = the job folder:
    job.json      {"cells": [...], "skip": [i, ...], "cell_timeout": s}
    cases.pkl     {check name: {"graded": name, "cases": [Case, ...], "forbidden": [(func, why)]}}
    progress.log  written here: "start i", "end i", "done"
    out/<i>.npz   the outcomes of test cell i
"""
from __future__ import annotations

import json
import os
import signal
import sys

OUTPUT_CAP = 200_000  # characters of student output kept (the rest is dropped)


class _CappedStream:
    """A stdout/stderr stand-in that keeps the first OUTPUT_CAP characters and drops the rest."""

    def __init__(self, path: str):
        self._fh = open(path, "w", encoding="utf-8", errors="replace")
        self._left = OUTPUT_CAP

    def write(self, text):
        text = str(text)
        if self._left > 0:
            self._fh.write(text[: self._left])
            self._left -= len(text)
            if self._left <= 0:
                self._fh.write("\n[output truncated by the grader]\n")
            self._fh.flush()
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


class CellTimeout(BaseException):
    """Raised in the student's cell when its time is up (BaseException: harder to swallow)."""


def _progress(fh, text: str) -> None:
    fh.write(text + "\n")
    fh.flush()
    os.fsync(fh.fileno())


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def main() -> int:
    with open("job.json") as fh:
        job = json.load(fh)
    skip = set(job.get("skip", []))
    cell_timeout = float(job.get("cell_timeout", 60))

    # Student output never reaches the grader's terminal: fd 1/2 and sys.stdout/err go to capped files.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = _CappedStream("stdout.txt")
    sys.stderr = _CappedStream("stderr.txt")

    import cloudpickle

    with open("cases.pkl", "rb") as fh:
        checks = cloudpickle.load(fh)  # trusted input, written by the grader (cases pickled by value)

    from IPython.core.interactiveshell import InteractiveShell

    from autograder import serialize
    from autograder.checks.core import run_case

    shell = InteractiveShell.instance(colors="NoColor")
    shell.showtraceback = _quiet_traceback(shell)  # keep tracebacks short; they are not graded
    os.makedirs("out", exist_ok=True)

    def on_alarm(signum, frame):
        raise CellTimeout(f"cell took longer than {cell_timeout:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    progress = open("progress.log", "a")
    for i, cell in enumerate(job["cells"]):
        if i in skip:
            continue
        _progress(progress, f"start {i}")
        signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            if cell["kind"] == "code":
                shell.run_cell(cell["source"], store_history=False)
            else:
                outcomes = {}
                for check in cell["checks"]:
                    spec = checks[check["name"]]
                    impl = shell.user_ns.get(check["variable"])
                    outcomes[check["name"]] = [run_case(spec["exercise"], case, impl) for case in spec["cases"]]
                _write_atomic(os.path.join("out", f"{i}.npz"), serialize.dumps(outcomes))
        except CellTimeout:
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _progress(progress, f"end {i}")
    _progress(progress, "done")
    progress.close()
    os._exit(0)  # skip interpreter teardown: student atexit hooks and threads get no say


def _quiet_traceback(shell):
    def show(*args, **kwargs):
        etype, value, _ = sys.exc_info()
        if etype is not None:
            sys.stderr.write(f"{etype.__name__}: {value}\n")
    return show


if __name__ == "__main__":
    sys.exit(main())
