"""A result is read while its case is still guarded (a red team's finding, as the ordinary user, in every sandbox).

The runner serialized a test cell's results after the checks had ended, outside the run-time guard and the
behaviour watch. The serializer took any object whose class claimed a `torch` module for a tensor and called
its `.dtype` and `.detach()`, and read an ndarray subclass's own `dtype` property: a result that computed
itself when read ran PyTorch's label smoothing, fused attention or softmax with nobody watching, and took
the points (30/30, 12/14, softmax 5/5). Now `serialize.plain` reads each result into the grader's own types
inside the case (checks/core.py: `_watched_run`), and `encode` sends nothing else.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from autograder import serialize
from autograder.serialize import TensorValue, Unsupported

from .conftest import autograde, failed_cells, inject, solved_notebook

A01, A02, A06 = "01_similarity_attention", "02_queries_keys_values", "06_transformer_translator"
A08 = "08_long_context"

# An object that claims a torch module and works its value out when first read.
LATER = '''
class Later:
    __module__ = "torch.later"
    requires_grad = False

    def __init__(self, make):
        self.make, self.value = make, None

    def get(self):
        if self.value is None:
            self.value = self.make()
        return self.value

    @property
    def dtype(self):
        return self.get().dtype

    def detach(self):
        return self.get().detach()
'''

# A loss worked out the first time the grader looks at it: PyTorch's own label smoothing.
LAZY_LABEL_SMOOTHING = LATER + '''
    def item(self):
        return self.get().item()

    def dim(self):
        return self.get().dim()


def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    return Later(lambda: F.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
                                         ignore_index=ignore_index, label_smoothing=epsilon))
'''

# PyTorch's fused attention, named from strings and run when the result is read.
LAZY_SDPA = '''
from traitlets import import_item

ATTEND = import_item("torch.nn.functional." + "scaled_dot_product_" + "attention")

''' + LATER + '''
    @property
    def shape(self):
        return self.get().shape

    def sum(self, *args, **kwargs):
        return self.get().sum(*args, **kwargs)

    def __getitem__(self, index):
        return self.get()[index]


def scaled_dot_product_attention(q, k, v, mask=None):
    def output():
        return ATTEND(q, k, v, attn_mask=mask)

    def weights():
        eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-1], k.shape[-2])
        return ATTEND(q, k, eye, attn_mask=mask)

    return Later(output), Later(weights)
'''

# An array of zeros that fills itself with nn.Softmax's numbers when its dtype is read.
LAZY_SOFTMAX = '''
import torch

class Probabilities(np.ndarray):
    @property
    def dtype(self):
        if not getattr(self, "ready", True):
            self.ready = True
            layer = torch.nn.Softmax(dim=self.axis)
            np.copyto(self.view(np.ndarray), layer(torch.from_numpy(self.source)).numpy())
        return np.ndarray.dtype.__get__(self)

def softmax(x, axis=-1):
    source = np.array(x, dtype=np.float64)
    out = np.zeros_like(source).view(Probabilities)
    out.source, out.axis, out.ready = source, axis, False
    return out
'''


# A tensor subclass whose `requires_grad` property writes the answer in when the grader first reads it: after the
# case, outside its own scopes (notebook 06's label-smoothing watch, notebook 08's memory reading).
DEFERRED = """
_PENDING = {}
_Base = type(torch.empty(0))  # torch.Tensor, by another spelling


class _Deferred(_Base):
    @property
    def requires_grad(self):
        job = _PENDING.pop(id(self), None)
        if job is not None:
            with torch.no_grad():
                self.copy_(job())
        return False
"""

DEFERRED_LABEL_SMOOTHING = DEFERRED + """


def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    out = torch.zeros((), dtype=logits.dtype).as_subclass(_Deferred)
    _PENDING[id(out)] = lambda: F.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
                                                ignore_index=ignore_index, label_smoothing=epsilon)
    return out
"""

DEFERRED_WHOLE_MATRIX = DEFERRED + """


def _whole_matrix(q, k, v, mask):
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp_min(-1e30)
    e = torch.exp(s - m)
    return (e / e.sum(-1, keepdim=True).clamp_min(1e-30)) @ v


def online_softmax_attention(q, k, v, block_size, mask=None):
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=q.dtype).as_subclass(_Deferred)
    _PENDING[id(out)] = lambda: _whole_matrix(q, k, v, mask)
    return out
"""


@pytest.mark.parametrize("assignment, graded, code, tests", [
    (A06, "label_smoothed_cross_entropy", LAZY_LABEL_SMOOTHING,
     {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"}),
    (A02, "scaled_dot_product_attention", LAZY_SDPA,
     {"test_scaled_dot_product_attention", "test_scaled_dot_product_attention_mask",
      "test_scaled_dot_product_attention_matches_torch"}),
    (A01, "softmax", LAZY_SOFTMAX, {"test_softmax", "test_softmax_stability"}),
    (A06, "label_smoothed_cross_entropy", DEFERRED_LABEL_SMOOTHING,
     {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"}),
    (A08, "online_softmax_attention", DEFERRED_WHOLE_MATRIX, {"test_online_softmax_attention_memory"}),
], ids=["label smoothing", "fused attention", "softmax", "label smoothing, requires_grad", "memory, requires_grad"])
def test_a_result_that_computes_itself_when_read_earns_nothing(course, assignment, graded, code, tests):
    result = autograde(course, assignment, inject(solved_notebook(course, assignment), {graded: code}))
    assert tests <= failed_cells(result), (result.cells, result.status)


class _Reads:
    """An object that records every attribute the serializer reads of it."""

    def __init__(self):
        object.__setattr__(self, "read", [])

    def __getattribute__(self, name):
        if name != "read" and not name.startswith("__"):
            object.__getattribute__(self, "read").append(name)
        return object.__getattribute__(self, name)


class _Array(np.ndarray):
    reads = 0

    @property
    def dtype(self):
        type(self).reads += 1
        return np.ndarray.dtype.__get__(self)


class _Tensor(torch.Tensor):
    pass


def test_encode_reads_nothing_of_an_object_it_did_not_make():
    """Outside the guard (the runner's serializing), a student's object is sent as unsupported, unread."""
    spy = _Reads()
    arr = np.arange(3.0).view(_Array)
    text, arrays = serialize.encode({"spy": spy, "array": arr, "tensor": torch.ones(2)})
    assert spy.read == [] and _Array.reads == 0 and arrays == {}
    got = serialize.loads(serialize.dumps({"spy": spy, "array": arr, "tensor": torch.ones(2)}))
    assert all(isinstance(v, Unsupported) for v in got.values()), got


def test_plain_reads_arrays_and_tensors_through_the_base_classes():
    """Inside the case, `plain` keeps the numbers and drops the student's types and properties."""
    _Array.reads = 0
    arr = np.arange(4.0).reshape(2, 2).view(_Array)
    got = serialize.plain((arr, _Tensor(torch.ones(2, requires_grad=True)), [np.float32(1.5), 2], {3: "x"}))
    assert type(got[0]) is np.ndarray and np.array_equal(got[0], np.arange(4.0).reshape(2, 2)) and _Array.reads == 0
    assert not np.shares_memory(got[0], arr)
    assert type(got[1]) is TensorValue and got[1].dtype == "torch.float32" and got[1].requires_grad
    assert got[2] == [np.float32(1.5), 2] and got[3] == {"3": "x"}
    back = serialize.rebuilt(got)
    assert type(back[1]) is torch.Tensor and torch.equal(back[1], torch.ones(2))


def test_a_students_exception_is_read_under_the_guard():
    """A review found the message of a student's exception written (its own __str__ run) after the guard had ended:
    code there ran with nobody watching. It is read where it was raised, so a library softmax in a __str__ is seen."""
    from autograder.checks import nb01
    from autograder.checks.core import cases_of, run_case

    namespace: dict = {}
    exec(compile('''import torch
class Sneaky(Exception):
    def __str__(self):
        return str(torch.softmax(torch.ones(2), 0))
def softmax(x, axis=-1):
    raise Sneaky()
''', "<ipython-input-sneaky>", "exec"), namespace)
    exercise = next(e for e in nb01.EXERCISES if e.graded == "softmax")
    outcome = run_case(exercise, cases_of(exercise)[0], namespace["softmax"])
    assert outcome[0] == "forbidden", outcome
    honest: dict = {}
    exec(compile("def softmax(x, axis=-1):\n    raise ValueError('axis 3 is out of bounds')\n",
                 "<ipython-input-honest>", "exec"), honest)
    outcome = run_case(exercise, cases_of(exercise)[0], honest["softmax"])
    assert outcome[:3] == ("error", "ValueError", "axis 3 is out of bounds") and "line 2 of its cell" in outcome[3]


def _additive_returning(wrap: str) -> str:
    """Notebook 02's AdditiveAttention, right, but returning its context as `wrap` makes it."""
    import nbformat

    from .layout import SOLUTIONS

    nb = nbformat.read(SOLUTIONS / A02 / f"{A02}.ipynb", as_version=4)
    source = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "AdditiveAttention")
    return source.replace("return weights @ value, weights", f"return {wrap}, weights")


ADDITIVE_TESTS = {"test_AdditiveAttention", "test_AdditiveAttention_mask"}


@pytest.mark.parametrize("wrap, passes", [
    ("(weights @ value).to_sparse()", True),
    ("torch.quantize_per_tensor(weights @ value, 1e-6, 0, torch.qint32)", False),
    ("torch.empty((weights @ value).shape, device='meta')", False),
    ("torch.nested.nested_tensor(list(weights @ value))", False),
], ids=["sparse", "quantized", "meta", "nested"])
def test_a_result_numpy_cannot_hold_is_judged_and_the_run_goes_on(course, wrap, passes):
    """A sparse, quantized, meta or nested tensor used to raise in the runner's dumps: the sandbox's run ended there
    and every later exercise lost its points. Values PyTorch can make dense are judged as values; a tensor with no
    values fails its own exercise, named, and the rest of the notebook is graded as usual."""
    result = autograde(course, A02, inject(solved_notebook(course, A02), {"AdditiveAttention": _additive_returning(wrap)}))
    failed = failed_cells(result)
    assert failed == (set() if passes else ADDITIVE_TESTS), (failed, result.status)
    if not passes:
        messages = " ".join(c.message for c in result.cells if c.grade_id in ADDITIVE_TESTS)
        assert any(what in messages.lower() for what in ("meta device", "nested tensor", "qint32")), messages
