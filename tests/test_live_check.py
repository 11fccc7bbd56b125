"""`check()` from inside a notebook, as on Colab: the live notebook's JSON (Colab's notebook is no
file on the machine) goes to `attn-course check -`, the same check as the terminal's; without a
sandbox it runs anyway and says so. Colab's front end is simulated by a stand-in for
`google.colab._message` that answers `get_ipynb` as Colab does ({"ipynb": the notebook})."""
from __future__ import annotations

import json
import subprocess
import sys
import types

import nbformat
import pytest

from autograder import selfcheck
from course_tools import live

from .conftest import inject, solved_notebook

pytestmark = pytest.mark.slow

A01 = "01_similarity_attention"
WRONG_SOFTMAX = "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(selfcheck.CACHE_ENV, str(tmp_path / "check-cache"))


@pytest.fixture
def colab(monkeypatch, course):
    """A stand-in for Colab's front end holding notebook 01 with softmax's typical mistake, unsaved
    and nameless (as a notebook opened from a link can be)."""
    nb = inject(solved_notebook(course, A01), {"softmax": WRONG_SOFTMAX})
    asked = []

    def blocking_request(kind, request="", timeout_sec=None):
        asked.append(kind)
        return {"ipynb": json.loads(nbformat.writes(nb))}

    message = types.ModuleType("google.colab._message")
    message.blocking_request = blocking_request
    colab_pkg = types.ModuleType("google.colab")
    colab_pkg._message = message
    google = types.ModuleType("google")
    google.colab = colab_pkg
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab_pkg)
    monkeypatch.setitem(sys.modules, "google.colab._message", message)
    return asked


def test_check_in_colab_reads_the_live_notebook_and_grades_it(colab, cache, capsys):
    assert live.check() == 1
    out = capsys.readouterr().out
    assert colab == ["get_ipynb"]
    assert out.startswith("checking this Colab notebook, as it is now (saved or not)")
    assert f"{A01}: 15 / 17 points" in out and "FAIL  softmax" in out and "PASS  normalize_rows" in out, out
    assert "softmax without subtracting the max" in out


def test_check_one_exercise_shows_only_its_lines(colab, cache, capsys):
    live.check("softmax")
    out = capsys.readouterr().out
    assert "FAIL  softmax" in out and "normalize_rows" not in out, out
    live.check("no_such_exercise")
    assert "(no exercise called 'no_such_exercise' in this notebook)" in capsys.readouterr().out


def test_without_a_sandbox_the_check_runs_and_says_so(colab, cache, capsys, monkeypatch):
    monkeypatch.setenv("ATTN_SANDBOX", "none")
    assert live.check() == 1
    out = capsys.readouterr().out
    assert "FAIL  softmax" in out, out
    assert "note: checked without a sandbox here (disabled by ATTN_SANDBOX=none)" in out, out


def test_check_reads_the_notebook_json_on_standard_input_and_knows_it_by_its_cells(course, cache):
    nb = solved_notebook(course, A01)
    done = subprocess.run([sys.executable, "-m", "course_tools.cli", "check", "-", "--progress", "none"],
                          input=nbformat.writes(nb).encode(), capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().startswith(f"{A01}: 17 / 17 points")
    stray = nbformat.writes(nbformat.v4.new_notebook()).encode()
    done = subprocess.run([sys.executable, "-m", "course_tools.cli", "check", "-"], input=stray,
                          capture_output=True, check=False)
    assert done.returncode == 2 and "this notebook is not one of the course notebooks" in done.stderr.decode()
    done = subprocess.run([sys.executable, "-m", "course_tools.cli", "check", "-"], input=b'{"cells": [',
                          capture_output=True, check=False)  # cut off: the file is at fault, not its (absent) name
    said = done.stderr.decode()
    assert done.returncode == 2 and "cannot be read as a notebook: not valid JSON" in said and "save it again" in said


def test_in_jupyter_the_saved_file_named_by_the_server_is_checked(course, cache, tmp_path, capsys, monkeypatch):
    path = tmp_path / f"{A01}.ipynb"
    nbformat.write(solved_notebook(course, A01), path)
    monkeypatch.setenv("JPY_SESSION_NAME", str(path))
    assert live.check() == 0
    out = capsys.readouterr().out
    assert out.startswith(f"checking {A01}.ipynb as last saved (save first: Ctrl+S)") and "17 / 17" in out


def test_a_kernel_that_does_not_know_its_notebook_says_what_to_do(monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", None)  # not Colab: the import fails
    with pytest.raises(live.NoLiveNotebook, match=r"attn-course check PATH.ipynb"):
        live.check()
