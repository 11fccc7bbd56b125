"""The book's architecture figure: the encoder–decoder Transformer, drawn with matplotlib.

Each block names the chapter where the reader builds it. Written as SVG with the text turned into
paths (no font to load in the browser) and without a date, so a rebuild gives the same file.
"""
from __future__ import annotations

from pathlib import Path

ALT = ("The encoder-decoder Transformer. Left, the encoder: source tokens, embedding plus positional "
       "encoding (chapter 04), then N encoder layers of multi-head self-attention (chapters 02-03) and a "
       "feed-forward network, each followed by add & layer norm (chapter 05). Right, the decoder: target "
       "tokens shifted right, embedding plus positional encoding, then N decoder layers of masked "
       "multi-head self-attention (chapter 05), cross-attention whose keys and values come from the "
       "encoder's output (chapter 05), and a feed-forward network, each with add & layer norm; then a "
       "linear layer and a softmax give the next token's probabilities, decoded greedily, by beam search "
       "or by sampling (chapter 06).")

# colours of the blocks (the lecture's: attention orange, feed-forward blue, norm yellow)
ATTENTION, FEED_FORWARD, NORM, EMBED, OUTPUT = "#f6c28b", "#a9cbe8", "#f3eda0", "#f4b6c2", "#c8e6c9"


def draw_architecture(path: str | Path) -> Path:
    """Draw the figure into `path` (.svg or .png) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    path = Path(path)
    with plt.rc_context({"svg.fonttype": "path", "svg.hashsalt": "attention-step-by-step",
                         "font.family": "DejaVu Sans", "font.size": 10}):
        fig, ax = plt.subplots(figsize=(9.0, 8.4))
        ax.set_xlim(0, 10.2)
        ax.set_ylim(0, 11.6)
        ax.axis("off")

        def box(x, y, w, h, text, colour, size=9.5):
            ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.12",
                                        facecolor=colour, edgecolor="#333333", linewidth=1.1))
            ax.text(x, y, text, ha="center", va="center", fontsize=size)

        def arrow(x0, y0, x1, y1, **kw):
            ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=12,
                                         color="#333333", linewidth=1.1, shrinkA=0, shrinkB=0, **kw))

        def stack(x, y0, h, label, n_side):
            ax.add_patch(FancyBboxPatch((x - 1.85, y0), 3.7, h, boxstyle="round,pad=0.05,rounding_size=0.2",
                                        facecolor="#f2f2f2", edgecolor="#777777", linewidth=1.0, linestyle="--"))
            ax.text(x - 1.75, y0 + h - 0.22, label, ha="left", va="center", fontsize=10, fontweight="bold")
            side = -1 if n_side == "left" else 1
            ax.text(x + side * 2.0, y0 + h / 2, "N ×", ha="right" if side < 0 else "left", va="center",
                    fontsize=12, fontweight="bold")

        enc, dec = 2.6, 7.6
        w = 3.3
        # ---- encoder
        box(enc, 0.45, w, 0.5, "source tokens (“a man rides a bike”)", "#ffffff", 8.5)
        arrow(enc, 0.7, enc, 1.1)
        box(enc, 1.4, w, 0.6, "embedding + positional encoding\n(04)", EMBED, 8.5)
        stack(enc, 2.2, 4.3, "Encoder layer", "left")
        arrow(enc, 1.7, enc, 2.5)
        box(enc, 2.8, w, 0.6, "multi-head self-attention\n(02, 03)", ATTENTION, 8.5)
        box(enc, 3.7, w, 0.45, "add & layer norm (05)", NORM, 8.5)
        box(enc, 4.65, w, 0.6, "feed-forward\n(05)", FEED_FORWARD, 8.5)
        box(enc, 5.55, w, 0.45, "add & layer norm (05)", NORM, 8.5)
        for y0, y1 in ((3.1, 3.475), (3.925, 4.35), (4.95, 5.325)):
            arrow(enc, y0, enc, y1)
        arrow(enc, 5.775, enc, 7.05)
        box(enc, 7.3, w, 0.5, "memory (the encoder's output)", "#ffffff", 8.5)

        # ---- decoder
        box(dec, 0.45, w, 0.5, "target tokens so far (shifted right)", "#ffffff", 8.5)
        arrow(dec, 0.7, dec, 1.1)
        box(dec, 1.4, w, 0.6, "embedding + positional encoding\n(04)", EMBED, 8.5)
        stack(dec, 2.2, 6.0, "Decoder layer", "right")
        arrow(dec, 1.7, dec, 2.5)
        box(dec, 2.8, w, 0.6, "masked multi-head self-attention\n(05: the causal mask)", ATTENTION, 8.5)
        box(dec, 3.7, w, 0.45, "add & layer norm", NORM, 8.5)
        box(dec, 4.65, w, 0.6, "cross-attention (05)\nkeys & values from the memory", ATTENTION, 8.5)
        box(dec, 5.55, w, 0.45, "add & layer norm", NORM, 8.5)
        box(dec, 6.45, w, 0.6, "feed-forward", FEED_FORWARD, 8.5)
        box(dec, 7.35, w, 0.45, "add & layer norm", NORM, 8.5)
        for y0, y1 in ((3.1, 3.475), (3.925, 4.35), (4.95, 5.325), (5.775, 6.15), (6.75, 7.125)):
            arrow(dec, y0, dec, y1)
        arrow(dec, 7.575, dec, 8.775)
        box(dec, 9.05, w, 0.55, "linear + softmax", OUTPUT, 9)
        arrow(dec, 9.325, dec, 9.925)
        box(dec, 10.25, w, 0.65, "next-token probabilities → greedy,\nbeam search or sampling (06)", "#ffffff", 8.5)

        # the memory feeds every decoder layer's cross-attention
        arrow(enc + w / 2, 7.3, dec - w / 2, 4.65, connectionstyle="arc3,rad=-0.3")
        ax.text(5.0, 6.35, "keys &\nvalues", ha="center", va="center", fontsize=8.5, style="italic")

        ax.text(5.1, 11.35, "The encoder–decoder Transformer (notebooks 02–06)", ha="center", va="center",
                fontsize=13, fontweight="bold")
        ax.text(enc, 9.4, "Notebook 07 makes the same attention\ncheap at scale: KV cache, grouped-query\n"
                "and latent attention, rotary positions,\nonline softmax, sliding windows.",
                ha="center", va="center", fontsize=8.5, color="#444444")

        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"Date": None} if path.suffix == ".svg" else None
        fig.savefig(path, bbox_inches="tight", metadata=metadata, dpi=150)
        plt.close(fig)
    return path
