"""Notebook 06 checks: the reference passes, other correct implementations pass too (another beam
search, other samplers, a loss built on F.cross_entropy without its label smoothing), every
catalogued mistake fails and is named, the built-ins and the reference are refused, and real
nbgrader takes points off in exactly the right cells."""
from __future__ import annotations

import textwrap

import pytest
import torch

from attention_course import translate as ref
from autograder.checks import nb06
from autograder.checks.core import CheckFailed, Mistake, check_exercise

from .conftest import autograde, failed_cells, fresh_copy, inject, solved_notebook

ASSIGNMENT = "06_transformer_translator"
STUDENT = fresh_copy(ref)
MISTAKES = [(m, g) for g in sorted({e.graded for e in nb06.EXERCISES})
            for m in {m for e in nb06.EXERCISES if e.graded == g for m in e.mistakes}]


def _exercises(graded):
    return [e for e in nb06.EXERCISES if e.graded == graded]


def _passes_everything(graded, impl):
    for exercise in _exercises(graded):
        check_exercise(exercise, impl)


def _build(code: str, name: str, extra: dict | None = None):
    env = {"torch": torch, "F": torch.nn.functional, "math": __import__("math"), **(extra or {})}
    exec(textwrap.dedent(code), env)
    return env[name]


@pytest.mark.parametrize("exercise", nb06.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    impl = mistake.build(graded)
    messages = []
    for exercise in _exercises(graded):
        try:
            check_exercise(exercise, impl)
        except CheckFailed as err:
            messages.append(str(err))
    assert messages, f"{mistake.name!r} passed every check of {graded}"
    assert any("This matches a known mistake" in m for m in messages), messages


# --------------------------------------------------------------------------- other correct solutions
ONE_SENTENCE_BEAM = Mistake("(correct)", "", nb06._beam_code()).build("beam_search")

GREEDY_ONE_AT_A_TIME = """
def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1]
            mask = (s != pad_id)[:, None, None, :]
            memory = model.encode(s, mask)
            ys = [bos_id]
            for _ in range(max_len):
                logits = model.decode(torch.tensor([ys]), memory, None, mask)
                ys.append(int(logits[0, -1].argmax()))
                if ys[-1] == eos_id:
                    break
            rows.append(ys)
    L = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
"""

GUMBEL_SAMPLER = """
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    if temperature <= 0:
        raise ValueError("temperature")
    x = logits / temperature
    if top_k is not None:
        x = torch.where(x >= x.topk(top_k, -1).values[..., -1:], x, torch.tensor(float("-inf")))
    u = torch.rand(x.shape, generator=generator).clamp(1e-12, 1 - 1e-12)
    return (x - torch.log(-torch.log(u))).argmax(-1)
"""

INVERSE_CDF_SAMPLER = """
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    if not temperature > 0:
        raise ValueError("temperature")
    p = torch.softmax(logits / temperature, dim=-1)
    if top_k is not None:
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(top_k, -1).indices, True)
        p = torch.where(keep, p, torch.zeros_like(p))
        p = p / p.sum(-1, keepdim=True)
    u = torch.rand(p.shape[:-1] + (1,), generator=generator)
    return (p.cumsum(-1) < u).sum(-1).clamp(max=p.size(-1) - 1)
"""

LOSS_FROM_CROSS_ENTROPY = """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    x, y = logits.reshape(-1, V), target.reshape(-1)
    nll = F.cross_entropy(x, y, ignore_index=ignore_index)            # no label smoothing: allowed
    keep = y != ignore_index
    uniform = -F.log_softmax(x, -1).mean(-1)[keep].mean()
    return (1 - epsilon) * nll + epsilon * uniform
"""

NOAM_STYLE_LR = """
def inverse_sqrt_lr(step, warmup, peak_lr):
    return 0.0 if step == 0 else peak_lr * warmup ** 0.5 * min(step ** -0.5, step * warmup ** -1.5)
"""


@pytest.mark.parametrize("graded,code", [
    ("greedy_decode", GREEDY_ONE_AT_A_TIME),
    ("sample_next_token", GUMBEL_SAMPLER),
    ("sample_next_token", INVERSE_CDF_SAMPLER),
    ("label_smoothed_cross_entropy", LOSS_FROM_CROSS_ENTROPY),
    ("inverse_sqrt_lr", NOAM_STYLE_LR),
], ids=["greedy one sentence at a time", "Gumbel-max sampler", "inverse-CDF sampler",
        "loss from F.cross_entropy without smoothing", "Noam-style schedule"])
def test_other_correct_implementations_pass(graded, code):
    _passes_everything(graded, _build(code, graded))


def test_a_one_sentence_at_a_time_beam_search_passes():
    _passes_everything("beam_search", ONE_SENTENCE_BEAM)


# --------------------------------------------------------------------------- refused
def test_builtin_label_smoothing_is_not_accepted():
    def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
        V = logits.size(-1)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
                                                 label_smoothing=epsilon, ignore_index=ignore_index)

    with pytest.raises(CheckFailed, match="label_smoothing"):
        nb06.check("label_smoothed_cross_entropy", label_smoothed_cross_entropy)

    def via_module(logits, target, epsilon=0.1, ignore_index=-100):
        loss = torch.nn.CrossEntropyLoss(label_smoothing=epsilon, ignore_index=ignore_index)
        return loss(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    with pytest.raises(CheckFailed, match="not accepted"):
        nb06.check("label_smoothed_cross_entropy", via_module)


def test_calling_the_reference_is_not_accepted():
    def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
        return ref.beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb06.check("beam_search", beam_search)


def test_stub_is_reported_as_not_attempted():
    def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb06.check("sample_next_token", sample_next_token)


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb06.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


DEMO = ("label_smoothed_cross_entropy", "smoothing mass spread over the V-1 wrong classes instead of all V classes",
        {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"})


@pytest.mark.slow
def test_nbgrader_demo_mistake_costs_exactly_its_cells(course):
    """The notebook-06 entry for the demo's typical-mistake student."""
    graded, name, cells = DEMO
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {graded: _code(graded, name)}))
    assert result.status == "ok"
    assert failed_cells(result) == cells
    assert result.score == result.max_score - 4
    assert "V-1 wrong classes" in " ".join(c.message for c in result.cells)


@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Five functions wrong at once: each loses exactly its own cells (none feeds another's tests)."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "make_masks": _code("make_masks", "the target mask is only causal: target padding is not masked"),
        "inverse_sqrt_lr": _code("inverse_sqrt_lr", "decays like 1/step instead of 1/sqrt(step)"),
        "greedy_decode": _code("greedy_decode", "drops the eos token"),
        "beam_search": _code("beam_search", "ignores the length penalty (ranks finished hypotheses by the raw sum of log p)"),
        "sample_next_token": _code("sample_next_token", "returned the most likely token (argmax) instead of sampling"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {
        "test_make_masks_padding", "test_inverse_sqrt_lr", "test_greedy_decode", "test_greedy_decode_source_padding",
        "test_beam_search", "test_beam_search_length_penalty", "test_sample_next_token", "test_sample_next_token_top_k",
    }
    assert result.score == 2 + 3 + 1 + 1 + 1   # test_make_masks, the loss (3 + 1), beam_size=1, the generator
    messages = " ".join(c.message for c in result.cells)
    assert "drops the eos token" in messages and "argmax" in messages
