"""Inputs for the checks' cases: random tensors and masks from an exercise's own generator, and
the marker that stands for PyTorch's own implementation.

Not secret (the sandbox may import it): it says how inputs are drawn, not what is expected."""
from __future__ import annotations

import numpy as np
import torch


def tensor(rng: np.random.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    """A float32 tensor of normal samples."""
    return torch.from_numpy(rng.normal(scale=scale, size=shape).astype(np.float32))


def random_mask(rng: np.random.Generator, *shape, p_keep: float = 0.6, keep_column: int | None = 0) -> torch.Tensor:
    """A boolean mask (True = may attend); keep_column stays True so no row is empty."""
    m = torch.from_numpy(rng.uniform(size=shape) < p_keep)
    if keep_column is not None:
        m[..., keep_column] = True
    return m


def causal(T: int) -> torch.Tensor:
    """[T, T] lower-triangular boolean mask: position i may attend to 0..i."""
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


class Builtin:
    """Stands for PyTorch's own implementation where an exercise is compared with it (the case
    runs PyTorch when it is handed this marker). `__module__` names the notebook's reference
    module, which is what the grader's static honesty check looks for."""

    def __init__(self, name: str, module: str):
        self.name = name
        self.__module__ = module

    def __repr__(self) -> str:
        return self.name
