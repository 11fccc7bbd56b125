"""One sandbox's memory, summed over all its processes, where no memory cgroup does it.

RLIMIT_AS bounds each process on its own: a notebook that forks could hold the process limit times
the memory limit. As root the grader puts each sandbox in a memory cgroup; an ordinary user has
none (no delegated cgroup), so the grader watches instead: five times a second it adds up the
proportional set size (PSS: a page shared by several processes counts once in all) of every
process started under the sandbox, and stops the sandbox when the sum passes the memory limit.
The sandbox's tmpfs mounts are sized on their own (scratch, /dev/shm), so they are not counted
here. A burst between two samples can overshoot by what a notebook can touch in 0.2 s.
"""
from __future__ import annotations

from dataclasses import dataclass

import psutil

SAMPLE_SECONDS = 0.2  # how often the grader looks (the sandbox's wait loop)


@dataclass
class MemoryWatch:
    """The processes under `root_pid` (the sandbox's launcher, outside it), and their memory."""

    root_pid: int
    limit_bytes: int
    peak_bytes: int = 0

    def held(self) -> int:
        """The memory held now by the sandbox's processes, in bytes (PSS; RSS where PSS cannot be read)."""
        try:
            root = psutil.Process(self.root_pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:  # the sandbox has ended
            return 0
        total = sum(_process_bytes(p) for p in processes)
        self.peak_bytes = max(self.peak_bytes, total)
        return total

    def over(self) -> bool:
        return self.held() > self.limit_bytes

    def describe(self) -> str:
        return (f"the notebook's processes together held {_gib(self.peak_bytes)} of memory, more than the "
                f"{_gib(self.limit_bytes)} a notebook may use (counted over all the processes it starts)")


def _process_bytes(process: psutil.Process) -> int:
    try:
        return process.memory_full_info().pss
    except (psutil.AccessDenied, AttributeError):  # PSS needs ptrace-level access; RSS never does (and counts more)
        try:
            return process.memory_info().rss
        except psutil.Error:
            return 0
    except psutil.Error:  # ended meanwhile
        return 0


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def needed(groups) -> bool:
    """Whether the watch is needed: no memory cgroup caps the sandbox (`groups`: those made for it)."""
    return not any((g / "memory.max").exists() or (g / "memory.limit_in_bytes").exists() for g in groups)
