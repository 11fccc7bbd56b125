"""Grading on a Dask cluster, on 127.0.0.1: the same grades as on this machine, a worker killed
mid-notebook (graded once, elsewhere), a notebook whose worker keeps dying (the student's crash),
workers that refuse (another course, a weaker sandbox), and a scheduler reached over TLS."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import nbformat
import pytest

from autograder import cluster as grading_cluster
from autograder import grade as grading
from autograder.outcomes import Status
from autograder.sandbox import SandboxCannotReach
from autograder.settings import ClusterSettings
from course_tools.net import free_port

from .conftest import inject, solved_notebook
from .layout import REPO

A01 = "01_similarity_attention"
SLEEP = 8  # seconds the slow notebook sleeps in its first answer cell: long enough to kill its worker during it


def _mistake(course):
    return inject(solved_notebook(course, A01), {"dot_similarity": "def dot_similarity(E):\n    return E.T @ E"})


def _slow(course):
    nb = solved_notebook(course, A01)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "normalize_rows")
    return inject(nb, {"normalize_rows": f"import time\ntime.sleep({SLEEP})\n" + cell.source})


def _class(root, notebooks: dict) -> None:
    for student, nb in notebooks.items():
        (root / student).mkdir(parents=True)
        data = nb if isinstance(nb, str) else nbformat.writes(nb)
        (root / student / f"{A01}.ipynb").write_text(data)


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> grading.Course:
    """conftest's course, notebook 01 only (what these tests grade): prepared in seconds, not minutes."""
    return grading.Course(tmp_path_factory.mktemp("grading") / "course").setup(only=[A01])


def _out(folder):
    """A grading output whose course holds notebook 01 only (`grade` sets up every notebook otherwise)."""
    grading.Course(folder / "course").setup(only=[A01])
    return folder


def _table(results) -> list[tuple]:
    return sorted((r.student_id, r.notebook, r.score, r.max_score, r.status, r.detail,
                   tuple((c.grade_id, c.score, c.message, c.mistake) for c in r.cells)) for r in results)


# A LocalCluster's nannies live in this process: a worker they restart starts in this process's folder, which
# nbgrader's autograde changes for a moment (to the grading course), and found no course there (a grader incident
# under load). The course is named instead, as a real worker finds it from the checkout it is started in.
WORKER_ENV = {"ATTN_COURSE_ROOT": str(REPO)}


@pytest.fixture(scope="module")
def local_cluster():
    """Two worker processes of one thread each, on 127.0.0.1 (workers restart when killed)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env=WORKER_ENV) as cluster, Client(cluster) as client:
        yield cluster, client


def _on(cluster, **more) -> ClusterSettings:
    return ClusterSettings(scheduler=cluster.scheduler_address, **more)


def _executing(dask_worker=None) -> list[str]:
    return [str(key) for key, ts in dask_worker.state.tasks.items() if ts.state == "executing"]


def _kill_worker_grading(client, student: str, after: float = 3.0, timeout: float = 180.0,
                        signal_to_send: int | None = signal.SIGKILL) -> str:
    """SIGKILL the worker process grading `student`'s notebook, `after` seconds into it (no signal: only wait)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        running = client.run(_executing, on_error="return")
        found = [w for w, keys in running.items() if isinstance(keys, list) and any(f"-{student}-" in k for k in keys)]
        if found:
            time.sleep(after)
            if signal_to_send is not None:
                pid = client.run(os.getpid, workers=found)[found[0]]
                os.kill(pid, signal_to_send)
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"{student}'s notebook never started on a worker")


def _grade_in_thread(*args, **kwargs):
    box: dict = {}

    def run():
        try:
            box["results"] = grading.grade(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def _finished(thread, box) -> list:
    thread.join(timeout=600)
    assert not thread.is_alive(), "grading never finished"
    if "error" in box:
        raise box["error"]
    return box["results"]


# --------------------------------------------------------------------------- no cluster needed
def test_a_worker_importing_another_copy_of_the_library_is_refused(tmp_path):
    """A red team: a worker started in the course, as the README says, but with PYTHONPATH naming another clone
    whose attention_course differed (its autograder/ byte for byte the same): accepted, and honest students scored
    14/17 for 17/17, said nowhere. The worker's identity now holds the library it imports."""
    import base64
    import pickle
    import shutil
    import subprocess
    import sys

    expected = grading_cluster.course_identity([A01])
    other = tmp_path / "oldlib"  # the grader the same byte for byte (its library is the one beside it), the library not
    for package in ("autograder", "attention_course"):
        shutil.copytree(REPO / package, other / package, ignore=shutil.ignore_patterns("__pycache__", "texts"))
    similarity = other / "attention_course" / "similarity.py"
    similarity.write_text(similarity.read_text() + "\n# an older copy\n")
    code = ("import base64, pickle, sys\nfrom autograder import cluster\n"
            "print(cluster.refusal(pickle.loads(base64.b64decode(sys.argv[1])), True))")
    said = subprocess.run([sys.executable, "-c", code, base64.b64encode(pickle.dumps(expected)).decode()],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(other), "ATTN_COURSE_ROOT": str(REPO)},
                          capture_output=True, text=True, timeout=300)  # (as a worker's command: not from the course's folder)
    assert said.returncode == 0, said.stderr[-3000:]
    assert "another course: the course library it imports" in said.stdout and str(other) in said.stdout, said.stdout


def test_worker_refuses_another_course_and_a_weak_sandbox(monkeypatch):
    mine = grading_cluster.course_identity([A01])
    assert grading_cluster.refusal(mine, weak_sandbox=False) == "" or "bubblewrap" in grading_cluster.refusal(mine, False)
    other = replace(mine, solutions=((A01, "0" * 64),))
    assert "another course: the solution of 01_similarity_attention" in grading_cluster.refusal(other, True)
    assert "grader's code" in grading_cluster.refusal(replace(mine, grader="x"), True)
    assert mine.library and "the course library it imports" in grading_cluster.refusal(replace(mine, library="x"), True)
    monkeypatch.setattr("autograder.sandbox.isolation_mode", lambda: "namespaces (user)")
    assert "not bubblewrap" in grading_cluster.refusal(mine, weak_sandbox=False)
    assert grading_cluster.refusal(mine, weak_sandbox=True) == ""

    def behind_a_private_home(needed, mode=None):
        assert needed["the course library"].name == "attention_course" and (needed["the course"] / "solutions").is_dir()
        raise SandboxCannotReach("the Python (/home/alice/course/.venv/bin/python) lies in /home/alice ...")

    monkeypatch.setattr("autograder.sandbox.require_reachable", behind_a_private_home)
    assert grading_cluster.refusal(mine, weak_sandbox=True).startswith("the Python (/home/alice")


def test_cli_checks_the_scheduler_arguments(tmp_path):
    from course_tools.cli import UsageError, _cluster_arguments

    class Args:
        scheduler, scheduler_file, tls_ca_file, tls_cert, tls_key = "tcp://127.0.0.1:8786", None, None, None, None

    assert _cluster_arguments(Args, ClusterSettings()).scheduler == "tcp://127.0.0.1:8786"
    for bad in ("127.0.0.1:8786", "http://host:1", "tcp://host"):
        Args.scheduler = bad
        with pytest.raises(UsageError, match="tcp://HOST:PORT"):
            _cluster_arguments(Args, ClusterSettings())
    Args.scheduler, Args.tls_cert = "tls://127.0.0.1:8786", str(tmp_path / "absent.pem")
    with pytest.raises(UsageError, match="not a file"):
        _cluster_arguments(Args, ClusterSettings())


def test_an_unreachable_scheduler_is_one_line_naming_it_and_what_to_start(tmp_path):
    """An instructor's wrong --scheduler waited 30 s in silence, then printed 60 lines of traceback (exit 1)."""
    settings = ClusterSettings(scheduler=f"tcp://127.0.0.1:{free_port()}", connect_seconds=2)
    with pytest.raises(grading_cluster.ClusterUnreachable) as err, grading_cluster.connected(settings):
        pass
    said = str(err.value)
    assert settings.scheduler in said and "dask scheduler" in said and "dask worker" in said and "\n" not in said
    assert isinstance(err.value, ValueError)  # the command line's one-line error, exit 2


class _FakeClient:
    """The parts of a Dask client the membership reads: who is there, their threads, and each one's answer."""

    def __init__(self, workers: dict[str, tuple[int, str]]):
        self.workers, self.asked, self.busy = workers, [], {}

    def processing(self):
        return {w: self.busy.get(w, []) for w in self.workers}

    def scheduler_info(self):
        return {"workers": {w: {} for w in self.workers}}

    def nthreads(self):
        return {w: n for w, (n, _) in self.workers.items()}

    def run(self, function, *args, workers=None, on_error="raise"):
        self.asked += list(workers)
        return {w: self.workers[w][1] for w in workers}


def test_workers_that_join_late_or_come_back_at_new_addresses_grade(capsys):
    """The head asked the workers once, up front, and pinned every notebook to their addresses: a worker that joined
    later never graded, and when the workers restarted (new addresses) the run waited forever."""
    client = _FakeClient({"tcp://a:1": (1, ""), "tcp://b:1": (2, "")})
    members = grading_cluster._Membership(client, None, False)
    members.refresh()
    assert sorted(members.good) == ["tcp://a:1", "tcp://b:1"] and members.slots() == 3
    assert members.pin() is None, "while no worker refuses, a notebook may go to any worker (a restarted one too)"
    client.workers = {"tcp://b:1": (2, ""), "tcp://c:1": (1, ""), "tcp://d:1": (4, "it has another course")}
    members.refresh()
    assert sorted(members.good) == ["tcp://b:1", "tcp://c:1"] and members.slots() == 3
    assert client.asked == ["tcp://a:1", "tcp://b:1", "tcp://c:1", "tcp://d:1"], "each worker asked once"
    assert members.pin() == members.good and "tcp://d:1 refuses to grade: it has another course" in capsys.readouterr().err
    members.labels = {"grade-sam-01-ab": "sam 01", "grade-ann-05-cd": "ann 05", "grade-ben-01-ef": "ben 01"}
    client.busy = {"tcp://b:1": ["grade-sam-01-ab", "grade-ann-05-cd"], "tcp://c:1": []}
    members.look(every_s=0)
    client.workers = {}
    members.look(every_s=0)  # a look after they died and before refresh says so keeps what they held (a reviewer)
    members.refresh()
    assert members.good == [] and members.slots() == 1
    err = capsys.readouterr().err  # an instructor's walkthrough: a worker lost mid-run was said nowhere
    assert "cluster: lost worker tcp://b:1 (it died or was stopped)" in err and "lost worker tcp://c:1" in err
    # and then which notebooks it had was said nowhere either (a reviewer: "whose grade do I check?")
    assert "lost worker tcp://b:1 (it died or was stopped): the notebooks it was grading (ann 05, sam 01) are" in err, err
    assert "lost worker tcp://c:1 (it died or was stopped): the notebooks it was grading are" in err, err
    assert members.lost == ["tcp://a:1", "tcp://b:1", "tcp://c:1"]


def test_a_worker_that_refused_and_left_does_not_stop_the_wait_for_one(capsys):
    """A reviewer's: once any worker had refused, losing every good worker skipped the wait (the refused one was
    still counted, though gone)."""
    client = _FakeClient({"tcp://a:1": (1, ""), "tcp://r:1": (1, "it has another course")})
    members = grading_cluster._Membership(client, None, False)
    members.refresh()
    client.workers = {}
    joined = threading.Timer(1.5, lambda: client.workers.update({"tcp://b:1": (1, "")}))
    joined.start()
    assert members.wait_for_one("tcp://10.0.0.1:8786", progress=True, wait_s=120)
    assert members.good == ["tcp://b:1"] and members.refused == {}


def test_a_cluster_with_no_worker_waits_for_one_then_says_what_to_start(capsys):
    members = grading_cluster._Membership(_FakeClient({}), None, False)
    assert not members.wait_for_one("tcp://10.0.0.1:8786", progress=True, wait_s=0)
    client = _FakeClient({})
    members = grading_cluster._Membership(client, None, False)
    joined = threading.Timer(1.5, lambda: client.workers.update({"tcp://a:1": (1, "")}))
    joined.start()
    assert members.wait_for_one("tcp://10.0.0.1:8786", progress=True, wait_s=120)
    assert f"`{Path(sys.executable).parent / 'dask'} worker tcp://10.0.0.1:8786 --nthreads 1`" in capsys.readouterr().err


def test_cli_checks_the_gateway_arguments():
    from course_tools.cli import UsageError, _cluster_arguments

    class Args:
        scheduler = scheduler_file = tls_ca_file = tls_cert = tls_key = gateway_cluster = gateway_workers = None
        gateway = "http://127.0.0.1:8000"

    settings = _cluster_arguments(Args, ClusterSettings())
    assert settings.remote and settings.gateway == "http://127.0.0.1:8000" and settings.gateway_workers == 2
    Args.gateway_cluster, Args.gateway_workers = "abc123", 4
    assert (_cluster_arguments(Args, ClusterSettings()).gateway_cluster, _cluster_arguments(Args, ClusterSettings())
            .gateway_workers) == ("abc123", 4)
    Args.gateway = "gateway://127.0.0.1:8000"
    with pytest.raises(UsageError, match="http"):
        _cluster_arguments(Args, ClusterSettings())
    Args.gateway, Args.scheduler = "http://127.0.0.1:8000", "tcp://127.0.0.1:8786"
    with pytest.raises(UsageError, match="one of"):
        _cluster_arguments(Args, ClusterSettings())
    Args.gateway, Args.scheduler = None, None
    with pytest.raises(UsageError, match="--gateway URL"):
        _cluster_arguments(Args, ClusterSettings())


# --------------------------------------------------------------------------- on a LocalCluster
@pytest.mark.slow
def test_cluster_gives_the_same_grades_as_this_machine(course, local_cluster, tmp_path):
    cluster, _ = local_cluster
    root = tmp_path / "class"
    _class(root, {"ann": solved_notebook(course, A01), "ben": _mistake(course), "cat": '{"cells": [ broken'})
    here = grading.grade(root, _out(tmp_path / "here"), progress=False, workers=2)
    there = grading.grade(root, _out(tmp_path / "there"), progress=False, remote=grading_cluster.on_cluster(_on(cluster)))
    assert _table(there) == _table(here)
    by = {r.student_id: r for r in there}
    assert by["ann"].score == by["ann"].max_score == 17 and by["ben"].score == 16
    assert by["cat"].status is Status.UNREADABLE
    assert by["cat"].timestamp and by["cat"].timestamp == {r.student_id: r for r in here}["cat"].timestamp, by["cat"]
    rows = {r["student_id"]: r for r in csv.DictReader((tmp_path / "there" / "grades.csv").open())}
    assert rows["ben"]["score"] == "16" and rows["ann"]["sandbox"] == by["ann"].sandbox != ""
    assert (tmp_path / "there" / "feedback" / "ben" / f"{A01}.html").is_file()
    again = grading.grade(root, tmp_path / "there", progress=False, remote=grading_cluster.on_cluster(_on(cluster)))  # resumes: nothing regraded
    assert _table(again) == _table(there)


def test_the_bar_names_the_notebooks_the_workers_hold_and_for_how_long(course, local_cluster, tmp_path, monkeypatch,
                                                                       capsys):
    """A TA's class of 40: the bar moved only when a notebook finished, so it stood still for a minute at a time
    while two notebooks used their time limits, naming nobody (the one-machine route names who is graded)."""
    cluster, _ = local_cluster
    monkeypatch.setattr(grading_cluster, "TICK_S", 0.5)  # how often the bar is redrawn while nothing finishes
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course)})
    grading.grade(root, _out(tmp_path / "out"), progress=True, remote=grading_cluster.on_cluster(_on(cluster)))
    err = capsys.readouterr().err
    assert re.search(rf"now: sam {A01} \d+ s", err), err[-3000:]


def test_ctrl_c_on_the_cluster_keeps_what_the_workers_hold_and_hands_out_nothing_more(course, local_cluster,
                                                                                     tmp_path, capsys):
    """The README's Ctrl-C (no other notebook is started, the ones running finish and are kept): on the cluster the
    command left at once and dropped the notebooks the workers held. Now the first Ctrl-C hands out nothing more,
    waits for those, records them, and stops; the same command grades the rest, nothing twice."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Ctrl-C reaches the main thread only")
    cluster, client = local_cluster
    root = tmp_path / "class"
    others = [f"s{i:02d}" for i in range(12)]
    _class(root, {"abe": _slow(course), **{s: solved_notebook(course, A01) for s in others}})

    def press_ctrl_c_while_abe_is_graded():
        _kill_worker_grading(client, "abe", after=1.0, signal_to_send=None)
        os.kill(os.getpid(), signal.SIGINT)

    pressing = threading.Thread(target=press_ctrl_c_while_abe_is_graded, daemon=True)
    pressing.start()
    out = _out(tmp_path / "out")
    with pytest.raises(KeyboardInterrupt):
        grading.grade(root, out, progress=True, remote=grading_cluster.on_cluster(_on(cluster)))
    pressing.join(timeout=60)
    assert "stopping (Ctrl-C): no other notebook is handed to a worker" in capsys.readouterr().err
    kept = {path.parent.name for path in (out / "course" / "autograded").glob(f"*/{A01}")}
    assert "abe" in kept, kept  # the first handed out (names in order), held by a worker when Ctrl-C came: finished and recorded
    assert len(kept) < len(others) + 1, kept  # the rest were not handed out
    results = grading.grade(root, out, progress=False, remote=grading_cluster.on_cluster(_on(cluster)))
    assert {r.student_id: r.score for r in results} == {s: 17 for s in ["abe", *others]}


@pytest.mark.slow
def test_worker_killed_mid_notebook_is_graded_once_elsewhere(course, local_cluster, tmp_path, monkeypatch):
    cluster, client = local_cluster
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course)})
    recorded = []
    real = grading_cluster.record_judged
    monkeypatch.setattr(grading_cluster, "record_judged", lambda course, judged, *a: recorded.append(judged.student_id)
                        or real(course, judged, *a))
    thread, box = _grade_in_thread(root, _out(tmp_path / "out"), progress=False, remote=grading_cluster.on_cluster(_on(cluster, tries=3)))
    killed = _kill_worker_grading(client, "sam")
    results = _finished(thread, box)
    (sam,) = results
    assert sam.status is Status.OK and sam.score == sam.max_score == 17, (killed, sam)
    assert recorded == ["sam"]  # recorded once
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert [r["student_id"] for r in rows] == ["sam"]


@pytest.mark.slow
def test_notebook_whose_worker_keeps_dying_is_the_students_crash(course, local_cluster, tmp_path):
    cluster, client = local_cluster
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course)})
    thread, box = _grade_in_thread(root, _out(tmp_path / "out"), progress=False, remote=grading_cluster.on_cluster(_on(cluster, tries=1)))
    _kill_worker_grading(client, "sam", after=1.0)
    (sam,) = _finished(thread, box)
    assert sam.status is Status.CRASH and sam.score == 0 and sam.max_score == 17
    assert "died 1 times" in sam.detail
    saved = json.loads((tmp_path / "out" / "students" / "sam" / f"{A01}.json").read_text())
    assert saved["fingerprint"]  # the student's outcome: kept, not regraded by the next run


@pytest.mark.slow
def test_a_dead_worker_blames_only_the_notebook_it_was_grading(course, local_cluster, tmp_path):
    """With one try, one worker's death gave 8 of 10 students a saved crash: every notebook queued on it was blamed.
    The head now hands out one notebook per worker thread, so the others are graded as usual."""
    cluster, client = local_cluster
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course), **{name: solved_notebook(course, A01) for name in ("ann", "ben", "cat", "dan")}})
    thread, box = _grade_in_thread(root, _out(tmp_path / "out"), progress=False,
                                   remote=grading_cluster.on_cluster(_on(cluster, tries=1)))
    _kill_worker_grading(client, "sam", after=1.0)
    by = {r.student_id: r for r in _finished(thread, box)}
    assert by["sam"].status is Status.CRASH and "died 1 times while it ran" in by["sam"].detail
    assert all(by[name].status is Status.OK and by[name].score == 17 for name in ("ann", "ben", "cat", "dan")), by


@pytest.mark.slow
def test_the_run_goes_on_when_every_worker_restarts(course, tmp_path):
    """Both workers killed at once come back at new addresses; the notebooks they held are graded there. (A cluster
    of its own: its nannies are left to restart what they can.)"""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env=WORKER_ENV) as cluster, Client(cluster) as client:
        _grade_while_every_worker_restarts(course, cluster, client, tmp_path)


def _grade_while_every_worker_restarts(course, cluster, client, tmp_path):
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course), "ann": solved_notebook(course, A01), "ben": _mistake(course)})
    thread, box = _grade_in_thread(root, _out(tmp_path / "out"), progress=False,
                                   remote=grading_cluster.on_cluster(_on(cluster, tries=3)))
    _kill_worker_grading(client, "sam", after=1.0)
    for pid in client.run(os.getpid, on_error="return").values():
        if isinstance(pid, int):
            os.kill(pid, signal.SIGKILL)
    by = {r.student_id: r for r in _finished(thread, box)}
    assert by["sam"].score == by["ann"].score == 17 and by["ben"].score == 16, by


@pytest.mark.slow
def test_a_run_that_loses_every_worker_ends_with_incidents_not_a_silent_wait(course, tmp_path, monkeypatch, capsys):
    """An instructor's walkthrough: every worker killed mid-run, none restarted; the bar stood still for minutes and
    `grade` never returned. It now waits for a worker as at the start, saying so, then records the notebooks not
    graded as the grader's incidents (graded by the next run). (A cluster of its own: it is emptied.)"""
    from distributed import Client, LocalCluster

    monkeypatch.setattr(grading_cluster, "STALLED_S", 1.0)
    monkeypatch.setattr(grading_cluster, "WAIT_FOR_WORKERS_S", 2.0)
    root = tmp_path / "class"
    _class(root, {"sam": _slow(course), "ann": solved_notebook(course, A01)})
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env=WORKER_ENV) as cluster, Client(cluster) as client:
        thread, box = _grade_in_thread(root, _out(tmp_path / "out"), progress=True,
                                       remote=grading_cluster.on_cluster(_on(cluster, tries=3)))
        _kill_worker_grading(client, "sam", after=0.5)  # its nanny restarts it: stopped for good below
        cluster.scale(0)
        results = _finished(thread, box)
    by = {r.student_id: r for r in results}
    assert by["sam"].status is Status.INCIDENT and "lost every worker that may grade during the run" in by["sam"].detail, by["sam"]
    assert all(r.status in (Status.INCIDENT, Status.OK) for r in results), by
    err = capsys.readouterr().err
    assert "cluster: lost worker" in err and "no worker that may grade left; waiting up to 2 s" in err, err[-2000:]
    assert "notebook(s) were left as grader incidents, graded by the next run" in err, err[-2000:]


@pytest.mark.slow
def test_workers_of_another_course_refuse_as_a_grader_incident(course, local_cluster, tmp_path, monkeypatch):
    cluster, _ = local_cluster
    root = tmp_path / "class"
    _class(root, {"ann": solved_notebook(course, A01)})
    real = grading_cluster.course_identity
    monkeypatch.setattr(grading_cluster, "course_identity",
                        lambda names, solutions=None: replace(real(names, solutions), solutions=((A01, "0" * 64),)))
    (ann,) = grading.grade(root, _out(tmp_path / "out"), progress=False, remote=grading_cluster.on_cluster(_on(cluster)))
    assert ann.status is Status.INCIDENT and "another course" in ann.detail and ann.score == 0
    assert ann.max_score == 17, ann  # out of the notebook's points, as everywhere else (was 0/0)
    saved = json.loads((tmp_path / "out" / "students" / "ann" / f"{A01}.json").read_text())
    assert saved["fingerprint"] == ""  # the grader's incident: the next run grades it again


@pytest.mark.slow
def test_a_notebook_the_head_cannot_record_is_an_error_and_the_class_goes_on(course, local_cluster, tmp_path,
                                                                            monkeypatch):
    """The head's own exception while recording one notebook (tried twice) is that notebook's
    "error", not saved as graded; the others are graded, and the next run grades it."""
    cluster, _ = local_cluster
    root = tmp_path / "class"
    _class(root, {"ann": solved_notebook(course, A01), "ben": _mistake(course)})
    real, tries = grading_cluster.record_judged, []

    def fails_for_ann(course, judged, *args):
        if judged.student_id == "ann":
            tries.append("ann")
            raise OSError("the disk went away")
        return real(course, judged, *args)

    monkeypatch.setattr(grading_cluster, "record_judged", fails_for_ann)
    by = {r.student_id: r for r in grading.grade(root, _out(tmp_path / "out"), progress=False,
                                                 remote=grading_cluster.on_cluster(_on(cluster)))}
    assert by["ann"].status is Status.ERROR and "2 times (OSError: the disk went away)" in by["ann"].detail, by["ann"]
    assert tries == ["ann", "ann"] and by["ben"].status is Status.OK and by["ben"].score == 16
    monkeypatch.undo()
    again = {r.student_id: r for r in grading.grade(root, tmp_path / "out", progress=False,
                                                    remote=grading_cluster.on_cluster(_on(cluster)))}
    assert again["ann"].status is Status.OK and again["ann"].score == 17 and again["ben"].score == 16


# --------------------------------------------------------------------------- TLS, `dask scheduler` / `dask worker`
def _openssl(*args, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _self_signed(folder) -> tuple[str, str, str]:
    """(CA, certificate, key): a CA made here, and one certificate it signed for 127.0.0.1."""
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=attention-course test CA", cwd=folder)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=127.0.0.1",
             cwd=folder)
    _openssl("x509", "-req", "-in", "req.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "cert.pem", "-days", "1", "-extfile", "san.ext", cwd=folder)
    return str(folder / "ca.pem"), str(folder / "cert.pem"), str(folder / "key.pem")


@pytest.mark.slow
def test_scheduler_with_tls_from_a_self_signed_ca(course, tmp_path):
    ca, cert, key = _self_signed(tmp_path)
    tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--protocol", "tls",
                               "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file",
                               str(scheduler_file), *tls], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)]
    try:
        address = _address_in(scheduler_file)
        assert address.startswith("tls://127.0.0.1:")
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                       "--no-dashboard", "--host", "127.0.0.1", *tls],
                                      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        root = tmp_path / "class"
        _class(root, {"ben": _mistake(course)})
        settings = ClusterSettings(scheduler=address, tls_ca_file=ca, tls_cert=cert, tls_key=key)
        _wait_for_workers(settings, 1)
        (ben,) = grading.grade(root, _out(tmp_path / "out"), progress=False, remote=grading_cluster.on_cluster(settings))
        assert ben.score == 16 and ben.status is Status.OK and ben.sandbox
        with pytest.raises(Exception):  # noqa: B017 - without the CA, no connection at all
            with grading_cluster.connected(replace(settings, tls_ca_file="", tls_cert="", tls_key="",
                                                   connect_seconds=5)) as client:
                client.run(os.getpid)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _address_in(scheduler_file, timeout: float = 60) -> str:
    """The address in the scheduler file `dask scheduler` writes (once it is whole)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            return json.loads(scheduler_file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise AssertionError(f"the scheduler wrote no address into {scheduler_file}")


def _wait_for_workers(settings: ClusterSettings, n: int, timeout: float = 120) -> None:
    with grading_cluster.connected(settings) as client:
        client.wait_for_workers(n, timeout=timeout)


# --------------------------------------------------------------------------- on a Dask Gateway
GATEWAY_CONFIG = """
import os
c = get_config()
c.DaskGateway.address = os.environ["ATTN_GATEWAY_API"]
c.Proxy.address = os.environ["ATTN_GATEWAY_PROXY"]
c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"  # clusters: local processes
c.ClusterConfig.scheduler_cmd = [os.environ["ATTN_GATEWAY_BIN"] + "/dask", "scheduler"]
c.ClusterConfig.worker_cmd = [os.environ["ATTN_GATEWAY_BIN"] + "/dask", "worker"]
c.ClusterConfig.worker_threads = 1
c.ClusterConfig.worker_memory = "4 G"
c.ClusterConfig.environment = {"ATTN_COURSE_ROOT": os.environ["ATTN_COURSE_ROOT"],
                               "PATH": os.environ["ATTN_GATEWAY_BIN"] + ":/usr/bin:/bin"}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A Dask Gateway server on 127.0.0.1 (its proxy's address yielded) whose clusters are local processes
    of this course's environment."""
    import requests

    folder = tmp_path_factory.mktemp("gateway")
    (folder / "config.py").write_text(GATEWAY_CONFIG)
    proxy = f"127.0.0.1:{free_port()}"
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "ATTN_GATEWAY_API": f"127.0.0.1:{free_port()}", "ATTN_GATEWAY_PROXY": proxy,
           "ATTN_GATEWAY_BIN": bin_dir, "ATTN_COURSE_ROOT": str(REPO)}
    log = folder / "gateway.log"
    proc = subprocess.Popen([os.path.join(bin_dir, "dask-gateway-server"), "-f", "config.py"], cwd=folder, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if requests.get(f"http://{proxy}/api/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield f"http://{proxy}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
# dask_gateway's Gateway.__del__ (also of the Gateway a GatewayCluster makes for itself) closes the client a
# second time, after its event loop has stopped, and distributed refuses that: a RuntimeError ignored in
# __del__ after a clean close, the library's, not the grade's
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_dask_gateway_cluster_gives_the_same_grades_and_is_shut_down(course, gateway, tmp_path):
    """`--gateway URL`: a cluster of two workers made for the run through the gateway (its scheduler
    reached over the gateway's TLS proxy), the same grades as this machine, and no cluster left after."""
    from dask_gateway import Gateway

    root = tmp_path / "class"
    _class(root, {"ann": solved_notebook(course, A01), "ben": _mistake(course)})
    here = grading.grade(root, _out(tmp_path / "here"), progress=False, workers=2)
    settings = ClusterSettings(gateway=gateway, gateway_workers=2)
    there = grading.grade(root, _out(tmp_path / "there"), progress=False, remote=grading_cluster.on_cluster(settings))
    assert _table(there) == _table(here)
    by = {r.student_id: r for r in there}
    assert by["ann"].score == 17 and by["ben"].score == 16 and by["ben"].sandbox
    with Gateway(gateway) as client:
        assert client.list_clusters() == [], "the cluster made for the run is shut down afterwards"
