"""A catalogue of hostile, broken and bizarre submissions of notebook 01, each with the outcome
a fair grader must produce. The tests grade all of them in one batch; `make grade`'s demo
class includes a few (DEMO).

Each entry builds a notebook from two honest ones — `solved` (every exercise right) and
`blank` (the release) — so the expectation is exact: a trick either changes nothing
(`score == full`, or `== 0` on top of the blank) or costs exactly the exercise it breaks.

Probes: some entries make `softmax` correct only if the sandbox held (e.g. the solutions could
not be read); a leak then shows up as lost points.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import nbformat

from autograder.outcomes import Status

ASSIGNMENT = "01_similarity_attention"
# softmax's cells (3 + 2): basic self-attention, built on it, is checked again with the course's softmax in its
# place and keeps its points (one refusal, one penalty)
SOFTMAX_POINTS = 5
DOT_POINTS = 1


@dataclass(frozen=True)
class Adversary:
    name: str
    what: str
    build: Callable[..., bytes]  # (solved, blank, paths) -> the submitted file's bytes
    expect: str  # "full", "zero", "full-minus:<points>"
    status: Status | None = None  # the status the notebook must end with (None: any)
    needs: str = ""  # "bubblewrap": only meaningful with the allow-list sandbox


def _nb(nb) -> bytes:
    return nbformat.writes(nb).encode()


def _cells_with(nb, code: str, before: str | None = None, at_end: bool = False):
    """A copy of `nb` with a code cell inserted before the solution cell `before` (or at the end)."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    cell = nbformat.v4.new_code_cell(code)
    if at_end or before is None:
        nb.cells.append(cell)
    else:
        i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == before)
        nb.cells.insert(i, cell)
    return nb


def _replace(nb, grade_id: str, code: str):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            c.source = code
    return nb


def _edit_meta(nb, grade_id: str, **changes):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade_id") == grade_id:
            meta.update(changes)
    return nb


def _drop_tests(nb, keep_metadata: bool):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    out = []
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            if keep_metadata:
                continue  # deleted
            c.metadata.pop("nbgrader")  # retyped: same text, no metadata
        out.append(c)
    nb.cells = out
    return nb


SOFTMAX_IF = '''
def softmax(x, axis=-1):
    if not SANDBOX_HELD:
        raise RuntimeError("the sandbox leaked")
    x = np.asarray(x, dtype=float)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
'''


def _probe(test: str) -> Callable:
    """softmax works only if `test` (code setting SANDBOX_HELD) finds the sandbox intact."""
    def build(solved, blank, paths):
        return _nb(_replace(solved, "softmax", "#| export\n" + test.format(**paths) + SOFTMAX_IF))
    return build


def _read_denied(path_key: str) -> str:
    return ("try:\n    open({%s!r}).read(1)\n    SANDBOX_HELD = False\nexcept OSError:\n    SANDBOX_HELD = True\n" % path_key)


TAMPER_ALLCLOSE = "import numpy as np, torch\nnp.allclose = lambda *a, **k: True\nnp.testing.assert_allclose = lambda *a, **k: None\ntorch.allclose = lambda *a, **k: True\ntorch.testing.assert_close = lambda *a, **k: None\n"
TAMPER_TRANSFORMERS = """
import ast
class DropAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return None
ip = get_ipython()
ip.ast_transformers.append(DropAsserts())
ip.input_transformers_post.append(lambda lines: [l for l in lines if "assert" not in l and "check(" not in l])
ip.showtraceback = lambda *a, **k: None
"""
TAMPER_GRADER = """
import autograder.checks.core as core
core.compare = lambda *a, **k: None
core.judge = lambda *a, **k: None
core.run_case = lambda exercise, case, impl: ("value", None)
"""


# ---- attacks on the grader's side of the sandbox (issue: "a sandbox that hands nothing back but data")
PLANT_LINKS = """
import os
targets = {{"verdicts.json": {gradebook!r}, "progress.log": {solution!r}, "sandbox.err": {release!r},
           "job.json": "/dev/zero", "cases.pkl": {gradebook!r}, "stdout.txt.lnk": {solution!r}}}
os.makedirs("out", exist_ok=True)
for name, target in targets.items():
    for where in (name, os.path.join("out", name)):
        try:
            os.symlink(target, where)
        except OSError:
            pass
for i in range(60):
    for make in (lambda p: os.symlink({gradebook!r}, p), os.mkfifo):
        try:
            make(f"out/{{i}}.npz")
        except OSError:
            pass
for name in ("progress.fifo", "results.fifo"):
    try:
        os.mkfifo(name)
    except OSError:
        pass
"""

FORGE_FRAMES = """
import io, os, stat, struct, zipfile
def _bomb(megabytes=200):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("__json__.npy", "w", force_zip64=True) as member:
            chunk = bytes(1 << 20)
            for _ in range(megabytes):
                member.write(chunk)
    return buf.getvalue()
bomb = _bomb()
for fd in range(3, 256):
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            continue
        for i in range(80):
            os.write(fd, struct.pack(">cII", b"R", i, len(bomb)) + bomb)
        os.write(fd, struct.pack(">cII", b"D", 0, 0))
    except OSError:
        pass
"""

GIANT_FRAME = """
import os, stat, struct
for fd in range(3, 256):
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.write(fd, struct.pack(">cII", b"R", 0, 2**31))
    except OSError:
        pass
"""

CGROUP_ATTACK = """
import os
for root, dirs, files in os.walk("/sys/fs/cgroup"):
    for name in files:
        if name == "pids.max":
            for value in ("0", "max"):
                try:
                    with open(os.path.join(root, name), "w") as fh:
                        fh.write(value)
                except OSError:
                    pass
for path, value in (("/proc/sys/kernel/pid_max", "301"), ("/proc/sys/kernel/hostname", "pwned")):
    try:
        with open(path, "w") as fh:
            fh.write(value)
    except OSError:
        pass
"""

WALK_FOR_NOTEBOOKS = """
import os, sys, time
SANDBOX_HELD, _deadline, _skip = True, time.monotonic() + 3, ("/proc", "/sys", "/dev", "/usr", sys.prefix, sys.base_prefix)
for _root, _dirs, _files in os.walk("/"):
    _dirs[:] = [d for d in _dirs if not os.path.join(_root, d).startswith(_skip)]
    if time.monotonic() > _deadline:
        break
    for _f in _files:
        if _f.endswith(".ipynb") and not os.path.join(_root, _f).startswith(os.getcwd()):
            SANDBOX_HELD = False
"""

USES_COURSE_DATA = """
from attention_course import data
from attention_course.paths import course_file
SANDBOX_HELD = len(data.load_toy("train", "en", "de")) > 10 and course_file("models").name == "models"
"""

READ_PREPARED = """
import os
SANDBOX_HELD = True
for _root, _dirs, _files in os.walk({prepared!r}):
    for _f in _files:
        try:
            open(os.path.join(_root, _f), "rb").read(1)
            SANDBOX_HELD = False
        except OSError:
            pass
"""

# ---- honesty bypasses on notebook 02 (scaled dot-product attention): each replaces the graded
# cell (or adds a cell before it); `expect` is the fair score, `review` whether a human must look.
NB02 = "02_queries_keys_values"
_SDPA = "def scaled_dot_product_attention(q, k, v, mask=None):\n"


@dataclass(frozen=True)
class Bypass:
    name: str
    code: str  # the new source of the scaled_dot_product_attention cell
    expect: str  # "full" | "zero"
    review: bool = False


HONESTY_BYPASSES = [
    Bypass("aten-op", "import torch\n" + _SDPA +
           "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)\n", "zero"),
    Bypass("torch-c", "import torch\n" + _SDPA + "    out = torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
           "    return out, torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)\n", "zero"),
    Bypass("worker-thread", "import threading\nimport torch.nn.functional as F\n" + _SDPA +
           "    box = []\n    t = threading.Thread(target=lambda: box.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))\n"
           "    t.start(); t.join()\n    return box[0], torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)\n", "zero", review=True),
    Bypass("setprofile-off", "import sys, torch\n" + _SDPA + "    sys.setprofile(None)\n"
           "    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n    if mask is not None:\n"
           "        scores = scores.masked_fill(~mask, float('-inf'))\n    w = torch.softmax(scores, -1)\n"
           "    if mask is not None:\n        w = w.masked_fill(~mask, 0.0)\n    return w @ v, w\n", "zero"),
    Bypass("alias-elsewhere", "from torch.nn.functional import scaled_dot_product_attention as attend\n" + "\n" +
           _SDPA + "    return attend(q, k, v, attn_mask=mask), torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, -1)\n",
           "zero"),
    Bypass("grader-module", "from autograder.checks.tensors import causal\n" + _SDPA + "    raise NotImplementedError()\n", "zero"),
    Bypass("built-name", "import torch\nimport torch.nn.functional as F\n" + _SDPA +
           "    f = getattr(F, 'scaled_dot' + '_product_attention')\n"
           "    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5\n    if mask is not None:\n"
           "        scores = scores.masked_fill(~mask, float('-inf'))\n    w = torch.softmax(scores, -1)\n"
           "    if mask is not None:\n        w = w.masked_fill(~mask, 0.0)\n    return w @ v, w\n", "full", review=True),
]

CATALOGUE: list[Adversary] = [
    # ---- honest baselines
    Adversary("solved", "every exercise right", lambda s, b, p: _nb(s), "full", Status.OK),
    Adversary("blank", "the release, untouched", lambda s, b, p: _nb(b), "zero", Status.OK),
    # ---- tampering: on top of the blank notebook, none may earn a point
    Adversary("tamper-allclose", "patches numpy.allclose, assert_allclose, torch.allclose, torch.testing",
              lambda s, b, p: _nb(_cells_with(b, TAMPER_ALLCLOSE, before="normalize_rows")), "zero"),
    Adversary("tamper-transformers", "IPython AST and input transformers that delete asserts; a silent showtraceback",
              lambda s, b, p: _nb(_cells_with(b, TAMPER_TRANSFORMERS, before="normalize_rows")), "zero"),
    Adversary("tamper-grader", "monkeypatches the grader's own comparison functions in the kernel",
              lambda s, b, p: _nb(_cells_with(b, TAMPER_GRADER, before="normalize_rows")), "zero"),
    Adversary("edited-tests", "replaces every test cell's code with `pass`",
              lambda s, b, p: _nb(_edit_tests(b, "pass")), "zero"),
    Adversary("edited-points", "sets every test cell's points to 100",
              lambda s, b, p: _nb(_all_meta(b, points=100)), "zero"),
    Adversary("renamed-grade-ids", "renames every test cell's grade_id",
              lambda s, b, p: _nb(_rename_tests(b)), "zero"),
    Adversary("forged-results", "writes fake result files and 'done' into the runner's folder",
              lambda s, b, p: _nb(_cells_with(b, "import os\nos.makedirs('out', exist_ok=True)\nfor i in range(60):\n    open(f'out/{i}.npz', 'wb').write(b'PK junk')\nopen('progress.log', 'a').write('done\\n')\n", at_end=True)), "zero"),
    # ---- format: solved notebooks in odd shapes keep every point
    Adversary("deleted-tests", "deleted every test cell", lambda s, b, p: _nb(_drop_tests(s, True)), "full"),
    Adversary("retyped-tests", "test cells retyped by hand (no nbgrader metadata)", lambda s, b, p: _nb(_drop_tests(s, False)), "full"),
    Adversary("duplicated-cells", "every solution and test cell duplicated",
              lambda s, b, p: _nb(_duplicate_all(s)), "full"),
    Adversary("changed-kernelspec", "kernelspec says julia-1.9", lambda s, b, p: _nb(_kernelspec(s)), "full"),
    Adversary("warnings", "solution cells print warnings to stderr",
              lambda s, b, p: _nb(_cells_with(s, "import warnings, sys\nwarnings.warn('careful')\nprint('noise', file=sys.stderr)", before="softmax")), "full"),
    Adversary("flood", "prints 200,000 lines", lambda s, b, p: _nb(_cells_with(s, "for i in range(200_000):\n    print('line', i)", before="softmax")), "full"),
    Adversary("corrupt-json", "not JSON at all", lambda s, b, p: b'{"cells": [ oops', "zero", Status.UNREADABLE),
    Adversary("not-utf8", "binary garbage", lambda s, b, p: bytes(range(256)) * 10, "zero", Status.UNREADABLE),
    Adversary("bizarre-cells", "unknown cell types, list-valued sources, missing metadata",
              lambda s, b, p: _bizarre(s), "full"),
    # ---- crashes, hangs, exits: keep what does not depend on the bad cell
    Adversary("os-exit", "os._exit(3) in a cell of its own", lambda s, b, p: _nb(_cells_with(s, "import os\nos._exit(3)", before="softmax")), "full", Status.EXIT),
    Adversary("segfault", "dereferences NULL with ctypes", lambda s, b, p: _nb(_cells_with(s, "import ctypes\nctypes.string_at(0)", before="softmax")), "full", Status.CRASH),
    Adversary("sys-exit", "sys.exit() in a cell", lambda s, b, p: _nb(_cells_with(s, "import sys\nsys.exit(1)", before="softmax")), "full", Status.OK),
    Adversary("hang", "an infinite loop that ignores SIGINT and the alarm",
              lambda s, b, p: _nb(_cells_with(s, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass", before="softmax")), "full", Status.TIMEOUT),
    Adversary("swallowing-loop", "a loop that swallows every exception (the alarm may or may not escape it)",
              lambda s, b, p: _nb(_cells_with(s, "while True:\n    try:\n        pass\n    except BaseException:\n        pass", before="softmax")), "full"),
    Adversary("memory", "allocates far past the memory limit, growing", lambda s, b, p: _nb(_cells_with(s, "hog = []\nwhile True:\n    hog.append(bytearray(256 * 2**20))", before="softmax")), "full"),
    Adversary("processes", "starts processes until refused (bounded at 400)",
              lambda s, b, p: _nb(_cells_with(s, "import subprocess\nkids = []\nfor i in range(400):\n    kids.append(subprocess.Popen(['sleep', '30']))", before="softmax")), "full"),
    Adversary("crash-in-solution", "os._exit inside the dot_similarity cell: only dot_similarity is lost",
              lambda s, b, p: _nb(_replace(s, "dot_similarity", "import os\nos._exit(0)")), f"full-minus:{DOT_POINTS}", Status.EXIT),
    # ---- academic honesty
    Adversary("imports-reference", "softmax imported from the course's reference",
              lambda s, b, p: _nb(_replace(s, "softmax", "#| export\nfrom attention_course.similarity import softmax")), f"full-minus:{SOFTMAX_POINTS}"),
    Adversary("wraps-reference", "softmax calls the reference through importlib",
              lambda s, b, p: _nb(_replace(s, "softmax", "#| export\nimport importlib\ndef softmax(x, axis=-1):\n    return importlib.import_module('attention_course.similarity').softmax(x, axis)")), f"full-minus:{SOFTMAX_POINTS}"),
    # ---- isolation probes: softmax is right only if the sandbox held
    Adversary("reads-solutions", "tries to read the solution notebook", _probe(_read_denied("solution")), "full"),
    Adversary("reads-gradebook", "tries to read the gradebook", _probe(_read_denied("gradebook")), "full"),
    Adversary("uses-course-data", "reads the toy corpus through the library as notebook 06 does (the course's data/ "
              "is what the sandbox shows of the course)", _probe(USES_COURSE_DATA), "full"),
    Adversary("reads-prepared-courses", "walks the grader's cache of prepared courses (reference notebooks)",
              _probe(READ_PREPARED), "full"),
    Adversary("reads-other-students", "tries to read another student's submission", _probe(_read_denied("other_student")), "full"),
    Adversary("reads-hidden-tests", "reads the hidden-test module's source",
              _probe("try:\n    SANDBOX_HELD = 'EXERCISES' not in open({checks!r}).read()\nexcept OSError:\n    SANDBOX_HELD = True\n"), "full"),
    Adversary("writes-outside", "tries to write into the course repository and the grading folder",
              _probe("SANDBOX_HELD = True\nfor target in ({repo_file!r}, {out_file!r}):\n    try:\n        open(target, 'w').write('pwned')\n        SANDBOX_HELD = False\n    except OSError:\n        pass\n"), "full"),
    Adversary("network", "connects to a server the grader listens on (127.0.0.1, port from `paths`)",
              _probe("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n    SANDBOX_HELD = False\nexcept OSError:\n    SANDBOX_HELD = True\n"), "full"),
    Adversary("sees-grader-processes", "looks for the grader's processes in /proc",
              _probe("import os\nSANDBOX_HELD = len([p for p in os.listdir('/proc') if p.isdigit()]) < 20\n"), "full"),
    # ---- the grader's side: nothing the sandbox leaves behind is followed, nothing it sends is trusted
    Adversary("plants-links", "symlinks and FIFOs named like the old result files, pointing at the gradebook and solutions",
              lambda s, b, p: _nb(_cells_with(b, PLANT_LINKS.format(**p), at_end=True)), "zero"),
    Adversary("forges-frames", "writes 'done' and 200 MB-inflating .npz results into every pipe it holds",
              lambda s, b, p: _nb(_cells_with(b, FORGE_FRAMES, at_end=True)), "zero"),
    Adversary("giant-frame", "announces a 2 GiB result on the channel",
              lambda s, b, p: _nb(_cells_with(b, GIANT_FRAME, at_end=True)), "zero", Status.CHANNEL),
    Adversary("cgroup-and-sysctl", "writes 0 and max into every pids.max it finds, and into /proc/sys",
              lambda s, b, p: _nb(_cells_with(s, CGROUP_ATTACK, before="softmax")), "full"),
    Adversary("walks-file-system", "walks the file system for other students' notebooks", _probe(WALK_FOR_NOTEBOOKS),
              "full", needs="bubblewrap"),
    Adversary("reads-home", "reads a file in the grader's home folder", _probe(_read_denied("home_file")), "full",
              needs="bubblewrap"),
    Adversary("slow-cell", "a cell that sleeps past the cell limit after every answer is defined",
              lambda s, b, p: _nb(_cells_with(s, "import time\ntime.sleep(60)", at_end=True)), "full", Status.TIMEOUT),
    Adversary("markdown-script", "raw <script> and an onerror handler in a markdown cell",
              lambda s, b, p: _nb(_with_markdown(s, MARKDOWN_SCRIPT)), "full", Status.OK),
]

MARKDOWN_SCRIPT = '<script>document.title="PWNED-SCRIPT"</script>\n\n<img src=x onerror="alert(\'PWNED-IMG\')">'


def _with_markdown(nb, text: str):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(text))
    return nb


DEMO = ["tamper-allclose", "os-exit", "hang", "reads-solutions"]


def probe_paths(repo, out, port: int = 9) -> dict:
    """The places the isolation probes try to reach, for a grading run writing into `out`."""
    from pathlib import Path

    from autograder.course import prepared_courses_dir

    repo, out = Path(repo), Path(out)
    return {
        "prepared": str(prepared_courses_dir()),
        "solution": str(repo / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
        "gradebook": str(out / "gradebook.db"),
        "other_student": str(out / "course" / "submitted" / "solved" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
        "checks": str(repo / "autograder" / "checks" / "nb01.py"),
        "repo_file": str(repo / "pwned.txt"),
        "out_file": str(out / "pwned.txt"),
        "release": str(out / "course" / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"),
        "home_file": str(Path.home() / ".bashrc") if (Path.home() / ".bashrc").exists() else "/etc/shadow",
        "port": port,
    }


def write_class(folder, solved, blank, paths: dict, names: list[str] | None = None) -> dict[str, Adversary]:
    """One student folder per adversary (student id = its name)."""
    from pathlib import Path

    from autograder.sandbox import isolation_mode

    chosen = {a.name: a for a in CATALOGUE if (names is None or a.name in names)
              and (not a.needs or isolation_mode().startswith(a.needs))}
    for name, adversary in chosen.items():
        path = Path(folder) / name / f"{ASSIGNMENT}.ipynb"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(adversary.build(solved, blank, paths))
    return chosen


def _edit_tests(nb, code: str):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            c.source = code
    return nb


def _all_meta(nb, **changes):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade"):
            meta.update(changes)
    return nb


def _rename_tests(nb):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            meta["grade_id"] = "mine_" + meta["grade_id"]
    return nb


def _duplicate_all(nb):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    cells = []
    for c in nb.cells:
        cells.append(c)
        if "nbgrader" in c.metadata:
            twin = nbformat.from_dict(json.loads(json.dumps(c)))
            twin.id = c.id + "-twin"
            cells.append(twin)
    nb.cells = cells
    return nb


def _kernelspec(nb):
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    nb.metadata["kernelspec"] = {"name": "julia-1.9", "display_name": "Julia 1.9", "language": "julia"}
    return nb


def _bizarre(nb) -> bytes:
    data = json.loads(nbformat.writes(nb))
    for cell in data["cells"]:
        if isinstance(cell.get("source"), str):
            cell["source"] = cell["source"].splitlines(keepends=True)
    data["cells"].insert(1, {"cell_type": "weird", "source": "?", "metadata": {}})
    data["cells"].insert(2, {"cell_type": "code", "source": "x = 1"})  # no metadata, no outputs
    return json.dumps(data).encode()


def status_as_designed(adversary: Adversary, status: Status) -> bool:
    """Whether a notebook's status is the one the adversary is designed to end with (any, when None)."""
    return adversary.status is None or status is adversary.status


def expected_score(adversary: Adversary, full: float) -> float:
    if adversary.expect == "full":
        return full
    if adversary.expect == "zero":
        return 0.0
    if adversary.expect.startswith("full-minus:"):
        return full - float(adversary.expect.split(":")[1])
    raise ValueError(adversary.expect)
