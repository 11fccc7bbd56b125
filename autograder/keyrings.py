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
LD_ABS, AND, JEQ, JGE, JGT, RET = 0x20, 0x54, 0x15, 0x35, 0x25, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
ARCH, NR, ARG1_LOW = 4, 0, 24  # offsets in seccomp_data (little-endian: an argument's low half first)


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
            code = {"if ==": JEQ, "if >=": JGE, "if >": JGT}[step[0]]
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
JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K: jump when A & k
ARG0_LOW = 16  # offset of the first argument's low half in seccomp_data


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
      classmates' sandboxes could not start (their grades became the grader's incidents)."""
    if not sys.platform.startswith("linux") or platform.machine() not in NOTEBOOK_REFUSED:
        return ""  # another kernel, or an architecture not numbered here: nothing refused
    arch = KEY_SYSCALLS[platform.machine()][0]
    setsid, memfd, secret, shmget = NOTEBOOK_REFUSED[platform.machine()]
    unshare, clone, clone3 = NAMESPACE_CALLS[platform.machine()]
    program = [(LD_ABS, 0, 0, ARCH), (JEQ, 0, 8, arch),        # 0-1: another ABI: left to the keyring filter
               (LD_ABS, 0, 0, NR), (JEQ, 10, 0, setsid),        # 2-3: -> EPERM
               (JEQ, 10, 0, memfd), (JEQ, 9, 0, secret), (JEQ, 8, 0, shmget), (JEQ, 7, 0, clone3),  # 4-7: -> ENOSYS
               (JEQ, 2, 0, unshare), (JEQ, 1, 0, clone),        # 8-9: -> the flags, at 11
               (RET, 0, 0, RET_ALLOW),                          # 10
               (LD_ABS, 0, 0, ARG0_LOW), (JSET, 1, 0, CLONE_NEWUSER),  # 11-12: a new user namespace -> EPERM
               (RET, 0, 0, RET_ALLOW),                          # 13
               (RET, 0, 0, RET_ERRNO | EPERM), (RET, 0, 0, RET_ERRNO | ENOSYS)]  # 14, 15
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    libc = ctypes.CDLL(None, use_errno=True)
    return _deny(libc, SockFprog(len(program), filters), filters)


def _deny(libc, fprog: SockFprog, filters) -> str:
    """"" once the filter runs here and in every child (seccomp needs no_new_privs without CAP_SYS_ADMIN)."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"no seccomp filter: no_new_privs ({os.strerror(ctypes.get_errno())})"
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"no seccomp filter ({os.strerror(ctypes.get_errno())})"
    return ""
