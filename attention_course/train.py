"""Train and evaluate the notebook-06 translator: `attn-course train` / `attn-course evaluate`.

Everything a run needs is in one place, `CONFIGS`:

* ``gpu``   the full model, for one GPU (bf16 autocast, fused attention, large token batches,
            checkpoint averaging, beam search); the course's target is en→de test_2016_flickr
            sacreBLEU -lc ≥ 42 in ≤ 10 minutes of training on one H100;
* ``cpu``   a smaller model a learner can train on a laptop without a GPU (about 20 minutes);
* ``quick`` what CI and notebook 06 run: 300 steps (about 90 seconds on 2 CPU cores), and it demonstrably learns;
* ``toy``   seconds, on the team-written toy corpus (tests).

The loss, the learning-rate schedule, the masks and the decoders are notebook 06's graded
functions, imported from `attention_course.translate` (extracted from the notebook): one source.
A run directory holds ``tokenizer.json`` (the joint BPE, learned on the training split only),
``model.pt`` (the final, checkpoint-averaged weights), ``config.json``, ``history.json`` (the
curves) and ``summary.json`` (time, tokens/s, validation BLEU).
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from . import bpe
from .data import REPO, TEST_SETS, load_pairs
from .decoding import beam_search_cached, greedy_decode_cached
from .model import Seq2SeqTransformer, set_fused
from .translate import beam_search, greedy_decode, inverse_sqrt_lr, label_smoothed_cross_entropy, make_masks

RUNS = Path(os.environ.get("ATTN_RUNS_DIR") or REPO / "runs")
RESULTS = REPO / "results"


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
    # decoding for evaluation
    beam_size: int = 4
    length_penalty: float = 0.6
    # hardware
    bf16: bool = True                  # bf16 autocast on CUDA (ignored on CPU)
    fused: bool = True                 # F.scaled_dot_product_attention inside the course's attention
    compile: bool = False              # torch.compile the model (CUDA)
    num_threads: int | None = None     # CPU threads (None: PyTorch's default)
    seed: int = 1

    def model_config(self, vocab_size: int) -> dict:
        return dict(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=self.d_model,
                    num_heads=self.num_heads, num_encoder_layers=self.num_encoder_layers,
                    num_decoder_layers=self.num_decoder_layers, d_ff=self.d_ff, dropout=self.dropout,
                    max_len=max(self.max_len, 256), share_embeddings=self.share_embeddings,
                    norm_first=self.norm_first, fused=self.fused, attention_dropout=self.attention_dropout,
                    activation_dropout=self.activation_dropout)


CONFIGS: dict[str, TrainConfig] = {
    # One H100, <= 10 minutes of training. A small, strongly regularised Transformer is what works
    # on 29k sentence pairs (Wu et al. 2021: Transformer-Tiny, 41.0 lowercased BLEU); this one is a
    # little wider, pre-norm for stable large learning rates, with big token batches, bf16 and
    # fused attention for speed, and the last 10 checkpoints averaged.
    "gpu": TrainConfig(
        name="gpu", vocab_size=8000, d_model=256, num_heads=4, num_encoder_layers=6, num_decoder_layers=6,
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


def shown(path) -> str:
    """A path for messages: relative to the repository when inside it (no machine paths in outputs)."""
    try:
        return Path(path).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


def default_run_dir(config: str, src: str, tgt: str) -> Path:
    return RUNS / f"{config}-{src}-{tgt}"


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cores = os.cpu_count() or 1
    return f"CPU ({cores} {'core' if cores == 1 else 'cores'})"


def cpu_threads(requested: int | None) -> int:
    """Threads for CPU training: as requested, else all cores, or 1 when the machine is already busy
    (PyTorch's threads wait for each other; on an oversubscribed machine one thread is faster)."""
    if requested:
        return requested
    cores = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0] >= cores
    except OSError:  # pragma: no cover - not on every platform
        busy = False
    return 1 if busy else cores


def pick_device(device: str | None = None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


# --------------------------------------------------------------------------- batching
def encode_pairs(tok, pairs, max_len: int | None = None):
    """[(src ids + eos, bos + tgt ids + eos)], dropping pairs longer than max_len tokens."""
    src = bpe.encode(tok, [p[0] for p in pairs], bos=False, eos=True)
    tgt = bpe.encode(tok, [p[1] for p in pairs], bos=True, eos=True)
    data = list(zip(src, tgt))
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
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return out.to(device) if device is not None else out


# --------------------------------------------------------------------------- decoding and BLEU
def translate_texts(model, tok, texts, beam_size: int = 1, length_penalty: float = 1.0,
                    max_tokens: int | None = None, device=None, extra_len: int = 10, progress: bool = False,
                    cached: bool = True) -> list[str]:
    """Translate `texts` with greedy decoding (beam_size=1) or beam search; returns detokenized text.
    Sentences are sorted by length and batched, `max_tokens` source tokens x beam per batch.
    cached=True decodes with a key/value cache (`attention_course.decoding`: the same translations
    as notebook 06's readable decoders, several times faster); cached=False runs those decoders."""
    from tqdm.auto import tqdm

    device = device or next(model.parameters()).device
    max_tokens = max_tokens or (32000 if torch.device(device).type == "cuda" else 4000)
    was_training = model.training
    model.eval()
    ids = bpe.encode(tok, texts, bos=False, eos=True)
    max_src = model.positional.pe.size(0) - extra_len - 1
    ids = [s[:max_src - 1] + [bpe.EOS_ID] if len(s) > max_src else s for s in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    budget = max(1, max_tokens // max(beam_size, 1))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * len(ids[i]) > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    speedup = model.decoding_speedup() if hasattr(model, "decoding_speedup") else contextlib.nullcontext()
    greedy, beam = (greedy_decode_cached, beam_search_cached) if cached else (greedy_decode, beam_search)
    with speedup:
        for batch in tqdm(batches, desc="translating", disable=not progress, leave=False):
            src = collate([ids[i] for i in batch], device=device)
            max_len = int(src.size(1) * 1.2) + extra_len     # German runs ~5% longer than English in tokens
            if beam_size == 1:
                hyp = greedy(model, src, max_len, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID)
            else:
                hyp = beam(model, src, beam_size, max_len, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID, length_penalty)
            for i, text in zip(batch, bpe.decode(tok, hyp.tolist())):
                out[i] = text
    model.train(was_training)
    return out


def bleu(hypotheses, references, lowercase: bool = False):
    """sacreBLEU corpus BLEU on detokenized text: (score, signature)."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(lowercase=lowercase)
    result = metric.corpus_score(list(hypotheses), [list(references)])
    return result.score, str(metric.get_signature())


@torch.no_grad()
def validation_loss(model, batches, data, epsilon: float, device) -> float:
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        src = collate([data[i][0] for i in batch], device=device)
        tgt = collate([data[i][1] for i in batch], device=device)
        src_mask, tgt_mask = make_masks(src, tgt[:, :-1], bpe.PAD_ID)
        logits = model(src, tgt[:, :-1], src_mask, tgt_mask)
        n = int((tgt[:, 1:] != bpe.PAD_ID).sum())
        total += float(label_smoothed_cross_entropy(logits.float(), tgt[:, 1:], epsilon, bpe.PAD_ID)) * n
        count += n
    model.train()
    return total / max(count, 1)


# --------------------------------------------------------------------------- checkpoints
def average_state_dicts(paths) -> dict:
    """Element-wise mean of the floating-point tensors of several checkpoints."""
    avg = None
    for p in paths:
        state = torch.load(p, map_location="cpu", weights_only=True)["model"]
        if avg is None:
            avg = {k: v.clone().double() if v.is_floating_point() else v.clone() for k, v in state.items()}
        else:
            for k, v in state.items():
                if v.is_floating_point():
                    avg[k] += v.double()
    n = len(paths)
    return {k: (v / n).float() if v.is_floating_point() else v for k, v in avg.items()}


def _save_checkpoint(model, folder: Path, step: int, keep: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "step": step}, path)
    for old in sorted(folder.glob("step_*.pt"))[:-keep]:
        old.unlink()
    return path


def load_run(run_dir: str | Path, device=None):
    """(model, tokenizer, config dict) of a finished run."""
    run_dir = Path(run_dir)
    info = json.loads((run_dir / "config.json").read_text())
    model = Seq2SeqTransformer(**info["model"])
    model.load_state_dict(torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True))
    device = pick_device(device)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(None))   # one thread on a busy machine is much faster
    model.to(device).eval()
    return model, bpe.load(run_dir), info


def run_is_complete(run_dir: str | Path, config: TrainConfig, src: str, tgt: str) -> bool:
    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return ((run_dir / "model.pt").is_file() and (run_dir / "summary.json").is_file()
            and info.get("train") == json.loads(json.dumps(asdict(config)))
            and info.get("src") == src and info.get("tgt") == tgt)


# --------------------------------------------------------------------------- training
@dataclass
class Run:
    run_dir: Path
    model: Seq2SeqTransformer
    tokenizer: object
    history: list = field(default_factory=list)   # training-curve points, and evaluations (with val_loss, val_bleu)
    summary: dict = field(default_factory=dict)

    @property
    def evaluations(self) -> list[dict]:
        return [h for h in self.history if "val_loss" in h]


def train(config: str | TrainConfig = "quick", src: str = "en", tgt: str = "de", out_dir: str | Path | None = None,
          mirror=None, device: str | None = None, progress: bool = True, log=print, **overrides) -> Run:
    """Train a translator; returns the Run (also written to `out_dir`, default runs/<config>-<src>-<tgt>)."""
    from tqdm.auto import tqdm

    cfg = get_config(config, **overrides)
    device = pick_device(device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")   # TF32 for the fp32 parts (evaluation)
    threads = None
    if device.type == "cpu":
        threads = cpu_threads(cfg.num_threads)
        torch.set_num_threads(threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg.name, src, tgt)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("model.pt", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    started = time.time()

    train_pairs = load_pairs(cfg.corpus, "train", src, tgt, mirror)[:cfg.train_limit]
    val_pairs = load_pairs(cfg.corpus, "val", src, tgt, mirror)
    tok = bpe.train_joint_bpe(train_pairs, cfg.vocab_size, cfg.min_frequency)   # training split only
    bpe.save(tok, out)
    vocab = tok.get_vocab_size()
    train_data = encode_pairs(tok, train_pairs, cfg.max_len)
    val_data = encode_pairs(tok, val_pairs)
    val_batches = token_batches(val_data, cfg.max_tokens, shuffle=False)
    model_cfg = cfg.model_config(vocab)
    model = Seq2SeqTransformer(**model_cfg).to(device)
    info = {"train": asdict(cfg), "model": model_cfg, "src": src, "tgt": tgt, "corpus": cfg.corpus,
            "device": describe_device(device), "threads": threads, "parameters": sum(p.numel() for p in model.parameters())}
    (out / "config.json").write_text(json.dumps(info, indent=2) + "\n")
    step_model = torch.compile(model) if cfg.compile and device.type == "cuda" else model
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() > 1 and "embed" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=0.0, betas=cfg.betas, eps=1e-9, fused=device.type == "cuda")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.bf16 and device.type == "cuda")
    log(f"{cfg.name}: {len(train_data):,} training pairs ({src}->{tgt}), joint BPE vocabulary {vocab:,}, "
        f"{info['parameters']:,} parameters, {info['device']}" + (f", {threads} thread(s)" if threads else ""))

    rng = random.Random(cfg.seed)
    history, step, micro, tokens, epoch, epochs_done = [], 0, 0, 0, 0.0, 0
    eval_seconds, ckpt_seconds = 0.0, 0.0
    running, loss_sum = None, None
    sync_every = 10 if device.type == "cuda" else 1
    log_every = max(sync_every, cfg.eval_every // 20)      # a training-curve point (loss, lr) every few steps
    loop_start = time.time()
    bar = tqdm(total=cfg.max_steps, desc=f"train {cfg.name}", unit="step", disable=not progress,
               dynamic_ncols=True)
    ckpt_dir = out / "checkpoints"
    for old in ckpt_dir.glob("step_*.pt"):
        old.unlink()

    def should_stop() -> bool:
        if cfg.max_steps is not None and step >= cfg.max_steps:
            return True
        if cfg.max_epochs is not None and epoch >= cfg.max_epochs:
            return True
        spent = time.time() - loop_start - eval_seconds - ckpt_seconds    # the steps alone
        return cfg.max_seconds is not None and spent >= cfg.max_seconds

    def evaluate_now() -> None:
        nonlocal eval_seconds
        if device.type == "cuda":
            torch.cuda.synchronize()    # the training steps queued so far count as training time
        t = time.time()
        n = cfg.val_bleu_sentences
        hyps = translate_texts(model, tok, [p[0] for p in val_pairs[:n]], beam_size=1, device=device)
        score, _ = bleu(hyps, [p[1] for p in val_pairs[:n]])
        entry = {"step": step, "epoch": round(epoch, 3), "seconds": round(time.time() - loop_start, 1),
                 "train_loss": running, "val_loss": validation_loss(model, val_batches, val_data,
                                                                    cfg.label_smoothing, device),
                 "val_bleu": score, "lr": opt.param_groups[0]["lr"], "tokens": tokens}
        history.append(entry)
        (out / "history.json").write_text(json.dumps(history, indent=1) + "\n")
        eval_seconds += time.time() - t
        shown = f"{running:.3f}" if running is not None else "  -  "
        bar.write(f"step {step:5d}  epoch {epoch:5.2f}  train loss {shown}  val loss {entry['val_loss']:.3f}  "
                  f"val BLEU (greedy, {n} sentences) {score:5.2f}  lr {entry['lr']:.2e}")

    model.train()
    stop = False
    while not stop:
        batches = token_batches(train_data, cfg.max_tokens, shuffle=True, rng=rng)
        for b_index, batch in enumerate(batches):
            src_ids = collate([train_data[i][0] for i in batch], device=device)
            tgt_ids = collate([train_data[i][1] for i in batch], device=device)
            tgt_in, tgt_out = tgt_ids[:, :-1], tgt_ids[:, 1:]
            src_mask, tgt_mask = make_masks(src_ids, tgt_in, bpe.PAD_ID)
            with autocast:
                logits = step_model(src_ids, tgt_in, src_mask, tgt_mask)
            loss = label_smoothed_cross_entropy(logits.float(), tgt_out, cfg.label_smoothing, bpe.PAD_ID)
            (loss / cfg.accumulate).backward()
            micro += 1
            tokens += sum(len(train_data[i][1]) - 1 for i in batch)     # counted on the CPU: no GPU sync
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            if micro % sync_every == 0:                                  # read the loss now and then only
                value = float(loss_sum) / sync_every
                alpha = min(1.0, 0.05 * sync_every)
                running = value if running is None else (1 - alpha) * running + alpha * value
                loss_sum = None
            if micro % cfg.accumulate == 0:
                lr = inverse_sqrt_lr(step + 1, cfg.warmup, cfg.peak_lr)
                for group in opt.param_groups:
                    group["lr"] = lr
                if cfg.clip_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                bar.update(1)
            epoch = epochs_done + (b_index + 1) / len(batches)
            if micro % cfg.accumulate == 0:
                if step % log_every == 0 and running is not None:
                    history.append({"step": step, "epoch": round(epoch, 3), "train_loss": running,
                                    "lr": opt.param_groups[0]["lr"], "tokens": tokens})
                if running is not None:
                    busy = time.time() - loop_start - eval_seconds - ckpt_seconds
                    bar.set_postfix(loss=f"{running:.3f}", lr=f"{opt.param_groups[0]['lr']:.1e}",
                                    tok_s=f"{tokens / max(busy, 1e-9):,.0f}", refresh=False)
                if step % cfg.checkpoint_every == 0:
                    t = time.time()
                    _save_checkpoint(model, ckpt_dir, step, cfg.average_last)
                    ckpt_seconds += time.time() - t
                if step % cfg.eval_every == 0:
                    evaluate_now()
                if should_stop():
                    stop = True
                    break
        else:
            epochs_done += 1
    bar.close()
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - loop_start - eval_seconds - ckpt_seconds   # the steps alone
    if not history or "val_loss" not in history[-1] or history[-1]["step"] != step:
        evaluate_now()
    last = _save_checkpoint(model, ckpt_dir, step, cfg.average_last)
    loop_seconds = time.time() - loop_start

    # checkpoint averaging: keep the averaged weights if they are at least as good on validation
    chosen, n = "last", cfg.val_bleu_sentences
    final_bleu = history[-1]["val_bleu"]   # the evaluation just above
    checkpoints = sorted(ckpt_dir.glob("step_*.pt"))[-cfg.average_last:]
    if cfg.average_last > 1 and len(checkpoints) > 1:
        last_state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(average_state_dicts(checkpoints))
        hyps = translate_texts(model, tok, [p[0] for p in val_pairs[:n]], beam_size=1, device=device)
        avg_bleu, _ = bleu(hyps, [p[1] for p in val_pairs[:n]])
        log(f"averaged the last {len(checkpoints)} checkpoints: val BLEU {avg_bleu:.2f} (last checkpoint {final_bleu:.2f})")
        if avg_bleu >= final_bleu:
            chosen, final_bleu = f"average of the last {len(checkpoints)} checkpoints", avg_bleu
        else:
            model.load_state_dict(last_state)
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out / "model.pt")
    summary = {"config": cfg.name, "src": src, "tgt": tgt, "device": info["device"], "threads": threads, "steps": step,
               "epochs": round(epoch, 2), "train_seconds": round(train_seconds, 1),
               "loop_seconds": round(loop_seconds, 1), "eval_seconds": round(eval_seconds, 1),
               "total_seconds": round(time.time() - started, 1), "target_tokens": tokens,
               "tokens_per_second": round(tokens / max(train_seconds, 1e-9)), "weights": chosen,
               "val_bleu_greedy": round(final_bleu, 2), "val_bleu_sentences": min(n, len(val_pairs)),
               "parameters": info["parameters"], "vocab_size": vocab, "last_checkpoint": last.name}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"done: {step} steps, {summary['epochs']} epochs in {summary['loop_seconds']:.0f} s "
        f"({summary['tokens_per_second']:,} target tokens/s); weights: {chosen}; "
        f"val BLEU (greedy, {summary['val_bleu_sentences']} sentences) {final_bleu:.2f}; saved in {shown(out)}")
    model.eval()
    set_fused(model, cfg.fused)
    return Run(out, model, tok, history, summary)


def train_or_load(config: str = "quick", src: str = "en", tgt: str = "de", out_dir=None, retrain: bool = False,
                  **kwargs) -> Run:
    """The finished run of `config` if one with exactly this configuration is on disk, else train it."""
    cfg = get_config(config)
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg.name, src, tgt)
    if not retrain and run_is_complete(out, cfg, src, tgt):
        model, tok, _ = load_run(out, kwargs.get("device"))
        history = json.loads((out / "history.json").read_text())
        summary = json.loads((out / "summary.json").read_text())
        print(f"loaded the finished run in {shown(out)} (trained in {summary['loop_seconds']:.0f} s on {summary['device']}; "
              f"pass retrain=True to train it again)")
        return Run(out, model, tok, history, summary)
    return train(cfg, src, tgt, out, **kwargs)


# --------------------------------------------------------------------------- evaluation and results
def current_commit() -> str:
    """The checked-out commit, read from .git without running git (ATTN_COMMIT overrides)."""
    if os.environ.get("ATTN_COMMIT"):
        return os.environ["ATTN_COMMIT"]
    git = REPO / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        pass
    return "unknown"


LENGTH_PENALTIES = (0.0, 0.3, 0.6, 0.8, 1.0, 1.2, 1.5)


def tune_length_penalty(run_dir: str | Path, candidates=LENGTH_PENALTIES, beam_size: int | None = None,
                        mirror=None, device: str | None = None, progress: bool = True, log=print) -> float:
    """Choose beam search's length penalty on the validation set (never on a test set): the one with the
    best BLEU; saved in the run's summary.json, where `evaluate` picks it up."""
    run_dir = Path(run_dir)
    model, tok, info = load_run(run_dir, device)
    cfg = _run_config(info)
    beam = beam_size or cfg.beam_size
    pairs = load_pairs(info.get("corpus", "multi30k"), "val", info["src"], info["tgt"], mirror)
    scores = {}
    for lp in candidates:
        hyps = translate_texts(model, tok, [p[0] for p in pairs], beam_size=beam, length_penalty=lp, progress=progress)
        scores[lp] = bleu(hyps, [p[1] for p in pairs])[0]
        log(f"validation BLEU, beam {beam}, length penalty {lp:g}: {scores[lp]:.2f}")
    best = max(scores, key=lambda lp: (scores[lp], -abs(lp - cfg.length_penalty)))
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["length_penalty"] = {"chosen": best, "beam": beam, "on": f"val ({len(pairs)} sentences)",
                                 "val_bleu": {f"{lp:g}": round(b, 2) for lp, b in scores.items()}}
    path.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"length penalty {best:g} chosen on the validation set (saved in {shown(path)})")
    return best


def _run_config(info: dict) -> TrainConfig:
    known = TrainConfig.__dataclass_fields__
    return TrainConfig(**{**{k: v for k, v in info["train"].items() if k in known},
                          "betas": tuple(info["train"]["betas"])})


def evaluate(run_dir: str | Path, test_sets=None, beam_size: int | None = None,
             length_penalty: float | None = None, mirror=None, device: str | None = None,
             hypotheses_dir: str | Path | None = None, progress: bool = True, log=print) -> list[dict]:
    """sacreBLEU of a run on the test sets (cased and lowercased, with signatures); writes the
    detokenized hypotheses and returns one results entry per test set. The length penalty: as
    given, else the one `tune_length_penalty` chose on the validation set, else the configuration's."""
    run_dir = Path(run_dir)
    model, tok, info = load_run(run_dir, device)
    if next(model.parameters()).device.type == "cuda":
        torch.set_float32_matmul_precision("high")   # TF32, as during training's evaluations
    cfg = _run_config(info)
    summary = json.loads((run_dir / "summary.json").read_text())
    src, tgt, corpus = info["src"], info["tgt"], info.get("corpus", "multi30k")
    beam = beam_size or cfg.beam_size
    tuned = summary.get("length_penalty", {})
    if length_penalty is not None:
        lp, lp_source = length_penalty, "given"
    elif tuned and tuned.get("beam") == beam:
        lp, lp_source = tuned["chosen"], "chosen on val"
    else:
        lp, lp_source = cfg.length_penalty, "configuration"
    test_sets = list(test_sets or (("test",) if corpus == "toy" else TEST_SETS))
    hyp_dir = Path(hypotheses_dir) if hypotheses_dir is not None else RESULTS / "hypotheses"
    hyp_dir.mkdir(parents=True, exist_ok=True)
    base = asdict(CONFIGS[cfg.name]) if cfg.name in CONFIGS else {}
    changed = {k: v for k, v in asdict(cfg).items() if base and base.get(k) != v}
    entries = []
    for test_set in test_sets:
        pairs = load_pairs(corpus, test_set, src, tgt, mirror)
        t = time.time()
        hyps = translate_texts(model, tok, [p[0] for p in pairs], beam_size=beam, length_penalty=lp,
                               progress=progress)
        seconds = time.time() - t
        refs = [p[1] for p in pairs]
        cased, signature = bleu(hyps, refs)
        lowered, signature_lc = bleu(hyps, refs, lowercase=True)
        path = hyp_dir / f"{cfg.name}.{src}-{tgt}.{test_set}.{tgt}"
        path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        entries.append({
            "src": src, "tgt": tgt, "test_set": test_set, "bleu": round(cased, 2), "bleu_lc": round(lowered, 2),
            "signature": signature, "signature_lc": signature_lc, "device": summary["device"],
            "train_seconds": summary["loop_seconds"], "tokens_per_second": summary["tokens_per_second"],
            "config": cfg.name, "commit": current_commit(), "hypotheses": shown(path),
            "step_seconds": summary["train_seconds"],
            **({"config_overrides": changed} if changed else {}),
            "decoding": f"beam {beam}, length penalty {lp:g} ({lp_source})" if beam > 1 else "greedy",
            "steps": summary["steps"], "epochs": summary["epochs"], "parameters": summary["parameters"],
            "weights": summary["weights"], "decode_seconds": round(seconds, 1),
        })
        log(f"{src}->{tgt} {test_set}: BLEU {cased:.2f} (cased, {signature}); {lowered:.2f} lowercased (-lc)")
    return entries


def record(entries: list[dict], path: str | Path = RESULTS / "translator.json") -> Path:
    """Add entries to the results file, replacing earlier ones for the same (src, tgt, test set, config)."""
    path = Path(path)
    runs = json.loads(path.read_text()) if path.is_file() else []
    key = lambda e: (e["src"], e["tgt"], e["test_set"], e["config"])  # noqa: E731
    new = {key(e) for e in entries}
    runs = [r for r in runs if key(r) not in new] + list(entries)
    runs.sort(key=lambda e: (e["config"], e["src"], e["tgt"], e["test_set"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=2, ensure_ascii=False) + "\n")
    return path
