"""Runs INSIDE the sandbox: execute a student's notebook cells in order, and at each test cell
run the grader's cases on the student's implementations and send the outcomes back.

It never decides a grade. Everything it sends is data (see serialize.py) that the trusted
grader judges against the reference, so tampering here (patched asserts, input transformers,
a monkeypatched numpy or torch) cannot earn a point.

Inputs arrive on file descriptor ATTN_IN_FD (an unlinked file the grader wrote; read, then
closed before any student code runs):
    {"cells": [...], "skip": [i, ...], "cell_timeout": s, "checks": {name: {"exercise", "cases"}}}
Outputs leave on ATTN_OUT_FD, the write end of the grader's pipe, as frames (channel.py).
The working directory is a private scratch folder; nothing written there is ever read back.
"""
from __future__ import annotations

import os
import signal
import sys

OUTPUT_CAP = 200_000  # characters of student output kept in the scratch folder (the rest is dropped)
GRADER_PATH_ENV = "ATTN_GRADER_PATH"  # where the runner's own modules are importable from (removed before student code)


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


def _read_inputs() -> dict:
    import pickle

    fd = int(os.environ.pop("ATTN_IN_FD"))
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return pickle.loads(b"".join(chunks))  # trusted input, written by the grader (cases pickled by value)


def _hide_grader() -> None:
    """Take the grader's modules off the import path: `import autograder` fails in student code."""
    path = os.environ.pop(GRADER_PATH_ENV, "")
    if path:
        sys.path[:] = [p for p in sys.path if p != path]
    for name in [m for m in sys.modules if m == "autograder" or m.startswith("autograder.")]:
        del sys.modules[name]
    sys.path_importer_cache.clear()


def main() -> int:
    out_fd = int(os.environ.pop("ATTN_OUT_FD"))
    job = _read_inputs()
    skip = set(job.get("skip", []))
    cell_timeout = float(job.get("cell_timeout", 60))
    import cloudpickle

    checks = cloudpickle.loads(job["checks"])  # trusted: the grader's cases, pickled by value

    # Student output never reaches the grader: fd 1/2 and sys.stdout/err go to capped scratch files.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = _CappedStream("stdout.txt")
    sys.stderr = _CappedStream("stderr.txt")

    from IPython.core.interactiveshell import InteractiveShell

    from autograder import serialize
    from autograder.channel import send
    from autograder.checks.core import run_case

    _hide_grader()
    shell = InteractiveShell.instance(colors="NoColor")
    _close_setup_errors()  # from here on the student's code runs: it gets no way to the grader's stderr
    shell.showtraceback = _quiet_traceback(shell)  # keep tracebacks short; they are not graded

    current = [0]

    def on_alarm(signum, frame):
        send(out_fd, b"T", current[0])  # the timer is off whenever a frame is being sent
        raise CellTimeout(f"cell took longer than {cell_timeout:g} s")

    signal.signal(signal.SIGALRM, on_alarm)
    for i, cell in enumerate(job["cells"]):
        if i in skip:
            continue
        current[0] = i
        send(out_fd, b"S", i)
        blob = None
        signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            if cell["kind"] == "code":
                shell.run_cell(cell["source"], store_history=False)  # IPython reports the timeout itself
            else:
                outcomes = {}
                for check in cell["checks"]:
                    spec = checks[check["name"]]
                    impl = shell.user_ns.get(check["variable"])
                    outcomes[check["name"]] = [run_case(spec["exercise"], case, impl) for case in spec["cases"]]
                blob = serialize.dumps(outcomes)
        except CellTimeout:
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if blob is not None:
            send(out_fd, b"R", i, blob)
        send(out_fd, b"E", i)
    send(out_fd, b"D")
    os._exit(0)  # skip interpreter teardown: student atexit hooks and threads get no say


def _quiet_traceback(shell):
    def show(*args, **kwargs):
        etype, value, _ = sys.exc_info()
        if etype is not None:
            sys.stderr.write(f"{etype.__name__}: {value}\n")
    return show


_SETUP_ERRORS: list[int] = []  # a copy of stderr, kept only while the runner sets itself up


def _close_setup_errors() -> None:
    while _SETUP_ERRORS:
        os.close(_SETUP_ERRORS.pop())


if __name__ == "__main__":
    _SETUP_ERRORS.append(os.dup(2))
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the runner's own failure while setting up: say why
        import traceback

        if _SETUP_ERRORS:
            os.write(_SETUP_ERRORS[0], traceback.format_exc()[-2000:].encode(errors="replace"))
        os._exit(1)
