"""Notebook 01 checks: the reference passes, every catalogued mistake fails (and is named),
and real nbgrader takes points off wrong implementations in the right cells."""
from __future__ import annotations

import pytest

from attention_course import similarity as ref
from autograder.checks import nb01
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import assert_mistake_fails_and_is_named, catalogued_mistakes, autograde, failed_cells, fresh_copy, inject, solved_notebook

ASSIGNMENT = "01_similarity_attention"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb01)


@pytest.mark.parametrize("exercise", nb01.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb01, mistake, graded)


def test_calling_the_reference_is_not_accepted():
    def softmax(x, axis=-1):
        return ref.softmax(x, axis)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb01.check("softmax", softmax)


def test_stub_is_reported_as_not_attempted():
    def softmax(x, axis=-1):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb01.check("softmax", softmax)


def _code(graded, name):
    for e in nb01.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Five functions wrong at once (they don't feed each other): each loses its cells."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "normalize_rows": _code("normalize_rows", "divided each row by its maximum"),
        "contextualize": _code("contextualize", "used the columns of W (W.T @ E) instead of its rows"),
        "dot_similarity": _code("dot_similarity", "E.T @ E (a [d, d] matrix) instead of E @ E.T"),
        "cosine_similarity": _code("cosine_similarity", "cosine similarity that forgets to normalize (a plain dot product)"),
        "basic_self_attention": _code("basic_self_attention", "no softmax: (X X^T) X"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {
        "test_normalize_rows", "test_normalize_rows_apple_in_sentence_2", "test_contextualize",
        "test_dot_similarity", "test_cosine_similarity", "test_basic_self_attention",
        "test_basic_self_attention_permutation_equivariance",
    }
    assert result.score == 5  # only softmax (3) and its stability (2) were right
    messages = " ".join(c.message for c in result.cells)
    assert "forgets to normalize" in messages and "no softmax" in messages


@pytest.mark.slow
def test_nbgrader_softmax_mistakes(course):
    """An unstable softmax loses only the stability points; softmax over the whole array
    also breaks the self-attention built on it."""
    unstable = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "softmax": _code("softmax", "softmax without subtracting the max")}))
    assert failed_cells(unstable) == {"test_softmax_stability"}
    assert unstable.score == unstable.max_score - 2
    whole = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {
        "softmax": _code("softmax", "softmax over the whole array instead of along `axis`")}))
    assert {"test_softmax", "test_softmax_stability", "test_basic_self_attention"} <= failed_cells(whole)
    assert "over the whole array" in " ".join(c.message for c in whole.cells)
