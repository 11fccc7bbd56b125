"""Inputs for the checks' cases: random tensors and masks from an exercise's own generator, the
marker that stands for PyTorch's own implementation, and the few steps the cases take with the
student's code where it runs (load the hidden weights, backpropagate).

Not secret (the sandbox may import it): it says how inputs are drawn, not what is expected."""
from __future__ import annotations

import numpy as np
import torch
import torch.ao.nn.quantizable as quantizable
import torch.nn.functional as F
from torch import nn

from .core import ByName

RANDOM_COLUMN = "random"  # random_mask's keep_column: a column drawn from the generator after the mask
# the honesty rule of an exercise that writes attention's step itself (notebook 08: 07 names its own)
FUSED_ATTENTION = ((F.scaled_dot_product_attention,
                    "it calls torch.nn.functional.scaled_dot_product_attention, PyTorch's fused attention; this "
                    "exercise asks you to write the attention step yourself"),)
# Every public entry to PyTorch's own attention. Any of them does the work of an exercise that writes a part of
# attention: one answer to notebook 02 took softmax(q k^T / sqrt(d)), masked, from the weights
# F.multi_head_attention_forward returns (identity projections, need_weights=True) and scored full marks.
TORCH_ATTENTION = (
    (F.scaled_dot_product_attention, "torch.nn.functional.scaled_dot_product_attention"),
    (F.multi_head_attention_forward, "torch.nn.functional.multi_head_attention_forward"),
    (nn.MultiheadAttention.forward, "torch.nn.MultiheadAttention"),
    # a whole attention of its own in Python (not nn.MultiheadAttention's forward), reachable without its name
    # through the quantization's default module mapping: it took notebook 02's and 03's points unflagged
    (quantizable.MultiheadAttention.forward, "torch.ao.nn.quantizable.MultiheadAttention"),
    (quantizable.MultiheadAttention._forward_impl, "torch.ao.nn.quantizable.MultiheadAttention"),
    (nn.TransformerEncoderLayer.forward, "torch.nn.TransformerEncoderLayer"),
    (nn.TransformerDecoderLayer.forward, "torch.nn.TransformerDecoderLayer"),
    (nn.TransformerEncoder.forward, "torch.nn.TransformerEncoder"),
    (nn.TransformerDecoder.forward, "torch.nn.TransformerDecoder"),
    (nn.Transformer.forward, "torch.nn.Transformer"),
    (ByName("torch.nn.attention.flex_attention", "flex_attention"), "torch.nn.attention.flex_attention"),
)
TORCH_ATTENTION_WHY = ("it calls {name}, PyTorch's own attention, which does this exercise's work; write the "
                       "attention yourself, from the course's parts of the earlier notebooks")


def torch_attention(*own: tuple, allowed: tuple = ()) -> tuple:
    """The honesty entries of an exercise that writes a part of attention: `own` (the built-ins it re-implements,
    with messages of their own), then every other entry of TORCH_ATTENTION but those `allowed` (a built-in the
    course's own library calls where the exercise's code runs, or one that does none of the exercise's work)."""
    named = {id(func) for func, _ in own} | {id(func) for func in allowed}
    return (*own, *((func, TORCH_ATTENTION_WHY.format(name=name)) for func, name in TORCH_ATTENTION
                    if id(func) not in named))


def tensor(rng: np.random.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    """A float32 tensor of normal samples."""
    return torch.from_numpy(rng.normal(scale=scale, size=shape).astype(np.float32))


def as_float32(array) -> torch.Tensor:
    """A float32 tensor holding `array` (numbers, nested lists or a numpy array), copied."""
    return torch.tensor(np.asarray(array), dtype=torch.float32)


def random_mask(rng: np.random.Generator, *shape, p_keep: float = 0.6,
                keep_column: int | str | None = 0) -> torch.Tensor:
    """A boolean mask (True = may attend); keep_column stays True so no row is empty (RANDOM_COLUMN:
    one column drawn from `rng` after the mask; None: rows may be empty)."""
    m = torch.from_numpy(rng.uniform(size=shape) < p_keep)
    if isinstance(keep_column, str) and keep_column == RANDOM_COLUMN:
        keep_column = rng.integers(shape[-1])
    if keep_column is not None:
        m[..., keep_column] = True
    return m


def causal(T: int) -> torch.Tensor:
    """[T, T] lower-triangular boolean mask: position i may attend to 0..i."""
    return torch.tril(torch.ones(T, T, dtype=torch.bool))


def shape_text(t) -> str:
    """A tensor's shape as a case's description writes it: '[2, 5, 8]'."""
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def two_outputs(result) -> tuple | None:
    """(output, weights) from a layer's call; None when it returned anything else, to be compared as it is ("expected
    a tuple of 2 values"): unpacked, a lone [2, ...] output split into two and said "expected shape (2, 5, 6), got
    shape (5, 6)" (a mutation test's finding)."""
    return tuple(result) if isinstance(result, (tuple, list)) and len(result) == 2 else None


def backpropagate(out, weights) -> None:
    """Backpropagate a fixed random linear function of the output and the weights."""
    g = torch.Generator().manual_seed(0)
    loss = (out * torch.randn(out.shape, generator=g)).sum() + (weights * torch.randn(weights.shape, generator=g)).sum()
    if loss.requires_grad:
        loss.backward()


def calls_of_one_layer(layer: nn.Module, calls) -> tuple:
    """`layer` called on each tuple of `calls` in turn (copies of the tensors, without gradients): the results of all.
    A layer that keeps something of its first call (keys projected once) answers the second one wrongly. The copies
    are kept alive to the end, so that no two inputs share an address."""
    inputs = [tuple(t.clone() for t in call) for call in calls]
    with torch.no_grad():
        return tuple(layer(*args) for args in inputs)


def require_names(module: nn.Module, names) -> dict:
    """The module's state dict, once its parameters are named as the notebook asks (`names`; extra buffers
    are fine); else an AttributeError that lists the missing and the unexpected names."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(module).__name__}")
    own = module.state_dict()
    params = {name for name, _ in module.named_parameters()}
    missing = sorted(set(names) - set(own))
    unexpected = sorted(params - set(names))
    if missing or unexpected:
        raise AttributeError(
            "the module's parameters do not have the names this notebook asks for"
            + (f"; missing: {', '.join(missing[:6])}" if missing else "")
            + (f"; unexpected: {', '.join(unexpected[:6])}" if unexpected else ""))
    return own


def load_state(module: nn.Module, state: dict, check_shapes: bool = True) -> nn.Module:
    """Load `state` into the student's module and put it in evaluation mode, with a message naming the
    expected attributes (and, with check_shapes, the expected shapes; without, a wrong shape is left to
    PyTorch's own load_state_dict error). Extra buffers (a cached mask, say) are fine."""
    own = require_names(module, state)
    if check_shapes:
        wrong = [f"{k} is {tuple(own[k].shape)}, expected {tuple(v.shape)}" for k, v in state.items()
                 if tuple(own[k].shape) != tuple(v.shape)]
        if wrong:
            raise AttributeError("the module's parameters have the wrong shapes: " + "; ".join(wrong[:4]))
    module.load_state_dict(state, strict=False)
    return module.eval()


def load_weights(module: nn.Module, state: dict) -> nn.Module:
    """Copy `state` (clones) into the student's module strictly, so a missing, extra or mis-shaped parameter
    gets PyTorch's own error (the grader turns it into one line), and put it in evaluation mode. Buffers of
    the student's own (a causal mask kept with register_buffer) keep their values: the specification does
    not name them, and they are no mistake."""
    buffers = {name for name, _ in module.named_buffers()} if isinstance(module, nn.Module) else set()
    own = {k: v for k, v in module.state_dict().items() if k in buffers and k not in state} if buffers else {}
    module.load_state_dict({**own, **{k: v.clone() for k, v in state.items()}})
    return module.eval()


class Builtin:
    """Stands for PyTorch's own implementation where an exercise is compared with it (the case
    runs PyTorch when it is handed this marker). `__module__` names the notebook's reference
    module, which is what the grader's static honesty check looks for."""

    def __init__(self, name: str, module: str):
        self.name = name
        self.__module__ = module

    def __repr__(self) -> str:
        return self.name
