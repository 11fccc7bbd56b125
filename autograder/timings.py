"""Where grading's time goes: seconds per phase, summed over the notebooks graded in this process
(every worker thread's), for `attn-course bench` to print. Nothing decides anything with them."""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager

SANDBOX = "sandbox"    # the sandbox runs: start-up, imports, the student's cells, the checks' cases
TRUSTED = "trusted"    # the trusted path of a notebook (trusted.grade_job): its sandbox runs and the judging
NBGRADER = "nbgrader"  # nbgrader's autograde and feedback page for one judged notebook (inside the gradebook's lock)
OUTPUTS = "outputs"    # the class's CSVs, report and feedback folder, once per run

_lock = threading.Lock()
_seconds: dict[str, float] = defaultdict(float)
_times: dict[str, int] = defaultdict(int)


@contextmanager
def phase(name: str):
    """Add the time the block takes to `name`'s total."""
    started = time.perf_counter()
    try:
        yield
    finally:
        spent = time.perf_counter() - started
        with _lock:
            _seconds[name] += spent
            _times[name] += 1


def taken() -> dict[str, dict[str, float]]:
    """{phase: {"seconds": total, "times": how many}} since the last `reset` (not rounded: a phase of a few
    milliseconds a notebook, and the difference of two phases, stay what they are)."""
    with _lock:
        return {name: {"seconds": _seconds[name], "times": _times[name]} for name in _seconds}


def reset() -> None:
    with _lock:
        _seconds.clear()
        _times.clear()
