"""Render results/translator.json as the README's results table.

    python -m attention_course.results [results/translator.json]

Each entry of the file is one (run, test set): src, tgt, test_set, bleu (sacreBLEU, cased,
detokenized), bleu_lc (lowercased, the number the literature reports), signature, device,
train_seconds, tokens_per_second, config, commit, hypotheses (the committed system output,
so anyone can re-score it with `sacrebleu REF -i HYP`).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .paths import course_file, lazy_paths


def results_file() -> Path:
    return course_file("results", "translator.json")


__getattr__ = lazy_paths(__name__, {"RESULTS_FILE": results_file})  # RESULTS_FILE: looked up when asked for

ORDER = {"test_2016_flickr": 0, "test_2017_flickr": 1, "test_2017_mscoco": 2}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def table(path: str | Path | None = None) -> str:
    """A Markdown table, one row per (config, language pair, test set), plus the signatures used."""
    runs = json.loads(Path(path if path is not None else results_file()).read_text())
    runs = sorted(runs, key=lambda r: (not r["config"].startswith("gpu"), r["config"], r["src"], r["tgt"],
                                       ORDER.get(r["test_set"], 9)))
    lines = ["| config | pair | test set | BLEU | BLEU -lc | decoding | training | tokens/s | device | output |",
             "|---|---|---|---:|---:|---|---:|---:|---|---|"]
    for r in runs:
        lines.append(f"| `{r['config']}` | {r['src']}→{r['tgt']} | {r['test_set']} | {r['bleu']:.1f} | "
                     f"{r['bleu_lc']:.1f} | {r.get('decoding', '')} | {_minutes(r['train_seconds'])} | "
                     f"{r['tokens_per_second']:,} | {r['device']} | [{Path(r['hypotheses']).name}]({r['hypotheses']}) |")
    signatures = sorted({r["signature"] for r in runs} | {r.get("signature_lc", "") for r in runs} - {""})
    notes = {r["config"]: r["note"] for r in runs if r.get("note")}
    if notes:
        lines.append("")
        lines.extend(f"- `{config}`: {note}." for config, note in notes.items())
    lines.append("")
    lines.append("sacreBLEU signatures: " + "; ".join(f"`{s}`" for s in signatures) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(table(argv[0] if argv else None), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
