"""Warm sandboxes: the grader's side of forkserver.py.

A fresh bubblewrap sandbox spends ~3 s importing torch, numpy, matplotlib and IPython before the
notebook's first cell. While a class is graded, each assignment gets a fork server: one bubblewrap
sandbox, set up exactly as a notebook's own (sandbox.bwrap_command, its limits), with those imports
done once. Each notebook run is then a child of it in namespaces of its own (see forkserver.py),
and the grader follows it as it follows a fresh sandbox: the same channel, the same exit codes,
the same wall clocks, its own cgroups as root and the same memory watch otherwise.

A server serves one run at a time; a pool keeps them per assignment (the sandbox's world) for the
length of one `grade` call. Anything wrong with a server (it does not start, it dies, it does not
answer) is never a student's: that run starts a fresh sandbox instead, as before.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

from . import sandbox
from .forkserver import CONTROL_FD_ENV
from .settings import Limits

READY_SECONDS = 120.0  # a server's imports (a loaded 2-core machine: ~10 s)
HELLO_SECONDS = 30.0  # a forked run says hello
UCRED = struct.Struct("iII")  # SCM_CREDENTIALS: pid, uid, gid


class WarmStartFailed(RuntimeError):
    """The fork server could not start this run: the grader's own problem, the run starts cold."""


class WarmRun:
    """One notebook run forked from a server: what sandbox._run_once waits for and kills (as it
    does a fresh sandbox's process). `pid` is the run's guard, outside the run's namespaces."""

    warm = True

    def __init__(self, server: ForkServer, status: socket.socket, pid: int, pidfd: int):
        self.server, self.status, self.pid, self.pidfd = server, status, pid, pidfd
        self.returncode: int | None = None
        self._reported: int | None = None
        self.killed = False  # by the grader (a wall clock, the memory watch, the run's end)

    def _read_status(self) -> None:
        try:
            message = self.status.recv(32)
        except OSError:
            message = b""
        if message.startswith(b"X") and message[1:].isdigit():
            self._reported = int(message[1:])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.status, self.pidfd], [], [], left)
            if self.status in ready and self._reported is None:
                self._read_status()
            if self.pidfd in ready:  # the guard has ended: its report (if any) came first
                if self._reported is None:
                    ready, _, _ = select.select([self.status], [], [], 0)
                    if ready:
                        self._read_status()
                self.returncode = self._reported if self._reported is not None else -signal.SIGKILL
            elif not ready:
                raise subprocess.TimeoutExpired("warm sandbox run", timeout)
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the guard (by pidfd: never another process that got its number): its init then
        dies (PDEATHSIG), and with the init every process of the run's PID namespace."""
        if self.returncode is None:
            self.killed = True
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @property
    def lost(self) -> bool:
        """The run ended without its guard's report, the grader did not kill it, and its fork server
        has died: the grader's problem, never the student's (the run is done again, fresh). A guard
        killed while its server lives (out of memory in the run's cgroup) is the run's end, as a
        fresh sandbox's bubblewrap killed would be."""
        if self.returncode is None or self._reported is not None or self.killed:
            return False
        return self.server.hung_up()

    def release(self) -> None:
        """The run is over: the server takes the next one (or is closed, when something went wrong)."""
        self.kill()
        try:
            self.wait(30)
        except subprocess.TimeoutExpired:
            self.server.broken = True
        self.status.close()
        os.close(self.pidfd)
        self.server.pool.give_back(self.server)


class ForkServer:
    """One bubblewrap sandbox holding a warm runner, for one world (assignment) and limits."""

    def __init__(self, pool: Pool, key, world: sandbox.World, limits: Limits):
        self.pool, self.key, self.broken = pool, key, False
        self.lock = threading.Lock()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.err = tempfile.TemporaryFile()
        env = sandbox.server_env(world)
        env[CONTROL_FD_ENV] = str(theirs.fileno())
        command = sandbox.bwrap_command(world, as_pid_1=True) + [sys.executable, "-m", "autograder.forkserver"]
        try:
            self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=self.err.fileno(), pass_fds=(theirs.fileno(),),
                                         start_new_session=True,
                                         preexec_fn=sandbox.server_preexec(limits))
        finally:
            theirs.close()
        self.control = mine
        ready, _, _ = select.select([mine], [], [], READY_SECONDS)
        answer = mine.recv(600) if ready else b""
        if answer != b"R":
            self.err.seek(0)
            said = self.err.read(2000).decode(errors="replace").strip().splitlines()
            self.close()
            why = answer[1:].decode(errors="replace") if answer.startswith(b"N") else \
                (said[-1] if said else "it did not start")
            raise WarmStartFailed(f"the fork server did not start: {why}")

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None and not self.hung_up()

    def hung_up(self) -> bool:
        """Whether the server has ended: its end of the control socket is closed. A dying process's
        files are closed before its children get their PDEATHSIG, so a guard ended by its server's
        death always finds this true (no waiting on the clock)."""
        try:
            ready, _, _ = select.select([self.control], [], [], 0)
            return bool(ready) and self.control.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def fork(self, env: dict, scratch: str, in_fd: int, out_fd: int, err_fd: int, groups: list[Path]) -> WarmRun:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            request = json.dumps({"env": {k: v for k, v in env.items() if k not in ("ATTN_IN_FD", "ATTN_OUT_FD")},
                                  "scratch": scratch, "scratch_bytes": sandbox.SCRATCH_BYTES,
                                  "shm_bytes": sandbox.SHM_BYTES}).encode()
            try:
                socket.send_fds(self.control, [request], [in_fd, out_fd, err_fd, theirs.fileno()])
            except OSError as err:
                raise WarmStartFailed(f"the fork server does not answer ({err})") from None
            theirs.close()
            pid = self._hello(ours)
            pidfd = os.pidfd_open(pid)
            if select.select([ours], [], [], 0)[0]:  # the guard hung up: `pid` may name another process by now
                os.close(pidfd)
                raise WarmStartFailed("the fork server's run ended before it started")
            for group in groups:  # before any of the run's code: the guard waits for "G"
                (group / "cgroup.procs").write_text(str(pid))
            ours.send(b"G")
        except BaseException:
            theirs.close()
            ours.close()
            self.broken = True
            raise
        return WarmRun(self, ours, pid, pidfd)

    @staticmethod
    def _hello(status: socket.socket) -> int:
        ready, _, _ = select.select([status], [], [], HELLO_SECONDS)
        if not ready:
            raise WarmStartFailed("the fork server's run did not start")
        message, ancillary, _, _ = status.recvmsg(8, socket.CMSG_SPACE(UCRED.size))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and message == b"H":
                return UCRED.unpack(data[:UCRED.size])[0]  # the kernel's word, in this PID namespace
        raise WarmStartFailed("the fork server's run did not say hello")

    def close(self) -> None:
        self.broken = True
        try:
            self.control.close()
        except (OSError, AttributeError):
            pass
        if getattr(self, "proc", None) is not None:
            sandbox._kill(self.proc)
        self.err.close()


class Pool:
    """Fork servers for one grading run, at most `limit` alive (the least recently used idle one
    makes room); each serves one run at a time. A world without an idle server starts one in the
    background while its run starts fresh (`background`), so a small class never waits for a
    server's imports; with `background=False` the run waits for it (tests: what runs is known)."""

    def __init__(self, limit: int, background: bool = True):
        self.limit, self.background = max(1, limit), background
        self.base_limit, self.widenings = self.limit, []  # `limit` is the largest of these (widened)
        self.lock = threading.Lock()
        # Servers are started from one thread that lives as long as the pool: a sandbox dies with the
        # thread that started it (PR_SET_PDEATHSIG), and a grading thread may end before its server.
        self.starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fork-servers")
        self.stubs = Path(tempfile.mkdtemp(prefix="attn-servers-"))  # the servers' own copies of the stubs
        self.idle: list[ForkServer] = []  # least recently used first
        self.busy = 0  # servers serving a run
        self.starting: list = []  # worlds whose server is being started (one entry per server)
        self.cold: set = set()  # worlds whose server would not start: they run fresh, said once
        self.closed = False

    def start(self, world: sandbox.World, limits: Limits, env: dict, scratch: str, in_fd: int, out_fd: int,
              err_fd: int, groups: list[Path]) -> WarmRun | None:
        """A warm run of this world, or None (start a fresh sandbox): never an error of the student's."""
        key = _world_key(world, limits)
        server, starting = self._take(key, world, limits)
        if server is None and starting is not None and not self.background:
            starting.result()
            server, _ = self._take(key, world, limits, start=False)
        if server is None:
            return None
        try:
            return server.fork(env, scratch, in_fd, out_fd, err_fd, groups)
        except Exception as err:  # noqa: BLE001 - the server's failure, never the student's: this run starts fresh
            print(f"grader: a fork server failed to start a run ({type(err).__name__}: {err}); a fresh sandbox "
                  "instead", file=sys.stderr)
            self.give_back(server)
            return None

    def ready(self, world: sandbox.World, limits: Limits) -> None:
        """Before a run's clocks start: with `background=False`, this world's server started (waited
        for) now, so its imports never count against the notebook's time limit. In the background
        mode, nothing: the run itself starts fresh while its server starts."""
        if self.background:
            return
        server, starting = self._take(_world_key(world, limits), world, limits)
        if starting is not None:
            starting.result()
        elif server is not None:
            self.give_back(server)  # one was idle already

    def _take(self, key, world: sandbox.World, limits: Limits, start: bool = True):
        """(an idle server of this world, marked busy, or None; the start begun for it, or None)."""
        with self.lock:
            for server in [s for s in self.idle if not s.alive()]:
                self.idle.remove(server)
                server.close()
            for server in self.idle:
                if server.key == key:
                    self.idle.remove(server)
                    self.busy += 1
                    return server, None
            if not start or self.closed or key in self.cold or (self.background and key in self.starting):
                return None, None
            while self.idle and len(self.idle) + self.busy + len(self.starting) >= self.limit:
                self.idle.pop(0).close()
            if self.busy + len(self.starting) >= self.limit:
                return None, None
            self.starting.append(key)
            return None, self.starter.submit(self._start, key, self._own_copy(world), limits)

    def _own_copy(self, world: sandbox.World) -> sandbox.World:
        """`world` with its stubs copied here: a notebook's job folder may be emptied before the server starts."""
        stubs = []
        for stub, target in world.stubs:
            fd, name = tempfile.mkstemp(dir=self.stubs, suffix=".py")
            os.close(fd)
            copy = Path(name)
            copy.write_bytes(Path(stub).read_bytes())
            copy.chmod(0o644)
            stubs.append((str(copy), target))
        return replace(world, stubs=stubs)

    def _start(self, key, world: sandbox.World, limits: Limits) -> None:
        try:
            server = ForkServer(self, key, world, limits)
        except Exception as err:  # noqa: BLE001 - any failure of the server is ours: this world runs fresh
            with self.lock:
                self.starting.remove(key)
                self.cold.add(key)
            print(f"grader: warm sandbox unavailable ({err}); fresh sandboxes instead", file=sys.stderr)
            return
        with self.lock:
            self.starting.remove(key)
            if not self.closed:
                self.idle.append(server)
                return
        server.close()

    def give_back(self, server: ForkServer) -> None:
        with self.lock:
            self.busy -= 1
            if server.alive() and not self.closed:
                self.idle.append(server)
                return
        server.close()

    @contextmanager
    def widened(self, limit: int):
        """At least `limit` servers alive inside the block (a grading run inside another's pool asks for
        as many as it would keep itself); afterwards the least recently used idle ones over the limit
        still in force close. Blocks of several threads may overlap and end in any order."""
        request = [limit]  # this block's own entry (compared by identity: two blocks may ask alike)
        with self.lock:
            self.widenings.append(request)
            self.limit = max([self.base_limit, *(r[0] for r in self.widenings)])
        try:
            yield self
        finally:
            with self.lock:
                self.widenings = [r for r in self.widenings if r is not request]
                self.limit = max([self.base_limit, *(r[0] for r in self.widenings)])
                surplus = max(0, len(self.idle) + self.busy + len(self.starting) - self.limit)
                closing, self.idle = self.idle[:surplus], self.idle[surplus:]
            for server in closing:
                server.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        self.starter.shutdown(wait=True, cancel_futures=True)
        with self.lock:
            servers, self.idle = self.idle, []
        for server in servers:
            server.close()
        shutil.rmtree(self.stubs, ignore_errors=True)


def _world_key(world: sandbox.World, limits: Limits):
    """What makes two sandboxes the same: the world (the stubs by content: each notebook's job
    folder holds its own copy) and the limits."""
    stubs = tuple((Path(stub).read_bytes(), target) for stub, target in world.stubs)
    return (tuple(world.readonly), stubs, tuple(world.hide), world.kit, world.library, world.course_root,
            limits.memory_bytes, limits.file_bytes, limits.processes)


SERVER_MEMORY = 2**30  # available memory a fork server may take: its ~250 MB, and room for its runs


def servers_for(workers: int, assignments: int) -> int:
    """How many fork servers a grading run may keep: one per grading thread and assignment, fewer
    where memory is short. Each thread grades one student's notebooks in turn, starting at its own
    assignment (grade.staggered), so most runs need one server per assignment."""
    import psutil

    room = psutil.virtual_memory().available // SERVER_MEMORY
    return max(workers, min(workers * max(assignments, 1), room))


_stack: list[Pool | None] = []  # the innermost `warm_sandboxes` block's pool (None: that block starts fresh)
_stack_lock = threading.Lock()


def current() -> Pool | None:
    """The pool of the innermost `warm_sandboxes` block running now, if any (grading threads share it)."""
    return _stack[-1] if _stack else None


@contextmanager
def warm_sandboxes(limit: int, enabled: bool = True, background: bool = True):
    """Fork servers for the notebooks graded inside the block, all closed when it ends; only with
    bubblewrap (the other sandboxes start as before). Inside another block, its servers serve, with room
    for `limit` of them while this block lasts (`enabled=False`: none, every notebook starts fresh).
    `background`: see Pool."""
    outer = current()
    pool = None
    if enabled and outer is None and sandbox.isolation_mode() == "bubblewrap":
        pool = Pool(limit, background)
    with _stack_lock:
        _stack.append(pool if pool is not None else (outer if enabled else None))
    try:
        with (outer.widened(limit) if pool is None and enabled and outer is not None else nullcontext()):
            yield current()
    finally:
        with _stack_lock:
            _stack.pop()
        if pool is not None:
            pool.close()
