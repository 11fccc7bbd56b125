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

The head hands out one notebook per thread of the workers that may grade (Dask blames a dead worker's
every task: only what it was running is on it), asks each worker when it first sees it (workers join
late, and come back at new addresses when restarted), and leaves notebooks unpinned while no worker
refuses. A cluster with no workers is waited for, saying so; a scheduler that does not answer is one
line (ClusterUnreachable).
"""
from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .course import hash_python_sources, library_dir, notebook_path
from .grade import (
    GRADER_TRIES,
    INCIDENT_ADVICE,
    Course,
    NotebookResult,
    RemoteGrader,
    checks_salted,
    not_graded_here,
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
    library: str = ""  # the course library as this Python imports it: the reference every check compares with

    def differences(self, other: CourseIdentity) -> list[str]:
        """What differs from `other` (the head's), in words ([] when the same course)."""
        found = ["the grader's code or nbgrader's version"] if self.grader != other.grader else []
        if self.library != other.library:  # (a red team: a worker whose PYTHONPATH named another copy's library,
            found.append(f"the course library it imports ({library_dir()})")  # its grader the same: 14/17 for 17/17)
        mine = dict(self.solutions)
        return found + [f"the solution of {a}" for a, digest in other.solutions if mine.get(a) != digest]


def course_identity(assignments: list[str], solutions: Path | None = None) -> CourseIdentity:
    """This machine's identity for `assignments`: its own solutions (the course found from the current
    folder or ATTN_COURSE_ROOT when `solutions` is None); a missing notebook hashes as ''."""
    from .selfcheck import grader_version

    def digest(assignment: str) -> str:
        path = notebook_path(assignment, solutions)
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""

    library = hashlib.sha256()
    hash_python_sources(library, library_dir())
    return CourseIdentity(grader_version(), tuple((a, digest(a)) for a in assignments), library.hexdigest())


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
        return ("it has another course: " + ", ".join(differs) + " differ from the grading machine's (bring its "
                "checkout to the same commit, and restart a worker started before the code changed: a worker keeps "
                "the code it started with)")
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
    refused: str = ""  # why the worker would not grade (another course, a weaker sandbox): the head hands it on
    worker_address: str = ""  # the refusing worker's Dask address


def judge_task(task: Task) -> Judged:
    """On a worker: refuse (a grader incident) or run and judge the notebook; never raises."""
    import socket

    here = socket.gethostname()
    why = refusal(task.expected, task.weak_sandbox)
    if why:
        from distributed import get_worker

        return Judged(_incident(task.student, task.assignment, f"the worker on {here} refused to grade: {why}"), {}, here,
                      refused=why, worker_address=get_worker().address)
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
    try:
        client = Client(**where, security=security, timeout=settings.connect_seconds, set_as_default=False)
    except (OSError, TimeoutError) as err:
        named = settings.scheduler_file or settings.scheduler
        raise ClusterUnreachable(
            f"no Dask scheduler answered at {named} within {settings.connect_seconds:.0f} s: start one (`dask scheduler`, "
            f"then workers with `dask worker ADDRESS`) or check --scheduler / --scheduler-file "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''})") from None
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


class ClusterUnreachable(ValueError):
    """No scheduler answered at the address given: said in one line, what to start or check (exit 2)."""


WAIT_FOR_WORKERS_S = 60.0  # a cluster with no worker that may grade: how long the head waits for one, saying so
STALLED_S = 15.0  # no notebook finished this long (or this long since it looked): the head looks again at the cluster
TICK_S = 5.0  # while nothing finishes, the bar says this often which notebooks the workers hold, and for how long
SHOWN_RUNNING = 4  # the longest-held notebooks the bar names (then "and N more")
STOPPING_ON_CLUSTER = ("\nstopping (Ctrl-C): no other notebook is handed to a worker; the ones the workers hold now "
                       "finish first, within their time limits, and are kept (Ctrl-C again not to wait for them: they "
                       "are graded again by the next run)")
MAX_HANDED_ON = 3  # a notebook refused by this many workers is the grader's incident, not handed on again


class _Membership:
    """Which of the cluster's workers may grade: each asked once, when first seen (workers join late, and come
    back at new addresses when they restart); the ones that refuse are named on the console once."""

    def __init__(self, client, expected: CourseIdentity, weak_sandbox: bool):
        self.client, self.expected, self.weak_sandbox = client, expected, weak_sandbox
        self.good: list[str] = []
        self.refused: dict[str, str] = {}
        self.lost: list[str] = []  # workers that graded and left during the run (died, or were stopped)
        self.labels: dict[str, str] = {}  # a notebook's task key -> 'student notebook', for the console
        self.held: dict[str, list[str]] = {}  # worker -> the task keys it was running when the head last looked
        self.looked_at = float("-inf")

    def look(self, every_s: float = 1.0) -> None:
        """Remember which notebooks each worker is running (so that a lost worker's can be named), at most every
        `every_s` seconds: a worker gone since the last look keeps what it held until `refresh` names it."""
        import time

        if time.monotonic() - self.looked_at < every_s:
            return
        self.looked_at = time.monotonic()
        try:
            now = {w: [str(k) for k in keys] for w, keys in self.client.processing().items()}
        except Exception:  # noqa: BLE001 - only the console's words depend on it
            return
        self.held = {**{w: keys for w, keys in self.held.items() if w in self.good and w not in now}, **now}

    def refresh(self) -> None:
        present = set(self.client.scheduler_info().get("workers", {}))
        for worker in [w for w in self.good if w not in present]:
            self.lost.append(worker)
            names = sorted(self.labels[k] for k in self.held.get(worker, ()) if k in self.labels)
            what = f"the notebooks it was grading ({', '.join(names)})" if names else "the notebooks it was grading"
            _say(f"cluster: lost worker {worker} (it died or was stopped): {what} are handed to another worker that "
                 f"may grade, each recorded once")
            self.held.pop(worker, None)
        self.good = [w for w in self.good if w in present]
        self.refused = {w: why for w, why in self.refused.items() if w in present}  # gone: waited for like the rest
        new = sorted(present - set(self.good) - set(self.refused))
        if not new:
            return
        good, refused = usable_workers(self.client, self.expected, self.weak_sandbox, new)
        self.good += good
        for worker, why in refused.items():
            self.refuse(worker, why)

    def refuse(self, worker: str, why: str) -> None:
        if worker in self.good:
            self.good.remove(worker)
        if worker not in self.refused:
            self.refused[worker] = why
            print(f"cluster: worker {worker} refuses to grade: {why}", file=sys.stderr)

    def slots(self) -> int:
        """How many notebooks may be on the workers at once: one per thread of the workers that may grade, so that
        a worker that dies had only the notebooks it was running (Dask blames every task it held)."""
        threads = self.client.nthreads()
        return max(1, sum(threads.get(w, 1) for w in self.good))

    def pin(self) -> list[str] | None:
        """Where a notebook may go: anywhere while no worker has refused (a restarted or new worker takes work at
        its new address), else the workers that may grade."""
        return list(self.good) if self.refused else None

    def wait_for_one(self, address: str, progress: bool, wait_s: float | None = None) -> bool:
        """At least one worker that may grade, waited for (and said so) up to `wait_s` while the cluster has none at
        all (workers that refuse are not waited out: they stay what they are until restarted)."""
        import time

        wait_s = WAIT_FOR_WORKERS_S if wait_s is None else wait_s
        self.refresh()
        deadline, said = time.monotonic() + wait_s, False
        while not self.good and not self.refused and time.monotonic() < deadline:
            if not said:
                _say(f"cluster: no worker that may grade{' left' if self.lost else ' yet'}; waiting up to "
                     f"{wait_s:.0f} s for one (start workers from the course folder: {worker_command(address)})")
                said = True
            time.sleep(1.0)
            self.refresh()
        return bool(self.good)


def _say(line: str) -> None:
    """A line on stderr that a progress bar there does not run into (tqdm.write clears and redraws it)."""
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def worker_command(address: str) -> str:
    """How to start a worker that may grade, as the README says: this environment's dask, one thread per process."""
    return f"`{Path(sys.executable).parent / 'dask'} worker {address} --nthreads 1`"


def usable_workers(client, expected: CourseIdentity, weak_sandbox: bool,
                   workers: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """(the workers that may grade, {worker: why it refuses}), of `workers` (None: every worker), each asked once."""
    answers = client.run(refusal, expected, weak_sandbox, workers=workers, on_error="return")
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
    import queue
    import time
    from collections import deque

    from tqdm import tqdm

    with connected(settings) as client:
        try:
            client.run_on_scheduler(_allow_failures, settings.tries - 1)
        except Exception as err:  # noqa: BLE001 - a scheduler that runs no code of ours: its own setting holds
            print(f"cluster: the scheduler's own allowed-failures applies ({type(err).__name__})", file=sys.stderr)
        members = _Membership(client, expected, settings.weak_sandbox)
        address = client.scheduler.address
        if work and not members.wait_for_one(address, progress):
            reasons = "; ".join(sorted(set(members.refused.values())))
            why = (f"no worker may grade: {reasons}" if reasons else
                   f"the cluster at {address} has no workers: start some ({worker_command(address)}), then grade again")
            for sub, assignment in work:
                finish(sub, assignment, _incident(sub.student_id, assignment, why))
            return 0
        if progress:
            print(f"cluster: {len(members.good)} of {len(members.good) + len(members.refused)} workers grade "
                  f"({address})", flush=True)
        waiting, running, graded_by, finished = deque(work), {}, set(), queue.Queue()
        incidents = 0  # notebooks left as the grader's incidents when every worker was lost
        refusals: dict[tuple[str, str], int] = {}  # a notebook handed on by refusing workers: at most a few times
        looked = quiet_since = time.monotonic()
        handed_at: dict = {}  # future -> when it was handed to a worker

        def submit(sub, assignment):
            task = Task(sub.student_id, assignment, sub.notebooks[assignment], salt, limits, expected,
                        settings.weak_sandbox, tuple(hidden))
            key = f"grade-{sub.student_id}-{assignment}-{uuid.uuid4().hex[:8]}"
            future = client.submit(judge_task, task, key=key, pure=False, workers=members.pin())
            running[future] = (sub, assignment)
            handed_at[future] = time.monotonic()
            members.labels[key] = f"{sub.student_id} {assignment}"
            future.add_done_callback(finished.put)

        with tqdm(total=len(work), desc="grading", unit="notebook", disable=not progress) as bar, \
                _stopped_by_ctrl_c() as stop:
            while waiting or running:
                if stop.asked and not stop.said:  # the first Ctrl-C: what the workers hold finishes, nothing else starts
                    stop.left = len(waiting)
                    waiting.clear()
                    stop.said = True
                    print(STOPPING_ON_CLUSTER, file=sys.stderr, flush=True)
                if time.monotonic() - looked > STALLED_S:  # workers that joined meanwhile add their threads
                    members.refresh()
                    looked = time.monotonic()
                while waiting and len(running) < members.slots():
                    submit(*waiting.popleft())
                members.look()
                try:
                    future = finished.get(timeout=TICK_S)
                except queue.Empty:
                    bar.set_postfix_str(_held_now(running, handed_at), refresh=True)  # the elapsed time moves too
                    if time.monotonic() - quiet_since < STALLED_S:
                        continue
                    quiet_since = time.monotonic()
                    _look_again(members, running, submit)
                    if not members.good and not members.wait_for_one(address, progress):  # every worker gone
                        why = (f"the cluster at {address} lost every worker that may grade during the run, and none "
                               f"came in {WAIT_FOR_WORKERS_S:.0f} s")
                        stranded = [f for f in running if not f.done()]  # a finished one is read from the queue
                        for future in stranded:
                            future.cancel()
                        for sub, assignment in [*(running.pop(f) for f in stranded), *waiting]:
                            finish(sub, assignment, _incident(sub.student_id, assignment, why))
                            incidents += 1
                            bar.update()
                        waiting.clear()
                    continue
                quiet_since = time.monotonic()
                if future not in running:  # handed out again (_look_again) and cancelled here
                    continue
                sub, assignment = running.pop(future)
                handed_at.pop(future, None)
                judged = _judged(future, sub.student_id, assignment, settings.tries)
                if judged.refused:  # a worker that joined with another course: the notebook goes elsewhere
                    members.refuse(judged.worker_address, judged.refused)
                    handed = refusals[sub.student_id, assignment] = refusals.get((sub.student_id, assignment), 0) + 1
                    if handed <= MAX_HANDED_ON and (members.good or members.wait_for_one(address, progress)):
                        waiting.appendleft((sub, assignment))
                        continue
                graded_by.add(judged.worker)
                finish(sub, assignment, record(sub, judged))
                bar.set_postfix_str(_held_now(running, handed_at), refresh=False)
                bar.update()
        if stop.left:
            raise KeyboardInterrupt  # what was graded is kept; the command says so, and the next run grades the rest
        if members.lost:
            after = (f"{incidents} notebook(s) were left as grader incidents, graded by the next run" if incidents else
                     f"the notebooks they held were graded on other workers (one whose workers died {settings.tries} "
                     f"times is its student's crash)")
            _say(f"cluster: {len(members.lost)} worker(s) lost during the run ({', '.join(members.lost)}); {after}")
        return len(members.good) or len(graded_by)


def _held_now(running: dict, handed_at: dict) -> str:
    """The bar's postfix: the notebooks the workers hold, longest-held first, with how long each has been held
    ('now: s33 01_similarity_attention 65 s, s34 ... 60 s'); '' when none."""
    import time

    now = time.monotonic()
    held = sorted(((now - handed_at.get(f, now), f"{sub.student_id} {assignment}") for f, (sub, assignment)
                   in running.items()), reverse=True)
    if not held:
        return ""
    shown = ", ".join(f"{label} {seconds:.0f} s" for seconds, label in held[:SHOWN_RUNNING])
    more = f" and {len(held) - SHOWN_RUNNING} more" if len(held) > SHOWN_RUNNING else ""
    return f"now: {shown}{more}"


class _CtrlC:
    """Whether Ctrl-C was pressed once (`asked`): the loop then hands out nothing more, and says so (`said`)."""

    asked = False
    said = False
    left = 0  # the notebooks not handed out because of it


@contextmanager
def _stopped_by_ctrl_c():
    """A first Ctrl-C (SIGINT) sets `asked` instead of interrupting the head where it stands (in the middle of
    recording a grade, say); a second one interrupts at once. Only in the main thread, where signals arrive."""
    import signal
    import threading

    state = _CtrlC()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def first(signum, frame):
        state.asked = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the second Ctrl-C raises KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield state
    finally:
        signal.signal(signal.SIGINT, previous)


def _look_again(members: _Membership, running: dict, submit) -> None:
    """Nothing finished for a while: new workers join the ones that may grade, and a notebook held for workers that
    are gone (restarted at new addresses) is handed out again."""
    before = set(members.good)
    members.refresh()
    if not members.refused or set(members.good) >= before:
        return
    present = set(members.good)
    for future in [f for f in running if not _placed_on(f, present)]:
        sub, assignment = running.pop(future)
        future.cancel()
        submit(sub, assignment)


def _placed_on(future, workers: set[str]) -> bool:
    """Whether `future`'s task may still run on one of `workers` (its restriction names one, or it has none)."""
    state = future.client.run_on_scheduler(_restriction, future.key)
    return not state or bool(set(state) & workers)


def _restriction(key, dask_scheduler=None) -> list[str]:
    task = dask_scheduler.tasks.get(key)
    return sorted(task.worker_restrictions or ()) if task is not None else []


def _judged(future, student: str, assignment: str, tries: int) -> Judged:
    """A finished future's Judged; a notebook whose workers died `tries` times while grading it is the student's
    CRASH, any other failure of the cluster the grader's incident. (The head hands out one notebook per worker
    thread, so a worker that dies was grading only what it held.)"""
    from distributed.scheduler import KilledWorker

    try:
        return future.result()
    except KilledWorker:
        return Judged(NotebookResult(student, assignment, 0.0, 0.0, Status.CRASH, detail=(
            f"the Dask worker grading this notebook died {tries} times while it ran (a notebook that uses too much "
            "memory is the usual cause; if the workers were stopped from outside, grade it again with --force "
            "--student and --assignment)")))
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
                    finish(sub, assignment, not_graded_here(course, sub, assignment))

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

