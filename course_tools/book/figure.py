"""The book's architecture figure: the course's own (attention_course/architecture.py), drawn whole.

Written as SVG with the text turned into
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
       "or by sampling (chapter 06). The drawing is the paper's post-norm layout; with norm_first=True (as "
       "the course's GPU recipe trains) each sublayer normalizes its input instead, and a final layer norm, "
       "drawn at the top of each stack, ends the encoder and the decoder.")

def draw_architecture(path: str | Path) -> Path:
    """Draw the course's one figure (attention_course/architecture.py, the one notebooks 02-06 show
    with their part in colour), all of it in colour, into `path` (.svg or .png) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention_course.architecture import draw_architecture as draw

    path = Path(path)
    with plt.rc_context({"svg.fonttype": "path", "svg.hashsalt": "attention-step-by-step",
                         "font.family": "DejaVu Sans", "font.size": 10}):
        ax = draw(highlight=None)
        fig = ax.figure
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"Date": None} if path.suffix == ".svg" else None
        fig.savefig(path, bbox_inches="tight", metadata=metadata, dpi=150)
        plt.close(fig)
    return path
