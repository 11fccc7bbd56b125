"""`attn-course bench-peer`: the course's translator against a peer of the same size from Hugging Face
`transformers`, trained side by side in one call (issue 28, item 4).

Both models are trained by the same loop on the same things: the recipe's batches from
`attention_course.batching` (the same segmentation, the same order), the same AdamW, learning-rate
schedule, label-smoothed loss, gradient clipping and autocast precision (`train.train_step`), the same
seed, one after the other, each alone on the device. Only the model differs:

* ours: `attention_course.model.Seq2SeqTransformer` (the recipe's architecture: pre-norm for `gpu`);
* marian: `MarianMTModel` built from a `MarianConfig` of the recipe's size (post-norm, learned nothing
  from a checkpoint: random weights), the peer the issue names;
* m2m100: `M2M100ForConditionalGeneration`, the same size again: Hugging Face's pre-norm encoder-decoder
  (the course's `gpu` recipe is pre-norm because post-norm blew up at its learning rate, issue 17).

The peers have the recipe's trainable parameters but for ours' learned output bias (one per vocabulary
entry) and, for Marian, a pre-norm stack's two final LayerNorms. They keep their library's own
initialisation (every matrix N(0, 0.02^2)) unless asked for the course's (`--peer-init course`), which
tells what initialisation does from what the architecture and the engine do.

What it reports per model: parameters; steady target tokens per second of training (the steps after the
first tenth, the clock stopped during evaluations); the training seconds at which greedy validation
BLEU first reached each threshold (38 and 40 by default; checked every `eval_every` steps, so a time is
known to within one evaluation interval); and test BLEU (cased and -lc) after the same number of steps,
greedy and with each model's own beam search. The ratios (ours / peer) are what carry to other machines.

    attn-course bench-peer --config gpu --peer marian          # the device run of issue 28
    attn-course bench-peer --config quick --steps 100          # on a CPU: speed, and the loop end to end
"""
from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

from attention_course import bpe
from attention_course.batching import collate, segmentation_stream
from attention_course.data import load_pairs
from attention_course.evaluation import bleu, translate_texts
from attention_course.hardware import describe_device, pick_device, precision_for, synchronize
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import TrainConfig, get_config
from attention_course.train import Clock, configure_device, load_data, make_optimizer, scheduled_lr, train_step

PEERS = {
    "marian": "Hugging Face MarianMTModel (post-norm)",
    "m2m100": "Hugging Face M2M100ForConditionalGeneration (pre-norm)",
}
THRESHOLDS = (38.0, 40.0)
INITS = {
    "library": "the library's own initialisation (every matrix N(0, 0.02^2)), as anyone building it from a config gets",
    "course": "the course model's initialisation (Xavier-uniform matrices, N(0, 1/d) embeddings)",
}


# --------------------------------------------------------------------------- the peer
def peer_config(kind: str, cfg: TrainConfig, vocab_size: int):
    """The Hugging Face configuration of the recipe's model: its sizes, dropouts, ReLU, scaled and shared
    embeddings tied to the output layer, sinusoidal positions, and the course's special token ids."""
    from transformers import M2M100Config, MarianConfig

    attention = cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout
    activation = cfg.dropout if cfg.activation_dropout is None else cfg.activation_dropout
    common = dict(vocab_size=vocab_size, d_model=cfg.d_model, encoder_layers=cfg.num_encoder_layers,
                  decoder_layers=cfg.num_decoder_layers, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                  encoder_attention_heads=cfg.num_heads, decoder_attention_heads=cfg.num_heads,
                  dropout=cfg.dropout, attention_dropout=attention, activation_dropout=activation,
                  activation_function="relu", max_position_embeddings=max(cfg.max_len, 256), scale_embedding=True,
                  encoder_layerdrop=0.0, decoder_layerdrop=0.0, pad_token_id=bpe.PAD_ID, bos_token_id=bpe.BOS_ID,
                  eos_token_id=bpe.EOS_ID, decoder_start_token_id=bpe.BOS_ID, forced_eos_token_id=None,
                  tie_word_embeddings=cfg.share_embeddings)
    if kind == "marian":
        return MarianConfig(**common, decoder_vocab_size=vocab_size,
                            share_encoder_decoder_embeddings=cfg.share_embeddings)
    if kind == "m2m100":
        return M2M100Config(**common)
    raise ValueError(f"unknown peer {kind!r}: choose one of {', '.join(PEERS)}")


class PeerTranslator(nn.Module):
    """A Hugging Face encoder-decoder behind the course model's training call, forward(src, tgt_in, src_mask,
    tgt_mask) -> logits [B, T, V], so `train.train_step` trains it unchanged. The course's masks are not
    passed: the peer builds its own from the source padding and causality (its fastest path). Padding
    at the end of a target row is only ever seen by padded positions, which the loss ignores."""

    def __init__(self, kind: str, cfg: TrainConfig, vocab_size: int, init: str = "library"):
        super().__init__()
        from transformers import AutoModelForSeq2SeqLM

        if init not in INITS:
            raise ValueError(f"unknown initialisation {init!r}: choose one of {', '.join(INITS)}")
        self.kind = kind
        self.hf = AutoModelForSeq2SeqLM.from_config(peer_config(kind, cfg, vocab_size), attn_implementation="sdpa")
        if init == "course":
            self.course_init()

    @torch.no_grad()
    def course_init(self) -> None:
        """The course model's initialisation (`Seq2SeqTransformer._reset_parameters`) in the peer: Xavier-
        uniform weight matrices and N(0, 1/d) embeddings (so that, scaled by sqrt(d), they match the
        sinusoidal positions' size), where the library draws every matrix from N(0, 0.02^2)."""
        embedding = self.hf.get_input_embeddings().weight
        for p in self.hf.parameters():
            if p is embedding:
                nn.init.normal_(p, mean=0.0, std=p.size(1) ** -0.5)
            elif p.requires_grad and p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        return self.hf(input_ids=src, attention_mask=(src != bpe.PAD_ID).long(), decoder_input_ids=tgt,
                       use_cache=False).logits                                      # [B, T, V]

    @torch.no_grad()
    def translate(self, tok, texts, beam_size: int = 1, length_penalty: float = 1.0, max_tokens: int = 32000,
                  extra_len: int = 10) -> list[str]:
        """The peer's own `generate` (greedy, or its beam search), batched by length as the course's
        `translate_texts` batches, with the same length limit (1.2 x the source + 10 tokens)."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        ids = bpe.encode(tok, texts, bos=False, eos=True)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        budget, out, start = max(1, max_tokens // max(beam_size, 1)), [""] * len(ids), 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(ids[order[end]]) <= budget:
                end += 1
            batch = order[start:end]
            src = collate([ids[i] for i in batch], device=device)                 # [N, S]
            beams = {"num_beams": beam_size, "length_penalty": length_penalty, "early_stopping": True} if beam_size > 1 else {}
            hyp = self.hf.generate(input_ids=src, attention_mask=(src != bpe.PAD_ID).long(), **beams,
                                   do_sample=False, max_new_tokens=int(src.size(1) * 1.2) + extra_len)   # [N, <= 1 + max_new]
            for i, text in zip(batch, bpe.decode(tok, hyp.tolist()), strict=True):
                out[i] = text
            start = end
        self.train(was_training)
        return out


# --------------------------------------------------------------------------- one model's run
@dataclass
class Contender:
    """A model to train, and how it translates (texts, beam size) -> texts."""
    name: str
    description: str
    model: nn.Module
    translate: Callable[[list[str], int], list[str]]


@dataclass
class Outcome:
    name: str
    description: str
    parameters: int
    steps: int = 0
    train_seconds: float = 0.0
    target_tokens: int = 0
    steady_tokens_per_second: float = 0.0
    seconds_to_bleu: dict[str, float | None] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)       # step, seconds, val_bleu (greedy)
    test: list[dict] = field(default_factory=list)
    final_loss: float | None = None


def contenders(peer: str, cfg: TrainConfig, tok, device: torch.device,
               init: str = "library") -> list[Callable[[], Contender]]:
    """Builders of the two models (built just before each trains, from the same seed)."""
    vocab = tok.get_vocab_size()

    def ours() -> Contender:
        model = Seq2SeqTransformer(cfg.model_config(vocab)).to(device)
        return Contender("ours", "attention_course.model.Seq2SeqTransformer"
                         + (" (pre-norm)" if cfg.norm_first else " (post-norm)"), model,
                         lambda texts, k: translate_texts(model, tok, texts, beam_size=k, length_penalty=1.0))

    def theirs() -> Contender:
        model = PeerTranslator(peer, cfg, vocab, init).to(device)
        return Contender(peer, PEERS[peer] + ("" if init == "library" else f", {init} initialisation"), model, lambda texts, k: model.translate(tok, texts, beam_size=k))

    return [ours, theirs]


def _val_bleu(contender: Contender, val_pairs) -> float:
    return bleu(contender.translate([s for s, _ in val_pairs], 1), [t for _, t in val_pairs])[0]


def train_contender(build: Callable[[], Contender], cfg: TrainConfig, data, device: torch.device,
                    thresholds=THRESHOLDS, eval_every: int | None = None, log=print,
                    progress: bool = False) -> tuple[Contender, Outcome]:
    """Train one model with the course's loop for the recipe's budget (steps, and training seconds read at
    log points as `train.train` reads them), evaluating greedy validation BLEU every `eval_every` steps."""
    torch.manual_seed(cfg.seed)                         # the same initial draw for both models' construction
    contender = build()
    model = contender.model.train()
    torch.manual_seed(cfg.seed + 1)                     # and the same dropout stream from here
    outcome = Outcome(contender.name, contender.description,
                      sum(p.numel() for p in model.parameters() if p.requires_grad))   # the peer's positions are fixed
    precision = precision_for(device, cfg.bf16)
    autocast, scaler = precision.autocast(device), precision.grad_scaler(device)
    opt = make_optimizer(model, cfg, device)
    stream = segmentation_stream(data.segmentations, cfg.accumulate, random.Random(cfg.seed))
    val_pairs = data.val_pairs[:cfg.val_bleu_sentences]
    eval_every, every = eval_every or cfg.eval_every, max(1, (eval_every or cfg.eval_every) // 20)
    warm = max(1, (cfg.max_steps or 1000) // 10)        # steady speed: from here on
    bar = tqdm(total=cfg.max_steps, desc=f"train {contender.name}", unit="step", disable=not progress, leave=False,
               dynamic_ncols=True)
    warm_mark, clock, step, tokens = None, Clock(device), 0, 0
    while True:
        epoch, batches = next(stream)
        loss = train_step(model, opt, batches, cfg, scheduled_lr(cfg, step + 1, epoch), autocast, scaler)
        step += 1
        tokens += sum(b.target_tokens for b in batches)
        bar.update(1)
        seconds = None
        if step % every == 0 or step == warm:
            synchronize(device)
            seconds = clock.training_seconds()
            if step == warm:
                warm_mark = (seconds, tokens)
        out_of_time = cfg.max_seconds is not None and seconds is not None and seconds >= cfg.max_seconds
        done = (cfg.max_steps is not None and step >= cfg.max_steps) or out_of_time
        if step % eval_every == 0 or done:
            with clock.pause():
                score = _val_bleu(contender, val_pairs)
            at = clock.training_seconds()
            outcome.history.append({"step": step, "seconds": round(at, 2), "val_bleu": round(score, 2),
                                    "train_loss": round(float(loss), 4)})
            for t in thresholds:
                outcome.seconds_to_bleu.setdefault(f"{t:g}", None)
                if score >= t and outcome.seconds_to_bleu[f"{t:g}"] is None:
                    outcome.seconds_to_bleu[f"{t:g}"] = round(at, 2)
            (bar.write if progress else log)(f"  {contender.name:>7} step {step:5d}: {at:7.1f} s of training, val BLEU (greedy, "
                f"{len(val_pairs)} sentences) {score:5.2f}, train loss {float(loss):.3f}")
        if done:
            break
    bar.close()
    synchronize(device)
    outcome.steps, outcome.target_tokens, outcome.final_loss = step, tokens, float(loss)
    outcome.train_seconds = round(clock.training_seconds(), 2)
    start_s, start_tokens = warm_mark if warm_mark and step > warm else (0.0, 0)
    outcome.steady_tokens_per_second = round((tokens - start_tokens) / max(outcome.train_seconds - start_s, 1e-9))
    return contender, outcome


def score_tests(contender: Contender, outcome: Outcome, cfg: TrainConfig, src: str, tgt: str, test_sets,
                out: Path, beams=(1,), mirror=None, log=print) -> None:
    """Test BLEU (cased and -lc) after training, greedy and with the model's own beam search; hypotheses
    written to `out`."""
    for test_set in test_sets:
        pairs = load_pairs(cfg.corpus, test_set, src, tgt, mirror)
        for k in beams:
            hyps = contender.translate([s for s, _ in pairs], k)
            refs = [t for _, t in pairs]
            cased, signature = bleu(hyps, refs)
            lowered, signature_lc = bleu(hyps, refs, lowercase=True)
            path = out / f"{outcome.name}.{src}-{tgt}.{test_set}.beam{k}.{tgt}"
            path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            outcome.test.append({"test_set": test_set, "beam": k, "bleu": round(cased, 2), "bleu_lc": round(lowered, 2),
                                 "signature": signature, "signature_lc": signature_lc, "hypotheses": path.name})
            log(f"  {outcome.name:>7} {test_set} ({'greedy' if k == 1 else f'beam {k}'}): BLEU {cased:.2f}, "
                f"-lc {lowered:.2f}")


# --------------------------------------------------------------------------- the comparison
def ratios(ours: Outcome, peer: Outcome) -> dict:
    """Ours / peer: speed (above 1: ours trains faster) and seconds to each threshold (below 1: ours sooner)."""
    speed = ours.steady_tokens_per_second / max(peer.steady_tokens_per_second, 1e-9)
    to_bleu = {t: (ours.seconds_to_bleu[t] / peer.seconds_to_bleu[t]
                   if ours.seconds_to_bleu.get(t) and peer.seconds_to_bleu.get(t) else None)
               for t in ours.seconds_to_bleu}
    return {"tokens_per_second": round(speed, 3),
            "seconds_to_bleu": {t: None if r is None else round(r, 3) for t, r in to_bleu.items()}}


def table(result: dict) -> str:
    """The comparison as a Markdown table (what the README quotes)."""
    rows = result["models"]
    thresholds = list(rows[0]["seconds_to_bleu"])
    head = ["model", "parameters", "steps", "steady tokens/s", *[f"s to val BLEU {t}" for t in thresholds],
            *[f"{t['test_set']} {'greedy' if t['beam'] == 1 else 'beam ' + str(t['beam'])} -lc" for t in rows[0]["test"]]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        times = [("not reached" if r["seconds_to_bleu"][t] is None else f"{r['seconds_to_bleu'][t]:.0f}") for t in thresholds]
        tests = [f"{t['bleu_lc']:.2f}" for t in r["test"]]
        lines.append("| " + " | ".join([r["name"], f"{r['parameters']:,}", str(r["steps"]),
                                         f"{r['steady_tokens_per_second']:,.0f}", *times, *tests]) + " |")
    return "\n".join(lines) + "\n"


def versions() -> dict:
    import sacrebleu
    import tokenizers
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "sacrebleu": sacrebleu.__version__}


def compare(config: str = "gpu", peer: str = "marian", src: str = "en", tgt: str = "de", out: str | Path = "build/peer",
            thresholds=THRESHOLDS, test_sets=None, beam: int | None = None, mirror=None, device: str | None = None,
            log=print, progress: bool = True, init: str = "library", **overrides) -> dict:
    """Train ours, then the peer, on the same batches with the same loop; score both; write
    `peer.json`, `peer.md` and the hypotheses to `out`; return the result."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}: choose one of {', '.join(PEERS)}")
    if init not in INITS:
        raise ValueError(f"unknown initialisation {init!r}: choose one of {', '.join(INITS)}")
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError("bench-peer needs Hugging Face transformers, which `make venv` installs: elsewhere, "
                         "pip install \".[bench]\" in the course folder") from None
    overrides = {k: v for k, v in overrides.items() if v is not None}
    cfg = get_config(config, **overrides)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dev = pick_device(device)
    threads = configure_device(cfg, dev)
    started = time.time()
    data = load_data(cfg, src, tgt, mirror, dev)
    test_sets = list(test_sets or (["test"] if cfg.corpus == "toy" else ["test_2016_flickr"]))
    beams = sorted({1, beam or cfg.beam_size})
    precision = precision_for(dev, cfg.bf16)
    log(f"bench-peer: `{cfg.name}` ({src}->{tgt}), ours against {PEERS[peer]} ({INITS[init]}), on {describe_device(dev)}"
        + (f", {threads} thread(s)" if threads else "") + f"; {precision.why}; budget per model: "
        + ", ".join(b for b in (f"{cfg.max_steps} steps" if cfg.max_steps else "",
                                f"{cfg.max_seconds:g} s of training" if cfg.max_seconds else "") if b))
    outcomes = []
    for build in contenders(peer, cfg, data.tok, dev, init):
        contender, outcome = train_contender(build, cfg, data, dev, thresholds, log=log, progress=progress)
        score_tests(contender, outcome, cfg, src, tgt, test_sets, out, beams, mirror, log)
        outcomes.append(outcome)
        del contender
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    result = {"config": cfg.name, "overrides": overrides, "src": src, "tgt": tgt, "device": describe_device(dev),
              "threads": threads, "precision": precision.name, "versions": versions(), "peer": peer,
              "peer_init": INITS[init],
              "same": "batches (batching.py, one seed), AdamW, schedule, loss, clipping, precision, training loop",
              "models": [o.__dict__ for o in outcomes], "ratio_ours_over_peer": ratios(*outcomes),
              "wall_seconds": round(time.time() - started, 1)}
    (out / "peer.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "peer.md").write_text(table(result))
    r = result["ratio_ours_over_peer"]
    log(table(result) + f"ours / {peer}: {r['tokens_per_second']:.2f}x the steady training speed"
        + "".join(f"; {v:.2f}x the seconds to val BLEU {t}" for t, v in r["seconds_to_bleu"].items() if v)
        + f"  (written to {out / 'peer.json'})")
    return result
