"""Every grade right in every setup the README allows (issue 23): root or an ordinary user,
bubblewrap or the namespaces fallback (with the course's Python under /tmp), a PYTHONPATH naming
another copy of the library. Graded for real, each setup in a process of its own, run as the
user it names; `.ci/run` runs this file again as an ordinary user.

Metamorphic: each student's score in a class equals their score graded alone, whatever the setup
and the worker count. The attacks on each setup: tests/test_sandbox_attacks.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.outcomes import Status

from .layout import REPO
from .setups import (
    Setup,
    bwrap_env,
    class_of_three,
    is_root,
    kind_works,
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


@pytest.fixture(scope="module")
def class_folder():
    yield from class_of_three()


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
                  env=bwrap_env("wheel") if spec.get("wheel") else {})
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
        workers = 1 if "ordinary" in name else 2
        out = base / "out"
        # with another copy, run from outside the checkout, as `attn-course` runs: a `python -c` started in the
        # checkout has it first on its path, and PYTHONPATH's copy would never be the one imported
        found = run_as(user, GRADE_CLASS.format(submissions=str(folder / "submissions"), out=str(out),
                                                workers=workers),
                       sandbox=setup.sandbox, python=setup.python, pythonpath=setup.pythonpath, env=setup.env,
                       cwd=base if setup.pythonpath else REPO)
        if made_leftover:
            leftover.rmdir()
        assert found["sandbox"].startswith(setup.sandbox), found
        assert "ATTN_BWRAP" not in setup.env or setup.env["ATTN_BWRAP"] in found["bwrap"], found
        assert found["scores"] == alone, f"{setup}: {found}"
        assert set(found["status"].values()) == {Status.OK.value}, found["status"]

    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_attn_course_check_takes_its_references_from_its_own_library_not_pythonpaths(class_folder):
    """`attn-course check` as a student or an instructor runs it (the installed command, from outside the
    checkout) with PYTHONPATH naming a stale copy of the library: the solved notebook keeps full marks.
    That copy used to supply the expected values: 12 / 17, and nothing said why."""
    _, paths = class_folder
    base = scratch_dir()
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("ATTN_COURSE_ROOT", "PYTHONPATH")}
        env["PYTHONPATH"] = other_library_copy(base)
        command = [str(Path(sys.executable).parent / "attn-course"), "--course", str(REPO), "check", str(paths["solved"])]
        done = subprocess.run(command, capture_output=True, text=True, cwd=base, env=env, timeout=600)
        assert done.returncode == 0 and "17 / 17 points" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        # imported from PYTHONPATH before the grader: the grader's import puts its own in its place
        probe = "import attention_course, autograder\nimport attention_course as again\nprint(again.__file__)"
        where = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=base, env=env)
        assert where.stdout.strip() == str(REPO / "attention_course" / "__init__.py"), where.stdout + where.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


STALE_GRADER = '''

def main(argv=None):  # a stale checkout's grader: whatever it would say, it is not this course's
    print("graded by a stale checkout")
    return 3
'''


def test_attn_course_runs_its_own_course_whatever_checkout_pythonpath_names(class_folder):
    """A whole second checkout named on PYTHONPATH (an older term's, left in a shell's profile) supplied
    the entire grader: its cli, its checks, its references, silently. The course's environment (its
    sitecustomize, which `make venv` installs) leaves such a folder out of `attn-course`, says so, and
    keeps it from the command's children; a plain `python` still honours PYTHONPATH."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip("only the Makefile's .venv has the course's sitecustomize; this Python is another environment")
    _, paths = class_folder
    base = scratch_dir()
    try:
        other = base / "older-checkout"
        for package in ("course_tools", "autograder", "attention_course"):
            shutil.copytree(REPO / package, other / package, ignore=shutil.ignore_patterns("__pycache__"))
        cli = other / "course_tools" / "cli.py"
        cli.write_text(cli.read_text() + STALE_GRADER)
        env = {k: v for k, v in os.environ.items() if k not in ("ATTN_COURSE_ROOT", "PYTHONPATH")}
        env["PYTHONPATH"] = os.pathsep.join([str(other), str(base / "elsewhere")])
        command = [str(Path(sys.executable).parent / "attn-course"), "--course", str(REPO), "check", str(paths["solved"])]
        done = subprocess.run(command, capture_output=True, text=True, cwd=base, env=env, timeout=600)
        assert done.returncode == 0 and "17 / 17 points" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
        assert "stale" not in done.stdout
        assert f"PYTHONPATH names another copy of the course, {other.resolve()}: left out" in done.stderr, done.stderr
        plain = subprocess.run([sys.executable, "-c", "import course_tools; print(course_tools.__file__)"],
                               capture_output=True, text=True, cwd=base, env=env)
        assert plain.stdout.strip() == str(other / "course_tools" / "__init__.py"), plain.stdout + plain.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
