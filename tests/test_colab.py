"""Colab, simulated as far as this machine allows (issue 25): the install cell under every notebook's
title does nothing off Colab; on a "Colab" (a google.colab module, a fresh Python environment, the
course published as a git repository with its tag) it clones and installs the course in one cell, and
the notebook can then check itself through Colab's live-notebook channel. The fp16 decision for
Colab's T4 is tested in test_precision.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from course_tools import colab
from course_tools.book.scrub import scrub_notebook

from .layout import REPO, SOLUTIONS

A01 = "01_similarity_attention"


def _run(code: str, cwd: Path, env: dict | None = None, python: str = sys.executable, timeout: int = 900):
    return subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _fake_colab(folder: Path, notebook: dict) -> Path:
    """A `google.colab` package whose front-end channel answers get_ipynb with `notebook`."""
    pkg = folder / "google" / "colab"
    pkg.mkdir(parents=True)
    (folder / "google" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (folder / "notebook.json").write_text(json.dumps(notebook))
    (pkg / "_message.py").write_text(textwrap.dedent(f"""\
        import json
        def blocking_request(kind, request="", timeout_sec=None):
            assert kind == "get_ipynb"
            return {{"ipynb": json.load(open({str(folder / "notebook.json")!r}))}}
        """))
    return folder


def test_every_notebook_carries_the_install_cell_under_its_title_student_and_solved():
    source = colab.install_source(*colab.published(REPO))
    for path in sorted(SOLUTIONS.glob("*/*.ipynb")):
        for nb_path in (path, REPO / "notebooks" / path.parent.name / path.name):
            nb = nbformat.read(nb_path, as_version=4)
            cells = [c for c in nb.cells if colab.is_install_cell(c)]
            assert len(cells) == 1 and nb.cells[1] is cells[0], f"{nb_path}: the install cell belongs under the title"
            assert cells[0].source == source, f"{nb_path}: stale install cell: run `make build`"
            assert not cells[0].get("outputs"), f"{nb_path}: the install cell printed something off Colab"


def test_the_cell_does_nothing_off_colab(tmp_path):
    cell = colab.install_source("someone/attention-course", "v0.1.0")
    code = ("import subprocess, os\n"
            "subprocess.run = lambda *a, **k: (_ for _ in ()).throw(AssertionError('ran ' + str(a)))\n"
            f"exec({cell!r})\n"
            "assert 'ATTN_COURSE_ROOT' not in os.environ\nprint('nothing done')")
    env = {k: v for k, v in os.environ.items() if k != "ATTN_COURSE_ROOT"}
    done = _run(code, tmp_path, env)
    assert done.returncode == 0 and done.stdout.strip() == "nothing done", done.stderr


def test_without_a_repository_the_cell_stops_on_colab_with_what_to_do(tmp_path):
    fake = _fake_colab(tmp_path / "fake", {})
    cell = colab.install_source("", "")
    env = {**{k: v for k, v in os.environ.items() if k != "ATTN_COURSE_ROOT"}, "PYTHONPATH": str(fake)}
    done = _run(f"import google.colab\nexec({cell!r})", tmp_path, env)
    assert done.returncode != 0 and "names no repository" in done.stderr and "published" in done.stderr
    assert "Upload the course folder yourself" in done.stderr and "pyproject.toml exists" in done.stderr


def test_without_a_repository_the_cell_installs_a_copy_the_learner_uploaded(tmp_path):
    """A self-learner with a zip of the course and no published repository: they upload it, and the cell
    installs that copy instead of stopping."""
    ran, root, _grader = _install_commands(tmp_path, colab.install_source("", ""), uploaded=True)
    assert root == str(tmp_path / "content" / "attention-course")
    assert "clone" not in str(ran) and f"{root}[grader]" in str(ran)  # installed, not cloned


def _install_commands(tmp_path: Path, cell: str, uploaded: bool) -> tuple[list[list[str]], str, str]:
    """The commands the install cell runs on a simulated Colab (none of them run), where the course is, and the
    Python that check() will grade with."""
    fake = _fake_colab(tmp_path / "fake", {})
    course, grader = tmp_path / "content" / "attention-course", tmp_path / "content" / "attention-grader"
    if uploaded:
        course.mkdir(parents=True)
        (course / "pyproject.toml").write_text("[project]\nname = 'attention-course'\n")
    cell = cell.replace(colab.COURSE_ON_COLAB, str(course)).replace(colab.GRADER_ON_COLAB, str(grader))
    site = tmp_path / "grader-site"
    site.mkdir()
    code = ("import json, os, subprocess\nran = []\n"
            "def run(cmd, **k):\n"
            "    ran.append(cmd)\n"
            f"    return subprocess.CompletedProcess(cmd, 0, stdout={str(site)!r} + '\\n')\n"
            "subprocess.run = run\n"
            f"import google.colab\nexec({cell!r})\n"
            "print(json.dumps([ran, os.environ['ATTN_COURSE_ROOT'], os.environ['ATTN_GRADER_PYTHON']]))")
    env = {**{k: v for k, v in os.environ.items() if k not in ("ATTN_COURSE_ROOT", "ATTN_GRADER_PYTHON")},
           "PYTHONPATH": str(fake)}
    done = _run(code, tmp_path, env)
    assert done.returncode == 0, done.stderr
    ran, root, python = json.loads(done.stdout.strip().splitlines()[-1])
    assert (site / "colab-packages.pth").is_file(), "the grader's environment sees the kernel's packages (torch)"
    return ran, root, python


def test_on_colab_the_kernel_gets_the_library_alone_and_the_grader_an_environment_of_its_own(tmp_path):
    """The grader extra's Jupyter (ipykernel 7, IPython 8, tornado 6.5) installed into Colab's running kernel replaced
    the versions Colab pins, which can crash the runtime (a reader's finding). The kernel's pip installs the library
    alone; the grader goes into a venv of its own, made without ensurepip, which check() then runs."""
    ran, root, python = _install_commands(tmp_path, colab.install_source("someone/attention-course", "v0.1.0"),
                                          uploaded=False)
    grader = str(tmp_path / "content" / "attention-grader")
    pips = [cmd for cmd in ran if cmd[1:3] == ["-m", "pip"]]
    assert pips[0][-2:] == ["-e", root], "the kernel's own pip installs the library, no extra"
    assert pips[1][3:5] == ["--python", f"{grader}/bin/python"] and pips[1][-1] == f"{root}[grader]"
    assert ["-m", "venv", "--without-pip", grader] == next(cmd for cmd in ran if "venv" in cmd)[1:]
    assert python == f"{grader}/bin/python"


def test_check_runs_the_grader_with_the_python_the_install_cell_named(tmp_path, monkeypatch):
    from course_tools import live

    seen = []
    monkeypatch.setenv(live.GRADER_PYTHON, "/content/attention-grader/bin/python")
    monkeypatch.setattr(live.subprocess, "run", lambda cmd, **k: seen.append(cmd) or
                        subprocess.CompletedProcess(cmd, 0, stdout=b"notebook: 17/17\n", stderr=b""))
    nb = tmp_path / "n.ipynb"
    nb.write_text("{}")
    assert live.check(path=nb) == 0 and seen[0][0] == "/content/attention-grader/bin/python"


def test_the_book_leaves_the_install_cell_out():
    nb = nbformat.read(SOLUTIONS / A01 / f"{A01}.ipynb", as_version=4)
    assert any(colab.is_install_cell(c) for c in nb.cells)
    assert not any("google.colab" in c.source for c in scrub_notebook(nb).cells)


def test_the_grader_skips_the_unedited_install_cell_and_reads_an_edited_one_as_the_students():
    """Unedited, it is the course's (it starts pip): not run, not scanned, and the cells keep their
    numbers. A student's code put into it is run and read like any other cell's."""
    from autograder import honesty, trusted

    source = nbformat.read(SOLUTIONS / A01 / f"{A01}.ipynb", as_version=4)
    student = nbformat.read(REPO / "notebooks" / A01 / f"{A01}.ipynb", as_version=4)
    tests = trusted.test_cells(source)
    from autograder.checks import nb01

    rules = honesty.rules_for_exercises(nb01.check.exercises.values())
    job = trusted.build_job(trusted.normalize_submission(student, source), tests)
    assert not any("google.colab" in s for s in job.sources)
    assert not any("google.colab" in c.get("source", "") for c in job.cells)
    assert job.positions[0] == 3, "the first code cell after the install cell is still cell 3"
    [cell] = [c for c in student.cells if colab.is_install_cell(c)]
    cell.source += "\nimport subprocess; subprocess.run(['true'])\n"
    edited = trusted.build_job(trusted.normalize_submission(student, source), tests)
    assert sum("google.colab" in c.get("source", "") for c in edited.cells) == 1
    assert any(f.cell == 0 and "subprocess" in f.reason for f in honesty.scan(edited.sources, rules))


@pytest.mark.parametrize("saved_as", [
    lambda text: text.replace("\n", "\r\n"),                                # an editor on Windows
    lambda text: "\n".join(line + "  " for line in text.split("\n")) + "\n\n",  # trailing spaces, a last empty line
], ids=["CRLF line endings", "trailing whitespace"])
def test_the_install_cell_saved_with_other_line_endings_is_still_the_courses(saved_as):
    """An unedited install cell whose lines were only re-ended by an editor was the student's code, and was
    flagged for review (it starts pip)."""
    from autograder import trusted

    source = nbformat.read(SOLUTIONS / A01 / f"{A01}.ipynb", as_version=4)
    student = nbformat.read(REPO / "notebooks" / A01 / f"{A01}.ipynb", as_version=4)
    [cell] = [c for c in student.cells if colab.is_install_cell(c)]
    cell.source = saved_as(cell.source)
    job = trusted.build_job(trusted.normalize_submission(student, source), trusted.test_cells(source))
    assert not any("google.colab" in s for s in job.sources)


def test_a_moved_or_stale_cell_is_replaced_once():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Title"), nbformat.v4.new_code_cell("x = 1")])
    assert colab.with_install_cell(nb, "old")
    nb.cells.append(nb.cells.pop(1))                                     # moved to the end, and stale
    assert colab.with_install_cell(nb, "new") and not colab.with_install_cell(nb, "new")
    assert [c.source for c in nb.cells] == ["# Title", "new", "x = 1"]


@pytest.mark.slow
def test_on_a_simulated_colab_one_cell_installs_the_course_and_the_notebook_checks_itself(tmp_path):
    # the course, published: a git repository with the release tag, reached by URL
    origin = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", str(REPO), str(origin)], check=True, timeout=300)
    subprocess.run(["git", "--git-dir", str(origin), "tag", "-f", "v0.1.0", "HEAD"], check=True, capture_output=True)
    content = tmp_path / "content"
    content.mkdir()
    course = content / "attention-course"
    cell = colab.install_source("someone/attention-course", "v0.1.0")
    grader = content / "attention-grader"
    for real, here in (("https://github.com/someone/attention-course", f"file://{origin}"),
                       (colab.COURSE_ON_COLAB, str(course)), (colab.GRADER_ON_COLAB, str(grader))):
        assert cell.count(repr(real)) == 1, real
        cell = cell.replace(repr(real), repr(here))

    # a fresh Python with the course's dependencies already there (as Colab has torch and numpy), offline
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(_run("import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path, python=str(python))
                .stdout.strip())
    ours = _run("import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path).stdout.strip()
    (site / "dependencies.pth").write_text(ours + "\n")

    solved = json.loads((SOLUTIONS / A01 / f"{A01}.ipynb").read_text())
    fake = _fake_colab(tmp_path / "fake", solved)
    env = {k: v for k, v in os.environ.items() if k not in ("ATTN_COURSE_ROOT", "ATTN_GRADER_PYTHON", "VIRTUAL_ENV")}
    env.update(PYTHONPATH=str(fake), PIP_NO_INDEX="1",
               PIP_NO_BUILD_ISOLATION="0")  # pip reads this one inverted: "0" turns build isolation off
    kernel = (f"import google.colab, sys\nexec({cell!r})\n"
              "import attention_course, course_tools\n"
              "print('library', attention_course.__file__)\n"
              "from course_tools.live import check\n"
              "sys.exit(check('softmax'))\n")
    done = _run(kernel, content, env, python=str(python), timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"library {course}/attention_course/__init__.py" in done.stdout, done.stdout
    assert "this Colab notebook" in done.stdout and "PASS" in done.stdout and "softmax" in done.stdout, done.stdout
    assert (course / "solutions" / A01).is_dir() and (course / "models" / "gpu.en-de").is_dir()
    kernel_site = sorted(p.name for p in site.iterdir() if not p.name.startswith(("__pycache__", "dependencies")))
    assert all("attention_course" in name for name in kernel_site), kernel_site  # the library alone, nothing else
    assert (grader / "bin" / "python").is_file()


@pytest.mark.parametrize("release", range(len(colab._EARLIER_TEMPLATES)))
def test_an_earlier_releases_install_cell_unedited_is_still_the_courses(release):
    """A student who fetched the notebooks before the course changed its install cell hands in the earlier cell,
    unedited: it was read as the student's code and sent to review (it starts pip). Earlier releases' cells are
    known by their digests, kept in the install cell's metadata by the build."""
    from autograder import trusted

    source = nbformat.read(SOLUTIONS / A01 / f"{A01}.ipynb", as_version=4)
    student = nbformat.read(REPO / "notebooks" / A01 / f"{A01}.ipynb", as_version=4)
    [cell] = [c for c in student.cells if colab.is_install_cell(c)]
    cell.source = colab.install_source(*colab.published(REPO), template=colab._EARLIER_TEMPLATES[release])
    assert cell.source != colab.install_source(*colab.published(REPO))
    job = trusted.build_job(trusted.normalize_submission(student, source), trusted.test_cells(source))
    assert not any("google.colab" in s for s in job.sources)
    cell.source += "\nprint('mine')\n"  # edited: the student's
    edited = trusted.build_job(trusted.normalize_submission(student, source), trusted.test_cells(source))
    assert sum("google.colab" in c.get("source", "") for c in edited.cells) == 1
