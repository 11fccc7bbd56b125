"""Notebook 07's lesson "Every decoding idea, on real text" (section 7) prints what eight decoding strategies
wrote with the shipped character-level GPT (models/shakespeare-gpt/), and a table of three measures of
those texts: the model's own log-probability per character, the share of invented words (not in the
training text) and the share of distinct character 4-grams, beside the same measures of held-out
Shakespeare. The notebook is not re-run for this: the committed outputs are read back, the printed texts
are measured again with the shipped model and the shipped text, and each strategy's texts are checked
to be what it can write (greedy: the most likely character every step; top-k: one of the k likeliest;
top-p: one of the nucleus). So an edited output, a retrained model or a changed text is an erratum caught
here. The checks are also run on perturbed copies, to show they notice. Nothing here times anything."""
from __future__ import annotations

import ast
import contextlib
import copy
import functools
import math
import re
import statistics
import weakref
from pathlib import Path

import nbformat
import pytest
import torch

from attention_course.corpora import shakespeare
from attention_course.efficient import CHAR_GPT
from attention_course.shakespeare_gpt import load_shakespeare_gpt

from .layout import NOTEBOOKS, REPO, names_read_from_elsewhere

ASSIGNMENT = "07_attention_at_scale"
SOLUTION = REPO / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RELEASE = NOTEBOOKS / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
NEW_CELLS = ["decode-ideas", "decode-ideas-code", "decode-ideas-picture", "decode-ideas-figure", "decode-ideas-reading"]
CODE_CELLS = ["decode-ideas-code", "decode-ideas-figure"]
AFTER, BEFORE = "69c847ef", "eb71bc4c"      # section 7's greedy and sampled text; "### A preallocated cache"
STRATEGIES = ["greedy", "T = 0.5", "T = 0.8", "T = 1.0", "T = 1.5", "top-k 5", "top-p 0.9", "beam 4"]
REAL = "Shakespeare (held out)"
PROMPT = "ROMEO:\n"
N_TEXTS, N_NEW, WINDOWS = 8, CHAR_GPT["context"] - len(PROMPT), 64
LP_SLACK = 0.005 + 2e-4      # half the printed unit, and float32 sums that round differently on another CPU
PERCENT_SLACK = 0.05 + 1e-9


def _cells(path: Path = SOLUTION) -> dict:
    return {c.get("id"): c for c in nbformat.read(path, as_version=4).cells}


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.fixture(scope="module")
def shipped():
    """The shipped model, its vocabulary and the training text (the first 90 % of the shipped text)."""
    model, vocab = load_shakespeare_gpt()
    text = shakespeare()
    return model, vocab, text[:int(0.9 * len(text))]


# --------------------------------------------------------------------------- reading the outputs back
def written(cells: dict) -> dict[str, list[str]]:
    """What each strategy wrote, as decode-ideas-code prints it: one line a text, `name  'text'`."""
    texts: dict[str, list[str]] = {}
    name = None
    for line in _printed(cells["decode-ideas-code"]).splitlines()[1:]:
        name = line[:10].strip() or name
        texts.setdefault(name, []).append(ast.literal_eval(line[11:]))
    return texts


ROW = re.compile(r"^(?P<name>.{23}) +(?P<lp>[+-]?\d+\.\d\d)(?: ± (?P<lp_se>\d+\.\d\d))? +(?P<new>\d+\.\d)"
                 r"(?: ± (?P<new_se>\d+\.\d))? +(?P<d4>\d+\.\d)(?: ± (?P<d4_se>\d+\.\d))? +(?P<n>\d+)$")


def table(cells: dict) -> dict[str, re.Match]:
    return {m["name"].strip(): m for m in map(ROW.match, _printed(cells["decode-ideas-figure"]).splitlines()) if m}


# --------------------------------------------------------------------------- measuring again
def _words(text: str, start: int) -> list[str]:
    """Runs of letters, lowercased, that begin at `start` or later and end before the text does."""
    return [m.group().lower() for m in re.finditer(r"[A-Za-z]+", text) if m.start() >= start and m.end() < len(text)]


@contextlib.contextmanager
def _one_thread():
    """Notebook 07's setting for small products on a shared 2-core machine; the caller's setting after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_SCORED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # model -> {texts: its scores}


def scored(model, vocab, texts: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Texts of one length, run through the model at once: log p(x_t | x_<t) [N, T - 1], the logits
    [N, T - 1, V] they come from, and the tokens [N, T] (kept per model: the checks run many times)."""
    memo = _SCORED.setdefault(model, {})
    if texts not in memo:
        tokens = torch.cat([vocab.encode(t) for t in texts])
        with torch.no_grad(), _one_thread():
            logits = model(tokens[:, :-1])
        memo[texts] = (logits.log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0], logits, tokens)
    return memo[texts]


@functools.lru_cache(maxsize=4)
def _known(training: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+", training.lower()))


def measured(full_texts: list[str], log_p: torch.Tensor, start: int, training: str) -> list[tuple[float, float, float]]:
    """Per text, given its log p [T - 1]: (mean log p per character from `start` on, the share of invented
    words, the share of distinct character 4-grams)."""
    rows = []
    for text, lp in zip(full_texts, log_p[:, start - 1:].mean(-1).tolist(), strict=True):
        words = _words(text, start)
        grams = [text[i:i + 4] for i in range(start, len(text) - 3)]
        rows.append((lp, sum(w not in _known(training) for w in words) / len(words), len(set(grams)) / len(grams)))
    return rows


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    return statistics.mean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


def strategy_errata(name: str, texts: list[str], logits: torch.Tensor, tokens: torch.Tensor) -> list[str]:
    """Each text is one the strategy could have written: greedy takes the likeliest character, top-k one of
    the k likeliest, top-p one of the nucleus (near-ties, which another CPU may break otherwise, pass).
    logits [B, T - 1, V] and tokens [B, T] are the texts' own, prompt included."""
    start = len(PROMPT)
    logits, chosen = logits[:, start - 1:], tokens[:, start:]                   # [B, N_NEW, V], [B, N_NEW]
    mine = logits.gather(-1, chosen[..., None])[..., 0]
    if name == "greedy":
        wrong, what = (logits > mine[..., None] + 1e-4).any(-1), "not the most likely character"
    elif name.startswith("top-k"):
        k = int(name.split()[-1])
        wrong, what = (logits > mine[..., None] + 1e-4).sum(-1) >= k, f"outside the {k} most likely"
    elif name.startswith("top-p"):
        p = float(name.split()[-1])
        probs = logits.softmax(-1)
        likelier = (probs * (probs > probs.gather(-1, chosen[..., None]) * (1 + 1e-4))).sum(-1)   # their mass
        wrong, what = likelier >= p + 1e-4, f"outside the nucleus of {p}"
    else:
        return []
    return [f"{name}, text {b + 1}: character {t + 1} ({texts[b][t]!r}) is {what}" for b, t in wrong.nonzero().tolist()]


def lesson_errata(cells: dict, model, vocab, training: str, held_out: torch.Tensor) -> list[str]:
    """What the lesson prints that the model, the texts and its own samples do not say."""
    errata = []
    texts = written(cells)
    if list(texts) != STRATEGIES:
        return [f"the strategies printed are {list(texts)}, not {STRATEGIES}"]
    for name, these in texts.items():
        count = 1 if name in ("greedy", "beam 4") else N_TEXTS
        if len(these) != count or any(len(t) != N_NEW for t in these):
            errata.append(f"{name}: {len(these)} texts of {[len(t) for t in these]} characters, not {count} of {N_NEW}")
        unknown = set("".join(these)) - set(vocab.chars)
        if unknown:
            errata.append(f"{name}: characters the model cannot write: {sorted(unknown)}")
    if errata:
        return errata

    # the shipped model is the run whose greedy text section 7 printed above
    above = _printed(cells[AFTER])
    shown = above.split("--- greedy ---\n", 1)[-1].split("\n--- sampled", 1)[0]
    if shown != PROMPT + texts["greedy"][0]:
        errata.append("the greedy text is not the one section 7 printed above: the shipped model is another run")

    groups = {name: [PROMPT + t for t in these] for name, these in texts.items()}
    groups[REAL] = [vocab.decode(w) for w in held_out[:WINDOWS * 128].view(WINDOWS, 128)]
    everything = tuple(t for these in groups.values() for t in these)
    log_p, logits, tokens = scored(model, vocab, everything)
    expected, first = {}, 0
    for name, these in groups.items():
        rows = slice(first, first + len(these))
        expected[name] = measured(these, log_p[rows], len(PROMPT), training)
        errata += strategy_errata(name, [t[len(PROMPT):] for t in these], logits[rows], tokens[rows])
        first += len(these)

    printed = table(cells)
    if list(printed) != [*STRATEGIES, REAL]:
        return errata + [f"the table's rows are {list(printed)}, not {[*STRATEGIES, REAL]}"]
    for name, rows in expected.items():
        m = printed[name]
        if int(m["n"]) != len(rows):
            errata.append(f"{name}: the table counts {m['n']} texts, there are {len(rows)}")
        for j, (column, scale, slack) in enumerate((("lp", 1, LP_SLACK), ("new", 100, PERCENT_SLACK),
                                                     ("d4", 100, PERCENT_SLACK))):
            mean, se = _mean_se([r[j] * scale for r in rows])
            if abs(float(m[column]) - mean) > slack:
                errata.append(f"{name}: prints {column} {m[column]}, the texts give {mean:.4f}")
            shown_se = m[f"{column}_se"]
            if (se is None) != (shown_se is None) or (se is not None and abs(float(shown_se) - se) > slack):
                errata.append(f"{name}: prints {column} ± {shown_se}, the texts give ± {se}")
    lp = {name: statistics.mean(r[0] for r in rows) for name, rows in expected.items()}
    if not lp["beam 4"] > lp["greedy"]:
        errata.append(f"beam search found a less probable text than greedy decoding ({lp['beam 4']} < {lp['greedy']})")

    # every number the reading quotes is one the table prints
    numbers = set(re.findall(r"\d+\.\d+", _printed(cells["decode-ideas-figure"])))
    for cell in ("decode-ideas-picture", "decode-ideas-reading"):
        quoted = set(re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])", cells[cell].source))
        errata += [f"{cell} quotes {n}, which the table does not print" for n in sorted(quoted - numbers)]
    return errata


# --------------------------------------------------------------------------- the committed notebook
def test_the_lesson_prints_what_the_shipped_model_and_text_say(shipped):
    model, vocab, training = shipped
    assert lesson_errata(_cells(), model, vocab, training, vocab.held_out) == []


def test_the_new_cells_are_in_place_ungraded_and_released_without_outputs():
    solution, release = _cells(), _cells(RELEASE)
    ids = list(solution)
    assert len(ids) == len(set(ids))
    at = ids.index(AFTER) + 1
    assert ids[at:at + len(NEW_CELLS) + 1] == [*NEW_CELLS, BEFORE]   # after the first decoded text, before the cache
    assert solution[NEW_CELLS[0]].source.startswith("### Every decoding idea, on real text")
    for name in NEW_CELLS:
        cell = solution[name]
        assert "nbgrader" not in cell.metadata
        assert release[name].source == cell.source
        if cell.cell_type == "code":
            assert cell.metadata.get("tags") == ["grader-skip"] and cell.execution_count and cell.outputs
            assert not any(o.get("output_type") == "error" for o in cell.outputs)
            assert not release[name].outputs
    assert any("image/png" in o.get("data", {}) for o in solution["decode-ideas-figure"].outputs)
    assert list(release)[list(release).index(AFTER) + 1:][:len(NEW_CELLS)] == NEW_CELLS


def test_the_new_code_runs_after_any_earlier_cell():
    """Every name the new code cells read is imported or defined in them (or a builtin): the lesson decodes the
    shipped model, whatever the notebook's own training run above gave."""
    for k, name in enumerate(CODE_CELLS):  # a cell may read what the new cells before it define
        elsewhere = names_read_from_elsewhere("\n".join(_cells()[n].source for n in CODE_CELLS[:k + 1]))
        assert not elsewhere, f"{name} reads names of earlier cells: {sorted(elsewhere)}"


# --------------------------------------------------------------------------- the checks notice a change
def _edit_output(cells: dict, cell: str, old: str, new: str) -> dict:
    cells = copy.deepcopy(cells)
    for out in cells[cell].outputs:
        if out.get("output_type") == "stream":
            assert old in out["text"], old
            out["text"] = out["text"].replace(old, new, 1)
    return cells


def _edit_text(cells: dict, strategy: str, index: int, position: int, character: str) -> dict:
    """One character of one printed text changed (`position` in the text, not counting the prompt)."""
    text = written(cells)[strategy][index]
    changed = text[:position] + character + text[position + 1:]
    assert changed != text
    return _edit_output(cells, "decode-ideas-code", repr(text), repr(changed))


def _first_row(cells: dict, name: str) -> str:
    return table(cells)[name].group(0)


PERTURBED_OUTPUTS = {
    "an invented-word rate": lambda c: _edit_output(c, "decode-ideas-figure", _first_row(c, "T = 1.0"),
                                                    _first_row(c, "T = 1.0").replace(table(c)["T = 1.0"]["new"], "40.0")),
    "a log-probability": lambda c: _edit_output(c, "decode-ideas-figure", _first_row(c, "beam 4"),
                                                _first_row(c, "beam 4").replace(table(c)["beam 4"]["lp"], "-0.86")),
    "a distinct 4-gram share of real text": lambda c: _edit_output(
        c, "decode-ideas-figure", _first_row(c, REAL), _first_row(c, REAL).replace(table(c)[REAL]["d4"], "99.5")),
    "a word of a sampled text": lambda c: _edit_text(c, "T = 0.5", 2, 4, "q"),
    "a greedy character": lambda c: _edit_text(c, "greedy", 0, 60, "a"),
    "a top-k character": lambda c: _edit_text(c, "top-k 5", 0, 10, "Z"),
    "a top-p character": lambda c: _edit_text(c, "top-p 0.9", 1, 20, "z"),
    "a number in the reading": lambda c: {**c, "decode-ideas-reading": nbformat.from_dict(
        {**c["decode-ideas-reading"], "source": c["decode-ideas-reading"].source.replace(
            table(c)["T = 1.0"]["new"], "61.3", 1)})},
}


@pytest.mark.parametrize("what", PERTURBED_OUTPUTS)
def test_the_checks_catch_a_changed_output(shipped, what):
    model, vocab, training = shipped
    cells = _cells()
    assert lesson_errata(cells, model, vocab, training, vocab.held_out) == []       # the committed copy agrees
    changed = PERTURBED_OUTPUTS[what](cells)
    assert lesson_errata(changed, model, vocab, training, vocab.held_out), f"a changed {what} went unnoticed"


def test_the_checks_catch_another_model_and_another_text(shipped):
    model, vocab, training = shipped
    cells = _cells()
    retrained = copy.deepcopy(model)
    with torch.no_grad():
        retrained.head.weight.mul_(1.1)                   # sharper: every log-probability moves, no argmax does
    assert lesson_errata(cells, retrained, vocab, training, vocab.held_out)
    beam = written(cells)["beam 4"][0]
    invented = [w for w in _words(PROMPT + beam, len(PROMPT)) if w not in set(re.findall(r"[a-z]+", training.lower()))]
    assert invented, "beam search's text has an invented word to make known"
    assert lesson_errata(cells, model, vocab, training + "\n" + " ".join(invented) + "\n", vocab.held_out)
    assert lesson_errata(cells, model, vocab, training, vocab.held_out[128:])     # other windows of real text
