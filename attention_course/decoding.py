"""Decoding with a key/value cache: the same greedy, beam and sampled translations as notebook 06's
readable decoders (`attention_course.translate`), without recomputing the whole prefix at every step.

Notebook 06's decoders call `model.decode(ys, ...)` on the whole prefix at every step, so step t
costs O(t) per layer and a sentence of L tokens O(L²). In causal self-attention position i sees only
positions 0..i, so a layer's keys and values for the tokens already generated never change: keep them
(the KV cache) and compute only the new position at each step. The cross-attention keys and values
come from the encoder's output and are computed once per sentence.

What evaluation uses (`attention_course.train.translate_texts`). The readable decoders stay the
lesson in notebook 06; `tests/test_decoding.py` checks both give the same translations.

Beam search here follows notebook 06's convention (a finished hypothesis leaves the beam, which
shrinks) and adds two things that do not change the result:
* early stopping per sentence, exact: a sentence stops once no live hypothesis can still beat its best
  finished one (a live score s ≤ 0 can only fall, so its best possible normalised score is
  s / L^length_penalty at the most favourable length L ≤ max_len);
* finished sentences leave the batch, and the host reads the device only every `check_every` steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .multihead import merge_heads, split_heads
from .translate import sample_next_token


@dataclass
class DecoderCache:
    """Per decoder layer: the cross-attention keys/values of the source (computed once) and the
    self-attention keys/values of the positions generated so far (preallocated to max_len)."""
    memory_k: list[torch.Tensor]     # per layer [N, H, S, Dh]
    memory_v: list[torch.Tensor]     # per layer [N, H, S, Dv]
    self_k: list[torch.Tensor]       # per layer [N, H, max_len, Dh], filled up to `length`
    self_v: list[torch.Tensor]       # per layer [N, H, max_len, Dv]
    src_mask: torch.Tensor           # [N, 1, 1, S], True = a real source token
    self_mask: torch.Tensor          # [N, 1, 1, max_len], True = the token there is not padding
    pad_id: int
    length: int = 0                  # positions cached so far

    def select(self, rows: torch.Tensor) -> "DecoderCache":
        """Keep (and reorder, or repeat) the rows `rows` [N'] of every tensor: beam reordering and
        dropping finished sentences."""
        pick = lambda ts: [t.index_select(0, rows) for t in ts] 
        return DecoderCache(pick(self.memory_k), pick(self.memory_v), pick(self.self_k), pick(self.self_v),
                            self.src_mask.index_select(0, rows), self.self_mask.index_select(0, rows),
                            self.pad_id, self.length)


def start_cache(model, src: torch.Tensor, src_mask: torch.Tensor, max_len: int, pad_id: int = 0) -> DecoderCache:
    """Encode `src` [N, S] once and precompute every decoder layer's cross-attention keys/values.
    A generated `pad_id` token is hidden from later positions, as `make_masks` hides it."""
    memory = model.encode(src, src_mask)                                   # [N, S, D]
    mk, mv, sk, sv = [], [], [], []
    for layer in model.decoder_layers:
        attn = layer.cross_attn
        mk.append(split_heads(attn.k_proj(memory), attn.num_heads))        # [N, H, S, Dh]
        mv.append(split_heads(attn.v_proj(memory), attn.num_heads))        # [N, H, S, Dv]
        own = layer.self_attn
        N, H = src.size(0), own.num_heads
        sk.append(memory.new_zeros(N, H, max_len, own.key_dim))
        sv.append(memory.new_zeros(N, H, max_len, own.value_dim))
    self_mask = torch.zeros(src.size(0), 1, 1, max_len, dtype=torch.bool, device=src.device)
    return DecoderCache(mk, mv, sk, sv, src_mask, self_mask, pad_id)


def _self_attention_step(attn, h: torch.Tensor, cache: DecoderCache, layer: int) -> torch.Tensor:
    """Self-attention of the one new position h [N, 1, D] over the cached positions and itself."""
    t = cache.length
    q = split_heads(attn.q_proj(h), attn.num_heads)                        # [N, H, 1, Dh]
    cache.self_k[layer][:, :, t:t + 1] = split_heads(attn.k_proj(h), attn.num_heads)
    cache.self_v[layer][:, :, t:t + 1] = split_heads(attn.v_proj(h), attn.num_heads)
    k = cache.self_k[layer][:, :, :t + 1]                                  # [N, H, t+1, Dh]
    v = cache.self_v[layer][:, :, :t + 1]
    mask = cache.self_mask[..., :t + 1]                                    # causal by construction
    return attn.out_proj(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


def _cross_attention_step(attn, h: torch.Tensor, cache: DecoderCache, layer: int) -> torch.Tensor:
    q = split_heads(attn.q_proj(h), attn.num_heads)                        # [N, H, 1, Dh]
    out = F.scaled_dot_product_attention(q, cache.memory_k[layer], cache.memory_v[layer],
                                         attn_mask=cache.src_mask)         # [N, H, 1, Dv]
    return attn.out_proj(merge_heads(out))


def decode_step(model, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
    """Logits [N, V] for the next token after `tokens` [N] (the tokens at position cache.length),
    given the cached prefix; appends this position to the cache (for an `Ensemble`: the mean of its
    members' log-probabilities). The model must be in eval mode
    (no dropout), as for any decoding."""
    if model.training:
        raise RuntimeError("decode_step needs model.eval(): dropout would make cached decoding differ")
    if isinstance(model, Ensemble):                                        # mean of log p: [N, V]
        return torch.stack([F.log_softmax(decode_step(m, tokens, c).float(), dim=-1)
                            for m, c in zip(model.members, cache.caches, strict=True)]).mean(dim=0)
    t = cache.length
    cache.self_mask[:, 0, 0, t] = tokens != cache.pad_id
    x = model.tgt_embed(tokens[:, None]) * math.sqrt(model.d_model) + model.positional.pe[t]   # [N, 1, D]
    for i, layer in enumerate(model.decoder_layers):
        if layer.norm_first:
            x = x + _self_attention_step(layer.self_attn, layer.norm1(x), cache, i)
            x = x + _cross_attention_step(layer.cross_attn, layer.norm2(x), cache, i)
            x = x + layer.ff(layer.norm3(x))
        else:
            x = layer.norm1(x + _self_attention_step(layer.self_attn, x, cache, i))
            x = layer.norm2(x + _cross_attention_step(layer.cross_attn, x, cache, i))
            x = layer.norm3(x + layer.ff(x))
    cache.length = t + 1
    return model.generator(model.decoder_norm(x))[:, 0]                    # [N, V]


class Ensemble(torch.nn.Module):
    """Several translators decoding as one: at every step the next-token scores are the mean of the
    members' log-probabilities (independently trained seeds make different mistakes, and averaging
    them usually gains a BLEU point or two). The members must share a vocabulary. Decodes with the
    cached decoders below and `evaluation.translate_texts` (the readable decoders need one model)."""

    def __init__(self, models):
        super().__init__()
        models = list(models)
        if not models:
            raise ValueError("an ensemble needs at least one model")
        vocab = {m.generator.out_features for m in models}
        if len(vocab) > 1:
            raise ValueError(f"the ensemble's models have different vocabularies ({sorted(vocab)}): "
                             "members must be trained with the same tokenizer")
        self.members = torch.nn.ModuleList(models)

    @property
    def positional(self):
        """The positional table that bounds the sentence length (the shortest member's)."""
        return min((m.positional for m in self.members), key=lambda p: p.pe.size(0))


@dataclass
class EnsembleCache:
    """One `DecoderCache` per member of an `Ensemble`."""
    caches: list[DecoderCache]

    def select(self, rows: torch.Tensor) -> "EnsembleCache":
        return EnsembleCache([c.select(rows) for c in self.caches])


def _start(model, src: torch.Tensor, max_len: int, pad_id: int) -> DecoderCache | EnsembleCache:
    if isinstance(model, Ensemble):
        return EnsembleCache([_start(m, src, max_len, pad_id) for m in model.members])
    src_mask = (src != pad_id)[:, None, None, :]                           # [N, 1, 1, S]
    return start_cache(model, src, src_mask, max_len, pad_id)


@torch.no_grad()
def greedy_decode_cached(model, src: torch.Tensor, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                         check_every: int = 4) -> torch.Tensor:
    """`translate.greedy_decode` with a KV cache: the same output [B, L]. Finished sentences leave
    the batch; the device is read every `check_every` steps only."""
    B, device = src.size(0), src.device
    out = torch.full((B, max_len + 1), pad_id, dtype=torch.long, device=device)
    out[:, 0] = bos_id
    last_step = torch.full((B,), max_len, dtype=torch.long, device=device)   # step each row emitted eos
    alive = torch.arange(B, device=device)                                 # rows of `out` still decoding
    cache = _start(model, src, max_len, pad_id)
    token = out[:, 0]
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(1, max_len + 1):
        token = decode_step(model, token, cache).argmax(dim=-1).masked_fill(finished, pad_id)
        out[alive, t] = token
        newly = (token == eos_id) & ~finished
        last_step[alive] = torch.where(newly, t, last_step[alive])
        finished = finished | newly
        if t % check_every == 0 and t < max_len:
            keep = (~finished).nonzero().squeeze(1)                        # the one host read
            if keep.numel() == 0:
                break
            if keep.numel() < alive.numel():
                alive, token, finished = alive[keep], token[keep], finished[keep]
                cache = cache.select(keep)
    return out[:, :int(last_step.max()) + 1]


@torch.no_grad()
def sample_decode_cached(model, src: torch.Tensor, max_len: int, bos_id: int, eos_id: int, pad_id: int,
                         temperature: float = 1.0, top_k: int | None = None,
                         generator: torch.Generator | None = None, check_every: int = 4) -> torch.Tensor:
    """`translate.sample_decode` with a KV cache: the same draws from the same generator. Every row
    draws at every step, as the readable version does, so the generator is consumed identically."""
    B, device = src.size(0), src.device
    out = torch.full((B, max_len + 1), pad_id, dtype=torch.long, device=device)
    out[:, 0] = bos_id
    last_step = torch.full((B,), max_len, dtype=torch.long, device=device)
    cache = _start(model, src, max_len, pad_id)
    token, finished = out[:, 0], torch.zeros(B, dtype=torch.bool, device=device)
    for t in range(1, max_len + 1):
        logits = decode_step(model, token, cache).float()
        token = sample_next_token(logits, temperature, top_k, generator).masked_fill(finished, pad_id)
        out[:, t] = token
        newly = (token == eos_id) & ~finished
        last_step = torch.where(newly, t, last_step)
        finished = finished | newly
        if t % check_every == 0 and bool(finished.all()):
            break
    return out[:, :int(last_step.max()) + 1]


def _best_possible(live_scores: torch.Tensor, t: int, max_len: int, length_penalty: float) -> torch.Tensor:
    """[n] the best normalised score any live hypothesis [n, k] could still reach (its sum of log p
    can only fall): s / L^lp at the most favourable final length L in (t, max_len]."""
    best_live = live_scores.max(dim=1).values.double()                     # [n], -inf if none live
    if t >= max_len:
        return torch.full_like(best_live, float("-inf"))
    return torch.maximum(best_live / (t + 1) ** length_penalty, best_live / max_len ** length_penalty)


@torch.no_grad()
def beam_search_cached(model, src: torch.Tensor, beam_size: int, max_len: int, bos_id: int, eos_id: int,
                       pad_id: int, length_penalty: float = 1.0, check_every: int = 4) -> torch.Tensor:
    """`translate.beam_search` with a KV cache, exact per-sentence early stopping, and finished
    sentences dropped from the batch: the same output [B, L]."""
    B, k, device = src.size(0), beam_size, src.device
    ninf = float("-inf")
    cache = _start(model, src.repeat_interleave(k, dim=0), max_len, pad_id)   # [B*k] rows
    ys = torch.full((B * k, max_len + 1), pad_id, dtype=torch.long, device=device)
    ys[:, 0] = bos_id
    scores = torch.full((B, k), ninf, device=device)                       # sum log p of each live beam
    scores[:, 0] = 0.0                                                     # at first one live beam: <bos>
    best_score = torch.full((B,), ninf, dtype=torch.float64, device=device)   # best finished, normalised
    best = torch.full((B, max_len + 1), pad_id, dtype=torch.long, device=device)
    best_len = torch.ones(B, dtype=torch.long, device=device)
    alive = torch.arange(B, device=device)                                 # sentences still searching
    token = ys[:, 0]
    for t in range(1, max_len + 1):
        log_probs = F.log_softmax(decode_step(model, token, cache).float(), dim=-1)   # [n*k, V]
        n, V = alive.numel(), log_probs.size(-1)
        candidates = scores[:, :, None] + log_probs.view(n, k, V)          # [n, k, V]
        top, index = candidates.view(n, k * V).topk(k, dim=-1)             # the k best extensions
        beam, new = index // V, index % V                                  # [n, k]
        rows = (torch.arange(n, device=device)[:, None] * k + beam).view(-1)
        ys = ys.index_select(0, rows)
        ys[:, t] = new.view(-1)
        cache = cache.select(rows)
        ended = (new == eos_id) | (t == max_len)
        # float64, as notebook 06's `top[b, j].item() / t ** length_penalty`: the same ties
        final = torch.where(ended & torch.isfinite(top), top.double() / t ** length_penalty, ninf)   # [n, k]
        value, j = final.max(dim=1)                                        # first of equals, as notebook 06
        better = value > best_score[alive]                                 # strictly: earlier wins ties
        best_score[alive] = torch.where(better, value, best_score[alive])
        chosen = ys.view(n, k, -1)[torch.arange(n, device=device), j]      # [n, max_len + 1]
        best[alive] = torch.where(better[:, None], chosen, best[alive])
        best_len[alive] = torch.where(better, t + 1, best_len[alive])
        scores = top.masked_fill(ended, ninf)                              # finished leave the beam
        token = new.view(-1)
        if t == max_len:
            break
        if t % check_every == 0:
            done = best_score[alive] >= _best_possible(scores, t, max_len, length_penalty)
            keep = (~done).nonzero().squeeze(1)                            # the one host read
            if keep.numel() == 0:
                break
            if keep.numel() < n:
                row_keep = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)
                alive, scores = alive[keep], scores[keep]
                ys, token, cache = ys[row_keep], token[row_keep], cache.select(row_keep)
    return best[:, :int(best_len.max())]
