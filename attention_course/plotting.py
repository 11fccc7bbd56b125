"""Small plotting helpers shared by the notebooks and the grading report."""
from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np


def heatmap(
    matrix,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    title: str = "",
    ax=None,
    annotate: bool = True,
    fmt: str = "{:.2f}",
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    colorbar_label: str = "",
):
    """Draw `matrix` [rows, cols] as a labelled heatmap; numbers in the cells when it is small; `colorbar_label`
    says what the colours measure."""
    m = np.asarray(getattr(matrix, "detach", lambda: matrix)(), dtype=float)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(0.6 * m.shape[1] + 2.0, 0.5 * m.shape[0] + 1.5))
    image = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax)
    if row_labels is not None:
        ax.set_yticks(range(m.shape[0]), labels=list(row_labels))
    if col_labels is not None:
        ax.set_xticks(range(m.shape[1]), labels=list(col_labels), rotation=45, ha="right")
    if annotate and m.size <= 144:
        for (i, j), value in np.ndenumerate(m):
            r, g, b, _ = image.cmap(image.norm(value))
            light = 0.299 * r + 0.587 * g + 0.114 * b > 0.5  # text that reads on any colormap
            ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=8,
                    color="black" if light else "white")
    if title:
        ax.set_title(title)
    plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=colorbar_label or None)
    return ax
