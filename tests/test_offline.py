"""`make test` on a machine without Multi30k: notebook 06, executed top to bottom by nbval as the
suite does, with no mirror, an empty cache and its own runs folder. Its data cell falls back to the
toy corpus with a message (or downloads, where a network exists) and every cell still runs."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .layout import REPO

pytestmark = pytest.mark.slow

NB06 = REPO / "solutions" / "06_transformer_translator" / "06_transformer_translator.ipynb"


def test_notebook_06_runs_without_multi30k(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ATTN_MULTI30K_MIRROR"}
    env.update(ATTN_DATA_CACHE=str(tmp_path / "cache"), ATTN_RUNS_DIR=str(tmp_path / "runs"))
    done = subprocess.run([sys.executable, "-m", "pytest", str(NB06), "-q", "-p", "no:cacheprovider",
                           "--nbval-lax", "--nbval-cell-timeout=300", "-o", "testpaths=", "-o", "addopts="],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert "passed" in last and "failed" not in last, done.stdout[-1000:]
