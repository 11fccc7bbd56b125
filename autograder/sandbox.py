"""Run untrusted notebook code in a sandbox, and survive whatever it does.

Isolation (Linux): the runner starts inside fresh mount, network and PID namespaces
(`unshare`), where
* the network is empty (loopback down): nothing goes out;
* solutions/, the repository's history, the grading output (gradebook, other students),
  the hidden-test modules and the reference module of the notebook being graded are
  covered by empty mounts, and /tmp, /var/tmp, /dev/shm are private;
* as root it drops to the unprivileged user `nobody`, which can write only its job folder;
  as an ordinary user it cannot drop, so the repository and $HOME are remounted read-only;
* resource limits cap memory (RLIMIT_AS), processes (RLIMIT_NPROC), file size and core dumps;
* the parent enforces a per-cell and a whole-notebook wall clock and kills the whole
  PID namespace when time is up.
Where namespaces are unavailable it falls back to limits only and says so in the status.

`run_notebook_job` executes the job again after a crash, a hang or a kill, skipping the cell
that caused it, so a student keeps the points of every exercise that does not depend on it.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

SCRATCH = "/dev/shm"  # a tmpfs mount point every Linux has: the sandbox's private scratch
PRIVATE_SCRATCH = (SCRATCH, "/tmp", "/var/tmp")


@dataclass
class Limits:
    cell_seconds: float = float(os.environ.get("ATTN_CELL_TIMEOUT", 60))
    notebook_seconds: float = float(os.environ.get("ATTN_NOTEBOOK_TIMEOUT", 300))
    memory_bytes: int = int(float(os.environ.get("ATTN_MEMORY_GB", 6)) * 2**30)
    processes: int = int(os.environ.get("ATTN_MAX_PROCESSES", 256))
    file_bytes: int = 256 * 2**20
    restarts: int = 4


@dataclass
class Incident:
    cell: int
    kind: str  # crash | timeout | memory | exit
    detail: str


@dataclass
class JobResult:
    isolation: str
    incidents: list[Incident] = field(default_factory=list)
    finished: bool = False
    seconds: float = 0.0


# --------------------------------------------------------------------------- isolation probe
@lru_cache(maxsize=1)
def isolation_mode() -> str:
    """'root' or 'user' when namespaces work here, else 'none: <why>'."""
    if os.environ.get("ATTN_SANDBOX") == "none":
        return "none: disabled by ATTN_SANDBOX=none"
    unshare = shutil.which("unshare")
    if not sys.platform.startswith("linux") or not unshare:
        return "none: needs Linux with util-linux's unshare"
    base = [unshare, "--mount", "--net", "--pid", "--fork", "--mount-proc"]
    mode = "root" if os.geteuid() == 0 else "user"
    cmd = base + ([] if mode == "root" else ["--map-root-user"]) + ["true"]
    try:
        ok = subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return mode if ok else "none: this system does not allow unprivileged namespaces"


# --------------------------------------------------------------------------- inside the namespace
def _mount(*args, fds=()) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, pass_fds=fds).returncode == 0


def _init_inside(spec_path: str) -> None:
    """PID 1 of the sandbox: hide what the student must not see, freeze the rest read-only, give
    the job folder back as the only writable place, set limits, drop every capability, exec."""
    spec = json.loads(Path(spec_path).read_text())
    job = os.open(spec["job"], os.O_RDONLY | os.O_DIRECTORY)
    for stub, target in spec["stub_files"]:
        if os.path.exists(target):
            _mount("--bind", stub, target)
    private = set()
    for path in spec["hide_dirs"]:  # hidden: an empty, read-only folder in its place
        if os.path.isdir(path) and _mount("-t", "tmpfs", "-o", "ro,size=4k,mode=555", "tmpfs", path):
            private.add(path)
    for path in PRIVATE_SCRATCH:  # the sandbox's own throwaway /tmp and friends
        if path not in spec["keep"] and os.path.isdir(path) and \
                _mount("-t", "tmpfs", "-o", "size=64m,mode=1777", "tmpfs", path):
            private.add(path)
    workdir = os.path.join(SCRATCH, "job")
    os.mkdir(workdir)
    if not _mount("--bind", f"/proc/self/fd/{job}", workdir, fds=(job,)):
        raise SystemExit("sandbox: could not mount the job folder")
    keep_writable = private | {workdir, "/proc", "/sys", "/dev", "/dev/pts", "/dev/mqueue"}
    for mountpoint in _mountpoints():
        if mountpoint not in keep_writable and not mountpoint.startswith(("/proc/", "/sys/")):
            _mount("-o", "remount,bind,ro", mountpoint)
    os.close(job)
    os.chdir(workdir)
    limits = spec["limits"]
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.environ.clear()
    os.environ.update(spec["env"])
    drop = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    os.execvp(drop[0], drop + [sys.executable, "-m", "autograder.runner"])


def _mountpoints() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            points.append(line.split()[4].replace("\\040", " "))
    return points


def _no_namespace_preexec(limits: Limits):
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if os.geteuid() != 0:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    return apply


# --------------------------------------------------------------------------- the parent side
def _sandbox_env() -> dict:
    """A small, explicit environment: no instructor secrets, one thread per library."""
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH") if k in os.environ}
    keep.update(HOME=".", MPLBACKEND="Agg", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", ATTN_IN_SANDBOX="1",
                IPYTHONDIR=".ipython", MPLCONFIGDIR=".mpl", TMPDIR=SCRATCH)
    return keep


def _contains_needed(path: str) -> bool:
    """Whether `path` holds the course or the Python running it (then it must stay visible)."""
    from attention_course.build import REPO

    needed = [REPO.resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent]
    return any(n == Path(path) or n.is_relative_to(path) for n in needed)


def _pids_cgroup(name: str, limit: int) -> Path | None:
    """A pids cgroup capping the sandbox's processes (root only: RLIMIT_NPROC does not bind root)."""
    if os.geteuid() != 0:
        return None
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (base / "cgroup.procs").exists() and (base / "pids.max").exists() or \
                (base == Path("/sys/fs/cgroup/pids") and base.is_dir()):
            group = base / f"attn-{name}"
            try:
                group.mkdir(exist_ok=True)
                (group / "pids.max").write_text(str(limit))
                return group
            except OSError:
                continue
    return None


def _enter(group: Path | None):
    def apply():
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        os.setsid()
    return apply


def _launch(job: Path, hide_dirs: list[str], stub_files: list[tuple[str, str]],
            limits: Limits, mode: str, group: Path | None) -> subprocess.Popen:
    env = _sandbox_env()
    if mode in ("root", "user"):
        spec = {"job": str(job), "hide_dirs": hide_dirs, "stub_files": stub_files,
                "keep": [p for p in PRIVATE_SCRATCH if _contains_needed(p)],
                "mode": mode, "env": env,
                "limits": {"memory_bytes": limits.memory_bytes, "processes": limits.processes,
                           "file_bytes": limits.file_bytes}}
        spec_path = job / "sandbox.json"
        spec_path.write_text(json.dumps(spec))
        cmd = ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]
        if mode == "user":
            cmd.append("--map-root-user")
        cmd += [sys.executable, "-m", "autograder.sandbox", "init", str(spec_path)]
        with open(job / "sandbox.err", "wb") as err:
            return subprocess.Popen(cmd, cwd=job, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=_enter(group))
    return subprocess.Popen([sys.executable, "-m", "autograder.runner"], cwd=job, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_no_namespace_preexec(limits))


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_progress(job: Path) -> tuple[int | None, bool]:
    """(cell started but not ended, done?) from the runner's progress log."""
    path = job / "progress.log"
    if not path.exists():
        return None, False
    running, done = None, False
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if parts[:1] == ["start"] and len(parts) == 2:
            running = int(parts[1])
        elif parts[:1] == ["end"]:
            running = None
        elif parts[:1] == ["done"]:
            done = True
    return running, done


def _describe_exit(code: int | None, mode: str) -> tuple[str, str]:
    if code is None:
        return "timeout", "killed"
    sig = -code if code < 0 else (code - 128 if mode != "none" and code > 128 else 0)
    if sig == signal.SIGSEGV:
        return "crash", "the process crashed (segmentation fault)"
    if sig == signal.SIGKILL:
        return "memory", "the process was killed (out of memory?)"
    if sig == signal.SIGXFSZ:
        return "crash", "a file grew past the size limit"
    if sig:
        return "crash", f"the process died from signal {signal.Signals(sig).name}"
    return "exit", f"the notebook ended the process (exit code {code}: os._exit or similar)"


def run_notebook_job(job: Path, hide_dirs: list[str], stub_files: list[tuple[str, str]],
                     limits: Limits | None = None) -> JobResult:
    """Execute job.json in the sandbox, restarting past bad cells. Outcomes land in job/out/."""
    limits = limits or Limits()
    mode = isolation_mode()
    result = JobResult(isolation=mode if mode in ("root", "user") else mode)
    job = job.resolve()
    spec = json.loads((job / "job.json").read_text())
    group = _pids_cgroup(job.name, limits.processes) if mode == "root" else None
    if mode == "root" and group is None:
        result.isolation = "root, processes not limited (no writable pids cgroup)"
    started = time.monotonic()
    for _attempt in range(limits.restarts + 1):
        (job / "progress.log").unlink(missing_ok=True)
        proc = _launch(job, hide_dirs, stub_files, limits, mode if mode in ("root", "user") else "none", group)
        cell_started, last_cell = time.monotonic(), None
        code: int | None = None
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            running, _ = _read_progress(job)
            if running != last_cell:
                last_cell, cell_started = running, time.monotonic()
            now = time.monotonic()
            if (running is not None and now - cell_started > limits.cell_seconds + 5) or \
                    now - started > limits.notebook_seconds:
                _kill(proc)
                code = None
                break
        running, done = _read_progress(job)
        if done:
            result.finished = True
            break
        if time.monotonic() - started > limits.notebook_seconds:
            result.incidents.append(Incident(running if running is not None else -1, "timeout",
                                             f"the notebook ran past its {limits.notebook_seconds:g} s limit"))
            break
        if running is None:  # died between cells or before the first: nothing to skip
            kind, detail = _describe_exit(code, mode)
            result.incidents.append(Incident(-1, kind, detail + " outside any cell"))
            break
        kind, detail = _describe_exit(code, mode)
        if code is None:
            kind, detail = "timeout", f"the cell ran past its {limits.cell_seconds:g} s limit and ignored the interrupt"
        result.incidents.append(Incident(running, kind, detail))
        spec["skip"] = sorted(set(spec.get("skip", [])) | {running})
        (job / "job.json").write_text(json.dumps(spec))
    result.seconds = time.monotonic() - started
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass
    return result


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "init":
        _init_inside(sys.argv[2])
    else:
        sys.exit("usage: python -m autograder.sandbox init SPEC.json (used by the grader)")
