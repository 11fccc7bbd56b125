"""`Seq2SeqTransformer`: the encoder–decoder translator of notebook 06, built from the course's
own layers (notebook 05's `EncoderLayer` / `DecoderLayer`, notebook 04's `PositionalEncoding`,
notebook 03's `MultiHeadAttention`).

Speed: the course's `MultiHeadAttention` computes attention the readable way (scores, softmax,
weights @ values) and returns the weights. For training, the model swaps each of its attention
modules to `FusedMultiHeadAttention`, a subclass with the *same parameters* whose forward calls
`torch.nn.functional.scaled_dot_product_attention` (a fused kernel; on a GPU it never builds the
[T_q, T_k] weight matrix) and returns ``None`` for the weights. `readable_attention(model)` switches
back, e.g. to plot cross-attention; tests check both paths give the same numbers.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.layers import DecoderLayer, EncoderLayer, FeedForward
from attention_course.multihead import MultiHeadAttention, merge_heads, split_heads
from attention_course.positional import PositionalEncoding


class FusedMultiHeadAttention(MultiHeadAttention):
    """The course's MultiHeadAttention with a fused path (`fused = True`): same parameters, same
    mask convention (boolean, True = may attend), same outputs; the weights come back as None.
    Self-attention (query is key is value) projects q, k and v with one matrix multiplication."""

    fused: bool = True

    def _project(self, query, key, value):
        projs = (self.q_proj, self.k_proj, self.v_proj)
        if key is query and value is query and all(p.bias is not None for p in projs):
            weight = torch.cat([p.weight for p in projs])             # [Dq + Dk + Dv, D]: one matmul
            bias = torch.cat([p.bias for p in projs])
            return F.linear(query, weight, bias).split([p.out_features for p in projs], dim=-1)
        return tuple(p(x) for p, x in zip(projs, (query, key, value), strict=True))

    def forward(self, query, key=None, value=None, mask=None):
        if not self.fused:
            return super().forward(query, key, value, mask)
        key = query if key is None else key
        value = key if value is None else value
        q, k, v = (split_heads(x, self.num_heads) for x in self._project(query, key, value))   # [B, H, T, Dh]
        p = self.dropout.p if self.training else 0.0
        heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        if mask is not None and not self.training:
            # A query with no allowed key: a zero output, as the readable path gives. Training never
            # needs this (`make_masks` always lets a query see <bos> and a source its own tokens).
            heads = heads.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return self.out_proj(merge_heads(heads)), None


def attention_modules(model: nn.Module) -> list[MultiHeadAttention]:
    return [m for m in model.modules() if isinstance(m, MultiHeadAttention)]


def set_fused(model: nn.Module, fused: bool = True) -> nn.Module:
    """Switch every attention module of `model` to the fused (True) or readable (False) path."""
    for m in attention_modules(model):
        if not isinstance(m, FusedMultiHeadAttention):
            m.__class__ = FusedMultiHeadAttention   # same parameters and buffers, one more method
        m.fused = fused
    return model


@contextlib.contextmanager
def readable_attention(model: nn.Module):
    """Within the block, attention runs the readable way and the layers keep their weights."""
    before = [getattr(m, "fused", False) for m in attention_modules(model)]
    set_fused(model, False)
    try:
        yield model
    finally:
        for m, flag in zip(attention_modules(model), before, strict=True):
            m.fused = flag


@dataclass(frozen=True)
class ModelConfig:
    """Everything that defines a translator's architecture: what the model is built from, what the
    trainer writes to a run's config.json, and what a checkpoint is loaded with."""
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1                     # residual paths and embeddings
    max_len: int = 256                       # longest sequence the positional table covers
    share_embeddings: bool = False           # one matrix: source and target embeddings and output layer
    norm_first: bool = False                 # pre-norm (True) or the paper's post-norm
    fused: bool = True                       # F.scaled_dot_product_attention inside the course's attention
    attention_dropout: float | None = None   # on the attention weights (None: = dropout)
    activation_dropout: float | None = None  # after the feed-forward ReLU (None: = dropout)


class Seq2SeqTransformer(nn.Module):
    """Encoder–decoder Transformer ("Attention Is All You Need"), batch first.

    encode(src [B, S], src_mask [B, 1, 1, S]) -> memory [B, S, d_model]
    decode(tgt [B, T], memory, tgt_mask [B, 1, T, T], memory_mask [B, 1, 1, S]) -> logits [B, T, V_tgt]
    Masks are boolean, True = may attend (see `attention_course.translate.make_masks`).

    share_embeddings: one matrix for the source embedding, the target embedding and the output
    layer (needs a joint vocabulary, src_vocab_size == tgt_vocab_size).
    """

    def __init__(self, src_vocab_size: int | ModelConfig, tgt_vocab_size: int | None = None, **settings):
        """Seq2SeqTransformer(ModelConfig(...)) or Seq2SeqTransformer(src_vocab_size, tgt_vocab_size,
        d_model=..., ...) with the fields of `ModelConfig` as keywords."""
        super().__init__()
        cfg = src_vocab_size if isinstance(src_vocab_size, ModelConfig) else \
            ModelConfig(src_vocab_size, tgt_vocab_size, **settings)
        if cfg.share_embeddings and cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise ValueError("share_embeddings needs one joint vocabulary (src_vocab_size == tgt_vocab_size)")
        self.config = cfg
        d_model, num_heads, d_ff, dropout, norm_first = cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout, cfg.norm_first
        self.d_model = d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d_model)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, cfg.max_len, dropout)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(cfg.num_encoder_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(cfg.num_decoder_layers))
        # pre-norm stacks end with a LayerNorm (their residual stream is never normalized otherwise)
        self.encoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.generator = nn.Linear(d_model, cfg.tgt_vocab_size)
        self._set_inner_dropout(cfg.attention_dropout, cfg.activation_dropout)
        self._reset_parameters()
        if cfg.share_embeddings:
            self.generator.weight = self.tgt_embed.weight
        set_fused(self, cfg.fused)

    def _set_inner_dropout(self, attention: float | None, activation: float | None) -> None:
        """`dropout` is the residual and embedding dropout; the dropout on the attention weights and
        after the feed-forward ReLU can differ (Transformer-Tiny: 0.3 on residuals, 0 inside).
        None: the same as `dropout`, as notebook 05's layers do."""
        for m in self.modules():
            if attention is not None and isinstance(m, MultiHeadAttention):
                m.dropout.p = attention
            if activation is not None and isinstance(m, FeedForward):
                m.dropout.p = activation

    def _reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
        for emb in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(emb.weight, mean=0.0, std=self.d_model ** -0.5)

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.positional(embedding(tokens) * math.sqrt(self.d_model))

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self._embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, tgt_mask: torch.Tensor | None = None,
               memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        y = self._embed(self.tgt_embed, tgt)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask, memory_mask)
        if self.last_position_only:     # decoding reads logits[:, -1] only: skip the other positions' output layer
            y = y[:, -1:]
        return self.generator(self.decoder_norm(y))

    last_position_only = False   # see decoding_speedup()

    @contextlib.contextmanager
    def decoding_speedup(self):
        """Within the block, decode() returns logits for the last position only ([B, 1, V]): all that
        greedy, beam and sampled decoding read (logits[:, -1]), without the output layer's cost for
        the other positions. Used by `attention_course.train.translate_texts`."""
        before, self.last_position_only = self.last_position_only, True
        try:
            yield self
        finally:
            self.last_position_only = before

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        """Teacher forcing: logits [B, T, V] for the target prefix `tgt` given `src`."""
        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, src_mask)

    def cross_attention(self) -> list[torch.Tensor | None]:
        """Each decoder layer's last cross-attention weights [B, H, T, S] (readable path only)."""
        return [layer.cross_attn_weights for layer in self.decoder_layers]
