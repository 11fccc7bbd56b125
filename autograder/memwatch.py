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
        sockets = f", {gib(self.peak_sockets)} of it in its sockets' buffers" if self.peak_sockets >= 2**28 else ""
        return (f"the notebook's processes together held {gib(self.peak_bytes)} of memory{sockets}, more than the "
                f"{gib(self.limit_bytes)} a notebook may use (counted over all the processes it starts)")


def _sysctl(name: str, default: int) -> int:
    try:
        with open(f"/proc/sys/{name}", "rb") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


# The most a Unix socket can hold: a stream socket, what it has sent and its peer has not read, up to its send
# buffer (net.core.wmem_default: the sandbox cannot set another, keyrings.deny_to_notebook) and one more packet;
# a datagram socket also the datagrams queued to it, whose senders may have closed since (up to
# net.unix.max_dgram_qlen of them, and one more).
UNIX_STREAM_BYTES = _sysctl("net/core/wmem_default", 212992) + 2**16
UNIX_DATAGRAM_BYTES = (_sysctl("net/unix/max_dgram_qlen", 10) + 2) * UNIX_STREAM_BYTES
UNIX_STREAM = 1  # the Type column of /proc/net/unix: 1 stream, 2 datagram, 5 sequenced packets
QUEUE_TABLES = ("tcp", "tcp6", "udp", "udp6", "udplite", "udplite6")  # /proc/PID/net/...: tx_queue:rx_queue, hex
SOCKET_FLOOR = 2048  # what any socket holds in the kernel before a byte is queued (TCP, UDP, netlink)


def socket_bytes(pids: list[int]) -> int:
    """The memory the sockets of the processes' network namespaces hold, counted once per namespace: Unix sockets
    at the most they can hold (in flight between processes too: the table lists them all), TCP, UDP, UDP-Lite and
    netlink sockets at their queues, and each at least SOCKET_FLOOR. A process in the grader's own namespace (the
    launcher) is not counted. Never raises: what cannot be read counts 0 (the tables are the notebook's to fill,
    names and all)."""
    seen: set = set()
    total = 0
    for pid in pids:
        try:
            key = _namespace(pid)
            if key in seen or key == ("self", 0):
                continue
            seen.add(key)
            total += _unix_bytes(pid) + sum(_queued(pid, table) for table in QUEUE_TABLES) + _netlink_bytes(pid)
        except Exception:  # noqa: BLE001 - a table the notebook made unreadable: the rest is still counted
            continue
    return total


def _namespace(pid: int):
    """Which network namespace `pid` is in: its link, or where that cannot be read (a process that made
    itself undumpable) the process itself (its namespace then counted once for each such process: more, never less)."""
    try:
        link = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ("pid", pid)
    return ("self", 0) if link == os.readlink("/proc/self/ns/net") else ("link", link)


def _rows(pid: int, table: str):
    """The rows of /proc/PID/net/<table>, as lists of byte fields (header skipped; a socket's name, which the
    notebook chooses, may hold any byte, a newline included: a row it breaks in two just reads as short)."""
    try:
        with open(f"/proc/{pid}/net/{table}", "rb") as fh:
            next(fh, None)
            for line in fh:
                yield line.split()
    except OSError:
        return


def _unix_bytes(pid: int) -> int:
    total = 0
    for fields in _rows(pid, "unix"):
        if len(fields) >= 7 and fields[0].endswith(b":"):  # a row of its own, not the tail of a name
            stream = fields[4] == b"%04X" % UNIX_STREAM
            total += UNIX_STREAM_BYTES if stream else UNIX_DATAGRAM_BYTES
    return total


def _queued(pid: int, table: str) -> int:
    """Bytes in the send and receive queues of the sockets in /proc/PID/net/<table>, each at least SOCKET_FLOOR."""
    total = 0
    for fields in _rows(pid, table):
        if len(fields) > 4 and fields[4].count(b":") == 1:
            tx, rx = fields[4].split(b":")
            try:
                total += max(SOCKET_FLOOR, int(tx, 16) + int(rx, 16))
            except ValueError:
                total += SOCKET_FLOOR
    return total


def _netlink_bytes(pid: int) -> int:
    """Netlink sockets (a notebook may open NETLINK_USERSOCK ones and send between them): Rmem + Wmem each."""
    total = 0
    for fields in _rows(pid, "netlink"):
        if len(fields) >= 6 and fields[4].isdigit() and fields[5].isdigit():
            total += max(SOCKET_FLOOR, int(fields[4]) + int(fields[5]))
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


def gib(n: int) -> str:
    """`n` bytes in GiB, one decimal."""
    return f"{n / 2**30:.1f} GiB"


def needed(groups) -> bool:
    """Whether the watch is needed: no memory cgroup caps the sandbox (`groups`: those made for it)."""
    return not any((g / "memory.max").exists() or (g / "memory.limit_in_bytes").exists() for g in groups)
