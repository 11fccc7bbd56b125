"""Grading a class on a Dask cluster (`attn-course grade ... --scheduler tcp://HOST:PORT`).

The unit of work is one student's notebook: a worker runs it in its sandbox and judges it (the
same code as `attn-course check`: selfcheck.judge_notebook, on the worker's own prepared copy of
the assignment) and sends back data only, a `Judged`. The head alone writes: nbgrader's gradebook
(from the worker's verdicts), the saved runs, the CSVs, the report and the feedback.

Before a worker grades it checks that it has the head's course (`CourseIdentity`: the grader's
version and each solution notebook's hash) and the sandbox the head asks for (bubblewrap unless
the head's settings allow a weaker one). A worker that refuses, or a cluster that cannot take the
work, is the grader's incident (Status.INCIDENT: not saved, the next run grades it again), never
a student's grade. A worker that dies mid-notebook is Dask's to handle: the scheduler gives the
notebook to another worker, and the head records whichever result comes back, once; a notebook
whose workers died `ClusterSettings.tries` times is that student's incident (Status.CRASH).
"""
from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .course import notebook_path
from .grade import (
    GRADER_TRIES,
    INCIDENT_ADVICE,
    NOT_SUBMITTED,
    Course,
    NotebookResult,
    RemoteGrader,
    checks_salted,
    record_judged,
    tried_again,
)
from .outcomes import Status, Verdict
from .settings import ClusterSettings, Limits
from .submissions import StudentSubmission

Finish = Callable[[StudentSubmission, str, NotebookResult], None]  # the head's: save, note, keep


@dataclass(frozen=True)
class CourseIdentity:
    """What makes two machines grade alike: the grader's code (selfcheck.grader_version) and, per
    assignment, the SHA-256 of its solution notebook."""

    grader: str
    solutions: tuple[tuple[str, str], ...]

    def differences(self, other: CourseIdentity) -> list[str]:
        """What differs from `other` (the head's), in words ([] when the same course)."""
        found = ["the grader's code or nbgrader's version"] if self.grader != other.grader else []
        mine = dict(self.solutions)
        return found + [f"the solution of {a}" for a, digest in other.solutions if mine.get(a) != digest]


def course_identity(assignments: list[str], solutions: Path | None = None) -> CourseIdentity:
    """This machine's identity for `assignments`: its own solutions (the course found from the current
    folder or ATTN_COURSE_ROOT when `solutions` is None); a missing notebook hashes as ''."""
    from .selfcheck import grader_version

    def digest(assignment: str) -> str:
        path = notebook_path(assignment, solutions)
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""

    return CourseIdentity(grader_version(), tuple((a, digest(a)) for a in assignments))


def refusal(expected: CourseIdentity, weak_sandbox: bool) -> str:
    """Why this worker must not grade for a head expecting `expected` ("" when it may)."""
    from . import sandbox
    from .course import CourseFolder, library_dir
    from .sandbox import isolation_mode

    try:
        differs = course_identity([a for a, _ in expected.solutions]).differences(expected)
    except Exception as err:  # noqa: BLE001 - no course here at all: said, never raised on the worker
        return f"it has no course checkout ({type(err).__name__}: {err})"
    if differs:
        return "it has another course: " + ", ".join(differs) + " differ from the grading machine's"
    mode = isolation_mode()
    if mode != "bubblewrap" and not weak_sandbox:
        return (f"its sandbox is {mode!r}, not bubblewrap (install bubblewrap there, or set ATTN_SANDBOX=namespaces "
                "on the grading machine to allow the weaker sandbox)")
    try:  # as root: its sandboxes could start at all (nothing behind another user's private folder)
        sandbox.require_reachable({"the course library": library_dir(), "the course": CourseFolder.find().root}, mode)
    except sandbox.SandboxCannotReach as err:
        return str(err)
    return ""


@dataclass(frozen=True)
class Task:
    """One notebook to grade, as sent to a worker (data only)."""

    student: str
    assignment: str
    data: bytes
    salt: str  # the class's hidden inputs' salt (the grading thread's, checks_salted, on the worker)
    limits: Limits
    expected: CourseIdentity
    weak_sandbox: bool
    hidden: tuple[str, ...] = ()  # the head's folders (submissions, output): hidden where they exist


@dataclass
class Judged:
    """What a worker sends back: the notebook's result as `attn-course check` scores it, and the
    trusted verdicts nbgrader's gradebook is filled from on the head."""

    result: NotebookResult
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    worker: str = ""


def judge_task(task: Task) -> Judged:
    """On a worker: refuse (a grader incident) or run and judge the notebook; never raises."""
    import socket

    here = socket.gethostname()
    why = refusal(task.expected, task.weak_sandbox)
    if why:
        return Judged(_incident(task.student, task.assignment, f"the worker on {here} refused to grade: {why}"), {}, here)
    from .sandbox import SandboxUnavailable
    from .selfcheck import judge_notebook, prepare
    from .trusted import warm_up

    def judge() -> tuple[NotebookResult, dict[str, Verdict]]:
        warm_up()
        prepared = prepare(task.assignment)
        with checks_salted(task.salt):
            return judge_notebook(prepared, task.data, task.limits, task.student, hidden=task.hidden)

    try:
        result, verdicts = tried_again(judge)  # the grader's own failure: tried once more, as grade_one does
    except SandboxUnavailable as err:  # nothing of the student's ran
        return Judged(_incident(task.student, task.assignment, f"on {here}: {err}"), {}, here)
    except Exception as err:  # noqa: BLE001 - one student's disaster never stops the batch
        detail = f"the grader failed on this notebook on {here}, {GRADER_TRIES} times ({type(err).__name__}: {err})"
        return Judged(NotebookResult(task.student, task.assignment, 0.0, 0.0, Status.ERROR,
                                     detail=detail[:400 - len("error: ")]), {}, here)
    return Judged(result, verdicts, here)


def _incident(student: str, assignment: str, what: str) -> NotebookResult:
    return NotebookResult(student, assignment, 0.0, 0.0, Status.INCIDENT, detail=f"{what}; {INCIDENT_ADVICE}")


# --------------------------------------------------------------------------- the head
@contextmanager
def connected(settings: ClusterSettings):
    """A Dask client of the cluster `settings` names (TLS files from the settings, else Dask's own
    configuration), closed afterwards; the cluster itself is left running (a Gateway cluster made for
    this run is shut down)."""
    if settings.gateway:
        with _gateway_client(settings) as client:
            yield client
        return
    from distributed import Client
    from distributed.security import Security

    tls = {k: v for k, v in (("tls_ca_file", settings.tls_ca_file), ("tls_client_cert", settings.tls_cert),
                             ("tls_client_key", settings.tls_key)) if v}
    security = Security(**tls, require_encryption=True) if tls else None
    where = {"scheduler_file": settings.scheduler_file} if settings.scheduler_file else {"address": settings.scheduler}
    client = Client(**where, security=security, timeout=settings.connect_seconds, set_as_default=False)
    try:
        yield client
    finally:
        client.close()


@contextmanager
def _gateway_client(settings: ClusterSettings):
    """A client of a Dask Gateway cluster: the one named `gateway_cluster`, or a new one with
    `gateway_workers` workers, waited for, and shut down afterwards. The gateway's authentication and
    TLS are Dask's configuration's (`gateway.auth`, e.g. JupyterHub's token inside a hub)."""
    from dask_gateway import Gateway

    gateway = Gateway(settings.gateway)
    cluster = None
    try:
        if settings.gateway_cluster:
            cluster = gateway.connect(settings.gateway_cluster)
        else:
            cluster = gateway.new_cluster()
            cluster.scale(settings.gateway_workers)
        client = cluster.get_client(set_as_default=False)
        try:
            if not settings.gateway_cluster:
                client.wait_for_workers(settings.gateway_workers, timeout=max(settings.connect_seconds, 300))
            yield client
        finally:
            client.close()
    finally:
        if cluster is not None and not settings.gateway_cluster:
            cluster.shutdown()
        gateway.close()


def _allow_failures(n: int, dask_scheduler=None) -> None:
    dask_scheduler.allowed_failures = n


def usable_workers(client, expected: CourseIdentity, weak_sandbox: bool) -> tuple[list[str], dict[str, str]]:
    """(the workers that may grade, {worker: why it refuses}): each worker asked once, up front."""
    answers = client.run(refusal, expected, weak_sandbox, on_error="return")
    good, refused = [], {}
    for worker, why in answers.items():
        if isinstance(why, BaseException):
            why = f"it could not check its course ({type(why).__name__}: {why})"
        if why:
            refused[worker] = why
        else:
            good.append(worker)
    return good, refused


def grade_on_cluster(work: list[tuple[StudentSubmission, str]], finish: Finish, record: Callable,
                     settings: ClusterSettings, expected: CourseIdentity, limits: Limits, salt: str,
                     hidden: list[str], progress: bool) -> int:
    """Grade each (submission, assignment) of `work` on the cluster; `record(sub, judged)` turns a
    worker's Judged into the gradebook's NotebookResult (on the head, one at a time) and `finish`
    keeps it. Returns how many workers graded."""
    from distributed import as_completed
    from tqdm import tqdm

    with connected(settings) as client:
        try:
            client.run_on_scheduler(_allow_failures, settings.tries - 1)
        except Exception as err:  # noqa: BLE001 - a scheduler that runs no code of ours: its own setting holds
            print(f"cluster: the scheduler's own allowed-failures applies ({type(err).__name__})", file=sys.stderr)
        good, refused = usable_workers(client, expected, settings.weak_sandbox)
        for worker, why in refused.items():
            print(f"cluster: worker {worker} refuses to grade: {why}", file=sys.stderr)
        if progress:
            print(f"cluster: {len(good)} of {len(good) + len(refused)} workers grade ({client.scheduler.address})")
        futures = {}
        for sub, assignment in work:
            if not good:
                reasons = "; ".join(sorted(set(refused.values()))) or "the cluster has no workers"
                finish(sub, assignment, _incident(sub.student_id, assignment, f"no worker may grade: {reasons}"))
                continue
            task = Task(sub.student_id, assignment, sub.notebooks[assignment], salt, limits, expected,
                        settings.weak_sandbox, tuple(hidden))
            key = f"grade-{sub.student_id}-{assignment}-{uuid.uuid4().hex[:8]}"
            futures[client.submit(judge_task, task, key=key, pure=False, workers=good)] = (sub, assignment)
        for future in tqdm(as_completed(futures, loop=client.loop), total=len(futures), desc="grading", unit="notebook",
                           disable=not progress):
            sub, assignment = futures.pop(future)
            finish(sub, assignment, record(sub, _judged(future, sub.student_id, assignment, settings.tries)))
        return len(good)


def _judged(future, student: str, assignment: str, tries: int) -> Judged:
    """A finished future's Judged; a notebook whose workers kept dying is the student's CRASH, any
    other failure of the cluster the grader's incident."""
    from distributed.scheduler import KilledWorker

    try:
        return future.result()
    except KilledWorker:
        return Judged(NotebookResult(student, assignment, 0.0, 0.0, Status.CRASH, detail=(
            f"the worker grading this notebook died {tries} times (most likely the notebook used too much memory); "
            "not graded")))
    except Exception as err:  # noqa: BLE001 - the cluster's failure, not the student's
        return Judged(_incident(student, assignment, f"the cluster failed ({type(err).__name__}: {err})"))


def on_cluster(cluster: ClusterSettings) -> RemoteGrader:
    """`grade(..., remote=on_cluster(settings))`: the class's notebooks on this Dask cluster. A
    missing notebook is recorded on the head at once; every other one is judged on a worker and
    recorded on the head (one at a time: the gradebook is SQLite). The callable returns how many
    workers graded."""

    def grade_remotely(course: Course, subs: list[StudentSubmission], todo, finish, limits: Limits | None,
                       salt: str, solutions: Path, progress: bool) -> int:
        work = []
        for sub in subs:
            for assignment in todo(sub):
                if assignment in sub.notebooks:
                    work.append((sub, assignment))
                else:
                    finish(sub, assignment, NotebookResult(sub.student_id, assignment, 0.0,
                                                           course.max_score(assignment), Status.MISSING,
                                                           detail=NOT_SUBMITTED))

        def record(sub: StudentSubmission, judged) -> NotebookResult:
            """Into the head's gradebook; an exception of the grader's own is tried once more, then an
            "error" (not saved as graded), and the class's run goes on."""
            notebook = judged.result.notebook
            stamp = getattr(sub, "timestamps", {}).get(notebook)
            secret = getattr(sub, "secrets", {}).get(notebook, "")
            try:
                return tried_again(lambda: record_judged(course, judged.result, judged.verdicts, sub.notebooks[notebook],
                                                         stamp, secret))
            except Exception as err:  # noqa: BLE001 - one notebook's failure never stops the class
                failure = f"the grader failed to record this notebook, {GRADER_TRIES} times ({type(err).__name__}: {err})"
                return NotebookResult(sub.student_id, notebook, 0.0, course.max_score(notebook), Status.ERROR,
                                      detail=failure[:400 - len("error: ")])

        expected = course_identity(course.assignments, solutions)
        hidden = [str(course.root.parent), *course.extra_hidden]
        return grade_on_cluster(work, finish, record, cluster, expected, limits or Limits(), salt, hidden, progress)

    return grade_remotely

