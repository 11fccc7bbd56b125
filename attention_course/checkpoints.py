"""What a training run leaves on disk, and the weights the course ships.

A run directory holds ``tokenizer.json`` (the joint BPE, learned on the training split only),
``model.pt`` (the final, possibly checkpoint-averaged weights), ``config.json`` (the recipe and the
`ModelConfig`), ``history.json`` (the curves), ``summary.json`` (time, tokens/s, validation BLEU) and
``checkpoints/`` (the last few, for averaging).

A shipped model (``models/<config>.<src>-<tgt>/``) is a finished run in half precision, small enough
for the repository (a 2M-parameter model is 4 MB), with its SHA-256 sums in ``models/SHA256SUMS``:
`load_shipped` checks them before it loads anything, so notebook 06 reads exactly the recorded model.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import MISSING, asdict, fields
from importlib import resources
from pathlib import Path

import torch

from . import bpe
from .data import sha256
from .hardware import cpu_threads, pick_device
from .model import ModelConfig, Seq2SeqTransformer
from .paths import CourseNotFound, course_file, lazy_paths
from .recipes import TrainConfig


def models_dir() -> Path:
    """The shipped, trained translators: the course's models/ folder; outside any course, the copy
    installed with the package (package data), so `pip install attention-course` alone translates."""
    try:
        return course_file("models")
    except CourseNotFound:
        packaged = Path(str(resources.files("attention_course") / "models"))
        if (packaged / SUMS).is_file():
            return packaged
        raise


__getattr__ = lazy_paths(__name__, {"MODELS": models_dir})  # MODELS: looked up when asked for
SUMS = "SHA256SUMS"
SHIPPED_FILES = ("model.fp16.pt", bpe.FILE_NAME, "config.json", "summary.json", "history.json")


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


def cpu_state(model) -> dict:
    """The model's state_dict on the CPU, tied weights (shared embeddings) kept as one tensor: copying
    each entry to the CPU on its own would store them three times."""
    copies: dict[int, torch.Tensor] = {}
    return {k: copies.setdefault(v.data_ptr(), v.detach().cpu()) for k, v in model.state_dict().items()}


def save_checkpoint(model, folder: Path, step: int, keep: int) -> Path:
    """Save the weights as checkpoints/step_NNNNNNN.pt and keep only the newest `keep`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    torch.save({"model": cpu_state(model), "step": step}, path)
    for old in sorted(folder.glob("step_*.pt"))[:-keep]:
        old.unlink()
    return path


def _build(info: dict, state: dict, device=None):
    model = Seq2SeqTransformer(ModelConfig(**info["model"]))
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    device = pick_device(device)
    if device.type == "cpu":
        torch.set_num_threads(cpu_threads(None))   # one thread on a busy machine is much faster
    return model.to(device).eval()


def load_run(run_dir: str | Path, device=None):
    """(model, tokenizer, config dict) of a finished run, or of a shipped model's folder (models/NAME,
    whose half-precision weights are loaded as float32)."""
    run_dir = Path(run_dir)
    info = json.loads((run_dir / "config.json").read_text())
    weights = run_dir / "model.pt"
    if not weights.is_file() and (run_dir / SHIPPED_FILES[0]).is_file():
        weights = run_dir / SHIPPED_FILES[0]
    state = torch.load(weights, map_location="cpu", weights_only=True)
    return _build(info, state, device), bpe.load(run_dir), info


def same_recipe(recorded: dict, config: TrainConfig) -> bool:
    """Whether a run's recorded recipe (config.json's "train") is `config`. A setting added to
    `TrainConfig` since the run was written counts as its default (a run from before the regularisers
    of issue 28 is the same recipe with them off); a setting this version does not know never matches."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    expected = json.loads(json.dumps(asdict(config)))
    return json.loads(json.dumps({**defaults, **recorded})) == expected


def run_is_complete(run_dir: str | Path, config: TrainConfig, src: str, tgt: str) -> bool:
    run_dir = Path(run_dir)
    try:
        info = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return ((run_dir / "model.pt").is_file() and (run_dir / "summary.json").is_file()
            and isinstance(info.get("train"), dict) and same_recipe(info["train"], config)
            and info.get("src") == src and info.get("tgt") == tgt)


# --------------------------------------------------------------------------- shipped weights
def _read_sums(models: Path) -> dict[str, str]:
    path = models / SUMS
    if not path.is_file():
        return {}
    sums = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(None, 1)
            sums[name.strip()] = digest
    return sums


def half_state(state: dict) -> dict:
    """A state_dict's floating-point tensors in half precision; tied weights (shared embeddings) stay one tensor."""
    halves: dict[int, torch.Tensor] = {}
    return {k: halves.setdefault(v.data_ptr(), v.half()) if v.is_floating_point() else v for k, v in state.items()}


def ship_run(run_dir: str | Path, name: str, models: Path | None = None) -> Path:
    """Copy a finished run into models/<name>/ with half-precision weights, and record the SHA-256
    of every file in models/SHA256SUMS."""
    models = Path(models) if models is not None else models_dir()
    run_dir, dest = Path(run_dir), models / name
    dest.mkdir(parents=True, exist_ok=True)
    state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
    torch.save(half_state(state), dest / "model.fp16.pt")
    for file in SHIPPED_FILES[1:]:
        shutil.copyfile(run_dir / file, dest / file)
    sums = {k: v for k, v in _read_sums(Path(models)).items() if not k.startswith(f"{name}/")}
    sums.update({f"{name}/{file}": sha256(dest / file) for file in SHIPPED_FILES})
    (Path(models) / SUMS).write_text("".join(f"{d}  {n}\n" for n, d in sorted(sums.items())))
    return dest


class ShippedModelError(RuntimeError):
    pass


def load_shipped(name: str, device=None, models: Path | None = None):
    """(model, tokenizer, config dict, summary dict, history list) of the shipped model `name`, after
    checking every file against models/SHA256SUMS."""
    models = Path(models) if models is not None else models_dir()
    if not (models / SUMS).is_file():
        raise ShippedModelError(f"{models} holds no shipped models (no {SUMS} there): give the course's models "
                                "folder, or leave --models out")
    folder, sums = models / name, _read_sums(models)
    for file in SHIPPED_FILES:
        path, expected = folder / file, sums.get(f"{name}/{file}")
        if expected is None:
            raise ShippedModelError(f"models/{SUMS} has no checksum for {name}/{file}: is '{name}' a shipped "
                                    f"model? Shipped: {', '.join(shipped_models(models)) or 'none'}")
        if not path.is_file():
            raise ShippedModelError(f"models/{name}/{file} is missing: restore it with "
                                    f"`git checkout -- models/{name}`")
        if sha256(path) != expected:
            raise ShippedModelError(f"models/{name}/{file} does not match its SHA-256 in models/{SUMS} "
                                    f"(changed or damaged): restore it with `git checkout -- models/{name}`")
    info = json.loads((folder / "config.json").read_text())
    state = torch.load(folder / "model.fp16.pt", map_location="cpu", weights_only=True)
    model = _build(info, state, device)
    summary = json.loads((folder / "summary.json").read_text())
    history = json.loads((folder / "history.json").read_text())
    return model, bpe.load(folder), info, summary, history


def shipped_models(models: Path | None = None) -> list[str]:
    return sorted({n.split("/", 1)[0] for n in _read_sums(Path(models) if models is not None else models_dir())})
