"""Runs INSIDE a bubblewrap sandbox: a warm start for the runner. It imports what every notebook
imports (numpy, torch, matplotlib, IPython) once, then forks one child per notebook run, so a
notebook no longer pays the ~3 s of imports. The grader starts one per assignment and grading
thread (warm_sandbox.py) and hands it one run at a time.

A child never shares anything writable with the notebooks before or after it:

    fork server (PID 1 of the bubblewrap sandbox, non-dumpable, runs nothing of a student's)
      └─ guard    (trusted; reports the run's exit status to the grader, then exits)
           └─ init   (PID 1 of the run's own PID namespace: when it ends, every process of the run ends)
                └─ runner (autograder/runner.py: the student's notebook)

The guard waits until the grader has put it in the run's own control groups (as root), then moves
into new user, mount, PID, network, IPC, UTS and cgroup namespaces, mounts a fresh scratch folder
and /dev/shm (the only writable places) and an empty folder over the server's /proc entry, and
the init starts a session of its own and drops every capability before the runner starts. The
runner cannot signal the fork server or the guard (another PID namespace, another session and
process group), cannot read or write their memory or /proc files (non-dumpable, no capability in
their user namespace, the server's entry covered), and sees none of an earlier run's files,
sockets, IPC objects or processes.

Messages (a SOCK_SEQPACKET pair, descriptors as SCM_RIGHTS):
    fork server -> grader: b"R" ready (after the imports) | b"N<why>" cannot serve
    grader -> fork server: JSON {"env", "scratch"} + fds [inputs, channel, stderr, status]
    guard -> grader, on `status`: b"H" (its pid arrives as the message's credentials),
        then b"X<exit code>" when the run ends; grader -> guard: b"G" go (it is in its cgroups)
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import sys

PRELOAD = ("numpy", "torch", "matplotlib", "matplotlib.pyplot", "cloudpickle",
           "IPython.core.interactiveshell", "autograder.channel", "autograder.serialize",
           "autograder.checks.core", "autograder.runner")
CONTROL_FD_ENV = "ATTN_FORKSERVER_FD"
FRESH_PID1 = "--fresh-pid1"  # `python -m autograder.forkserver --fresh-pid1`: PID 1 of a fresh sandbox (fresh_pid1)
MAX_REQUEST_BYTES = 1 << 20
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 1 << 14, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def main() -> None:
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_FD_ENV)))
    for name in PRELOAD:
        __import__(name)
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    threads, shared = _threads(), _shared_writable_mappings()
    if threads != 1:  # fork copies one thread: a library's own thread would be missing in every child
        control.send(f"Nthe fork server runs {threads} threads after its imports".encode())
        os._exit(1)
    if shared:  # every run would write through to the next one
        control.send(f"Nthe fork server holds writable shared memory after its imports: {shared[0]}".encode())
        os._exit(1)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # guards are reaped by the kernel
    control.send(b"R")
    while True:
        message, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, 4)
        if not message:  # the grader closed its end: the run is over
            os._exit(0)
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            try:
                _guard(control, json.loads(message), *fds)
            except BaseException as err:  # noqa: BLE001 - said on the run's stderr, for the grader's report
                _fail(fds[2], err)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)


def _fail(err_fd: int, err: BaseException) -> None:
    """End this process of a run that could not start, saying why on the run's stderr."""
    try:
        os.write(err_fd, f"fork server: {type(err).__name__}: {err}\n".encode(errors="replace"))
    finally:
        os._exit(70)


def _shared_writable_mappings() -> list[str]:
    with open("/proc/self/maps") as fh:
        return [line.strip() for line in fh if line.split()[1][1] == "w" and line.split()[1][3] == "s"]


def _threads() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


def _guard(control: socket.socket, request: dict, in_fd: int, out_fd: int, err_fd: int, status_fd: int) -> None:
    """The run's guard: isolate, start the run's init, report its exit status, exit."""
    control.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    status = socket.socket(fileno=status_fd)
    server = os.getppid()
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != server:
        os._exit(1)
    os.setpgid(0, 0)
    status.send(b"H")
    if status.recv(1) != b"G":
        os._exit(1)
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                         | CLONE_NEWCGROUP), "unshare")
    # A non-dumpable process's /proc files belong to root: as an ordinary user the guard could not
    # write its own maps. Dumpable for these three writes only (nothing of a student's runs yet).
    _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as fh:
            fh.write(text)
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    scratch = request["scratch"]
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, f"size={request['scratch_bytes']},mode=755")
    for sub in ("job", "home"):
        os.mkdir(os.path.join(scratch, sub))
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={request['shm_bytes']},mode=1777")
    # The server's /proc files (oom_score_adj, autogroup...) belong to root when it is non-dumpable,
    # which is the run's own uid outside when the grader is root: covered, the run cannot write them.
    _mount("tmpfs", f"/proc/{server}", "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=555")
    os.chdir("/")
    guard_alive, held = os.pipe()  # read end at EOF: this guard has ended
    child = os.fork()
    if child == 0:
        status.close()
        os.close(held)
        _init(request, in_fd, out_fd, err_fd, guard_alive)
    os.close(guard_alive)
    for fd in (in_fd, out_fd, err_fd):
        os.close(fd)
    _, wait_status = os.waitpid(child, 0)
    status.send(b"X%d" % _exit_code(wait_status))
    os._exit(0)


def _mount(source, target, fstype, flags, data) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _exit_code(wait_status: int) -> int:
    """As bubblewrap reports its child: the exit code, or 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def _reap_until(runner: int) -> None:
    """As PID 1: reap every orphan until the runner ends, then end with its exit status."""
    while True:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(1)
        if pid == runner:
            os._exit(_exit_code(wait_status))


def _init(request: dict, in_fd: int, out_fd: int, err_fd: int, guard_alive: int) -> None:
    """PID 1 of the run's namespace: drop every capability, start the runner, reap orphans, and end
    with the runner's exit status (the kernel then ends whatever the notebook left running)."""
    try:
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
        if select.select([guard_alive], [], [], 0)[0]:  # the guard ended before the prctl: nobody would stop this run
            os._exit(1)
        os.close(guard_alive)
        # A session and process group of the run's own, as bubblewrap's --new-session gives a fresh
        # sandbox: kill(0) or a nice on the session's autogroup reaches no process outside the run.
        os.setsid()
        _drop_capabilities()
        runner = os.fork()
    except Exception as err:  # noqa: BLE001 - the run cannot start: said on its stderr (the grader tries again)
        _fail(err_fd, err)
    if runner == 0:
        _run(request, in_fd, out_fd, err_fd)
    for fd in (in_fd, out_fd, err_fd):
        os.close(fd)
    _reap_until(runner)


def _drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT)")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable, twice (64 capabilities): all empty
    _check(_libc.capset(header, data), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _run(request: dict, in_fd: int, out_fd: int, err_fd: int) -> None:
    """The runner, as `python -m autograder.runner` would start it in a fresh sandbox."""
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, min(in_fd, out_fd))
        os.closerange(max(in_fd, out_fd) + 1, os.sysconf("SC_OPEN_MAX"))
        os.closerange(min(in_fd, out_fd) + 1, max(in_fd, out_fd))
        _check(_libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # as a fresh process
        with open("/proc/self/oom_score_adj", "w") as fh:  # out of memory, the notebook goes, never its guard
            fh.write("1000")
        os.environ.clear()
        os.environ.update(request["env"], ATTN_IN_FD=str(in_fd), ATTN_OUT_FD=str(out_fd))
        os.chdir(os.path.join(request["scratch"], "job"))
        _fresh_randomness()
        from autograder import runner
    except Exception as err:  # noqa: BLE001 - the run cannot start: said on its stderr (the grader tries again)
        _fail(2, err)
    runner._SETUP_ERRORS.append(os.dup(2))
    try:
        sys.exit(runner.main())
    except SystemExit as done:
        os._exit(done.code if isinstance(done.code, int) else 1)
    except BaseException:  # noqa: BLE001 - the runner's own failure while setting up: say why, as runner.py does
        import traceback

        if runner._SETUP_ERRORS:
            os.write(runner._SETUP_ERRORS[0], traceback.format_exc()[-2000:].encode(errors="replace"))
        os._exit(1)


def fresh_pid1() -> None:
    """PID 1 of a fresh bubblewrap sandbox (`bwrap --as-pid-1`), in place of bubblewrap's own reaper,
    which a notebook could ptrace or write through /proc/1/mem (the same uid, and dumpable), and
    which under a setuid bwrap ran without the keyring filter. This one is non-dumpable and filtered
    before it starts the runner; then it reaps, and ends with the runner's exit status (the kernel
    then ends whatever the notebook left running)."""
    try:
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
        from autograder.keyrings import close_keyrings

        close_keyrings()  # what fails here fails the runner's own try again, and it refuses to run
        runner = os.fork()
    except Exception as err:  # noqa: BLE001 - the run cannot start: said on its stderr (the grader tries again)
        _fail(2, err)
    if runner == 0:
        try:
            os.execv(sys.executable, [sys.executable, "-m", "autograder.runner"])  # dumpable again, as any exec
        except BaseException as err:  # noqa: BLE001
            _fail(2, err)
    os.closerange(0, os.sysconf("SC_OPEN_MAX"))  # the channel, the inputs and stderr are the runner's alone
    _reap_until(runner)


def _fresh_randomness() -> None:
    """Seeds a fresh process would draw: the fork server's were drawn once, for every child."""
    import random

    import numpy

    random.seed()
    numpy.random.seed()


if __name__ == "__main__":
    if sys.argv[1:] == [FRESH_PID1]:
        fresh_pid1()
    try:
        main()
    except BaseException as err:  # noqa: BLE001 - the fork server's own failure: say why, on stderr
        sys.stderr.write(f"fork server: {type(err).__name__}: {err}\n")
        os._exit(1)
