"""`printable`: what a student chose (a file name, an error message) as the instructor's terminal and files may show it."""
from __future__ import annotations

import pytest

from autograder.printable import printable


@pytest.mark.parametrize("text, shown", [
    ("bob/01_similarity_attention.ipynb", "bob/01_similarity_attention.ipynb"),
    ("Zoë Ñandú 漢字 🐶", "Zoë Ñandú 漢字 🐶"),
    ("مهدی\u200cزاده", "مهدی\u200cزاده"),                          # the zero-width non-joiner of a Persian name
    ("\U0001F468\u200d\U0001F469\u200d\U0001F467", "\U0001F468\u200d\U0001F469\u200d\U0001F467"),  # one emoji
    ("C:\\Users\\bob\\work.ipynb", "C:\\Users\\bob\\work.ipynb"),  # backslashes as they are
    ("x\udcff.ipynb", "x\\xff.ipynb"),                              # a byte of a name that was not UTF-8
    ("\x1b]0;PWNED\x07\x1b[2J", "\\x1b]0;PWNED\\x07\\x1b[2J"),       # a title, then a cleared screen
    ("a\nforged row", "a\\x0aforged row"),
    ("\u202egnp.exe", "\\u202egnp.exe"),                             # a right-to-left override
    ("\ud800", "\\ud800"),                                           # a lone surrogate of no file name
])
def test_controls_and_undecodable_bytes_are_shown_as_escapes_and_nothing_else_changes(text, shown):
    assert printable(text) == shown
    printable(text).encode("utf-8")  # every result can be written to a UTF-8 file
