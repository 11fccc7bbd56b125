"""Messages that say the real cause, graded for real (the sandbox, the trusted judge; nbgrader's
feedback page for one of them): a syntax error or a failed import in an answer cell, an endless
loop (at the top of a cell, inside the graded function, eating the whole notebook's time),
PyTorch's seven-line state_dict error, and the same values dumped in every test cell."""
from __future__ import annotations

import nbformat
import pytest

from autograder import selfcheck
from autograder.sandbox import Limits

from .conftest import NO_SCALE, autograde, inject, solved_notebook

pytestmark = pytest.mark.slow

A01, A02, A03 = "01_similarity_attention", "02_queries_keys_values", "03_multi_head_attention"
QUICK = Limits(cell_seconds=3, notebook_seconds=120)  # an endless loop costs 3 s per cell

UNCLOSED = "def cosine_similarity(E):\n    U = E / np.linalg.norm(E, axis=1, keepdims=True\n    return U @ U.T"
BAD_IMPORT = "from scipy_not_installed import cdist\n\ndef cosine_similarity(E):\n    return 1 - cdist(E, E, 'cosine')"
LOOP_AT_TOP = "n = 0\nwhile True:\n    n += 1\n\ndef cosine_similarity(E):\n    return E @ E.T"
LOOP_INSIDE = "def cosine_similarity(E):\n    while True:\n        pass"


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    """`attn-course check` on a notebook in memory: (result, the report the student reads)."""
    cache = tmp_path_factory.mktemp("check-cache")

    def run(assignment: str, nb, limits: Limits = QUICK):
        prepared = selfcheck.prepare(assignment, root=cache)
        data = nbformat.writes(nb).encode()
        result = selfcheck.check_notebook(prepared, data, limits)
        return result, selfcheck.format_report(result, selfcheck.verdicts_of(result, data, prepared.stubs))

    return run


def by_cell(result) -> dict[str, str]:
    return {c.grade_id: c.message for c in result.cells}


def answer_cell_number(nb, graded: str) -> int:
    return next(n for n, c in enumerate(nb.cells, start=1) if c.metadata.get("nbgrader", {}).get("grade_id") == graded)


def test_syntax_error_names_type_message_and_line(course, check):
    nb = inject(solved_notebook(course, A01), {"cosine_similarity": UNCLOSED})
    result, report = check(A01, nb)
    message = by_cell(result)["test_cosine_similarity"]
    number = answer_cell_number(nb, "cosine_similarity")
    assert f"your answer cell `cosine_similarity` (cell {number} of the notebook)" in message, message
    assert "SyntaxError: '(' was never closed at line 4: `U = E / np.linalg.norm(E, axis=1, keepdims=True`" in message
    assert "fix it and run the cell again" in message
    assert result.score == result.max_score - 2  # only cosine_similarity's cell
    assert "SyntaxError" in report


def test_failed_import_names_the_module_and_line_and_reaches_the_feedback_page(course):
    """Graded through nbgrader: the explanation is what the feedback page shows."""
    nb = inject(solved_notebook(course, A01), {"cosine_similarity": BAD_IMPORT})
    result = autograde(course, A01, nb)
    message = by_cell(result)["test_cosine_similarity"]
    assert ("stopped with ModuleNotFoundError: No module named 'scipy_not_installed' at line 3: "
            "`from scipy_not_installed import cdist`") in message, message
    assert "nothing named `cosine_similarity` is defined, because your answer cell `cosine_similarity`" in message
    html = (course.root / "feedback" / result.student_id / A01 / f"{A01}.html").read_text()
    assert "No module named &#39;scipy_not_installed&#39; at line 3" in html or \
        "No module named 'scipy_not_installed' at line 3" in html


def test_endless_loop_in_an_answer_cell_names_the_cell_and_the_time_limit(course, check):
    nb = inject(solved_notebook(course, A01), {"cosine_similarity": LOOP_AT_TOP})
    result, _ = check(A01, nb)
    message = by_cell(result)["test_cosine_similarity"]
    number = answer_cell_number(nb, "cosine_similarity")
    assert (f"because your answer cell `cosine_similarity` (cell {number} of the notebook) ran past the per-cell "
            "time limit of 3 s and was interrupted before it defined `cosine_similarity`") in message, message
    assert f"the answer cell cosine_similarity (cell {number})" in result.detail  # the instructor's table too


def test_endless_loop_in_the_graded_function_names_the_test_cell_and_the_limit(course, check):
    nb = inject(solved_notebook(course, A01), {"cosine_similarity": LOOP_INSIDE})
    result, _ = check(A01, nb)
    message = by_cell(result)["test_cosine_similarity"]
    number = answer_cell_number(nb, "test_cosine_similarity")
    assert (f"not graded: checking your `cosine_similarity` in test cell `test_cosine_similarity` (cell {number} of "
            "the notebook) ran past the per-cell time limit of 3 s") in message, message
    assert "loop that never ends" in message


LOOP_IN_SOFTMAX = "def softmax(x, axis=-1):\n    while True:\n        pass"


def test_a_function_that_timed_out_is_waited_for_once(course, check):
    """softmax loops: its first test cell waits the whole limit; its stability test, the code cells
    calling it and basic_self_attention's tests (which call it) fail at once, saying where it timed
    out; basic_self_attention still gets its points (checked again with the course's softmax)."""
    nb = inject(solved_notebook(course, A01), {"softmax": LOOP_IN_SOFTMAX})
    result, report = check(A01, nb)
    waited = [part for part in result.detail.split("; ") if "the checks of test_" in part]
    assert len(waited) == 1 and "the checks of test_softmax:" in waited[0], result.detail
    messages = by_cell(result)
    assert "ran past the per-cell time limit of 3 s" in messages["test_softmax"], messages["test_softmax"]
    stability = messages["test_softmax_stability"]
    assert "already ran past the time limit in test cell `test_softmax`" in stability, stability
    assert "softmax: not run again:" in stability and "StoppedEarlier" not in stability, stability  # no class name
    assert result.score == result.max_score - 5, (result.score, messages)  # softmax's 5 points only


def _waits(check_run, nb) -> tuple[object, dict[str, str], list[str]]:
    """Check `nb` (3 s per cell), hearing which cell runs: (result, messages per test cell, the
    cells in the order they were entered: a cell waited for twice is entered twice)."""
    entered: list[str] = []
    result = check_run(nb, lambda i, n, what, seconds, limit: entered.append(what)
                       if not entered or entered[-1] != what else None)
    return result, by_cell(result), entered


@pytest.fixture(scope="module")
def check_heard(tmp_path_factory):
    cache = tmp_path_factory.mktemp("check-cache")

    def run(nb, progress):
        prepared = selfcheck.prepare(A01, root=cache)
        return selfcheck.check_notebook(prepared, nbformat.writes(nb).encode(), QUICK, progress=progress)

    return run


def test_a_loop_first_met_in_a_code_cell_is_not_waited_for_again_by_its_tests(course, check_heard):
    """A code cell calls the looping softmax before its test does: that cell waits the limit once,
    and the tests of softmax then fail at once, naming the code cell (no second wait)."""
    nb = solved_notebook(course, A01)
    nb = inject(nb, {"softmax": LOOP_IN_SOFTMAX})
    at = answer_cell_number(nb, "softmax")
    nb.cells.insert(at, nbformat.v4.new_code_cell("demo = softmax(np.array([1.0, 2.0]))  # the student tries it"))
    result, messages, entered = _waits(check_heard, nb)
    assert "already ran past the time limit in code cell" in messages["test_softmax"], messages["test_softmax"]
    assert "already ran past the time limit in code cell" in messages["test_softmax_stability"]
    waited = [part for part in result.detail.split("; ") if "ran past" in part or "time limit" in part]
    assert len(waited) == 1, result.detail
    assert result.score == result.max_score - 5, (result.score, messages)


def test_a_restart_does_not_wait_for_a_loop_again(course, check_heard):
    """softmax loops in its test, then a later cell kills the kernel process: the restarted run
    skips the cell that timed out and starts with softmax stubbed, so the loop is waited for once
    in all (before, the restart ran test_softmax again and waited the whole limit a second time)."""
    nb = inject(solved_notebook(course, A01), {"softmax": LOOP_IN_SOFTMAX})
    at = answer_cell_number(nb, "test_softmax_stability")
    nb.cells.insert(at - 1, nbformat.v4.new_code_cell("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"))
    result, messages, entered = _waits(check_heard, nb)
    assert any(part.startswith("crash") or "killed" in part or "signal" in part
               for part in result.detail.split("; ")), result.detail  # the restart really happened
    into_test = [what for what in entered if "`test_softmax`" in what]
    assert len(into_test) == 1, entered
    stability = messages["test_softmax_stability"]
    assert "already ran past the time limit in test cell `test_softmax`" in stability, stability


def test_check_says_which_cell_runs_and_for_how_long(course, tmp_path_factory, capsys):
    """No blind wait: while a slow cell runs, the live display hears which cell it is and how much
    of its limit it has used (the sandbox reports five times a second); `check` prints it on stderr."""
    nb = solved_notebook(course, A01)
    at = answer_cell_number(nb, "dot_similarity")
    nb.cells.insert(at - 1, nbformat.v4.new_code_cell("import time\ntime.sleep(3)  # a slow cell"))
    heard = []
    prepared = selfcheck.prepare(A01, root=tmp_path_factory.mktemp("check-cache"))
    result = selfcheck.check_notebook(prepared, nbformat.writes(nb).encode(), Limits(cell_seconds=20),
                                      progress=lambda i, n, what, seconds, limit: heard.append((i, n, what, seconds, limit)))
    assert result.score == result.max_score
    slow = [h for h in heard if "the code cell starting 'import time'" in h[2]]
    assert slow and max(h[3] for h in slow) >= 2 and all(h[4] == 20 for h in slow), heard[-5:]
    assert len({h[1] for h in heard}) == 1 and all(0 <= h[0] < h[1] for h in heard)

    from course_tools import cli

    path = tmp_path_factory.mktemp("nb") / f"{A01}.ipynb"
    nbformat.write(nb, path)
    assert cli.main(["check", str(path)]) == 0
    err = capsys.readouterr().err
    assert "checking: cell" in err and "the code cell starting 'import time'" in err, err[-2000:]


def test_notebook_out_of_time_says_which_cells_used_it(course, check):
    """Endless cells in a row use up the notebook's time: the tests after them say so, and
    name the cells (none reads 'the notebook stopped before this test' and nothing else)."""
    nb = solved_notebook(course, A01)
    at = answer_cell_number(nb, "dot_similarity")
    for k in reversed(range(8)):  # 16 s of endless cells: more than the notebook's 14 s
        nb.cells.insert(at - 1, nbformat.v4.new_code_cell(f"# slow cell {k}\nwhile True:\n    pass"))
    result, _ = check(A01, nb, Limits(cell_seconds=2, notebook_seconds=14))
    message = by_cell(result)["test_basic_self_attention"]
    assert message.startswith("not graded: the notebook stopped before this test ("), message
    assert "the notebook ran past its 14 s limit" in message
    assert "ran past the per-cell time limit of 2 s" in message and "'# slow cell 0'" in message
    assert result.score >= 10  # what came before the slow cells stands


def test_state_dict_size_mismatch_is_named_in_two_lines(course, check):
    """key_dim left at d_model: PyTorch's load_state_dict error lists seven parameters; the student
    reads which parameter, expected versus got, and the likely cause."""
    nb = solved_notebook(course, A03)
    source = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "MultiHeadAttention")
    wide = source.replace("key_dim = d_model // num_heads", "key_dim = d_model")
    assert wide != source
    result, report = check(A03, inject(nb, {"MultiHeadAttention": wide}))
    message = by_cell(result)["test_MultiHeadAttention"]
    assert "size mismatch for" not in report and "torch.Size" not in report
    lines = message.split("\n")
    assert lines[0].startswith("MultiHeadAttention: the test copies weights of the right shapes into your module, "
                               "and q_proj.weight has the wrong shape: expected [16, 16], yours is [64, 16]"), lines[0]
    if "This matches a known mistake" not in message:  # else the catalogue names the cause
        assert lines[1].startswith("  Likely cause: these layers are 4 times too wide") and "key_dim left at d_model" in lines[1]
        assert lines[2].startswith("  on: ") and len(lines) == 3, message
    assert len(lines) <= 5, message
    later = by_cell(result)["test_MultiHeadAttention_mask"]
    assert "expected [12, 12], yours is [36, 12]" in later and "Likely cause" not in later  # said once


def test_each_dump_is_shown_once(course, check):
    """A missing scale fails three test cells of scaled_dot_product_attention: the expected and
    received values are printed under the first only; the others keep their one-line difference."""
    result, report = check(A02, inject(solved_notebook(course, A02), {"scaled_dot_product_attention": NO_SCALE}))
    messages = by_cell(result)
    assert report.count("expected: [") == 1 and report.count("received: [") == 1, report
    for later in ("test_scaled_dot_product_attention_mask", "test_scaled_dot_product_attention_matches_torch"):
        assert "values differ (largest difference" in messages[later]
        assert "shown once, under test_scaled_dot_product_attention" in messages[later]
        assert "This matches a known mistake: no 1/sqrt(d_k) scaling." in messages[later]
    assert report.count("Where to look: divide the scores q @ k^T") == 1
    assert len(report.splitlines()) < 40, report  # was 132 lines


def test_identical_messages_point_back(course, check):
    """The same check in two test cells gives the same message: the second refers to the first."""
    wrong = "def basic_self_attention(X):\n    return (X @ X.T) @ X"
    result, _ = check(A01, inject(solved_notebook(course, A01), {"basic_self_attention": wrong}))
    first, second = (by_cell(result)[c] for c in ("test_basic_self_attention",
                                                  "test_basic_self_attention_permutation_equivariance"))
    assert "expected: [" in first
    assert second == ("basic_self_attention gave a wrong result on: X of shape (5, 3)\n"
                      "  This matches a known mistake: no softmax: (X X^T) X.\n"
                      "  (the same as under test_basic_self_attention above)"), second


def test_state_dict_summary_as_judged_in_grading():
    """The same summary from the judge itself (run_case and serialization as in the sandbox, the
    verdict here), on each case of the comparison with torch.nn.MultiheadAttention."""
    import torch.nn as nn

    from attention_course import multihead as ref
    from autograder.checks import nb03

    from .conftest import fresh_copy, judged_as_in_grading

    class Wide(fresh_copy(ref)["MultiHeadAttention"]):  # the course's code, re-created: not the reference's objects
        def __init__(self, d_model, num_heads, key_dim=None, value_dim=None, dropout=0.0, bias=True):
            nn.Module.__init__(self)
            key_dim = d_model if key_dim is None else key_dim  # the slip: one head as wide as the model
            value_dim = key_dim if value_dim is None else value_dim
            self.num_heads, self.key_dim, self.value_dim = num_heads, key_dim, value_dim
            self.q_proj = nn.Linear(d_model, num_heads * key_dim, bias=bias)
            self.k_proj = nn.Linear(d_model, num_heads * key_dim, bias=bias)
            self.v_proj = nn.Linear(d_model, num_heads * value_dim, bias=bias)
            self.out_proj = nn.Linear(num_heads * value_dim, d_model, bias=bias)
            self.dropout = nn.Dropout(dropout)

    exercise = nb03.check.exercises["MultiHeadAttention_torch"]
    messages = [m for m in judged_as_in_grading(exercise, Wide) if m]
    assert messages
    for message in messages:
        assert "size mismatch" not in message and "q_proj.weight has the wrong shape: expected [" in message, message
        assert len(message.split("\n")) <= 5, message


def test_biases_kept_when_bias_false_is_told_once_with_the_known_mistake():
    """SelfAttention that ignores bias=False: PyTorch's load error lists the three biases. The known mistake
    says why; the generic 'attribute names must be exactly...' line used to come first and point the student
    at their names instead. Without a catalogued match, the summary itself names bias=False."""
    import torch.nn as nn

    from attention_course import attention as ref
    from autograder.checks import nb02
    from autograder.checks.core import CheckFailed, state_dict_summary

    from .conftest import fresh_copy

    attend = fresh_copy(ref)["scaled_dot_product_attention"]

    class SelfAttention(nn.Module):
        def __init__(self, d_model, d_k, d_v=None, bias=True):
            super().__init__()
            self.q_proj, self.k_proj = nn.Linear(d_model, d_k), nn.Linear(d_model, d_k)
            self.v_proj = nn.Linear(d_model, d_v or d_k)

        def forward(self, x, mask=None):
            return attend(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)

    with pytest.raises(CheckFailed) as failed:
        nb02.check("SelfAttention", SelfAttention)
    message = str(failed.value)
    assert "known mistake: bias argument ignored" in message, message
    assert "attribute names must be exactly" not in message, message
    torch_error = ("Error(s) in loading state_dict for SelfAttention:\n\tMissing key(s) in state_dict: "
                   '"q_proj.bias", "k_proj.bias", "v_proj.bias". ')
    summary = state_dict_summary("SelfAttention", torch_error)
    assert "bias=False" in summary and "attribute names must be exactly" not in summary, summary


def test_biases_a_module_should_not_have_are_explained_for_a_module_without_a_bias_argument():
    """AdditiveAttention takes no bias argument (Bahdanau's layers have none): the hint told a student with a bias
    only on `score` to 'pass the bias argument on to every nn.Linear' (a mutation test's finding)."""
    from autograder.checks.core import state_dict_summary

    said = state_dict_summary("AdditiveAttention", 'Error(s) in loading state_dict for AdditiveAttention:\n\t'
                                                   'Missing key(s) in state_dict: "score.bias". ')
    assert said is not None and "score.bias" in said, said
    assert "or the specification's layers have none at all" in said and "else with bias=False" in said, said


def test_a_students_message_shaped_like_a_load_error_fails_the_test_not_the_grader():
    """Red team 15: every answer raised a RuntimeError worded like PyTorch's load_state_dict error with a 400-digit
    shape; the summary divided the two shapes (OverflowError) and the grader failed on the notebook, every run, so the
    student had no grade and no 0 in any export. The message is the student's: the test fails with it."""
    from autograder.checks import nb01
    from autograder.checks.core import cases_of, failure_of, state_dict_summary

    text = ("Error(s) in loading state_dict for Attention:\n\tsize mismatch for w: copying a param with shape "
            "torch.Size([1]) from checkpoint, the shape in current model is torch.Size([" + "9" * 400 + "]).")
    assert state_dict_summary("softmax", text) is None
    exercise = nb01.check.exercises["softmax"]
    case = cases_of(exercise)[0]
    failure = failure_of(exercise, case, ("error", "RuntimeError", text, ""))
    assert failure is not None and failure.message.startswith("softmax raised RuntimeError: Error(s) in loading"), failure


def test_a_complex_answer_is_not_taken_for_its_real_part():
    """Red team 15: a softmax returning the right numbers + 1e6j scored 17/17 (the comparison read it as float64,
    which drops the imaginary part with a warning only)."""
    import numpy as np

    from autograder.checks import nb01
    from autograder.checks.core import CheckFailed, difference

    def softmax(x, axis=-1):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True) + 1e6j

    with pytest.raises(CheckFailed, match="expected real numbers, got complex numbers"):
        nb01.check("softmax", softmax)
    assert difference(np.array([1.0, 2.0]), np.array([1.0, 2.0])) is None
    assert difference(np.array([1 + 1j]), np.array([1 + 1j])) is None  # complex where complex is expected


def test_an_unused_import_of_the_answer_key_costs_nothing_and_using_it_is_refused(course, check):
    """Fairness audit 4: an unused `from attention_course import multihead` at the top of an answer cell stopped the
    cell in the sandbox (the stand-in module raised on import), 0 of the exercise's points, while the same line at
    the cell's end cost nothing and the instructor's note said it 'takes no points by itself'. Importing the stand-in
    is now harmless; reading a name from it still fails."""
    solved = solved_notebook(course, A03)
    answer = next(c.source for c in solved.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "MultiHeadAttention")
    unused = inject(solved, {"MultiHeadAttention": "from attention_course import multihead as course_mh  # to compare "
                                                   "with later\n" + answer})
    result, report = check(A03, unused)
    assert result.score == result.max_score, report
    used = inject(solved_notebook(course, A01), {"softmax": "import attention_course.similarity as course\n\n"
                                      "def softmax(x, axis=-1):\n    return course.softmax(x, axis)\n"})
    result, report = check(A01, used)
    softmax_cells = [c for c in result.cells if c.grade_id.startswith("test_softmax")]
    assert softmax_cells and all(c.score == 0 for c in softmax_cells), report
    assert "answer key" in report or "holds the answers of this notebook" in report, report


FILL_THE_CHANNEL = '''import os, struct
pipes = []
for name in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{name}")
        flags = int(open(f"/proc/self/fdinfo/{name}").read().split("flags:")[1].split()[0], 8)
    except (OSError, IndexError, ValueError):
        continue
    if target.startswith("pipe:") and flags & 3 == 1:
        pipes.append(int(name))
H = 9                                          # a frame's header
left = 256 * 2**20 - 1 - 2 * H                 # the runner sent I and S (this cell) so far; leave 1 byte
while left > 0:
    p = min(64 * 2**20, left - H)
    data = memoryview(struct.pack(">cII", b"I", 0, p) + bytes(p))  # a second ready frame: counted, then ignored
    while data:
        data = data[os.write(pipes[0], data):]
    left -= H + p
os._exit(1)
'''


@pytest.mark.slow
def test_a_channel_filled_to_one_byte_short_is_the_students_not_the_graders_incident(course, check):
    """Red team 16: a cell wrote ready frames to the results channel until one byte of its 256 MiB was left, then
    exited; the restart's own ready frame did not fit, three tries 'could not start', and the notebook was the
    grader's incident (no grade, no 0), every run. It is the student's now: what the channel took is its own."""
    from autograder.outcomes import Status

    nb = solved_notebook(course, A01)
    nb.cells.insert(1, nbformat.v4.new_code_cell(FILL_THE_CHANNEL))
    result, report = check(A01, nb, Limits(cell_seconds=120, notebook_seconds=600))  # time to write 256 MiB
    assert result.status is not Status.INCIDENT, report
    assert "sent too many results" in report, report
