"""Inputs for the checks' cases: random tensors and masks from an exercise's own generator.

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
