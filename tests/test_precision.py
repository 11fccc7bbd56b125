"""Mixed precision chosen by the GPU (issue 25): bf16 where the GPU computes it natively, fp16 with a
gradient scaler on older ones (Colab's T4), fp32 on the CPU. No GPU here: the decision is checked on
compute capabilities, and the fp16 training step with its scaler runs on the CPU's own fp16 autocast."""
from __future__ import annotations

import copy

import pytest
import torch

from attention_course import train as training
from attention_course.hardware import Precision, choose_precision

from .test_translator_regularisers import _batch, _model, tiny


@pytest.mark.parametrize("device, wanted, capability, name, says", [
    ("cuda", True, (7, 5), "fp16", "compute capability 7.5 has no native bf16"),    # T4 (Colab's free GPU)
    ("cuda", True, (7, 0), "fp16", "gradient scaler"),                              # V100
    ("cuda", True, (8, 0), "bf16", "compute capability 8.0 computes bf16 natively"),  # A100
    ("cuda", True, (9, 0), "bf16", "natively"),                                     # H100
    ("cuda", False, (9, 0), "fp32", "bf16=False"),
    ("cpu", True, None, "fp32", "cpu: full precision"),
])
def test_precision_follows_the_gpu(device, wanted, capability, name, says):
    chosen = choose_precision(device, wanted, capability)
    assert chosen.name == name and says in chosen.why
    assert chosen.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[name]


def test_only_fp16_scales_the_gradients():
    cpu = torch.device("cpu")
    assert Precision("fp16", "").grad_scaler(cpu).is_enabled()
    assert not Precision("bf16", "").grad_scaler(cpu).is_enabled()
    assert not Precision("fp32", "").grad_scaler(cpu).is_enabled()


def _step(precision: Precision, model, cfg):
    cpu = torch.device("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    scaler = precision.grad_scaler(cpu)
    loss = training.train_step(model, opt, [_batch()], cfg, 0.1, precision.autocast(cpu), scaler)
    moved = sum(float((p.detach() - b).norm()) for p, b in zip(model.parameters(), before, strict=True))
    return float(loss), moved, scaler


def test_an_fp16_step_with_its_scaler_updates_like_an_fp32_step():
    """The scaler multiplies the loss by 2^16 before the backward pass; the gradients must be divided
    back before clipping, or the clip would shrink them by the scale and the step would barely move
    (a mistake this test catches: the update must be the fp32 step's size, not 65,536 times smaller)."""
    cfg = tiny(clip_norm=1.0, dropout=0.0)
    model = _model(cfg)
    twin = copy.deepcopy(model)
    loss16, moved16, scaler = _step(Precision("fp16", "test"), model, cfg)
    loss32, moved32, _ = _step(Precision("fp32", "test"), twin, cfg)
    assert scaler.is_enabled() and scaler.get_scale() > 1
    assert torch.isfinite(torch.tensor(loss16)) and abs(loss16 - loss32) < 0.05 * loss32
    assert 0.5 < moved16 / moved32 < 2.0, (moved16, moved32)


def test_a_run_records_its_precision(tmp_path):
    run = training.train(tiny(max_steps=2), out_dir=tmp_path / "run", progress=False, log=lambda *a: None)
    import json

    info = json.loads((run.run_dir / "config.json").read_text())
    assert info["precision"] == {"name": "fp32", "why": "cpu: full precision"}
