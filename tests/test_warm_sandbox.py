"""Warm sandboxes (autograder/warm_sandbox.py, autograder/forkserver.py): notebook runs forked from
one bubblewrap fork server per assignment, with torch, numpy, matplotlib and IPython imported once.

A fork server outlives the runs it serves, so these tests attack what a fresh sandbox never had to
defend: a run reaching the server or the next student's run (files, sockets, IPC, processes left
behind, the server's memory, signals), and a server that dies. Every probe runs for real in
bubblewrap; what it saw comes back as the value of a check, through the grader's own channel.
"""
from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace

import cloudpickle
import pytest

from autograder import sandbox, serialize, warm_sandbox
from autograder.checks.core import Case, Exercise
from autograder.grade import world_for
from autograder.sandbox import Limits, make_kit, run_notebook_job

from .layout import SOLUTIONS
from .setups import class_of_three

A01 = "01_similarity_attention"
LIMITS = Limits(cell_seconds=30, notebook_seconds=120)

pytestmark = pytest.mark.skipif(sandbox.isolation_mode() != "bubblewrap", reason="warm sandboxes need bubblewrap")

# What a run sees of itself and of the world around it (a code cell), read back by the check `seen`.
PROBE = r'''
import ctypes, json, os, socket, stat
_seen = {"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(), "pid": os.getpid(),
         "forked": b"autograder.forkserver" in open("/proc/self/cmdline", "rb").read(),
         "env": {k: os.environ.get(k) for k in ("HOME", "TMPDIR", "PYTHONPATH", "MPLCONFIGDIR", "USER")}}
_seen["status"] = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status")
                   if l.startswith(("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Uid", "Gid"))}
_seen["writable"] = sorted({l.split()[4] for l in open("/proc/self/mountinfo") if l.split()[5].startswith("rw")})
_seen["files"] = {d: sorted(os.listdir(d)) for d in ("/tmp", "/tmp/job", "/tmp/home", "/dev/shm") if os.path.isdir(d)}
_mine = {str(os.getpid())}  # this process, in the /proc it was given
with open("/proc/self/stat") as fh:
    _mine = {fh.read().split()[0]}
_seen["reachable"] = []  # other processes whose memory or files this run can open
_seen["visible"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for p in _seen["visible"]:
    if str(p) in _mine:
        continue
    for what, how in (("mem", "r+b"), ("environ", "rb")):
        try:
            open(f"/proc/{p}/{what}", how).close()
            _seen["reachable"].append(f"{p}/{what}")
        except OSError:
            pass
    try:
        os.listdir(f"/proc/{p}/root/")
        _seen["reachable"].append(f"{p}/root")
    except OSError:
        pass
_seen["signalled"] = []  # processes this run can signal, by the numbers of its own PID namespace
for p in range(1, 400):
    try:
        os.kill(p, 0)
        _seen["signalled"].append(p)
    except OSError:
        pass
try:
    socket.socket(socket.AF_UNIX).connect("\0attn-warm-probe")
    _seen["socket"] = "connected"
except OSError as err:
    _seen["socket"] = type(err).__name__
_seen["sysv"] = ctypes.CDLL(None).shmget(0x4242, 0, 0)  # -1: no such segment
try:  # the scheduler's group of this run's session (kernels with autogroup): its nice
    _seen["autogroup"] = open("/proc/self/autogroup").read().split("nice")[1].strip()
except (OSError, IndexError):
    _seen["autogroup"] = None
import numpy
_seen["numpy_sum"] = numpy.sum([1, 2, 3]) == 6 and getattr(numpy.sum, "__name__", "") == "sum"

def seen():
    return json.dumps(_seen)
'''

# What a hostile run leaves behind for the next one, and how it goes after the fork server.
LEAVE_BEHIND = r'''
import ctypes, os, signal, socket, time
for d in ("/tmp", "/tmp/job", "/tmp/home", "/dev/shm"):
    with open(os.path.join(d, "planted.py"), "w") as fh:
        fh.write("PLANTED = True\n")
_listener = socket.socket(socket.AF_UNIX)
_listener.bind("\0attn-warm-probe")
_listener.listen()
ctypes.CDLL(None).shmget(0x4242, 4096, 0o1666)
import numpy
numpy.sum = lambda *a, **k: 0  # monkeypatched for whoever comes next
attacks = []
try:  # the slowest share of the CPU for this session's scheduler group: this run's own, only
    open("/proc/self/autogroup", "w").write("19")
except OSError:
    pass
for _target in ("oom_score_adj", "autogroup"):  # the server's own /proc files (owned by root outside)
    try:
        open(f"/proc/1/{_target}", "w").write("1000" if _target == "oom_score_adj" else "19")
        attacks.append(f"wrote 1/{_target}")
    except OSError:
        pass
with open("/proc/self/stat") as fh:
    _me = int(fh.read().split()[0])  # this process, as the /proc it was given numbers it
for p in [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != _me]:  # the server, the guard, the init
    try:
        with open(f"/proc/{p}/mem", "r+b") as fh:
            attacks.append(f"opened {p}/mem")
    except OSError:
        pass
if os.fork() == 0:  # a daemon waiting for the next student, out of the notebook's session if it may leave it
    try:
        try:
            os.setsid()
        except OSError:
            pass  # refused (the runner's filter): it stays in the run's session and waits there
        if os.fork() == 0:
            _keep = _listener
            time.sleep(600)
    finally:
        os._exit(0)  # never back into the runner's code: a forked copy of it would report this run's cells
for p in range(1, 400):
    if p != os.getpid():
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(p, sig)
            except OSError:
                pass

def seen():
    return "; ".join(attacks)
'''


def _inputs(code: str) -> dict:
    exercise = Exercise(name="seen", reference=None, cases=lambda rng: [])
    checks = {"seen": {"exercise": exercise, "cases": [Case("what the run saw", run=lambda impl: impl())]}}
    cells = [{"kind": "code", "source": code},
             {"kind": "record", "test": "t", "checks": [{"name": "seen", "variable": "seen"}]}]
    return {"cells": cells, "skip": [], "cell_timeout": LIMITS.cell_seconds, "checks": cloudpickle.dumps(checks)}


def _seen(result) -> str:
    outcome = serialize.loads(result.results[1])["seen"][0]
    assert outcome[0] == "value", f"the probe failed in the sandbox: {outcome}"
    return outcome[1]


@pytest.fixture
def world(tmp_path):
    source = SOLUTIONS / A01 / f"{A01}.ipynb"
    return world_for(source, tmp_path / "job", make_kit(tmp_path / "kit"), [])


@pytest.fixture
def pool():
    """A pool of this test's own (not the suite's), so the server is the one the test looks at."""
    pool = warm_sandbox.Pool(2, background=False)
    yield pool
    pool.close()


def _run(world, tmp_path, code: str, warm=None):
    return run_notebook_job(tmp_path / "job", _inputs(code), world, LIMITS, warm=warm)


def test_a_warm_run_gets_the_world_a_fresh_sandbox_gives(world, tmp_path, pool):
    fresh = json.loads(_seen(_run(world, tmp_path, PROBE)))
    warm = json.loads(_seen(_run(world, tmp_path, PROBE, pool)))
    assert warm["forked"] and not fresh["forked"], "the run did not come from a fork server"
    assert len(pool.idle) == 1
    for key in ("uid", "gid", "cwd", "env", "status", "writable", "files", "socket", "sysv", "numpy_sum"):
        assert warm[key] == fresh[key], f"{key}: warm {warm[key]!r}, fresh {fresh[key]!r}"
    assert warm["status"]["CapEff"] == warm["status"]["CapBnd"] == "0000000000000000"
    assert warm["status"]["NoNewPrivs"] == "1" and warm["uid"] == sandbox.SANDBOX_UID
    # It sees the fork server and its guard in /proc, but can open nothing of theirs, and signal
    # only what a fresh sandbox's runner can: its own PID namespace (its init, itself, its threads).
    assert warm["reachable"] == [], f"a warm run can open {warm['reachable']}"
    assert warm["signalled"] == fresh["signalled"] and warm["pid"] == fresh["pid"] == 2


def test_nothing_a_run_leaves_behind_reaches_the_next_run_and_the_server_survives(world, tmp_path, pool):
    attacks = _seen(_run(world, tmp_path, LEAVE_BEHIND, pool))
    assert attacks == "", f"a run reached another process's memory: {attacks}"
    server = pool.idle[0]
    assert server.alive(), "a run stopped or killed its fork server"
    after = json.loads(_seen(_run(world, tmp_path, PROBE, pool)))
    assert after["forked"] and pool.idle == [server], "the second run did not come from the same fork server"
    assert after["files"] == {"/tmp": ["home", "job"], "/tmp/job": ["stderr.txt", "stdout.txt"],
                              "/tmp/home": [".ipython"], "/dev/shm": []}, after["files"]
    assert after["socket"] == "ConnectionRefusedError", "the first run's daemon is still listening"
    assert after["sysv"] == -1, "the first run's shared memory segment is still there"
    assert after["numpy_sum"] is True, "the first run's monkeypatch reached the next run"
    assert after["autogroup"] in (None, "0"), f"the first run's nice reached the next run: {after['autogroup']}"
    assert after["visible"] == sorted(after["visible"]) and len(after["visible"]) == 4, \
        f"processes besides the server, the guard, the init and the run: {after['visible']}"


def test_a_server_that_dies_mid_run_is_the_graders_problem_the_run_is_done_fresh(world, tmp_path, pool):
    _run(world, tmp_path, PROBE, pool)
    server = pool.idle[0]
    code = "import time\ntime.sleep(3)\n" + PROBE
    killer = __import__("threading").Timer(1.5, lambda: os.killpg(server.proc.pid, signal.SIGKILL))
    killer.start()
    result = _run(world, tmp_path, code, pool)
    killer.join()
    assert result.finished and result.incidents == [], result.incidents
    assert json.loads(_seen(result))["forked"] is False, "the run was not done again in a fresh sandbox"
    assert not server.alive()


def test_a_server_that_cannot_start_leaves_every_run_fresh(world, tmp_path, pool, monkeypatch):
    # without the kit on its path, the server's `python -m autograder.forkserver` cannot start
    monkeypatch.setattr(sandbox, "server_env", lambda world: {"PATH": os.environ.get("PATH", "/usr/bin")})
    result = _run(world, tmp_path, PROBE, pool)
    assert result.finished and result.incidents == []
    assert json.loads(_seen(result))["forked"] is False
    assert pool.cold and not pool.idle, "the pool did not note that this world runs fresh"


def test_waiting_for_a_server_to_start_is_never_the_notebooks_time(world, tmp_path, pool, monkeypatch):
    """A pool that waits for its servers (the suite's, background=False) starts this world's server
    before the run's clocks: a server slower to start than the notebook may run costs it nothing.
    The slow start is a clock moved forward (no sleep), the limit far above the run's real time."""
    limits = replace(LIMITS, notebook_seconds=600)
    real_init, real_monotonic, skipped = warm_sandbox.ForkServer.__init__, time.monotonic, [0.0]

    def slow_start(self, *args):
        skipped[0] += limits.notebook_seconds + 1  # the server "takes" longer than the notebook may run
        real_init(self, *args)

    monkeypatch.setattr(sandbox.time, "monotonic", lambda: real_monotonic() + skipped[0])
    monkeypatch.setattr(warm_sandbox.ForkServer, "__init__", slow_start)
    result = run_notebook_job(tmp_path / "job", _inputs(PROBE), world, limits, warm=pool)
    assert skipped[0] > 0, "no server started for this run"
    assert result.seconds < limits.notebook_seconds, f"the server's start counted as the notebook's: {result.seconds:.0f} s"
    assert result.finished and result.incidents == [], result.incidents
    assert json.loads(_seen(result))["forked"] is True, "the run did not fork from the server it waited for"


def test_a_class_graded_warm_gets_the_grades_it_gets_fresh(tmp_path, monkeypatch):
    from autograder import grade as grading

    forks = []
    real_fork = warm_sandbox.ForkServer.fork
    monkeypatch.setattr(warm_sandbox.ForkServer, "fork", lambda self, *a: forks.append(1) or real_fork(self, *a))
    folders = class_of_three()
    folder, _ = next(folders)
    try:
        graded = {}
        for warm in (False, True):
            results = grading.grade(folder / "submissions", tmp_path / f"out-{warm}", progress=False, workers=2,
                                    assignments=[A01], warm=warm)
            graded[warm] = {r.student_id: (r.score, r.status, [(c.grade_id, c.score) for c in r.cells])
                            for r in results}
            assert len(forks) == (3 if warm else 0), f"warm={warm}: {len(forks)} runs forked from a server"
    finally:
        folders.close()
    assert graded[True] == graded[False]
    assert graded[True]["solved"][0] == 17 and graded[True]["blank"][0] == 0
    assert 0 < graded[True]["mistake"][0] < 17


def test_a_run_that_kills_its_process_group_ends_only_itself(world, tmp_path, pool, capsys):
    """kill(0) reaches the caller's process group, whatever the PID namespace: the run's own, never
    its guard's (which would make the run look like the server's failure, to be done again)."""
    inputs = _inputs(PROBE)
    inputs["cells"].insert(0, {"kind": "code", "source": "import os, signal\nos.kill(0, signal.SIGKILL)"})
    result = run_notebook_job(tmp_path / "job", inputs, world, LIMITS, warm=pool)
    assert [(x.cell, x.kind) for x in result.incidents] == [(0, "memory")], result.incidents
    outcome = serialize.loads(result.results[2])["seen"][0]
    assert json.loads(outcome[1])["forked"] is True
    assert "done again in a fresh sandbox" not in capsys.readouterr().err
    assert pool.idle and pool.idle[0].alive()


def test_in_the_background_a_run_starts_fresh_while_its_server_starts(world, tmp_path):
    """`attn-course grade`'s pool: a class of one never waits for a server's imports."""
    pool = warm_sandbox.Pool(2)
    try:
        first = json.loads(_seen(_run(world, tmp_path, PROBE, pool)))
        assert first["forked"] is False and (pool.starting or pool.idle)
        pool.starter.submit(lambda: None).result()  # the server's start is done (one starter thread)
        second = json.loads(_seen(_run(world, tmp_path, PROBE, pool)))
        assert second["forked"] is True and len(pool.idle) == 1
    finally:
        pool.close()
    assert not pool.idle and not pool.stubs.exists()


class _IdleServer:
    """Stands in for an idle fork server in the pool's bookkeeping."""
    def __init__(self):
        self.closed = False

    def alive(self) -> bool:
        return not self.closed

    def close(self) -> None:
        self.closed = True


def test_a_grading_run_inside_another_pool_gets_room_for_its_servers_while_it_lasts(monkeypatch):
    """The suite's pool keeps 4 servers; a class of 8 assignments graded inside it asks for 16
    (servers_for): without the room, each assignment's server was closed before the next student
    came back to it, and started again."""
    pool = warm_sandbox.Pool(2, background=False)
    servers = [_IdleServer() for _ in range(4)]
    try:
        with pool.widened(4):
            assert pool.limit == 4
            pool.idle.extend(servers)  # the four servers a grading run kept, least recently used first
        assert pool.limit == 2
        assert [s.closed for s in servers] == [True, True, False, False], "the least recently used two close"
        assert pool.idle == servers[2:]
        with pool.widened(1):
            assert pool.limit == 2, "a block never shrinks the pool"
        first, second = pool.widened(5), pool.widened(3)  # two threads' blocks that overlap, and end
        first.__enter__()                                  # in the order they began
        second.__enter__()
        assert pool.limit == 5
        first.__exit__(None, None, None)
        assert pool.limit == 3, "the block still running lost its room"
        second.__exit__(None, None, None)
        assert pool.limit == 2
    finally:
        pool.close()
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: "bubblewrap")  # a pool starts no server until used
    with warm_sandbox.warm_sandboxes(2, background=False) as outer:  # the suite's own pool, if it has one
        before = outer.limit
        with warm_sandbox.warm_sandboxes(before + 3) as inner:
            assert inner is outer and outer.limit == before + 3, "an inner block did not widen the pool it runs in"
        assert outer.limit == before


def test_grading_threads_start_their_students_at_different_assignments():
    from autograder.grade import staggered

    chosen = [f"0{i}" for i in range(1, 9)]
    orders = [staggered(chosen, chosen, slot, 2) for slot in range(4)]
    assert orders[0] == chosen and orders[1] == chosen[4:] + chosen[:4]
    assert orders[2] == orders[0] and orders[3] == orders[1], "a thread keeps its place"
    assert all(sorted(order) == chosen for order in orders), "every notebook is graded, once"
    assert staggered(["03", "07"], chosen, 1, 2) == ["07", "03"], "only the student's own notebooks, in the thread's turn"
    assert staggered(["01"], ["01"], 1, 3) == ["01"]
