"""Notebook 07 checks: the reference passes, other correct implementations pass, every catalogued
mistake fails (and is named), PyTorch's fused attention and the reference are refused, the cost model
agrees with counted FLOPs and real cache sizes (DeepSeek-V3's numbers included), decoding through the
cache gives the same tokens, and real nbgrader takes points off wrong implementations in the right cells.
No test here asserts a wall-clock time."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attention_course import efficient as ref
from attention_course.attention import scaled_dot_product_attention
from attention_course.measure import peak_tensor_bytes
from attention_course.multihead import merge_heads, split_heads
from autograder.checks import nb07
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

ASSIGNMENT = "07_attention_at_scale"
STUDENT = fresh_copy(ref)
MISTAKES = catalogued_mistakes(nb07)


@pytest.mark.parametrize("exercise", nb07.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    assert_mistake_fails_and_is_named(nb07, mistake, graded)


def test_the_issue_s_mistakes_are_catalogued():
    """The mistakes the issue asks the grader to recognise, by exercise."""
    names = {(g, m.name) for m, g in MISTAKES}
    wanted = {
        ("cached_attention", "the cache appended after attending"),
        ("MultiHeadLatentAttention", "rotary embedding applied to the values"),
        ("apply_rotary", "interleaved pairs"),
        ("GroupedQueryAttention", "key/value heads repeated in the wrong order"),
        ("MultiHeadLatentAttention", "the up-projected keys and values cached"),
    }
    for graded, start in wanted:
        assert any(g == graded and n.startswith(start) for g, n in names), (graded, start)


# --------------------------------------------------------------------------- other correct answers pass
def attention_flops_and_memory_alt(seq_len, d_model, num_heads, num_layers, num_kv_heads=None, head_dim=None,
                                   batch_size=1, bytes_per_value=2):
    """Per-matrix products added up, in floats, returned as the ints the exercise asks for."""
    kv = num_kv_heads or num_heads
    if num_heads % kv or (head_dim is None and d_model % num_heads):
        raise ValueError("heads do not divide")
    dh = head_dim or d_model / num_heads

    def matmul(m, k, n):
        return 2.0 * m * k * n

    tokens = batch_size * seq_len
    proj = sum(matmul(tokens, d_model, width) for width in (num_heads * dh, kv * dh, kv * dh, num_heads * dh))
    scores = batch_size * num_heads * (matmul(seq_len, dh, seq_len) + matmul(seq_len, seq_len, dh))
    cache = num_layers * (kv * dh + kv * dh) * bytes_per_value
    counts = {"projection_flops": proj * num_layers, "score_flops": scores * num_layers,
              "score_bytes": batch_size * num_heads * seq_len ** 2 * bytes_per_value,
              "kv_cache_bytes_per_token": cache, "kv_cache_bytes": cache * tokens}
    return {key: round(value) for key, value in counts.items()}


def test_a_cost_model_of_floats_is_told_to_return_ints():
    """Wrong-code audit 12: head_dim = d_model / num_heads made every count a float, with full marks; the exercise
    asks for five integers (float64 is not exact past 2**53 FLOPs, which a long context at DeepSeek's size reaches)."""
    def with_true_division(*args, **kwargs):
        return {key: float(value) for key, value in attention_flops_and_memory_alt(*args, **kwargs).items()}

    with pytest.raises(CheckFailed, match="a float: FLOPs and bytes are counted in whole numbers, so return ints"):
        nb07.check("attention_flops_and_memory", with_true_division)


class KVCacheAlt:
    """Chunks kept in lists, joined when read (keys / values are properties)."""

    def __init__(self, num_layers=1):
        self._k = [[] for _ in range(num_layers)]
        self._v = [[] for _ in range(num_layers)]

    @property
    def keys(self):
        return [torch.cat(c, dim=-2) if c else None for c in self._k]

    @property
    def values(self):
        return [torch.cat(c, dim=-2) if c else None for c in self._v]

    def append(self, layer, k, v):
        self._k[layer].append(k)
        self._v[layer].append(v)
        return self.keys[layer], self.values[layer]

    def seq_len(self, layer=0):
        return sum(c.shape[-2] for c in self._k[layer])

    def nbytes(self):
        return sum(c.nbytes for chunks in self._k + self._v for c in chunks)


def cached_attention_alt(q_t, k_t, v_t, cache, layer=0):
    """Its own softmax and a mask from position indices."""
    keys, values = cache.append(layer, k_t, v_t)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    query_pos = torch.arange(T_total - T_new, T_total)[:, None]
    allowed = torch.arange(T_total)[None, :] <= query_pos
    scores = (q_t @ keys.transpose(-1, -2)) / q_t.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    w = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (w / w.sum(-1, keepdim=True)) @ values


def apply_rotary_alt(x, positions, base=10000.0):
    """Complex numbers: pair i is x[i] + 1j * x[i + D/2], turned by exp(1j * angle)."""
    D = x.shape[-1]
    if D % 2:
        raise ValueError("odd")
    theta = 1.0 / (base ** (torch.arange(D // 2, dtype=torch.float64) * 2 / D))
    angle = torch.outer(torch.as_tensor(positions).double(), theta)
    z = torch.complex(x[..., : D // 2].double(), x[..., D // 2:].double()) * torch.polar(torch.ones_like(angle), angle)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


class GroupedQueryAttentionAlt(nn.Module):
    """Queries reshaped into groups [B, H_kv, group, T, Dh] against unrepeated keys; its own softmax."""

    def __init__(self, d_model, num_heads, num_kv_heads, bias=True):
        super().__init__()
        if d_model % num_heads or num_heads % num_kv_heads:
            raise ValueError("heads do not divide")
        self.h, self.g, self.dh = num_heads, num_kv_heads, d_model // num_heads
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=bias)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.dh, bias=bias)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None, cache=None, layer=0):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.g, self.h // self.g, self.dh).permute(0, 2, 3, 1, 4)  # [B, g, r, T, Dh]
        k = self.k_proj(x).view(B, T, self.g, self.dh).transpose(1, 2)                            # [B, g, T, Dh]
        v = self.v_proj(x).view(B, T, self.g, self.dh).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(layer, k, v)
        scores = q @ k[:, :, None].transpose(-1, -2) / math.sqrt(self.dh)                        # [B, g, r, T, T_k]
        scores = scores.reshape(B, self.h, T, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        if mask is not None:
            w = w.masked_fill(~mask, 0.0)
        out = w.view(B, self.g, self.h // self.g, T, -1) @ v[:, :, None]                          # [B, g, r, T, Dh]
        return self.out_proj(out.reshape(B, self.h, T, self.dh).transpose(1, 2).reshape(B, T, -1)), w


class MultiHeadLatentAttentionAlt(nn.Module):
    """The 'absorbed' computation as the forward pass: keys and values are never built (any T, any mask)."""

    def __init__(self, d_model, num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
        super().__init__()
        self.H, self.r, self.n, self.p, self.dv = num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.q_down = nn.Linear(d_model, q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(q_lora_rank, eps=1e-6)
        self.q_up = nn.Linear(q_lora_rank, num_heads * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_down = nn.Linear(d_model, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.k_up = nn.Linear(kv_lora_rank, num_heads * qk_nope_head_dim, bias=False)
        self.v_up = nn.Linear(kv_lora_rank, num_heads * v_head_dim, bias=False)
        self.out_proj = nn.Linear(num_heads * v_head_dim, d_model, bias=False)

    def forward(self, x, mask=None, cache=None, layer=0):
        B, T, _ = x.shape
        start = cache.seq_len(layer) if cache is not None else 0
        pos = torch.arange(start, start + T)
        q = split_heads(self.q_up(self.q_norm(self.q_down(x))), self.H)
        q_nope, q_rope = q[..., : self.n], apply_rotary_alt(q[..., self.n:], pos)
        a = self.kv_down(x)
        latent, k_rope = self.kv_norm(a[..., : self.r]), apply_rotary_alt(a[..., self.r:], pos)
        if cache is not None:
            latent, k_rope = cache.append(layer, latent, k_rope)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, self.k_up.weight.view(self.H, self.n, self.r))
        scores = (q_latent @ latent[:, None].transpose(-1, -2) + q_rope @ k_rope[:, None].transpose(-1, -2))
        scores = scores / math.sqrt(self.n + self.p)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = torch.softmax(scores, dim=-1)
        if mask is not None:
            w = w.masked_fill(~mask, 0.0)
        out = torch.einsum("bhtr,hvr->bhtv", w @ latent[:, None], self.v_up.weight.view(self.H, self.dv, self.r))
        return self.out_proj(merge_heads(out)), w


class GroupedQueryAttentionDetachedWeights(GroupedQueryAttentionAlt):
    """Weights returned detached (they are for looking at): trains as the reference does (a review of the gradient
    case, which pushed a gradient through the weights too)."""

    def forward(self, x, mask=None, cache=None, layer=0):
        out, weights = super().forward(x, mask=mask, cache=cache, layer=layer)
        return out, weights.detach()


@pytest.mark.parametrize("graded,impl", [
    ("GroupedQueryAttention", GroupedQueryAttentionDetachedWeights),
    ("attention_flops_and_memory", attention_flops_and_memory_alt), ("KVCache", KVCacheAlt),
    ("cached_attention", cached_attention_alt), ("apply_rotary", apply_rotary_alt),
    ("GroupedQueryAttention", GroupedQueryAttentionAlt), ("MultiHeadLatentAttention", MultiHeadLatentAttentionAlt),
], ids=lambda x: getattr(x, "__name__", x))
def test_other_correct_implementations_pass(graded, impl):
    for exercise in (e for e in nb07.EXERCISES if e.graded == graded):
        check_exercise(exercise, impl)


# --------------------------------------------------------------------------- honesty and stubs
OWN_CACHE_HELPERS = """
class KVCache:
    def __init__(self, num_layers):
        self.keys, self.values = [None] * num_layers, [None] * num_layers
        self.num_layers = num_layers

    def append(self, layer, k, v):
        self.keys[layer] = k if self.keys[layer] is None else torch.cat([self.keys[layer], k], dim=-2)
        self.values[layer] = v if self.values[layer] is None else torch.cat([self.values[layer], v], dim=-2)
        return self.keys[layer], self.values[layer]

    def get(self, layer):
        assert 0 <= layer < self.num_layers
        return self.keys[layer], self.values[layer]

    @property
    def layers(self):
        return len(self.keys)

    def seq_len(self, layer=0):
        return 0 if self.keys[layer] is None else self.keys[layer].shape[-2]

    def nbytes(self):
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)

def cached_attention(q_t, k_t, v_t, cache, layer=0):
    assert 0 <= layer < cache.layers
    cache.append(layer, k_t, v_t)
    keys, values = cache.get(layer)
    T_new, T_total = q_t.shape[-2], keys.shape[-2]
    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
    return scaled_dot_product_attention(q_t, keys, values, mask)[0]
"""


def test_a_cached_attention_that_calls_its_own_caches_helpers_passes():
    """A fairness audit: a correct cached_attention calling a method its own KVCache has (get(layer), a property) got
    0/5, told "'_Cache' object has no attribute 'get'", a class it never saw: the grader's cache lends the student's
    own KVCache's methods, and the attributes its __init__ sets (self.num_layers, a review); an attribute neither
    has is named for what it is."""
    env = {"torch": torch, "scaled_dot_product_attention": scaled_dot_product_attention}
    exec(OWN_CACHE_HELPERS, env)
    for exercise in (e for e in nb07.EXERCISES if e.graded == "cached_attention"):
        check_exercise(exercise, env["cached_attention"])
    exec(OWN_CACHE_HELPERS.replace("cache.get(layer)", "cache.fetch(layer)"), env)
    with pytest.raises(CheckFailed, match="KVCache has no attribute 'fetch'"):
        nb07.check("cached_attention", env["cached_attention"])


def test_pytorch_fused_attention_is_not_accepted():
    def cached_attention(q_t, k_t, v_t, cache, layer=0):
        keys, values = cache.append(layer, k_t, v_t)
        T_new, T_total = q_t.shape[-2], keys.shape[-2]
        mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)
        return F.scaled_dot_product_attention(q_t, keys, values, attn_mask=mask)

    with pytest.raises(CheckFailed, match="fused attention") as refused:
        nb07.check("cached_attention", cached_attention)
    # what to do is notebook 02's function, which the exercise asks for, not an attention by hand (a reader of 07)
    assert "call notebook 02's scaled_dot_product_attention instead" in str(refused.value), refused.value


def test_calling_the_reference_is_not_accepted():
    def apply_rotary(x, positions, base=10000.0):
        return ref.apply_rotary(x, positions, base)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb07.check("apply_rotary", apply_rotary)

    class GroupedQueryAttention(ref.GroupedQueryAttention):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb07.check("GroupedQueryAttention", GroupedQueryAttention)


def test_stub_is_reported_as_not_attempted():
    class KVCache:
        def __init__(self, num_layers=1):
            raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb07.check("KVCache", KVCache)


def test_wrong_parameter_names_are_reported():
    class GroupedQueryAttention(GroupedQueryAttentionAlt):
        def __init__(self, d_model, num_heads, num_kv_heads, bias=True):
            super().__init__(d_model, num_heads, num_kv_heads, bias)
            self.wq = self.q_proj
            del self.q_proj

    with pytest.raises(CheckFailed, match="missing: q_proj.bias, q_proj.weight"):
        nb07.check("GroupedQueryAttention", GroupedQueryAttention)


def test_a_wrong_apply_rotary_costs_only_its_own_cells():
    """MultiHeadLatentAttention's cases run it with a correct apply_rotary in the notebook's namespace."""
    namespace = fresh_copy(ref)                    # a notebook: MultiHeadLatentAttention finds apply_rotary here
    exec(compile(_code("apply_rotary", "interleaved pairs"), "<mistake>", "exec"), namespace)
    wrong = namespace["apply_rotary"]
    mla = namespace["MultiHeadLatentAttention"](32, 4, 16, 8, 8, 4, 6).eval()
    x = torch.randn(1, 3, 32)
    right = fresh_copy(ref)["MultiHeadLatentAttention"](32, 4, 16, 8, 8, 4, 6).eval()
    right.load_state_dict(mla.state_dict())
    assert not torch.allclose(mla(x)[0], right(x)[0]), "the wrong apply_rotary does change this notebook's MLA"
    for exercise in (e for e in nb07.EXERCISES if e.graded == "MultiHeadLatentAttention"):
        check_exercise(exercise, namespace["MultiHeadLatentAttention"])
    assert namespace["apply_rotary"] is wrong, "the student's own function is put back afterwards"
    with pytest.raises(CheckFailed, match="interleaved"):
        nb07.check("apply_rotary", wrong)


# --------------------------------------------------------------------------- the cost model against counted values
@pytest.mark.parametrize("H,H_kv", [(8, 8), (8, 2), (8, 1)])
def test_cost_model_matches_counted_flops_and_cache_bytes(H, H_kv):
    B, T, d = 2, 12, 64
    layer = ref.GroupedQueryAttention(d, H, H_kv).eval()
    x = torch.randn(B, T, d)
    cache = ref.KVCache()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(x, mask=torch.ones(T, T, dtype=torch.bool).tril(), cache=cache)
    cost = ref.attention_flops_and_memory(T, d, H, 1, num_kv_heads=H_kv, batch_size=B, bytes_per_value=4)
    assert counter.get_total_flops() == cost["projection_flops"] + cost["score_flops"]
    assert cache.nbytes() == cost["kv_cache_bytes"] == B * T * cost["kv_cache_bytes_per_token"]
    half = ref.KVCache()
    half.append(0, cache.keys[0].bfloat16(), cache.values[0].bfloat16())
    assert half.nbytes() == ref.attention_flops_and_memory(T, d, H, 1, num_kv_heads=H_kv, batch_size=B)["kv_cache_bytes"]
    with FlopCounterMode(display=False) as counter:
        scaled_dot_product_attention(*(torch.randn(B, H, T, d // H) for _ in range(3)))
    assert counter.get_total_flops() == cost["score_flops"]


def test_score_bytes_is_what_plain_attention_holds():
    B, H, T, Dh = 1, 4, 256, 16
    q, k, v = (torch.randn(B, H, T, Dh) for _ in range(3))
    one_matrix = ref.attention_flops_and_memory(T, H * Dh, H, 1, batch_size=B, bytes_per_value=4)["score_bytes"]
    peak = peak_tensor_bytes(scaled_dot_product_attention, q, k, v)
    assert 2 * one_matrix <= peak < 2.2 * one_matrix, "scores and weights: two [B, H, T, T] float32 tensors at once"


def test_deepseek_v3_cache_per_token():
    """DeepSeek-V3: 61 layers, 128 heads of 128, kv_lora_rank 512, qk_rope_head_dim 64, bfloat16."""
    v3 = dict(d_model=7168, num_heads=128, num_layers=61, head_dim=128)
    per_token = {kv: ref.attention_flops_and_memory(1, **v3, num_kv_heads=kv)["kv_cache_bytes_per_token"]
                 for kv in (128, 8, 1)}
    assert per_token == {128: 3_997_696, 8: 249_856, 1: 31_232}
    mla = (512 + 64) * 61 * 2
    assert mla == 70_272 and round(per_token[128] / mla) == 57
    assert mla / (2 * 128 * 61 * 2) == 2.25            # the DeepSeek-V2 paper: "GQA with only 2.25 groups"
    # the module at DeepSeek-V3's per-head sizes (8 heads, one layer, float32) caches exactly 512 + 64 numbers a token
    module = ref.MultiHeadLatentAttention(256, 8, q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=128,
                                          qk_rope_head_dim=64, v_head_dim=128)
    cache = ref.KVCache()
    with torch.no_grad():
        module(torch.randn(2, 5, 256), mask=torch.ones(5, 5, dtype=torch.bool).tril(), cache=cache)
    assert cache.nbytes() == 2 * 5 * (512 + 64) * 4


# --------------------------------------------------------------------------- decoding, rotary, online softmax
@pytest.mark.parametrize("kind", ["mha", "gqa", "mqa", "mla"])
def test_decoding_with_the_cache_gives_the_same_tokens(kind):
    d = 64
    make = {"mha": lambda: ref.GroupedQueryAttention(d, 4, 4), "gqa": lambda: ref.GroupedQueryAttention(d, 4, 2),
            "mqa": lambda: ref.GroupedQueryAttention(d, 4, 1),
            "mla": lambda: ref.MultiHeadLatentAttention(d, 4, 32, 16, 8, 8, 16)}[kind]
    torch.manual_seed(0)
    model = ref.TinyDecoder(100, d, 2, make).eval()
    prompt = torch.randint(0, 100, (2, 5))
    cached, times, cache = ref.generate(model, prompt, 12, use_cache=True)
    full, _, _ = ref.generate(model, prompt, 12, use_cache=False)
    assert torch.equal(cached, full) and cached.shape == (2, 17) and len(times) == 12
    assert cache.seq_len(0) == cache.seq_len(1) == 16      # the last token is generated, never fed back


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_the_preallocated_cache_decodes_the_same_tokens_in_place(kind):
    """PreallocatedKVCache: the tokens of KVCache and of no cache, greedy and sampled, buffers never reallocated."""
    d = 64
    make = {"gqa": lambda: ref.GroupedQueryAttention(d, 4, 2),
            "mla": lambda: ref.MultiHeadLatentAttention(d, 4, 32, 16, 8, 8, 16)}[kind]
    torch.manual_seed(0)
    model = ref.TinyDecoder(100, d, 2, make, max_len=32).eval()
    prompt = torch.randint(0, 100, (2, 5))
    fixed = ref.PreallocatedKVCache(2, max_len=32)
    preallocated = ref.decode_tokens(model, prompt, 12, cache=fixed)
    assert torch.equal(preallocated, ref.decode_tokens(model, prompt, 12, cache=ref.KVCache(2)))
    assert torch.equal(preallocated, ref.decode_tokens(model, prompt, 12))
    assert preallocated.shape == (2, 17) and fixed.seq_len(0) == fixed.seq_len(1) == 16
    buffers = [b.data_ptr() for b in fixed.key_buffers + fixed.value_buffers]
    with torch.no_grad():
        model(preallocated[:, -1:], cache=fixed)
    assert [b.data_ptr() for b in fixed.key_buffers + fixed.value_buffers] == buffers, "written in place"
    assert all(b.shape[-2] == 32 for b in fixed.key_buffers), "max_len positions reserved"
    grown = ref.KVCache(2)
    with torch.no_grad():
        model(preallocated, cache=grown)
    for layer in range(2):
        torch.testing.assert_close(fixed.keys[layer], grown.keys[layer])      # step by step against one pass
        torch.testing.assert_close(fixed.values[layer], grown.values[layer])
    assert fixed.nbytes() * 17 == grown.nbytes() * 32, "nbytes counts the reserved buffers"
    sample = {name: ref.decode_tokens(model, prompt, 12, cache=cache, temperature=1.0,
                                      generator=torch.Generator().manual_seed(3))
              for name, cache in (("fixed", ref.PreallocatedKVCache(2, 32)), ("grown", ref.KVCache(2)))}
    assert torch.equal(sample["fixed"], sample["grown"])


def test_the_preallocated_cache_refuses_to_overflow():
    cache = ref.PreallocatedKVCache(1, max_len=4)
    assert cache.keys == [None] and cache.seq_len() == 0 and cache.nbytes() == 0
    cache.append(0, torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8))
    with pytest.raises(ValueError, match="max_len=4"):
        cache.append(0, torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8))
    assert cache.seq_len() == 3, "a refused append changes nothing"


def test_rotary_matches_notebook_04s_rotation_up_to_the_layout():
    """Half-split RoPE is notebook 04's block rotation R_m = pe_shift_matrix(m)^T with the features reordered."""
    from attention_course.positional import pe_shift_matrix
    D, m = 8, 5
    x = torch.randn(D)
    interleave = torch.stack([torch.arange(D // 2), torch.arange(D // 2) + D // 2], dim=1).flatten()  # 0, 4, 1, 5, ...
    rotated = ref.apply_rotary(x[None], torch.tensor([m]))[0]
    torch.testing.assert_close(rotated[interleave], pe_shift_matrix(m, D).T @ x[interleave], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, start):
    for m, g in MISTAKES:
        if g == graded and m.name.startswith(start):
            return m.code
    raise KeyError(start)


ALL_CELLS = {"test_attention_flops_and_memory", "test_KVCache", "test_cached_attention", "test_cached_attention_decoding",
             "test_apply_rotary", "test_apply_rotary_relative", "test_GroupedQueryAttention",
             "test_GroupedQueryAttention_matches_mha", "test_GroupedQueryAttention_cache", "test_MultiHeadLatentAttention",
             "test_MultiHeadLatentAttention_cache", "test_MultiHeadLatentAttention_decoding"}
TOTAL = 31


@pytest.mark.slow
def test_nbgrader_solution_full_marks_and_blank_zero(course):
    full = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert full.status == "ok" and full.score == full.max_score == TOTAL, (full.status, failed_cells(full))
    assert {c.grade_id for c in full.cells} == ALL_CELLS
    blank = autograde(course, ASSIGNMENT, course.release(ASSIGNMENT))
    assert blank.status == "ok" and blank.score == 0 and failed_cells(blank) == ALL_CELLS


@pytest.mark.slow
def test_nbgrader_takes_points_for_the_issue_s_mistakes(course):
    """Five exercises wrong at once, each a mistake the issue names; each costs its own cells only
    (the wrong KVCache and apply_rotary do not spill into the exercises that use a cache or rotary)."""
    mistakes = {
        "KVCache": ("KVCache", "keys and values share one list"),
        "cached_attention": ("cached_attention", "the cache appended after attending"),
        "apply_rotary": ("apply_rotary", "interleaved pairs"),
        "GroupedQueryAttention": ("GroupedQueryAttention", "key/value heads repeated in the wrong order"),
        "MultiHeadLatentAttention": ("MultiHeadLatentAttention", "the up-projected keys and values cached"),
    }
    nb = inject(solved_notebook(course, ASSIGNMENT), {g: _code(*m) for g, m in mistakes.items()})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    expected_failed = {"test_KVCache", "test_cached_attention", "test_cached_attention_decoding", "test_apply_rotary",
                       "test_GroupedQueryAttention", "test_MultiHeadLatentAttention_cache"}
    assert failed_cells(result) == expected_failed
    # what still scores: the cost model 3, rotary's relative property 2 (interleaved pairs are rotary too), GQA against
    # MHA 2 (one head per group) and its cache 2 (wrong consistently), MLA 4 + decoding 2
    assert result.score == 15
    by_cell = {c.grade_id: c.message for c in result.cells}
    for cell, (_graded, start) in [("test_KVCache", mistakes["KVCache"]),
                                  ("test_cached_attention", mistakes["cached_attention"]),
                                  ("test_apply_rotary", mistakes["apply_rotary"]),
                                  ("test_GroupedQueryAttention", mistakes["GroupedQueryAttention"]),
                                  ("test_MultiHeadLatentAttention_cache", mistakes["MultiHeadLatentAttention"])]:
        assert f"This matches a known mistake: {start}" in by_cell[cell], (cell, by_cell[cell])


@pytest.mark.slow
def test_nbgrader_refuses_the_fused_kernel_and_names_rotary_on_values(course):
    sdpa_cached = ("def cached_attention(q_t, k_t, v_t, cache, layer=0):\n"
                   "    keys, values = cache.append(layer, k_t, v_t)\n"
                   "    T_new, T_total = q_t.shape[-2], keys.shape[-2]\n"
                   "    mask = torch.ones(T_new, T_total, dtype=torch.bool).tril(T_total - T_new)\n"
                   "    return torch.nn.functional.scaled_dot_product_attention(q_t, keys, values, attn_mask=mask)\n")
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "cached_attention": sdpa_cached,
        "MultiHeadLatentAttention": _code("MultiHeadLatentAttention", "rotary embedding applied to the values"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    # rotated values change what is computed, not what is cached: the cache cell still passes
    assert failed_cells(result) == {"test_cached_attention", "test_cached_attention_decoding",
                                    "test_MultiHeadLatentAttention", "test_MultiHeadLatentAttention_decoding"}
    by_cell = {c.grade_id: c.message for c in result.cells}
    assert "scaled_dot_product_attention" in by_cell["test_cached_attention"]
    assert "not accepted" in by_cell["test_cached_attention"]
    assert "call notebook 02's scaled_dot_product_attention instead" in by_cell["test_cached_attention"]
    assert "basic operations" not in by_cell["test_cached_attention"], by_cell["test_cached_attention"]
    assert "rotary embedding applied to the values too" in by_cell["test_MultiHeadLatentAttention"]
