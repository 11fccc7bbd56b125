"""Unit tests for the judging half of autograder/trusted.py, on hand-built inputs: a Job as
build_job would make it, outcomes computed in this process with core.run_case (what the runner
would send) and carried through serialize, and a JobResult as the sandbox would return it.
No sandbox, no nbgrader. The verdict types themselves are tests/test_outcomes.py's.
"""
from __future__ import annotations

import io
import json
import sys
import types

import numpy as np
import pytest

from attention_course import similarity
from autograder import serialize, trusted
from autograder.checks import core, nb01
from autograder.grade import NotebookResult
from autograder.honesty import Finding
from autograder.outcomes import Status, Verdict
from autograder.sandbox import Incident, JobResult

SOFTMAX = trusted.CheckRef("nb01", "softmax", "softmax")
STABILITY = trusted.CheckRef("nb01", "softmax_stability", "softmax")
ATTENTION = trusted.CheckRef("nb01", "basic_self_attention", "basic_self_attention")
TESTS = [trusted.TestCell("test_softmax", 2.0, [SOFTMAX, STABILITY]),
         trusted.TestCell("test_attention", 2.0, [ATTENTION])]
CELLS = [{"kind": "code", "source": "import numpy as np"},
         {"kind": "code", "source": "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e"},
         {"kind": "record", "test": "test_softmax", "checks": []},
         {"kind": "code", "source": "def basic_self_attention(X):\n    return X"},
         {"kind": "record", "test": "test_attention", "checks": []}]
SOFTMAX_CELL, ATTENTION_CELL = 2, 4

RIGHT = ("def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
         "    return e / e.sum(axis=axis, keepdims=True)")
RIGHT_ATTENTION = "def basic_self_attention(X):\n    return softmax(X @ X.T, axis=-1) @ X"


def make_job(sources: list[str] | None = None, answers: dict[str, int] | None = None,
             source_positions: list[int] | None = None) -> trusted.Job:
    """The Job build_job makes of a five-cell notebook (cells 1, 3, 4, 6, 7 of the student's file)."""
    return trusted.Job(cells=[dict(c) for c in CELLS], test_cell_index={"test_softmax": 2, "test_attention": 4},
                       sources=[c["source"] for c in CELLS if c["kind"] == "code"] if sources is None else sources,
                       source_positions=[1, 3, 6] if source_positions is None else source_positions,
                       positions=[1, 3, 4, 6, 7], cell_timeout=60.0,
                       answer_cells={"softmax": 1, "basic_self_attention": 3} if answers is None else answers)


def student(code: str, *extra: str):
    """The student's functions, defined as a notebook would (one namespace for every cell)."""
    namespace = core._default_namespace()
    for source in (code, *extra):
        exec(source, namespace)
    return namespace


def outcomes(test: trusted.TestCell, namespace: dict | None) -> dict:
    """What runner.py sends for one test cell: per check, one outcome per case."""
    namespace = namespace or {}
    return {ref.key: [core.run_case(trusted.exercise(ref), case, namespace.get(ref.variable))
                      for case in trusted.cases(ref)] for ref in test.checks}


def judged(results: dict[int, bytes], job: trusted.Job | None = None, incidents=(), isolation="bubblewrap"):
    job = job or make_job()
    return trusted.judge_job(job, TESTS, JobResult(isolation, list(incidents), results=results)), job


def raw_blob(structure) -> bytes:
    """A blob holding exactly this structure, which dumps would never write."""
    buf = io.BytesIO()
    np.savez(buf, __json__=np.frombuffer(json.dumps(structure).encode(), dtype=np.uint8))
    return buf.getvalue()


def blob(test_index: int, namespace: dict | None, **extra) -> bytes:
    return serialize.dumps({**outcomes(TESTS[test_index], namespace), **extra})


# --------------------------------------------------------------------------- a verdict from an outcome
def _calls_the_reference():
    def softmax(x, axis=-1):
        return similarity.softmax(x, axis=axis)
    return {"softmax": softmax}


VERDICTS = {
    # name: (the student's namespace, cause, mistake, words in the message)
    "right": (lambda: student(RIGHT), "", "", ""),
    "catalogued mistake": (lambda: student(nb01.SOFTMAX_MISTAKES[0].code), "value", nb01.SOFTMAX_MISTAKES[0].name,
                           "softmax gave a wrong result on: large entries (around 1000)"),
    "uncatalogued wrong value": (lambda: student(RIGHT.replace("return e", "return 2 * e")), "value", "",
                                 "softmax gave a wrong result on: x of shape (7,), axis=-1"),
    "missing": (lambda: {}, "missing", "", "softmax: nothing named `softmax` is defined"),
    "not written": (lambda: student("def softmax(x, axis=-1):\n    raise NotImplementedError()"), "notimpl", "",
                    "softmax: not attempted yet (it still raises NotImplementedError)"),
    "calls one not written": (lambda: student("def helper(x):\n    raise NotImplementedError()",
                                              "def softmax(x, axis=-1):\n    return helper(x)"),
                              "notimpl-elsewhere", "",
                              "softmax calls `helper`, which still raises NotImplementedError"),
    "exception": (lambda: student("def softmax(x, axis=-1):\n    return x[100]"), "error", "",
                  "softmax raised IndexError: index 100 is out of bounds for axis 0 with size 7\n"
                  "  on: x of shape (7,), axis=-1"),
    "calls the reference at run time": (_calls_the_reference, "forbidden", "",
                                        "softmax: not accepted, because it calls the course's reference "
                                        "implementation"),
}


def test_a_crash_names_the_line_of_the_notebook_it_came_from():
    """A crash in a helper the graded function calls was told as the graded function's alone; the message now
    says where in the notebook's own code it was raised (cells are compiled under IPython's names for them)."""
    import linecache

    namespace = core._default_namespace()
    for number, source in enumerate(["def helper(x):\n    total = x.sum()\n    return x[100] / total\n",
                                     "def softmax(x, axis=-1):\n    return helper(x)\n"]):
        filename = f"<ipython-input-{number}-0123abcd>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # as IPython does
        exec(compile(source, filename, "exec"), namespace)
    exercise = nb01.check.exercises["softmax"]
    case = core.cases_of(exercise)[0]
    outcome = core.run_case(exercise, case, namespace["softmax"])
    assert outcome[0] == "error" and outcome[3] == "`helper`, line 3 of its cell: return x[100] / total", outcome
    message = core.judge(exercise, case, outcome)
    assert "\n  raised at: `helper`, line 3 of its cell: return x[100] / total\n  on: " in message, message


@pytest.mark.parametrize("name", VERDICTS)
def test_a_verdict_is_formed_from_the_outcomes(name):
    make, cause, mistake, words = VERDICTS[name]
    verdicts, _ = judged({SOFTMAX_CELL: blob(0, make())}, make_job(sources=["x = 1"]))
    v = verdicts["test_softmax"]
    assert (v.passed, v.cause, v.mistake) == (cause == "", cause, mistake)
    assert words in v.message
    if mistake:
        assert f"{core.KNOWN_MISTAKE}{mistake}." in v.message
    if cause == "value":
        assert v.expected and v.received and v.expected != v.received
    else:
        assert (v.expected, v.received) == ("", "")


def test_every_check_of_a_cell_must_pass():
    """test_softmax runs two checks; a softmax right on ordinary inputs but not large ones fails it."""
    namespace = student(nb01.SOFTMAX_MISTAKES[0].code)
    got = outcomes(TESTS[0], namespace)
    assert all(o[0] == "value" for o in got[SOFTMAX.key])
    v = judged({SOFTMAX_CELL: serialize.dumps(got)})[0]["test_softmax"]
    assert not v.passed and v.mistake == "softmax without subtracting the max"


def test_a_static_finding_fails_the_exercise_whatever_the_outcomes():
    source = "from attention_course.similarity import softmax"
    verdicts, job = judged({SOFTMAX_CELL: blob(0, student(RIGHT))},
                           make_job(sources=["import numpy as np", source], source_positions=[1, 3]))
    v = verdicts["test_softmax"]
    assert (v.passed, v.cause) == (False, "forbidden-static")
    assert v.message.startswith("softmax: not accepted, because it uses the course's reference implementation")
    assert v.message.endswith(f"(cell 3 of the notebook, line 1: {source}).")  # counted as Jupyter counts cells
    assert trusted.review_notes(job) == ""  # certain, so not left for a human


# --------------------------------------------------------------------------- unreadable, unreached
def test_what_the_sandbox_sent_is_judged_only_when_it_reads_as_outcomes():
    checks = [("value", 1)] * len(trusted.cases(SOFTMAX))
    cases = {
        "junk": (b"not an npz", "the grader could not read this cell's results (UnsafeBlob: the sandbox's results "
                                "are not a readable .npz"),
        "a malformed structure": (raw_blob({"__seq__": "list"}), "the grader could not read this cell's results ("),
        "a list, not a dict": (serialize.dumps([1, 2]), "softmax: the checks did not complete"),
        "a check missing": (serialize.dumps({STABILITY.key: []}), "softmax: the checks did not complete"),
        "too few cases": (serialize.dumps({SOFTMAX.key: checks[:-1]}), "softmax: the checks did not complete"),
        "an outcome not a tuple": (serialize.dumps({SOFTMAX.key: [["value", 1]] * len(checks)}),
                                   "softmax: unreadable result"),
        "an empty outcome": (serialize.dumps({SOFTMAX.key: [()] * len(checks)}), "softmax: unreadable result"),
        "an outcome kind not a string": (serialize.dumps({SOFTMAX.key: [(1, 2)] * len(checks)}),
                                         "softmax: unreadable result"),
    }
    for name, (data, words) in cases.items():
        v = judged({SOFTMAX_CELL: data})[0]["test_softmax"]
        assert (v.passed, v.cause) == (False, "unreadable") and v.message.startswith(words), name


def test_a_test_cell_without_hidden_checks_fails_as_a_course_bug():
    tests = [trusted.TestCell("test_softmax", 2.0, [])]
    job = make_job()
    verdicts = trusted.judge_job(job, tests, JobResult("bubblewrap", results={SOFTMAX_CELL: blob(0, student(RIGHT))}))
    assert verdicts["test_softmax"] == Verdict(False, "this test cell has no hidden check (a course bug: tell your "
                                                      "instructor)", cause="no-checks")


@pytest.mark.parametrize("incidents, words", [
    ([], "not graded: the notebook stopped before this test, and the grader was not told why"),
    ([Incident(SOFTMAX_CELL, "timeout", "the cell ran past its 60 s limit and ignored the interrupt")],
     "not graded: checking your `softmax` in test cell `test_softmax` (cell 4 of the notebook) ran past the per-cell "
     "time limit of 60 s and ignored the interrupt (it was stopped). The test calls `softmax` on small inputs, which "
     "takes well under a second: look for a loop that never ends."),
    ([Incident(SOFTMAX_CELL, "memory", "the process was killed (out of memory?)")],
     "not graded: checking your `softmax` in test cell `test_softmax` (cell 4 of the notebook) stopped the notebook "
     "(memory: the process was killed (out of memory?))"),
    ([Incident(0, "crash", "the process crashed (segmentation fault)")],
     "not graded: the notebook stopped before this test (cell 1 of the notebook (the code cell starting 'import "
     "numpy as np'): crash, the process crashed (segmentation fault))"),
    ([Incident(1, "timeout", "the cell ran past its 60 s limit and was interrupted", points_kept=True)],
     "not graded: the notebook stopped before this test (cells that ran past the per-cell time limit of 60 s before "
     "it: your answer cell `softmax` (cell 3 of the notebook))"),
    ([Incident(3, "crash", "the process crashed (segmentation fault)")],  # after the test cell: not the reason
     "not graded: the notebook stopped before this test, and the grader was not told why"),
], ids=["no reason", "its own timeout", "its own memory", "an earlier crash", "an earlier slow cell", "a later crash"])
def test_a_test_cell_without_results_says_why(incidents, words):
    v = judged({}, incidents=incidents)[0]["test_softmax"]
    assert (v.passed, v.cause, v.message) == (False, "unreached", words)


# --------------------------------------------------------------------------- a missing function, explained
def test_a_missing_function_is_explained_by_the_answer_cell_s_error():
    errors = {"1": {"type": "NameError", "message": "name 'np' is not defined", "line": 2}}
    v = judged({SOFTMAX_CELL: blob(0, {}, **{trusted.CELL_ERRORS: errors})})[0]["test_softmax"]
    assert v.cause == "missing" and v.message == (
        "softmax: nothing named `softmax` is defined, because your answer cell `softmax` (cell 3 of the notebook) "
        "stopped with NameError: name 'np' is not defined at line 2: `e = np.exp(x)`. Everything after that line in "
        "the cell never ran: fix it and run the cell again.")


@pytest.mark.parametrize("incidents, answers, words", [
    ([], None, "though your answer cell `softmax` (cell 3 of the notebook) ran without an error. Keep the name "
               "`softmax` (was it renamed?)."),
    ([], {}, "and your notebook has no answer cell for softmax (was it deleted, or copied without its metadata?)"),
    ([Incident(1, "timeout", "the cell ran past its 60 s limit and was interrupted", points_kept=True)], None,
     "because your answer cell `softmax` (cell 3 of the notebook) ran past the per-cell time limit of 60 s and was "
     "interrupted before it defined `softmax`. Look for a loop that never ends"),
    ([Incident(1, "crash", "the process crashed (segmentation fault)")], None,
     "because your answer cell `softmax` (cell 3 of the notebook) stopped the notebook (crash: the process crashed "
     "(segmentation fault)), so the grader skipped that cell."),
], ids=["ran fine", "no answer cell", "answer cell timed out", "answer cell crashed"])
def test_a_missing_function_is_explained(incidents, answers, words):
    job = make_job(answers=answers)
    v = judged({SOFTMAX_CELL: blob(0, {})}, job, incidents)[0]["test_softmax"]
    assert v.cause == "missing" and v.message.startswith("softmax: nothing named `softmax` is defined")
    assert words in v.message


def test_the_code_cells_errors_the_sandbox_reports_are_checked_and_bounded():
    reported = {
        "1": {"type": "T" * 300, "message": "m" * 3000, "line": 2},  # kept, cut to 100 and 500 characters
        "3": {"type": "ValueError", "message": "fine", "line": None},
        "2": {"type": "NameError", "message": "a test cell is no code cell", "line": 1},
        "9": {"type": "NameError", "message": "no such cell", "line": 1},
        "-1": {"type": "NameError", "message": "no such cell", "line": 1},
        "zero": {"type": "NameError", "message": "not a number", "line": 1},
        "0": {"type": "NameError", "message": "line not a number", "line": "2"},
    }
    _, job = judged({SOFTMAX_CELL: blob(0, {}, **{trusted.CELL_ERRORS: reported})})
    assert job.errors == {1: {"type": "T" * 100, "message": "m" * 500, "line": 2},
                          3: {"type": "ValueError", "message": "fine", "line": None}}
    for odd in (["a list"], "text", {"1": "not a dict"}, {"1": {"type": 1, "message": "m", "line": 1}}):
        _, job = judged({SOFTMAX_CELL: blob(0, {}, **{trusted.CELL_ERRORS: odd})})
        assert job.errors == {}, odd


# --------------------------------------------------------------------------- the honesty pass's notes
def _finding(severity: str, cell: int, line: int, code: str, reason: str) -> Finding:
    return Finding(severity, ("softmax",), cell, line, code, reason)


@pytest.mark.parametrize("findings, notes", [
    ([], ""),
    ([_finding("forbidden", 0, 1, "import autograder", "it imports the grader")], ""),
    ([_finding("review", 2, 5, "return eval(s)", "it runs code built at run time (eval)")],
     "cell 3, line 5: it runs code built at run time (eval) [return eval(s)]"),
    ([_finding("review", 0, 1, "a", "why a"), _finding("forbidden", 1, 1, "b", "why b"),
      _finding("review", 4, 2, "c", "why c")], "cell 1, line 1: why a [a]; cell 5, line 2: why c [c]"),
], ids=["none", "forbidden only", "one review", "reviews among others"])
def test_review_notes_list_only_what_a_human_must_decide(findings, notes):
    job = make_job(source_positions=[1, 2, 3, 4, 5])
    job.findings = findings
    assert trusted.review_notes(job) == notes


def test_code_flagged_for_review_is_noted_and_never_failed():
    source = "def softmax(x, axis=-1):\n    return eval('x')"
    verdicts, job = judged({SOFTMAX_CELL: blob(0, student(RIGHT))},
                           make_job(sources=["import numpy as np", source], source_positions=[2, 5]))
    assert verdicts["test_softmax"].passed
    assert trusted.review_notes(job).startswith("cell 5, line 2: it runs code built at run time (eval)")


# --------------------------------------------------------------------------- the notebook's status
@pytest.mark.parametrize("incidents, isolation, status, detail, others", [
    ([], "bubblewrap", Status.OK, "", []),
    ([], "namespaces (user)", Status.OK, "", []),
    ([], "none: no user namespaces", Status.SANDBOX, "none: no user namespaces", []),
    ([Incident(SOFTMAX_CELL, "timeout", "ran past 60 s", points_kept=True)], "bubblewrap", Status.TIMEOUT,
     "the checks of test_softmax: ran past 60 s (this test scored 0)", []),
    ([Incident(0, "crash", "segfault")], "bubblewrap", Status.CRASH,
     "the code cell starting 'import numpy as np' (cell 1): segfault (skipped; the rest was graded)", []),
    ([Incident(1, "memory", "killed")], "bubblewrap", Status.MEMORY,
     "the answer cell softmax (cell 3): killed (skipped; the rest was graded)", []),
    ([Incident(-1, "exit", "os._exit(3) outside any cell")], "bubblewrap", Status.EXIT,
     "os._exit(3) outside any cell", []),
    ([Incident(99, "channel", "too much data")], "bubblewrap", Status.CHANNEL, "too much data", []),
    ([Incident(1, "a kind nobody knows", "odd")], "bubblewrap", Status.ERROR,
     "the answer cell softmax (cell 3): odd (skipped; the rest was graded)", []),
    ([Incident(1, "timeout", "slow", points_kept=True), Incident(-1, "crash", "segfault")], "none: off",
     Status.TIMEOUT, "the answer cell softmax (cell 3): slow (the points it earned stand); crash: segfault; "
                     "sandbox: none: off", [Status.CRASH, Status.SANDBOX]),
], ids=["isolated", "namespaces", "not isolated", "test cell timeout", "code cell crash", "answer cell memory",
        "outside any cell", "past the last cell", "unknown kind", "several"])
def test_the_status_is_the_first_incident_with_the_others_in_the_detail(incidents, isolation, status, detail, others):
    assert trusted.incidents_status(JobResult(isolation, incidents), make_job()) == (status, detail, others)


# --------------------------------------------------------------------------- one mistake, one penalty
def _failed(cause: str) -> Verdict:
    return Verdict(False, "why", cause=cause)


@pytest.mark.parametrize("softmax, attention, swaps", [
    (_failed("value"), _failed("value"), {ATTENTION_CELL: ("softmax",)}),
    (_failed("notimpl"), _failed("error"), {ATTENTION_CELL: ("softmax",)}),
    (Verdict(True), _failed("value"), None),  # its dependency passed: the mistake is its own
    (_failed("value"), Verdict(True), None),
    (_failed("value"), _failed("missing"), None),  # causes the course's softmax cannot change
    (_failed("value"), _failed("notimpl"), None),
    (_failed("value"), _failed("forbidden-static"), None),
    (_failed("value"), _failed("unreadable"), None),
], ids=["both wrong", "dependency not written", "dependency passed", "exercise passed", "exercise missing",
        "exercise not written", "exercise forbidden", "exercise unreadable"])
def test_a_second_run_is_planned_only_when_a_failed_dependency_could_be_the_cause(softmax, attention, swaps):
    plan = trusted.isolation_plan(make_job(), TESTS, {"test_softmax": softmax, "test_attention": attention})
    if swaps is None:
        assert plan is None
    else:
        assert plan.swaps == swaps and set(plan.failing["softmax"]) == {"test_softmax"}
        assert plan.modules == {"softmax": "nb01"}


def _isolated(second_results: dict[int, bytes]) -> dict[str, Verdict]:
    """Verdicts after a first run where softmax and basic_self_attention both failed, and a second run."""
    first = {SOFTMAX_CELL: blob(0, student(nb01.SOFTMAX_MISTAKES[4].code)),  # the sum rule
             ATTENTION_CELL: blob(1, {"basic_self_attention": lambda X: X})}
    job = make_job(sources=["x = 1"])
    verdicts = trusted._judge_run(job, TESTS, JobResult("bubblewrap", results=first))
    plan = trusted.isolation_plan(job, TESTS, verdicts)
    assert plan is not None and plan.swaps == {ATTENTION_CELL: ("softmax",)}
    trusted.apply_isolation(job, TESTS, verdicts, plan, JobResult("bubblewrap", results=second_results))
    return verdicts


def test_an_exercise_that_passes_with_the_course_s_dependency_passes_with_a_note():
    namespace = student(RIGHT, RIGHT_ATTENTION)
    verdicts = _isolated({ATTENTION_CELL: blob(1, namespace)})
    v = verdicts["test_attention"]
    assert (v.passed, v.cause) == (True, "isolated")
    assert v.note == ("basic_self_attention passes when it calls the course's `softmax` instead of yours. Your "
                      "`softmax` fails its own test (test_softmax), and that mistake costs points there only.")
    assert not verdicts["test_softmax"].passed  # the dependency's own mistake still costs its own points


def test_an_exercise_that_fails_with_the_course_s_dependency_keeps_its_failure():
    verdicts = _isolated({ATTENTION_CELL: blob(1, {"basic_self_attention": lambda X: X})})
    v = verdicts["test_attention"]
    assert not v.passed and v.cause == "value"
    assert v.message.split("\n")[1] == ("  It fails with the course's `softmax` in place of yours too, so the mistake "
                                        "is in basic_self_attention itself.")


@pytest.mark.parametrize("second", [{}, {ATTENTION_CELL: b"junk"}], ids=["not reached", "unreadable"])
def test_a_second_run_that_says_nothing_leaves_the_first_verdict(second):
    v = _isolated(second)["test_attention"]
    assert not v.passed and v.cause == "value"
    assert v.message.endswith("(The grader also tried basic_self_attention with the course's `softmax` in place of "
                              "yours, but that run did not reach this test, so the result above stands.)")


def test_dependencies_are_closed_under_calls_and_cycles_end(monkeypatch):
    module = types.ModuleType("autograder.checks.unit_fake")
    module.DEPENDS = {"a": ("b",), "b": ("c", "a"), "c": ("d",), "e": ()}
    monkeypatch.setitem(sys.modules, "autograder.checks.unit_fake", module)
    assert trusted.dependencies("unit_fake") == {"a": ("b", "c", "d"), "b": ("c", "a", "d"), "c": ("d",), "e": ()}
    assert trusted.dependencies("nb03") == {"MultiHeadAttention": ("split_heads", "merge_heads")}


# --------------------------------------------------------------------------- said once per notebook
def test_a_message_repeated_in_a_later_cell_points_back_and_hints_are_said_once():
    tests = [trusted.TestCell(f"test_{i}", 1.0, [ref]) for i, ref in enumerate((SOFTMAX, STABILITY, ATTENTION))]
    job = trusted.Job(cells=[{"kind": "record", "test": t.grade_id} for t in tests],
                      test_cell_index={t.grade_id: i for i, t in enumerate(tests)})
    same = "softmax gave a wrong result\n  This matches a known mistake: x.\n  Where to look: here\n  output: differs"
    verdicts = {"test_0": Verdict(False, same), "test_1": Verdict(False, same),
                "test_2": Verdict(False, "basic_self_attention gave a wrong result\n  Where to look: here\n  more")}
    trusted.condense(job, tests, verdicts)
    assert verdicts["test_0"].message == same
    assert verdicts["test_1"].message == ("softmax gave a wrong result\n  This matches a known mistake: x.\n"
                                          "  (the same as under test_0 above)")
    assert verdicts["test_2"].message == "basic_self_attention gave a wrong result\n  more"


def test_a_mistake_named_by_a_later_test_is_named_under_the_first_failing_test_too():
    """A wrong-code audit: softmax over dim=1 in masked_softmax was named under its second failing test only, while
    the first one, the test a student reads first, said "values differ". Another function's later test is no help."""
    tests = [trusted.TestCell(f"test_{i}", 1.0, [ref]) for i, ref in enumerate((SOFTMAX, STABILITY, ATTENTION))]
    job = trusted.Job(cells=[{"kind": "record", "test": t.grade_id} for t in tests],
                      test_cell_index={t.grade_id: i for i, t in enumerate(tests)})
    first = "softmax gave a wrong result on: x\n  output: values differ"
    named = "softmax gave a wrong result on: y\n  This matches a known mistake: the wrong axis.\n  Where to look: dim=-1"
    verdicts = {"test_0": Verdict(False, first), "test_1": Verdict(False, named, mistake="the wrong axis"),
                "test_2": Verdict(False, "basic_self_attention gave a wrong result\n  values differ")}
    trusted.condense(job, tests, verdicts)
    assert verdicts["test_0"].message == ("softmax gave a wrong result on: x\n  This matches a known mistake: the wrong "
                                          "axis (recognised by test_1, below).\n  Where to look: dim=-1\n"
                                          "  output: values differ")
    assert verdicts["test_0"].mistake == "the wrong axis"
    assert "known mistake" not in verdicts["test_2"].message  # basic_self_attention's own: nothing named for it
    assert verdicts["test_1"].message.startswith(named.split("\n  Where")[0])


def test_split_dump_separates_the_expected_and_received_values():
    message = "f gave a wrong result\n    expected: [1 2]\n    received: [1 3]\n  Where to look: f"
    assert trusted.split_dump(message) == ("f gave a wrong result", "\n    expected: [1 2]\n    received: [1 3]",
                                           "\n  Where to look: f")
    assert trusted.split_dump("no values here") == ("no values here", "", "")


def test_a_grader_failure_is_tried_again_then_reported_never_raised(monkeypatch):
    """An exception of the grader's own (not the student's code: that runs in the sandbox) is tried
    once more; a second one is an "error" result naming how often it failed, and the batch goes on."""
    from autograder import grade
    from autograder.submissions import StudentSubmission

    class OneAssignment:
        assignments = ["02_queries_keys_values"]

        def max_score(self, assignment):
            return 14.0

    failures = []

    def flaky(course, student, assignment, data, *rest):
        failures.append(student)
        if student == "unlucky" or len(failures) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=51, after=46)")
        return NotebookResult(student, assignment, 14.0, 14.0, Status.OK)

    monkeypatch.setattr(grade, "grade_notebook", flaky)
    once = grade.grade_one(OneAssignment(), StudentSubmission("lucky", {"02_queries_keys_values": b"{}"}))
    assert [(r.status, r.score) for r in once] == [(Status.OK, 14.0)] and failures == ["lucky", "lucky"]
    twice = grade.grade_one(OneAssignment(), StudentSubmission("unlucky", {"02_queries_keys_values": b"{}"}))
    assert [(r.status, r.score, r.max_score) for r in twice] == [(Status.ERROR, 0.0, 14.0)]
    assert "failed on this notebook, 2 times (SystemError: AST constructor" in twice[0].detail


def test_a_cluster_worker_tries_a_grader_failure_again_too(monkeypatch):
    """The Dask worker's side (autograder/cluster.py judge_task) treats its own failures as grade_one does."""
    from autograder import cluster, selfcheck
    from autograder.settings import Limits

    failures = []

    def flaky(prepared, data, limits, student, hidden=()):
        failures.append(student)
        if student == "unlucky" or len(failures) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=51, after=46)")
        return NotebookResult(student, "02_queries_keys_values", 14.0, 14.0, Status.OK), {}

    monkeypatch.setattr(cluster, "refusal", lambda expected, weak: "")
    monkeypatch.setattr(selfcheck, "prepare", lambda assignment: assignment)
    monkeypatch.setattr(selfcheck, "judge_notebook", flaky)

    def task(student):
        return cluster.Task(student, "02_queries_keys_values", b"{}", "salt", Limits(), None, False)

    assert cluster.judge_task(task("lucky")).result.status is Status.OK and failures == ["lucky", "lucky"]
    judged = cluster.judge_task(task("unlucky")).result
    assert judged.status is Status.ERROR and ", 2 times (SystemError: AST constructor" in judged.detail


@pytest.mark.parametrize("later, hinted", [("", True), ("TEMPERATURE = 2.0", False), ("[TEMPERATURE for TEMPERATURE in (1,)]", True)],
                         ids=["set-only-where-skipped", "also-set-by-a-run-cell", "a-comprehension-binds-nothing"])
def test_a_name_error_points_at_the_skipped_cell_only_when_no_run_cell_sets_it(later, hinted):
    """`TEMPERATURE` set in a grader-skip cell (and maybe in a cell that runs, after the answer): the skipped
    cell is named only when it is the one place the name is set; a comprehension's variable is its own."""
    import nbformat

    skipped = nbformat.v4.new_code_cell("TEMPERATURE = 1.0\n" + "x = 1\n" * 5)
    skipped.metadata["tags"] = [trusted.SKIP_TAG]
    answer = nbformat.v4.new_code_cell("def softmax(x, axis=-1):\n    return np.exp(x / TEMPERATURE)")
    answer.metadata["nbgrader"] = {"grade_id": "softmax", "solution": True}
    test = nbformat.v4.new_code_cell("")
    test.metadata["nbgrader"] = {"grade_id": "test_softmax", "grade": True, "points": 2}
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import numpy as np"), skipped, answer, test,
                                         nbformat.v4.new_code_cell(later)])
    job = trusted.build_job(nb, [trusted.TestCell("test_softmax", 2.0, [SOFTMAX])])
    assert job.skipped and job.skipped[0][0] == 2
    verdicts = {"test_softmax": Verdict(False, "softmax raised NameError: name 'TEMPERATURE' is not defined"),
                "test_attention": Verdict(False, "softmax raised NameError: name 'np' is not defined")}
    trusted._explain_names_set_where_skipped(job, verdicts)
    hint = "`TEMPERATURE` is set only in cell 2 of the notebook, which the grader does not run"
    assert (hint in verdicts["test_softmax"].message) is hinted, verdicts["test_softmax"].message
    assert "Where to look" not in verdicts["test_attention"].message  # np is set by a cell that runs
