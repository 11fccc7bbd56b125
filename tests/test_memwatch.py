"""The ordinary user's memory watch over what a sandbox's sockets hold (autograder/memwatch.py): kernel memory in
no process's PSS. A child in a network namespace of its own stands in for the sandbox."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from autograder import memwatch

HOLDER = r'''
import socket, sys, time
held = []
odd = socket.socket(socket.AF_UNIX)  # a name of the notebook's choosing: bytes that are no text, a newline
odd.bind(b"\0\xff\xfe\nnot a row 1 2 3 4 5 6")
receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
receiver.bind(b"\0receiver")
queued = 0
for _ in range(11):  # datagrams whose senders have closed: one socket listed, eleven datagrams held
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    try:
        queued += sender.sendto(b"x" * 200000, b"\0receiver")
    except OSError:
        pass
    sender.close()
for _ in range(50):  # stream pairs with a full buffer each way
    ends = socket.socketpair()
    for end in ends:
        end.setblocking(False)
        try:
            while True:
                queued += end.send(b"x" * 65536)
        except BlockingIOError:
            pass
    held.append(ends)
print(queued, flush=True)
time.sleep(60)
'''


def _in_a_network_namespace_of_its_own() -> list[str]:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--net"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("no network namespace can be made here")
    return prefix


def test_the_watch_counts_at_least_what_the_sockets_hold_and_a_name_breaks_nothing():
    """A datagram receiver holding eleven datagrams of closed senders was counted as one socket (a ninth of what it
    held); a socket named with bytes that are no text made the watch itself raise (the notebook's grading became the
    grader's error)."""
    holder = subprocess.Popen([*_in_a_network_namespace_of_its_own(), sys.executable, "-c", HOLDER],
                              stdout=subprocess.PIPE, text=True)
    try:
        queued = int(holder.stdout.readline())
        pids = [holder.pid, *(int(p) for p in _children(holder.pid))]
        counted = memwatch.socket_bytes(pids)
        assert queued > 2_000_000 and counted >= queued, (counted, queued)
        assert memwatch.socket_bytes([os.getpid()]) == 0  # the grader's own namespace is not the sandbox's
    finally:
        holder.kill()
        holder.wait()


def _children(pid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return found + [g for c in found for g in _children(int(c))]
