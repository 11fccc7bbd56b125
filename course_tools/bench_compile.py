"""`attn-course bench-compile`: the translator's training step eager against `torch.compile`, measured
side by side in one call on the same batches (issue 28, item 5).

The `gpu` recipe is launch-bound (small matrices, about a thousand kernels a step), which is what a
compiler's fused kernels (and, with `--mode reduce-overhead`, CUDA graphs) are for. Batches vary in
shape step by step (sentences x longest side), and a compiled graph is specialised to shapes, so the
compiled model is compiled with dynamic shapes; `--bucket M` further pads every batch's lengths up to a
multiple of M (with <pad>: the same loss) so that fewer distinct shapes reach it, at the price of the
extra padding, which is reported. Eager trains on the same (bucketed) batches, so both do the same work.

Both variants take the same steps twice: the first pass meets every batch shape (compilation happens
there), the second is the steady speed. Reports per variant: the first pass's seconds, the second's
target tokens per second, the number of graphs compiled, and the first batch's loss before training, without
dropout (the same weights, the same batch: the two must agree).

    attn-course bench-compile --config gpu --steps 200 --bucket 16                 # on the GPU
    attn-course bench-compile --config toy --steps 8 --backend aot_eager           # the path, on a CPU
"""
from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path

import torch

from attention_course import bpe
from attention_course.batching import Batch, segmentation_stream
from attention_course.hardware import describe_device, pick_device, precision_for, synchronize
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import get_config
from attention_course.train import batch_loss, configure_device, load_data, make_optimizer, scheduled_lr, train_step


def bucketed(batch: Batch, multiple: int) -> Batch:
    """The batch with its source and target-prefix lengths padded up to a multiple of `multiple` (with
    <pad>, which the masks and the loss ignore: the same loss, fewer distinct shapes)."""
    if multiple <= 1:
        return batch
    src, tgt = batch.src, batch.tgt                                          # [N, S], [N, T + 1]
    s = -(-src.size(1) // multiple) * multiple
    t = -(-(tgt.size(1) - 1) // multiple) * multiple + 1
    pad = torch.nn.functional.pad
    return Batch(pad(src, (0, s - src.size(1)), value=bpe.PAD_ID), pad(tgt, (0, t - tgt.size(1)), value=bpe.PAD_ID),
                 batch.target_tokens)


def _shapes(batches: list[Batch]) -> set[tuple[int, int, int]]:
    return {(b.src.size(0), b.src.size(1), b.tgt.size(1)) for b in batches}


def _padding(batches: list[Batch]) -> float:
    """The fraction of the batches' target positions that are padding."""
    cells = sum(b.tgt[:, 1:].numel() for b in batches)
    return 1 - sum(b.target_tokens for b in batches) / max(cells, 1)


def _run(name: str, step_model, model, batches: list[Batch], cfg, device, log) -> dict:
    """Two passes of optimizer steps over `batches`: the first meets every shape (compilation happens
    there), the second, over the same shapes, is the steady speed (no graph may be compiled in it)."""
    from torch._dynamo.utils import counters

    counters.clear()
    precision = precision_for(device, cfg.bf16)
    autocast, scaler = precision.autocast(device), precision.grad_scaler(device)
    opt = make_optimizer(model, cfg, device)
    model.eval()
    with torch.no_grad():                                  # no dropout: the two variants must agree here
        first_loss = float(batch_loss(step_model, batches[0], cfg, autocast).ce)
    torch.manual_seed(cfg.seed + 1)
    model.train()
    seconds, graphs = [], []
    for offset in (0, len(batches)):
        synchronize(device)
        start = time.perf_counter()
        for step, batch in enumerate(batches, offset + 1):
            train_step(step_model, opt, [batch], cfg, scheduled_lr(cfg, step), autocast, scaler)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
        graphs.append(int(counters["stats"]["unique_graphs"]))
    tokens = sum(b.target_tokens for b in batches)
    result = {"variant": name, "steps_per_pass": len(batches), "first_pass_seconds": round(seconds[0], 2),
              "steady_seconds": round(seconds[1], 3), "steady_tokens_per_second": round(tokens / max(seconds[1], 1e-9)),
              "graphs": graphs[0], "graphs_in_steady_pass": graphs[1] - graphs[0], "first_loss": first_loss}
    log(f"  {name:>9}: first pass {seconds[0]:.1f} s ({graphs[0]} graph(s) compiled), second pass "
        f"{result['steady_tokens_per_second']:,} target tokens/s ({graphs[1] - graphs[0]} compiled); the first "
        f"batch's loss before training {first_loss:.4f}")
    return result


def compare(config: str = "gpu", steps: int = 400, bucket: int = 16,
            backend: str = "inductor", mode: str | None = None, src: str = "en", tgt: str = "de",
            out: str | Path = "build/compile", mirror=None, device: str | None = None, log=print,
            **overrides) -> dict:
    """Eager, then compiled, over the same `steps` batches of the recipe from the same weights."""
    if steps < 1:
        raise ValueError(f"--steps {steps}: at least 1")
    cfg = get_config(config, **{k: v for k, v in overrides.items() if v is not None})
    dev = pick_device(device)
    threads = configure_device(cfg, dev)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg, src, tgt, mirror, dev)
    stream = segmentation_stream(data.segmentations, cfg.accumulate, random.Random(cfg.seed))
    raw = [next(stream)[1][0] for _ in range(steps)]
    batches = [bucketed(b, bucket) for b in raw]
    torch.manual_seed(cfg.seed)
    eager = Seq2SeqTransformer(cfg.model_config(data.vocab_size)).to(dev)
    twin = copy.deepcopy(eager)                            # the same initial weights
    compile_args = {"backend": backend, "dynamic": True, **({"mode": mode} if mode else {})}
    import torch._dynamo.config as dynamo_config

    # past this many graphs per function Dynamo would fall back to eager, silently: never below the shapes
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * len(_shapes(batches)) + 2)
    log(f"bench-compile: `{cfg.name}` on {describe_device(dev)}" + (f", {threads} thread(s)" if threads else "")
        + f"; {steps} steps, twice; {len(_shapes(raw))} distinct batch shapes, {len(_shapes(batches))} "
        f"after bucketing lengths to multiples of {bucket} (padding {_padding(raw):.1%} -> {_padding(batches):.1%}); "
        f"torch.compile({', '.join(f'{k}={v!r}' for k, v in compile_args.items())})")
    results = [_run("eager", eager, eager, batches, cfg, dev, log),
               _run("compiled", torch.compile(twin, **compile_args), twin, batches, cfg, dev, log)]
    ratio = results[1]["steady_tokens_per_second"] / max(results[0]["steady_tokens_per_second"], 1e-9)
    result = {"config": cfg.name, "device": describe_device(dev), "threads": threads, "torch": torch.__version__,
              "steps": steps, "bucket": bucket, "compile": compile_args,
              "shapes": {"raw": len(_shapes(raw)), "bucketed": len(_shapes(batches))},
              "padding": {"raw": round(_padding(raw), 4), "bucketed": round(_padding(batches), 4)},
              "variants": results, "steady_speedup": round(ratio, 3)}
    (out / "compile.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"compiled / eager: {ratio:.2f}x the steady training speed; the first pass (compilation included) took "
        f"{results[1]['first_pass_seconds']:.0f} s against {results[0]['first_pass_seconds']:.0f} s eager")
    return result
