"""A notebook that is not this assignment's, or whose answer cells are gone (issue 24, item 4).

Built from an instructor's report: another notebook under the right name, or one whose answer
cells were deleted, got `error: nbgrader: KeyError: 'normalize_rows'` and no feedback; `check` on
it said to replace `raise NotImplementedError()` in cells that were not there. Now such a
notebook gets the status "wrong notebook", naming the answer cells it lacks, and a feedback
page saying so; a notebook missing some answer cells (and their tests) is graded for the rest;
`check` says GONE for the missing cells; no raw exception text reaches anyone.

The first tests are on notebooks in memory (no sandbox, no nbgrader); the others grade a small
class for real, and run `check`.
"""
from __future__ import annotations

import csv
import json
import warnings

import nbformat
import pytest

from autograder import selfcheck, trusted
from autograder.course import notebook_path
from autograder.grade import grade
from autograder.outcomes import Status
from autograder.submissions import parse_notebook

from .conftest import solved_notebook

A01, A02 = "01_similarity_attention", "02_queries_keys_values"
ANSWERS = ["normalize_rows", "contextualize", "softmax", "dot_similarity", "cosine_similarity", "basic_self_attention"]
WRONG = "Your notebook has none of the answer cells of 01_similarity_attention: is it another notebook?"


def _source(assignment: str = A01) -> nbformat.NotebookNode:
    return nbformat.read(notebook_path(assignment), as_version=4)


def _without(nb, drop) -> nbformat.NotebookNode:
    """A copy of `nb` without the cells whose grade id `drop` accepts (a set of ids, or a predicate on the metadata)."""
    keep = (lambda meta: meta.get("grade_id") not in drop) if isinstance(drop, set) else (lambda meta: not drop(meta))
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    nb.cells = [c for c in nb.cells if keep(c.metadata.get("nbgrader", {}))]
    return nb


def _is_answer(meta: dict) -> bool:
    return bool(meta.get("solution"))


def _unmarked(nb) -> nbformat.NotebookNode:
    """`nb` with every cell's nbgrader metadata gone: the code pasted into a new notebook."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    return nb


def _prepared(nb, source):
    """(the submission as the grader parses it, normalized) for `nb`."""
    student, problem = parse_notebook(nbformat.writes(nb).encode())
    assert problem is None
    return student, trusted.normalize_submission(student, source)


def _ids(nb) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")]


# --------------------------------------------------------------------------- in memory
def test_another_notebook_is_told_by_its_answer_cells():
    source = _source()
    student, normalized = _prepared(_source(A02), source)
    wrong = trusted.wrong_notebook(student, normalized, source, A01)
    found = ("AdditiveAttention", "scaled_dot_product_attention", "SelfAttention")   # notebook 02's, in its order
    assert wrong == trusted.WrongNotebook(A01, tuple(ANSWERS), found)
    assert wrong.detail.startswith("none of the 6 answer cells of 01_similarity_attention is in this notebook "
                                   f"({', '.join(ANSWERS)}); it has the answer cells of another notebook "
                                   f"({', '.join(found)})")
    lines = wrong.message.split("\n")
    assert lines[0] == WRONG and lines[1].startswith(f"  Expected: the answer cells {', '.join(ANSWERS)}")
    assert lines[2].startswith("  Found: answer cells of another notebook") and lines[3].startswith("  What to do: ")


@pytest.mark.parametrize("drop, wrong", [
    (set(), False), ({"normalize_rows", "test_normalize_rows"}, False), (set(ANSWERS[:-1]), False),
    (_is_answer, True), (lambda meta: bool(meta), True),
], ids=["whole", "one answer and its test deleted", "all answers but one deleted", "every answer deleted",
        "every graded cell deleted"])
def test_a_notebook_is_wrong_only_when_it_has_none_of_the_answer_cells(drop, wrong):
    source = _source()
    student, normalized = _prepared(_without(source, drop), source)
    found = trusted.wrong_notebook(student, normalized, source, A01)
    assert (found is not None) == wrong
    if wrong:
        assert found.found == () and "it has no answer cell at all" in found.detail


def test_answer_cells_that_are_gone_are_put_back_where_they_were_for_nbgrader():
    """nbgrader puts a deleted test cell back after the source cell before it, and failed with a
    KeyError when that cell (its answer cell) was gone too: the answer cells are put back first."""
    source = _source()
    _, normalized = _prepared(_without(source, {"contextualize", "test_contextualize", "softmax"}), source)
    before = nbformat.writes(normalized)
    restored = trusted.with_answer_cells(normalized, source)
    assert nbformat.writes(normalized) == before  # the job's notebook is left as it was
    nbformat.validate(restored)
    assert len({c.id for c in restored.cells}) == len(restored.cells)
    ids = _ids(restored)
    assert ids == [i for i in _ids(source) if i != "test_contextualize"]  # the test: nbgrader's to put back
    put_back = next(c for c in restored.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "contextualize")
    assert put_back.source.startswith("# The grader put this answer cell back, empty: your notebook had no answer "
                                      "cell `contextualize`")
    assert put_back.metadata["nbgrader"]["solution"] and "checksum" not in put_back.metadata["nbgrader"]


def test_another_notebook_gets_every_answer_cell_back_in_order():
    source = _source()
    _, normalized = _prepared(_source(A02), source)
    restored = trusted.with_answer_cells(normalized, source)
    assert _ids(restored)[:len(ANSWERS)] == ANSWERS and len(restored.cells) == len(normalized.cells) + len(ANSWERS)


# --------------------------------------------------------------------------- a class, graded for real
def _copied_cell(nb, gid: str, first: str) -> nbformat.NotebookNode:
    """`nb` with its answer cell `gid` copied in the editor, the copy first holding `first` (metadata and all)."""
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[i])))
    copy.id, copy.source = "a-copy", first
    nb.cells.insert(i, copy)
    return nb


def _with_kernel(nb, kernelspec: dict) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(json.loads(nbformat.writes(nb)))
    nb.metadata["kernelspec"] = kernelspec
    return nb


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    """One class: another notebook under 01's name, 01 with its answer cells deleted (a student whose
    name is in Cyrillic), 01 with one answer cell and its test deleted, 01 pasted into a new notebook
    (every cell unmarked), and an empty zip."""
    root = tmp_path_factory.mktemp("wrong-notebooks")
    solved = solved_notebook(course, A01)
    students = {
        "foreign": solved_notebook(course, A02),
        "Иван Петров": _without(solved, _is_answer),
        "partial": _without(solved, {"normalize_rows", "test_normalize_rows"}),
        "pasted": _unmarked(solved),
        "copied": _copied_cell(solved, "softmax", "def softmax(x, axis=-1):\n    return x"),
        "kernel": _with_kernel(solved, {"name": "ir", "display_name": "R", "language": "R"}),
        "vscode": _with_kernel(solved, {"name": "attn-venv", "display_name": ".venv (3.11)"}),  # no language: Python
    }
    for name, nb in students.items():
        (root / "class" / name).mkdir(parents=True)
        nbformat.write(nb, root / "class" / name / f"{A01}.ipynb")
    (root / "class" / "empty.zip").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # a valid zip of nothing
    big = nbformat.from_dict(json.loads(nbformat.writes(solved)))  # right answers, and a 21 MiB output kept
    next(c for c in big.cells if c.cell_type == "code").outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="x" * (21 * 2**20))]
    (root / "class" / "big").mkdir()
    nbformat.write(big, root / "class" / "big" / f"{A01}.ipynb")
    with warnings.catch_warnings(record=True) as caught:  # what the instructor's console would print
        warnings.simplefilter("always")
        results = grade(root / "class", root / "out", progress=False, workers=2, assignments=[A01])
    GRADING_WARNINGS[:] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return {r.student_id: r for r in results if r.notebook == A01}, root / "out"


GRADING_WARNINGS: list[str] = []


@pytest.mark.slow
def test_a_wrong_notebook_prints_no_warning_of_nbformats_into_the_console(graded):
    """nbgrader's feedback of another notebook handed in under this one's name printed nbformat's
    MissingIDFieldWarning between the progress bar's lines."""
    assert not [w for w in GRADING_WARNINGS if "MissingIDField" in w], GRADING_WARNINGS


@pytest.mark.slow
def test_another_notebook_gets_a_status_naming_the_missing_cells_and_no_exception(graded):
    results, out = graded
    r = results["foreign"]
    assert r.status is Status.WRONG_NOTEBOOK and r.score == 0 and r.other_kinds == []
    assert r.detail.startswith("none of the 6 answer cells of 01_similarity_attention is in this notebook "
                               f"({', '.join(ANSWERS)})")
    assert all(c.score == 0 and c.message.startswith(WRONG) for c in r.cells)
    rows = {row["student_id"]: row for row in csv.DictReader((out / "grades.csv").open())}
    assert rows["foreign"]["status"] == r.status_text and rows["foreign"]["status"].startswith("wrong notebook: ")
    for row in rows.values():
        assert "Error" not in row["status"] and "nbgrader:" not in row["status"], row


@pytest.mark.slow
def test_a_wrong_notebook_has_a_feedback_page_saying_so(graded):
    _, out = graded
    for student in ("foreign", "Ivan_Petrov"):
        page = (out / "feedback" / student / f"{A01}.html").read_text()
        assert "none of the answer cells of 01_similarity_attention" in page, student
        assert "Expected: the answer cells normalize_rows, contextualize" in page, student
        assert "KeyError: &#39;normalize_rows&#39;" not in page and "most recent call last" not in page


@pytest.mark.slow
def test_a_notebook_whose_answer_cells_were_deleted_is_a_wrong_notebook(graded):
    results, _ = graded
    r = results["Ivan_Petrov"]  # the name, transliterated (item 9)
    assert r.status is Status.WRONG_NOTEBOOK and r.score == 0
    assert "it has no answer cell at all" in r.detail
    assert r.cells[0].message.split("\n")[2].startswith("  Found: no answer cell at all")


@pytest.mark.slow
def test_a_notebook_missing_one_answer_cell_and_its_test_is_graded_for_the_rest(graded):
    results, out = graded
    r = results["partial"]
    assert r.status is Status.OK, r.status_text
    missing = {"test_normalize_rows", "test_normalize_rows_apple_in_sentence_2"}
    assert {c.grade_id for c in r.cells if c.score < c.max_score} == missing and r.score == r.max_score - 3
    for c in r.cells:
        if c.grade_id in missing:
            assert c.message.startswith("normalize_rows: nothing named `normalize_rows` is defined, and your notebook "
                                        "has no answer cell for normalize_rows"), c.message
    page = (out / "feedback" / "partial" / f"{A01}.html").read_text()
    assert "no answer cell for normalize_rows" in page and "The grader put this answer cell back" in page


@pytest.mark.slow
def test_code_pasted_into_a_new_notebook_keeps_its_points_and_is_flagged(graded):
    """Unmarked cells are still the student's code (as retyped test cells are): graded, and the
    status tells the instructor that the notebook has none of the answer cells."""
    results, _ = graded
    r = results["pasted"]
    assert r.score == r.max_score and r.status is Status.WRONG_NOTEBOOK


@pytest.mark.slow
def test_an_empty_zip_is_named_in_the_notes(graded):
    results, _ = graded
    r = results["empty"]
    assert r.status is Status.MISSING
    assert r.notes == ["empty.zip: nothing graded from this zip: no notebook (.ipynb) in it (it is empty); zip the "
                       ".ipynb files and upload again"]


@pytest.mark.slow
def test_a_copied_answer_cell_and_another_kernel_are_said_and_cost_nothing(graded):
    """The spec's "duplicated cells ... a changed kernelspec: handled, graded fairly, reported": both were graded
    fairly and said nowhere (a spec audit). Every copy runs, in order; a kernel of another name and no language (VS
    Code's venv) is no change worth a note."""
    results, out = graded
    copied, kernel, vscode = results["copied"], results["kernel"], results["vscode"]
    assert copied.score == kernel.score == vscode.score == copied.max_score
    assert copied.notes == ["as handed in: cell `softmax` appears 2 times (copied in the editor): every copy ran, in "
                            "order, and each test used the definition above it"], copied.notes
    assert kernel.notes == ["as handed in: its kernel was set to R; it was run with the course's Python kernel"], \
        kernel.notes
    assert vscode.notes == []
    rows = {row["student_id"]: row for row in csv.DictReader((out / "grades.csv").open())}
    assert "cell `softmax` appears 2 times" in rows["copied"]["notes"] and "set to R" in rows["kernel"]["notes"]


@pytest.mark.slow
def test_a_notebook_too_large_to_read_is_unreadable_and_says_why_not_missing(graded):
    """Fairness audit 4: a correct notebook with a 21 MiB output was 'missing: no notebook for this assignment was
    submitted', 'nothing handed in' in the report and 0 in the exports; the reason was in the notes only."""
    results, _ = graded
    r = results["big"]
    assert r.status is Status.UNREADABLE, (r.status, r.detail)
    assert r.detail.startswith(f"{A01}.ipynb: the file is 21.") and "clear the cell outputs" in r.detail, r.detail


# --------------------------------------------------------------------------- the student's check
@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(selfcheck.CACHE_ENV, str(tmp_path / "check-cache"))


@pytest.mark.slow
def test_check_says_which_answer_cells_are_gone_not_to_replace_a_stub(course, tmp_path, cache):
    foreign = tmp_path / "foreign" / f"{A01}.ipynb"
    partial = tmp_path / "partial" / f"{A01}.ipynb"
    for path, nb in ((foreign, solved_notebook(course, A02)),
                     (partial, _without(solved_notebook(course, A01), {"softmax"}))):
        path.parent.mkdir()
        nbformat.write(nb, path)

    result, verdicts = selfcheck.self_check(foreign)
    report = selfcheck.format_report(result, verdicts)
    assert result.status is Status.WRONG_NOTEBOOK and set(verdicts.values()) == {"missing"}
    assert report.startswith(f"{A01}: 0 / 17 points  [wrong notebook: none of the 6 answer cells")
    assert "NotImplementedError" not in report and "TODO" not in report
    assert "GONE  softmax" in report and "no answer cell for softmax in your notebook" in report

    result, verdicts = selfcheck.self_check(partial)
    assert result.status is Status.OK and verdicts.pop("softmax") == "missing"
    assert set(verdicts.values()) == {"pass"}


def test_the_other_notebooks_cell_names_are_shown_tamed():
    """The other notebook's grade ids are the submission's own text: no markup, no new lines."""
    source = _source()
    nb = _source(A02)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.metadata["nbgrader"]["grade_id"] = "<b>x</b>\nstatus: ok " + "y" * 100
    student, normalized = _prepared(nb, source)
    wrong = trusted.wrong_notebook(student, normalized, source, A01)
    assert wrong.found == ("?b?x??b??status??ok?" + "y" * 40,)
    assert "\n" not in wrong.detail and "<" not in wrong.message
