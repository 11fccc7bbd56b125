"""The trainer under torchrun: two CPU processes (gloo), each taking half of every optimizer step's
batches, follow the same loss curve as one process that accumulates both halves. And the
`compile` flag runs (torch.compile on the CPU) and trains like the eager model."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attention_course import train as training

STEPS = 12


def _losses(history: list[dict]) -> dict[int, float]:
    return {h["step"]: h["train_loss"] for h in history if "val_loss" not in h}


@pytest.mark.slow
def test_two_processes_follow_the_one_process_loss_curve(tmp_path):
    one = training.train("toy", "en", "de", out_dir=tmp_path / "one", progress=False, log=lambda *a: None,
                         accumulate=2, max_steps=STEPS, num_threads=1)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "course_tools.cli", "train", "--config", "toy", "--out", str(tmp_path / "two"),
           "--max-steps", str(STEPS), "--threads", "1", "--set", "accumulate=1", "--no-progress"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == STEPS
    assert summary["target_tokens"] == one.summary["target_tokens"]        # the same batches, split in two
    two = _losses(json.loads((tmp_path / "two" / "history.json").read_text()))
    ones = _losses(one.history)
    assert len(ones) >= 5 and ones.keys() == two.keys()
    for step in ones:
        assert two[step] == pytest.approx(ones[step], rel=2e-3), (step, ones, two)
    assert ones[max(ones)] < ones[min(ones)] - 0.5                         # and it is learning


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one(tmp_path):
    kwargs = dict(progress=False, log=lambda *a: None, max_steps=4, num_threads=1, eval_every=20)
    eager = training.train("toy", "en", "de", out_dir=tmp_path / "eager", **kwargs)
    # aot_eager: TorchDynamo's graph capture and AOTAutograd, the parts that break on unusual model code,
    # without inductor's C++ code generation (minutes on a busy 2-core CI machine); GPUs use inductor
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = training.train("toy", "en", "de", out_dir=tmp_path / "compiled", compile="aot_eager", **kwargs)
    assert counters["stats"]["unique_graphs"] >= 1, "nothing was compiled"
    a, b = _losses(eager.history), _losses(compiled.history)
    assert a.keys() == b.keys() and len(a) == 4
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-3)
    assert json.loads((tmp_path / "compiled" / "config.json").read_text())["train"]["compile"] == "aot_eager"
