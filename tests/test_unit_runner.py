"""Unit tests for the protocol between the sandboxed runner (autograder/runner.py) and the grader:
the frames of autograder/channel.py (layout, what the grader's Reader keeps, its size caps, what
it refuses), the runner's own helpers, and one real runner process (no sandbox, no nbgrader)
talking over a pipe, frame by frame.

No test waits on a clock: pipes are written in full and closed before anything is read back, and
the one "timeout" is a SIGALRM the cell sends itself (the runner's handler is what is tested, not
how long a second is). Time limits below (join, wait) are safety nets only, never what is checked.
"""
from __future__ import annotations

import os
import pickle
import select
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import pytest

from autograder import channel, runner, sandbox, serialize, trusted
from autograder.channel import HEADER, KINDS, Reader, Received, send

REPO = Path(__file__).resolve().parents[1]
SAFETY = 60  # seconds: only ever reached when something hangs


# --------------------------------------------------------------------------- frames
def frame(kind: bytes, cell: int = 0, payload: bytes = b"", length: int | None = None) -> bytes:
    """One frame as the runner writes it (a `length` that lies, when given)."""
    return HEADER.pack(kind, cell, len(payload) if length is None else length) + payload


def read_back(data: bytes, cells: int = 10, result_cells=frozenset({1, 3}), ready: bool = True,
              **caps) -> Received:
    """What a Reader keeps of `data`, written whole and closed before it is read (no timing);
    after the runner's "ready" frame (I) unless `ready` is False."""
    data = (frame(b"I") if ready else b"") + data
    read_fd, write_fd = os.pipe()
    assert len(data) < 60_000, "keep test frames inside one pipe buffer"
    os.write(write_fd, data)
    os.close(write_fd)
    reader = Reader(read_fd, cells, set(result_cells), **caps)
    got = reader.close(timeout=SAFETY)
    assert not reader.thread.is_alive()
    return got


def test_a_frame_is_kind_cell_length_payload_big_endian():
    read_fd, write_fd = os.pipe()
    send(write_fd, b"R", 0x01020304, b"payload")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        assert fh.read() == b"R" + b"\x01\x02\x03\x04" + b"\x00\x00\x00\x07" + b"payload"
    assert HEADER.size == 9 and KINDS == {b"S", b"E", b"T", b"R", b"D", b"I", b"X"}


def test_before_ready_only_the_runners_own_frames_count():
    """Nothing counts before the self-check's I (no student code ran); a refusal (X) counts only
    then: student code, which runs after I, cannot make its own run look like the grader's incident."""
    early = read_back(frame(b"S", 1) + frame(b"R", 1, b"forged") + frame(b"D"), ready=False)
    assert not early.ready and early.results == {} and not early.done and early.running is None
    refused = read_back(frame(b"X", 0, "the library does not import".encode()), ready=False)
    assert not refused.ready and refused.refused == "the library does not import"
    late = read_back(frame(b"S", 1) + frame(b"X", 0, b"pretend") + frame(b"E", 1) + frame(b"D"))
    assert late.ready and late.refused == "" and late.done


def test_send_writes_the_whole_frame_when_the_pipe_takes_a_few_bytes_at_a_time(monkeypatch):
    written = []
    real_write = os.write

    def stingy(fd, data):
        written.append(len(data))
        return real_write(fd, bytes(data[:3]))

    read_fd, write_fd = os.pipe()
    with monkeypatch.context() as m:
        m.setattr(channel.os, "write", stingy)
        send(write_fd, b"R", 1, b"0123456789")
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        assert fh.read() == frame(b"R", 1, b"0123456789")
    assert len(written) == 7  # 19 bytes, 3 at a time


def test_a_whole_run_is_read_back():
    blob = serialize.dumps({"nb01.softmax": [("value", np.arange(3.0))]})
    data = b"".join([frame(b"S", 0), frame(b"E", 0), frame(b"S", 1), frame(b"R", 1, blob), frame(b"E", 1),
                     frame(b"S", 2), frame(b"T", 2), frame(b"E", 2), frame(b"D")])
    got = read_back(data)
    assert got == Received(running=None, done=True, results={1: blob}, timed_out=[2], problem="",
                           total=HEADER.size + len(data), ready=True)
    assert serialize.loads(got.results[1])["nb01.softmax"][0][1].tolist() == [0.0, 1.0, 2.0]


def test_a_run_that_stops_in_a_cell_leaves_it_running():
    got = read_back(frame(b"S", 0) + frame(b"E", 0) + frame(b"S", 1))
    assert (got.running, got.done, got.problem) == (1, False, "")


# Frames the runner never sends, or that speak for a cell that is not running: dropped, reading goes on.
IGNORED = {
    "results for a cell that is not running": [frame(b"S", 1), frame(b"E", 1), frame(b"R", 1, b"late")],
    "results for a cell never started": [frame(b"R", 3, b"forged")],
    "results while another cell runs": [frame(b"S", 1), frame(b"R", 3, b"forged")],
    "results for a code cell": [frame(b"S", 2), frame(b"R", 2, b"forged")],
    "a start past the last cell": [frame(b"S", 10), frame(b"R", 10, b"forged")],
    "a timeout for a cell not running": [frame(b"S", 1), frame(b"T", 2)],
}


@pytest.mark.parametrize("name", IGNORED)
def test_frames_that_do_not_speak_for_the_running_cell_are_dropped(name):
    got = read_back(b"".join(IGNORED[name]) + frame(b"D"))
    assert got.results == {} and got.timed_out == [] and got.done and got.problem == ""


def test_one_result_and_one_timeout_per_cell_the_first_kept():
    got = read_back(b"".join([frame(b"S", 1), frame(b"R", 1, b"first"), frame(b"R", 1, b"second"),
                              frame(b"T", 1), frame(b"T", 1), frame(b"E", 1)]))
    assert got.results == {1: b"first"} and got.timed_out == [1]


def test_an_unknown_frame_stops_reading_there():
    got = read_back(frame(b"S", 1) + frame(b"Z", 1, b"?") + frame(b"R", 1, b"after") + frame(b"D"))
    assert got.problem == "the results channel carried an unknown frame"
    assert (got.running, got.results, got.done) == (1, {}, False)  # nothing after it was applied


@pytest.mark.parametrize("kind", [b"s", b"\x00", b"P", b"\xff"])
def test_every_kind_outside_the_five_is_unknown(kind):
    assert read_back(frame(kind)).problem == "the results channel carried an unknown frame"


def test_a_frame_over_the_frame_cap_stops_reading_before_its_payload():
    """Only the header is sent: the Reader must not wait for (or allocate) the claimed payload. The
    total cap is set out of the way, so that only the frame cap can refuse it."""
    got = read_back(frame(b"S", 1) + frame(b"R", 1, length=2**32 - 1), max_frame=1000, max_total=2**40)
    assert "(or one test cell over 0 MiB)" in got.problem
    assert got.results == {} and got.total == 2 * HEADER.size  # I, then the refused header


def test_the_frame_cap_itself_is_allowed():
    got = read_back(frame(b"S", 1) + frame(b"R", 1, b"x" * 1000) + frame(b"E", 1), max_frame=1000, max_total=2**40)
    assert got.problem == "" and got.results == {1: b"x" * 1000}
    got = read_back(frame(b"S", 1) + frame(b"R", 1, b"x" * 1001) + frame(b"E", 1), max_frame=1000, max_total=2**40)
    assert "one test cell over" in got.problem and got.results == {} and got.running == 1


def test_the_total_cap_counts_headers_and_payloads_of_every_frame():
    frames = [frame(b"S", 1), frame(b"R", 1, b"x" * 100), frame(b"E", 1)]
    total = sum(map(len, frames))
    assert read_back(b"".join(frames), max_total=HEADER.size + total).problem == ""
    got = read_back(b"".join(frames), max_total=HEADER.size + total - 1)
    assert got.problem.startswith("the notebook sent more than") and got.running == 1
    assert got.total == total  # I and two frames: the last one was refused before it was read


def test_the_real_caps_are_what_the_module_says():
    assert (channel.MAX_FRAME_BYTES, channel.MAX_TOTAL_BYTES) == (64 * 2**20, 256 * 2**20)
    got = read_back(frame(b"S", 1) + frame(b"R", 1, length=channel.MAX_FRAME_BYTES + 1))
    assert "one test cell over 64 MiB" in got.problem


@pytest.mark.parametrize("cut", [1, HEADER.size - 1, HEADER.size + 2])
def test_a_frame_cut_short_by_the_writer_s_death_is_not_applied(cut):
    whole = frame(b"S", 1) + frame(b"R", 1, b"payload")
    got = read_back(whole[:len(frame(b"S", 1)) + cut])
    assert (got.running, got.results, got.problem) == (1, {}, "")


def test_close_returns_a_copy_and_the_reader_closes_its_end():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, frame(b"I") + frame(b"S", 1) + frame(b"R", 1, b"r") + frame(b"T", 1))
    os.close(write_fd)
    reader = Reader(read_fd, 5, {1})
    got = reader.close(timeout=SAFETY)
    got.results.clear()
    got.timed_out.clear()
    assert reader.state.results == {1: b"r"} and reader.state.timed_out == [1]
    assert reader.snapshot() == (1, False)
    with pytest.raises(OSError):
        os.fstat(read_fd)


# --------------------------------------------------------------------------- the runner's helpers
def test_student_output_is_capped_and_marked_once(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "OUTPUT_CAP", 10)
    stream = runner._CappedStream(str(tmp_path / "out.txt"))
    assert stream.write("12345") == 5 and stream.write("6789AB") == 6 and stream.write("more") == 4
    assert stream.write(12) == 2  # not a str: written as one, as print would
    assert not stream.isatty() and stream.flush() is None
    assert (tmp_path / "out.txt").read_text() == "123456789A\n[output truncated by the grader]\n"


def test_the_real_output_cap_keeps_exactly_its_characters(tmp_path):
    stream = runner._CappedStream(str(tmp_path / "out.txt"))
    stream.write("x" * (runner.OUTPUT_CAP - 1))
    stream.write("yz" * 1000)
    assert (tmp_path / "out.txt").read_text() == "x" * (runner.OUTPUT_CAP - 1) + "y\n[output truncated by the grader]\n"


def test_swapping_binds_only_names_with_a_reference_and_puts_everything_back():
    def student_softmax(x):
        return x

    def course_softmax(x):
        return x

    namespace = {"softmax": student_softmax, "other": 1}
    original = dict(namespace)
    saved = runner._swap_in(namespace, ["softmax", "merge_heads", "other"], {"softmax": course_softmax,
                                                                            "merge_heads": print})
    assert namespace == {"softmax": course_softmax, "other": 1, "merge_heads": print}
    runner._swap_out(namespace, saved)
    assert namespace == original  # merge_heads was not defined before: gone again


def test_cell_errors_name_the_type_message_and_line_in_the_cell():
    source = "def helper(x):\n    return 1 / x\n\ny = 2\nhelper(0)\n"
    try:
        exec(compile(source, "<ipython-input-3-0123456789ab>", "exec"), {})
    except ZeroDivisionError as err:
        error = err
    result = types.SimpleNamespace(error_before_exec=None, error_in_exec=error)
    assert runner._cell_error(result) == {"type": "ZeroDivisionError", "message": "division by zero", "line": 2}


def test_a_cell_error_raised_in_a_library_points_at_the_cell_s_line():
    source = "import json\nx = 1\njson.loads('{')\n"
    try:
        exec(compile(source, "<ipython-input-7-0123456789ab>", "exec"), {})
    except ValueError as err:
        error = err
    got = runner._cell_error(types.SimpleNamespace(error_before_exec=None, error_in_exec=error))
    assert got["type"] == "JSONDecodeError" and got["line"] == 3


def test_a_syntax_error_points_at_its_line():
    err = SyntaxError("invalid syntax", ("<ipython-input-1-x>", 4, 2, "x = (\n"))
    got = runner._cell_error(types.SimpleNamespace(error_before_exec=err, error_in_exec=None))
    assert got == {"type": "SyntaxError", "message": "invalid syntax", "line": 4}


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


@pytest.mark.parametrize("error, want", [
    (None, None),
    (runner.CellTimeout("cell took longer than 1 s"), None),  # the timeout is reported by its own frame
    (_Unprintable(), {"type": "Exception", "message": "(its message could not be read)", "line": None}),
    (ValueError("m" * 10_000), {"type": "ValueError", "message": "m" * 500, "line": None}),
    (type("E" * 300, (Exception,), {})("x"), {"type": "E" * 100, "message": "x", "line": None}),
    (SyntaxError("bad", ("f", "not a line", 1, "")), {"type": "SyntaxError", "message": "bad", "line": None}),
], ids=["no error", "timeout", "unprintable", "long message", "long type name", "odd lineno"])
def test_cell_errors_are_bounded_and_never_raise(error, want):
    assert runner._cell_error(types.SimpleNamespace(error_before_exec=None, error_in_exec=error)) == want


def test_the_grader_is_taken_off_the_import_path(monkeypatch):
    """On private copies of sys.path and sys.modules: the real ones are left alone."""
    kit = "/opt/attn-grader-kit"
    monkeypatch.setenv(runner.GRADER_PATH_ENV, kit)
    monkeypatch.setattr(sys, "path", [kit, "/usr/lib/python3", kit])
    fake = {name: types.ModuleType(name) for name in ("autograder", "autograder.channel", "autograderx", "numpy")}
    monkeypatch.setattr(sys, "modules", dict(fake))
    runner._hide_grader()
    assert sys.path == ["/usr/lib/python3"] and sorted(sys.modules) == ["autograderx", "numpy"]
    assert runner.GRADER_PATH_ENV not in os.environ


def test_the_inputs_are_read_once_from_their_descriptor(tmp_path, monkeypatch):
    inputs = {"cells": [{"kind": "code", "source": "x = 1"}], "skip": [], "cell_timeout": 5.0, "checks": b""}
    (tmp_path / "inputs").write_bytes(pickle.dumps(inputs))
    fd = os.open(tmp_path / "inputs", os.O_RDONLY)
    monkeypatch.setenv("ATTN_IN_FD", str(fd))
    assert runner._read_inputs() == inputs
    assert "ATTN_IN_FD" not in os.environ
    with pytest.raises(OSError):
        os.fstat(fd)


def test_the_runner_and_the_grader_agree_on_the_cell_errors_key():
    assert runner.CELL_ERRORS == trusted.CELL_ERRORS


# --------------------------------------------------------------------------- one real runner
def read_frames(fd: int, proc: subprocess.Popen) -> list[tuple[bytes, int, bytes]]:
    """Every frame on `fd` until the runner closes it (select: never blocked past SAFETY)."""
    data = b""
    while True:
        ready, _, _ = select.select([fd], [], [], SAFETY)
        if not ready:
            proc.kill()
            raise AssertionError("the runner sent nothing for a minute")
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    frames, at = [], 0
    while at < len(data):
        kind, cell, length = HEADER.unpack_from(data, at)
        frames.append((kind, cell, data[at + HEADER.size:at + HEADER.size + length]))
        at += HEADER.size + length
    assert at == len(data), "a frame cut short"
    return frames


def test_a_real_runner_speaks_the_protocol(tmp_path):
    """The runner, from the sandbox's kit only (sandbox.KIT_FILES), runs a small notebook: a frame
    per cell in order, results for the test cell only (with the code cells' errors), a timeout
    frame for the cell whose alarm went off, nothing for a skipped cell, and D at the end."""
    kit = tmp_path / "kit"
    for name in sandbox.KIT_FILES:
        (kit / "autograder" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "autograder" / name, kit / "autograder" / name)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    softmax = trusted.CheckRef("nb01", "softmax", "softmax")
    cells = [
        {"kind": "code", "source": "import numpy as np\ndef softmax(x, axis=-1):\n"
                                   "    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
                                   "    return e / e.sum(axis=axis, keepdims=True)\n"},
        {"kind": "code", "source": "x = 1\nundefined_name\n"},
        {"kind": "record", "test": "test_softmax", "checks": [{"name": softmax.key, "variable": "softmax"}]},
        {"kind": "code", "source": "import os, signal\nos.kill(os.getpid(), signal.SIGALRM)\nwhile True:\n    pass\n"},
        {"kind": "code", "source": "raise SystemExit('skipped: never run')\n"},
        {"kind": "code", "source": "print('the run went on')\n"},
    ]
    tests = [trusted.TestCell("test_softmax", 1.0, [softmax])]
    job = trusted.Job(cells, {"test_softmax": 2})
    inputs = dict(trusted.job_inputs(job, tests, cell_timeout=SAFETY), skip=[4])
    with tempfile.TemporaryFile() as fh:
        fh.write(pickle.dumps(inputs))
        fh.seek(0)
        read_fd, write_fd = os.pipe()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(scratch), "PYTHONPATH": str(kit),
               runner.GRADER_PATH_ENV: str(kit), "ATTN_IN_FD": str(fh.fileno()), "ATTN_OUT_FD": str(write_fd),
               "IPYTHONDIR": str(scratch / ".ipython"), "MPLCONFIGDIR": str(scratch / ".mpl"), "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "autograder.runner"], cwd=scratch, env=env,
                                pass_fds=(fh.fileno(), write_fd), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(write_fd)
        try:
            frames = read_frames(read_fd, proc)
        finally:
            os.close(read_fd)
        _, errors = proc.communicate(timeout=SAFETY)
    assert proc.returncode == 0, errors.decode(errors="replace")[-2000:]
    assert [(kind, cell) for kind, cell, _ in frames] == [
        (b"I", 0), (b"S", 0), (b"E", 0), (b"S", 1), (b"E", 1), (b"S", 2), (b"R", 2), (b"E", 2),
        (b"S", 3), (b"T", 3), (b"E", 3), (b"S", 5), (b"E", 5), (b"D", 0)]
    outcomes = serialize.loads(frames[6][2])
    assert outcomes[runner.CELL_ERRORS] == {
        "1": {"type": "NameError", "message": "name 'undefined_name' is not defined", "line": 2}}
    assert [o[0] for o in outcomes[softmax.key]] == ["value"] * len(trusted.cases(softmax))
    verdicts = trusted.judge_job(job, tests, sandbox.JobResult("none: a unit test", results={2: frames[6][2]}))
    assert verdicts["test_softmax"].passed
    assert (scratch / "stdout.txt").read_text() == "the run went on\n"  # student output: a scratch file only


def test_a_restart_still_starting_when_the_notebooks_time_runs_out_is_the_students_timeout(monkeypatch, tmp_path):
    """Red team 15: a notebook that exits just before its time limit has its restart stopped while it starts (the
    limit passes); that was read as a sandbox that could not start, tried twice more with the time spent, and the
    notebook became the grader's incident: no grade, no 0, and every re-run another try. The time was the student's."""
    from autograder.settings import Limits

    runs = []
    clock = types.SimpleNamespace(now=0.0)  # the sandbox's clock, moved by the runs alone: no machine's speed in it
    monkeypatch.setattr(sandbox, "time", types.SimpleNamespace(monotonic=lambda: clock.now, sleep=lambda s: None))

    def fake_run_once(mode, world, limits, job, inputs, groups, started, budget, progress=None, warm=None):
        runs.append(sorted(inputs["skip"]))
        if len(runs) == 1:  # the student's code ran, and left in cell 2 well before the limit
            clock.now += 0.5
            return Received(running=2, ready=True), 1, "", ""
        clock.now += 2.0  # the restart, stopped while it starts: the notebook's limit passed meanwhile
        return Received(), None, "", ""

    monkeypatch.setattr(sandbox, "_run_once", fake_run_once)
    monkeypatch.setattr(sandbox, "_cgroups", lambda limits: [])
    inputs = {"cells": [{"kind": "code"} for _ in range(4)], "skip": []}
    result = sandbox.run_notebook_job(tmp_path, inputs, world=None, limits=Limits(notebook_seconds=2.0))
    assert len(runs) == 2, runs  # no retries with the time spent
    kinds = [(i.cell, i.kind) for i in result.incidents]
    assert kinds == [(2, "exit"), (-1, "timeout")], result.incidents
    assert "ran past its 2 s limit" in result.incidents[-1].detail


@pytest.mark.parametrize("first_total,restart", [(channel.MAX_TOTAL_BYTES - 1, None),
                                                 (1000, Received(problem="more than the notebook may send"))])
def test_a_results_budget_filled_to_the_brim_is_the_students_not_a_sandbox_that_could_not_start(
        monkeypatch, tmp_path, first_total, restart):
    """Red team 16: a cell sent ready frames until the channel held one byte less than its limit, then exited; the
    restart's own ready frame no longer fitted, the restart read as a sandbox that could not start, and after three
    tries the notebook was the grader's incident (no grade, no 0), every run. A nearly spent budget is not
    restarted, and a restart the channel stopped is the student's: 'channel'."""
    from autograder.settings import Limits

    runs = []

    def fake_run_once(mode, world, limits, job, inputs, groups, started, budget, progress=None, warm=None):
        runs.append(budget)
        if len(runs) == 1:
            return Received(running=1, ready=True, total=first_total), 1, "", ""
        return restart, None, "", ""

    monkeypatch.setattr(sandbox, "_run_once", fake_run_once)
    monkeypatch.setattr(sandbox, "_cgroups", lambda limits: [])
    inputs = {"cells": [{"kind": "code"} for _ in range(3)], "skip": []}
    result = sandbox.run_notebook_job(tmp_path, inputs, world=None, limits=Limits())
    assert len(runs) == (1 if restart is None else 2), runs
    assert [i.kind for i in result.incidents][-1] == "channel", result.incidents
