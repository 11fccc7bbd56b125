"""The course's one architecture figure: the encoder–decoder Transformer and its residual stream.

`draw_architecture(highlight=...)` draws the model of notebook 06 with matplotlib shapes (vector
patches and lines, no image files): token embeddings plus positions, N encoder layers
(self-attention, add & norm, feed-forward, add & norm), N decoder layers (masked self-attention,
cross-attention over the encoder's output, feed-forward, each with add & norm), the final norm of a
pre-norm stack, and the generator whose weight is tied to the target embedding. The residual
stream is the thick line each layer reads from and adds back into. `highlight` names the part a
notebook builds; the rest is drawn in grey.
"""
from __future__ import annotations

from dataclasses import dataclass

# The parts a notebook builds: notebook, title, and the kinds of blocks that are highlighted.
PARTS: dict[str, tuple[str, str, frozenset[str]]] = {
    "attention": ("02", "scaled dot-product attention", frozenset({"attention"})),
    "multihead": ("03", "multi-head attention", frozenset({"attention"})),
    "positions": ("04", "embeddings + positional encoding", frozenset({"embed"})),
    "layers": ("05", "masks, cross-attention, feed-forward, residuals and LayerNorm",
               frozenset({"masked", "cross", "ffn", "norm", "residual"})),
    "model": ("06", "the whole translator", frozenset({"attention", "masked", "cross", "ffn", "norm", "residual",
                                                      "embed", "final", "generator", "tokens", "stack"})),
}

# fill colours (the lecture's: attention orange, feed-forward blue, norm yellow)
COLOURS = {"attention": "#f6c28b", "masked": "#f6c28b", "cross": "#f4a582", "ffn": "#a9cbe8", "norm": "#f3eda0",
           "embed": "#f4b6c2", "final": "#f3eda0", "generator": "#c8e6c9", "tokens": "#ffffff"}
FADED_FILL, FADED_EDGE, FADED_TEXT = "#f3f3f3", "#b5b5b5", "#9a9a9a"
STREAM = "#3b6ea5"  # the residual stream


@dataclass(frozen=True)
class Block:
    """One box of the figure: its centre, size, text and kind (what decides its colour and highlight)."""

    x: float
    y: float
    w: float
    h: float
    text: str
    kind: str


def _blocks(enc: float = 2.7, dec: float = 8.3, w: float = 3.8) -> list[Block]:
    """The boxes, bottom to top; y grows upwards."""
    b = [
        Block(enc, 0.4, w, 0.45, "source tokens", "tokens"),
        Block(enc, 1.3, w, 0.6, "embedding × √d + positional encoding", "embed"),
        Block(enc, 2.85, w, 0.55, "multi-head self-attention\n(padding mask)", "attention"),
        Block(enc, 3.75, w, 0.4, "add & LayerNorm", "norm"),
        Block(enc, 4.65, w, 0.55, "feed-forward (FFN)", "ffn"),
        Block(enc, 5.55, w, 0.4, "add & LayerNorm", "norm"),
        Block(enc, 6.75, w, 0.4, "final LayerNorm (pre-norm only)", "final"),
        Block(dec, 0.4, w, 0.45, "target tokens, shifted right", "tokens"),
        Block(dec, 1.3, w, 0.6, "embedding × √d + positional encoding", "embed"),
        Block(dec, 2.85, w, 0.55, "masked multi-head self-attention\n(causal + padding mask)", "masked"),
        Block(dec, 3.75, w, 0.4, "add & LayerNorm", "norm"),
        Block(dec, 4.65, w, 0.55, "cross-attention: queries from here,\nkeys & values from the memory", "cross"),
        Block(dec, 5.55, w, 0.4, "add & LayerNorm", "norm"),
        Block(dec, 6.45, w, 0.55, "feed-forward (FFN)", "ffn"),
        Block(dec, 7.35, w, 0.4, "add & LayerNorm", "norm"),
        Block(dec, 8.55, w, 0.4, "final LayerNorm (pre-norm only)", "final"),
        Block(dec, 9.45, w, 0.55, "generator: linear (weight tied\nto the embedding) + softmax", "generator"),
        Block(dec, 10.45, w, 0.45, "next-token probabilities", "tokens"),
    ]
    return b


def draw_architecture(highlight: str | None = None, ax=None):
    """Draw the encoder–decoder Transformer; `highlight` ("attention", "multihead", "positions",
    "layers" or "model") colours the part a notebook builds and greys the rest (None: all in colour).
    Draws into `ax` (a new figure when None) and returns the axes."""
    if highlight is not None and highlight not in PARTS:
        raise ValueError(f"unknown highlight {highlight!r}: choose one of {', '.join(map(repr, PARTS))} (or None)")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    lit = set().union(*(kinds for _, _, kinds in PARTS.values())) if highlight is None else set(PARTS[highlight][2])
    if ax is None:
        _, ax = plt.subplots(figsize=(8.8, 8.2))
    ax.set_xlim(-0.6, 11.9)
    ax.set_ylim(-0.1, 11.5)
    ax.set_aspect("equal")
    ax.axis("off")

    def on(kind: str) -> bool:
        return kind in lit

    def arrow(x0, y0, x1, y1, kind="stack", colour="#333333", width=1.1, **kw):
        colour = colour if on(kind) else FADED_EDGE
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=11, color=colour,
                                     linewidth=width, shrinkA=0, shrinkB=0, zorder=2, **kw))

    enc, dec, w = 2.7, 8.3, 3.8
    # the two stacks: dashed frames with "N ×"
    for x, y0, h, label, side in ((enc, 2.3, 3.6, "encoder layer", -1), (dec, 2.3, 5.4, "decoder layer", 1)):
        edge = "#777777" if on("stack") else FADED_EDGE
        ax.add_patch(FancyBboxPatch((x - w / 2 - 0.35, y0), w + 0.7, h, boxstyle="round,pad=0.03,rounding_size=0.2",
                                    facecolor="none", edgecolor=edge, linewidth=1.0, linestyle="--", zorder=0))
        ax.text(x + w / 2 + 0.3, y0 + h + 0.05, label, ha="right", va="bottom", fontsize=8, style="italic",
                color="#444444" if on("stack") else FADED_TEXT)
        ax.text(x + side * (w / 2 + (0.75 if side < 0 else 0.45)), y0 + h / 2, "N ×", ha="right" if side < 0 else "left", va="center",
                fontsize=12, fontweight="bold", color="#222222" if on("stack") else FADED_TEXT)

    # the residual stream: a thick line beside each column, joining every add & norm
    stream_on = on("residual")
    for x, rows in ((enc, [(2.2, 3.75), (3.95, 5.55)]), (dec, [(2.2, 3.75), (3.95, 5.55), (5.75, 7.35)])):
        for y0, y1 in rows:
            xs = x - w / 2 - 0.2
            colour = STREAM if stream_on else FADED_EDGE
            width = 2.6 if stream_on else 1.2
            ax.plot([x, x, xs, xs], [y0 - 0.05, y0, y0, y1], color=colour, linewidth=width, zorder=1,
                    solid_capstyle="round")
            arrow(xs, y1, x - w / 2, y1, kind="residual", colour=STREAM, width=width)
    ax.text(enc - w / 2 - 0.27, 4.65, "residual stream", rotation=90, ha="right", va="center", fontsize=7.5,
            color=STREAM if stream_on else FADED_TEXT)

    for b in _blocks(enc, dec, w):
        lit_block = on(b.kind)
        fill = COLOURS[b.kind] if lit_block else FADED_FILL
        edge = "#222222" if lit_block else FADED_EDGE
        width = 2.0 if lit_block and highlight not in (None, "model") else 1.0
        ax.add_patch(FancyBboxPatch((b.x - b.w / 2, b.y - b.h / 2), b.w, b.h,
                                    boxstyle="round,pad=0.02,rounding_size=0.1", facecolor=fill, edgecolor=edge,
                                    linewidth=width, zorder=3))
        ax.text(b.x, b.y, b.text, ha="center", va="center", fontsize=7.5, zorder=4,
                color="#111111" if lit_block else FADED_TEXT)

    # the data path, bottom to top
    for x, stops in ((enc, [0.625, 1.0, 1.6, 2.575, 3.125, 3.55, 3.95, 4.375, 4.925, 5.35, 5.75, 6.55]),
                     (dec, [0.625, 1.0, 1.6, 2.575, 3.125, 3.55, 3.95, 4.375, 4.925, 5.35, 5.75, 6.175,
                            6.725, 7.15, 7.55, 8.35, 8.75, 9.175, 9.725, 10.225])):
        for y0, y1 in zip(stops[::2], stops[1::2], strict=True):
            arrow(x, y0, x, y1, kind="stack")
    # the memory: the encoder's output feeds every decoder layer's cross-attention (keys and values)
    ax.plot([enc, enc], [6.95, 7.6], color="#333333" if on("cross") else FADED_EDGE, linewidth=1.1, zorder=2)
    ax.text(enc, 7.8, "memory", ha="center", va="bottom", fontsize=8.5, style="italic",
            color="#222222" if on("cross") else FADED_TEXT)
    arrow(enc + 0.05, 7.6, dec - w / 2, 4.65, kind="cross", connectionstyle="arc3,rad=-0.25")
    # the tied weight: the generator reuses the target embedding's matrix
    tied_on = on("generator")
    tied = "#2e7d32" if tied_on else FADED_EDGE
    xt = dec + w / 2 + 1.25
    ax.plot([dec + w / 2, xt, xt, dec + w / 2], [9.45, 9.45, 1.3, 1.3], color=tied, linestyle=":", linewidth=1.3,
            zorder=1)
    ax.text(xt + 0.1, 9.0, "tied\nweight", ha="left", va="center", fontsize=7.5,
            color=tied if tied_on else FADED_TEXT)
    if highlight is None:
        title = "The encoder–decoder Transformer (notebooks 02–06)"
    else:
        notebook, what, _ = PARTS[highlight]
        title = f"The encoder–decoder Transformer\nnotebook {notebook}: {what}"
    ax.set_title(title, fontsize=10.5, fontweight="bold")
    return ax
