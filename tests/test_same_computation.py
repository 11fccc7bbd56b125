"""F7: the same computation under another name. An exercise is not passed by a library function
that computes its result without its name (a distribution parameterised by logits computes a
softmax; log_softmax then exp is one), nor by the course's own modules of later notebooks (they
import the reference of this one). Graded for real: the student's check, in the sandbox."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autograder.checks import nb01
from autograder.checks.core import cases_of, run_case
from autograder.selfcheck import self_check

from .layout import SOLUTIONS

SOFTMAX_ELSEWHERE = {
    "distribution": "def softmax(x, axis=-1):\n    import torch\n    t = torch.as_tensor(np.moveaxis(x, axis, -1))\n"
                    "    return np.moveaxis(torch.distributions.Categorical(logits=t).probs.numpy(), -1, axis)",
    "log-softmax-exp": "def softmax(x, axis=-1):\n    import torch\n    return torch.log_softmax(torch.as_tensor(x), dim=axis).exp().numpy()",
    "tensor-method": "def softmax(x, axis=-1):\n    import torch\n    return torch.as_tensor(x).softmax(axis).numpy()",
    "functional": "def softmax(x, axis=-1):\n    from torch.nn import functional as G\n    import torch\n"
                  "    return G.softmax(torch.as_tensor(x), dim=axis).numpy()",
}
HONEST_TORCH = ("def softmax(x, axis=-1):\n    import torch\n    t = torch.as_tensor(x)\n"
                "    e = torch.exp(t - t.amax(dim=axis, keepdim=True))\n    return (e / e.sum(dim=axis, keepdim=True)).numpy()")


def _softmax_exercise():
    return next(e for e in nb01.EXERCISES if e.name == "softmax")


@pytest.mark.parametrize("name", sorted(SOFTMAX_ELSEWHERE))
def test_softmax_computed_by_a_library_under_another_name_is_refused(name):
    namespace = {"np": __import__("numpy")}
    exec(SOFTMAX_ELSEWHERE[name], namespace)
    outcomes = [run_case(_softmax_exercise(), case, namespace["softmax"]) for case in cases_of(_softmax_exercise())]
    assert {o[0] for o in outcomes} == {"forbidden"}, outcomes[:2]
    assert "softmax someone else wrote" in outcomes[0][1]


def test_a_softmax_written_with_torch_tensors_is_still_accepted():
    namespace = {"np": __import__("numpy")}
    exec(HONEST_TORCH, namespace)
    outcomes = [run_case(_softmax_exercise(), case, namespace["softmax"]) for case in cases_of(_softmax_exercise())]
    assert {o[0] for o in outcomes} == {"value"}


def _with(assignment: str, grade_id: str, code: str, folder: Path) -> Path:
    nb = json.loads((SOLUTIONS / assignment / f"{assignment}.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            cell["source"] = code
    path = folder / f"{assignment}.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_graded_a_distribution_for_softmax_scores_nothing_for_softmax(tmp_path):
    result, verdicts = self_check(_with("01_similarity_attention", "softmax",
                                        "#| export\n" + SOFTMAX_ELSEWHERE["distribution"], tmp_path))
    assert verdicts["softmax"] == "fail"
    assert all(v == "pass" for k, v in verdicts.items() if k != "softmax"), verdicts
    message = " ".join(c.message for c in result.cells if c.exercise == "softmax")
    assert "softmax someone else wrote" in message or "torch" in message, message


def test_a_later_notebooks_module_is_not_importable_while_an_earlier_one_is_graded(tmp_path):
    """Notebook 02's module computes attention under another name: with q = k = X * d**0.25 its
    scaled dot-product attention is notebook 01's basic_self_attention. Grading notebook 01, it is
    not there (the course's modules of this notebook and every later one are not importable)."""
    code = ("#| export\ndef basic_self_attention(X):\n"
            "    import torch\n"
            "    from attention_course.attention import scaled_dot_product_attention as later\n"
            "    t = torch.as_tensor(X, dtype=torch.float64)\n"
            "    q = t * t.shape[-1] ** 0.25\n"
            "    return later(q, q, t)[0].numpy()")
    result, verdicts = self_check(_with("01_similarity_attention", "basic_self_attention", code, tmp_path))
    assert verdicts["basic_self_attention"] == "fail", verdicts
    message = " ".join(c.message for c in result.cells if c.exercise == "basic_self_attention")
    assert "not available while your own code is graded" in message, message
