"""Resuming a training run where it stopped (a Colab runtime that disconnects, a killed job).

At every checkpoint the trainer also writes `resume.pt` in the run's folder: the raw weights, the
optimizer's moments, the gradient scaler, the weights' moving average, the random-number generators,
the step, the epoch, the tokens seen, the history and the clocks. Training again with `resume=True`
(`attn-course train --resume`, and `train_or_load` by default) starts from that point, replaying the
data stream to the same place, so the resumed run takes the same steps as one that never stopped
(bit for bit on the CPU). A run folder on a mounted drive ($ATTN_RUNS_DIR) survives the machine.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import asdict
from pathlib import Path

import torch

from .recipes import TrainConfig

FILE = "resume.pt"


class ResumeMismatch(ValueError):
    """The run's folder holds a resume point of another recipe or language pair."""


def recipe_key(cfg: TrainConfig, src: str, tgt: str) -> dict:
    """What must match for a resume: the whole recipe and the language pair (JSON-normalised)."""
    return json.loads(json.dumps({"train": asdict(cfg), "src": src, "tgt": tgt}))


def save_point(out: Path, cfg: TrainConfig, src: str, tgt: str, state: dict) -> Path:
    """Write resume.pt atomically (a half-written file never replaces a good one)."""
    path, tmp = out / FILE, out / f".{FILE}.tmp"
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"recipe": recipe_key(cfg, src, tgt), "rng": rng, **state}, tmp)
    os.replace(tmp, path)
    return path


def load_point(out: Path, cfg: TrainConfig, src: str, tgt: str) -> dict | None:
    """The run's resume point, or None when it has none. ResumeMismatch if it was another recipe."""
    path = out / FILE
    if not path.is_file():
        return None
    point = torch.load(path, map_location="cpu", weights_only=False)  # our own file, written by save_point
    expected = recipe_key(cfg, src, tgt)
    if point.get("recipe") != expected:
        recorded = point.get("recipe", {})
        differ = sorted(k for k in expected["train"] if recorded.get("train", {}).get(k) != expected["train"][k])
        differ += [k for k in ("src", "tgt") if recorded.get(k) != expected[k]]
        raise ResumeMismatch(f"{path} is the resume point of another run (different: {', '.join(differ) or 'format'}): "
                             f"resume with the same recipe, or train into another folder (out_dir / --out)")
    return point


def restore_rng(point: dict) -> None:
    """The random-number generators as they were at the resume point (dropout masks, word dropout)."""
    torch.set_rng_state(point["rng"]["torch"])
    random.setstate(point["rng"]["python"])
    if "cuda" in point["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(point["rng"]["cuda"])


def discard(out: Path) -> None:
    """A finished run needs no resume point (it is four copies of the model)."""
    (out / FILE).unlink(missing_ok=True)
