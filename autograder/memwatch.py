"""One sandbox's memory, summed over all its processes, where no memory cgroup does it.

RLIMIT_AS bounds each process on its own: a notebook that forks could hold the process limit times
the memory limit. As root the grader puts each sandbox in a memory cgroup; an ordinary user has
none (no delegated cgroup), so the grader watches instead: five times a second it adds up the
proportional set size (PSS: a page shared by several processes counts once in all) of every
process started under the sandbox, and stops the sandbox when the sum passes the memory limit.
The sandbox's tmpfs mounts are sized on their own (scratch, /dev/shm), so they are not counted
here. A burst between two samples can overshoot by what a notebook can touch in 0.2 s.

What a socket holds is kernel memory, in no process's PSS (a red team's socket pairs held the
machine's memory unseen, and the kernel killed the grader). Every sandbox has a network namespace of
its own, so the watch reads its socket tables: each Unix socket counts at the most its send buffer
can hold (the sandbox cannot make a buffer larger: keyrings.deny_to_notebook), and each TCP or UDP
socket at what its queues hold now. (Where a memory cgroup caps the sandbox, it counts them itself.)
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

SAMPLE_SECONDS = 0.2  # how often the grader looks (the sandbox's wait loop)


@dataclass
class MemoryWatch:
    """The processes under `root_pid` (the sandbox's launcher, outside it), and their memory."""

    root_pid: int
    limit_bytes: int
    peak_bytes: int = 0
    peak_sockets: int = 0  # of which in its sockets' buffers

    def held(self) -> int:
        """The memory held now by the sandbox's processes, in bytes (PSS; RSS where PSS cannot be read)."""
        try:
            root = psutil.Process(self.root_pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:  # the sandbox has ended
            return 0
        sockets = socket_bytes([p.pid for p in processes])
        total = sum(_process_bytes(p) for p in processes) + sockets
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_sockets = total, sockets
        return total

    def over(self) -> bool:
        return self.held() > self.limit_bytes

    def describe(self) -> str:
        sockets = f", {_gib(self.peak_sockets)} of it in its sockets' buffers" if self.peak_sockets >= 2**28 else ""
        return (f"the notebook's processes together held {_gib(self.peak_bytes)} of memory{sockets}, more than the "
                f"{_gib(self.limit_bytes)} a notebook may use (counted over all the processes it starts)")


def _unix_socket_bytes() -> int:
    """The most a Unix socket can hold: what it has sent and its peer has not read, up to its send buffer
    (the default size, net.core.wmem_default: the sandbox cannot set another), and one more packet."""
    try:
        with open("/proc/sys/net/core/wmem_default") as fh:
            default = int(fh.read())
    except (OSError, ValueError):
        default = 212992
    return default + 2**16


UNIX_SOCKET_BYTES = _unix_socket_bytes()
QUEUE_TABLES = ("tcp", "tcp6", "udp", "udp6")  # /proc/PID/net/...: tx_queue:rx_queue of each socket, in hex


def socket_bytes(pids: list[int]) -> int:
    """The memory the sockets of the processes' network namespaces hold, counted once per namespace: Unix
    sockets at UNIX_SOCKET_BYTES each (in flight between processes too: the table lists them all), TCP and
    UDP sockets at their queues. A process in the grader's own namespace (the launcher) is not counted."""
    own = _first_unix_inode("self")
    seen: set = set()
    total = 0
    for pid in pids:
        key = _namespace(pid)
        if key in seen or key == ("self", 0) or (own is not None and key == ("first", own)):
            continue
        seen.add(key)
        total += _count_unix(pid) * UNIX_SOCKET_BYTES + sum(_queued(pid, table) for table in QUEUE_TABLES)
    return total


def _namespace(pid: int):
    """Which network namespace `pid` is in: its link, or where that cannot be read (a process that made
    itself undumpable) the first socket of its Unix table (an inode is one socket's, in one namespace)."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        first = _first_unix_inode(pid)
        return ("first", first) if first is not None else ("pid", pid)
    return ("self", 0) if link == _own_namespace() else ("link", link)


def _own_namespace() -> str:
    return os.readlink("/proc/self/ns/net")


def _unix_lines(pid):
    try:
        with open(f"/proc/{pid}/net/unix") as fh:
            next(fh, None)  # the header
            yield from fh
    except OSError:
        return


def _first_unix_inode(pid) -> int | None:
    for line in _unix_lines(pid):
        fields = line.split()
        if len(fields) >= 7 and fields[6].isdigit():
            return int(fields[6])
    return None


def _count_unix(pid: int) -> int:
    return sum(1 for _ in _unix_lines(pid))


def _queued(pid: int, table: str) -> int:
    """Bytes in the send and receive queues of the sockets in /proc/PID/net/<table>."""
    total = 0
    try:
        with open(f"/proc/{pid}/net/{table}") as fh:
            next(fh, None)
            for line in fh:
                fields = line.split()
                if len(fields) > 4 and ":" in fields[4]:
                    tx, rx = fields[4].split(":", 1)
                    total += int(tx, 16) + int(rx, 16)
    except (OSError, ValueError):
        return total
    return total


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
