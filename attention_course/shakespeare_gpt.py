"""Notebook 07's character-level GPT, trained once and shipped (models/shakespeare-gpt/), so that notebook 08
reads real text through a sliding window without training it again.

The recipe is notebook 07's, exported into `attention_course.efficient` (CHAR_GPT, char_gpt, train_char_model):
the same seed, steps and data as the notebook's own run. `python -m attention_course.shakespeare_gpt` trains it
again and writes the folder (about a minute on one CPU thread).
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from attention_course.checkpoints import models_dir, sha256
from attention_course.corpora import shakespeare
from attention_course.efficient import CHAR_GPT, TinyDecoder, char_gpt, held_out_loss, train_char_model

NAME = "shakespeare-gpt"
WEIGHTS = "model.pt"
SUMMARY = "summary.json"


@dataclass(frozen=True)
class CharVocabulary:
    """Every character of the text, sorted: token i is chars[i]. Holds the text's held-out tail too."""
    chars: str
    held_out: torch.Tensor          # [N_val] token ids: the last 10 % of the text, as notebook 07 splits it

    def encode(self, text: str) -> torch.Tensor:
        """A string -> token ids [1, T] (a batch of one); ValueError names a character the model never saw."""
        unknown = sorted(set(text) - set(self.chars))
        if unknown:
            raise ValueError(f"characters the model never saw: {unknown!r}; it knows only {self.chars!r}")
        index = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([[index[c] for c in text]])

    def decode(self, tokens: torch.Tensor) -> str:
        """Token ids [T] -> the string they spell."""
        return "".join(self.chars[int(i)] for i in tokens)

    def held_out_loss(self, model: TinyDecoder) -> float:
        """Notebook 07's held-out loss (nats per character) on the last 10 % of the text."""
        return held_out_loss(model, self.held_out, CHAR_GPT["context"])

    def describe(self) -> str:
        return f"a vocabulary of {len(self.chars)} characters, {len(self.held_out):,} held out"


@lru_cache(maxsize=1)
def _data() -> tuple[CharVocabulary, torch.Tensor]:
    """The vocabulary and the training ids, split 90/10 as notebook 07 does (read once per process)."""
    text = shakespeare()
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text])
    split = int(0.9 * len(ids))
    return CharVocabulary(chars, ids[split:]), ids[:split]


def folder() -> Path:
    return models_dir() / NAME


def load_shakespeare_gpt(decoder: type | None = None, **options) -> tuple[TinyDecoder, CharVocabulary]:
    """The shipped model in eval mode, as a TinyDecoder or as the `decoder` subclass given (built with
    `options`, e.g. notebook 08's SlidingWindowDecoder with window=32), and its vocabulary."""
    vocab, _ = _data()
    path = folder() / WEIGHTS
    again = "train it again with `python -m attention_course.shakespeare_gpt` (about a minute on a CPU)"
    if not path.is_file() or not (folder() / SUMMARY).is_file():
        raise FileNotFoundError(f"models/{NAME}/{WEIGHTS} or {SUMMARY} is missing: {again}, or restore the folder "
                                f"with `git checkout -- models/{NAME}`")
    if sha256(path) != json.loads((folder() / SUMMARY).read_text()).get("sha256"):
        raise ValueError(f"models/{NAME}/{WEIGHTS} does not match the SHA-256 in its {SUMMARY} (changed or damaged): "
                         f"{again}, or restore it with `git checkout -- models/{NAME}`")
    model = char_gpt(len(vocab.chars), decoder, **options)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval(), vocab


def train(out: Path) -> dict:
    """Notebook 07's run (seed 0, CHAR_GPT's steps, one thread), saved to `out`; returns the summary written."""
    vocab, train_ids = _data()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = char_gpt(len(vocab.chars))
    started = time.perf_counter()
    losses = train_char_model(model, train_ids, CHAR_GPT["steps"], CHAR_GPT["lr"], desc="Shakespeare GPT",
                              context=CHAR_GPT["context"], batch=CHAR_GPT["batch"])
    seconds = time.perf_counter() - started
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / WEIGHTS)
    summary = {"recipe": CHAR_GPT, "seed": 0, "vocabulary": len(vocab.chars),
               "parameters": sum(p.numel() for p in model.parameters()),
               "final_training_loss": round(losses[-1], 4), "held_out_loss": round(vocab.held_out_loss(model), 4),
               "uniform_guessing": round(math.log(len(vocab.chars)), 4), "seconds": round(seconds, 1),
               "torch": torch.__version__, "threads": 1, "sha256": sha256(out / WEIGHTS)}
    (out / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help=f"folder to write (default: models/{NAME})")
    args = parser.parse_args(argv)
    out = args.out or folder()
    summary = train(out)
    print(f"wrote {out}: held-out loss {summary['held_out_loss']} nats per character "
          f"(uniform guessing {summary['uniform_guessing']}), {summary['seconds']} s")


if __name__ == "__main__":
    main()
