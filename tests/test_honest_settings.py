"""An honest notebook may change PyTorch's process-wide settings in a cell of its own: float64 as the
default dtype, gradients switched off, anomaly detection on. The hidden tests run each case with the
settings the reference ran with, so none of these costs a point (they cost 3 to 24 points each before),
and the student's settings are back when the case ends."""
from __future__ import annotations

import nbformat
import pytest
import torch

from autograder.checks import core

from .conftest import autograde, failed_cells, solved_notebook

SETTINGS = {
    "float64": "torch.set_default_dtype(torch.float64)",
    "no grad": "torch.set_grad_enabled(False)",
    "anomaly detection": "torch.autograd.set_detect_anomaly(True)",
    "TF32 matrix products": "torch.set_float32_matmul_precision('medium')",
}
# a notebook's own default device (on Colab: torch.set_default_device("cuda")); "meta" stands in for it here, a
# device on which nothing is computed at all
DEFAULT_DEVICE = "torch.set_default_device('meta')"


def with_cell_before_the_answers(nb: nbformat.NotebookNode, code: str) -> nbformat.NotebookNode:
    """The notebook with an ungraded cell of the student's just before the first answer cell."""
    first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
    nb.cells.insert(first, nbformat.v4.new_code_cell("import torch\n" + code))
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ["02_queries_keys_values", "03_multi_head_attention", "05_masked_cross_attention",
                                        "06_transformer_translator"])
def test_settings_of_the_students_own_cost_no_points(course, assignment):
    nb = with_cell_before_the_answers(solved_notebook(course, assignment), "\n".join(SETTINGS.values()))
    result = autograde(course, assignment, nb)
    assert failed_cells(result) == set(), [c.message for c in result.cells if c.score < c.max_score]
    assert result.score == result.max_score


@pytest.mark.parametrize("name", [*SETTINGS, "default device"])
def test_a_case_runs_with_the_references_settings_and_gives_the_students_back(name):
    seen = {}

    def case(_impl):
        seen.update(dtype=torch.get_default_dtype(), grad=torch.is_grad_enabled(),
                    anomaly=torch.is_anomaly_enabled(), inference=torch.is_inference_mode_enabled(),
                    precision=torch.get_float32_matmul_precision(), device=torch.zeros(1).device.type)
        return torch.ones(2)

    def settings():
        return (torch.get_default_dtype(), torch.is_grad_enabled(), torch.is_anomaly_enabled(),
                torch.get_float32_matmul_precision(), torch.get_default_device().type)

    exercise = core.Exercise(name="settings", graded="f", reference=lambda: None, cases=lambda rng: [])
    before = settings()
    try:
        exec(SETTINGS.get(name, DEFAULT_DEVICE), {"torch": torch})
        changed = settings()
        outcome = core.run_case(exercise, core.Case("settings", case), lambda: None)
        assert outcome[0] == "value", outcome
        assert seen == dict(dtype=torch.float32, grad=True, anomaly=False, inference=False, precision="highest",
                            device="cpu")
        assert settings() == changed != before
    finally:
        torch.set_default_dtype(before[0])
        torch.set_grad_enabled(before[1])
        torch.autograd.set_detect_anomaly(before[2])
        torch.set_float32_matmul_precision(before[3])
        torch.set_default_device(None)


def test_inference_mode_entered_for_good_is_left_for_the_case():
    seen = []
    mode = torch.inference_mode()
    mode.__enter__()
    try:
        exercise = core.Exercise(name="settings", graded="f", reference=lambda: None, cases=lambda rng: [])
        case = core.Case("settings", lambda _impl: seen.append(torch.is_inference_mode_enabled()) or 1.0)
        assert core.run_case(exercise, case, lambda: None)[0] == "value"
        assert seen == [False] and torch.is_inference_mode_enabled()
    finally:
        mode.__exit__(None, None, None)
