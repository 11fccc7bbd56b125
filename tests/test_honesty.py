"""The static honesty pass (autograder/honesty.py) and the runtime guard (core._CallGuard).

Each bypass a hostile class used is written as notebook cells and must be found with the right
severity and exercises; honest idioms, the solutions and the student releases must give nothing."""
from __future__ import annotations

import importlib
import math
import sys
import threading
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from autograder.checks import core, nb08
from autograder.checks.core import CheckFailed
from autograder.honesty import FORBIDDEN, REVIEW, Finding, Rules, rules_for, rules_for_exercises, scan

REPO = Path(__file__).resolve().parents[1]
HEAD = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
HONEST_SDPA = '''def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights
'''
HONEST_SELF_ATTENTION = '''class SelfAttention(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        q = getattr(self, "q_proj")(x)
        return scaled_dot_product_attention(q, self.k_proj(x), self.v_proj(x), mask)
'''


def rules(notebook: str) -> list[Rules]:
    """The merged rules of a notebook's exercises ("02" -> autograder.checks.nb02)."""
    module = importlib.import_module(f"autograder.checks.nb{notebook}")
    return rules_for_exercises(module.check.exercises.values())


def graded(notebook: str) -> tuple[str, ...]:
    return tuple(sorted(r.graded for r in rules(notebook)))


def only(findings: list[Finding], severity: str) -> list[Finding]:
    return [f for f in findings if f.severity == severity]


def one(findings: list[Finding], severity: str) -> Finding:
    """The single finding of that severity (the test fails when there are none or several)."""
    found = only(findings, severity)
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------- rules
def test_rules_name_the_builtins_and_the_reference():
    nb02 = {r.graded: r for r in rules("02")}
    torch_attention = {"scaled_dot_product_attention", "multi_head_attention_forward", "MultiheadAttention",
                       "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder",
                       "Transformer", "flex_attention"}  # every entry to PyTorch's own attention
    assert set(nb02["scaled_dot_product_attention"].banned) == torch_attention
    assert set(nb02["SelfAttention"].banned) == torch_attention | {"SelfAttention"}
    assert nb02["SelfAttention"].reference_module == "attention_course.attention"
    nb03 = {r.graded: r for r in rules("03")}
    assert torch_attention - {"scaled_dot_product_attention"} <= set(nb03["MultiHeadAttention"].banned)
    assert "scaled_dot_product_attention" not in nb03["MultiHeadAttention"].banned  # notebook 02's step: allowed
    nb05 = {r.graded: r for r in rules("05")}
    assert "TransformerEncoderLayer" in nb05["EncoderLayer"].banned
    assert "TransformerEncoderLayer" not in nb05["masked_softmax"].banned
    nb06 = {r.graded: r for r in rules("06")}
    # beam_search's reference lives in the grader; its course module is still translate
    assert nb06["beam_search"].reference_module == "attention_course.translate"
    banned = set(nb01_rule("softmax").banned)  # the library softmaxes, under every name they go by (F7)
    # a categorical distribution normalises its logits; transform_to(simplex) is a softmax transform
    distributions = {"Categorical", "logits_to_probs", "SoftmaxTransform"}
    assert {"softmax", "log_softmax"} | distributions <= banned, banned
    assert all("softmax" in name for name in banned - distributions), banned


def nb01_rule(name: str) -> Rules:
    from autograder.checks import nb01

    return rules_for(nb01.check.exercises[name])


# --------------------------------------------------------------------------- the bypasses
def test_private_aten_op_is_forbidden():
    cells = [HEAD, "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                   "    out, w = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)\n"
                   "    return out, w\n"]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    assert (f.exercises, f.cell, f.line) == (("scaled_dot_product_attention",), 1, 2)
    assert "torch.ops.aten._scaled_dot_product_attention_math" in f.reason and "private" in f.reason


def test_private_torch_c_entry_is_forbidden():
    cells = ["import torch\n", "def label_smoothed_cross_entropy(logits, target, epsilon, ignore_index):\n"
                               "    return torch._C._nn.cross_entropy_loss(logits, target, None, 1, ignore_index, epsilon)\n"]
    f = one(scan(cells, rules("06")), FORBIDDEN)
    assert f.exercises == ("label_smoothed_cross_entropy",) and "torch._C._nn.cross_entropy_loss" in f.reason


def test_builtin_called_from_a_worker_thread_is_forbidden():
    cells = [HEAD + "import threading\n",
             "def worker(q, k, v, box):\n    box.append(F.scaled_dot_product_attention(q, k, v))\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n    box = []\n"
             "    t = threading.Thread(target=worker, args=(q, k, v, box))\n    t.start(); t.join()\n"
             "    return box[0], None\n"]
    findings = scan(cells, rules("02"))
    f = one(findings, FORBIDDEN)
    assert (f.exercises, f.cell, f.line) == (("scaled_dot_product_attention",), 1, 2)
    assert any(r.severity == REVIEW and "thread" in r.reason for r in findings)


def test_switching_off_the_profile_hook_is_forbidden_for_every_exercise():
    cells = [HEAD + "import sys\n", HONEST_SDPA, HONEST_SELF_ATTENTION, "sys.setprofile(None)\n"]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    assert (f.exercises, f.cell, f.line) == (graded("02"), 3, 1) and "sys.setprofile" in f.reason
    aliased = [HEAD, "from threading import settrace as quiet\nquiet(None)\n", HONEST_SDPA]
    assert one(scan(aliased, rules("02")), FORBIDDEN).exercises == graded("02")


def test_alias_imported_in_an_ungraded_cell_is_forbidden_where_it_is_used():
    cells = [HEAD, "from torch.nn.functional import scaled_dot_product_attention as f\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n    return f(q, k, v), None\n",
             HONEST_SELF_ATTENTION]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    # SelfAttention calls the student's scaled_dot_product_attention, which reaches the built-in
    assert (f.exercises, f.cell, f.line) == (("SelfAttention", "scaled_dot_product_attention"), 1, 1)
    assert "as f" in f.reason


def test_module_level_assignment_alias_is_forbidden():
    cells = [HEAD, "attend = torch.nn.functional.scaled_dot_product_attention\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n    return attend(q, k, v), None\n"]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    assert (f.exercises, f.cell) == (("scaled_dot_product_attention",), 1)


def test_rebinding_the_graded_name_to_the_builtin_is_forbidden():
    cells = [HEAD, HONEST_SDPA, "from torch.nn.functional import scaled_dot_product_attention\n"]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    assert (f.exercises, f.cell) == (("scaled_dot_product_attention",), 2)


def test_clearing_the_guard_through_gc_is_reviewed():
    cells = [HEAD + "import gc\n", "for obj in gc.get_objects():\n    if type(obj).__name__ == '_CallGuard':\n"
                                   "        obj.codes.clear()\n", HONEST_SDPA]
    findings = scan(cells, rules("02"))
    assert not only(findings, FORBIDDEN)
    assert {(f.cell, f.line) for f in only(findings, REVIEW) if "gc" in f.reason} == {(0, 5), (1, 1)}


def test_getattr_with_a_built_name_is_review_not_forbidden():
    cells = ["import torch\nfrom torch import nn\n",
             "class EncoderLayer(nn.Module):\n    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, norm_first=False):\n"
             "        super().__init__()\n"
             "        self.layer = getattr(nn, 'Transformer' + 'EncoderLayer')(d_model, num_heads, d_ff, dropout)\n"]
    findings = scan(cells, rules("05"))
    assert not only(findings, FORBIDDEN)
    f = one(findings, REVIEW)
    assert (f.exercises, f.cell, f.line) == (("EncoderLayer",), 1, 4) and "TransformerEncoderLayer" in f.reason


def test_importing_the_grader_is_forbidden_everywhere():
    cells = ["import torch\n", "from autograder.checks.tensors import causal\n",
             "def causal_mask(T):\n    return causal(T)\n"]
    f = one(scan(cells, rules("05")), FORBIDDEN)
    assert (f.exercises, f.cell, f.line) == (graded("05"), 1, 1) and "grader" in f.reason


def test_a_library_function_of_the_exercise_name_is_forbidden():
    nb01 = rules("01")
    spellings = ["    return torch.softmax(torch.from_numpy(np.asarray(x, dtype=float)), dim=axis).numpy()\n",
                 "    return torch.tensor(x).softmax(axis).numpy()\n",
                 "    return scipy.special.softmax(x, axis=axis)\n"]
    for body in spellings:
        cells = ["import numpy as np\nimport torch\nimport scipy.special\n", f"def softmax(x, axis=-1):\n{body}"]
        f = one(scan(cells, nb01), FORBIDDEN)
        assert (f.exercises, f.cell, f.line) == (("softmax",), 1, 2), body
    # basic_self_attention may call the student's own softmax
    cells = ["import numpy as np\n", "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True))\n"
                                     "    return e / e.sum(axis=axis, keepdims=True)\n",
             "def basic_self_attention(X):\n    return softmax(X @ X.T, axis=-1) @ X\n"]
    assert scan(cells, nb01) == []


def test_the_course_reference_is_forbidden_however_it_is_imported():
    """Used where an exercise reaches it: forbidden for that exercise (and what builds on it).
    Imported but never used: flagged for review, no points taken (its other answers are its own)."""
    spellings = ["from attention_course.attention import scaled_dot_product_attention as ref\n",
                 "from attention_course import attention as ref\n",
                 "import attention_course.attention\n"]
    for spelling in spellings:
        unused = scan([HEAD, spelling, HONEST_SDPA], rules("02"))
        assert not only(unused, FORBIDDEN) and "reference" in one(unused, REVIEW).reason, spelling
    used = ["from attention_course.attention import scaled_dot_product_attention\n"]
    f = one(scan([HEAD, *used], rules("02")), FORBIDDEN)
    assert "scaled_dot_product_attention" in f.exercises and "reference" in f.reason
    # a re-export from another course module is the reference all the same
    reexport = ["import torch\nfrom attention_course.evaluation import greedy_decode as g\n"]
    assert any("reference" in f.reason for f in scan(reexport, rules("06")))
    # ... and so is a constant import_module
    dynamic = ["import importlib\n", "def softmax(x, axis=-1):\n"
                                    "    return importlib.import_module('attention_course.similarity').softmax(x, axis)\n"]
    assert any("softmax" in f.exercises and "reference" in f.reason for f in only(scan(dynamic, rules("01")), FORBIDDEN))


def test_code_built_from_strings_is_review_not_forbidden():
    tricks = [
        "    exec('from torch.nn.functional import scaled_dot_product_attention as f', globals())\n"
        "    return f(q, k, v), None\n",
        "    name = ''.join(['scaled_', 'dot_product_attention'])\n    return getattr(F, name)(q, k, v), None\n",
        "    return getattr(F, 'scaled_dot_' + 'product_attention')(q, k, v), None\n",
        "    return getattr(F, base64.b64decode(b'c2NhbGVk').decode())(q, k, v), None\n",
    ]
    for body in tricks:
        cells = [HEAD + "import base64\n", f"def scaled_dot_product_attention(q, k, v, mask=None):\n{body}"]
        findings = scan(cells, rules("02"))
        assert not only(findings, FORBIDDEN), body
        assert any(f.exercises == ("scaled_dot_product_attention",) and f.cell == 1 for f in only(findings, REVIEW)), body


def test_code_the_grader_cannot_read_is_reviewed():
    cases = {
        "star import": [HEAD, "from torch.nn.functional import *\n", HONEST_SDPA],
        "%%writefile": [HEAD, "%%writefile helper.py\nimport torch\n", HONEST_SDPA],
        "getattr passed around": [HEAD, "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                                        "    look = getattr\n    return look(F, NAME)(q, k, v), None\n"],
        "nested too deeply": [HEAD, "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                                    "    return " + " + ".join(["q"] * 900) + ", F.scaled_dot_product_attention(q, k, v)\n"],
    }
    for name, cells in cases.items():
        findings = scan(cells, rules("02"))
        assert not only(findings, FORBIDDEN) and only(findings, REVIEW), name


def test_tampering_tools_are_reviewed():
    tools = ["import inspect\n", "import ctypes\n", "import sys\nsys.modules['torch'] = None\n",
             "from torch.overrides import TorchFunctionMode\n", "import os\nos.write(1, b'x')\n",
             "import sys\nframe = sys._getframe()\n", "f = lambda: 0\nf.__code__ = f.__code__\n"]
    for source in tools:
        findings = scan([HEAD, HONEST_SDPA, source], rules("02"))
        assert not only(findings, FORBIDDEN) and only(findings, REVIEW), source


# --------------------------------------------------------------------------- honest code
def test_honest_idioms_give_no_finding():
    cells = [
        "%matplotlib inline\n" + HEAD + "import numpy as np\nimport matplotlib.pyplot as plt\n",
        "!ls\ntorch.manual_seed(0)\nF.softmax?\n",
        HONEST_SDPA.replace("torch.softmax(scores, dim=-1)", "F.softmax(scores, dim=-1)"),
        HONEST_SELF_ATTENTION,
        # comparing with PyTorch in an ungraded cell, with the graded function's own variable names
        "q = k = v = torch.randn(2, 3, 4)\nout, weights = scaled_dot_product_attention(q, k, v)\n"
        "theirs = F.scaled_dot_product_attention(q, k, v)\nprint((out - theirs).abs().max())\n"
        "fig, ax = plt.subplots()\nax.imshow(weights[0].detach().numpy())\nplt.show()\n",
        # looking attributes up by names from a literal list
        "layer = SelfAttention(4)\nshapes = {name: getattr(layer, name).weight.shape for name in ('q_proj', 'k_proj')}\n",
    ]
    assert scan(cells, rules("02")) == []


def test_a_local_variable_does_not_reach_a_global_of_the_same_name():
    cells = [HEAD, "out = F.scaled_dot_product_attention\n",
             "def scaled_dot_product_attention(q, k, v, mask=None):\n    out = torch.softmax(q @ k.transpose(-2, -1), -1)\n"
             "    return out @ v, out\n"]
    assert scan(cells, rules("02")) == []


def test_a_type_hint_is_not_a_use():
    cells = [HEAD, "class MultiHeadAttention(nn.Module):\n"
                   "    def load_from(self, other: nn.MultiheadAttention) -> None:\n        pass\n"]
    assert scan(cells, rules("03")) == []


def test_ipython_syntax_is_read_and_broken_cells_are_skipped():
    cells = [HEAD + "%load_ext autoreload\n", "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                                              "    %time out = F.scaled_dot_product_attention(q, k, v)\n"
                                              "    return out, None\n",
             "def broken(:\n    F.scaled_dot_product_attention\n"]
    f = one(scan(cells, rules("02")), FORBIDDEN)
    assert (f.cell, f.line) == (1, 2)


def _code_cells(path: Path) -> list[str]:
    """The code cells that run when a submission is graded (test cells are replaced by the grader)."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for c in nb.cells:
        meta = c.metadata.get("nbgrader", {})
        if c.cell_type == "code" and not (meta.get("grade") and not meta.get("solution")) \
                and "colab-install" not in c.metadata.get("tags", []):   # the course's own: skipped (test_colab.py)
            cells.append(c.source)
    return cells


NOTEBOOKS = sorted(p.relative_to(REPO) for folder in ("solutions", "notebooks") for p in (REPO / folder).glob("*/*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_solutions_and_releases_give_no_finding(path: Path):
    cells = _code_cells(REPO / path)
    notebook_rules = rules(path.name[:2])
    assert len(cells) > 5 and len(notebook_rules) >= 2
    assert scan(cells, notebook_rules) == []


def test_the_solutions_reach_their_own_code():
    """Guards the test above against passing vacuously: the same cells with a built-in slipped
    into a graded function give a finding."""
    cells = _code_cells(REPO / "solutions/02_queries_keys_values/02_queries_keys_values.ipynb")
    i = next(i for i, c in enumerate(cells) if "\ndef scaled_dot_product_attention(" in c)
    cells[i] = cells[i].replace("weights = torch.softmax(scores, dim=-1)",
                                "weights = F.scaled_dot_product_attention(q, k, v)")
    # it costs the function and SelfAttention, which calls it; AdditiveAttention never does
    assert one(scan(cells, rules("02")), FORBIDDEN).exercises == ("SelfAttention", "scaled_dot_product_attention")


# --------------------------------------------------------------------------- the runtime guard
def _outcomes(impl) -> set[tuple]:
    """The distinct outcomes of nb02's scaled_dot_product_attention cases on `impl` (values elided)."""
    from autograder.checks import nb02

    ex = nb02.check.exercises["scaled_dot_product_attention"]
    found = set()
    for case in core.cases_of(ex):
        outcome = core.run_case(ex, case, impl)
        found.add(("value",) if outcome[0] == "value" else outcome[:2])
    return found


_honest = {}
exec(HEAD + HONEST_SDPA, _honest)  # the same honest code the static tests scan, as a function
_honest = _honest["scaled_dot_product_attention"]


WHY = ("it calls torch.nn.functional.scaled_dot_product_attention, the built-in this exercise asks you to "
       "write yourself")


def test_runtime_guard_accepts_an_honest_implementation():
    assert _outcomes(_honest) == {("value",)}


def _quiet_threads(monkeypatch):
    monkeypatch.setattr(threading, "excepthook", lambda args: None)


def test_runtime_guard_sees_the_builtin_in_a_worker_thread(monkeypatch):
    _quiet_threads(monkeypatch)

    def in_a_thread(q, k, v, mask=None):
        box = {}
        worker = threading.Thread(target=lambda: box.update(out=F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
        worker.start()
        worker.join()
        return box.get("out"), _honest(q, k, v, mask)[1]

    assert _outcomes(in_a_thread) == {("forbidden", WHY)}


def test_runtime_guard_sees_the_private_aten_kernel(monkeypatch):
    _quiet_threads(monkeypatch)

    def aten(q, k, v, mask=None):
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0], _honest(q, k, v, mask)[1]

    def aten_in_a_thread(q, k, v, mask=None):
        box = {}
        worker = threading.Thread(target=lambda: box.update(out=aten(q, k, v, mask)[0]))
        worker.start()
        worker.join()
        return box.get("out"), _honest(q, k, v, mask)[1]

    def torch_level(q, k, v, mask=None):
        return torch._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0], _honest(q, k, v, mask)[1]

    def called_from_c(q, k, v, mask=None):
        return next(map(F.scaled_dot_product_attention, [q], [k], [v])), _honest(q, k, v, mask)[1]

    def kernel_without_torch_function(q, k, v, mask=None):
        with torch._C.DisableTorchFunction():
            out = next(map(torch._scaled_dot_product_flash_attention_for_cpu, [q], [k], [v]))[0]
        return out, _honest(q, k, v, mask)[1]

    for impl in (aten, aten_in_a_thread, torch_level, called_from_c, kernel_without_torch_function):
        outcomes = _outcomes(impl)  # a kernel is named after the reason: "(PyTorch's `_scaled_dot_..._math` was called)"
        assert {kind for kind, _ in outcomes} == {"forbidden"}, (impl.__name__, outcomes)
        assert all(why.startswith(WHY) for _, why in outcomes), (impl.__name__, outcomes)


def test_runtime_guard_sees_its_hook_switched_off():
    def switch_off(q, k, v, mask=None):
        sys.setprofile(None)
        return _honest(q, k, v, mask)

    (outcome,) = _outcomes(switch_off)
    assert outcome[0] == "forbidden" and "sys.setprofile" in outcome[1]
    assert sys.getprofile() is None and threading.getprofile() is None  # the guard restored both


def test_a_class_attribute_of_the_students_own_is_no_finding_and_no_crash():
    """An answer that keeps a constant on a small class of its own (`class Cfg: eps = 0.0`) is
    honest: the scan once crashed on it (it read `.target` of a plain assignment, which has
    `.targets`), and the whole notebook went ungraded."""
    cells = ["import numpy as np\n",
             "class Cfg:\n    eps = 0.0\n    scale: float = 1.0\n\n"
             "def normalize_rows(S):\n    return Cfg.scale * S / (S.sum(axis=-1, keepdims=True) + Cfg.eps)\n"]
    assert scan(cells, rules("01")) == []


def test_a_library_file_run_as_a_script_is_reviewed():
    """A red team's route to notebook 06's answer: attention_course/model.py run with runpy compiles the
    reference anew, past the runtime guard's identity check (full marks, nothing flagged). It is a copy of
    the course's code, which the static pass cannot tell from the student's own: flagged for a human."""
    cell = ("import os, runpy\nimport attention_course\n"
            "Seq2SeqTransformer = runpy.run_path(os.path.join(os.path.dirname(attention_course.__file__), "
            "'model.py'))['Seq2SeqTransformer']\n")
    findings = scan([HEAD, cell], rules("06"))
    assert any("runpy" in f.reason for f in only(findings, REVIEW)), findings


def test_numbered_layers_set_with_setattr_on_self_are_not_sent_to_review():
    """A fairness audit: `setattr(self, f"norm{i}", nn.LayerNorm(d))` in __init__ (an ordinary way to register
    layers) was sent to an instructor's hand review as an attribute name computed at run time. Setting an attribute
    of one's own named from a plain word reaches nothing; a name that could be special, or another object's, is
    still reviewed."""
    layer = ("class EncoderLayer(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
             "        for i in (1, 2):\n            setattr(self, {name}, nn.LayerNorm(d))\n")
    assert scan([HEAD, layer.format(name='f"norm{i}"')], rules("05")) == []
    for name in ('f"__{i}"', 'f"{i}"', "name"):
        assert only(scan([HEAD, layer.format(name=name)], rules("05")), REVIEW), name
    assert only(scan([HEAD, layer.format(name='f"norm{i}"').replace("setattr(self,", "setattr(nn,")], rules("05")),
                REVIEW)


def test_naming_torch_tensor_or_a_layers_own_forward_is_not_refused():
    """A red team's honest student: notebook 08's answer with `isinstance(mask, (torch.Tensor, type(None)))` lost 6
    of 8 points as turning tensors into numpy arrays (Tensor.__array__ banned the name `Tensor`), and notebook 05's
    rules banned the bare name `forward` (from _BatchNorm.forward). The special method itself stays refused."""
    solution = REPO / "solutions" / "08_long_context" / "08_long_context.ipynb"
    answer = next(c.source for c in nbformat.read(solution, as_version=4).cells
                  if c.metadata.get("nbgrader", {}).get("grade_id") == "online_softmax_attention")
    answer = answer.replace("def online_softmax_attention(", "def _online(", 1)
    wrapper = ("def online_softmax_attention(q, k, v, block_size, mask=None):\n"
               "    assert isinstance(mask, (torch.Tensor, type(None)))\n{extra}"
               "    return _online(q, k, v, block_size, mask)\n")
    assert scan([HEAD, answer, wrapper.format(extra="")], rules("08")) == []
    # the special method itself stays refused, at run time, where its tensor holds the attention's numbers (the
    # name alone refused a .tolist() of block starts: a fairness audit)
    calling = wrapper.format(extra="    q.__array__()\n")
    assert scan([HEAD, answer, calling], rules("08")) == []
    env = {"torch": torch, "math": math}
    exec(answer + "\n" + calling, env)
    with pytest.raises(CheckFailed, match=r"floating-point numbers into numpy arrays \(np.asarray, np.array: "
                                          r"Tensor.__array__\)"):
        nb08.check("online_softmax_attention", env["online_softmax_attention"])
    layer_norm = ("class LayerNorm(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n"
                  "        self.inner = nn.Identity()\n\n    def forward(self, x):\n"
                  "        return self.inner.forward(x - x.mean(-1, keepdim=True))\n")
    assert scan([HEAD, layer_norm], rules("05")) == []
