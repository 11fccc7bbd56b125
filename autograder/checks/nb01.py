"""Checks for notebook 01, "Attention from similarity" (numpy)."""
from __future__ import annotations

import numpy as np

from attention_course import similarity as ref

from .core import ByName, Case, Exercise, Mistake, keeps_inputs, make_checker, reference_guard

HONESTY = tuple(reference_guard(ref))


def _softmax_elsewhere() -> tuple:
    """The softmax other libraries already have (what the exercise asks you to write), including the
    ones reached under another name: a distribution parameterised by logits computes it through
    these, and log_softmax then exp is the same computation. Named (ByName), not imported: a numpy
    notebook's check does not load PyTorch unless the student's code did."""
    # one sentence per name, not per library: the static pass knows a call by its name (torch.softmax was told
    # it "calls scipy.special.softmax", the first library listed)
    why = ("it calls a library's {} (scipy's or PyTorch's: a softmax someone else wrote, or the same computation "
           "under another name): this exercise asks you to write softmax yourself with numpy")
    named = [("scipy.special", "softmax"), ("scipy.special", "log_softmax"),
             ("torch", "softmax"), ("torch", "log_softmax"), ("torch.nn.functional", "softmax"),
             ("torch.nn.functional", "log_softmax"), ("torch", "Tensor.softmax"), ("torch", "Tensor.log_softmax"),
             ("torch.special", "softmax"), ("torch.special", "log_softmax")]
    return tuple((ByName(module, path), why.format(path.rsplit(".", 1)[-1])) for module, path in named)


def _forbidden(why: str, named: list[tuple[str, str, str]]) -> tuple:
    """Honesty entries for (module, path, banned name) triples, each `why` naming its module's object."""
    return tuple((ByName(module, path, banned), why.format(f"{module}.{path.split('.')[0]}"))
                 for module, path, banned in named)


def _distributions_softmax() -> tuple:
    """A categorical distribution normalises its logits (logits - logsumexp): Categorical(logits=x).logits.exp()
    is softmax (a red team's 5 of 5 points). Its __init__ is where that happens, for OneHotCategorical,
    Multinomial and the relaxed ones too; logits_to_probs is the same step on its own."""
    why = ("it uses {}, a softmax someone else wrote (a distribution normalises its logits with one): this "
           "exercise asks you to write softmax yourself with numpy")
    named = [("torch.distributions.categorical", "Categorical.__init__", "Categorical"),
             ("torch.distributions.utils", "logits_to_probs", ""),
             # transform_to(constraints.simplex) is this transform: exp(x - max) over its sum (a red team's 5 points)
             ("torch.distributions.transforms", "SoftmaxTransform._call", "SoftmaxTransform")]
    return _forbidden(why, named)


def _decomposed_softmax() -> tuple:
    """PyTorch's softmax written in Python, for its compiler (torch._decomp, torch._refs): amax, exp and sum, no
    softmax kernel for the kernel check to see (a red team's 5 points). Their own code, under their wrappers."""
    why = ("it calls {}, PyTorch's own softmax written out for its compiler (a softmax someone else wrote): this "
           "exercise asks you to write softmax yourself with numpy")
    named = [("torch._decomp.decompositions", "_softmax.__wrapped__", "_softmax"),
             ("torch._decomp.decompositions", "_log_softmax.__wrapped__", "_log_softmax"),
             ("torch._decomp.decompositions", "safe_softmax", "safe_softmax"),
             ("torch._refs", "softmax.__wrapped__", "softmax"), ("torch._refs", "log_softmax.__wrapped__", "log_softmax"),
             ("torch._refs.special", "softmax", "softmax"), ("torch._refs.special", "log_softmax", "log_softmax")]
    return _forbidden(why, named)


def _cosine_elsewhere() -> tuple:
    """PyTorch's cosine similarity (the exercise's own name is banned by the static pass already) and the layer
    that calls it. (Not scipy's cdist: the static pass knows a call by its name, and a cdist of another library,
    or of none, is no cosine similarity.)"""
    why = "it uses {}, a cosine similarity someone else wrote: this exercise asks you to write it with numpy"
    named = [("torch", "cosine_similarity", ""),
             ("torch.nn.modules.distance", "CosineSimilarity.forward", "CosineSimilarity")]
    # the loss that is 1 - cosine for each pair (a red team's 2 of 2 points): 1 - loss is the similarity
    loss = ("it uses {}, a loss that computes a cosine similarity someone else wrote (1 - cos for each pair): this "
            "exercise asks you to write it with numpy")
    named_loss = [("torch.nn.functional", "cosine_embedding_loss", ""), ("torch", "cosine_embedding_loss", ""),
                  ("torch.nn.modules.loss", "CosineEmbeddingLoss.forward", "CosineEmbeddingLoss")]
    return _forbidden(why, named) + _forbidden(loss, named_loss)


def _normalize_elsewhere() -> tuple:
    """PyTorch's normalize divides each row by its norm, and its 1-norm is the row sum of a non-negative S:
    F.normalize(S, p=1, dim=1) is the whole exercise (a red team's 3 of 3 points). A categorical distribution
    given probs divides them by their sum. (torch.linalg.norm stays allowed: it is no normalization.)"""
    why = ("it uses {}, a row normalization someone else wrote: this exercise asks you to divide each row by its "
           "sum yourself")
    named = [("torch.nn.functional", "normalize", ""),
             ("torch.distributions.categorical", "Categorical.__init__", "Categorical"),
             # a Dirichlet's mean is its concentrations over their sum (a red team's 3 points)
             ("torch.distributions.dirichlet", "Dirichlet.mean.fget", "Dirichlet")]
    return _forbidden(why, named)


def _attention_elsewhere() -> tuple:
    """PyTorch's own attention: with scale=1 (or identity projections) it is basic self-attention (a red team's
    4 of 4 points: notebook 02 on forbids it, and this notebook did not)."""
    why = ("it calls {}, PyTorch's own attention, which does this exercise's work: write softmax(X X^T) X "
           "yourself with numpy")
    named = [("torch.nn.functional", "scaled_dot_product_attention", ""),
             ("torch.nn.functional", "multi_head_attention_forward", ""),
             ("torch.nn.modules.activation", "MultiheadAttention.forward", "MultiheadAttention"),
             ("torch.ao.nn.quantizable.modules.activation", "MultiheadAttention.forward", "MultiheadAttention"),
             ("torch.ao.nn.quantizable.modules.activation", "MultiheadAttention._forward_impl", "MultiheadAttention"),
             ("torch.nn.modules.transformer", "TransformerEncoderLayer.forward", "TransformerEncoderLayer"),
             ("torch.nn.modules.transformer", "TransformerDecoderLayer.forward", "TransformerDecoderLayer"),
             ("torch.nn.attention.flex_attention", "flex_attention", "")]
    return _forbidden(why, named)


# Forbidding PyTorch's softmax forbids its kernels too (core._KERNELS), wherever they are reached from: F.softmin(-x),
# F.cross_entropy per target then exp(-nll) (a log_softmax inside), F.scaled_dot_product_attention(x, I, I, scale=1)
# (its softmax, or its fused kernel) and exp(x - torch.logsumexp(x)) (log_softmax by definition, with the
# max-subtraction this exercise teaches done for you) each took softmax's 5 points. A logsumexp of one's own is fine.
SOFTMAX_HONESTY = HONESTY + _softmax_elsewhere() + _distributions_softmax() + _decomposed_softmax()
COSINE_HONESTY = HONESTY + _cosine_elsewhere()
NORMALIZE_HONESTY = HONESTY + _normalize_elsewhere()
ATTENTION_HONESTY = HONESTY + _attention_elsewhere()

# Float32 tolerances, as the spec promises: an implementation may compute in float32 (np.float32 arrays,
# or torch). Rounding an input to float32 moves it by up to |x| * 6e-8, which exp turns into a relative
# error of the weights of about that much: the ordinary cases (|x| < 20) stay far inside rtol 1e-4, the
# stability cases (|x| up to about 1200, relative error up to 1.5e-4) get rtol 1e-3. Every catalogued
# mistake is off by far more (NaN, wrong axis, no exponential, ...).
RTOL, ATOL = 1e-4, 1e-5
STABILITY_RTOL = 1e-3
# Dot products of rows of length ~3 * sqrt(d): values up to ~100 whose float32 rounding can reach 1e-5
# even where they cancel to about 0.
SIMILARITY_ATOL = 1e-4


def _square_similarities(rng, n):
    """A symmetric non-negative similarity matrix with 1 on the diagonal, rows of unequal sums."""
    S = rng.uniform(0, 1, size=(n, n)) * (rng.uniform(size=(n, n)) < 0.6)
    S = (S + S.T) / 2
    np.fill_diagonal(S, 1.0)
    return S


def _normalize_cases(rng):
    cases = []
    for n, m in [(3, 5), (4, 4), (6, 6)]:
        S = rng.uniform(0.05, 2.0, size=(n, m)) if n != m else _square_similarities(rng, n)
        cases.append(Case(f"S of shape {S.shape} with rows of different sums", lambda f, S=S: f(S.copy())))
    S = rng.uniform(0.05, 2.0, size=(3, 4))
    cases.append(keeps_inputs(f"S of shape {S.shape}", lambda f, S: f(S), S))
    # similarities can be negative (dot products): each row is still divided by its own sum, not by the sum
    # of its absolute values (F.normalize's 1-norm), which only agree on non-negative rows
    S = np.array([[1.0, -0.5, 0.5], [0.2, 1.0, -0.4], [-0.3, 0.6, 0.9]])
    cases.append(Case(f"S = {S.tolist()}: negative similarities, each row's sum still positive",
                      lambda f, S=S: f(S.copy())))
    return cases


def _contextualize_cases(rng):
    cases = []
    for n, d in [(4, 3), (5, 5), (2, 7)]:
        W = ref.normalize_rows(rng.uniform(0, 1, size=(n, n)))
        E = rng.normal(size=(n, d))
        cases.append(Case(f"W of shape {W.shape} (not symmetric), E of shape {E.shape}",
                          lambda f, W=W, E=E: f(W.copy(), E.copy())))
    # weights whose rows do not sum to 1 (the lecture's similarity matrix itself): W is used as given, never
    # normalized again (a rescaled W passed every case above, whose rows all summed to 1)
    S, E = rng.uniform(0, 2, size=(3, 3)), rng.normal(size=(3, 4))
    cases.append(Case(f"W of shape {S.shape} whose rows do not sum to 1 (use W as it is), E of shape {E.shape}",
                      lambda f, W=S, E=E: f(W.copy(), E.copy())))
    W, E = ref.normalize_rows(rng.uniform(0, 1, size=(4, 4))), rng.normal(size=(4, 3))
    cases.append(keeps_inputs(f"W of shape {W.shape}, E of shape {E.shape}", lambda f, W, E: f(W, E), W, E))
    return cases


def _softmax_cases(rng):
    shapes_axes = [((7,), -1), ((4, 7), -1), ((2, 3, 5), 1), ((3, 4), 0), ((2, 2, 3), -1)]
    cases = []
    for shape, axis in shapes_axes:
        x = rng.normal(scale=3.0, size=shape)
        cases.append(Case(f"x of shape {shape}, axis={axis}", lambda f, x=x, axis=axis: f(x.copy(), axis=axis)))
    x = rng.normal(size=(3, 6))
    cases.append(Case("x of shape (3, 6), default axis", lambda f, x=x: f(x.copy())))
    x = rng.normal(scale=3.0, size=(2, 5))
    cases.append(keeps_inputs("x of shape (2, 5), axis=-1", lambda f, x: f(x, axis=-1), x))
    return cases


def _softmax_stability_cases(rng):
    big = rng.normal(scale=50.0, size=(3, 5)) + 1000.0
    mixed = rng.normal(size=(2, 4)) + np.array([[800.0], [-800.0]])
    masked = rng.normal(size=(3, 6))
    masked[rng.uniform(size=masked.shape) < 0.4] = -np.inf
    masked[:, 0] = rng.normal(size=3)  # every row keeps one finite entry
    return [
        Case("large entries (around 1000)", lambda f: f(big.copy(), axis=-1)),
        Case("rows at very different scales (+800 and -800)", lambda f: f(mixed.copy(), axis=-1)),
        Case("-inf entries (they must get weight 0)", lambda f: f(masked.copy(), axis=-1)),
        Case("large entries along axis 0", lambda f: f(big.T.copy(), axis=0)),
    ]


def _embedding_cases(rng):
    cases = []
    for n, d in [(5, 3), (4, 8), (6, 6)]:
        E = rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, size=(n, 1))  # rows of different lengths
        cases.append(Case(f"E of shape {E.shape} with rows of different lengths", lambda f, E=E: f(E.copy())))
    # a float64 E: np.asarray(E, dtype=float) is then E itself, and `E /= norm` normalized the caller's array
    # (its next dot_similarity(E) gave 1 on the diagonal, not the squared lengths): an audit's 2 / 2
    E = rng.normal(size=(4, 5)) * rng.uniform(0.5, 3.0, size=(4, 1))
    cases.append(keeps_inputs(f"E of shape {E.shape} with rows of different lengths", lambda f, E: f(E), E))
    return cases


def _attention_cases(rng):
    cases = []
    for n, d in [(5, 3), (4, 6), (6, 6)]:
        X = rng.normal(size=(n, d))
        cases.append(Case(f"X of shape {X.shape}", lambda f, X=X: f(X.copy())))
    X = rng.normal(size=(4, 5))
    cases.append(keeps_inputs(f"X of shape {X.shape}", lambda f, X: f(X), X))
    return cases


SOFTMAX_MISTAKES = (
    Mistake("softmax without subtracting the max",
            "exp of a large number overflows to inf and inf/inf is NaN: subtract x.max(axis, keepdims=True) first",
            "def softmax(x, axis=-1):\n    e = np.exp(x)\n    return e / e.sum(axis=axis, keepdims=True)"),
    Mistake("softmax over the whole array instead of along `axis`",
            "sum with axis=axis and keepdims=True so each slice sums to 1",
            "def softmax(x, axis=-1):\n    e = np.exp(x - np.max(x))\n    return e / e.sum()"),
    Mistake("softmax along axis 0 whatever `axis` says",
            "use the `axis` argument in both max and sum",
            "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=0, keepdims=True))\n    return e / e.sum(axis=0, keepdims=True)"),
    Mistake("subtracting the global max instead of the max along `axis`",
            "a row far below the global max underflows to 0/0: take the max along `axis` with keepdims=True",
            "def softmax(x, axis=-1):\n    e = np.exp(x - np.max(x))\n    return e / e.sum(axis=axis, keepdims=True)"),
    Mistake("the sum rule (x / x.sum) instead of softmax",
            "softmax exponentiates first: exp(x - max) / sum(exp(x - max))",
            "def softmax(x, axis=-1):\n    return x / x.sum(axis=axis, keepdims=True)"),
    Mistake("x changed in place (x -= ..., np.exp(x, out=x)): the caller's array changed too",
            "x -= x.max(...) writes into the array you were given: compute new arrays, e = np.exp(x - x.max(...))",
            "def softmax(x, axis=-1):\n    x -= np.max(x, axis=axis, keepdims=True)\n    np.exp(x, out=x)\n"
            "    x /= x.sum(axis=axis, keepdims=True)\n    return x"),
)

EXERCISES = [
    Exercise("normalize_rows", ref.normalize_rows, _normalize_cases, mistakes=(
        Mistake("normalized columns instead of rows", "sum along axis=1 (each row), not axis=0",
                "def normalize_rows(S):\n    return S / S.sum(axis=0, keepdims=True)"),
        Mistake("divided each row by its maximum", "divide by the row's *sum* so it adds up to 1",
                "def normalize_rows(S):\n    return S / S.max(axis=1, keepdims=True)"),
        Mistake("divided by the sum of the whole matrix", "divide each row by its own sum: S.sum(axis=1, keepdims=True)",
                "def normalize_rows(S):\n    return S / S.sum()"),
        Mistake("softmax instead of dividing by the sum", "the lecture's normalization is S / row sum, no exponential",
                "def normalize_rows(S):\n    e = np.exp(S - S.max(axis=1, keepdims=True))\n    return e / e.sum(axis=1, keepdims=True)"),
        Mistake("row sums broadcast along the wrong axis", "S.sum(axis=1) has shape [n]; keep it as [n, 1] with keepdims=True",
                "def normalize_rows(S):\n    return S / S.sum(axis=1)"),
        Mistake("S divided in place (S /= ...): the caller's matrix changed too",
                "S /= S.sum(axis=1, keepdims=True) writes into the array you were given: return a new one, "
                "S / S.sum(axis=1, keepdims=True)",
                "def normalize_rows(S):\n    S /= S.sum(axis=1, keepdims=True)\n    return S"),
    ), forbidden=NORMALIZE_HONESTY, rtol=RTOL, atol=ATOL),
    Exercise("contextualize", ref.contextualize, _contextualize_cases, mistakes=(
        Mistake("used the columns of W (W.T @ E) instead of its rows", "row i of the result is sum_j W[i, j] * E[j]: that is W @ E",
                "def contextualize(W, E):\n    return W.T @ E"),
        Mistake("multiplied element-wise instead of a matrix product", "use the matrix product W @ E",
                "def contextualize(W, E):\n    return W * E"),
    ), forbidden=HONESTY, rtol=RTOL, atol=ATOL),
    Exercise("softmax", ref.softmax, _softmax_cases, mistakes=SOFTMAX_MISTAKES, forbidden=SOFTMAX_HONESTY,
             rtol=RTOL, atol=ATOL),
    Exercise("softmax_stability", ref.softmax, _softmax_stability_cases, mistakes=SOFTMAX_MISTAKES,
             forbidden=SOFTMAX_HONESTY, graded="softmax", rtol=STABILITY_RTOL, atol=ATOL),
    Exercise("dot_similarity", ref.dot_similarity, _embedding_cases, mistakes=(
        Mistake("E.T @ E (a [d, d] matrix) instead of E @ E.T", "similarities are between rows (words): E @ E.T is [n, n]",
                "def dot_similarity(E):\n    return E.T @ E"),
        Mistake("cosine similarity instead of the dot product", "the dot product keeps the vectors' lengths: no normalization",
                "def dot_similarity(E):\n    U = E / np.linalg.norm(E, axis=1, keepdims=True)\n    return U @ U.T"),
    ), forbidden=HONESTY, rtol=RTOL, atol=SIMILARITY_ATOL),
    Exercise("cosine_similarity", ref.cosine_similarity, _embedding_cases, mistakes=(
        Mistake("cosine similarity that forgets to normalize (a plain dot product)",
                "divide each row by its length: E / np.linalg.norm(E, axis=1, keepdims=True)",
                "def cosine_similarity(E):\n    return E @ E.T"),
        Mistake("normalized the columns of E instead of its rows", "take the norm along axis=1 (each word's vector)",
                "def cosine_similarity(E):\n    U = E / np.linalg.norm(E, axis=0, keepdims=True)\n    return U @ U.T"),
        Mistake("divided by only one of the two lengths", "cos = e_i·e_j / (|e_i| |e_j|): normalize both sides",
                "def cosine_similarity(E):\n    n = np.linalg.norm(E, axis=1, keepdims=True)\n    return (E @ E.T) / n"),
        Mistake("E divided in place (E /= its norms): the caller's embeddings are normalized too",
                "np.asarray(E, dtype=float) is E itself when E is already float, so E /= ... rewrites the caller's "
                "array (a dot_similarity(E) after it gives 1 on the diagonal): make a new one, "
                "U = E / np.linalg.norm(E, axis=1, keepdims=True), and return U @ U.T",
                "def cosine_similarity(E):\n    E = np.asarray(E, dtype=float)\n"
                "    E /= np.linalg.norm(E, axis=1, keepdims=True)\n    return E @ E.T"),
    ), forbidden=COSINE_HONESTY, rtol=RTOL, atol=ATOL),
    Exercise("basic_self_attention", ref.basic_self_attention, _attention_cases, mistakes=(
        Mistake("no softmax: (X X^T) X", "turn the scores X @ X.T into weights with softmax along the last axis",
                "def basic_self_attention(X):\n    return (X @ X.T) @ X"),
        Mistake("softmax over the wrong axis (columns sum to 1, not rows)", "use softmax(..., axis=-1): each query's row of weights sums to 1",
                "def basic_self_attention(X):\n    s = X @ X.T\n    e = np.exp(s - s.max(axis=0, keepdims=True))\n    return (e / e.sum(axis=0, keepdims=True)) @ X"),
        Mistake("returned the attention weights instead of the weighted sum", "multiply the weights by X: softmax(X @ X.T) @ X",
                "def basic_self_attention(X):\n    s = X @ X.T\n    e = np.exp(s - s.max(axis=-1, keepdims=True))\n    return e / e.sum(axis=-1, keepdims=True)"),
    ), forbidden=ATTENTION_HONESTY, rtol=RTOL, atol=ATOL),
]

check = make_checker(EXERCISES)

# The graded functions each graded one calls (the grader: trusted.grade_job). When one of these fails
# its own tests, the exercises calling it are checked again with the course's version in its place.
DEPENDS = {"basic_self_attention": ("softmax",)}
