"""Notebook 08 (long context): the checks of online_softmax_attention and sliding_window_mask against the
reference, other correct answers, the known mistakes, real nbgrader runs, and the shipped GPT that the
notebook reads through a window."""
from __future__ import annotations

import inspect
import math
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_course import efficient, shakespeare_gpt
from attention_course import long_context as ref
from attention_course.attention import scaled_dot_product_attention
from attention_course.measure import TensorMemory
from autograder.checks import nb08
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    fresh_copy,
    inject,
    solved_notebook,
)

ASSIGNMENT = "08_long_context"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb08)


@pytest.mark.parametrize("exercise", nb08.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb08, mistake, graded)


def test_the_issue_s_mistakes_are_catalogued():
    names = {(g, m.name) for m, g in MISTAKES}
    for graded, start in [("online_softmax_attention", "the running sum not rescaled when the max changes"),
                          ("online_softmax_attention", "the whole [T_q, T_k] score matrix built"),
                          ("sliding_window_mask", "off-by-one window")]:
        assert any(g == graded and n.startswith(start) for g, n in names), (graded, start)


# --------------------------------------------------------------------------- other correct answers pass
def online_softmax_attention_alt(q, k, v, block_size, mask=None):
    """Blocks of queries too (FlashAttention's two loops), in log-space: the running log-sum-exp."""
    T_q, T_k = q.shape[-2], k.shape[-2]
    outs = []
    for qs in range(0, T_q, 5):
        qb = q[..., qs:qs + 5, :]
        lse = torch.full((*qb.shape[:-1], 1), float("-inf"))
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1])
        for ks in range(0, T_k, block_size):
            s = qb @ k[..., ks:ks + block_size, :].transpose(-1, -2) / math.sqrt(q.shape[-1])
            if mask is not None:
                s = s.masked_fill(~mask[..., qs:qs + 5, ks:ks + block_size] if mask.shape[-2] > 1
                                  else ~mask[..., ks:ks + block_size], float("-inf"))
            block_lse = torch.logsumexp(s, dim=-1, keepdim=True)
            new_lse = torch.logaddexp(lse, block_lse)
            safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
            acc = acc * torch.exp(lse - safe) + torch.exp(s - safe) @ v[..., ks:ks + block_size, :]
            lse = new_lse
        outs.append(acc)
    return torch.cat(outs, dim=-2)


def online_softmax_attention_additive_mask(q, k, v, block_size, mask=None):
    """The caller's mask turned into an additive float mask once ([T_q, T_k], no batch or head axes: allowed)."""
    bias = None if mask is None else torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    m = torch.full((*q.shape[:-1], 1), float("-inf"))
    l, acc = torch.zeros_like(m), torch.zeros(*q.shape[:-1], v.shape[-1])
    for start in range(0, k.shape[-2], block_size):
        s = q @ k[..., start:start + block_size, :].transpose(-1, -2) / math.sqrt(q.shape[-1])
        if bias is not None:
            s = s + bias[..., start:start + block_size]
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p, c = torch.exp(s - shift), torch.exp(m - shift)
        l, acc, m = l * c + p.sum(-1, keepdim=True), acc * c + p @ v[..., start:start + block_size, :], m_new
    return acc / torch.where(l > 0, l, torch.ones_like(l))


def sliding_window_mask_alt(size, window):
    if window < 1:
        raise ValueError("window")
    ones = torch.ones(size, size, dtype=torch.bool)
    return ones.tril() & ~ones.tril(-window)


@pytest.mark.parametrize("graded,impl", [
    ("online_softmax_attention", online_softmax_attention_alt),
    ("online_softmax_attention", online_softmax_attention_additive_mask), ("sliding_window_mask", sliding_window_mask_alt),
], ids=lambda x: getattr(x, "__name__", x))
def test_other_correct_implementations_pass(graded, impl):
    for exercise in (e for e in nb08.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)


def _changing_its_callers_tensors(change: str):
    """The reference with one line more at the top, which changes the caller's q, k, v or mask in place."""
    source = inspect.getsource(ref.online_softmax_attention).split("\n")
    body_starts = next(i for i, line in enumerate(source) if line.strip().startswith("T_k ="))
    source.insert(body_starts, "    " + change)
    namespace = {"torch": torch, "math": math}
    exec(compile("\n".join(source), "<student>", "exec"), namespace)
    return namespace["online_softmax_attention"]


@pytest.mark.parametrize("change,exercise", [
    ("q = q.mul_(1.0 / math.sqrt(q.shape[-1])) * math.sqrt(q.shape[-1])", "online_softmax_attention"),
    ("mask = None if mask is None else ~mask.logical_not_()", "online_softmax_attention_mask"),
], ids=["q scaled in place", "mask flipped in place"])
def test_an_answer_that_changes_its_callers_tensors_in_place_fails(change, exercise):
    """Every other case hands the function copies, so `q.mul_(scale)` took full points (8 of 8 graded)."""
    with pytest.raises(CheckFailed, match="unchanged after the call"):
        nb08.check(exercise, _changing_its_callers_tensors(change))


# --------------------------------------------------------------------------- honesty
def test_pytorch_fused_attention_is_not_accepted():
    def online_softmax_attention(q, k, v, block_size, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    with pytest.raises(CheckFailed, match="fused attention"):
        nb08.check("online_softmax_attention", online_softmax_attention)


def _online_with(old: str, new: str, preamble: str = ""):
    """The reference's online softmax with one line changed (`old` -> `new`), as a student's own function."""
    env = {"torch": torch, "math": math, "np": __import__("numpy")}
    source = textwrap.dedent(nb08.ONLINE_SOURCE)
    assert old in source, old
    exec(preamble + source.replace(old, new), env)
    return env["online_softmax_attention"]


@pytest.mark.parametrize("old, new", [
    ("for start in range(0, T_k, block_size):", "for start in torch.arange(0, T_k, block_size).tolist():"),
    ("for start in range(0, T_k, block_size):", "for start in map(int, torch.arange(0, T_k, block_size).numpy()):"),
    ("for start in range(0, T_k, block_size):", "for start in map(int, np.asarray(torch.arange(0, T_k, block_size))):"),
    ("        m = m_new\n", "        m = m_new\n        if mask is not None and False:\n            print(mask.tolist())\n"),
    ("        m = m_new\n", "        m = m_new\n        _ = (m.isfinite().sum(-1) > 0).tolist()  # a debug look at the rows\n"),
], ids=["tolist starts", "numpy starts", "asarray starts", "tolist never run", "a few flags"])
def test_indices_or_flags_taken_out_of_pytorch_cost_nothing(old, new):
    """A fairness audit: a correct online softmax looping over torch.arange(...).tolist(), or with a .tolist() in a
    debug line (run or not), got 0 of 6 points: refused by the name alone. Only floating-point tensors are the
    attention's numbers; the static pass never refuses these names, and the memory point counts what they read."""
    from autograder.honesty import rules_for

    impl = _online_with(old, new)
    for exercise in nb08.EXERCISES[:3]:
        check_exercise(exercise, impl)
        assert not {"tolist", "numpy", "__array__", "__dlpack__"} & set(rules_for(exercise).banned), exercise.name


def test_the_attentions_numbers_taken_out_of_pytorch_are_refused_or_counted():
    """The floats themselves, as a list, are refused; quantised to integers first (q * 2**24 as int64, attention in
    Python, the answer handed back as a tensor), they are read out of PyTorch whole and lose the memory point."""
    floats = _online_with("    return acc / torch.where(l > 0, l, torch.ones_like(l))",
                          "    return torch.tensor((acc / torch.where(l > 0, l, torch.ones_like(l))).tolist())")
    with pytest.raises(CheckFailed, match="turns a tensor of floating-point numbers into Python lists"):
        nb08.check("online_softmax_attention", floats)
    quantised = _numpy_by(lambda t: (t * 2 ** 24).long().numpy() / 2 ** 24 if t.is_floating_point() else t.numpy())
    memory = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory")
    with pytest.raises(CheckFailed, match="numbers read out of tensors"):
        check_exercise(memory, quantised)
    # red team 14: the floats' bytes seen as bools (8/8 when a bool counted as 1/32 of a number): counted by their bytes
    with pytest.raises(CheckFailed, match="numbers read out of tensors"):
        check_exercise(memory, _plain_attention_through_bool_views)


def _plain_attention_through_bool_views(q, k, v, block_size, mask=None):
    """Red team 14's: the whole score matrix in numpy, q, k and v read as the bytes of their floats seen as bools, the
    answer copied into a tensor made where the measurement sees it."""
    def raw(t):
        t = t.detach().contiguous()
        return t.numpy() if t.dtype == torch.bool else t.view(torch.bool).numpy().view(np.float32).reshape(t.shape)

    Q, K, V = (raw(x).astype(np.float64) for x in (q, k, v))
    scores = Q @ np.swapaxes(K, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(np.broadcast_to(raw(mask), scores.shape), scores, -np.inf)
    top = scores.max(-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(-1, keepdims=True)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    out.copy_(torch.from_numpy(((weights @ V) / np.where(total == 0, 1.0, total)).astype(np.float32)))
    return out


class _NoFloats(torch.Tensor):
    """A subclass that says it holds no floats."""

    def is_floating_point(self):
        return False


class _Pretender:
    """Says it is a tensor (isinstance), and runs code of its own when asked what it holds."""

    __class__ = property(lambda self: torch.Tensor)
    ran = []

    def is_floating_point(self):
        _Pretender.ran.append(ref.online_softmax_attention(*(torch.randn(1, 3, 4),) * 3, 2))
        return False

    is_complex = is_floating_point


def _patched_is_floating_point(t):
    return False


@pytest.mark.parametrize("take_out", [
    lambda q: q.as_subclass(_NoFloats).tolist(),
    lambda q: q.as_subclass(_NoFloats).numpy(),
    lambda q: torch.Tensor.__array__(_Pretender()),
    lambda q: (setattr(torch.Tensor, "is_floating_point", _patched_is_floating_point), q.tolist()),
], ids=["subclass tolist", "subclass numpy", "pretender", "patched method"])
def test_whether_a_tensor_holds_floats_is_never_asked_of_the_students_own_code(take_out, monkeypatch):
    """A review: the guard asked the student's tensor `is_floating_point()`; a subclass, a patched method or a
    pretender said no, took the scores out of PyTorch, and ran the reference inside the guard's own hook, unwatched.
    Only a plain tensor's dtype, read by PyTorch's C getter, lets numbers out."""
    from autograder.checks.core import ForbiddenCall, _CallGuard

    monkeypatch.setattr(torch.Tensor, "is_floating_point", torch.Tensor.is_floating_point)  # restored afterwards
    _Pretender.ran.clear()
    exercise = next(e for e in nb08.EXERCISES if e.graded == "online_softmax_attention")
    with pytest.raises(ForbiddenCall, match="floating-point numbers"), _CallGuard(exercise.forbidden):
        take_out(torch.randn(2, 3))
    assert _Pretender.ran == []


def test_calling_the_reference_is_not_accepted():
    def sliding_window_mask(size, window):
        return ref.sliding_window_mask(size, window)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb08.check("sliding_window_mask", sliding_window_mask)


def test_stub_is_reported_as_not_attempted():
    def sliding_window_mask(size, window):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb08.check("sliding_window_mask", sliding_window_mask)


def test_online_softmax_never_holds_the_score_matrix():
    B, H, T, D = 1, 2, 256, 8
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    with torch.no_grad(), TensorMemory() as mem:
        out = ref.online_softmax_attention(q, k, v, 32, mask=ref.sliding_window_mask(T, 64))
    assert mem.largest <= B * H * T * 32 * 4, "the largest tensor is one block of scores"
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, ref.sliding_window_mask(T, 64))[0])
    with torch.no_grad(), TensorMemory() as mem:
        scaled_dot_product_attention(q, k, v)
    assert mem.largest == B * H * T * T * 4


# --------------------------------------------------------------------------- the windowed decoder
def _tiny(decoder=None, **options):
    torch.manual_seed(0)
    make = lambda: efficient.GroupedQueryAttention(32, 4, 4)
    return (decoder or efficient.TinyDecoder)(50, 32, 2, make, max_len=40, **options).eval()


def test_sliding_window_decoding_with_and_without_the_cache():
    """The windowed decoder: the cache changes no token; nothing differs from full attention before position W."""
    W = 6
    model = _tiny()
    windowed = _tiny(ref.SlidingWindowDecoder, window=W)
    windowed.load_state_dict(model.state_dict())
    prompt = torch.randint(0, 50, (3, 4))
    tokens = efficient.decode_tokens(windowed, prompt, 30)
    assert torch.equal(tokens, efficient.decode_tokens(windowed, prompt, 30, cache=efficient.KVCache(2)))
    assert torch.equal(tokens, efficient.decode_tokens(windowed, prompt, 30, cache=efficient.PreallocatedKVCache(2, 40)))
    full = efficient.decode_tokens(model, prompt, 30)
    assert torch.equal(tokens[:, :W + 1], full[:, :W + 1])
    with torch.no_grad():
        x = torch.randint(0, 50, (1, 20))
        logits_full, logits_window = model(x), windowed(x)
        wide = _tiny(ref.SlidingWindowDecoder, window=20)
        wide.load_state_dict(model.state_dict())
        assert torch.equal(wide(x), logits_full), "a window as long as the sequence is full attention"
    assert torch.equal(logits_window[:, :W], logits_full[:, :W]), "positions before W lose nothing"
    assert not torch.allclose(logits_window[:, W:], logits_full[:, W:]), "later positions read fewer keys"


def test_the_shipped_gpt_has_learned_and_loads_windowed():
    """models/shakespeare-gpt: notebook 07's recipe, well below uniform guessing on the held-out text, and the
    same weights in the windowed class."""
    gpt, vocab = shakespeare_gpt.load_shakespeare_gpt()
    loss = vocab.held_out_loss(gpt)
    assert loss < 0.6 * math.log(len(vocab.chars)), f"held-out loss {loss:.2f}: the shipped model has not learned"
    windowed, _ = shakespeare_gpt.load_shakespeare_gpt(ref.SlidingWindowDecoder, window=32)
    assert isinstance(windowed, ref.SlidingWindowDecoder) and windowed.window == 32
    for (name, a), b in zip(gpt.state_dict().items(), windowed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert vocab.decode(vocab.encode("ROMEO:\n")[0]) == "ROMEO:\n"
    with pytest.raises(ValueError, match="never saw"):
        vocab.encode("ROMEO: \u00e9")


def test_a_damaged_shipped_gpt_is_refused_by_name(tmp_path, monkeypatch):
    folder = tmp_path / shakespeare_gpt.NAME
    folder.mkdir()
    for name in (shakespeare_gpt.WEIGHTS, shakespeare_gpt.SUMMARY):
        (folder / name).write_bytes((shakespeare_gpt.folder() / name).read_bytes())
    monkeypatch.setattr(shakespeare_gpt, "folder", lambda: folder)
    shakespeare_gpt.load_shakespeare_gpt()                                    # an intact copy loads
    with (folder / shakespeare_gpt.WEIGHTS).open("r+b") as f:
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    with pytest.raises(ValueError, match="does not match the SHA-256.*python -m attention_course.shakespeare_gpt"):
        shakespeare_gpt.load_shakespeare_gpt()
    (folder / shakespeare_gpt.WEIGHTS).unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        shakespeare_gpt.load_shakespeare_gpt()


# --------------------------------------------------------------------------- real nbgrader
ALL_CELLS = {"test_online_softmax_attention", "test_online_softmax_attention_mask", "test_online_softmax_attention_memory",
             "test_sliding_window_mask"}
TOTAL = 8


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == TOTAL, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


def _code(graded, start):
    for m, g in MISTAKES:
        if g == graded and m.name.startswith(start):
            return m.code
    raise KeyError(start)


@pytest.mark.slow
def test_nbgrader_takes_points_for_the_issue_s_mistakes(course):
    """Both exercises wrong at once, each with a mistake the issue names: every cell fails (the memory cell
    judges the output too), and the feedback names each mistake."""
    mistakes = {"online_softmax_attention": ("online_softmax_attention", "the running sum not rescaled"),
                "sliding_window_mask": ("sliding_window_mask", "off-by-one window: window + 1")}
    nb = inject(solved_notebook(course, ASSIGNMENT), {g: _code(*m) for g, m in mistakes.items()})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok" and failed_cells(result) == ALL_CELLS and result.score == 0
    by_cell = {c.grade_id: c.message for c in result.cells}
    for cell, (_graded, start) in [("test_online_softmax_attention", mistakes["online_softmax_attention"]),
                                  ("test_sliding_window_mask", mistakes["sliding_window_mask"])]:
        assert f"This matches a known mistake: {start}" in by_cell[cell], (cell, by_cell[cell])


@pytest.mark.slow
def test_nbgrader_a_tiled_answer_that_holds_the_matrix_loses_the_memory_point(course):
    """The plain-attention answer gives the right numbers: the output cells pass, the memory cell does not."""
    nb = inject(solved_notebook(course, ASSIGNMENT),
                {"online_softmax_attention": _code("online_softmax_attention", "the whole [T_q, T_k] score matrix")})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok" and failed_cells(result) == {"test_online_softmax_attention_memory"}
    assert result.score == TOTAL - 1


def online_softmax_attention_float64(q, k, v, block_size, mask=None):
    """Correct, and more exact than the reference: the whole computation in float64, returned as float32."""
    return STUDENT["online_softmax_attention"](q.double(), k.double(), v.double(), block_size, mask=mask).float()


def test_a_float64_student_passes_the_ill_conditioned_cases_under_every_salt():
    """Scores of -400 are rounded by about 3e-5 in the float32 reference; a float64 answer is that far from
    it. With the exercise's atol of 1e-5 it lost this case under salt-41 of these 60 (5 salts in 200)."""
    from autograder.checks.core import THREAD_SALT

    exercise = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention")
    failed = []
    for n in range(60):
        token = THREAD_SALT.set(f"salt-{n}")
        try:
            check_exercise(exercise, online_softmax_attention_float64)
        except CheckFailed as failure:
            failed.append((n, str(failure).splitlines()[0]))
        finally:
            THREAD_SALT.reset(token)
    assert failed == [], failed


def whole_matrix_into_an_out_tensor(q, k, v, block_size, mask=None):
    """A red team's plain attention: the score matrix written by torch.matmul into an empty `out=` tensor,
    then only in-place steps. The probe took the resized `out=` for an input, and never counted it."""
    s = q.new_empty(0)
    torch.matmul(q, k.transpose(-2, -1), out=s)
    s.mul_(1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        s.masked_fill_(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = m.masked_fill(m == float("-inf"), 0.0)
    s.sub_(m).exp_()
    z = s.sum(-1, keepdim=True)
    s.div_(torch.where(z > 0, z, torch.ones_like(z)))
    return s @ v


def whole_matrix_in_numpy(q, k, v, block_size, mask=None):
    """... and the score matrix built in numpy, out of the dispatcher's sight."""
    import numpy as np

    Q, K, V = q.double().numpy(), k.double().numpy(), v.double().numpy()
    s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
    if mask is not None:
        s = np.where(np.broadcast_to(mask.numpy(), s.shape), s, -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(mx), mx, 0))
    z = e.sum(-1, keepdims=True)
    return torch.from_numpy((e / np.where(z > 0, z, 1) @ V).astype(np.float32))


def _numpy_by(convert):
    """whole_matrix_in_numpy, its tensors taken out another way."""
    def online_softmax_attention(q, k, v, block_size, mask=None):
        import numpy as np

        Q, K, V = (np.asarray(convert(t), dtype=np.float64) for t in (q, k, v))
        s = Q @ np.swapaxes(K, -1, -2) / math.sqrt(Q.shape[-1])
        if mask is not None:
            s = np.where(np.broadcast_to(np.asarray(convert(mask)), s.shape), s, -np.inf)
        mx = s.max(-1, keepdims=True)
        e = np.exp(s - np.where(np.isfinite(mx), mx, 0))
        z = e.sum(-1, keepdims=True)
        return torch.from_numpy((e / np.where(z > 0, z, 1) @ V).astype(np.float32))
    return online_softmax_attention


def every_key_for_a_few_queries(q, k, v, block_size, mask=None, manual=False):
    """A red team's 8/8: plain softmax attention over all keys, block_size queries at a time. Its largest tensor is
    the online algorithm's size ([.., block, T_k] against [.., T_q, block]); no running max, no rescaling."""
    outs = []
    for start in range(0, q.shape[-2], block_size):
        s = q[..., start:start + block_size, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~torch.broadcast_to(mask, (*q.shape[:-1], k.shape[-2]))[..., start:start + block_size, :],
                              float("-inf"))
        if manual:  # the softmax written out: a max and a sum over every key
            e = (s - s.amax(-1, keepdim=True).clamp(min=-1e30)).exp()
            w = e / e.sum(-1, keepdim=True).clamp(min=1e-30)
        else:
            w = torch.softmax(s, dim=-1).nan_to_num(0.0)
        outs.append(w @ v)
    return torch.cat(outs, dim=-2)


@pytest.mark.parametrize("impl", [every_key_for_a_few_queries,
                                  lambda q, k, v, b, mask=None: every_key_for_a_few_queries(q, k, v, b, mask, True)],
                         ids=["torch.softmax", "written out"])
def test_attention_over_every_key_a_few_queries_at_a_time_loses_the_memory_point(impl):
    memory = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory")
    with pytest.raises(CheckFailed, match="more than 32 of the 96 keys at once"):
        check_exercise(memory, impl)
    output = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention")
    check_exercise(output, impl)  # its numbers are right: only the memory point is lost


def _plain_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def out_of_the_modes_sight(q, k, v, block_size, mask=None):
    """A red team's 8/8: every dispatch mode popped off PyTorch's stack (the measurement's with them), the whole
    score matrix made, the modes pushed back before returning."""
    from torch.utils._python_dispatch import _len_torch_dispatch_stack, _pop_mode, _push_mode

    popped = [_pop_mode() for _ in range(_len_torch_dispatch_stack())]
    try:
        return _plain_attention(q, k, v, mask)
    finally:
        for mode in reversed(popped):
            _push_mode(mode)


def in_python_floats(q, k, v, block_size, mask=None):
    """A red team's 8/8: every number read out with .item() (which no rule refused), attention in Python lists."""
    lead, (T_q, D), T_k, Dv = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    Q, K, V = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    rows = []
    for b in range(Q.shape[0]):
        Kb = [[K[b, j, d].item() for d in range(D)] for j in range(T_k)]
        Vb = [[V[b, j, d].item() for d in range(Dv)] for j in range(T_k)]
        for i in range(T_q):
            qi = [Q[b, i, d].item() for d in range(D)]
            s = [sum(x * y for x, y in zip(qi, kj, strict=True)) / math.sqrt(D) for kj in Kb]
            e = [math.exp(x - max(s)) for x in s]
            rows.append([sum(w * vj[c] for w, vj in zip(e, Vb, strict=True)) / sum(e) for c in range(Dv)])
    return torch.tensor(rows, dtype=q.dtype).reshape(*lead, T_q, Dv)


def modes_popped_then_cloned(q, k, v, block_size, mask=None):
    """A reviewer's 8/8: out_of_the_modes_sight, its answer cloned after the modes are back (the mode saw the clone)."""
    return out_of_the_modes_sight(q, k, v, block_size, mask).clone()


def modes_popped_in_c(q, k, v, block_size, mask=None):
    """The same with PyTorch's C functions, looked up by a computed name."""
    from torch.utils._python_dispatch import _len_torch_dispatch_stack

    pop, push = (getattr(torch._C, "_" + name) for name in ("pop_torch_dispatch_stack", "push_on_torch_dispatch_stack"))
    popped = [pop() for _ in range(_len_torch_dispatch_stack())]
    try:
        out = _plain_attention(q, k, v, mask)
    finally:
        for mode in reversed(popped):
            push(mode)
    return out.clone()


@pytest.mark.parametrize("impl", [modes_popped_then_cloned, modes_popped_in_c], ids=["cloned", "in C"])
def test_popping_the_dispatch_modes_by_hand_is_refused(impl):
    for name in ("online_softmax_attention", "online_softmax_attention_memory"):
        with pytest.raises(CheckFailed, match="not accepted, because it switches PyTorch's dispatch modes off"):
            check_exercise(next(e for e in nb08.EXERCISES if e.name == name), impl)


@pytest.mark.parametrize("extra", [
    "        print(m)\n",  # PyTorch's printing turns the modes off while it formats the tensor
    "        with _noted():\n            pass\n",  # a @contextmanager of the student's own
], ids=["print(m)", "own context manager"])
def test_a_debug_print_or_a_context_manager_keeps_every_point(extra, capsys):
    """A reviewer: a leftover print(m) had the whole exercise refused as switching the dispatch modes off (PyTorch's
    printing does, for itself), as was any @contextmanager (its code object is contextlib's, shared by all)."""
    env = {"torch": torch, "math": math}
    exec("import contextlib\n@contextlib.contextmanager\ndef _noted():\n    yield\n", env)
    exec(textwrap.dedent(nb08.ONLINE_SOURCE).replace("        m = m_new\n", "        m = m_new\n" + extra), env)
    for exercise in nb08.EXERCISES[:3]:
        check_exercise(exercise, env["online_softmax_attention"])


@pytest.mark.parametrize("impl", [out_of_the_modes_sight, in_python_floats], ids=["modes popped", "Python floats"])
def test_attention_made_out_of_the_measurements_sight_loses_the_memory_point(impl):
    memory = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory")
    with pytest.raises(CheckFailed, match=r"(?s)not accepted, because it switches PyTorch's dispatch modes off|"
                                          r"at most 768 numbers read out of tensors with \.item\(\), "
                                          r"float\(\), int\(\), \.tolist\(\) or \.numpy\(\)\).*output\[1\]: .*expected True, got False"):
        check_exercise(memory, impl)


def test_an_online_softmax_computed_in_float64_keeps_the_memory_point():
    """A reviewer: casting q, k and v to float64 (then the answer back to float32) made a copy of k exactly half the
    score matrix, not below it: a correct, careful student lost the point, told "the whole score matrix built"."""
    env = {"torch": torch, "math": math}
    exec(textwrap.dedent(nb08.ONLINE_SOURCE).replace(
        "    T_k = k.shape[-2]\n", "    T_k = k.shape[-2]\n    q, k, v = q.double(), k.double(), v.double()\n").replace(
        "return acc / torch.where(l > 0, l, torch.ones_like(l))",
        "return (acc / torch.where(l > 0, l, torch.ones_like(l))).float()"), env)
    for exercise in nb08.EXERCISES[:3]:
        check_exercise(exercise, env["online_softmax_attention"])


@pytest.mark.parametrize("check", [
    "        _ = float(m.max().item())\n",  # a number now and then
    "        for i in range(q.shape[-2]):\n            assert torch.isfinite(acc[..., i, :]).all()\n",  # a bool per row
    "        for i in range(q.shape[-2]):\n            _ = float(m[..., i, :].max())\n",  # a number per row and block
], ids=["a number per block", "a finite check per row", "a number per row"])
def test_an_online_softmax_that_reads_a_few_numbers_keeps_the_memory_point(check):
    """A reviewer: checks per query row and block (192 reads on the 96-key case) lost the point to a budget of T_k
    reads, and a bool test (`if t.any()`) counted as a number read out."""
    env = {"torch": torch, "math": math}
    exec(textwrap.dedent(nb08.ONLINE_SOURCE).replace("        m = m_new\n", "        m = m_new\n" + check), env)
    check_exercise(next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory"),
                   env["online_softmax_attention"])


@pytest.mark.parametrize("impl, words", [(whole_matrix_into_an_out_tensor, "largest tensor created inside"),
                                         (whole_matrix_in_numpy, "Tensor.numpy"),
                                         # a red team's np.asarray(q): 8/8 (Tensor.__array__ calls .numpy() unseen)
                                         (_numpy_by(lambda t: t), "Tensor.__array__"),
                                         (_numpy_by(lambda t: __import__("numpy").from_dlpack(t)), "Tensor.__dlpack__"),
                                         (_numpy_by(lambda t: t.tolist()), "Tensor.tolist")],
                         ids=["out=", "numpy", "asarray", "dlpack", "tolist"])
def test_the_whole_score_matrix_is_found_however_it_is_made(impl, words):
    """Both scored 8/8 under the real grader (a red team): now the memory case fails, or numpy is refused."""
    memory = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory")
    with pytest.raises(CheckFailed, match=words.replace(".", "\\.")):
        check_exercise(memory, impl)


# A red team's three ways to the memory point with plain attention over every key (8/8, review empty, as the ordinary
# user with bubblewrap and with namespaces): the score matrix written into a tensor the answer's cell made before the
# call; Tensor.untyped_storage replaced for the call (every storage said 4 bytes); q, k and v read as the int32 bits of
# their floats (only float reads were counted).
_KEYS_8_AT_A_TIME = '''
def _max_keys(x):
    while x.shape[-1] > 8:
        x = torch.stack([x[..., j:j + 8].amax(-1) for j in range(0, x.shape[-1], 8)], -1)
    return x.amax(-1, keepdim=True)

def _sum_keys(x):
    while x.shape[-1] > 8:
        x = torch.stack([x[..., j:j + 8].sum(-1) for j in range(0, x.shape[-1], 8)], -1)
    return x.sum(-1, keepdim=True)

def _attend(s, v, mask):
    if mask is not None:
        s = s.masked_fill(~mask, float('-inf'))
    m = _max_keys(s)
    e = (s - m.masked_fill(m == float('-inf'), 0.0)).exp()
    z = _sum_keys(e)
    w = e / torch.where(z > 0, z, torch.ones_like(z))
    out = w[..., 0:8] @ v[..., 0:8, :]
    for j in range(8, v.shape[-2], 8):
        out = out + w[..., j:j + 8] @ v[..., j:j + 8, :]
    return out
'''
IN_A_SCRATCH_TENSOR = _KEYS_8_AT_A_TIME + '''
_SCRATCH = torch.zeros(1 << 17)

def online_softmax_attention(q, k, v, block_size, mask=None):
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    S = _SCRATCH[: math.prod(lead) * q.shape[-2] * k.shape[-2]].view(*lead, q.shape[-2], k.shape[-2])
    torch.matmul(q, k.transpose(-2, -1), out=S)          # every step in place, in memory made before the call
    S.mul_(1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        S.masked_fill_(~mask, float('-inf'))
    m = _max_keys(S)
    S.sub_(m.masked_fill(m == float('-inf'), 0.0)).exp_()
    z = _sum_keys(S)
    S.div_(torch.where(z > 0, z, torch.ones_like(z)))
    out = torch.zeros(*lead, q.shape[-2], v.shape[-1])
    for j in range(0, k.shape[-2], 8):
        out.add_(S[..., j:j + 8] @ v[..., j:j + 8, :])
    return out
'''
WITH_STORAGES_THAT_LIE = _KEYS_8_AT_A_TIME + '''
class _Small:
    def __init__(self, storage):
        self._s = storage
    def nbytes(self):
        return 4
    def data_ptr(self):
        return self._s.data_ptr()

def online_softmax_attention(q, k, v, block_size, mask=None):
    T = type(q)
    real = T.untyped_storage
    T.untyped_storage = lambda self: _Small(real(self))
    try:
        return _attend(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), v, mask)
    finally:
        T.untyped_storage = real
'''
READ_AS_INTEGER_BITS = '''
import struct

def _floats(t):
    flat = t.detach().contiguous().reshape(-1).view(torch.int32)
    return [struct.unpack('<f', struct.pack('<i', int(flat[i])))[0] for i in range(flat.shape[0])]

def online_softmax_attention(q, k, v, block_size, mask=None):
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T_q, D, T_k, Dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    Q, K, V = (_floats(torch.broadcast_to(t, (*lead, *t.shape[-2:]))) for t in (q, k, v))
    out = []
    for b in range(math.prod(lead)):                      # plain softmax attention in Python floats
        for i in range(T_q):
            s = [sum(Q[(b * T_q + i) * D + d] * K[(b * T_k + j) * D + d] for d in range(D)) / math.sqrt(D)
                 for j in range(T_k)]
            e = [math.exp(x - max(s)) for x in s]
            out += [sum(e[j] * V[(b * T_k + j) * Dv + c] for j in range(T_k)) / sum(e) for c in range(Dv)]
    return torch.tensor(out).reshape(*lead, T_q, Dv).clone()   # made where the probe sees it
'''


READ_FROM_ITS_PRINTING = READ_AS_INTEGER_BITS.replace("""
def _floats(t):
    flat = t.detach().contiguous().reshape(-1).view(torch.int32)
    return [struct.unpack('<f', struct.pack('<i', int(flat[i])))[0] for i in range(flat.shape[0])]
""", """
def _floats(t):
    torch.set_printoptions(precision=10, threshold=10 ** 9, sci_mode=True, linewidth=10 ** 9)
    try:
        text = str(t.detach().reshape(-1))
    finally:
        torch.set_printoptions(profile="default")
    body = text[text.index("[") + 1:text.rindex("]")]
    return [float(x) for x in __import__("re").findall(r"[-+]?\\d+\\.?\\d*(?:e[-+]?\\d+)?", body)]
""")


@pytest.mark.parametrize("options", [{}, {"precision": 6}, {"sci_mode": False, "threshold": 10 ** 6}])
def test_debug_prints_inside_an_online_softmax_keep_the_memory_point(capsys, options):
    """While the memory case runs, printing shows a placeholder for a tensor's numbers (a red team parsed q, k and v
    out of their printed text): a student's debug prints of every block cost nothing, whatever print options the
    notebook set earlier (a reviewer: counting printed numbers took the point from such prints at precision 6)."""
    env = {"torch": torch, "math": math}
    exec(textwrap.dedent(nb08.ONLINE_SOURCE).replace("        m = m_new\n", "        m = m_new\n        print(m, s, p)\n"),
         env)
    torch.set_printoptions(**options)
    try:
        check_exercise(next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory"),
                       env["online_softmax_attention"])
    finally:
        torch.set_printoptions(profile="default")
    assert nb08.NOT_PRINTED in capsys.readouterr().out
    assert str(torch.ones(2)) == "tensor([1., 1.])"  # printing is itself again after the case


READ_AS_PRINTED_INTEGERS = READ_AS_INTEGER_BITS.replace("""
def _floats(t):
    flat = t.detach().contiguous().reshape(-1).view(torch.int32)
    return [struct.unpack('<f', struct.pack('<i', int(flat[i])))[0] for i in range(flat.shape[0])]
""", """
def _floats(t):
    flat = torch.round(t.reshape(-1).double() * 1e9).long()   # every digit printed at the default options
    found = []
    for j in range(0, flat.shape[0], 500):
        text = str(flat[j:j + 500])
        found += [int(x) / 1e9 for x in __import__("re").findall(r"-?\\d+", text[text.index("[") + 1:text.rindex("]")])]
    return found
""")
READ_FROM_ITS_BYTES = {
    "torch.save": "buffer = __import__('io').BytesIO()\n    torch.save(t, buffer)\n    raw = buffer.getvalue()",
    "pickle": "raw = __import__('pickle').dumps(t)",
    "storage bytes": "raw = bytes(t.untyped_storage())",
}


@pytest.mark.parametrize("how", sorted(READ_FROM_ITS_BYTES))
def test_reading_the_inputs_bytes_out_of_pytorch_is_refused_in_the_online_softmax(how):
    """A reviewer: torch.save into a BytesIO, the floats read back with zipfile and struct, took the memory point
    with plain attention (8/8 in real grading); pickling a tensor, or reading its storage byte by byte, as well."""
    source = (f"def _raw(t):\n    {READ_FROM_ITS_BYTES[how]}\n    return raw\n\n"
              + nb08.ONLINE_SOURCE.replace("    T_k = k.shape[-2]\n", "    T_k = k.shape[-2]\n    _raw(k)\n"))
    env = {"torch": torch, "math": math}
    exec(textwrap.dedent(source), env)
    with pytest.raises(CheckFailed, match="not accepted, because it turns tensors into"):
        check_exercise(nb08.EXERCISES[0], env["online_softmax_attention"])


@pytest.mark.parametrize("source", [IN_A_SCRATCH_TENSOR, WITH_STORAGES_THAT_LIE, READ_AS_INTEGER_BITS,
                                    READ_FROM_ITS_PRINTING, READ_AS_PRINTED_INTEGERS],
                         ids=["scratch tensor", "untyped_storage patched", "int32 bits", "printed", "printed ints"])
def test_plain_attention_hidden_from_the_memory_probe_loses_the_memory_point(source):
    env = {"torch": torch, "math": math}
    exec(source, env)
    memory = next(e for e in nb08.EXERCISES if e.name == "online_softmax_attention_memory")
    with pytest.raises(CheckFailed, match=r"output\[1\]: .*expected True, got False|raised (IndexError|ValueError)"):
        check_exercise(memory, env["online_softmax_attention"])  # (printed: the placeholder cannot be parsed)
    if source not in (READ_AS_INTEGER_BITS, READ_FROM_ITS_PRINTING, READ_AS_PRINTED_INTEGERS):  # (no mask: the memory case's; the values are right, only this point goes)
        check_exercise(nb08.EXERCISES[0], env["online_softmax_attention"])
