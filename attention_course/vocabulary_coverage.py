"""How familiar a sentence is to a trained translator: the words its BPE vocabulary holds whole.

Byte-pair encoding merges the most frequent character sequences first, so a word the training
text used often becomes one token, and a word it saw rarely or never is spelled out in pieces
("favourite" -> f av our ite). The share of words spelled in pieces is therefore an honest,
cheap sign that a sentence is far from what the model learned from: no training data needed.
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

FAR_SHARE = 0.25  # from this share of words in pieces on, the sentence is called far from the training text
METASPACE = "\u2581"  # "▁": the tokenizer's mark of a word's start, a token of its own before a character it lacks


@dataclass(frozen=True)
class Coverage:
    """The words of one sentence, and those the vocabulary does not hold whole."""

    words: tuple[str, ...]
    in_pieces: tuple[tuple[str, tuple[str, ...]], ...]  # (word, its subword pieces), as the reader wrote them
    unknown: tuple[str, ...] = ()  # characters the vocabulary has no token for at all (<unk>), as written

    @property
    def share_in_pieces(self) -> float:
        return len(self.in_pieces) / len(self.words) if self.words else 0.0

    @property
    def far(self) -> bool:
        return self.share_in_pieces >= FAR_SHARE


def coverage(tok: Tokenizer, text: str) -> Coverage:
    """Group `text`'s tokens by word; a word (with at least one letter) in more than one token is in pieces.
    Words and pieces are quoted from `text` itself (by the tokens' offsets), so a character the vocabulary lacks
    shows as the reader wrote it, not as <unk>."""
    enc = tok.encode(text, add_special_tokens=False)
    unk = tok.token_to_id("<unk>")
    groups: dict[int, list[tuple[int, int, bool]]] = {}
    for word_id, (start, end), token_id, token in zip(enc.word_ids, enc.offsets, enc.ids, enc.tokens, strict=True):
        if word_id is not None and token != METASPACE:  # a bare word-start mark before <unk>: no piece of the word
            groups.setdefault(word_id, []).append((start, end, token_id == unk))
    words, in_pieces, unknown = [], [], []
    for spans in groups.values():
        unknown += [c for c in (text[s:e].strip() for s, e, is_unk in spans if is_unk) if c and c not in unknown]
        word = text[min(s for s, _, _ in spans):max(e for _, e, _ in spans)].strip()
        if not any(ch.isalpha() for ch in word):
            continue  # punctuation, numbers, emoji: not words the note is about
        words.append(word)
        if len(spans) > 1:
            in_pieces.append((word, tuple(p for p in (text[s:e].strip() for s, e, _ in spans) if p)))
    return Coverage(tuple(words), tuple(in_pieces), tuple(unknown))


def coverage_note(cov: Coverage, trained_on: str) -> str:
    """One or two sentences for a reader; "" when every word is whole in the vocabulary and every character has a
    token (an emoji in an otherwise familiar sentence is named: the model writes words for it that mean nothing)."""
    if not cov.in_pieces and not cov.unknown:
        return ""
    note = ""
    if cov.in_pieces:
        listed = ", ".join(f"{word} ({' '.join(pieces)})" for word, pieces in cov.in_pieces)
        note = (f"{len(cov.in_pieces)} of {len(cov.words)} words are not in the model's vocabulary as whole words, "
                f"so it saw them rarely or never: {listed}. ")
    if cov.unknown:
        note += (f"{'It' if note else 'The model'} has no token at all for {', '.join(cov.unknown)}: each reaches it "
                 "as the same unknown token, and the translation may have words for it that mean nothing.")
    note = note.rstrip()
    if cov.far:
        note += (f" This sentence is far from what the model learned from ({trained_on}); expect a rough "
                 "translation.")
    return note
