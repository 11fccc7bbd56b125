"""The pip path (requirements.txt) and the conda path (environment.yml) pin the same versions."""
from __future__ import annotations

import re

from attention_course.build import REPO


def _pins(lines):
    return {m.group(1).lower(): m.group(2) for line in lines
            if (m := re.match(r"^\s*(?:-\s+)?([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line))}


def test_pip_and_conda_pin_the_same_versions():
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    yml = (REPO / "environment.yml").read_text()
    conda = _pins(yml.split("- pip:", 1)[1].splitlines())
    assert pip == conda
    assert pip["torch"] == "2.13.0"
    assert "python=3.11" in yml


def test_constraints_agree_with_direct_pins():
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    constraints = _pins((REPO / "constraints.txt").read_text().splitlines())
    assert "torch" not in constraints, "torch is pinned once, in requirements.txt"
    for name, version in pip.items():
        if name in constraints:
            assert constraints[name] == version, f"{name}: requirements {version} vs constraints {constraints[name]}"


def test_every_pin_is_exact():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-c")):
            assert "==" in line, f"unpinned requirement: {line}"


def test_readme_results_table_is_generated_from_the_results_file():
    from attention_course.results import RESULTS_FILE, table

    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- results table: generated -->\n", 1)[1].split("<!-- end results table -->", 1)[0]
    assert block == table(RESULTS_FILE), "README's results table is stale: regenerate it with python -m attention_course.results"
