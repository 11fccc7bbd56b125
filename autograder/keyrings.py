"""Runs INSIDE the sandbox, before any student code: the kernel's keyrings, closed to the notebook.

Keyrings are not a namespace of their own. A sandbox inherits the grader's session keyring (a
pam_keyinit login's, a systemd service's: Kerberos tickets, disk-encryption keys), a new user
namespace does not replace it, and every sandbox of the grader's uid draws keys from one quota
(200 keys for an ordinary user). So the runner

1. joins a new, empty session keyring (the grader's is no longer its own), and
2. installs a seccomp filter that answers add_key, request_key and keyctl with EPERM for itself
   and everything it starts, as Docker's default profile does, and fscrypt's ioctls too (adding
   a file-system encryption key makes a kernel key charged to the uid, on a read-only mount too):
   a notebook can neither read a key it can still reach, nor fill the quota its classmates'
   sandboxes need, nor leave a key for the next notebook.

The sandbox's launcher does both too, between fork and exec (`closer`), so that nothing in the
sandbox holds the grader's keyring or runs unfiltered (bubblewrap itself, the sandbox's PID 1, the
fallback's init), and a fresh sandbox's PID 1 (forkserver.fresh_pid1) again before the runner.

Either suffices to keep the grader's keys from the notebook, and a key given to the notebook
by number is no use without keyctl; the sandbox refuses to run it only when both fail. Python
binds neither call: they go through libc by number, per machine.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from typing import Callable

# (AUDIT_ARCH of the native system call ABI, add_key, request_key, keyctl, ioctl), by platform.machine()
KEY_SYSCALLS = {"x86_64": (0xC000003E, 248, 249, 250, 16), "aarch64": (0xC00000B7, 217, 218, 219, 29),
                "riscv64": (0xC00000F3, 217, 218, 219, 29)}
KEYCTL_JOIN_SESSION_KEYRING = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
ENOSYS, EPERM = 38, 1
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers
# fscrypt's ioctls, _IO*('f', 19..27) (type << 8 | number: the request's low 16 bits): adding a key
# makes a kernel key charged to the caller's uid on any mounted file system with encryption on, read-only too
FSCRYPT_IOCTLS = (ord("f") << 8 | 19, ord("f") << 8 | 27)

# classic BPF, as seccomp(2) reads it: seccomp_data is {int nr; u32 arch; u64 ip; u64 args[6]}
LD_ABS, AND, JEQ, JGE, JGT, JSET, RET = 0x20, 0x54, 0x15, 0x35, 0x25, 0x45, 0x06  # JSET: jump when A & k
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
ARCH, NR, ARG0_LOW, ARG1_LOW, ARG2_LOW = 4, 0, 16, 24, 32  # offsets in seccomp_data (an argument's low half first)


class SockFilter(ctypes.Structure):  # struct sock_filter: one classic BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):  # struct sock_fprog: the program
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def close_keyrings() -> str:
    """Close the keyrings to everything this process starts from now on ("" when done, else why not)."""
    return closer()()


def closer(libc=None, filtered: bool = True) -> Callable[[], str]:
    """`close_keyrings`, prepared: the returned function only makes system calls (no import, no
    library loaded, nothing allocated), so a sandbox's launcher may call it between fork and exec,
    and then the whole sandbox (bubblewrap's own PID 1, the fallback's init) is closed too.
    `filtered=False`: the new keyring only (a setuid launcher must not inherit no_new_privs)."""
    if not sys.platform.startswith("linux"):  # keyrings and seccomp are Linux's (and other kernels number calls otherwise)
        return lambda: ""
    calls = KEY_SYSCALLS.get(platform.machine())
    if calls is None:
        why = (f"the grader does not know the keyring system calls' numbers on {platform.machine()}, so it cannot "
               "keep the grader's keys from the notebook: add them to KEY_SYSCALLS in autograder/keyrings.py")
        return lambda: why
    libc = libc or ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    program = _program(*calls)
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), filters)

    def close() -> str:
        joined = _join_new_session_keyring(libc, calls[3])
        denied = _deny(libc, fprog, filters) if filtered else "no seccomp filter (not asked for)"
        if joined and denied:
            return f"the sandbox could not close the kernel's keyrings to the notebook ({joined}; {denied})"
        return ""
    return close


def _join_new_session_keyring(libc, keyctl: int) -> str:
    """"" once this process has a new, empty session keyring, or cannot reach a keyring at all:
    a kernel without keyrings (ENOSYS), or keyctl already refused to it (EPERM: Docker's default
    seccomp profile, an outer sandbox's, or this module's own filter, installed before)."""
    if libc.syscall(ctypes.c_long(keyctl), KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return ""
    err = ctypes.get_errno()
    return "" if err in (ENOSYS, EPERM) else f"no new session keyring: {os.strerror(err)}"


def _program(arch: int, add_key: int, request_key: int, keyctl: int, ioctl: int) -> list[tuple[int, int, int, int]]:
    """The filter: another ABI's calls (32-bit ones on a 64-bit kernel) get ENOSYS; add_key,
    request_key, keyctl, x32's numbers and fscrypt's ioctls get EPERM; everything else runs."""
    low, high = FSCRYPT_IOCTLS
    labelled = [
        ("load", ARCH), ("if ==", arch, None, "other ABI"),
        ("load", NR), ("if >=", X32_SYSCALL_BIT, "deny", None),
        ("if ==", add_key, "deny", None), ("if ==", request_key, "deny", None), ("if ==", keyctl, "deny", None),
        ("if ==", ioctl, None, "allow"),
        ("load", ARG1_LOW), ("and", 0xFFFF), ("if >=", low, None, "allow"), ("if >", high, "allow", "deny"),
        ("label", "deny"), ("return", RET_ERRNO | EPERM),
        ("label", "allow"), ("return", RET_ALLOW),
        ("label", "other ABI"), ("return", RET_ERRNO | ENOSYS),
    ]
    return _assemble(labelled)


def _assemble(labelled: list[tuple]) -> list[tuple[int, int, int, int]]:
    """Classic BPF from steps with named jump targets: ("load", offset), ("and", k), ("return", k), ("label", name)
    and ("if ==" | "if >=" | "if >" | "if &", k, target if true, target if false), None = the next step."""
    at, count, program = {}, 0, []
    for step in labelled:  # where each label lands
        if step[0] == "label":
            at[step[1]] = count
        else:
            count += 1
    for step in labelled:
        if step[0] == "label":
            continue
        here = len(program) + 1  # jumps count from the next instruction
        if step[0] == "load":
            program.append((LD_ABS, 0, 0, step[1]))
        elif step[0] == "and":
            program.append((AND, 0, 0, step[1]))
        elif step[0] == "return":
            program.append((RET, 0, 0, step[1]))
        else:
            code = {"if ==": JEQ, "if >=": JGE, "if >": JGT, "if &": JSET}[step[0]]
            true, false = (0 if target is None else at[target] - here for target in step[2:4])
            program.append((code, true, false, step[1]))
    return program


# Refused to student code only (the runner installs the filter, after the sandbox's own setsid: bubblewrap's
# --new-session, the fork server's per run), by platform.machine(): setsid, then memfd_create, memfd_secret
# and shmget (x86_64's own numbers; aarch64 and riscv64 share the generic table).
NOTEBOOK_REFUSED = {"x86_64": (112, 319, 447, 29), "aarch64": (157, 279, 447, 194), "riscv64": (157, 279, 447, 194)}
# unshare, clone, clone3: a new user namespace is refused to the notebook (below)
NAMESPACE_CALLS = {"x86_64": (272, 56, 435), "aarch64": (97, 220, 435), "riscv64": (97, 220, 435)}
CLONE_NEWUSER = 0x10000000


# io_uring_setup, io_uring_enter, io_uring_register (one numbering on x86_64, aarch64 and riscv64): a ring's
# commands reach the kernel without a system call of their own, so no filter sees them (a reviewer's ring set
# SO_SNDBUF past the refusal below); answered ENOSYS, as Docker's default profile does
IO_URING = (425, 426, 427)
# setsockopt, by platform.machine(), and the options on SOL_SOCKET that size a socket's buffers
SETSOCKOPT = {"x86_64": 54, "aarch64": 208, "riscv64": 208}
SOL_SOCKET, BUFFER_OPTIONS = 1, (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE


def deny_to_notebook() -> str:
    """Refuse to this process and all it starts ("" when done, else why not):
    - setsid (EPERM): a new session is a new scheduler autogroup (kernel.sched_autogroup_enabled), and 240
      children each in a session of its own got as much CPU each as a classmate's whole sandbox or the
      grader, holding its classmates past their limits; in the run's one session they share one;
    - memfd_create, memfd_secret and SysV shmget (ENOSYS, as a kernel without them: libraries that try
      memfd fall back to /dev/shm, a sized tmpfs here): memory in no process's mapping, which the ordinary
      user's memory watch cannot see (a red team's memfds went past the limit unseen);
    - a new user namespace (unshare or clone with CLONE_NEWUSER: EPERM; clone3, whose flags a filter cannot
      read, ENOSYS, and the C library falls back to clone, as under Docker's default profile): the kernel
      counts user namespaces per uid, and a red team's notebook held the grader's whole quota, so that
      classmates' sandboxes could not start (their grades became the grader's incidents);
    - io_uring (ENOSYS): its commands bypass every filter here;
    - a socket's buffer made larger (setsockopt SO_SNDBUF / SO_RCVBUF and their FORCE forms answer success
      and change nothing): what a socket holds in the kernel is in no process's memory, and the ordinary
      user's memory watch counts each of the sandbox's sockets at the default buffer's size (memwatch.py);
      a red team's sockets of 8 MiB each held the machine's memory unseen until the grader was OOM-killed."""
    if not sys.platform.startswith("linux") or platform.machine() not in NOTEBOOK_REFUSED:
        return ""  # another kernel, or an architecture not numbered here: nothing refused
    filters = (SockFilter * len(program := _notebook_program(platform.machine())))(
        *(SockFilter(*instruction) for instruction in program))
    libc = ctypes.CDLL(None, use_errno=True)
    return _deny(libc, SockFprog(len(program), filters), filters)


def _notebook_program(machine: str) -> list[tuple[int, int, int, int]]:
    """deny_to_notebook's filter, as classic BPF (another ABI's calls are left to the keyring filter)."""
    arch = KEY_SYSCALLS[machine][0]
    setsid, memfd, secret, shmget = NOTEBOOK_REFUSED[machine]
    unshare, clone, clone3 = NAMESPACE_CALLS[machine]
    sndbuf, rcvbuf, sndbuf_force, rcvbuf_force = BUFFER_OPTIONS
    return _assemble([
        ("load", ARCH), ("if ==", arch, None, "allow"),
        ("load", NR), ("if ==", setsid, "EPERM", None),
        ("if ==", memfd, "ENOSYS", None), ("if ==", secret, "ENOSYS", None), ("if ==", shmget, "ENOSYS", None),
        ("if ==", clone3, "ENOSYS", None),
        ("if ==", unshare, "flags", None), ("if ==", clone, "flags", None),
        ("if ==", IO_URING[0], "ENOSYS", None), ("if ==", IO_URING[1], "ENOSYS", None),
        ("if ==", IO_URING[2], "ENOSYS", None),
        ("if ==", SETSOCKOPT[machine], "socket option", "allow"),
        ("label", "flags"), ("load", ARG0_LOW), ("if &", CLONE_NEWUSER, "EPERM", "allow"),
        ("label", "socket option"), ("load", ARG1_LOW), ("if ==", SOL_SOCKET, None, "allow"),
        ("load", ARG2_LOW), ("if ==", sndbuf, "unchanged", None), ("if ==", rcvbuf, "unchanged", None),
        ("if ==", sndbuf_force, "unchanged", None), ("if ==", rcvbuf_force, "unchanged", "allow"),
        ("label", "allow"), ("return", RET_ALLOW),
        ("label", "unchanged"), ("return", RET_ERRNO | 0),  # errno 0: the call answers success, having done nothing
        ("label", "EPERM"), ("return", RET_ERRNO | EPERM),
        ("label", "ENOSYS"), ("return", RET_ERRNO | ENOSYS),
    ])


def _deny(libc, fprog: SockFprog, filters) -> str:
    """"" once the filter runs here and in every child (seccomp needs no_new_privs without CAP_SYS_ADMIN)."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"no seccomp filter: no_new_privs ({os.strerror(ctypes.get_errno())})"
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"no seccomp filter ({os.strerror(ctypes.get_errno())})"
    return ""
