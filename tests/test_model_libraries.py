"""Hugging Face's transformers is installed with the course (its peer benchmark), and its models hold
ready-made answers to the exercises: eager_attention_forward (notebook 02), DebertaLayerNorm (05) and
LabelSmoother (06) took full marks without a flag. The static pass forbids what an exercise reaches of
it; the runtime guard refuses its code wherever a check enters it, however it was imported."""
from __future__ import annotations

import importlib
import sys
import threading

import pytest
import torch

from autograder.checks import core
from autograder.honesty import FORBIDDEN, rules_for_exercises, scan

from .conftest import autograde, failed_cells, inject, solved_notebook


def rules(notebook: str):
    module = importlib.import_module(f"autograder.checks.nb{notebook}")
    return rules_for_exercises(module.check.exercises.values())


READY_MADE = {
    "02": ["import torch\nfrom transformers.models.bert.modeling_bert import eager_attention_forward\n",
           "def scaled_dot_product_attention(q, k, v, mask=None):\n"
           "    return eager_attention_forward(None, q, k, v, mask, scaling=q.size(-1) ** -0.5)\n"],
    "05": ["import torch\nfrom transformers.models.deberta import modeling_deberta as md\n",
           "class LayerNorm(md.DebertaLayerNorm):\n    def __init__(self, d_model, eps=1e-5):\n"
           "        super().__init__(d_model, eps)\n"],
    "06": ["import torch\nfrom transformers.trainer_pt_utils import LabelSmoother\n",
           "def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index):\n"
           "    return LabelSmoother(epsilon, ignore_index)({'logits': logits}, target)\n"],
}


@pytest.mark.parametrize("notebook", READY_MADE)
def test_an_exercise_that_reaches_transformers_is_forbidden(notebook):
    findings = [f for f in scan(READY_MADE[notebook], rules(notebook)) if f.severity == FORBIDDEN]
    assert findings and all("transformers" in f.reason and "write that part yourself" in f.reason
                            for f in findings), findings


def test_transformers_imported_but_unused_by_the_exercises_is_no_finding():
    cells = ["import torch\nimport transformers\nprint(transformers.__version__)\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n"
             "    w = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)\n    return w @ v, w\n"]
    assert scan(cells, rules("02")) == []


def _exercise():
    return core.Exercise(name="norm", graded="LayerNorm", reference=None, cases=lambda rng: [])


def _deberta_norm(x):
    from transformers.models.deberta.modeling_deberta import DebertaLayerNorm

    return DebertaLayerNorm(x.size(-1))(x)


def _in_a_thread(x):
    box = []
    worker = threading.Thread(target=lambda: box.append(_deberta_norm(x)))
    worker.start()
    worker.join()
    return box[0]


@pytest.mark.parametrize("impl", [_deberta_norm, _in_a_thread], ids=["directly", "in a worker thread"])
def test_transformers_code_entered_during_a_check_is_refused(impl):
    """An exercise with no built-in of its own to forbid is guarded too, once the library is loaded (here
    first by the student's own function, during the case)."""
    case = core.Case("norm", lambda f: f(torch.randn(2, 4)))
    outcome = core.run_case(_exercise(), case, impl)
    assert outcome[0] == "forbidden", outcome
    assert "code of Hugging Face's transformers (transformers/models/deberta/" in outcome[1], outcome


def test_removing_the_library_from_sys_modules_hides_nothing(monkeypatch, request):
    """Every transformers entry of sys.modules deleted after the import, the guard still knows the library: the
    behaviour watch's audit hook saw the import, and its folder is found from where Python would find it."""
    monkeypatch.setattr(core, "_LIBRARY_FOLDERS", set())
    monkeypatch.setattr(core, "_LIBRARIES_IMPORTED", set())
    core.install_behaviour_watch()  # as the sandbox's runner does before any student code
    request.addfinalizer(core.unwatch_thread_starts)

    def forget_transformers():
        for name in [n for n in sys.modules if n == "transformers" or n.startswith("transformers.")]:
            monkeypatch.delitem(sys.modules, name)

    forget_transformers()
    norm = importlib.import_module("transformers.models.deberta.modeling_deberta").DebertaLayerNorm(4)
    forget_transformers()
    assert not any(n.startswith("transformers") for n in sys.modules)
    case = core.Case("norm", lambda f: f(torch.randn(2, 4)))
    outcome = core.run_case(_exercise(), case, lambda x: norm(x))
    assert outcome[0] == "forbidden", outcome


def test_an_honest_case_runs_as_before_with_transformers_loaded():
    importlib.import_module("transformers.models.deberta.modeling_deberta")
    case = core.Case("norm", lambda f: f(torch.ones(2, 4)))
    outcome = core.run_case(_exercise(), case, lambda x: torch.nn.functional.layer_norm(x, (4,)))
    assert outcome[0] == "value"


LAYER_NORM_BY_A_COMPUTED_IMPORT = '''import importlib
_md = importlib.import_module("transformers.models.deberta." + "modeling_deberta")


class LayerNorm(_md.DebertaLayerNorm):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__(d_model, eps)
'''


@pytest.mark.slow
def test_a_ready_made_layer_norm_out_of_the_static_passs_sight_gets_no_points(course):
    """Imported by a computed name, the static pass can only flag it; graded for real, the runtime guard
    takes the LayerNorm points (it took 2 + 1 before)."""
    nb = inject(solved_notebook(course, "05_masked_cross_attention"), {"LayerNorm": LAYER_NORM_BY_A_COMPUTED_IMPORT})
    result = autograde(course, "05_masked_cross_attention", nb)
    failed = failed_cells(result)
    assert {"test_LayerNorm", "test_LayerNorm_gradients"} <= failed, failed
    message = next(c.message for c in result.cells if c.grade_id == "test_LayerNorm")
    assert "transformers" in message, message


LAYER_NORM_FROM_A_RENAMED_CODE_OBJECT = '''import importlib
import types

import torch

_md = importlib.import_module("transformers.models.deberta." + "modeling_deberta")
_forward = _md.DebertaLayerNorm.forward  # its code, said to come from a cell: the run-time guard's folders miss it
_code = _forward.__code__.replace(co_filename="<ipython-input-9-0>")


class LayerNorm(torch.nn.Module):
    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d_model))
        self.bias = torch.nn.Parameter(torch.zeros(d_model))
        self.variance_epsilon = eps

    forward = types.FunctionType(_code, _forward.__globals__)
'''


@pytest.mark.slow
def test_a_ready_made_layer_norm_under_another_name_gets_no_points(course):
    """transformers' own code renamed to look like a cell's got past the run-time guard (which knows code by the
    file it came from); the sandbox holds no copy of the library, so there is nothing to rename."""
    nb = inject(solved_notebook(course, "05_masked_cross_attention"), {"LayerNorm": LAYER_NORM_FROM_A_RENAMED_CODE_OBJECT})
    result = autograde(course, "05_masked_cross_attention", nb)
    failed = failed_cells(result)
    assert {"test_LayerNorm", "test_LayerNorm_gradients"} <= failed, failed
