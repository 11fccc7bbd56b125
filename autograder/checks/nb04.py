"""Checks for notebook 04, "Positional encoding" (PyTorch)."""
from __future__ import annotations

import numpy as np
import torch

from attention_course import positional as ref

from .core import Case, Exercise, Mistake, keeps_inputs, make_checker, numbers, raises_value_error, reference_guard
from .tensors import tensor

HONESTY = tuple(reference_guard(ref))
# float32 tables: a correct implementation may compute angles in float32 (error ~ pos * 1e-7).
RTOL, ATOL = 1e-4, 1e-4


# --------------------------------------------------------------------------- cases
def _table_cases(rng):
    return [Case(f"sinusoidal_positional_encoding({n}, {d})", lambda f, n=n, d=d: f(n, d))
            for n, d in [(50, 16), (128, 64), (20, 6), (8, 2), (1, 4)]]


def _odd_cases(rng):
    return [Case(f"sinusoidal_positional_encoding({n}, {d}) with an odd d_model must raise ValueError "
                 "(True = it did)", lambda f, n=n, d=d: raises_value_error(lambda: f(n, d)))
            for n, d in [(10, 7), (4, 1), (30, 33)]] + [
        # so that a function that always raises ValueError does not earn this check
        Case("sinusoidal_positional_encoding(10, 8): an even d_model must NOT raise ValueError (True = it did)",
             lambda f: raises_value_error(lambda: f(10, 8)))]


def _with_table(cls, d, max_len, table, x):
    """forward only: the module's buffer is overwritten with the correct `table` first (a no-op for a
    correct module), so a wrong sinusoidal_positional_encoding does not hide a wrong forward."""
    m = cls(d, max_len=max_len).eval()
    with torch.no_grad():
        m.pe.copy_(table)
    return m(x.clone())


def _module_cases(rng):
    x = tensor(rng, 3, 11, 16)
    table = ref.sinusoidal_positional_encoding(60, 16)
    cases = [
        Case("PositionalEncoding(16, max_len=60) on x of shape [B=3, T=11, 16] (with the correct table "
             "copied into the buffer pe first: this case tests forward alone)",
             lambda cls, x=x, table=table: _with_table(cls, 16, 60, table, x)),
        Case("PositionalEncoding(12, max_len=30).pe, the table your __init__ built (with your "
             "sinusoidal_positional_encoding): shape [max_len, d_model] ([1, max_len, d_model], the Annotated "
             "Transformer's, is taken too)",
             lambda cls: cls(12, max_len=30).pe, derive=_table_of),
    ]
    for (B, T, d, max_len) in [(3, 11, 16, 60), (2, 5, 8, None), (1, 7, 32, 40), (4, 4, 8, 20), (2, 12, 6, 12)]:
        x = tensor(rng, B, T, d)
        kwargs = {} if max_len is None else {"max_len": max_len}
        desc = (f"PositionalEncoding({d}{'' if max_len is None else f', max_len={max_len}'}) "
                f"on x of shape [B={B}, T={T}, {d}]")
        cases.append(Case(desc, lambda cls, x=x, d=d, kw=kwargs: cls(d, **kw).eval()(x.clone())))

    cases.append(keeps_inputs("PositionalEncoding(8, max_len=20) in evaluation mode on x of shape [B=2, T=5, 8]",
                              lambda cls, x: cls(8, max_len=20).eval()(x), tensor(rng, 2, 5, 8)))

    def buffers_and_parameters(cls):
        m = cls(12, max_len=30)
        return [str(name) for name, _ in m.named_buffers()], len(list(m.parameters()))

    cases.append(Case("PositionalEncoding(12, max_len=30): is `pe` a buffer, and are there no trainable "
                      "parameters? ([buffer, no parameters])", buffers_and_parameters, derive=_buffer_flags))
    x, upstream = tensor(rng, 2, 6, 8), tensor(rng, 2, 6, 8)
    cases.append(Case("PositionalEncoding(8, max_len=20) in evaluation mode on x of shape [B=2, T=6, 8] that requires "
                      "grad, backpropagating a random linear function of the output (returns the output and x.grad: "
                      "the gradient must reach x, or the embeddings below never learn)",
                      lambda cls, x=x, u=upstream: _gradient_to_x(cls, x, u), tells=(CUT_OFF,)))
    return cases


def _gradient_to_x(cls, x, upstream):
    """Runs in the sandbox: (output, x.grad) after backpropagating sum(output * upstream). An output that does not
    require grad (computed under torch.no_grad(), or from x.detach()) is not backpropagated: x.grad is then None, and
    the judge says so, where backward() would raise PyTorch's "element 0 of tensors does not require grad"."""
    xx = x.clone().requires_grad_()
    out = cls(8, max_len=20).eval()(xx)
    if isinstance(out, torch.Tensor) and out.requires_grad:
        (out * upstream).sum().backward()
    return out, xx.grad


def _max_len_cases(rng):
    return [
        Case("PositionalEncoding(8, max_len=10) on x of shape [2, 11, 8] must raise ValueError (True = it did)",
             lambda cls: raises_value_error(lambda: cls(8, max_len=10)(torch.zeros(2, 11, 8)))),
        Case("PositionalEncoding(6, max_len=3) on x of shape [1, 40, 6] must raise ValueError (True = it did)",
             lambda cls: raises_value_error(lambda: cls(6, max_len=3)(torch.zeros(1, 40, 6)))),
        Case("PositionalEncoding(8, max_len=10) on x of shape [3, 10, 8]: T == max_len is allowed, "
             "so it must NOT raise ValueError (True = it did)",
             lambda cls: raises_value_error(lambda: cls(8, max_len=10)(torch.zeros(3, 10, 8)))),
    ]


def _table_of(pe):
    """derive (trusted side) for the `pe` case: a table kept with a leading batch axis of 1 ([1, max_len, d_model],
    as the Annotated Transformer keeps it, adding pe[:, :T]) is the same table; anything else is compared as it is."""
    if isinstance(pe, torch.Tensor) and pe.dim() == 3 and pe.shape[0] == 1:
        return pe[0]
    return pe


def _buffer_flags(result) -> np.ndarray:
    """derive (trusted side): (buffer names, number of parameter tensors) -> [pe is a buffer, no parameters]."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"expected (buffer names, number of parameters), got {type(result).__name__}")
    names, n_params = result
    if not isinstance(names, (list, tuple)) or isinstance(n_params, bool) or not isinstance(n_params, int):
        raise TypeError("expected (a list of buffer names, a number of parameters)")
    return np.array(["pe" in names, n_params == 0])


def _dropout_outputs(cls, x, p):
    """Runs in the sandbox: the module's outputs only (eval, eval again, train); the four answers
    are decided from them by _dropout_flags, in the trusted process."""
    B, T, d = x.shape
    m = cls(d, max_len=T + 5, dropout=p)
    m.eval()
    clean, clean_again = m(x.clone()), m(x.clone())
    m.train()
    noisy = m(x.clone())
    return clean, clean_again, noisy


def _dropout_flags(p: float):
    """derive (trusted side) for the dropout cases: (clean, clean_again, noisy) -> [training mode
    changes the output, kept entries are (x + pe) / (1 - p), about a fraction p is zeroed, evaluation
    mode drops nothing]. p comes from the case itself, not from the sandbox."""
    def flags(result) -> np.ndarray:
        if not isinstance(result, (tuple, list)) or len(result) != 3:
            raise TypeError(f"expected the module's three outputs, got {type(result).__name__}")
        clean, clean_again, noisy = (numbers(v, what) for v, what in
                                     zip(result, ("evaluation mode", "evaluation mode (2nd call)", "training mode"), strict=True))
        same_shape = clean.shape == noisy.shape
        kept = noisy != 0
        dropped = 1.0 - float(kept.mean()) if kept.size else 1.0
        scaled = same_shape and bool(np.allclose(noisy[kept], clean[kept] / (1.0 - p), rtol=1e-4, atol=1e-5))
        eval_untouched = (clean.shape == clean_again.shape and bool(np.array_equal(clean, clean_again))
                          and bool((clean != 0).all()))
        active = not (same_shape and bool(np.array_equal(noisy, clean)))
        return np.array([active, scaled, abs(dropped - p) < 0.04, eval_untouched])

    return flags


def _dropout_cases(rng):
    cases = []
    for p, shape in [(0.3, (8, 40, 32)), (0.5, (4, 50, 48)), (0.0, (2, 9, 8))]:
        x = tensor(rng, *shape)
        cases.append(Case(f"dropout={p}, x of shape {list(shape)}; the four answers: [training mode changes "
                          f"the output, kept entries are (x + pe) / (1 - p), about a fraction p = {p} is zeroed, "
                          f"evaluation mode drops nothing]",
                          lambda cls, x=x, p=p: _dropout_outputs(cls, x, p), derive=_dropout_flags(p)))
    return cases


def _shift_cases(rng):
    return [Case(f"pe_shift_matrix({k}, {d})", lambda f, k=k, d=d: f(k, d))
            for k, d in [(1, 8), (5, 16), (37, 32), (0, 6), (12, 10), (2, 2), (-3, 8), (-20, 12)]]


# --------------------------------------------------------------------------- mistakes
_TABLE_HEAD = """
def sinusoidal_positional_encoding(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
"""


def _table(body: str) -> str:
    return _TABLE_HEAD + body


def _table_unchecked(body: str) -> str:
    return _TABLE_HEAD.replace("""    if d_model % 2:
        raise ValueError("d_model must be even")
""", "") + body


TABLE_MISTAKES = (
    Mistake("sin and cos swapped (cos in the even columns, sin in the odd ones)",
            "the paper puts sin in the even columns 2i and cos in the odd columns 2i+1",
            _table("""
    angle = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.cos(angle)
    pe[:, 1::2] = torch.sin(angle)
    return pe.float()
""")),
    Mistake("exponent i/d_model instead of 2i/d_model (i = the pair's index)",
            "pair i uses 10000^(2i/d_model), where 2i is the index of its even column: "
            "use torch.arange(0, d_model, 2) / d_model",
            _table("""
    angle = pos / 10000 ** (torch.arange(d_model // 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()
""")),
    Mistake("exponent taken from the column index j, so the cos column 2i+1 uses (2i+1)/d_model",
            "both columns of a pair share one frequency, 10000^(2i/d_model): the cos column 2i+1 uses 2i, not 2i+1",
            _table("""
    j = torch.arange(d_model, dtype=torch.float64)
    angle = pos / 10000 ** (j / d_model)
    return torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle)).float()
""")),
    Mistake("sines in the first half and cosines in the second (concatenated, not interleaved)",
            "interleave: pe[:, 0::2] = sin(...), pe[:, 1::2] = cos(...)",
            _table("""
    angle = pos / 10000 ** (two_i / d_model)
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()
""")),
    Mistake("multiplied by 10000^(2i/d_model) instead of dividing",
            "the angle is pos / 10000^(2i/d_model): the frequencies get *slower* to the right",
            _table("""
    angle = pos * 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()
""")),
    Mistake("positions counted from 1 instead of 0",
            "the first position is pos = 0: torch.arange(max_len)",
            _table("""
    angle = (pos + 1) / 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()
""")),
    Mistake("returned a float64 tensor",
            "the course works in float32: return table.float() (or build it with dtype=torch.float32)",
            _table("""
    angle = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe
""")),
    Mistake("returned a numpy array instead of a torch tensor",
            "build the table with torch (or convert: torch.from_numpy(table).float())",
            """
def sinusoidal_positional_encoding(max_len, d_model):
    if d_model % 2:
        raise ValueError("d_model must be even")
    pos = np.arange(max_len)[:, None]
    angle = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((max_len, d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle)
    return pe
"""),
)

ODD_MISTAKES = (
    Mistake("no ValueError for an odd d_model",
            "check `d_model % 2` first and raise ValueError(...) when it is 1",
            _table_unchecked("""
    angle = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()
""")),
)

_MODULE_INIT = """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_positional_encoding(max_len, d_model))
"""
_CHECK = """
        if x.size(1) > self.pe.size(0):
            raise ValueError("too long")
"""


def _module(forward_body: str, init: str = _MODULE_INIT, check: str = _CHECK) -> str:
    return init + "\n    def forward(self, x):" + check + forward_body


CUT_OFF = ("the output cut off from the graph (x + pe computed under torch.no_grad(), or from x.detach()): no "
           "gradient reaches x")

MODULE_MISTAKES = (
    Mistake("PE indexed by the batch axis, x.size(0) (sequence-first code on batch-first input)",
            "x is [B, T, d_model]: the positions are axis 1, so add self.pe[:x.size(1)] (shape [T, d_model])",
            _module("        return self.dropout(x + self.pe[:x.size(0)].unsqueeze(1))\n")),
    Mistake("multiplied x by sqrt(d_model) inside PositionalEncoding",
            "forward is just dropout(x + pe[:T]); the sqrt(d_model) scaling of embeddings belongs to the embedding layer",
            _module("        return self.dropout(x * math.sqrt(x.size(-1)) + self.pe[:x.size(1)])\n")),
    Mistake("pe registered as a trainable nn.Parameter",
            "the table is fixed: self.register_buffer('pe', table), not nn.Parameter(table)",
            """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.pe = nn.Parameter(sinusoidal_positional_encoding(max_len, d_model))
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("too long")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake("pe stored as a plain attribute, not a buffer",
            "a plain tensor attribute does not move with .to(device) nor appear in state_dict: "
            "use self.register_buffer('pe', table)",
            """
class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=5000, dropout=0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.pe = sinusoidal_positional_encoding(max_len, d_model)
    def forward(self, x):
        if x.size(1) > self.pe.size(0):
            raise ValueError("too long")
        return self.dropout(x + self.pe[:x.size(1)])
"""),
    Mistake("the whole table added instead of its first T rows",
            "slice the table to the sequence length: self.pe[:x.size(1)]",
            _module("        return self.dropout(x + self.pe)\n")),
    Mistake(CUT_OFF,
            "the table needs no gradient (it is a buffer), but x does: the layers below (the embedding) learn "
            "through it. Add them as they are, return self.dropout(x + self.pe[:x.size(1)]), with no "
            "torch.no_grad() and no .detach() around x",
            _module("        with torch.no_grad():\n"
                    "            out = x + self.pe[:x.size(1)]\n"
                    "        return self.dropout(out)\n")),
)

MAX_LEN_MISTAKES = (
    Mistake("ValueError already at T == max_len (an off-by-one check, T >= max_len)",
            "a sequence of exactly max_len positions fits the table: raise only when x.size(1) > max_len",
            _module("        return self.dropout(x + self.pe[:x.size(1)])\n",
                    check="\n        if x.size(1) >= self.pe.size(0):\n            raise ValueError('too long')\n")),
    Mistake("no ValueError when T > max_len",
            "compare x.size(1) with self.pe.size(0) first and raise ValueError(...): slicing pe[:T] "
            "silently returns fewer rows",
            _module("        return self.dropout(x + self.pe[:x.size(1)])\n", check="\n")),
)

DROPOUT_MISTAKES = (
    Mistake("no dropout (the dropout argument is ignored)",
            "keep an nn.Dropout(dropout) and apply it to x + pe[:T]",
            _module("        return x + self.pe[:x.size(1)]\n")),
    Mistake("dropout applied to x before adding the encoding",
            "dropout goes on the sum: self.dropout(x + self.pe[:T])",
            _module("        return self.dropout(x) + self.pe[:x.size(1)]\n")),
    Mistake("F.dropout without training=self.training (drops in evaluation mode too)",
            "use an nn.Dropout module, or F.dropout(..., p, training=self.training)",
            _module("        return F.dropout(x + self.pe[:x.size(1)], self.p)\n",
                    init=_MODULE_INIT + "        self.p = dropout\n")),
)

SHIFT_HEAD = """
def pe_shift_matrix(offset, d_model):
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
"""
_INTERLEAVED = """
    c, s = torch.diag(torch.cos(angle)), torch.diag(torch.sin(angle))
    M[0::2, 0::2], M[0::2, 1::2] = c, s
    M[1::2, 0::2], M[1::2, 1::2] = -s, c
    return M.float()
"""

SHIFT_MISTAKES = (
    # before the rotation the wrong way round, which gives the same matrix for a negative offset
    Mistake("a negative offset shifts forward (the offset's sign is dropped: abs(offset))",
            "pe[pos + offset] with offset < 0 is an earlier position: the same blocks, with the angle offset * w_i "
            "negative (cos(-a) = cos(a), sin(-a) = -sin(a)); no abs, and no table lookup that needs offset >= 0",
            SHIFT_HEAD + "    angle = abs(offset) / 10000 ** (two_i / d_model)\n" + _INTERLEAVED),
    Mistake("rotation the wrong way round: [[cos, -sin], [sin, cos]] blocks (a shift by -offset)",
            "the textbook rotation acts on (cos, sin) pairs; the table stores (sin, cos): "
            "new sin = cos(b) sin(a) + sin(b) cos(a), so the block is [[cos, sin], [-sin, cos]]",
            SHIFT_HEAD + "    angle = offset / 10000 ** (two_i / d_model)\n" + """
    c, s = torch.diag(torch.cos(angle)), torch.diag(torch.sin(angle))
    M[0::2, 0::2], M[0::2, 1::2] = c, -s
    M[1::2, 0::2], M[1::2, 1::2] = s, c
    return M.float()
"""),
    Mistake("the same angle (offset) for every pair: the frequencies w_i are missing",
            "pair i turns by offset * w_i with w_i = 10000^(-2i/d_model)",
            SHIFT_HEAD + "    angle = offset * torch.ones_like(two_i)\n" + _INTERLEAVED),
    Mistake("exponent i/d_model instead of 2i/d_model",
            "use the same frequencies as the table: 10000^(-2i/d_model) with 2i = 0, 2, 4, ...",
            SHIFT_HEAD + "    angle = offset / 10000 ** (torch.arange(d_model // 2, dtype=torch.float64) / d_model)\n"
            + _INTERLEAVED),
    Mistake("blocks built for the concatenated [sin | cos] layout (column i paired with i + d_model/2)",
            "the table interleaves sin and cos: pair i is columns 2i and 2i+1, so the 2x2 blocks sit on the diagonal",
            SHIFT_HEAD + "    angle = offset / 10000 ** (two_i / d_model)\n" + """
    h = d_model // 2
    c, s = torch.diag(torch.cos(angle)), torch.diag(torch.sin(angle))
    M[:h, :h], M[:h, h:] = c, s
    M[h:, :h], M[h:, h:] = -s, c
    return M.float()
"""),
    Mistake("returned a float64 tensor",
            "the course works in float32: return M.float()",
            SHIFT_HEAD + "    angle = offset / 10000 ** (two_i / d_model)\n" + _INTERLEAVED.replace("M.float()", "M")),
)

# The mistakes below that need a table get a correct one of their own: the reference itself is
# forbidden to the code under test, and a catalogued mistake stands for a student's code.
_CORRECT_TABLE = _table("""
    angle = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()
""")
_env: dict = {"torch": torch}
exec(_CORRECT_TABLE, _env)  # our own code
NAMESPACE = {"sinusoidal_positional_encoding": _env["sinusoidal_positional_encoding"]}

EXERCISES = [
    Exercise("sinusoidal_positional_encoding", ref.sinusoidal_positional_encoding, _table_cases,
             mistakes=TABLE_MISTAKES, rtol=RTOL, atol=ATOL, forbidden=HONESTY),
    Exercise("sinusoidal_positional_encoding_odd_d_model", ref.sinusoidal_positional_encoding, _odd_cases,
             mistakes=ODD_MISTAKES, forbidden=HONESTY, graded="sinusoidal_positional_encoding"),
    Exercise("PositionalEncoding", ref.PositionalEncoding, _module_cases, mistakes=MODULE_MISTAKES,
             rtol=RTOL, atol=ATOL, forbidden=HONESTY, namespace=NAMESPACE),
    Exercise("PositionalEncoding_max_len", ref.PositionalEncoding, _max_len_cases, mistakes=MAX_LEN_MISTAKES,
             rtol=RTOL, atol=ATOL, forbidden=HONESTY, namespace=NAMESPACE, graded="PositionalEncoding"),
    Exercise("PositionalEncoding_dropout", ref.PositionalEncoding, _dropout_cases, mistakes=DROPOUT_MISTAKES,
             forbidden=HONESTY, namespace=NAMESPACE, graded="PositionalEncoding"),
    Exercise("pe_shift_matrix", ref.pe_shift_matrix, _shift_cases, mistakes=SHIFT_MISTAKES,
             rtol=RTOL, atol=ATOL, forbidden=HONESTY),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"PositionalEncoding": ("sinusoidal_positional_encoding",)}
