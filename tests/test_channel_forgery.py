"""F9: the results channel is reachable from student code (its descriptor is in the process's own
table). A notebook that never writes an exercise finds the pipe and sends, early, the frames a
solved notebook's run sent for every test cell (the genuine results, as F10 made computable from
the public seed). The grader accepts a frame only in the runner's own order: the forged run is
void, the notebook scores nothing it did not do, and the status says the channel was tampered with.
Graded for real: the sandbox, the runner, the trusted judge."""
from __future__ import annotations

import json
import os

import nbformat

from autograder import trusted
from autograder.grade import world_for
from autograder.outcomes import Status
from autograder.sandbox import Limits, make_kit, run_notebook_job

from .layout import SOLUTIONS

A01 = "01_similarity_attention"
SOURCE = SOLUTIONS / A01 / f"{A01}.ipynb"
LIMITS = Limits(cell_seconds=30, notebook_seconds=240)

FORGE = '''import os, stat, struct, fcntl
frames = {frames!r}
pipe = None
for name in os.listdir("/proc/self/fd"):
    fd = int(name)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
            pipe = fd
    except OSError:
        pass
def frame(kind, cell, payload=b""):
    return struct.pack(">cII", kind, cell, len(payload)) + payload
os.write(pipe, frame(b"E", {here}))
for cell, blob in frames:
    os.write(pipe, frame(b"S", cell) + frame(b"R", cell, bytes.fromhex(blob)) + frame(b"E", cell))
'''


def _job(nb, source):
    tests = trusted.test_cells(source)
    return trusted.build_job(trusted.normalize_submission(nb, source), tests), tests


def _run(nb, source, tmp_path, name):
    job, tests = _job(nb, source)
    folder = tmp_path / name
    folder.mkdir()
    world = world_for(SOURCE, folder / "job", make_kit(folder / "kit"), [])
    verdicts, run = trusted.grade_job(job, tests, LIMITS.cell_seconds,
                                      lambda inputs: run_notebook_job(folder / "job", inputs, world, LIMITS))
    return job, verdicts, run


def test_results_forged_early_on_the_runners_own_pipe_are_void(tmp_path):
    os.environ.setdefault("ATTN_CHECK_SEED", "attention-step-by-step")
    source = nbformat.read(SOURCE, as_version=4)
    solved_job, solved_verdicts, solved_run = _run(source, source, tmp_path, "solved")
    assert all(v.passed for v in solved_verdicts.values())
    genuine = {cell["test"]: solved_run.results[i].hex() for i, cell in enumerate(solved_job.cells)
               if cell["kind"] == "record" and i in solved_run.results}

    blank = nbformat.read(SOURCE, as_version=4)
    for cell in blank.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = "raise NotImplementedError()\n"
    first_code = next(i for i, c in enumerate(blank.cells) if c.cell_type == "code")
    blank.cells.insert(first_code, nbformat.v4.new_code_cell("pass"))
    job, _ = _job(blank, source)
    here = next(i for i, c in enumerate(job.cells) if c["kind"] == "code" and c["source"] == "pass")
    frames = [(i, genuine[c["test"]]) for i, c in enumerate(job.cells) if c["kind"] == "record" and c["test"] in genuine]
    assert len(frames) == len(genuine) >= 9
    blank.cells[first_code].source = FORGE.format(frames=frames, here=here)

    _, verdicts, run = _run(blank, source, tmp_path, "forged")
    passed = sorted(k for k, v in verdicts.items() if v.passed)
    assert passed == [], f"forged results were accepted for {passed}"
    status, detail, _ = trusted.incidents_status(run, job)
    assert status is Status.CHANNEL and "out of the runner's order" in detail, (status, detail)
    assert json.dumps(detail)  # a plain string, for the status column
