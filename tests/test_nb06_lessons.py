"""Notebook 06's lessons on checkpoint averaging and on the English → French run print numbers in their
committed outputs: validation BLEU before and after averaging (models/gpu.en-*/history.json and
summary.json), the French and German translations of four test sentences (results/hypotheses/), and
the recorded test BLEU with its sacreBLEU signatures (results/translator.json). The notebook is not
re-run for this: the committed outputs are read and compared with those files, so a change on
either side (a retrained model, a re-recorded result, an edited output) is an erratum caught here.
The checks are also run on perturbed copies of the files, to show they notice."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from .layout import NOTEBOOKS, REPO, names_read_from_elsewhere

ASSIGNMENT = "06_transformer_translator"
SOLUTION = REPO / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
RUNS = ("gpu.en-de", "gpu.en-fr")
NEW_CELLS = ["ckpt-avg", "ckpt-avg-code", "ckpt-avg-picture", "ckpt-avg-figure", "ckpt-avg-reading",
             "en-fr", "en-fr-translate", "en-fr-scores", "en-fr-bleu", "en-fr-reading"]
CODE_CELLS = ["ckpt-avg-code", "ckpt-avg-figure", "en-fr-translate", "en-fr-bleu"]


def _cells(path: Path = SOLUTION) -> dict:
    return {c.get("id"): c for c in nbformat.read(path, as_version=4).cells}


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _json(root: Path, *parts: str):
    return json.loads(root.joinpath(*parts).read_text(encoding="utf-8"))


def _gpu_entries(root: Path) -> dict:
    """results/translator.json's `gpu` entries by (src, tgt, test set)."""
    return {(r["src"], r["tgt"], r["test_set"]): r for r in _json(root, "results", "translator.json")
            if r["config"] == "gpu"}


# --------------------------------------------------------------------------- the checks, on any copy of the files
AVERAGING_LINE = re.compile(
    r"^(?P<name>gpu\.en-\w+): greedy validation BLEU of the last checkpoint \(step (?P<step>[\d,]+), history\.json\) "
    r"(?P<last>[\d.]+); of the mean of the last (?P<k>\d+) \(steps (?P<first>[\d,]+)-(?P<final>[\d,]+), summary\.json\) "
    r"(?P<mean>[\d.]+): (?P<gain>[+-][\d.]+); best single evaluation (?P<best>[\d.]+) \(step (?P<best_step>[\d,]+)\); "
    r"learning rate at the last step (?P<lr>[\d.e-]+) = (?P<ratio>[\d.]+) x its peak$", re.M)


def averaging_errata(cells: dict, root: Path) -> list[str]:
    """What the checkpoint-averaging cells print that the models' files do not say."""
    errata = []
    code = _printed(cells["ckpt-avg-code"])
    if "largest difference 0.0e+00" not in code:
        errata.append(f"the readable mean is not the library's average_state_dicts: {code.splitlines()[:1]}")
    found = {m["name"]: m for m in AVERAGING_LINE.finditer(_printed(cells["ckpt-avg-figure"]))}
    for name in RUNS:
        if name not in found:
            errata.append(f"{name}: no averaging line printed")
            continue
        m = found[name]
        summary = _json(root, "models", name, "summary.json")
        history = _json(root, "models", name, "history.json")
        recipe = _json(root, "models", name, "config.json")["train"]
        evals = [h for h in history if "val_bleu" in h]
        last, best = evals[-1], max(evals, key=lambda h: h["val_bleu"])
        every, k, steps = recipe["checkpoint_every"], recipe["average_last"], summary["steps"]
        averaged = sorted(set(range(every, steps + 1, every)) | {steps})[-k:]   # what the trainer keeps
        mean = summary["val_bleu_greedy"]
        expected = {
            "step": f"{steps:,}", "last": f"{last['val_bleu']:.2f}", "k": str(k), "first": f"{averaged[0]:,}",
            "final": f"{averaged[-1]:,}", "mean": f"{mean:.2f}", "gain": f"{mean - last['val_bleu']:+.2f}",
            "best": f"{best['val_bleu']:.2f}", "best_step": f"{best['step']:,}", "lr": f"{last['lr']:.2g}",
            "ratio": f"{last['lr'] / recipe['peak_lr']:.2f}"}
        errata += [f"{name}: prints {field} {m[field]}, the files say {value}"
                   for field, value in expected.items() if m[field] != value]
        if last["step"] != steps:
            errata.append(f"{name}: the last evaluation (step {last['step']}) is not of the last checkpoint ({steps})")
        if summary["weights"] != f"average of the last {k} checkpoints":
            errata.append(f"{name}: summary.json's weights are {summary['weights']!r}, not the mean the lesson shows")
    return errata


def french_errata(cells: dict, root: Path) -> list[str]:
    """What the English → French cells print that results/ and the models' summaries do not say."""
    errata = []
    entries = _gpu_entries(root)
    text = _printed(cells["en-fr-translate"])
    blocks = [dict(line.split("  ", 1) for line in block.splitlines())
              for block in text.split("\n\n") if block.startswith("en  ")]
    if len(blocks) != 4:
        errata.append(f"expected 4 translated sentences, found {len(blocks)}")
    settings = []
    for name in RUNS:
        tgt = name.rsplit("-", 1)[1]
        entry = entries[("en", tgt, "test_2016_flickr")]
        lines = root.joinpath(entry["hypotheses"]).read_text(encoding="utf-8").splitlines()[:len(blocks)]
        shown = [b.get(tgt) for b in blocks]
        if shown != lines:
            errata.append(f"{name}: the printed translations are not the first lines of {entry['hypotheses']}")
        lp = _json(root, "models", name, "summary.json")["length_penalty"]
        settings.append(f"{name}: beam {lp['beam']}, length penalty {lp['chosen']:g}")
        if not entry["decoding"].startswith(f"beam {lp['beam']}, length penalty {lp['chosen']:g} "):
            errata.append(f"{name}: summary.json's decoding ({lp}) is not the recorded one ({entry['decoding']})")
    if "; ".join(settings) not in text:
        errata.append(f"the decoding settings printed are not {'; '.join(settings)!r}")
    if "NOT the same" in text or text.count(": the same") != len(RUNS):
        errata.append("the translations printed differ from the recorded hypotheses")

    text = _printed(cells["en-fr-bleu"])
    for (src, tgt, test_set), r in entries.items():
        if (src, tgt) not in {("en", "de"), ("en", "fr")}:
            continue
        row = re.search(rf"^{test_set}\s+(.*)$", text, re.M)
        column = 0 if tgt == "de" else 2
        numbers = row[1].split() if row else []
        if numbers[column:column + 2] != [f"{r['bleu']:.2f}", f"{r['bleu_lc']:.2f}"]:
            errata.append(f"en→{tgt} {test_set}: the table prints {numbers[column:column + 2]}, "
                          f"results/translator.json says {r['bleu']:.2f}, {r['bleu_lc']:.2f}")
        if test_set == "test_2016_flickr":
            line = (f"en→{tgt} test_2016_flickr: BLEU {r['bleu']:.2f} ({r['signature']}), -lc {r['bleu_lc']:.2f} "
                    f"({r['signature_lc']}); {r['decoding']}; weights: {r['weights']}; recorded at commit {r['commit'][:10]}")
            if line not in text.splitlines():
                errata.append(f"en→{tgt} test_2016_flickr: no line {line!r}")
    return errata


# --------------------------------------------------------------------------- the committed notebook
def test_the_averaging_lesson_prints_what_the_models_files_say():
    assert averaging_errata(_cells(), REPO) == []


def test_the_french_lesson_prints_what_results_and_the_models_say():
    assert french_errata(_cells(), REPO) == []


def test_the_new_cells_are_in_place_ungraded_and_released_without_outputs():
    solution, release = _cells(), _cells(NOTEBOOKS / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    ids = list(solution)
    assert len(ids) == len(set(ids))
    assert ids.index("ckpt-avg") == ids.index("cell-027") + 1          # after the training curves (section 9)
    assert ids.index("en-fr") == ids.index("cell-050") + 1             # after the BLEU table (section 11)
    assert ids[ids.index("ckpt-avg"):ids.index("ckpt-avg") + 5] == NEW_CELLS[:5]
    assert ids[ids.index("en-fr"):ids.index("en-fr") + 5] == NEW_CELLS[5:]
    for name in NEW_CELLS:
        cell = solution[name]
        assert "nbgrader" not in cell.metadata
        if cell.cell_type == "code":
            assert cell.metadata.get("tags") == ["grader-skip"] and cell.execution_count and cell.outputs
            assert not any(o.get("output_type") == "error" for o in cell.outputs)
            assert release[name].source == cell.source and not release[name].outputs
    assert any(o.get("output_type") == "display_data" for o in solution["ckpt-avg-figure"].outputs)


@pytest.mark.parametrize("name", CODE_CELLS)
def test_each_new_code_cell_runs_on_its_own(name):
    """Every name a new cell reads is imported or defined in it (or a builtin): it was executed alone, and
    runs the same after any earlier cell is changed."""
    elsewhere = names_read_from_elsewhere(_cells()[name].source)
    assert not elsewhere, f"{name} reads names of earlier cells: {sorted(elsewhere)}"


def test_the_prose_types_no_recorded_score():
    """The scores are printed from the files, not typed in the new markdown (where they would go stale)."""
    solution = _cells()
    scores = {f"{r[k]:.2f}" for r in _gpu_entries(REPO).values() for k in ("bleu", "bleu_lc")}
    for name in RUNS:
        summary = _json(REPO, "models", name, "summary.json")
        scores |= {f"{summary['val_bleu_greedy']:.2f}", f"{summary['val_bleu_greedy']:.1f}"}
        scores |= {f"{h['val_bleu']:.2f}" for h in _json(REPO, "models", name, "history.json") if "val_bleu" in h}
    for cell in (solution[n] for n in NEW_CELLS if solution[n].cell_type == "markdown"):
        typed = sorted(s for s in scores if re.search(rf"(?<![\d.]){re.escape(s)}(?![\d])", cell.source))
        assert not typed, f"{cell.id} types {typed}"


# --------------------------------------------------------------------------- the checks notice a change
def _copy_of_the_files(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    (root / "results").mkdir(parents=True)
    shutil.copy(REPO / "results" / "translator.json", root / "results" / "translator.json")
    for entry in _gpu_entries(REPO).values():
        (root / entry["hypotheses"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / entry["hypotheses"], root / entry["hypotheses"])
    for name in RUNS:
        (root / "models" / name).mkdir(parents=True)
        for file in ("summary.json", "history.json", "config.json"):
            shutil.copy(REPO / "models" / name / file, root / "models" / name / file)
    return root


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _result(tgt: str, test_set: str = "test_2016_flickr"):
    return lambda runs: next(r for r in runs if r["config"] == "gpu" and r["tgt"] == tgt and r["test_set"] == test_set)


PERTURBATIONS = {
    "en-fr test BLEU": ("results/translator.json", lambda d: _result("fr")(d).update(bleu=_result("fr")(d)["bleu"] + 0.01)),
    "en-de test BLEU -lc": ("results/translator.json", lambda d: _result("de", "test_2017_mscoco")(d).update(bleu_lc=1.0)),
    "en-fr signature": ("results/translator.json",
                        lambda d: _result("fr")(d).update(signature=_result("fr")(d)["signature"].replace("13a", "intl"))),
    "en-de decoding": ("results/translator.json",
                       lambda d: _result("de")(d).update(decoding="beam 4, length penalty 1.2 (chosen on val)")),
    "averaged val BLEU": ("models/gpu.en-de/summary.json", lambda d: d.update(val_bleu_greedy=41.0)),
    "chosen length penalty": ("models/gpu.en-fr/summary.json", lambda d: d["length_penalty"].update(chosen=1.0)),
    "last val BLEU": ("models/gpu.en-fr/history.json", lambda d: d[-1].update(val_bleu=57.0)),
    "checkpoints averaged": ("models/gpu.en-de/config.json", lambda d: d["train"].update(average_last=5)),
}


@pytest.mark.parametrize("what", PERTURBATIONS)
def test_the_checks_catch_a_changed_file(tmp_path, what):
    root = _copy_of_the_files(tmp_path)
    cells = _cells()
    assert averaging_errata(cells, root) + french_errata(cells, root) == []     # the copy agrees
    path, change = PERTURBATIONS[what]
    _edit_json(root / path, change)
    assert averaging_errata(cells, root) + french_errata(cells, root), f"a changed {what} went unnoticed"


def test_the_checks_catch_a_changed_hypothesis_and_a_changed_output(tmp_path):
    root = _copy_of_the_files(tmp_path)
    hypotheses = root / "results" / "hypotheses" / "gpu.en-fr.test_2016_flickr.fr"
    lines = hypotheses.read_text(encoding="utf-8").splitlines()
    hypotheses.write_text("\n".join(["Un homme."] + lines[1:]) + "\n", encoding="utf-8")
    assert french_errata(_cells(), root)

    cells = _cells()
    for out in cells["ckpt-avg-figure"].outputs:
        if out.get("output_type") == "stream":
            out["text"] = out["text"].replace("40.43", "40.34")
    assert averaging_errata(cells, REPO)
