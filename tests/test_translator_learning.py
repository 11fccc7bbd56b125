"""The CI learning check: the `quick` configuration trains on the real Multi30k (the mirror CI
points ATTN_MULTI30K_MIRROR at) for a fixed 300 steps, and its BLEU on held-out sentences must be
far above that of the same model untrained. A learning check, not a smoke run; how long it took is
printed, never asserted (CI machines are shared).

It trains into a temporary folder: nothing else in the suite (notebook 06 reads the shipped
weights) depends on it or on the order tests run in."""
from __future__ import annotations

import os

import pytest
import torch

from attention_course import bpe, data
from attention_course.model import Seq2SeqTransformer
from attention_course.train import CONFIGS, bleu, train, translate_texts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.environ.get(data.MIRROR_ENV),
                       reason=f"{data.MIRROR_ENV} is not set: the learning check trains on the real Multi30k "
                              "(CI sets it to ../shared/data/multi30k/task1/raw)"),
]
HELD_OUT = 200   # the first sentences of test_2016_flickr: never seen in training or model selection


def test_quick_config_learns_to_translate(tmp_path):
    cfg = CONFIGS["quick"]
    run = train("quick", "en", "de", out_dir=tmp_path / "quick-en-de", progress=False)
    assert run.summary["steps"] == cfg.max_steps, run.summary

    pairs = data.load_multi30k("test_2016_flickr", "en", "de")[:HELD_OUT]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    trained, _ = bleu(translate_texts(run.model, run.tokenizer, sources), references)

    torch.manual_seed(0)
    untrained_model = Seq2SeqTransformer(cfg.model_config(run.tokenizer.get_vocab_size())).eval()
    untrained, _ = bleu(translate_texts(untrained_model, run.tokenizer, sources, extra_len=5), references)
    print(f"quick: {run.summary['steps']} steps in {run.summary['loop_seconds']:.0f} s; held-out BLEU "
          f"{trained:.2f} trained vs {untrained:.2f} untrained")

    assert untrained < 1.0
    assert trained >= 5.0 and trained >= untrained + 5.0, (trained, untrained)
    losses = [h["val_loss"] for h in run.evaluations]
    assert losses[-1] < losses[0] - 1.0, losses
    assert (run.run_dir / bpe.FILE_NAME).is_file() and (run.run_dir / "model.pt").is_file()
