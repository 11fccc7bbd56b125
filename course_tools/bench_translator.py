"""`attn-course bench-translator`: speed of the translator's engine, measured side by side in one run
(ratios, not absolute times, are what carry from one machine to another).

* decoding: the KV-cached decoders against notebook 06's readable ones (which recompute the whole
  prefix at every step), on the shipped model and real test sentences, greedy and beam; the outputs
  must be identical, and the benchmark says so;
* training: the course's layers against `torch.nn.Transformer` with the same weights copied in, on the
  same batches (forward, backward, optimizer step), after checking both give the same loss.
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from attention_course import bpe, data
from attention_course.batching import encode_pairs, padded_batches
from attention_course.checkpoints import load_shipped
from attention_course.evaluation import translate_texts
from attention_course.hardware import describe_device
from attention_course.layers import state_dict_from_torch
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import get_config
from attention_course.translate import label_smoothed_cross_entropy, make_masks

SHIPPED = "cpu-hour.en-de"


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_decoding(sentences: int = 200, beam: int = 5, log=print) -> list[dict]:
    model, tok, info, summary, _ = load_shipped(SHIPPED, device="cpu")
    texts = [s for s, _ in data.load_multi30k("test_2016_flickr", info["src"], info["tgt"])[:sentences]]
    lp = summary.get("length_penalty", {}).get("chosen", info["train"]["length_penalty"])
    rows = []
    for name, k in (("greedy", 1), (f"beam {beam}", beam)):
        readable, t_readable = _timed(lambda k=k: translate_texts(model, tok, texts, beam_size=k, length_penalty=lp,
                                                                   cached=False))
        cached, t_cached = _timed(lambda k=k: translate_texts(model, tok, texts, beam_size=k, length_penalty=lp,
                                                               cached=True))
        rows.append({"decoding": name, "readable_s": t_readable, "cached_s": t_cached,
                     "speedup": t_readable / t_cached, "identical": readable == cached})
        log(f"{name:>8}: readable {t_readable:6.1f} s, KV cache {t_cached:6.1f} s: {t_readable / t_cached:4.1f}x faster; "
            f"identical translations: {'yes' if readable == cached else 'NO'} ({len(texts)} sentences)")
    return rows


class TorchTransformer(nn.Module):
    """torch.nn.Transformer between the course model's own embeddings and output layer (shared
    objects), so the two differ only in the encoder and decoder stacks."""

    def __init__(self, ours: Seq2SeqTransformer):
        super().__init__()
        c = ours.config
        self.ours = ours
        import warnings

        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")   # pre-norm: not used, fine
        self.core = nn.Transformer(c.d_model, c.num_heads, c.num_encoder_layers, c.num_decoder_layers, c.d_ff,
                                   dropout=c.dropout, batch_first=True, norm_first=c.norm_first)

    def copy_into_ours(self) -> None:
        """Their weights into the course model (nn.Transformer's stacks end with a LayerNorm each)."""
        for mine, theirs in zip(self.ours.encoder_layers, self.core.encoder.layers, strict=True):
            mine.load_state_dict(state_dict_from_torch(theirs))
        for mine, theirs in zip(self.ours.decoder_layers, self.core.decoder.layers, strict=True):
            mine.load_state_dict(state_dict_from_torch(theirs))
        self.ours.encoder_norm.load_state_dict(self.core.encoder.norm.state_dict())
        self.ours.decoder_norm.load_state_dict(self.core.decoder.norm.state_dict())

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        o = self.ours
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)   # True = blocked
        y = self.core(o._embed(o.src_embed, src), o._embed(o.tgt_embed, tgt), tgt_mask=causal,
                      src_key_padding_mask=src == bpe.PAD_ID, tgt_key_padding_mask=tgt == bpe.PAD_ID,
                      memory_key_padding_mask=src == bpe.PAD_ID, tgt_is_causal=True)
        return o.generator(y)


def _step(model, opt, batch, epsilon: float) -> torch.Tensor:
    tgt_in, tgt_out = batch.tgt[:, :-1], batch.tgt[:, 1:]
    src_mask, tgt_mask = make_masks(batch.src, tgt_in, bpe.PAD_ID)
    loss = label_smoothed_cross_entropy(model(batch.src, tgt_in, src_mask, tgt_mask), tgt_out, epsilon, bpe.PAD_ID)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def bench_training(config: str = "cpu-hour", steps: int = 20, rounds: int = 3, log=print) -> dict:
    cfg = get_config(config, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)   # same math in both
    pairs = data.load_multi30k("train", "en", "de")
    tok = bpe.train_joint_bpe(pairs, cfg.vocab_size, cfg.min_frequency)
    batches = padded_batches(encode_pairs(tok, pairs, cfg.max_len), cfg.max_tokens, torch.device("cpu"))[:steps]
    tokens = sum(b.target_tokens for b in batches)
    torch.manual_seed(0)
    ours = Seq2SeqTransformer(cfg.model_config(tok.get_vocab_size()))
    theirs = TorchTransformer(ours)
    theirs.copy_into_ours()
    ours.train(), theirs.train()
    first = batches[0]
    with torch.no_grad():
        src_mask, tgt_mask = make_masks(first.src, first.tgt[:, :-1], bpe.PAD_ID)
        a = ours(first.src, first.tgt[:, :-1], src_mask, tgt_mask)
        b = theirs(first.src, first.tgt[:, :-1], src_mask, tgt_mask)
        real = first.tgt[:, :-1] != bpe.PAD_ID
        gap = float((a[real] - b[real]).abs().max())
    log(f"same weights, same batch: largest logit difference {gap:.1e}")
    states = {k: v.clone() for k, v in ours.state_dict().items()}, {k: v.clone() for k, v in theirs.state_dict().items()}
    times = {"course layers": [], "torch.nn.Transformer": []}
    for _ in range(rounds):                                   # interleaved, so both see the same machine load
        for name, model, state in (("course layers", ours, states[0]), ("torch.nn.Transformer", theirs, states[1])):
            model.load_state_dict(state)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            _, seconds = _timed(lambda model=model, opt=opt: [_step(model, opt, batch, cfg.label_smoothing)
                                                                  for batch in batches])
            times[name].append(seconds)
    ours_s, theirs_s = statistics.median(times["course layers"]), statistics.median(times["torch.nn.Transformer"])
    log(f"training, {steps} steps of `{config}` ({tokens:,} target tokens), median of {rounds}: course layers "
        f"{tokens / ours_s:,.0f} tokens/s, torch.nn.Transformer {tokens / theirs_s:,.0f} tokens/s: "
        f"ratio {theirs_s / ours_s:.3f} (above 1: the course's layers are faster)")
    return {"logit_gap": gap, "ours_s": ours_s, "theirs_s": theirs_s, "ratio": theirs_s / ours_s, "tokens": tokens}


def main(sentences: int = 200, steps: int = 20, threads: int | None = None, log=print) -> None:
    if threads:
        torch.set_num_threads(threads)
    log(f"machine: {describe_device(torch.device('cpu'))}, {torch.get_num_threads()} PyTorch thread(s), torch {torch.__version__}")
    bench_decoding(sentences, log=log)
    bench_training(steps=steps, log=log)
