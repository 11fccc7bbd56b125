"""Notebook 06's lessons on mixed precision and on the `quick` recipe print numbers in their committed
outputs: bfloat16 roundings, the same toy training in float32 and under bf16 autocast, and a finished
`quick` run's validation curve. The notebook is not re-run here. What is deterministic is recomputed
(every rounding, gap and dtype printed, and the first step of each toy run); the rest is held to
itself (the differences printed against the losses printed, the falling validation loss against
ln V) and to the recipe; and every number the two readings type must be one the outputs print.
Each check is also run on perturbed copies of the cells, to show that it notices."""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from attention_course.train import CONFIGS

from .layout import NOTEBOOKS, REPO, names_read_from_elsewhere

ASSIGNMENT = "06_transformer_translator"
SOLUTION = REPO / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
NEW_CELLS = ["mixed-precision", "mixed-precision-numbers", "mixed-precision-run", "mixed-precision-code",
             "mixed-precision-reading", "quick-learns", "quick-learns-code", "quick-learns-reading"]
CODE_CELLS = [name for name in NEW_CELLS if not name.endswith(("precision", "-run", "-reading", "learns"))]
READINGS = {"mixed-precision-reading": ["mixed-precision-numbers", "mixed-precision-code", "cell-025"],
            "quick-learns-reading": ["quick-learns-code"]}
BF16 = torch.bfloat16


def _cells(path=SOLUTION) -> dict:
    return {c.get("id"): c for c in nbformat.read(path, as_version=4).cells}


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


# --------------------------------------------------------------------------- the checks, on any copy of the cells
def placement_errata(cells: dict) -> list[str]:
    """The new cells in order right after the shipped run is loaded (section 8), before section 9."""
    ids = list(cells)
    if not all(name in ids for name in NEW_CELLS):
        return [f"missing cells: {[n for n in NEW_CELLS if n not in ids]}"]
    at = ids.index("cell-025") + 1
    errata = [] if ids[at:at + len(NEW_CELLS)] == NEW_CELLS else [f"not in order after cell-025: {ids[at:at + 8]}"]
    if ids[at + len(NEW_CELLS)] != "cell-026":
        errata.append("section 9 (cell-026) does not follow the new cells")
    return errata


def rounding_errata(cells: dict) -> list[str]:
    """Every number the bfloat16 cell prints, recomputed."""
    text, errata = _printed(cells["mixed-precision-numbers"]), []
    stored = re.findall(r"^ *(\S+) is stored as (\S+) +in float32, as (\S+) +in bfloat16$", text, re.M)
    if len(stored) != 4:
        errata.append(f"expected 4 roundings, found {len(stored)}")
    for x, f32, bf16 in stored:
        expect = (repr(torch.tensor(float(x)).item()), repr(torch.tensor(float(x)).to(BF16).item()))
        if (f32, bf16) != expect:
            errata.append(f"{x}: prints {f32}, {bf16}; float32 and bfloat16 store {expect}")
    gaps = re.findall(r"^near +(\S+) bfloat16 steps by (\S+) = 2\^(-?\d+)$", text, re.M)
    if [g[0] for g in gaps] != ["1", "100", "1000"]:
        errata.append(f"the gaps near 1, 100, 1000 are not all printed: {gaps}")
    for x, gap, power in gaps:
        t = torch.tensor(float(x), dtype=BF16)
        true = (torch.nextafter(t, torch.tensor(math.inf, dtype=BF16)) - t).item()
        if float(gap) != true or 2.0 ** int(power) != true or true != 2.0 ** (math.floor(math.log2(float(x))) - 7):
            errata.append(f"near {x}: prints a gap {gap} = 2^{power}, bfloat16's is {true}")
    running = torch.tensor(0.0, dtype=BF16)
    for _ in range(1000):
        running = running + torch.tensor(0.01, dtype=BF16)
    summed = torch.full((1000,), 0.01, dtype=BF16).sum()
    line = f"0.01 added 1000 times: {running.item():g} rounding to bfloat16 after each addition, {summed.item():g} with torch.sum"
    if line not in text.splitlines():
        errata.append(f"no line {line!r}")
    stored_w = torch.tensor(0.1, dtype=BF16)
    line = (f"the weight 0.1 after an update of -0.0001: {(torch.tensor(0.1) - 1e-4).item():.6f} in float32; in bfloat16 "
            f"{stored_w.item():.6f} -> {(stored_w - 1e-4).item():.6f}, the update lost")
    if line not in text.splitlines():
        errata.append(f"no line {line!r}")
    f32, bf, f16 = (torch.finfo(t) for t in (torch.float32, BF16, torch.float16))
    line = (f"largest: float32 {f32.max:.3g}, bfloat16 {bf.max:.3g}, float16 {f16.max:g}; smallest normal: float32 "
            f"{f32.smallest_normal:.3g}, bfloat16 {bf.smallest_normal:.3g}, float16 {f16.smallest_normal:.3g}")
    if line not in text.splitlines():
        errata.append(f"no line {line!r}")
    x, layer, norm = torch.randn(4, 8), torch.nn.Linear(8, 3), torch.nn.LayerNorm(8)
    with torch.autocast("cpu", dtype=BF16):
        logits = layer(x)
        dtypes = [x @ layer.weight.T, logits, logits.softmax(-1), norm(x),
                  torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 0]))]
    shown = re.findall(r"-> (\w+)", text.splitlines()[-1])
    if shown != [str(t.dtype).removeprefix("torch.") for t in dtypes] or not text.rstrip().endswith("still float32"):
        errata.append(f"the autocast line prints {shown}, autocast on this CPU gives {[t.dtype for t in dtypes]}")
    return errata


RUN_LINE = re.compile(r"^ *(?P<name>[\w ,]+): loss (?P<first>[\d.]+) at step 1 -> (?P<last>[\d.]+) at step (?P<steps>\d+), "
                      r"mean of the last 20 steps (?P<mean>[\d.]+); logits (?P<logits>\w+), loss (?P<loss>\w+), "
                      r"weights (?P<weights>\w+), gradients (?P<grads>\w+)$", re.M)
GAP_LINE = re.compile(r"^(?P<name>[\w ,]+) against float32: largest difference (?P<gap>[\d.]+) \(step (?P<at>\d+)\), "
                      r"at step 1 (?P<first>[\d.]+), lower at (?P<lower>\d+) of (?P<of>\d+) steps$", re.M)


def _your_functions() -> dict:
    """What the toy runs take from the notebook's earlier cells (the student's own, as section 7's run does; the
    library holds the solution's): the grader flags a notebook cell that imports the answer key itself."""
    from attention_course import translate

    return {name: getattr(translate, name) for name in YOURS}


YOURS = ("Seq2SeqTransformer", "make_masks", "label_smoothed_cross_entropy", "inverse_sqrt_lr")
YOUR_FUNCTIONS = _your_functions()


def _first_steps() -> dict[str, float]:
    """The first loss of each toy run, recomputed with the cell's own functions (one step each)."""
    source = _cells()["mixed-precision-code"].source
    namespace: dict = dict(YOUR_FUNCTIONS)
    exec(compile(source.split("\nRUNS = ")[0], "mixed-precision-code", "exec"), namespace)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {name: namespace["train_reverser"](bf16, seed, steps=1)[0][0]
                for name, (bf16, seed) in {"float32": (False, 1), "bf16 autocast": (True, 1),
                                           "float32, other batches": (False, 2)}.items()}
    finally:
        torch.set_num_threads(threads)


def training_errata(cells: dict, first_steps: dict[str, float]) -> list[str]:
    """The toy runs' printed losses against each other, against the recomputed first step, and the dtypes."""
    text, errata = _printed(cells["mixed-precision-code"]), []
    runs = {m["name"].strip(): m for m in RUN_LINE.finditer(text)}
    gaps = {m["name"]: m for m in GAP_LINE.finditer(text)}
    if set(runs) != set(first_steps) or set(gaps) != {"bf16 autocast", "float32, other batches"}:
        return [f"runs printed {sorted(runs)}, comparisons {sorted(gaps)}"]
    for name, m in runs.items():
        tolerance = 3e-4 if name.startswith("bf16") else 1.5e-4    # bf16 sums may round differently on another CPU
        if abs(float(m["first"]) - first_steps[name]) > tolerance:
            errata.append(f"{name}: prints {m['first']} at step 1, one step of the cell's code gives {first_steps[name]:.4f}")
        if int(m["steps"]) != 150 or not float(m["last"]) < float(m["first"]) / 10 or not float(m["mean"]) < float(m["first"]) / 10:
            errata.append(f"{name}: does not learn in 150 steps as printed ({m['first']} -> {m['last']}, mean {m['mean']})")
        expected = ("bfloat16" if name.startswith("bf16") else "float32", "float32", "float32", "float32")
        if (m["logits"], m["loss"], m["weights"], m["grads"]) != expected:
            errata.append(f"{name}: dtypes {m['logits']}, {m['loss']}, {m['weights']}, {m['grads']}, not {expected}")
    fp32 = runs["float32"]
    for name, g in gaps.items():
        other = runs[name]
        first_gap = abs(float(fp32["first"]) - float(other["first"]))
        if abs(float(g["first"]) - first_gap) > 1.5e-4:
            errata.append(f"{name}: prints {g['first']} at step 1, the losses printed differ by {first_gap:.4f}")
        biggest = max(first_gap, abs(float(fp32["last"]) - float(other["last"])))
        if float(g["gap"]) < biggest - 1.5e-4 or not 1 <= int(g["at"]) <= int(g["of"]) or int(g["of"]) != 150:
            errata.append(f"{name}: the largest difference {g['gap']} (step {g['at']}) is below one printed ({biggest:.4f})")
        if not 0 <= int(g["lower"]) <= int(g["of"]):
            errata.append(f"{name}: lower at {g['lower']} of {g['of']} steps")
    if not float(gaps["bf16 autocast"]["gap"]) < float(gaps["float32, other batches"]["gap"]):
        errata.append("the reading's claim fails: bf16's largest difference is not below the yardstick's")
    if not any(o.get("output_type") == "display_data" for o in cells["mixed-precision-code"].outputs):
        errata.append("no figure")
    return errata


def quick_errata(cells: dict, saved: Path = REPO / "results" / "quick-en-de") -> list[str]:
    """The `quick` run's printed curve: its recipe, ln V, a falling validation loss, a rising BLEU, each number the
    one in the run saved with the course (`saved`)."""
    text, errata, quick = _printed(cells["quick-learns-code"]), [], CONFIGS["quick"]
    head = re.search(r"the `quick` run in results/quick-en-de: (\d+) steps \(([\d.]+) epochs\) of a ([\d,]+)-parameter "
                     r"model, (\d+) s of training on (.+), (\d+) thread\(s\)$", text, re.M)
    loss = re.search(r"a uniform guess over ([\d,]+) tokens ln (\d+) = ([\d.]+); training loss of steps 1-(\d+) ([\d.]+); "
                     r"validation loss (.*) \(e\^loss: ([\d,]+) -> (\d+)\)$", text, re.M)
    bleu = re.search(rf"^greedy validation BLEU \(first {quick.val_bleu_sentences} sentences\): (.*)$", text, re.M)
    if not (head and loss and bleu):
        return [f"the quick run's lines are not all printed: {text[:300]!r}"]
    if int(head[1]) != quick.max_steps:
        errata.append(f"prints {head[1]} steps, the recipe takes {quick.max_steps}")
    V = _number(loss[1])
    if not V == float(loss[2]) == _number(loss[7]) == quick.vocab_size or loss[3] != f"{math.log(V):.3f}":
        errata.append(f"ln V: prints V {loss[1]}, ln {loss[2]} = {loss[3]}; the recipe's V {quick.vocab_size}")
    evals = [(int(s), float(v)) for s, v in re.findall(r"step (\d+) ([\d.]+)", loss[6])]
    scores = [(int(s), float(v)) for s, v in re.findall(r"step (\d+) ([\d.]+)", bleu[1])]
    steps = list(range(quick.eval_every, quick.max_steps + 1, quick.eval_every))
    if [s for s, _ in evals] != steps or [s for s, _ in scores] != steps:
        errata.append(f"evaluations at {[s for s, _ in evals]}, {[s for s, _ in scores]}; the recipe's at {steps}")
    losses, bleus = [v for _, v in evals], [v for _, v in scores]
    if not losses or any(b >= a for a, b in zip(losses, losses[1:], strict=False)) or not losses[-1] < math.log(V) - 2:
        errata.append(f"the validation loss does not fall well below ln V: {losses}")
    if losses and loss[8] != f"{math.exp(losses[-1]):.0f}":
        errata.append(f"e^loss: prints {loss[8]}, e^{losses[-1]} is {math.exp(losses[-1]):.0f}")
    if not bleus or any(b <= a for a, b in zip(bleus, bleus[1:], strict=False)) or not bleus[-1] >= bleus[0] + 5:
        errata.append(f"the validation BLEU does not rise: {bleus}")
    # the run saved with the course (results/quick-en-de), which the cell reads where no run of one's own is on disk
    summary = json.loads((saved / "summary.json").read_text())
    history = [h for h in json.loads((saved / "history.json").read_text()) if "val_loss" in h]
    recorded = (summary["steps"], summary["parameters"], round(summary["train_seconds"]), summary["vocab_size"])
    if (int(head[1]), _number(head[3]), int(head[4]), V) != recorded:
        errata.append(f"prints steps, parameters, seconds, V {head[1]}, {head[3]}, {head[4]}, {V}; "
                      f"results/quick-en-de says {recorded}")
    if evals != [(h["step"], round(h["val_loss"], 3)) for h in history] or \
            scores != [(h["step"], round(h["val_bleu"], 2)) for h in history]:
        errata.append(f"prints {evals} and {scores}; results/quick-en-de's history says otherwise")
    if not any(o.get("output_type") == "display_data" for o in cells["quick-learns-code"].outputs):
        errata.append("no figure")
    return errata


def prose_errata(cells: dict) -> list[str]:
    """Every number the two readings type (a decimal, or 10 and more) is printed by the cells they read."""
    errata = []
    for reading, sources in READINGS.items():
        printed = " ".join(_printed(cells[name]) for name in sources)
        shown = {_number(n) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", printed)}
        for typed in re.findall(r"(?<![\w^{.-])\d[\d,]*(?:\.\d+)?", cells[reading].source):
            value = _number(typed.rstrip(","))
            if ("." in typed or value >= 10) and value not in shown:
                errata.append(f"{reading} types {typed}, which its cells do not print")
    return errata


def all_errata(cells: dict, first_steps: dict[str, float]) -> list[str]:
    return (placement_errata(cells) + rounding_errata(cells) + training_errata(cells, first_steps)
            + quick_errata(cells) + prose_errata(cells))


@pytest.fixture(scope="module")
def first_steps() -> dict[str, float]:
    return _first_steps()


# --------------------------------------------------------------------------- the committed notebook
def test_the_lessons_print_what_their_code_computes(first_steps):
    assert all_errata(_cells(), first_steps) == []


def test_the_new_cells_are_ungraded_and_released_without_outputs():
    solution, release = _cells(), _cells(NOTEBOOKS / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    assert placement_errata(release) == []
    for name in NEW_CELLS:
        cell = solution[name]
        assert "nbgrader" not in cell.metadata and release[name].source == cell.source
        if cell.cell_type == "code":
            assert cell.metadata.get("tags") == ["grader-skip"] and cell.execution_count and cell.outputs
            assert not any(o.get("output_type") == "error" for o in cell.outputs)
            assert not release[name].outputs


@pytest.mark.parametrize("name", CODE_CELLS)
def test_each_new_code_cell_runs_on_its_own(name):
    """Every name a new cell reads is imported or defined in it (or a builtin): a change to an earlier
    cell, yours included, cannot change what it shows."""
    elsewhere = names_read_from_elsewhere(_cells()[name].source)
    if name == "mixed-precision-code":
        elsewhere -= set(YOURS)  # the notebook's graded functions, as section 7's run uses them
    assert not elsewhere, f"{name} reads names of earlier cells: {sorted(elsewhere)}"


def test_no_absolute_path_in_the_new_cells():
    """The run folder is printed relative to the course (`evaluation.shown`), never as a machine's path."""
    for name in NEW_CELLS:
        cell = _cells()[name]
        text = cell.source + _printed(cell)
        assert not re.search(r"(?<![\w.~])/[\w.-]+/[\w.-]+|[A-Z]:\\", text), name


# --------------------------------------------------------------------------- the checks notice a change
def _edit_output(cells: dict, name: str, old: str, new: str) -> dict:
    cells = copy.deepcopy(cells)
    hit = False
    for out in cells[name].outputs:
        if out.get("output_type") == "stream" and old in out["text"]:
            out["text"], hit = out["text"].replace(old, new, 1), True
    assert hit, f"{old!r} is not in {name}'s output"
    return cells


def _edit_source(cells: dict, name: str, old: str, new: str) -> dict:
    cells = copy.deepcopy(cells)
    assert old in cells[name].source, f"{old!r} is not in {name}"
    cells[name].source = cells[name].source.replace(old, new, 1)
    return cells


def _swap(cells: dict, a: str, b: str) -> dict:
    order = list(cells)
    i, j = order.index(a), order.index(b)
    order[i], order[j] = order[j], order[i]
    return {k: cells[k] for k in order}


PERTURBATIONS = {
    "a bfloat16 rounding": lambda c: _edit_output(c, "mixed-precision-numbers", "0.333984375 ", "0.333984376 "),
    "a gap": lambda c: _edit_output(c, "mixed-precision-numbers", "steps by 0.5 = 2^-1", "steps by 0.25 = 2^-2"),
    "the running sum": lambda c: _edit_output(c, "mixed-precision-numbers", "added 1000 times: 4 ", "added 1000 times: 8 "),
    "the autocast dtypes": lambda c: _edit_output(c, "mixed-precision-numbers", "softmax -> bfloat16", "softmax -> float32"),
    "a first-step loss": lambda c: _edit_output(c, "mixed-precision-code", "loss 3.5779 at step 1", "loss 3.5719 at step 1"),
    "the step-1 difference": lambda c: _edit_output(c, "mixed-precision-code", "at step 1 0.0001,", "at step 1 0.0011,"),
    "the largest difference": lambda c: _edit_output(c, "mixed-precision-code", "largest difference 0.1071", "largest difference 0.0271"),
    "a dtype": lambda c: _edit_output(c, "mixed-precision-code", "logits bfloat16", "logits float32"),
    "ln V": lambda c: _edit_output(c, "quick-learns-code", "ln 3000 = 8.006", "ln 3000 = 8.060"),
    "a validation loss": lambda c: _edit_output(c, "quick-learns-code", "step 200 4.673", "step 200 5.673"),
    "a BLEU score": lambda c: _edit_output(c, "quick-learns-code", "step 300 13.42", "step 300 10.42"),
    "e^loss": lambda c: _edit_output(c, "quick-learns-code", "-> 66)", "-> 67)"),
    "a number in a reading": lambda c: _edit_source(c, "mixed-precision-reading", "0.1071", "0.1017"),
    "a number in the quick reading": lambda c: _edit_source(c, "quick-learns-reading", "13.42", "14.42"),
    "the order of the cells": lambda c: _swap(c, "mixed-precision-code", "quick-learns-code"),
}


@pytest.mark.parametrize("what", PERTURBATIONS)
def test_the_checks_catch_a_change(what, first_steps):
    cells = _cells()
    assert all_errata(cells, first_steps) == []                      # the committed cells agree
    assert all_errata(PERTURBATIONS[what](cells), first_steps), f"a changed {what} went unnoticed"


def test_the_first_step_check_catches_other_code(first_steps):
    """The first losses are recomputed from the cell's own code: another seed there is noticed."""
    assert training_errata(_cells(), {**first_steps, "float32": first_steps["float32"] + 0.01})


@pytest.mark.parametrize("field, value", [("val_bleu", 12.0), ("val_loss", 4.3)])
def test_the_quick_check_holds_the_printed_curve_to_the_saved_run(tmp_path, field, value):
    """The printed curve is the one in results/quick-en-de: a saved run that says another number is noticed."""
    saved = REPO / "results" / "quick-en-de"
    assert quick_errata(_cells(), saved) == []
    history = json.loads((saved / "history.json").read_text())
    next(h for h in reversed(history) if field in h)[field] = value
    (tmp_path / "history.json").write_text(json.dumps(history))
    (tmp_path / "summary.json").write_text((saved / "summary.json").read_text())
    assert quick_errata(_cells(), tmp_path)
