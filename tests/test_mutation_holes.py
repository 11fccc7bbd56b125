"""Wrong implementations that two mutation tests (plausible slips, written as a student at midnight would, run
through `attn-course check`) found taking full points, each now failing its exercise. Every one is the course's
reference with one change, re-created from source (the honesty guard refuses the reference's own objects)."""
from __future__ import annotations

import itertools
import re
import sys
import types
from pathlib import Path

import pytest

from attention_course import (
    attention,
    efficient,
    layers,
    long_context,
    model,
    multihead,
    positional,
    similarity,
    translate,
)
from autograder.checks import nb01, nb02, nb03, nb04, nb05, nb06, nb07, nb08
from autograder.checks.core import CheckFailed, check_exercise

from .conftest import fresh_copy


def mutated(module, old: str, new: str) -> dict:
    """`module`'s source with `old` replaced by `new` (exactly once), executed as a student's copy."""
    source = Path(module.__file__).read_text()
    assert source.count(old) == 1, f"{old!r} is not in {module.__name__} once"
    return _executed(source.replace(old, new))


def _executed(source: str) -> dict:
    """`source` run as a module of its own (a dataclass in it looks its module up in sys.modules)."""
    copy = types.ModuleType(f"student_copy_{next(_copies)}")
    sys.modules[copy.__name__] = copy
    exec(compile(source, "<student copy>", "exec"), copy.__dict__)
    return copy.__dict__


_copies = itertools.count()


HOLES = [  # (id, checks, exercise, module, old, new, what the failure must say)
    ("contextualize renormalizes W", nb01, "contextualize", similarity,
     "return np.asarray(W, dtype=float) @ np.asarray(E, dtype=float)",
     "W = np.asarray(W, dtype=float)\n    return (W / W.sum(axis=1, keepdims=True)) @ np.asarray(E, dtype=float)",
     "rows do not sum to 1"),
    ("normalize_rows divides in place", nb01, "normalize_rows", similarity,
     "    S = np.asarray(S, dtype=float)\n    return S / S.sum(axis=1, keepdims=True)",
     "    S /= S.sum(axis=1, keepdims=True)\n    return S", "known mistake: S divided in place"),
    ("AdditiveAttention's default value detached", nb02, "AdditiveAttention", attention,
     "value = key if value is None else value", "value = key.detach() if value is None else value",
     "the keys are the values; returns context"),
    ("the mask inverted in place", nb02, "scaled_dot_product_attention_mask", attention,
     "        scores = scores.masked_fill(~mask, float(\"-inf\"))     # forbidden keys",
     "        mask.logical_not_()  # nn's convention (True = blocked), in the caller's tensor\n"
     "        scores = scores.masked_fill(mask, float(\"-inf\"))\n        mask = ~mask  # forbidden keys",
     "whether each input is unchanged"),
    ("a weight tied between two layers counted twice", nb03, "count_parameters", multihead,
     "return sum(p.numel() for p in module.parameters())",
     "return sum(p.numel() for m in module.modules() for p in m.parameters(recurse=False))",
     "tied between two different layers"),
    ("PositionalEncoding adds into x in place", nb04, "PositionalEncoding", positional,
     "return self.dropout(x + self.pe[:T])", "x += self.pe[:T]\n        return self.dropout(x)",
     "whether each input is unchanged"),
    ("masked_softmax without the max subtracted", nb05, "masked_softmax", layers,
     "    scores = scores.masked_fill(~mask, float(\"-inf\"))    # forbidden keys: exp(-inf) = 0\n"
     "    weights = torch.softmax(scores, dim=-1)",
     "    e = scores.exp().masked_fill(~mask, 0.0)\n    weights = e / e.sum(dim=-1, keepdim=True)",
     "scores of a few hundred"),
    ("masked_softmax without mask=None", nb05, "masked_softmax", layers,
     "    if mask is None:\n        return torch.softmax(scores, dim=-1)\n", "",
     "known mistake: mask=None not handled"),
    ("masked_softmax fills the caller's scores", nb05, "masked_softmax", layers,
     "scores = scores.masked_fill(~mask, float(\"-inf\"))", "scores = scores.masked_fill_(~mask, float(\"-inf\"))",
     "whether each input is unchanged"),
    ("label smoothing's log_softmax over axis 1", nb06, "label_smoothed_cross_entropy_stability", translate,
     "log_probs = F.log_softmax(logits, dim=-1).reshape(-1, V)",
     "log_probs = F.log_softmax(logits, dim=1).reshape(-1, V)", "large logits [2, 5, 12]"),
    ("GroupedQueryAttention ignores bias=False", nb07, "GroupedQueryAttention", efficient,
     "self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=bias)",
     "self.q_proj = nn.Linear(d_model, num_heads * self.head_dim, bias=True)", "bias=False"),
    # a wrong-code audit's: dropout only ever at p = 0.5, where p and 1 - p are one number
    ("MultiHeadAttention's dropout given the keep probability", nb03, "MultiHeadAttention", multihead,
     "self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(1 - dropout)", "fraction p = 0.3"),
    ("FeedForward's dropout given the keep probability", nb05, "FeedForward", layers,
     "self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(1 - dropout)", "fraction p = 0.3"),
    # ... and layers that build their attention and feed-forward without passing dropout on (evaluation mode only)
    ("EncoderLayer's sublayers built without dropout", nb05, "EncoderLayer", layers,
     "self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)\n        self.ff = FeedForward(d_model, d_ff, dropout)",
     "self.self_attn = MultiHeadAttention(d_model, num_heads)\n        self.ff = FeedForward(d_model, d_ff)",
     "whether its two outputs differ"),
    ("DecoderLayer's cross-attention built without dropout", nb05, "DecoderLayer", layers,
     "self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)",
     "self.cross_attn = MultiHeadAttention(d_model, num_heads)", "whether its two outputs differ"),
    ("Seq2SeqTransformer's encoder layers built without dropout", nb06, "Seq2SeqTransformer", model,
     "EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for",
     "EncoderLayer(d_model, num_heads, d_ff, 0.0, norm_first) for", "whether its two outputs differ"),
    ("greedy_decode with a [B, S] source mask", nb06, "greedy_decode", translate,
     "        src_mask, _ = make_masks(src, ys, pad_id)\n        memory = model.encode(src, src_mask)                           # once",
     "        src_mask = src != pad_id\n        memory = model.encode(src, src_mask)                           # once",
     "the source mask has shape"),
    ("normalize_rows by the sum of absolute values", nb01, "normalize_rows", similarity,
     "return S / S.sum(axis=1, keepdims=True)", "return S / np.abs(S).sum(axis=1, keepdims=True)",
     "negative similarities"),
    # ... and dropout left on in evaluation mode, said so (it read "values differ", by 0.016, like a rounding)
    ("FeedForward's dropout left on in evaluation mode", nb05, "FeedForward", layers,
     "return self.linear2(self.dropout(torch.relu(self.linear1(x))))",
     "return self.linear2(torch.nn.functional.dropout(torch.relu(self.linear1(x)), self.dropout.p))",
     "changed from one call to the next in evaluation mode"),
    ("EncoderLayer's residual dropout left on in evaluation mode", nb05, "EncoderLayer", layers,
     "x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask=mask)[0]))",
     "x = self.norm1(x + torch.nn.functional.dropout(self.self_attn(x, x, x, mask=mask)[0], self.dropout1.p))",
     "changed from one call to the next in evaluation mode"),
    # a second audit's: functions that change their caller's tensors in place (only some exercises checked it), a
    # ValueError never asked for, a dtype never tried, a window never negative
    ("AdditiveAttention flips the caller's mask", nb02, "AdditiveAttention_mask", attention,
     "            scores = scores.masked_fill(~mask, float(\"-inf\"))  # padding: exp(-inf) = 0",
     "            mask.logical_not_()\n            scores = scores.masked_fill(mask, float(\"-inf\"))\n"
     "            mask = ~mask", "whether each input is unchanged"),
    ("GroupedQueryAttention flips the caller's mask", nb07, "GroupedQueryAttention", efficient,
     "        out, weights = scaled_dot_product_attention(q, k, v, mask)  # [B, H, T, Dh], [B, H, T, T_k]",
     "        if mask is not None:\n            mask.logical_not_()\n            mask = ~mask\n"
     "        out, weights = scaled_dot_product_attention(q, k, v, mask)  # [B, H, T, Dh], [B, H, T, T_k]",
     "whether each input is unchanged"),
    ("cached_attention scales the caller's queries", nb07, "cached_attention", efficient,
     "    return scaled_dot_product_attention(q_t, keys, values, mask)[0]",
     "    q_t.mul_(1.0)\n    q_t.add_(0.5)\n    q_t.sub_(0.5)\n    return scaled_dot_product_attention(q_t, keys, values, mask)[0]",
     "whether each input is unchanged"),
    ("apply_rotary writes its answer into x", nb07, "apply_rotary", efficient,
     "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)",
     "    x.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype))\n    return x",
     "whether each input is unchanged"),
    ("apply_rotary returns float32 for bfloat16", nb07, "apply_rotary", efficient,
     "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)",
     "    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)", "bfloat16"),
    ("the cost model splits 50 features into 6 heads", nb07, "attention_flops_and_memory", efficient,
     "        if d_model % num_heads != 0:\n            raise ValueError(f\"d_model ({d_model}) is not divisible by num_heads "
     "({num_heads}): give head_dim\")\n", "", "50 features cannot be split into 6 heads"),
    ("sliding_window_mask lets a negative window through", nb08, "sliding_window_mask", long_context,
     "    if window < 1:", "    if not window:", "a negative window must raise"),
    # a third audit's: notebooks 05 and 06 had no input check outside masked_softmax
    ("a pre-norm EncoderLayer adds its residual in place", nb05, "EncoderLayer_norm_first", layers,
     "x = x + self.dropout1(self.self_attn(h, h, h, mask=mask)[0])",
     "x += self.dropout1(self.self_attn(h, h, h, mask=mask)[0])", "whether each input is unchanged"),
    ("a post-norm EncoderLayer adds its residual in place", nb05, "EncoderLayer", layers,
     "x = self.norm1(x + self.dropout1(self.self_attn(x, x, x, mask=mask)[0]))",
     "x += self.dropout1(self.self_attn(x, x, x, mask=mask)[0])\n            x = self.norm1(x)",
     "whether each input is unchanged"),
    ("a pre-norm DecoderLayer adds its residual in place", nb05, "DecoderLayer_norm_first", layers,
     "x = x + self.dropout1(out)", "x += self.dropout1(out)", "whether each input is unchanged"),
    ("LayerNorm subtracts the mean in place", nb05, "LayerNorm", layers,
     "        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)         # [..., 1]: biased, divided by D\n"
     "        x_hat = (x - mean) / torch.sqrt(var + self.eps)            # [..., D]: mean 0, variance 1\n",
     "        x -= mean\n        var = (x ** 2).mean(dim=-1, keepdim=True)\n        x_hat = x / torch.sqrt(var + self.eps)\n",
     "whether each input is unchanged"),
    ("sample_next_token divides and masks the caller's logits in place", nb06, "sample_next_token_generator",
     translate, "    logits = logits / temperature\n", "    logits /= temperature\n", "whether each input is unchanged"),
    ("the label-smoothed loss shifts the caller's logits in place", nb06, "label_smoothed_cross_entropy", translate,
     "    log_probs = F.log_softmax(logits, dim=-1).reshape(-1, V)          # [N, V], numerically stable\n",
     "    logits -= logits.amax(dim=-1, keepdim=True)\n"
     "    log_probs = (logits - logits.exp().sum(-1, keepdim=True).log()).reshape(-1, V)\n",
     "whether each input is unchanged"),
    ("the model never drops its embeddings", nb06, "Seq2SeqTransformer", model,
     "self.positional = PositionalEncoding(d_model, cfg.max_len, dropout)",
     "self.positional = PositionalEncoding(d_model, cfg.max_len)",
     "the embeddings never dropped (PositionalEncoding built without `dropout`)"),
    ("apply_rotary assumes consecutive positions", nb07, "apply_rotary", efficient,
     "angles = torch.as_tensor(positions).to(torch.float32)[..., None] * inv_freq",
     "angles = (torch.as_tensor(positions).reshape(-1)[0] + torch.arange(x.shape[-2])).to(torch.float32)[..., None]"
     " * inv_freq", "positions assumed consecutive"),
    ("KVCache.nbytes counts 4 bytes a number", nb07, "KVCache", efficient,
     "return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)",
     "return sum(t.numel() * 4 for t in self.keys + self.values if t is not None)", "float16"),
]


@pytest.mark.parametrize("hole", HOLES, ids=[h[0] for h in HOLES])
def test_a_wrong_implementation_that_took_full_points_fails_now(hole):
    _, checks, exercise_name, module, old, new, says = hole
    exercise = next(e for e in checks.EXERCISES if e.name == exercise_name)
    right = _executed(Path(module.__file__).read_text())[exercise.graded]
    wrong = mutated(module, old, new)[exercise.graded]
    check_exercise(exercise, right)  # the reference, re-created, still passes every case
    with pytest.raises(CheckFailed, match=re.escape(says)):
        check_exercise(exercise, wrong)


def test_multi_head_attention_that_flips_the_callers_mask_fails():
    """In notebook 03's layer (the course's PyTorch convention turned into nn's by flipping the mask in place)."""
    wrong = mutated(multihead, "_, weights = scaled_dot_product_attention(q, k, v, mask)",
                    "if mask is not None:\n            mask.logical_not_()\n"
                    "        _, weights = scaled_dot_product_attention(q, k, v, None if mask is None else ~mask)")
    exercise = next(e for e in nb03.EXERCISES if e.name == "MultiHeadAttention_mask")
    check_exercise(exercise, fresh_copy(multihead)["MultiHeadAttention"])
    with pytest.raises(CheckFailed, match="whether each input is unchanged"):
        check_exercise(exercise, wrong["MultiHeadAttention"])


def test_a_layer_that_returns_only_its_output_is_told_so_in_the_gradient_case_too():
    """Unpacked, its [2, 5, 6] output split into two, and the gradients case said 'expected shape (2, 5, 6), got
    shape (5, 6)' beside the other cases' 'a tuple of 2 values'."""
    wrong = mutated(attention, "return scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)",
                    "return scaled_dot_product_attention(self.q_proj(x), self.k_proj(x), self.v_proj(x), mask)[0]")
    exercise = next(e for e in nb02.EXERCISES if e.name == "SelfAttention_gradients")
    with pytest.raises(CheckFailed, match=r"output: expected a tuple of \d+ values, got Tensor"):
        check_exercise(exercise, wrong["SelfAttention"])


def test_a_beam_search_that_prefers_unfinished_hypotheses_is_named_so_in_every_case():
    """A third audit: a search that returns a hypothesis still unfinished at max_len over every finished one was named
    "does not count eos in the length" in one test cell and "no source padding mask" in the next; it is catalogued
    now (the mirror of "unfinished hypotheses do not compete"), and both cells name it."""
    wrong = mutated(translate, "best = [max(hyps, key=lambda h: h[0])[1] for hyps in finished]",
                    "best = [max([h for h in hyps if int(h[1][-1]) != eos_id] or hyps, key=lambda h: h[0])[1]\n"
                    "                for hyps in finished]")["beam_search"]
    said = []
    for name in ("beam_search", "beam_search_length_penalty"):
        exercise = next(e for e in nb06.EXERCISES if e.name == name)
        with pytest.raises(CheckFailed) as failed:
            check_exercise(exercise, wrong)
        said.append(str(failed.value))
    for message in said:
        assert "prefers a hypothesis still unfinished at max_len over the finished ones" in message, message
        assert "does not count eos" not in message and "no source padding mask" not in message, message


def test_a_latent_attention_that_caches_its_rotary_key_unrotated_is_named_so():
    """The same audit: an MLA that appends the shared rotary key before rotating it (and rotates every cached key at
    each call) gives the reference's outputs and loses the cache's points fairly, but was told "rotary embedding
    applied to the whole query and key", a mistake it does not make."""
    wrong = _executed(Path(efficient.__file__).read_text()
                      .replace("        k_rope = apply_rotary(k_rope, positions)                               "
                               "# [B, T, rope]: one key for all heads\n", "")
                      .replace("        T_k = latent.shape[1]\n",
                               "        T_k = latent.shape[1]\n        k_rope = apply_rotary(k_rope, torch.arange(T_k))\n"))
    by_name = {e.name: e for e in nb07.EXERCISES}
    check_exercise(by_name["MultiHeadLatentAttention"], wrong["MultiHeadLatentAttention"])  # its outputs are right
    with pytest.raises(CheckFailed) as failed:
        check_exercise(by_name["MultiHeadLatentAttention_cache"], wrong["MultiHeadLatentAttention"])
    said = str(failed.value)
    assert "the shared rotary key cached before its rotation" in said and "whole query and key" not in said, said
