"""Cells of the tables the grader writes (grades.csv, grades_wide.csv), made safe to open in a
spreadsheet.

Much of a row is text a student chose: names of files inside a zip, the notes about them, a
student id from a roster, the code flagged for review. Excel, LibreOffice and Google Sheets read a
cell that starts with ``=``, ``+``, ``-`` or ``@`` (also after a tab, a carriage return or a line
break) as a formula, which can run commands (DDE) or send data away (``HYPERLINK``). Every CSV
writer passes its rows through `safe_row`: such a cell gets a leading ``'`` (OWASP's advice; the
spreadsheet shows the text, and a reader that strips the quote gets it back unchanged). A cell
that is a plain number (the scores the grader wrote, ``-0.5``, ``1e+06``) is a number, not a
formula, and is left as it is.

The HTML report (report.py) escapes every text it interpolates with ``html.escape`` and the
feedback template uses ``escape_html``: nothing to add for HTML here.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from .printable import printable

# What starts a formula: the four operators, their full-width forms (some spreadsheets fold them),
# and the control characters after which a spreadsheet still sees them.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def safe_cell(value: object) -> str:
    """`value` as the text of a CSV cell that no spreadsheet runs as a formula: a `'` before any
    text that starts (after leading spaces) with a formula character, unless the whole text is a
    plain number. None is an empty cell; numbers are written as they are."""
    if value is None:
        return ""
    text = printable(value if isinstance(value, str) else str(value))  # no control sequence, no undecodable byte
    if _NUMBER.fullmatch(text):
        return text
    if text.startswith(FORMULA_STARTS) or text.lstrip(" ").startswith(FORMULA_STARTS):
        return "'" + text
    return text


def safe_row(values: Iterable[object]) -> list[str]:
    """A row for csv.writer, every cell through `safe_cell`."""
    return [safe_cell(v) for v in values]
