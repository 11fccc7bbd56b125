"""Train the notebook-06 translator: `attn-course train` (and `torchrun ... -m course_tools.cli train`).

The loop is short and linear; its helpers say what each part does. What a run needs comes from one
recipe (`recipes.TrainConfig`); batching, evaluation, checkpoints and the device live in their own
modules. The loss, the learning-rate schedule and the masks are notebook 06's graded functions
(`attention_course.translate`, extracted from the notebook): one source.

Under `torchrun --nproc_per_node N` every process takes its share of each optimizer step's batches
and DistributedDataParallel averages the gradients: N processes with `accumulate=1` take the same
steps as one process with `accumulate=N` (tests/test_distributed.py checks the loss curves agree).

The regularisers of issue 28 are recipe fields, each off by default (off, the loop runs exactly as
before): R-Drop (`batch_loss`), source word dropout (`batching.drop_source_tokens`), BPE-dropout
(`load_data`: several segmentations, one per epoch in turn), a linear cool-down of the learning
rate to 0 (`scheduled_lr`) and an exponential moving average of the weights (`WeightAverage`).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import bpe
from . import resume as resume_module  # `resume` is train()'s argument
from .batching import (  # noqa: F401
    Batch,
    collate,
    drop_source_tokens,
    encode_pairs,
    padded_batches,
    segmentation_stream,
    step_stream,
    token_batches,
)
from .checkpoints import average_state_dicts, cpu_state, load_run, run_is_complete, save_checkpoint
from .data import load_pairs
from .evaluation import (  # noqa: F401
    bleu,
    current_commit,
    evaluate,
    record,
    shown,
    translate_texts,
    tune_length_penalty,
    validation_loss,
)
from .hardware import (
    Distributed,
    Precision,
    cpu_threads,
    describe_device,
    init_distributed,
    pick_device,
    precision_for,
    synchronize,
)
from .model import Seq2SeqTransformer, set_fused
from .paths import course_file, lazy_paths
from .recipes import CONFIGS, TrainConfig, get_config, parse_overrides  # noqa: F401
from .translate import inverse_sqrt_lr, label_smoothed_cross_entropy, make_masks

RUNS_ENV = "ATTN_RUNS_DIR"


def runs_dir() -> Path:
    """Where training runs go: $ATTN_RUNS_DIR, else the course's runs/ folder."""
    return Path(os.environ[RUNS_ENV]) if os.environ.get(RUNS_ENV) else course_file("runs")


__getattr__ = lazy_paths(__name__, {"RUNS": runs_dir})  # RUNS: looked up when asked for


def default_run_dir(config: str, src: str, tgt: str) -> Path:
    return runs_dir() / f"{config}-{src}-{tgt}"


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


# --------------------------------------------------------------------------- the loop's helpers
class Clock:
    """Training time only: the loop's wall clock minus evaluations and checkpoints (GPU work is
    waited for before each pause, so it is counted where it ran)."""

    def __init__(self, device: torch.device):
        self.device, self.start, self.paused = device, time.time(), 0.0

    @contextlib.contextmanager
    def pause(self):
        synchronize(self.device)
        t = time.time()
        try:
            yield
        finally:
            self.paused += time.time() - t

    def training_seconds(self) -> float:
        return time.time() - self.start - self.paused

    def loop_seconds(self) -> float:
        return time.time() - self.start


def make_optimizer(model, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases, LayerNorms and embeddings."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() > 1 and "embed" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=0.0, betas=cfg.betas, eps=1e-9, fused=device.type == "cuda")


def wrap_for_training(model, cfg: TrainConfig, dist: Distributed, device: torch.device):
    """What the steps call: the model, in DistributedDataParallel under torchrun, compiled if asked."""
    step_model = model
    if dist.active:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.compile:
        step_model = torch.compile(step_model, **({"backend": cfg.compile} if isinstance(cfg.compile, str) else {}))
    return step_model


def budget_progress(cfg: TrainConfig, step: int, epoch: float, seconds: float | None) -> float:
    """How much of the run's budget is spent after optimizer step `step` (1-based): the largest of the
    step, epoch and training-time fractions (seconds: None where the clock is not read)."""
    parts = [step / cfg.max_steps if cfg.max_steps else 0.0, epoch / cfg.max_epochs if cfg.max_epochs else 0.0]
    if cfg.max_seconds and seconds is not None:
        parts.append(seconds / cfg.max_seconds)
    return max(parts)


def scheduled_lr(cfg: TrainConfig, step: int, epoch: float = 0.0, seconds: float | None = None) -> float:
    """The learning rate of optimizer step `step` (1-based): notebook 06's inverse-sqrt schedule; with
    `lr_cooldown` c, times a linear fall to 0 over the last fraction c of the budget (0 at the step
    that ends it: one step of the budget spent at lr 0, the price of an exact end). A run stopped by
    its clock cools down by the clock: the budget that is nearer its end leads."""
    lr = inverse_sqrt_lr(step, cfg.warmup, cfg.peak_lr)
    if not cfg.lr_cooldown:
        return lr
    left = 1.0 - budget_progress(cfg, step, epoch, seconds)
    return lr * min(1.0, max(0.0, left) / cfg.lr_cooldown)


@dataclass
class StepLoss:
    """One micro-batch's losses, on the device: `loss` is what is back-propagated; `ce` the
    label-smoothed cross-entropy (what the training curve shows, comparable across recipes); `kl`
    R-Drop's symmetric KL (None without R-Drop)."""
    loss: torch.Tensor
    ce: torch.Tensor
    kl: torch.Tensor | None = None


def symmetric_kl(logits: torch.Tensor, target: torch.Tensor, pad_id: int) -> torch.Tensor:
    """R-Drop's regulariser: logits [2N, T, V] holding the same N sentences twice (two dropout masks),
    target [2N, T] -> the mean over non-pad target tokens of (KL(p1 || p2) + KL(p2 || p1)) / 2."""
    lp1, lp2 = F.log_softmax(logits.float(), dim=-1).chunk(2)           # [N, T, V] each
    keep = (target.chunk(2)[0] != pad_id)                                # [N, T]
    kl = (lp1.exp() - lp2.exp()) * (lp1 - lp2)                           # [N, T, V]: both KLs' terms, summed
    return (kl.sum(-1) * keep).sum() / (2 * keep.sum())


def batch_loss(step_model, batch: Batch, cfg: TrainConfig, autocast) -> StepLoss:
    """The training loss of one micro-batch. Word dropout first hides some source tokens; R-Drop
    then runs the batch twice in one forward pass (concatenated: the two copies draw different dropout
    masks) and adds alpha x the symmetric KL between their predictions to the mean CE of both."""
    src, tgt = drop_source_tokens(batch.src, cfg.word_dropout), batch.tgt      # [N, S], [N, T + 1]
    if cfg.rdrop_alpha:
        src, tgt = torch.cat([src, src]), torch.cat([tgt, tgt])                # [2N, S], [2N, T + 1]
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    src_mask, tgt_mask = make_masks(src, tgt_in, bpe.PAD_ID)
    with autocast:
        logits = step_model(src, tgt_in, src_mask, tgt_mask)                   # [N or 2N, T, V]
    ce = label_smoothed_cross_entropy(logits.float(), tgt_out, cfg.label_smoothing, bpe.PAD_ID)
    if not cfg.rdrop_alpha:
        return StepLoss(ce, ce)
    kl = symmetric_kl(logits, tgt_out, bpe.PAD_ID)
    return StepLoss(ce + cfg.rdrop_alpha * kl, ce, kl)


def train_step(step_model, opt, batches: list[Batch], cfg: TrainConfig, lr: float, autocast,
               scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """One optimizer step over this process's micro-batches at learning rate `lr`: forward, loss,
    backward (gradients averaged), clip, update. With fp16, `scaler` scales the loss up before the
    backward pass and the gradients down before clipping (a step with inf/NaN gradients is skipped).
    Returns the mean cross-entropy, on the device (not read)."""
    scaler = scaler or _NO_SCALER
    for group in opt.param_groups:
        group["lr"] = lr
    total = None
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        sync = contextlib.nullcontext() if last or not hasattr(step_model, "no_sync") else step_model.no_sync()
        with sync:
            losses = batch_loss(step_model, batch, cfg, autocast)
            scaler.scale(losses.loss / len(batches)).backward()
        total = losses.ce.detach() if total is None else total + losses.ce.detach()
    if cfg.clip_norm:
        scaler.unscale_(opt)                   # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(step_model.parameters(), cfg.clip_norm)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return total / len(batches)


_NO_SCALER = torch.amp.GradScaler("cpu", enabled=False)  # its calls pass straight through: fp32 and bf16


class WeightAverage:
    """An exponential moving average of the model's weights, ema <- d * ema + (1 - d) * w after every
    optimizer step (one multi-tensor kernel: no per-parameter launches). Kept in a copy of the model
    (tied embeddings stay tied), which is what evaluations, checkpoints and model.pt then read."""

    def __init__(self, model: Seq2SeqTransformer, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self._raw, self._ema = list(model.parameters()), list(self.model.parameters())

    @torch.no_grad()
    def update(self) -> None:
        torch._foreach_lerp_(self._ema, self._raw, 1.0 - self.decay)


def mean_over_processes(value: torch.Tensor, dist: Distributed) -> float:
    """Read a device scalar (a host sync), averaged over the training processes."""
    if dist.active:
        import torch.distributed as td

        value = value.clone()
        td.all_reduce(value)
        value /= dist.world_size
    return float(value)


def should_stop(cfg: TrainConfig, step: int, epoch: float, seconds: float | None, dist: Distributed,
                device: torch.device) -> bool:
    """Budgets: steps and epochs (the same in every process), and training seconds, read only where
    given (at log points, where the device was just synced). Under torchrun the main process's clock
    decides for all."""
    stop = (cfg.max_steps is not None and step >= cfg.max_steps) or (cfg.max_epochs is not None and epoch >= cfg.max_epochs)
    if stop or seconds is None or cfg.max_seconds is None:
        return stop
    stop = seconds >= cfg.max_seconds
    if dist.active:
        import torch.distributed as td

        flag = torch.tensor([float(stop)], device=device)
        td.broadcast(flag, src=0)
        stop = bool(flag.item())
    return stop


def prepare_run_dir(cfg: TrainConfig, src: str, tgt: str, out_dir, resuming: bool = False) -> Path:
    """The run's folder, emptied of a previous run's weights, summary and checkpoints (main process);
    when resuming, the checkpoints and the resume point stay."""
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg.name, src, tgt)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("model.pt", "summary.json"):
        (out / stale).unlink(missing_ok=True)
    if not resuming:
        resume_module.discard(out)
        for old in (out / "checkpoints").glob("step_*.pt"):
            old.unlink()
    return out


def resume_point(cfg: TrainConfig, src: str, tgt: str, out_dir, dist: Distributed) -> dict | None:
    """The run folder's resume point (see resume.py), checked against this recipe; one process only."""
    if dist.active:
        raise ValueError("resume: a run is resumed on one process (torchrun's processes would each need their "
                         "own generators); train without resume under torchrun, or resume with plain `attn-course train`")
    return resume_module.load_point(Path(out_dir) if out_dir is not None else default_run_dir(cfg.name, src, tgt),
                             cfg, src, tgt)


def restore(point: dict, model, opt, scaler, average, tracker) -> tuple[int, float, int]:
    """Put the run back as it was at its resume point; returns (step, epoch, tokens)."""
    model.load_state_dict(point["model"])
    opt.load_state_dict(point["optimizer"])
    if scaler is not None and point.get("scaler"):
        scaler.load_state_dict(point["scaler"])
    if average is not None:
        average.model.load_state_dict(point["average"])
    tracker.history = point["history"]
    tracker.loss_sum = None if point["loss_sum"] is None else torch.tensor(point["loss_sum"])
    tracker.losses_since = point["losses_since"]
    tracker.clock.start = time.time() - point["loop_seconds"]
    tracker.clock.paused = point["paused_seconds"]
    tracker.bar.update(point["step"])
    resume_module.restore_rng(point)
    return point["step"], point["epoch"], point["tokens"]


def replay(stream, steps: int) -> None:
    """Draw `steps` steps' batches from the stream and drop them (cheap: the batches already exist)."""
    for _ in range(steps):
        next(stream)


def save_resume_point(out: Path, cfg: TrainConfig, src: str, tgt: str, model, opt, scaler, average,
                      tracker, step: int, epoch: float, tokens: int, elapsed: float) -> None:
    """Everything `restore` needs, written atomically next to the checkpoints."""
    loss_sum = tracker.loss_sum
    resume_module.save_point(out, cfg, src, tgt, {
        "model": cpu_state(model), "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None else None,
        "average": cpu_state(average.model) if average is not None else None,
        "history": tracker.history, "loss_sum": None if loss_sum is None else float(loss_sum),
        "losses_since": tracker.losses_since, "loop_seconds": tracker.clock.loop_seconds(),
        "paused_seconds": tracker.clock.paused, "elapsed": elapsed,
        "step": step, "epoch": epoch, "tokens": tokens})


def validation_bleu(model, tok, val_pairs, cfg: TrainConfig) -> float:
    """Greedy BLEU on the first `val_bleu_sentences` validation sentences (what model selection reads)."""
    n = cfg.val_bleu_sentences
    hyps = translate_texts(model, tok, [p[0] for p in val_pairs[:n]], beam_size=1)
    return bleu(hyps, [p[1] for p in val_pairs[:n]])[0]


def validation_check(model, tok, val_pairs, val_batches, cfg: TrainConfig) -> dict:
    """Validation loss, and greedy validation BLEU."""
    return {"val_loss": validation_loss(model, val_batches, cfg.label_smoothing),
            "val_bleu": validation_bleu(model, tok, val_pairs, cfg)}


def choose_final_weights(model, tok, val_pairs, cfg: TrainConfig, ckpt_dir: Path, last_bleu: float, log):
    """Average the last checkpoints; keep the average if its validation BLEU is at least the last's."""
    checkpoints = sorted(ckpt_dir.glob("step_*.pt"))[-cfg.average_last:]
    if cfg.average_last <= 1 or len(checkpoints) <= 1:
        return "last", last_bleu
    last_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(average_state_dicts(checkpoints))
    avg_bleu = validation_bleu(model, tok, val_pairs, cfg)
    log(f"averaged the last {len(checkpoints)} checkpoints: val BLEU {avg_bleu:.2f} (last checkpoint {last_bleu:.2f})")
    if avg_bleu >= last_bleu:
        return f"average of the last {len(checkpoints)} checkpoints", avg_bleu
    model.load_state_dict(last_state)
    return "last", last_bleu


# --------------------------------------------------------------------------- the run's parts
def configure_device(cfg: TrainConfig, device: torch.device) -> int | None:
    """Make `device` this process's device; on a CPU, set (and return) the thread count."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high")   # TF32 for the fp32 parts (evaluation)
        return None
    threads = cpu_threads(cfg.num_threads)
    torch.set_num_threads(threads)
    return threads


@dataclass
class TrainingData:
    """What the loop and the evaluations read: the tokenizer, the validation pairs, the batches."""
    tok: object
    val_pairs: list                   # (source, target) sentences, for validation BLEU
    train_batches: list[Batch]        # padded, on the device: src [N, S], tgt [N, T + 1]
    val_batches: list[Batch]
    more_train_batches: list[list[Batch]] = field(default_factory=list)   # BPE-dropout: further segmentations

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    @property
    def segmentations(self) -> list[list[Batch]]:
        """The training set's segmentations, taken in turn epoch by epoch (one without BPE-dropout)."""
        return [self.train_batches, *self.more_train_batches]


def load_data(cfg: TrainConfig, src: str, tgt: str, mirror, device: torch.device) -> TrainingData:
    """The corpus's pairs, a joint BPE learned on the training split only, and padded batches. With
    BPE-dropout, `bpe_dropout_samples` segmentations of the training pairs are drawn here, once
    (re-encoding the corpus every epoch would cost seconds of host time per epoch, on a GPU run whose
    epochs last a few seconds); validation is encoded without dropout, as every evaluation is."""
    train_pairs = load_pairs(cfg.corpus, "train", src, tgt, mirror)[:cfg.train_limit]
    val_pairs = load_pairs(cfg.corpus, "val", src, tgt, mirror)
    tok = bpe.train_joint_bpe(train_pairs, cfg.vocab_size, cfg.min_frequency)
    train_tok = bpe.with_dropout(tok, cfg.bpe_dropout) if cfg.bpe_dropout else tok
    samples = cfg.bpe_dropout_samples if cfg.bpe_dropout else 1
    train = [padded_batches(encode_pairs(train_tok, train_pairs, cfg.max_len), cfg.max_tokens, device, cfg.seed + i)
             for i in range(samples)]
    val_batches = padded_batches(encode_pairs(tok, val_pairs), cfg.max_tokens, device, cfg.seed)
    return TrainingData(tok, val_pairs, train[0], val_batches, train[1:])


def run_info(cfg: TrainConfig, model: Seq2SeqTransformer, src: str, tgt: str, device: torch.device,
             threads: int | None, dist: Distributed, precision: Precision | None = None) -> dict:
    """What the run is (config.json): the recipe, the model, the languages, the hardware, the precision."""
    precision = precision or precision_for(device, cfg.bf16)
    return {"train": asdict(cfg), "model": asdict(model.config), "src": src, "tgt": tgt, "corpus": cfg.corpus,
            "device": describe_device(device), "threads": threads, "processes": dist.world_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "precision": {"name": precision.name, "why": precision.why}}


def start_line(cfg: TrainConfig, data: TrainingData, info: dict, dist: Distributed) -> str:
    """The line a run starts with: its data, vocabulary, size and hardware."""
    threads = info["threads"]
    return (f"{cfg.name}: {sum(len(b.src) for b in data.train_batches):,} training pairs ({info['src']}->{info['tgt']}), "
            f"joint BPE vocabulary {data.vocab_size:,}, {info['parameters']:,} parameters, {info['device']}"
            + (f", {threads} thread(s)" if threads else "") + (f", {dist.world_size} processes" if dist.active else "")
            + (f"; {info['precision']['why']}" if info.get("precision", {}).get("name") != "fp32" else ""))


class TrainingLog:
    """The run's record: its history (a training-curve point every few steps, and the evaluations),
    the progress bar, history.json, and the clock the entries' seconds come from."""

    def __init__(self, cfg: TrainConfig, out: Path, device: torch.device, show: bool):
        from tqdm.auto import tqdm

        self.cfg, self.out = cfg, out
        self.history: list[dict] = []
        self.every = max(1, cfg.eval_every // 20)     # a training-curve point (loss, lr) every few steps
        self.loss_sum, self.losses_since = None, 0     # losses since the last point, on the device
        self.bar = tqdm(total=cfg.max_steps, desc=f"train {cfg.name}", unit="step", disable=not show,
                        dynamic_ncols=True)
        self.clock = Clock(device)                     # started last: the training time starts here

    def step_done(self, loss: torch.Tensor, step: int, epoch: float, tokens: int, lr: float,
                  dist: Distributed) -> float | None:
        """Count a step; at a log point (the only device reads) add a curve point and return the training seconds."""
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        self.losses_since += 1
        self.bar.update(1)
        if step % self.every != 0:
            return None
        mean_loss = mean_over_processes(self.loss_sum / self.losses_since, dist)
        self.loss_sum, self.losses_since = None, 0
        seconds = self.clock.training_seconds()
        self.history.append({"step": step, "epoch": round(epoch, 3), "train_loss": mean_loss,
                             "lr": lr, "tokens": tokens, "seconds": round(seconds, 1)})
        self.bar.set_postfix(loss=f"{mean_loss:.3f}", lr=f"{lr:.1e}", tok_s=f"{tokens / max(seconds, 1e-9):,.0f}",
                             refresh=False)
        return seconds

    def evaluate(self, model: Seq2SeqTransformer, data: TrainingData, step: int, epoch: float, tokens: int,
                 lr: float) -> None:
        """Validation loss and BLEU (off the training clock): add them to history.json and print them."""
        cfg, history = self.cfg, self.history
        with self.clock.pause():
            entry = {"step": step, "epoch": round(epoch, 3), "seconds": round(self.clock.training_seconds(), 1),
                     "train_loss": history[-1]["train_loss"] if history else None,
                     **validation_check(model, data.tok, data.val_pairs, data.val_batches, cfg),
                     "lr": lr, "tokens": tokens}
            history.append(entry)
            (self.out / "history.json").write_text(json.dumps(history, indent=1) + "\n")
        shown_loss = f"{entry['train_loss']:.3f}" if entry["train_loss"] is not None else "  -  "
        self.bar.write(f"step {step:5d}  epoch {epoch:5.2f}  train loss {shown_loss}  val loss {entry['val_loss']:.3f}  "
                       f"val BLEU (greedy, {cfg.val_bleu_sentences} sentences) {entry['val_bleu']:5.2f}  lr {lr:.2e}")

    def evaluated_at(self, step: int) -> bool:
        """Whether the last entry is an evaluation of this step (so the run's end need not repeat it)."""
        return bool(self.history) and "val_loss" in self.history[-1] and self.history[-1]["step"] == step


def write_summary(out: Path, cfg: TrainConfig, info: dict, data: TrainingData, step: int, epoch: float,
                  tokens: int, seconds: dict[str, float], weights: str, val_bleu: float, last: Path) -> dict:
    """What the run did (summary.json; train_or_load and the notebooks read it)."""
    summary = {"config": cfg.name, "src": info["src"], "tgt": info["tgt"], "device": info["device"],
               "threads": info["threads"], "processes": info["processes"], "steps": step, "epochs": round(epoch, 2),
               "train_seconds": round(seconds["train"], 1), "loop_seconds": round(seconds["loop"], 1),
               "eval_seconds": round(seconds["eval"], 1), "total_seconds": round(seconds["total"], 1),
               "target_tokens": tokens, "tokens_per_second": round(tokens / max(seconds["train"], 1e-9)),
               "weights": weights, "val_bleu_greedy": round(val_bleu, 2),
               "val_bleu_sentences": min(cfg.val_bleu_sentences, len(data.val_pairs)),
               "parameters": info["parameters"], "vocab_size": data.vocab_size, "last_checkpoint": last.name}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def done_line(summary: dict, val_bleu: float, out: Path) -> str:
    """The line a run ends with: its length, speed, chosen weights and validation BLEU."""
    return (f"done: {summary['steps']} steps, {summary['epochs']} epochs: {summary['train_seconds']:.0f} s of training "
            f"({summary['tokens_per_second']:,} target tokens/s) and {summary['eval_seconds']:.0f} s of evaluations "
            f"and checkpoints; weights: {summary['weights']}; val BLEU (greedy, {summary['val_bleu_sentences']} "
            f"sentences) {val_bleu:.2f}; saved in {shown(out)}")


# --------------------------------------------------------------------------- training
def train(config: str | TrainConfig = "quick", src: str = "en", tgt: str = "de", out_dir: str | Path | None = None,
          mirror=None, device: str | None = None, progress: bool = True, log=print, resume: bool = False,
          **overrides) -> Run:
    """Train a translator; returns the Run (also written to `out_dir`, default runs/<config>-<src>-<tgt>).
    resume=True: go on from the run folder's last checkpoint when it has one of this recipe (resume.py)."""
    cfg = get_config(config, **overrides)
    dist = init_distributed(torch.device(device) if device else None)
    if dist.active and cfg.bpe_dropout:
        raise ValueError("bpe_dropout under torchrun: the tokenizers library's dropout cannot be seeded, so the "
                         "processes would cut the corpus into different batches; train on one process")
    device = pick_device(device, dist)
    main = dist.is_main                                # only the main process writes files and logs
    log = log if main else (lambda *a, **k: None)
    threads = configure_device(cfg, device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)                        # the same initial weights in every process
    point = resume_point(cfg, src, tgt, out_dir, dist) if resume else None
    out = (prepare_run_dir(cfg, src, tgt, out_dir, resuming=point is not None) if main
           else Path(out_dir or default_run_dir(cfg.name, src, tgt)))
    started = time.time() - (point["elapsed"] if point else 0.0)

    data = load_data(cfg, src, tgt, mirror, device)
    model = Seq2SeqTransformer(cfg.model_config(data.vocab_size)).to(device)
    precision = precision_for(device, cfg.bf16)  # bf16, or fp16 with a gradient scaler on older GPUs, or fp32
    info = run_info(cfg, model, src, tgt, device, threads, dist, precision)
    if main:
        bpe.save(data.tok, out)
        (out / "config.json").write_text(json.dumps(info, indent=2) + "\n")
    step_model = wrap_for_training(model, cfg, dist, device)
    average = WeightAverage(model, cfg.ema_decay) if cfg.ema_decay and main else None
    shown_model = average.model if average else model  # what evaluations, checkpoints and model.pt read
    torch.manual_seed(cfg.seed + dist.rank)            # each process its own dropout masks
    opt = make_optimizer(model, cfg, device)
    autocast, scaler = precision.autocast(device), precision.grad_scaler(device)
    log(start_line(cfg, data, info, dist))

    stream = segmentation_stream(data.segmentations, dist.world_size * cfg.accumulate, random.Random(cfg.seed))
    ckpt_dir = out / "checkpoints"
    step, epoch, tokens = 0, 0.0, 0
    tracker = TrainingLog(cfg, out, device, show=progress and main)
    if point:
        step, epoch, tokens = restore(point, model, opt, scaler, average, tracker)
        replay(stream, step)                           # the data stream to where it was: the same batches
        log(f"resumed from step {step} ({resume_module.FILE} in {shown(out)}; {point['loop_seconds']:.0f} s of the run so far)")
    clock = tracker.clock
    model.train()
    while True:
        epoch, chosen = next(stream)                   # this step's batches, all processes'
        mine = chosen[dist.rank * cfg.accumulate:(dist.rank + 1) * cfg.accumulate]
        # the clock (a host read, no device sync) only for a cool-down that follows it, in one process
        now = clock.training_seconds() if cfg.lr_cooldown and cfg.max_seconds and not dist.active else None
        loss = train_step(step_model, opt, mine, cfg, scheduled_lr(cfg, step + 1, epoch, now), autocast, scaler)
        if average:
            average.update()
        step += 1
        tokens += sum(b.target_tokens for b in chosen)   # all processes', known on the host
        lr = opt.param_groups[0]["lr"]
        seconds = tracker.step_done(loss, step, epoch, tokens, lr, dist)    # None between log points
        if main and step % cfg.checkpoint_every == 0:
            with clock.pause():
                save_checkpoint(shown_model, ckpt_dir, step, cfg.average_last)
        if main and step % cfg.eval_every == 0:
            tracker.evaluate(shown_model, data, step, epoch, tokens, lr)
        if main and step % cfg.checkpoint_every == 0 and not dist.active:
            with clock.pause():
                save_resume_point(out, cfg, src, tgt, model, opt, scaler, average, tracker, step, epoch, tokens,
                                  time.time() - started)
        if should_stop(cfg, step, epoch, seconds, dist, device):
            break
    tracker.bar.close()
    synchronize(device)
    train_seconds = clock.training_seconds()
    if not main:
        return Run(out, model, data.tok, tracker.history, {})

    if not tracker.evaluated_at(step):
        tracker.evaluate(shown_model, data, step, epoch, tokens, lr)
    last = save_checkpoint(shown_model, ckpt_dir, step, cfg.average_last)
    timing = {"train": train_seconds, "loop": clock.loop_seconds(), "eval": clock.paused}
    weights, final_bleu = choose_final_weights(shown_model, data.tok, data.val_pairs, cfg, ckpt_dir,
                                               tracker.history[-1]["val_bleu"], log)
    if average:
        weights += f" of the weights' moving average (decay {cfg.ema_decay:g})"
    model = shown_model
    torch.save(cpu_state(model), out / "model.pt")
    summary = write_summary(out, cfg, info, data, step, epoch, tokens, {**timing, "total": time.time() - started},
                            weights, final_bleu, last)
    resume_module.discard(out)
    log(done_line(summary, final_bleu, out))
    model.eval()
    set_fused(model, cfg.fused)
    return Run(out, model, data.tok, tracker.history, summary)


def train_or_load(config: str = "quick", src: str = "en", tgt: str = "de", out_dir=None, retrain: bool = False,
                  resume: bool = True, **kwargs) -> Run:
    """The finished run of `config` if one with exactly this configuration is on disk, else train it
    (going on from its last checkpoint when a run of this recipe stopped part-way, unless resume=False)."""
    cfg = get_config(config)
    out = Path(out_dir) if out_dir is not None else default_run_dir(cfg.name, src, tgt)
    if not retrain and run_is_complete(out, cfg, src, tgt):
        model, tok, _ = load_run(out, kwargs.get("device"))
        history = json.loads((out / "history.json").read_text())
        summary = json.loads((out / "summary.json").read_text())
        print(f"loaded the finished run in {shown(out)} (trained in {summary['loop_seconds']:.0f} s on {summary['device']}; "
              f"pass retrain=True to train it again)")
        return Run(out, model, tok, history, summary)
    if resume and not retrain:
        try:
            return train(cfg, src, tgt, out, resume=True, **kwargs)
        except resume_module.ResumeMismatch as err:
            print(f"starting afresh: {err}")
    return train(cfg, src, tgt, out, **kwargs)


