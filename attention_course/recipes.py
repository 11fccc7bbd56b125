"""Training recipes: one `TrainConfig` per named configuration (`attn-course train --config NAME`),
and `--set KEY=VALUE` overrides. The architecture's fields are those of `model.ModelConfig`.

* ``gpu``      Transformer-Tiny (Wu et al. 2021, the best published small model on Multi30k), pre-norm,
               for one GPU: bf16 autocast, fused attention, 8k-token batches, the last 10 checkpoints
               averaged; 8000 steps took about 5 minutes on one H100 (three runs sharing it). What
               notebook 06 reads (its weights are shipped in models/);
* ``cpu-hour`` an hour on one CPU core (shipped too: the benchmarks and tests decode with it);
* ``cpu``      about 20 minutes on a laptop without a GPU;
* ``quick``    CI's learning check: a fixed 300 steps, and it demonstrably learns;
* ``toy``      seconds, on the team-written toy corpus (tests).

The regularisers of issue 28 (`rdrop_alpha`, `word_dropout`, `bpe_dropout`, `lr_cooldown`, `ema_decay`)
are fields of every recipe, off by default: a recipe that leaves them off trains exactly as before.
`attention_course.wave` trains several variants of one recipe at once on one GPU.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace

import torch

from .model import ModelConfig


@dataclass(frozen=True)
class TrainConfig:
    name: str
    corpus: str = "multi30k"           # "multi30k" or "toy"
    train_limit: int | None = None     # use only the first N training pairs
    # tokenizer
    vocab_size: int = 8000
    min_frequency: int = 2
    # model
    d_model: int = 256
    num_heads: int = 4
    num_encoder_layers: int = 3
    num_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1               # on the residual paths and the embeddings
    attention_dropout: float | None = None   # on the attention weights (None: = dropout)
    activation_dropout: float | None = None  # after the feed-forward ReLU (None: = dropout)
    norm_first: bool = False
    share_embeddings: bool = True
    max_len: int = 128                 # longest sentence (in tokens) kept for training
    # optimisation
    label_smoothing: float = 0.1
    peak_lr: float = 1e-3
    warmup: int = 1000
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    max_tokens: int = 4096             # per micro-batch: sentences x longest side, padding included
    accumulate: int = 1                # micro-batches per optimizer step
    max_steps: int | None = None
    max_epochs: float | None = None
    max_seconds: float | None = None   # training time (steps only: evaluations and checkpoints not counted)
    # monitoring and checkpoints
    eval_every: int = 500              # optimizer steps between validation loss + BLEU
    val_bleu_sentences: int = 200      # greedy BLEU on the first N validation sentences
    checkpoint_every: int = 500
    average_last: int = 1              # average the last N checkpoints at the end (1: no averaging)
    # regularisers and the schedule's end (issue 28): each off by default, and off changes nothing
    rdrop_alpha: float = 0.0           # R-Drop: every batch twice (two dropout masks), + alpha x their symmetric KL
    word_dropout: float = 0.0          # training only: each non-special source token becomes <unk> with this probability
    bpe_dropout: float = 0.0           # training only: each BPE merge skipped with this probability (Provilkov et al.)
    bpe_dropout_samples: int = 8       # segmentations of the training set drawn at the start; epoch e reads e mod N
    lr_cooldown: float = 0.0           # the learning rate falls linearly to 0 over this last fraction of the budget
    ema_decay: float = 0.0             # evaluate and save an exponential moving average of the weights (0: off)
    # decoding for evaluation
    beam_size: int = 4
    length_penalty: float = 0.6
    # hardware
    bf16: bool = True                  # bf16 autocast on CUDA (ignored on CPU)
    fused: bool = True                 # F.scaled_dot_product_attention inside the course's attention
    compile: bool | str = False        # torch.compile the model: True (inductor) or a backend name, e.g. "aot_eager"
    num_threads: int | None = None     # CPU threads (None: PyTorch's default)
    seed: int = 1

    def __post_init__(self):
        """Refuse a regulariser setting out of its range before any work starts (a GPU run's first
        minute must not be the first place a typo shows)."""
        if self.rdrop_alpha < 0:
            raise ValueError(f"rdrop_alpha must be >= 0, got {self.rdrop_alpha}")
        for name in ("word_dropout", "bpe_dropout", "ema_decay"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.lr_cooldown <= 1:
            raise ValueError(f"lr_cooldown must be in [0, 1], got {self.lr_cooldown}")
        if self.bpe_dropout_samples < 1:
            raise ValueError(f"bpe_dropout_samples must be >= 1, got {self.bpe_dropout_samples}")
        if self.lr_cooldown and self.max_steps is None and self.max_seconds is None and self.max_epochs is None:
            raise ValueError("lr_cooldown needs a budget to cool down before: set max_steps, max_seconds or max_epochs")

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model this recipe trains, on a joint vocabulary of `vocab_size` (the architecture's
        fields are `ModelConfig`'s; this recipe holds their values)."""
        same = {f.name: getattr(self, f.name) for f in fields(ModelConfig)
                if f.name in TrainConfig.__dataclass_fields__ and f.name != "max_len"}
        return ModelConfig(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size,
                           max_len=max(self.max_len, 256), **same)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """A recipe from a run's config.json (settings this version does not know are ignored)."""
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**{**known, "betas": tuple(known.get("betas", cls.betas))})


CONFIGS: dict[str, TrainConfig] = {
    # One H100, <= 10 minutes of training: Transformer-Tiny (Wu et al. 2021, the best small-model result
    # on Multi30k: 41.02 BLEU en->de test2016, tokenized lowercased; their larger models did worse):
    # 4+4 layers, d 128, feed-forward 256, 4 heads, shared embeddings, joint BPE 10k, dropout 0.3 on
    # the residual paths and embeddings only, Adam (0.9, 0.98), lr 5e-3, inverse-sqrt schedule with
    # 2000 warm-up steps, ~8k tokens per update, 8000 updates, a checkpoint about once an epoch and
    # the last 10 averaged, beam 5 (length penalty chosen on validation). One change, measured on an
    # H100 (issue 17): pre-norm layers. Post-norm at lr 5e-3 blew up en->de (validation BLEU fell
    # from 13.5 to 4.6 between steps 2000 and 4000, and ended at 35.8); pre-norm trained smoothly
    # to 42.0 validation BLEU (beam 5), post-norm at half the learning rate to 40.6.
    "gpu": TrainConfig(
        name="gpu", vocab_size=10000, d_model=128, num_heads=4, num_encoder_layers=4, num_decoder_layers=4,
        d_ff=256, dropout=0.3, attention_dropout=0.0, activation_dropout=0.0, norm_first=True,
        label_smoothing=0.1, peak_lr=5e-3, warmup=2000, weight_decay=0.0, max_tokens=8192, accumulate=1,
        max_steps=8000, max_seconds=570, eval_every=1000, val_bleu_sentences=1014, checkpoint_every=60,
        average_last=10, beam_size=5, length_penalty=1.0),
    # The course's earlier GPU recipe (13.1M parameters, 6+6 pre-norm layers, d 256), kept to compare.
    "gpu-wide": TrainConfig(
        name="gpu-wide", vocab_size=8000, d_model=256, num_heads=4, num_encoder_layers=6, num_decoder_layers=6,
        d_ff=1024, dropout=0.3, norm_first=True, label_smoothing=0.1, peak_lr=1.5e-3, warmup=1000,
        weight_decay=1e-4, max_tokens=8192, accumulate=1, max_steps=6000, max_seconds=570,
        eval_every=1000, val_bleu_sentences=1014, checkpoint_every=200, average_last=10, beam_size=5,
        length_penalty=1.0),
    # A laptop without a GPU: 19 minutes of training on 2 cores (then about 3 minutes to evaluate). On a
    # small budget a narrow model that sees the data ~10 times beats a wide one that sees it 4 times.
    "cpu": TrainConfig(
        name="cpu", vocab_size=5000, d_model=128, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
        d_ff=512, dropout=0.1, norm_first=True, peak_lr=3e-3, warmup=300, max_tokens=2500,
        max_seconds=1140, eval_every=500, val_bleu_sentences=200, checkpoint_every=150, average_last=5,
        beam_size=4, length_penalty=0.6),
    # An hour on one CPU core: the `cpu` model trained three times longer, regularised the
    # Transformer-Tiny way (dropout on the residual paths and embeddings only), checkpoints about
    # once an epoch and the last five averaged. Notebook 06 reads its shipped weights.
    "cpu-hour": TrainConfig(
        name="cpu-hour", vocab_size=5000, d_model=128, num_heads=4, num_encoder_layers=3, num_decoder_layers=3,
        d_ff=512, dropout=0.2, attention_dropout=0.0, activation_dropout=0.0, norm_first=True, peak_lr=3e-3,
        warmup=400, max_tokens=2500, max_seconds=3540, eval_every=1000, val_bleu_sentences=200,
        checkpoint_every=225, average_last=5, beam_size=5, length_penalty=0.6, num_threads=1),
    # CI and notebook 06: a fixed 300 small steps (about 90 seconds on 2 free CPU cores; a busy
    # machine takes longer but learns the same), and it learns: validation BLEU from 0 to above 10.
    "quick": TrainConfig(
        name="quick", vocab_size=3000, d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
        d_ff=256, dropout=0.1, norm_first=True, peak_lr=4e-3, warmup=100, max_tokens=1600, max_len=40,
        max_steps=300, max_seconds=None, eval_every=100, val_bleu_sentences=60, checkpoint_every=1000,
        average_last=1, beam_size=2, length_penalty=0.6),
    # Tests: the team-written toy corpus, seconds.
    "toy": TrainConfig(
        name="toy", corpus="toy", vocab_size=300, min_frequency=1, d_model=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, d_ff=128, dropout=0.0, peak_lr=5e-3, warmup=30, max_tokens=1200, max_steps=100,
        eval_every=50, val_bleu_sentences=50, checkpoint_every=10, average_last=3, beam_size=3,
        length_penalty=1.0),
}


def get_config(name_or_config: str | TrainConfig, **overrides) -> TrainConfig:
    if isinstance(name_or_config, TrainConfig):
        cfg = name_or_config
    elif name_or_config == "auto":
        cfg = CONFIGS["gpu" if torch.cuda.is_available() else "cpu"]
    elif name_or_config in CONFIGS:
        cfg = CONFIGS[name_or_config]
    else:
        raise ValueError(f"unknown configuration {name_or_config!r}; choose one of {', '.join(CONFIGS)} or auto")
    return replace(cfg, **{k: v for k, v in overrides.items() if v is not None})


def parse_overrides(items) -> dict:
    """["dropout=0.2", "d_model=512", "norm_first=false"] -> {"dropout": 0.2, ...} (JSON values, else strings)."""
    fields = TrainConfig.__dataclass_fields__
    out = {}
    for item in items or ():
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in fields or key == "name":
            raise ValueError(f"--set {item}: unknown setting {key!r}; settings: {', '.join(f for f in fields if f != 'name')}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return out


