"""The grader's settings: one object per concern, environment variables read at the edge only,
a bad value named with what to do, and nbgrader driven through its own configuration."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from autograder import plugins
from autograder.settings import GiB, GradingSettings, Limits, SettingError
from course_tools import cli

from .conftest import autograde, solved_notebook

A01 = "01_similarity_attention"
OVERRIDES = {"ATTN_CELL_TIMEOUT": "7", "ATTN_NOTEBOOK_TIMEOUT": "90", "ATTN_MEMORY_GB": "1.5",
             "ATTN_MAX_PROCESSES": "32", "ATTN_GRADE_WORKERS": "3"}


def test_defaults_are_written_in_one_place_and_overrides_apply():
    assert Limits() == Limits(cell_seconds=60, notebook_seconds=300, memory_bytes=6 * GiB, processes=256)
    assert GradingSettings.from_env({}) == GradingSettings()
    settings = GradingSettings.from_env(OVERRIDES)
    assert settings.limits == Limits(cell_seconds=7, notebook_seconds=90, memory_bytes=int(1.5 * GiB), processes=32)
    assert settings.workers == settings.worker_count == 3
    assert GradingSettings().worker_count >= 1
    assert GradingSettings().warm and not GradingSettings.from_env({"ATTN_WARM_SANDBOX": "0"}).warm


@pytest.mark.parametrize("name, value, says", [
    ("ATTN_CELL_TIMEOUT", "ten", "not a number of seconds"),
    ("ATTN_MEMORY_GB", "0", "at least 0.25 GiB"),
    ("ATTN_GRADE_WORKERS", "-2", "at least 0 workers"),
    ("ATTN_NOTEBOOK_TIMEOUT", "nan", "at least 1 seconds"),
    ("ATTN_WARM_SANDBOX", "sometimes", "set it to 1"),
])
def test_a_bad_value_is_named_with_what_to_do(name, value, says):
    with pytest.raises(SettingError, match=says) as err:
        GradingSettings.from_env({name: value})
    assert name in str(err.value) and repr(value) in str(err.value)


def test_the_command_line_refuses_a_bad_setting_before_any_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("ATTN_CELL_TIMEOUT", "soon")
    (tmp_path / "class").mkdir()
    assert cli.main(["grade", str(tmp_path / "class"), "--out", str(tmp_path / "out")]) == 2
    assert "ATTN_CELL_TIMEOUT='soon' is not a number of seconds" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_nothing_reads_the_environment_at_import():
    """Importing the grader with odd settings in the environment neither fails nor bakes them in:
    the defaults stay the defaults until the edge reads the overrides."""
    env = {"ATTN_CELL_TIMEOUT": "not-a-number", "ATTN_MEMORY_GB": "x", "PATH": "/usr/bin:/bin"}
    code = ("import autograder.grade, autograder.sandbox, autograder.selfcheck, autograder.plugins\n"
            "from autograder.settings import Limits\n"
            "assert Limits().cell_seconds == 60 and autograder.sandbox.Limits is Limits\n"
            "import warnings\n"
            "assert not any('not in session' in str(f[1] and f[1].pattern) for f in warnings.filters)\n"
            "print('ok')")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_grade_hands_its_verdicts_to_nbgrader_through_nbgraders_config(course, monkeypatch):
    """`attn-course grade` decides the verdicts first and gives nbgrader's TrustedVerdicts their
    file through nbgrader's configuration (never the process environment): the preprocessor must
    not fall back to running the notebook itself."""
    def must_not_run(self, nb, resources):
        raise AssertionError("TrustedVerdicts ran the notebook again: it did not get the verdicts file")

    monkeypatch.setattr(plugins.TrustedVerdicts, "_verdicts_now", must_not_run)
    monkeypatch.delenv("ATTN_VERDICTS", raising=False)
    result = autograde(course, A01, solved_notebook(course, A01))
    assert result.score == result.max_score == 17, result
    assert course.api.config.TrustedVerdicts.verdicts_file == ""  # reset after the notebook


def test_the_dead_sandbox_marker_is_gone():
    sandbox = importlib.import_module("autograder.sandbox")
    assert "ATTN_IN_SANDBOX" not in sandbox._sandbox_env("bubblewrap", 3, 4)
