"""Runs INSIDE the sandbox, before any student code: the kernel's keyrings, closed to the notebook.

Keyrings are not a namespace of their own. A sandbox inherits the grader's session keyring (a
pam_keyinit login's, a systemd service's: Kerberos tickets, disk-encryption keys), a new user
namespace does not replace it, and every sandbox of the grader's uid draws keys from one quota
(200 keys for an ordinary user). So the runner

1. joins a new, empty session keyring (the grader's is no longer its own), and
2. installs a seccomp filter that answers add_key, request_key and keyctl with EPERM for itself
   and everything it starts, as Docker's default profile does: a notebook can neither read a
   key it can still reach nor fill the quota its classmates' sandboxes need.

Either suffices to keep the grader's keys from the notebook, and a key given to the notebook
by number is no use without keyctl; the sandbox refuses to run it only when both fail. Python binds neither call: they go through libc by number, per machine.
"""
from __future__ import annotations

import ctypes
import os
import platform

# (AUDIT_ARCH of the native system call ABI, add_key, request_key, keyctl), by platform.machine()
KEY_SYSCALLS = {"x86_64": (0xC000003E, 248, 249, 250), "aarch64": (0xC00000B7, 217, 218, 219),
                "riscv64": (0xC00000F3, 217, 218, 219)}
KEYCTL_JOIN_SESSION_KEYRING = 1
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
ENOSYS, EPERM = 38, 1
X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers

# classic BPF, as seccomp(2) reads it: seccomp_data is {int nr; u32 arch; ...}
LD_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


class SockFilter(ctypes.Structure):  # struct sock_filter: one classic BPF instruction
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):  # struct sock_fprog: the program
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(SockFilter))]


def close_keyrings() -> str:
    """Close the keyrings to everything this process starts from now on ("" when done, else why not)."""
    calls = KEY_SYSCALLS.get(platform.machine())
    if calls is None:
        return (f"the grader does not know the keyring system calls' numbers on {platform.machine()}, so it cannot "
                "keep the grader's keys from the notebook: add them to KEY_SYSCALLS in autograder/keyrings.py")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    joined = _join_new_session_keyring(libc, calls[3])
    filtered = _deny_key_calls(libc, calls)
    if joined and filtered:
        return f"the sandbox could not close the kernel's keyrings to the notebook ({joined}; {filtered})"
    return ""


def _join_new_session_keyring(libc, keyctl: int) -> str:
    """"" once this process has a new, empty session keyring, or cannot reach a keyring at all:
    a kernel without keyrings (ENOSYS), or keyctl already refused to it (EPERM: Docker's default
    seccomp profile, an outer sandbox's)."""
    if libc.syscall(ctypes.c_long(keyctl), KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return ""
    err = ctypes.get_errno()
    return "" if err in (ENOSYS, EPERM) else f"no new session keyring: {os.strerror(err)}"


def _deny_key_calls(libc, calls: tuple[int, int, int, int]) -> str:
    """"" once add_key, request_key and keyctl fail with EPERM here and in every child (seccomp)."""
    arch, add_key, request_key, keyctl = calls
    program = [
        (LD_ABS, 0, 0, 4),  # A = arch
        (JEQ, 1, 0, arch),  # the native ABI: go on; another (32-bit calls on a 64-bit kernel): refused
        (RET, 0, 0, RET_ERRNO | ENOSYS),
        (LD_ABS, 0, 0, 0),  # A = the system call's number
        (JGE, 3, 0, X32_SYSCALL_BIT),
        (JEQ, 2, 0, add_key),
        (JEQ, 1, 0, request_key),
        (JEQ, 0, 1, keyctl),
        (RET, 0, 0, RET_ERRNO | EPERM),
        (RET, 0, 0, RET_ALLOW),
    ]
    filters = (SockFilter * len(program))(*(SockFilter(*instruction) for instruction in program))
    fprog = SockFprog(len(program), filters)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # seccomp's condition without CAP_SYS_ADMIN
        return f"no seccomp filter: no_new_privs ({os.strerror(ctypes.get_errno())})"
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return f"no seccomp filter ({os.strerror(ctypes.get_errno())})"
    return ""
