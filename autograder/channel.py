"""The one way back from the sandbox: length-prefixed frames on a pipe the grader created.

The trusted grader never opens a path the sandbox could have created or replaced: results,
progress and timeouts arrive on the read end of a pipe it holds, and everything on it is
bounded (a cap per frame and a cap for the whole run) before a byte is kept. What arrives is
data (see serialize.py), judged outside; a frame the student's own code writes can only claim
things about the student's own notebook.

A frame is ``kind (1 byte) | cell (4 bytes, big-endian) | length (4 bytes) | payload``:
    S  a cell started              E  a cell ended
    T  a cell hit its time limit (interrupted; the run went on); payload: the exercise function
       that was running (UTF-8, may be empty): a restart stubs it instead of waiting again
    R  the outcomes of a test cell (payload: serialize.dumps)
    D  the notebook ran to its end
    I  the runner's self-check passed: student code runs from here on (sent once, first)
    X  the runner's self-check refused this sandbox (payload: why, UTF-8); only before I counts

A run that never sends I ran nothing of the student's: the grader's own incident, never a grade.
"""
from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field

HEADER = struct.Struct(">cII")
KINDS = {b"S", b"E", b"T", b"R", b"D", b"I", b"X"}
MAX_REFUSAL_CHARS = 500
MAX_NAME_CHARS = 200  # an exercise's name in a T frame
MAX_FRAME_BYTES = 64 * 2**20  # one test cell's outcomes; the largest real one is a few MiB
MAX_TOTAL_BYTES = 256 * 2**20  # everything one notebook run may send


def send(fd: int, kind: bytes, cell: int = 0, payload: bytes = b"") -> None:
    """Write one frame (runner side). Blocking, whole frame or an OSError."""
    data = HEADER.pack(kind, cell, len(payload)) + payload
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@dataclass
class Received:
    """What the grader learnt from one sandbox run, kept in the grader's memory only."""

    running: int | None = None  # a cell started and not ended
    done: bool = False
    results: dict[int, bytes] = field(default_factory=dict)
    timed_out: list[int] = field(default_factory=list)
    problem: str = ""  # why reading stopped early ("" when the channel closed normally)
    total: int = 0
    ready: bool = False  # the self-check passed (I): from here on, what happens is the notebook's
    refused: str = ""  # why the self-check refused (X, before I): the grader's incident
    tampered: bool = False  # frames out of the runner's order: something else wrote them (results void)
    looping: dict[int, str] = field(default_factory=dict)  # timed-out cell -> the exercise running then (a claim)


class Reader:
    """Reads frames from `fd` on a thread of its own until the writer closes it or breaks a rule.

    Only what the job allows is kept: cell numbers below `cells`, results only for the cells in
    `result_cells` and only while that cell runs, one result and one timeout per cell. Frames the
    student's code forges can therefore neither grow the grader's memory nor speak for a cell
    that is not running."""

    def __init__(self, fd: int, cells: int, result_cells: set[int], max_frame: int = MAX_FRAME_BYTES,
                 max_total: int = MAX_TOTAL_BYTES, order: list[int] | None = None):
        self.fd, self.max_frame, self.max_total = fd, max_frame, max_total
        self.cells, self.result_cells = cells, result_cells
        self.order, self.next = order, 0  # the cells the runner will run, in its order (None: not checked)
        self.state = Received()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def snapshot(self) -> tuple[int | None, bool]:
        with self.lock:
            return self.state.running, self.state.done

    def close(self, timeout: float = 5.0) -> Received:
        """Wait for the reader to reach the end of the pipe (the writer is dead by now); a copy of
        what it has, taken under the lock (a leftover writer cannot change it afterwards)."""
        self.thread.join(timeout)
        with self.lock:
            s = self.state
            return Received(s.running, s.done, dict(s.results), list(s.timed_out), s.problem, s.total,
                            s.ready, s.refused, s.tampered, dict(s.looping))

    def _read_exactly(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = os.read(self.fd, min(left, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _run(self) -> None:
        try:
            while True:
                header = self._read_exactly(HEADER.size)
                if header is None:
                    return
                kind, cell, length = HEADER.unpack(header)
                if kind not in KINDS:
                    return self._stop("the results channel carried an unknown frame")
                if length > self.max_frame or self.state.total + HEADER.size + length > self.max_total:
                    return self._stop(f"the notebook sent more than {self.max_total // 2**20} MiB of results "
                                      f"(or one test cell over {self.max_frame // 2**20} MiB)")
                payload = self._read_exactly(length) if length else b""
                if payload is None:
                    return
                self._apply(kind, cell, payload)
                if self.state.problem:
                    return
        except OSError as err:
            self._stop(f"the results channel failed ({err.strerror})")
        finally:
            os.close(self.fd)

    def _apply(self, kind: bytes, cell: int, payload: bytes) -> None:
        with self.lock:
            s = self.state
            s.total += HEADER.size + len(payload)
            if not s.ready:  # the runner's own frames, before any student code
                if kind == b"I":
                    s.ready = True
                elif kind == b"X" and not s.refused:
                    s.refused = payload[:MAX_REFUSAL_CHARS * 4].decode("utf-8", "replace")[:MAX_REFUSAL_CHARS]
            elif kind in (b"I", b"X"):
                pass  # student code speaks from here on: it cannot take its own run back
            elif self.order is not None and not self._in_order(kind, cell):
                s.tampered = True
                s.problem = (f"the results channel was written out of the runner's order ({kind.decode()} for cell "
                             f"{cell}): something other than the grader's runner wrote to it, so this run's "
                             "results are void; for review")
            elif kind == b"S" and cell < self.cells:
                s.running = cell
            elif kind == b"E":
                s.running = None
            elif kind == b"T" and cell == s.running and cell not in s.timed_out:
                s.timed_out.append(cell)
                name = payload[:MAX_NAME_CHARS * 4].decode("utf-8", "replace")[:MAX_NAME_CHARS]
                if name.isidentifier():
                    s.looping[cell] = name
            elif kind == b"R" and cell == s.running and cell in self.result_cells and cell not in s.results:
                s.results[cell] = payload
            elif kind == b"D":
                s.done = True

    def _in_order(self, kind: bytes, cell: int) -> bool:
        """Whether a frame is the next the runner itself would send: each cell of `order` started
        once, in order, ended before the next; a timeout or one result only for the running cell;
        the end only after the last cell. (Called under the lock.)"""
        s = self.state
        if kind == b"S":
            ok = s.running is None and self.next < len(self.order) and cell == self.order[self.next]
            self.next += ok
            return ok
        if kind == b"E":
            return cell == s.running
        if kind == b"T":
            return cell == s.running and cell not in s.timed_out
        if kind == b"R":
            return cell == s.running and cell in self.result_cells and cell not in s.results
        return s.running is None and self.next == len(self.order)  # D

    def _stop(self, why: str) -> None:
        with self.lock:
            self.state.problem = why
