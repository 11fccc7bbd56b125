"""Batches for training: sentence pairs as token ids, grouped by length into batches of at most
`max_tokens` tokens (padding included), padded once into tensors, and dealt out step by step (to
several processes under torchrun); with BPE-dropout, several segmentations of the corpus taken in
turn, epoch by epoch; and source word dropout, applied to a batch as it is trained on."""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from . import bpe


def encode_pairs(tok, pairs, max_len: int | None = None):
    """[(src ids + eos, bos + tgt ids + eos)], dropping pairs longer than max_len tokens."""
    src = bpe.encode(tok, [p[0] for p in pairs], bos=False, eos=True)
    tgt = bpe.encode(tok, [p[1] for p in pairs], bos=True, eos=True)
    data = list(zip(src, tgt, strict=True))
    if max_len:
        data = [(s, t) for s, t in data if len(s) <= max_len and len(t) <= max_len + 1]
    return data


def token_batches(data, max_tokens: int, shuffle: bool = True, rng: random.Random | None = None):
    """Lists of indices into `data`: sentences of similar length together, each batch holding at most
    `max_tokens` tokens counting padding (n sentences x the longest side)."""
    rng = rng or random.Random(0)
    order = sorted(range(len(data)), key=lambda i: (len(data[i][1]), len(data[i][0]),
                                                    rng.random() if shuffle else i))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(len(data[i][0]), len(data[i][1]))
        if current and (len(current) + 1) * max(longest, size) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(rows, pad_id: int = bpe.PAD_ID, device=None) -> torch.Tensor:
    """Token-id lists -> Long [N, longest], padded with pad_id (one tensor built from padded lists)."""
    longest = max(len(r) for r in rows)
    out = torch.tensor([list(r) + [pad_id] * (longest - len(r)) for r in rows], dtype=torch.long)
    return out.to(device) if device is not None else out


@dataclass
class Batch:
    src: torch.Tensor          # [N, S]
    tgt: torch.Tensor          # [N, T + 1]: <bos> ... <eos>, padded
    target_tokens: int         # tokens the loss counts (known on the host: no device read)


def padded_batches(data, max_tokens: int, device: torch.device, seed: int = 0) -> list[Batch]:
    """Every batch padded once and placed on `device` once (the corpus is small: a few MB); each epoch
    only shuffles their order (as fairseq does)."""
    groups = token_batches(data, max_tokens, shuffle=True, rng=random.Random(seed))
    out = []
    for group in groups:
        src = collate([data[i][0] for i in group])
        tgt = collate([data[i][1] for i in group])
        if device.type == "cuda":
            src, tgt = src.pin_memory().to(device, non_blocking=True), tgt.pin_memory().to(device, non_blocking=True)
        out.append(Batch(src, tgt, sum(len(data[i][1]) - 1 for i in group)))
    return out


def step_stream(num_batches: int, per_step: int, rng: random.Random):
    """Endless (epoch, batch indices) for each optimizer step: every epoch a new order, cut into steps of
    `per_step` batches (world size x accumulation; the remainder of an epoch is left out, so all
    processes take the same number of steps). `epoch` counts completed epochs as a fraction."""
    if num_batches < per_step:
        raise ValueError(f"only {num_batches} batches for {per_step} per optimizer step "
                         "(world size x accumulate): use a smaller max_tokens or fewer processes")
    steps = num_batches // per_step
    epoch = 0
    while True:
        order = list(range(num_batches))
        rng.shuffle(order)
        for s in range(steps):
            yield epoch + (s + 1) / steps, order[s * per_step:(s + 1) * per_step]
        epoch += 1


def segmentation_stream(segmentations: list[list[Batch]], per_step: int, rng: random.Random):
    """Endless (epoch, this step's batches, all processes') over one or more segmentations of the
    training set (several: BPE-dropout): epoch e reads segmentations[e mod N], cut into steps as
    `step_stream` does. With one segmentation, exactly `step_stream`'s batches (the same draws)."""
    for batches in segmentations:
        if len(batches) < per_step:
            raise ValueError(f"only {len(batches)} batches for {per_step} per optimizer step "
                             "(world size x accumulate): use a smaller max_tokens or fewer processes")
    epoch = 0
    while True:
        batches = segmentations[epoch % len(segmentations)]
        steps = len(batches) // per_step
        order = list(range(len(batches)))
        rng.shuffle(order)
        for s in range(steps):
            yield epoch + (s + 1) / steps, [batches[i] for i in order[s * per_step:(s + 1) * per_step]]
        epoch += 1


def drop_source_tokens(src: torch.Tensor, rate: float) -> torch.Tensor:
    """Source word dropout (training only): each ordinary token of src [N, S] becomes <unk> with
    probability `rate`; <pad>, <bos>, <eos> and <unk> stay. Replacing rather than deleting keeps the
    batch's shape and padding (no re-padding on the device); the model learns to translate around a
    word it cannot read. rate 0: `src` itself."""
    if not rate:
        return src
    hit = (torch.rand(src.shape, device=src.device) < rate) & (src >= len(bpe.SPECIALS))   # [N, S]
    return src.masked_fill(hit, bpe.UNK_ID)
