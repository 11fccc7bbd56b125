"""Runs INSIDE the sandbox: execute a student's notebook cells in order, and at each test cell
run the grader's cases on the student's implementations and send the outcomes back.

It never decides a grade. Everything it sends is data (see serialize.py) that the trusted
grader judges against the reference, so tampering here (patched asserts, input transformers,
a monkeypatched numpy or torch) cannot earn a point.

Inputs arrive on file descriptor ATTN_IN_FD (an unlinked file the grader wrote; read, then
closed before any student code runs):
    {"cells": [...], "skip": [i, ...], "cell_timeout": s, "checks": {name: {"exercise", "cases"}},
     "swap": {i: [name, ...]}, "references": bytes, "stopped": {name: where}}
`stopped` (a restart only): exercises that already ran past the time limit in an earlier run of
this notebook, and where; they are bound to a stand-in that fails at once (see _stopped).
`swap` and `references` come only in the grader's second, isolated run (trusted.grade_job): at
test cell i the names listed are bound, while its checks run, to the course's implementations
(code objects without source or docstrings, trusted.blind_reference), then put back. Nothing
that run sends back is shown to the student but its verdicts (pass or fail).
Outputs leave on ATTN_OUT_FD, the write end of the grader's pipe, as frames (channel.py). A test
cell's results also carry, under CELL_ERRORS, the exceptions code cells raised since the last
results were sent (type, message, line): the grader explains a missing definition with them.
The working directory is a private scratch folder; nothing written there is ever read back.
"""
from __future__ import annotations

import os
import signal
import sys

OUTPUT_CAP = 200_000  # characters of student output kept in the scratch folder (the rest is dropped)
GRADER_PATH_ENV = "ATTN_GRADER_PATH"  # where the runner's own modules are importable from (removed before student code)
CELL_ERRORS = "#cell-errors"  # key, in a test cell's results, of the code cells' exceptions (never a check's name)
MAX_CELL_ERRORS = 50  # exceptions kept until the next results are sent


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
    from autograder import channel

    getpid, leave, runner = os.getpid, os._exit, os.getpid()  # bound now: student code may patch os

    def send(fd: int, kind: bytes, cell: int = 0, payload: bytes = b"") -> None:
        """A frame from this process only. A copy forked by the student's code that falls back into
        this loop (its cell raised instead of calling os._exit) is the notebook's own child: it leaves
        here, silently, instead of running the next cells and writing their frames among the runner's
        (out of order: the whole run void)."""
        if getpid() != runner:
            leave(0)
        channel.send(fd, kind, cell, payload)

    from autograder.keyrings import close_keyrings, deny_to_notebook

    refusal = close_keyrings() or _self_check(job.get("sandbox", {}))
    # A kernel without seccomp filters (close_keyrings accepts its new keyring alone there) loses only these
    # guards of the CPU's fair share and of memory outside any mapping, not a grade: the notebook runs.
    deny_to_notebook()
    _limit_open_files()
    if refusal:
        send(out_fd, b"X", 0, refusal.encode())
        os._exit(3)
    skip = set(job.get("skip", []))
    cell_timeout = float(job.get("cell_timeout", 60))
    import cloudpickle

    checks = cloudpickle.loads(job["checks"])  # trusted: the grader's cases, pickled by value
    # trusted too (isolated run only): unpickled now, before any student code can patch the unpickler
    references = cloudpickle.loads(job["references"]) if job.get("references") else {}

    # Student output never reaches the grader: fd 1/2 and sys.stdout/err go to capped scratch files.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    sys.stdout = _CappedStream("stdout.txt")
    sys.stderr = _CappedStream("stderr.txt")

    from IPython.core.interactiveshell import InteractiveShell

    from autograder import serialize
    from autograder.checks.core import install_behaviour_watch, run_case

    install_behaviour_watch()  # before any student code: no process, no unpickled name while a check runs

    _hide_grader()
    shell = InteractiveShell.instance(colors="NoColor")
    send(out_fd, b"I")  # the self-check passed: from here on, what happens is the notebook's
    _close_setup_errors()  # from here on the student's code runs: it gets no way to the grader's stderr
    shell.showtraceback = _quiet_traceback(shell)  # keep tracebacks short; they are not graded

    current = [0]
    exercises = {check["variable"] for cell in job["cells"] if cell["kind"] != "code" for check in cell.get("checks", ())}
    stopped: dict[str, str] = dict(job.get("stopped", {}))  # exercise -> where it ran past the limit
    looping = [None]  # the exercise that was running when the timer went off

    def on_alarm(signum, frame):
        looping[0] = _looping_exercise(frame, exercises, shell.user_ns)
        send(out_fd, b"T", current[0], (looping[0] or "").encode())  # the timer is off whenever a frame is being sent
        raise CellTimeout(f"cell took longer than {cell_timeout:g} s")

    swaps = {int(k): list(v) for k, v in job.get("swap", {}).items()}
    errors: dict[str, dict] = {}  # code cells' exceptions not yet sent
    signal.signal(signal.SIGALRM, on_alarm)
    for i, cell in enumerate(job["cells"]):
        if i in skip:
            continue
        current[0] = i
        send(out_fd, b"S", i)
        blob = None
        checking = [None]  # the notebook variable whose check is running (a test cell)
        looping[0] = None
        signal.setitimer(signal.ITIMER_REAL, cell_timeout)
        try:
            if cell["kind"] == "code":
                result = shell.run_cell(cell["source"], store_history=False)  # IPython reports the timeout itself
                if isinstance(result.error_in_exec, CellTimeout) and looping[0]:
                    stopped.setdefault(looping[0], f"code cell {i + 1} of the graded run")
                try:
                    error = _cell_error(result)  # read under the cell's timer: a student's __str__ may loop
                except Exception:  # noqa: BLE001 - a hostile exception object: no explanation, no crash
                    error = None
                if error and len(errors) < MAX_CELL_ERRORS:
                    errors[str(i)] = error
            else:
                outcomes = {}
                saved = _swap_in(shell.user_ns, swaps.get(i, ()), references)
                try:
                    for check in cell["checks"]:
                        spec = checks[check["name"]]
                        checking[0] = check["variable"]
                        impl = shell.user_ns.get(check["variable"])
                        outcomes[check["name"]] = [run_case(spec["exercise"], case, impl) for case in spec["cases"]]
                    checking[0] = None
                finally:
                    _swap_out(shell.user_ns, saved)
                if errors:
                    outcomes[CELL_ERRORS] = dict(errors)
                blob = serialize.dumps(outcomes)
        except CellTimeout:
            if looping[0] or checking[0]:  # one wait per looping function: later calls fail at once, saying why
                stopped.setdefault(looping[0] or checking[0], f"test cell `{cell.get('test', '')}`")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        for name, where in stopped.items():  # after every cell: an answer cell run later defines it again
            if not getattr(shell.user_ns.get(name), "_attn_stopped", False):
                shell.user_ns[name] = _stopped(name, where)
        if blob is not None:
            send(out_fd, b"R", i, blob)
            errors.clear()
        send(out_fd, b"E", i)
    send(out_fd, b"D")
    os._exit(0)  # skip interpreter teardown: student atexit hooks and threads get no say


def _self_check(expect: dict) -> str:
    """Why this sandbox must not run the student's code ("" when it may): the Python is the
    grader's, the course library imported is the copy the grader bound (and judges against), the
    scratch folder is empty and writable (its own). Also sets the process ceiling, inside the
    sandbox's own user namespace (counted per sandbox there, not per user)."""
    import resource

    if expect.get("python") and sys.version != expect["python"]:
        return f"the sandbox runs Python {sys.version.split()[0]}, the grader {str(expect['python']).split()[0]}"
    if expect.get("library"):
        try:
            import attention_course
        except Exception as err:  # noqa: BLE001 - any failure to import is the grader's problem, named
            return f"the course library does not import inside the sandbox ({type(err).__name__}: {err})"[:500]
        found = os.path.dirname(os.path.realpath(getattr(attention_course, "__file__", None) or "?"))
        if found != os.path.realpath(expect["library"]):
            return (f"the sandbox imports the course library from {found}, not the copy the grader bound "
                    f"({expect['library']})")
    try:
        if os.listdir("."):
            return "the sandbox's scratch folder is not empty: it is not private to this sandbox"
        with open(".attn-probe", "w") as fh:
            fh.write("ok")
        os.remove(".attn-probe")
    except OSError as err:
        return f"the sandbox's scratch folder is not writable ({err.strerror})"
    if expect.get("processes"):
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (int(expect["processes"]), int(expect["processes"])))
        except (OSError, ValueError) as err:
            return f"the sandbox could not limit its processes ({err})"
    return ""


OPEN_FILES = 1024  # files, sockets and pipes per process (Linux's usual soft limit): each holds kernel memory
# in no process's PSS; the memory watch counts sockets (memwatch.py), and this bounds the pipes it cannot see


def _limit_open_files() -> None:
    """At most OPEN_FILES open per process, for good (soft and hard): the memory watch counts a socket at its
    buffer's size, and the sockets a process can open are what it must read each time it looks."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


_ABSENT = object()


class StoppedEarlier(Exception):
    """Raised by an exercise that already ran past its time limit once, in place of running it again."""


def _stopped(name: str, where: str):
    """What `name` is bound to after it ran past the cell's time limit (in `where`, a test cell or a
    code cell): every later call (a later test, a code cell, another exercise calling it) fails at
    once, saying why, instead of waiting the whole limit again."""
    def stopped(*args, **kwargs):
        raise StoppedEarlier(f"`{name}` already ran past the time limit in {where}, so the grader "
                             f"does not run it again (it would wait the whole limit once more): fix the loop "
                             f"in `{name}` first")
    stopped.__name__ = stopped.__qualname__ = name
    stopped._attn_stopped = True
    return stopped


MAX_NAME_BYTES = 200  # an exercise's name in a timeout frame


def _looping_exercise(frame, exercises: set[str], namespace: dict) -> str | None:
    """The exercise whose code was running when the timer went off: the innermost frame, from
    `frame` outwards, running the code of one of the notebook's exercise functions."""
    codes = {}
    for name in exercises:
        code = getattr(namespace.get(name), "__code__", None)
        if code is not None and not getattr(namespace.get(name), "_attn_stopped", False):
            codes[code] = name
    while frame is not None and codes:
        if frame.f_code in codes:
            name = codes[frame.f_code]
            return name if len(name.encode()) <= MAX_NAME_BYTES else None
        frame = frame.f_back
    return None


def _swap_in(namespace: dict, names, references: dict) -> dict:
    """Bind `names` to the course's implementations (the isolated run only); what they were before."""
    saved = {name: namespace.get(name, _ABSENT) for name in names if name in references}
    namespace.update({name: references[name] for name in saved})
    return saved


def _swap_out(namespace: dict, saved: dict) -> None:
    for name, value in saved.items():
        if value is _ABSENT:
            namespace.pop(name, None)
        else:
            namespace[name] = value


def _cell_error(result) -> dict | None:
    """The exception a code cell stopped with: type, message and the line of the cell it came from
    (the deepest frame in the cell's own code; for a syntax error, the line it points at)."""
    err = getattr(result, "error_before_exec", None) or getattr(result, "error_in_exec", None)
    if err is None or isinstance(err, CellTimeout):
        return None
    try:
        kind = str(type(err).__name__)[:100]
        message = str(err.msg if isinstance(err, SyntaxError) and isinstance(err.msg, str) else err)[:500]
    except Exception:  # noqa: BLE001 - the student's exception may refuse to be printed
        kind, message = "Exception", "(its message could not be read)"
    line = None
    if isinstance(err, SyntaxError):
        line = err.lineno if isinstance(err.lineno, int) else None
    else:
        tb, cell_file = err.__traceback__, None
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename
            if cell_file is None and name.startswith("<ipython-input-"):
                cell_file = name
            if name == cell_file:
                line = tb.tb_lineno
            tb = tb.tb_next
    return {"type": kind, "message": message, "line": line}


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
