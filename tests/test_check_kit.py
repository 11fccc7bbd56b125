"""The checks' shared kit (checks/core.py, checks/tensors.py) and the mistake templates.

* Every mistake template, a module-level `*_SOURCE` string of a checks module (correct code, retyped
  so that mistakes can be written as changes to it), found here without a list: unmodified, and
  used as the student's answer the way its mistakes are, it passes every check of the graded name
  it defines (full marks on that exercise); and every mistake made from it by replacements
  (core.variant) changes it at each step, so that a reworded template cannot silently turn a
  mistake into a copy of the correct code (which no check could then fail).
* The shared helpers behave as the copies they replaced did (those copies are kept below, as they
  were, to compare with).
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

import autograder.checks
from autograder.checks import core, nb03, nb05, nb06, nb07, tensors
from autograder.checks.core import CheckFailed, ForbiddenCall, Mistake, Variant, check_exercise

CHECK_MODULES = [importlib.import_module(f"autograder.checks.{info.name}")
                 for info in pkgutil.iter_modules(autograder.checks.__path__)]
CHECK_MODULES = [m for m in CHECK_MODULES if hasattr(m, "EXERCISES")]

# A template whose definition is not named as the function it is graded as: ATTEND_SOURCE defines
# `_attend` (so that the SelfAttention and MultiHeadAttention mistakes built on it, dropped into a
# notebook, leave the student's own scaled_dot_product_attention alone).
GRADED_AS = {"_attend": "scaled_dot_product_attention"}


@dataclass(frozen=True)
class Template:
    module: object
    name: str
    source: str

    def __str__(self) -> str:
        return f"{self.module.__name__.rsplit('.', 1)[-1]}.{self.name}"


def templates() -> list[Template]:
    """Every module-level `*_SOURCE` string of the checks modules, each once (the first module holding
    it: nb03 imports nb02's ATTEND_SOURCE)."""
    found, seen = [], set()
    for module in CHECK_MODULES:
        for name, value in vars(module).items():
            if name.endswith("_SOURCE") and isinstance(value, str) and id(value) not in seen:
                seen.add(id(value))
                found.append(Template(module, name, value))
    return found


TEMPLATES = templates()


def mistakes_of(module) -> list[Mistake]:
    """The module's catalogued mistakes, each once, in catalogue order."""
    return list(dict.fromkeys(m for e in module.EXERCISES for m in e.mistakes))


def defined_names(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def test_the_templates_are_found():
    assert len(TEMPLATES) >= 12, [str(t) for t in TEMPLATES]
    assert {t.module.__name__ for t in TEMPLATES} >= {"autograder.checks.nb02", "autograder.checks.nb05",
                                                      "autograder.checks.nb07"}


def test_every_mistake_made_by_replacements_comes_from_a_template_found_here():
    known = {id(t.source) for t in TEMPLATES}
    strays = [f"{module.__name__}: {m.name!r}" for module in CHECK_MODULES for m in mistakes_of(module)
              if isinstance(m.code, Variant) and id(m.code.template) not in known]
    assert not strays, ("mistakes made by core.variant from a template that is not a module-level *_SOURCE "
                        f"string, so test_check_kit checks neither the template nor them: {strays}")


@pytest.mark.parametrize("template", TEMPLATES, ids=str)
def test_the_unmodified_template_passes_its_checks(template):
    names = defined_names(template.source)
    graded = {GRADED_AS.get(n, n): n for n in names}
    exercises = [e for e in template.module.EXERCISES if e.graded in graded]
    assert exercises, (f"template {template} defines {names}, none of which is graded in "
                       f"{template.module.__name__} (its graded names: "
                       f"{sorted({e.graded for e in template.module.EXERCISES})})")
    for exercise in exercises:
        answer = Mistake(f"the unmodified template {template}", "", template.source)
        impl = answer.build(graded[exercise.graded], exercise.namespace)
        try:
            check_exercise(exercise, impl)
        except CheckFailed as err:
            pytest.fail(f"template {template}, unmodified, fails the check {exercise.name!r} (it must be correct "
                        f"code: the mistakes are written as changes to it):\n{err}")


@pytest.mark.parametrize("template", TEMPLATES, ids=str)
def test_every_mistake_from_the_template_changes_it(template):
    made = [m for m in mistakes_of(template.module)
            if isinstance(m.code, Variant) and m.code.template is template.source]
    problems = []
    for mistake in made:
        source = template.source
        for step, (old, new) in enumerate(mistake.code.replacements, 1):
            if old not in source:
                problems.append(f"{mistake.name!r}, replacement {step}: {old!r} is not in the template "
                                "(as changed by the replacements before it)")
            elif old == new:
                problems.append(f"{mistake.name!r}, replacement {step}: replaces {old!r} with itself")
            source = source.replace(old, new)
        if source != mistake.code:
            problems.append(f"{mistake.name!r}: its code is not the template with its replacements")
        if source == template.source or _code(source) == _code(template.source):
            problems.append(f"{mistake.name!r}: its code is the template itself")
    assert not problems, f"template {template}: " + "; ".join(problems)


def _code(source: str) -> str:
    """The code as Python reads it (comments and layout aside)."""
    try:
        return ast.dump(ast.parse(source))
    except SyntaxError:
        return source


# --------------------------------------------------------------------------- the shared helpers
# The copies the shared helpers replaced, as they were.
def former_flag(value: bool) -> np.ndarray:  # nb03._flag, nb06._flag
    return np.array([bool(value)])


def former_nb03_raises_value_error(f, x, num_heads) -> np.ndarray:  # nb03._raises_value_error
    try:
        f(x.clone(), num_heads)
    except ValueError:
        return former_flag(True)
    return former_flag(False)


def former_nb06_raises_value_error(f, logits, temperature):  # nb06._raises_value_error
    try:
        f(logits.clone(), temperature=temperature)
    except ValueError:
        return former_flag(True)
    except Exception:  # noqa: BLE001 - as the copy had it
        return former_flag(False)
    return former_flag(False)


def former_raises_value_error(make) -> np.ndarray:  # core.raises_value_error
    try:
        make()
    except ValueError:
        return np.array([True])
    except (NotImplementedError, ForbiddenCall):
        raise
    except Exception:  # noqa: BLE001 - as the copy had it
        return np.array([False])
    return np.array([False])


def former_shape(t) -> str:  # nb02._shape, nb03._shape, nb07._shape
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def former_backward(out, weights) -> None:  # nb02._backward, nb03._backward
    g = torch.Generator().manual_seed(0)
    loss = (out * torch.randn(out.shape, generator=g)).sum() + (weights * torch.randn(weights.shape, generator=g)).sum()
    if loss.requires_grad:
        loss.backward()


def former_t(array) -> torch.Tensor:  # nb05._t, nb07._t
    return torch.tensor(np.asarray(array), dtype=torch.float32)


def former_x(rng, *shape) -> torch.Tensor:  # nb04._x
    return torch.tensor(rng.normal(size=shape), dtype=torch.float32)


def former_random_mask(rng, shape, p=0.5) -> torch.Tensor:  # nb05._random_mask
    m = torch.tensor(rng.uniform(size=shape) < p)
    m[..., rng.integers(shape[-1])] = True
    return m


def former_causal(T: int) -> torch.Tensor:  # nb07._causal
    return torch.ones(T, T, dtype=torch.bool).tril()


def former_load(module, state, shapes: bool):  # nb05._load (shapes=False), nb07._load (shapes=True)
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    own = module.state_dict()
    params = {name for name, _ in module.named_parameters()}
    missing = sorted(set(state) - set(own))
    unexpected = sorted(params - set(state))
    if missing or unexpected:
        raise AttributeError(
            "the module's parameters do not have the names this notebook asks for"
            + (f"; missing: {', '.join(missing[:6])}" if missing else "")
            + (f"; unexpected: {', '.join(unexpected[:6])}" if unexpected else ""))
    if shapes:
        wrong = [f"{k} is {tuple(own[k].shape)}, expected {tuple(v.shape)}" for k, v in state.items()
                 if tuple(own[k].shape) != tuple(v.shape)]
        if wrong:
            raise AttributeError("the module's parameters have the wrong shapes: " + "; ".join(wrong[:4]))
    module.load_state_dict(state, strict=False)
    return module.eval()


def former_variant(source: str, *replacements: tuple[str, str]) -> str:  # nb05._variant, nb07._variant
    for old, new in replacements:
        if old not in source:
            raise ValueError(f"mistake template: {old!r} not found")
        source = source.replace(old, new)
    return source


def outcome(call, *args, **kwargs):
    """What a call did, comparable: ('value', type, dtype, shape, values) or ('raised', type, message)."""
    try:
        value = call(*args, **kwargs)
    except BaseException as err:  # noqa: BLE001 - any outcome is compared
        return ("raised", type(err), str(err))
    if isinstance(value, np.ndarray):
        return ("value", type(value), value.dtype, value.shape, value.tolist())
    if isinstance(value, torch.Tensor):
        return ("value", type(value), value.dtype, tuple(value.shape), value.tolist())
    return ("value", type(value), value)


def returns(value):
    return lambda *args, **kwargs: value


def raising(error: BaseException):
    def f(*args, **kwargs):
        raise error
    return f


BEHAVIOURS = {
    "returns a tensor": returns(torch.zeros(2)),
    "returns None": returns(None),
    "raises ValueError": raising(ValueError("no")),
    "raises a ValueError subclass": raising(UnicodeError("no")),
    "raises TypeError": raising(TypeError("no")),
    "raises NotImplementedError (a stub)": raising(NotImplementedError()),
    "raises ForbiddenCall": raising(ForbiddenCall("a forbidden call")),
    "raises KeyboardInterrupt": raising(KeyboardInterrupt()),
}


@pytest.mark.parametrize("value", [True, False, 0, 1, 3, np.bool_(True), torch.tensor(False)])
def test_flag_is_the_former_flag(value):
    assert outcome(core.flag, value) == outcome(former_flag, value)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
def test_each_raises_helper_is_its_former_copy(behaviour):
    f, x, logits = BEHAVIOURS[behaviour], torch.zeros(1, 2, 4), torch.zeros(3, 5)
    assert outcome(nb03._rejects_head_count, f, x, 3) == outcome(former_nb03_raises_value_error, f, x, 3)
    assert outcome(nb06._rejects_temperature, f, logits, 0.0) == outcome(former_nb06_raises_value_error, f, logits, 0.0)
    assert outcome(core.raises_value_error, f) == outcome(former_raises_value_error, f)


def test_the_raises_helpers_hand_their_arguments_on():
    seen = []

    def split(x, num_heads):
        seen.append(("split", x.shape, num_heads))
        raise ValueError("not divisible")

    def sample(logits, temperature=1.0):
        seen.append(("sample", logits.shape, temperature))

    assert nb03._rejects_head_count(split, torch.zeros(1, 2, 4), 3).tolist() == [True]
    assert nb06._rejects_temperature(sample, torch.zeros(3, 5), -1.0).tolist() == [False]
    assert seen == [("split", (1, 2, 4), 3), ("sample", (3, 5), -1.0)]


@pytest.mark.parametrize("t", [torch.zeros(2, 5, 8), torch.zeros(()), torch.zeros(7), np.zeros((3, 1))],
                         ids=["3-d", "0-d", "1-d", "numpy"])
def test_shape_text_is_the_former_shape(t):
    assert tensors.shape_text(t) == former_shape(t)


@pytest.mark.parametrize("grads", [True, False])
def test_backpropagate_is_the_former_backward(grads):
    def grads_after(backward):
        g = torch.Generator().manual_seed(3)
        q = torch.randn(2, 3, 4, generator=g).requires_grad_(grads)
        w = torch.softmax(q @ q.transpose(-2, -1), dim=-1)
        backward(q * 2, w)
        return q.grad

    ours, theirs = grads_after(tensors.backpropagate), grads_after(former_backward)
    assert (ours is None) == (theirs is None) == (not grads)
    if grads:
        assert torch.equal(ours, theirs)


def test_the_tensor_makers_draw_as_the_former_ones():
    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

    for shape in [(2, 5, 8), (3,), (1, 1, 16)]:
        a, b = np.random.default_rng(7), np.random.default_rng(7)
        assert same(tensors.tensor(a, *shape), former_x(b, *shape))                      # nb04._x
        assert same(tensors.tensor(a, *shape), former_t(b.normal(size=shape)))           # _t(rng.normal(...))
        assert same(tensors.tensor(a, *shape, scale=1.5), former_t(1.5 * b.normal(size=shape)))
        assert same(tensors.tensor(a, *shape, scale=3), former_t(3 * b.normal(size=shape)))
        assert same(tensors.random_mask(a, *shape, p_keep=0.5, keep_column=tensors.RANDOM_COLUMN),
                    former_random_mask(b, shape))                                         # nb05._random_mask
        assert same(tensors.random_mask(a, *shape, p_keep=0.4, keep_column=None),
                    torch.tensor(b.uniform(size=shape) < 0.4))                            # nb07's inline masks
        assert a.random() == b.random()                                                   # as many draws
    values = 10.0 * np.ones((1, 16))
    assert same(tensors.as_float32(values), former_t(values))
    assert same(tensors.as_float32([[0.7, 0.1], [0.2, 0.3]]), former_t([[0.7, 0.1], [0.2, 0.3]]))
    for T in (1, 4, 7):
        assert same(tensors.causal(T), former_causal(T))


class _Pair(nn.Module):
    def __init__(self, d_in=3, d_out=2, name="proj"):
        super().__init__()
        setattr(self, name, nn.Linear(d_in, d_out))
        self.register_buffer("cached", torch.ones(2))  # an extra buffer is fine


@pytest.mark.parametrize("check_shapes", [False, True], ids=["as nb05's", "as nb07's"])
@pytest.mark.parametrize("module", ["right", "wrong names", "wrong shapes", "not a module"])
def test_load_state_is_the_former_load(module, check_shapes):
    state = {"proj.weight": torch.full((2, 3), 0.5), "proj.bias": torch.full((2,), -1.0)}
    make = {"right": lambda: _Pair(), "wrong names": lambda: _Pair(name="linear"),
            "wrong shapes": lambda: _Pair(d_in=4), "not a module": lambda: object()}[module]

    def loaded(load):
        def run():
            m = load(make())
            return tuple(m.state_dict().values()) + (torch.tensor(m.training),)
        return outcome(lambda: [outcome(lambda t=t: t) for t in run()])

    theirs = loaded(lambda m: former_load(m, state, shapes=check_shapes))
    assert loaded(lambda m: tensors.load_state(m, state, check_shapes=check_shapes)) == theirs
    called = nb07.load_state if check_shapes else nb05._load  # as each module calls it
    assert loaded(lambda m: called(m, state)) == theirs


@pytest.mark.parametrize("replacements", [(), (("b", "B"),), (("b", "B"), ("B", "bb")), (("a", "A"), ("z", "Z"))])
def test_variant_is_the_former_variant(replacements):
    source = "a b c b"
    ours, theirs = outcome(core.variant, source, *replacements), outcome(former_variant, source, *replacements)
    if theirs[0] == "raised":
        assert ours == theirs
    else:
        assert ours[0] == "value" and ours[-1] == theirs[-1]
        made = core.variant(source, *replacements)
        assert isinstance(made, str) and made.template is source and made.replacements == replacements


def test_the_check_modules_use_the_shared_helpers():
    """No module keeps (or brings back) a copy of a shared helper under its former name."""
    former = {"_shape", "_backward", "_flag", "_raises_value_error", "_t", "_x", "_causal", "_random_mask",
              "_variant"}
    kept = {f"{m.__name__}.{name}" for m in CHECK_MODULES for name in former
            if callable(getattr(m, name, None)) and not (m is nb06 and name == "_variant")}
    assert not kept, kept
    assert nb07.load_state is tensors.load_state and nb05.variant is core.variant is nb07.variant
