"""Text a student chose (a file or zip entry's name, an error message), made safe to print and to write.

A file name on Linux is bytes: one that is not UTF-8 reaches Python as lone surrogates, which no UTF-8 file
can hold (one such name stopped every table of a class). And a name may hold terminal control sequences
that clear the instructor's screen, redraw a forged table, set the window title or write the clipboard.
`printable` writes both kinds out as visible escapes, and leaves every other character, accents and
scripts and emoji, as it is."""
from __future__ import annotations

import unicodedata

_ESCAPED = ("Cc", "Cf", "Zl", "Zp", "Cs")  # controls, invisible formatting (bidi overrides), line breaks, surrogates
# formatting characters that are part of how people write: the zero-width non-joiner and joiner (Persian and Indic
# names, emoji sequences) and the tag characters of subdivision flags
_KEPT = frozenset({"\u200c", "\u200d"}) | frozenset(map(chr, range(0xE0020, 0xE0080)))


def printable(text: str) -> str:
    """`text` with each control, format or line-breaking character and each lone surrogate written as an escape
    (`\\x1b`, `\\u202e`, a byte that was not UTF-8 as `\\xff`; the joiners people write names and emoji with are
    kept); unchanged when it holds none."""
    if text.isprintable() and text.isascii():
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in _ESCAPED and ch not in _KEPT else ch for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a name that was not UTF-8 (Python's surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
