"""`attn-course bench-compile` (issue 28, item 5): eager against torch.compile on the same batches.
On the toy corpus with the `aot_eager` backend (TorchDynamo's capture and AOTAutograd, without
inductor's code generation, which takes minutes on a busy CPU): bucketing keeps the loss, the compiled
model computes what the eager one does, and its second pass compiles nothing. No timing assertions."""
from __future__ import annotations

import json

import pytest
import torch

from attention_course import bpe, data
from attention_course.batching import encode_pairs, padded_batches
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import get_config
from attention_course.train import batch_loss
from course_tools import bench_compile
from course_tools.cli import main as cli

TINY = dict(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, num_threads=1)


def test_bucketing_pads_lengths_to_the_multiple_and_keeps_the_loss():
    cfg = get_config("toy", **TINY)
    pairs = data.load_toy("train", "en", "de")
    tok = bpe.train_joint_bpe(pairs, 200, 1)
    batches = padded_batches(encode_pairs(tok, pairs), 300, torch.device("cpu"))
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg.model_config(tok.get_vocab_size())).eval()
    moved = 0
    for batch in batches[:6]:
        wide = bench_compile.bucketed(batch, 8)
        assert wide.src.size(1) % 8 == 0 and (wide.tgt.size(1) - 1) % 8 == 0      # the decoder reads T, not T + 1
        assert wide.src.size(0) == batch.src.size(0) and wide.target_tokens == batch.target_tokens
        moved += wide.tgt.size(1) != batch.tgt.size(1)
        with torch.no_grad():
            a = batch_loss(model, batch, cfg, torch.autocast("cpu", enabled=False)).ce
            b = batch_loss(model, wide, cfg, torch.autocast("cpu", enabled=False)).ce
        assert torch.allclose(a, b, atol=1e-5), (float(a), float(b))
    assert moved, "no batch needed padding: the test would not test"
    assert bench_compile.bucketed(batches[0], 1) is batches[0]


@pytest.mark.slow
def test_bench_compile_compiles_once_per_shape_and_agrees_with_eager(tmp_path, capsys):
    out = tmp_path / "compile"
    status = cli(["bench-compile", "--config", "toy", "--steps", "4", "--bucket", "8", "--backend", "aot_eager",
                  "--threads", "1", "--out", str(out), *[f"--set={k}={v}" for k, v in TINY.items() if k != "num_threads"]])
    assert status == 0
    result = json.loads((out / "compile.json").read_text())
    eager, compiled = result["variants"]
    assert (eager["variant"], compiled["variant"]) == ("eager", "compiled")
    assert eager["graphs"] == 0 and compiled["graphs"] >= 1                      # it was compiled ...
    assert compiled["graphs_in_steady_pass"] == 0                                # ... before the pass that is timed
    assert compiled["first_loss"] == pytest.approx(eager["first_loss"], rel=1e-4)
    assert result["compile"] == {"backend": "aot_eager", "dynamic": True}
    assert result["shapes"]["bucketed"] <= result["shapes"]["raw"]
    assert result["padding"]["bucketed"] >= result["padding"]["raw"]
    assert result["steady_speedup"] > 0 and "the steady training speed" in capsys.readouterr().out
