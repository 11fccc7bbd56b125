"""Evaluation of a translator: decoding whole test sets (with the KV cache), sacreBLEU with its
signature, the validation loss, the length penalty chosen on the validation set, and the results
table (`results/translator.json`, which the README's table is generated from)."""
from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import bpe
from .batching import collate
from .checkpoints import load_run
from .data import TEST_SETS, load_pairs
from .decoding import Ensemble, beam_search_cached, greedy_decode_cached
from .paths import CourseNotFound, course_file, find_course_root, lazy_paths
from .recipes import CONFIGS, TrainConfig
from .translate import beam_search, greedy_decode, label_smoothed_cross_entropy, make_masks


def results_dir() -> Path:
    """The course's results/ folder: recorded BLEU scores and the system outputs behind them."""
    return course_file("results")


__getattr__ = lazy_paths(__name__, {"RESULTS": results_dir})  # RESULTS: looked up when asked for


def shown(path) -> str:
    """A path for messages: relative to the course folder when inside it (no machine paths in outputs)."""
    try:
        return Path(path).resolve().relative_to(find_course_root()).as_posix()
    except (ValueError, CourseNotFound):
        return str(path)



def source_limit(model, extra_len: int = 10) -> int:
    """The most source tokens (end-of-sentence included) `translate_texts` reads of one sentence: the model has
    positions for `model.positional.pe.size(0)` tokens, and the translation's allowance needs `extra_len` more."""
    return model.positional.pe.size(0) - extra_len - 1


def translate_texts(model, tok, texts, beam_size: int = 1, length_penalty: float = 1.0,
                    max_tokens: int | None = None, device=None, extra_len: int = 10, progress: bool = False,
                    cached: bool = True) -> list[str]:
    """Translate `texts` with greedy decoding (beam_size=1) or beam search; returns detokenized text.
    Sentences are sorted by length and batched, `max_tokens` source tokens x beam per batch. A sentence longer
    than `source_limit(model)` tokens is cut there, and no translation runs past the model's last position.
    cached=True decodes with a key/value cache (`attention_course.decoding`: the same translations
    as notebook 06's readable decoders, several times faster); cached=False runs those decoders."""
    from tqdm.auto import tqdm

    device = device or next(model.parameters()).device
    max_tokens = max_tokens or (32000 if torch.device(device).type == "cuda" else 4000)
    was_training = model.training
    model.eval()
    ids = bpe.encode(tok, texts, bos=False, eos=True)
    max_src = source_limit(model, extra_len)
    positions = model.positional.pe.size(0)
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
            max_len = min(max_len, positions - 1)             # <bos> and max_len - 1 fed back: positions 0 .. max_len - 1
            if beam_size == 1:
                hyp = greedy(model, src, max_len, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID)
            else:
                hyp = beam(model, src, beam_size, max_len, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID, length_penalty)
            for i, text in zip(batch, bpe.decode(tok, hyp.tolist()), strict=True):
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
def validation_loss(model, batches, epsilon: float) -> float:
    """Label-smoothed cross-entropy per target token over padded batches (`batching.padded_batches`)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        src, tgt = batch.src, batch.tgt
        src_mask, tgt_mask = make_masks(src, tgt[:, :-1], bpe.PAD_ID)
        logits = model(src, tgt[:, :-1], src_mask, tgt_mask)
        n = int((tgt[:, 1:] != bpe.PAD_ID).sum())
        total += float(label_smoothed_cross_entropy(logits.float(), tgt[:, 1:], epsilon, bpe.PAD_ID)) * n
        count += n
    model.train(was_training)
    return total / max(count, 1)


def current_commit() -> str:
    """The checked-out commit, read from .git without running git (ATTN_COMMIT overrides)."""
    if os.environ.get("ATTN_COMMIT"):
        return os.environ["ATTN_COMMIT"]
    try:
        git = find_course_root() / ".git"
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head
        ref = head.split(None, 1)[1]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except (OSError, CourseNotFound):
        pass
    return "unknown"


LENGTH_PENALTIES = (0.0, 0.3, 0.6, 0.8, 1.0, 1.2, 1.5)


def _validation_bleus(model, tok, pairs, beam: int, candidates, progress: bool, log) -> dict[float, float]:
    """Validation BLEU of beam search for each candidate length penalty."""
    scores = {}
    for lp in candidates:
        hyps = translate_texts(model, tok, [p[0] for p in pairs], beam_size=beam, length_penalty=lp, progress=progress)
        scores[lp] = bleu(hyps, [p[1] for p in pairs])[0]
        log(f"validation BLEU, beam {beam}, length penalty {lp:g}: {scores[lp]:.2f}")
    return scores


def _best_length_penalty(scores: dict[float, float], default: float) -> float:
    """The best-scoring length penalty; among equals, the one nearest the configuration's."""
    return max(scores, key=lambda lp: (scores[lp], -abs(lp - default)))


def tune_length_penalty(run_dir: str | Path, candidates=LENGTH_PENALTIES, beam_size: int | None = None,
                        mirror=None, device: str | None = None, progress: bool = True, log=print) -> float:
    """Choose beam search's length penalty on the validation set (never on a test set): the one with the
    best BLEU; saved in the run's summary.json, where `evaluate` picks it up."""
    run_dir = Path(run_dir)
    model, tok, info = load_run(run_dir, device)
    cfg = TrainConfig.from_dict(info["train"])
    beam = beam_size or cfg.beam_size
    pairs = load_pairs(info.get("corpus", "multi30k"), "val", info["src"], info["tgt"], mirror)
    scores = _validation_bleus(model, tok, pairs, beam, candidates, progress, log)
    best = _best_length_penalty(scores, cfg.length_penalty)
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["length_penalty"] = {"chosen": best, "beam": beam, "on": f"val ({len(pairs)} sentences)",
                                 "val_bleu": {f"{lp:g}": round(b, 2) for lp, b in scores.items()}}
    path.write_text(json.dumps(summary, indent=2) + "\n")
    log(f"length penalty {best:g} chosen on the validation set (saved in {shown(path)})")
    return best


def _score_test_sets(model, tok, name: str, src: str, tgt: str, corpus: str, beam: int, lp: float,
                     test_sets, mirror, hypotheses_dir, progress: bool, log, common: dict) -> list[dict]:
    """Translate each test set, score it (cased and -lc), write the hypotheses; one entry per test set."""
    test_sets = list(test_sets or (("test",) if corpus == "toy" else TEST_SETS))
    hyp_dir = Path(hypotheses_dir) if hypotheses_dir is not None else results_dir() / "hypotheses"
    hyp_dir.mkdir(parents=True, exist_ok=True)
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
        path = hyp_dir / f"{name}.{src}-{tgt}.{test_set}.{tgt}"
        path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        entries.append({"src": src, "tgt": tgt, "test_set": test_set, "bleu": round(cased, 2),
                        "bleu_lc": round(lowered, 2), "signature": signature, "signature_lc": signature_lc,
                        "config": name, "commit": current_commit(), "hypotheses": shown(path),
                        **common, "decode_seconds": round(seconds, 1)})
        log(f"{src}->{tgt} {test_set}: BLEU {cased:.2f} (cased, {signature}); {lowered:.2f} lowercased (-lc)")
    return entries


def _device_for_evaluation(model) -> None:
    if next(model.parameters()).device.type == "cuda":
        torch.set_float32_matmul_precision("high")   # TF32, as during training's evaluations


def evaluate(run_dir: str | Path, test_sets=None, beam_size: int | None = None,
             length_penalty: float | None = None, mirror=None, device: str | None = None,
             hypotheses_dir: str | Path | None = None, progress: bool = True, log=print) -> list[dict]:
    """sacreBLEU of a run on the test sets (cased and lowercased, with signatures); writes the
    detokenized hypotheses and returns one results entry per test set. The length penalty: as
    given, else the one `tune_length_penalty` chose on the validation set, else the configuration's."""
    run_dir = Path(run_dir)
    model, tok, info = load_run(run_dir, device)
    _device_for_evaluation(model)
    cfg = TrainConfig.from_dict(info["train"])
    summary = json.loads((run_dir / "summary.json").read_text())
    beam = beam_size or cfg.beam_size
    tuned = summary.get("length_penalty", {})
    if length_penalty is not None:
        lp, lp_source = length_penalty, "given"
    elif tuned and tuned.get("beam") == beam:
        lp, lp_source = tuned["chosen"], "chosen on val"
    else:
        lp, lp_source = cfg.length_penalty, "configuration"
    base = asdict(CONFIGS[cfg.name]) if cfg.name in CONFIGS else {}
    changed = {k: v for k, v in asdict(cfg).items() if base and base.get(k) != v}
    common = {"device": summary["device"], "train_seconds": summary["train_seconds"],
              "tokens_per_second": summary["tokens_per_second"], "loop_seconds": summary["loop_seconds"],
              **({"config_overrides": changed} if changed else {}),
              "decoding": f"beam {beam}, length penalty {lp:g} ({lp_source})" if beam > 1 else "greedy",
              "steps": summary["steps"], "epochs": summary["epochs"], "parameters": summary["parameters"],
              "weights": summary["weights"]}
    return _score_test_sets(model, tok, cfg.name, info["src"], info["tgt"], info.get("corpus", "multi30k"), beam,
                            lp, test_sets, mirror, hypotheses_dir, progress, log, common)


def evaluate_ensemble(run_dirs, name: str | None = None, test_sets=None, beam_size: int | None = None,
                      candidates=LENGTH_PENALTIES, mirror=None, device: str | None = None,
                      hypotheses_dir: str | Path | None = None, progress: bool = True, log=print,
                      length_penalty: float | None = None) -> list[dict]:
    """sacreBLEU of several runs decoding as one (`decoding.Ensemble`: the mean of their log-probabilities),
    e.g. seeds of one recipe. The runs must share the language pair and the tokenizer. The length penalty:
    as given (fixed in advance: validation BLEU is still computed and recorded), else chosen on the
    validation set among `candidates`, as for one model; entries are recorded under their own name
    (default "<config>-ensemble<N>"), apart from the single models'."""
    run_dirs = [Path(d) for d in run_dirs]
    loaded = [load_run(d, device) for d in run_dirs]
    infos = [info for _, _, info in loaded]
    pairs_of = {(i["src"], i["tgt"], i.get("corpus", "multi30k")) for i in infos}
    if len(pairs_of) > 1:
        raise ValueError(f"an ensemble's runs must translate the same language pair: got {sorted(pairs_of)}")
    tok = loaded[0][1]
    for d, (_, other, _) in zip(run_dirs[1:], loaded[1:], strict=True):
        if other.to_str() != tok.to_str():
            raise ValueError(f"{shown(d)} has a different tokenizer from {shown(run_dirs[0])}: an ensemble's "
                             "members must share one vocabulary (train them with the same recipe and data)")
    model = Ensemble([m for m, _, _ in loaded]).eval()
    _device_for_evaluation(model)
    cfg = TrainConfig.from_dict(infos[0]["train"])
    (src, tgt, corpus), = pairs_of
    beam = beam_size or cfg.beam_size
    name = name or f"{cfg.name}-ensemble{len(run_dirs)}"
    val = load_pairs(corpus, "val", src, tgt, mirror)
    if length_penalty is not None:
        lp, lp_source = length_penalty, "given"
        scores = _validation_bleus(model, tok, val, beam, [lp], progress, log)
    else:
        scores = _validation_bleus(model, tok, val, beam, candidates, progress, log)
        lp, lp_source = _best_length_penalty(scores, cfg.length_penalty), "chosen on val"
        log(f"length penalty {lp:g} chosen on the validation set ({len(val)} sentences)")
    summaries = [json.loads((d / "summary.json").read_text()) for d in run_dirs]
    common = {"device": summaries[0]["device"], "train_seconds": round(sum(s["train_seconds"] for s in summaries), 1),
              "tokens_per_second": round(sum(s["tokens_per_second"] for s in summaries) / len(summaries)),
              "loop_seconds": round(sum(s["loop_seconds"] for s in summaries), 1),
              "decoding": f"beam {beam}, length penalty {lp:g} ({lp_source}), mean log-probabilities of "
                          f"{len(run_dirs)} models",
              "val_bleu_by_length_penalty": {f"{k:g}": round(v, 2) for k, v in scores.items()},
              "steps": summaries[0]["steps"], "epochs": summaries[0]["epochs"],
              "parameters": sum(s["parameters"] for s in summaries),
              "weights": f"ensemble of {len(run_dirs)} runs ({summaries[0]['weights']} each)",
              "members": [shown(d) for d in run_dirs]}
    return _score_test_sets(model, tok, name, src, tgt, corpus, beam, lp, test_sets, mirror, hypotheses_dir,
                            progress, log, common)


def record(entries: list[dict], path: str | Path | None = None) -> Path:
    """Add entries to the results file (default: results/translator.json), replacing earlier ones for
    the same (src, tgt, test set, config)."""
    path = Path(path) if path is not None else results_dir() / "translator.json"
    runs = json.loads(path.read_text()) if path.is_file() else []
    key = lambda e: (e["src"], e["tgt"], e["test_set"], e["config"])
    new = {key(e) for e in entries}
    runs = [r for r in runs if key(r) not in new] + list(entries)
    runs.sort(key=lambda e: (e["config"], e["src"], e["tgt"], e["test_set"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=2, ensure_ascii=False) + "\n")
    return path
