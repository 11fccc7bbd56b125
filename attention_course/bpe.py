"""Joint byte-pair-encoding vocabulary for source and target, with Hugging Face `tokenizers`.

One vocabulary for both languages (so the encoder's and decoder's embeddings and the output
layer can share one matrix), learned on the *training* split only. Text is split on spaces
into words marked with ``▁`` (as sentencepiece does) and punctuation is split off, so decoding
gives back the original detokenized sentence. Special tokens have fixed ids:
``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, ``<unk>`` 3.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
FILE_NAME = "tokenizer.json"


def new_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> Tokenizer:
    """Learn a BPE vocabulary of at most `vocab_size` tokens (specials included) from `texts`."""
    tok = new_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    check_specials(tok)
    return tok


def train_joint_bpe(pairs: Sequence[tuple[str, str]], vocab_size: int = 8000, min_frequency: int = 2) -> Tokenizer:
    """A joint vocabulary for the source and target sides of `pairs` (the training split)."""
    return train_bpe((s for pair in pairs for s in pair), vocab_size, min_frequency)


def with_dropout(tok: Tokenizer, dropout: float) -> Tokenizer:
    """A copy of `tok` whose BPE skips each merge with probability `dropout` (BPE-dropout, Provilkov
    et al. 2020): a word gets a different segmentation each time it is encoded, into the same
    vocabulary. For training batches only; `tok` itself (saved with the run) stays deterministic.
    The draws come from the tokenizers library's own random generator, which cannot be seeded."""
    copy = Tokenizer.from_str(tok.to_str())
    copy.model.dropout = dropout
    return copy


def check_specials(tok: Tokenizer) -> None:
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise ValueError(f"tokenizer: special token {s} should have id {i}, has {tok.token_to_id(s)}")


def save(tok: Tokenizer, folder: str | Path) -> Path:
    path = Path(folder) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def load(folder_or_file: str | Path) -> Tokenizer:
    path = Path(folder_or_file)
    if path.is_dir():
        path = path / FILE_NAME
    tok = Tokenizer.from_file(str(path))
    check_specials(tok)
    return tok


def encode(tok: Tokenizer, texts: Sequence[str], bos: bool = False, eos: bool = True) -> list[list[int]]:
    """Token ids of each text, optionally wrapped in <bos> ... <eos>."""
    out = []
    for enc in tok.encode_batch(list(texts), add_special_tokens=False):
        ids = list(enc.ids)
        out.append(([BOS_ID] if bos else []) + ids + ([EOS_ID] if eos else []))
    return out


def decode(tok: Tokenizer, rows) -> list[str]:
    """Detokenized text of each row of ids (specials and anything after the first <eos> dropped)."""
    texts = []
    for row in rows:
        row = [int(i) for i in row]
        if row and row[0] == BOS_ID:
            row = row[1:]
        if EOS_ID in row:
            row = row[:row.index(EOS_ID)]
        texts.append(tok.decode([i for i in row if i >= len(SPECIALS)], skip_special_tokens=True).strip())
    return texts


def pieces(tok: Tokenizer, text: str) -> list[str]:
    """The subword strings of `text` (for display)."""
    return tok.encode(text, add_special_tokens=False).tokens
