"""The architecture figure: every chapter's highlight draws (vector shapes, the highlighted blocks in
colour and the rest grey), no highlight draws everything in colour, an unknown name is refused with
the allowed ones listed, and it draws into a given axes."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import FancyBboxPatch

from attention_course.architecture import COLOURS, FADED_FILL, PARTS, draw_architecture


def _boxes(ax) -> dict[str, str]:
    """The text of each block -> its fill colour (the stack frames have no fill and no text of their own)."""
    boxes = [p for p in ax.patches if isinstance(p, FancyBboxPatch) and p.get_fill() and p.get_facecolor()[3] > 0]
    texts = {(round(t.get_position()[0], 3), round(t.get_position()[1], 3)): t.get_text() for t in ax.texts}
    found = {}
    for box in boxes:
        x = box.get_x() + box.get_width() / 2
        y = box.get_y() + box.get_height() / 2
        label = texts.get((round(x, 3), round(y, 3)))
        if label is not None:
            found.setdefault(label, set()).add(to_hex(box.get_facecolor()))
    return found


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_every_part_draws_and_highlights_its_blocks(ax):
    expected = {  # a block the chapter builds, and one it does not
        "attention": ("multi-head self-attention\n(padding mask)", "feed-forward (FFN)"),
        "multihead": ("multi-head self-attention\n(padding mask)", "add & LayerNorm"),
        "positions": ("embedding × √d + positional encoding", "feed-forward (FFN)"),
        "layers": ("add & LayerNorm", "embedding × √d + positional encoding"),
        "model": ("generator: linear (weight tied\nto the embedding) + softmax", None),
    }
    assert set(expected) == set(PARTS)
    for part, (lit, grey) in expected.items():
        ax.clear()
        assert draw_architecture(highlight=part, ax=ax) is ax
        boxes = _boxes(ax)
        assert len(boxes) == 11, boxes  # distinct blocks (the add & norms share a text)
        assert FADED_FILL not in boxes[lit], (part, lit)
        if grey is not None:
            assert boxes[grey] == {FADED_FILL}, (part, grey)
        notebook = PARTS[part][0]
        assert f"notebook {notebook}" in ax.get_title()


def test_the_figure_names_the_whole_model(ax):
    draw_architecture(ax=ax)
    text = " ".join(t.get_text() for t in ax.texts)
    for part in ("source tokens", "positional encoding", "multi-head self-attention", "add & LayerNorm",
                 "feed-forward", "masked multi-head self-attention", "cross-attention", "final LayerNorm",
                 "generator", "tied", "residual stream", "N ×", "memory"):
        assert part in text, part
    assert FADED_FILL not in set().union(*_boxes(ax).values()), "without a highlight everything is in colour"
    assert to_hex(COLOURS["cross"]) in set().union(*_boxes(ax).values())


def test_unknown_highlight_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError) as err:
        draw_architecture(highlight="decoder")
    message = str(err.value)
    assert "'decoder'" in message
    for part in PARTS:
        assert repr(part) in message


def test_draws_a_new_figure_when_no_axes_is_given():
    ax = draw_architecture(highlight="positions")
    try:
        assert ax.figure is not None and len(ax.patches) > 20
        assert not ax.images, "vector shapes only, no raster image"
    finally:
        plt.close(ax.figure)


@pytest.mark.parametrize("notebook,part", [("02_queries_keys_values", "attention"),
                                           ("03_multi_head_attention", "multihead"),
                                           ("04_positional_encoding", "positions"),
                                           ("05_masked_cross_attention", "layers"),
                                           ("06_transformer_translator", "model")])
def test_the_notebooks_show_their_part_near_the_top(notebook, part):
    """The figure sits among a chapter's first cells, highlighting that chapter's part, with a caption above."""
    import json
    from pathlib import Path

    cells = json.loads((Path(__file__).resolve().parents[1] / "solutions" / notebook / f"{notebook}.ipynb")
                       .read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    at = [i for i, s in enumerate(sources) if "draw_architecture(" in s]
    assert len(at) == 1 and at[0] < 8, at
    assert f'draw_architecture(highlight="{part}")' in sources[at[0]]
    assert cells[at[0] - 1]["cell_type"] == "markdown" and "Where this notebook sits" in sources[at[0] - 1]
