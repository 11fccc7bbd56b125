"""`make hub-e2e` (issue 26): the course on a real JupyterHub on 127.0.0.1 with local users, driven
through the hub's and nbgrader's own interfaces, from release to the feedback a student fetches.
It needs root (local users, a hub that starts servers as them): CI runs it as root."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .layout import REPO


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="make hub-e2e creates local users and runs JupyterHub as root")
def test_make_hub_e2e_grades_the_class_through_the_hub():
    done = subprocess.run([sys.executable, "-m", "course_tools.hub_e2e"], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "hub-e2e: graded 2 students", output[-3000:]
    assert any("attnhub-alice 17/17, attnhub-bob 15/17" in line for line in lines), output[-3000:]
    assert any("validated (FAIL: softmax without subtracting the max)" in line for line in lines), output[-3000:]
    for user in ("attnhub-teacher", "attnhub-alice", "attnhub-bob"):
        assert subprocess.run(["id", "-u", user], capture_output=True).returncode != 0, f"{user} was not removed"


def test_hub_e2e_refuses_to_run_without_root_and_says_why():
    if os.geteuid() == 0:
        command = ["runuser", "-u", "nobody", "--", sys.executable, "-m", "course_tools.hub_e2e"]
    else:
        command = [sys.executable, "-m", "course_tools.hub_e2e"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "needs root" in done.stderr, done.stdout + done.stderr
