"""Typed outcomes of grading, read as fields and never parsed back out of English.

* `Verdict`: one test cell's result, with the catalogued mistake it matches (its name, as data)
  and, where the comparison knew them, short summaries of the expected and received values.
* `Status`: what happened to a notebook as a whole (an enum), with a free-text `detail`.

Both are decided by the trusted grader; nothing here comes from the sandbox (the sandbox sends
outcomes, serialize.py, and mistakes are diagnosed outside it: trusted.py). What is read back from
a file the grader wrote (the verdicts file nbgrader's preprocessor reads, the saved runs) goes
through `Verdict.from_dict` / `status_from_text`, which accept plain data of the expected types only.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any

EXTENDED = "extension"  # how the note on a grade due later than the class (attn-course extend) starts
BY_HAND = "set by hand"  # how a note about a score typed in formgrader starts (grades.csv's notes column)
REFUSED = "not accepted"  # how a note about an exercise refused for academic honesty starts (grades.csv's notes)
AS_HANDED_IN = "as handed in"  # how a note about the notebook's form starts (a copied cell, another kernel): no points


class Status(StrEnum):
    """What happened to a notebook as a whole. The value is how grades.csv's status column starts
    (`status_text`), as it always has: instructors filter on it."""

    OK = "ok"  # graded, nothing went wrong
    MISSING = "missing"  # no notebook was submitted for this assignment
    UNREADABLE = "unreadable notebook"  # the file is not a notebook the grader can read
    WRONG_NOTEBOOK = "wrong notebook"  # a notebook, but with none of the assignment's answer cells (another one's)
    ERROR = "error"  # the grader or nbgrader failed on this notebook
    TIMEOUT = "timeout"  # a cell or the notebook ran past its time limit
    CRASH = "crash"  # the kernel died (a signal, a file past the size limit)
    EXIT = "exit"  # the notebook ended its own process (os._exit)
    MEMORY = "memory"  # killed, most likely for memory
    CHANNEL = "channel"  # the results channel broke a rule (too much data, an unknown frame)
    SANDBOX = "sandbox"  # graded, but not in an isolating sandbox (the detail says which)
    INCIDENT = "grader incident"  # not graded: the sandbox could not run it (nothing of the student's ran)

    @classmethod
    def of_incident(cls, kind: str) -> "Status":
        """The status for a sandbox incident's kind (sandbox.Incident.kind); ERROR for one unknown here."""
        try:
            return cls(kind)
        except ValueError:
            return cls.ERROR


KEPT_OVER_A_FAILURE = "a later run could not grade this notebook"  # a row's note: the grade saved before stands
GRADERS_OWN = (Status.INCIDENT, Status.ERROR)  # failures of the grader, not grades: never saved as done, no score


def status_text(status: Status, detail: str = "") -> str:
    """The status as grades.csv and the tables show it: 'ok', or 'timeout: <detail>'."""
    return f"{status.value}: {detail}" if detail else status.value


def status_from_text(text: str) -> tuple[Status, str, list[str]]:
    """(status, detail, notes) of a status written before statuses were typed (saved runs of an
    older grader): the longest Status value the text starts with, the rest as detail; an 'ok'
    followed by a bracket held the submission notes then. Raises ValueError when no kind fits."""
    for status in sorted(Status, key=lambda s: -len(s.value)):
        if text == status.value:
            return status, "", []
        if text.startswith(status.value + ": "):
            return status, text[len(status.value) + 2:], []
        if text.startswith(status.value + " (") and text.endswith(")"):
            rest = text[len(status.value) + 2:-1]
            return (status, "", [rest]) if status is Status.OK else (status, rest, [])
    raise ValueError(f"not a status: {text[:80]!r}")


def summarize(parts: list[tuple[Status, str]]) -> tuple[Status, str, list[Status]]:
    """(status, detail, the kinds after the first) for a run's incidents in order: the first
    incident's kind is the status; the others keep their kind in the detail text ('...; crash: ...'),
    so the status column reads as it always has. (OK, '', []) when nothing went wrong."""
    if not parts:
        return Status.OK, "", []
    (first, detail), rest = parts[0], parts[1:]
    detail = "; ".join([detail, *(status_text(kind, text) for kind, text in rest)])
    return first, detail, [kind for kind, _ in rest]


_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """`text` with lone UTF-16 surrogates (a student's `raise ValueError("\\ud800")`, a JSON escape in a
    notebook) replaced by U+FFFD: every file the grader writes is UTF-8, which cannot hold them, and one
    made nbgrader fail on the notebook, an error of the grader's for a student's own text."""
    return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


@dataclass
class Verdict:
    """One test cell's result, decided by the trusted grader."""

    passed: bool
    message: str = ""  # why it failed, for the student (names the mistake too, in words)
    note: str = ""  # for a passed cell: what the student should still know (which dependency was replaced)
    cause: str = ""  # what decided a failure (missing, notimpl, error, value, ...): the grader's own use
    mistake: str = ""  # the catalogued mistake's name the output matches ("" when none was recognised)
    expected: str = ""  # a short summary of the expected value, where the comparison knew one
    received: str = ""  # ... and of the student's

    def __post_init__(self) -> None:
        self.message, self.note = encodable(self.message), encodable(self.note)
        self.expected, self.received = encodable(self.expected), encodable(self.received)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the verdicts file, the saved runs)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, payload: Any) -> "Verdict":
        """A verdict read back: a dict with `passed` (a bool) and any of the other fields, each a
        str; anything else (a wrong type, an unknown key) is refused with ValueError."""
        return cls(**plain_fields(cls, payload, required=("passed",)))


def plain_fields(cls, payload: Any, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """`payload` checked against the dataclass `cls`'s str/bool/float fields: a dict whose keys are
    fields of `cls` (those in `required` present) and whose values have exactly the field's type
    (a bool is no number; an int is taken for a float). Fields of other types are the caller's to
    check. ValueError otherwise."""
    if not isinstance(payload, dict):
        raise ValueError(f"{cls.__name__}: expected a dict, got {type(payload).__name__}")
    types = {f.name: f.type for f in fields(cls)}
    unknown = sorted(set(payload) - set(types), key=str)
    missing = [name for name in required if name not in payload]
    if unknown or missing:
        raise ValueError(f"{cls.__name__}: unknown fields {unknown[:5]}, missing fields {missing}")
    for name, value in payload.items():
        kind = {"str": str, "bool": bool, "float": float}.get(types[name])
        ok = type(value) is kind or (kind is float and type(value) is int)
        if kind is not None and not ok:
            raise ValueError(f"{cls.__name__}.{name}: expected {types[name]}, got {type(value).__name__}")
    return dict(payload)


def is_blank(r) -> bool:
    """Handed in, but no exercise attempted: every graded cell failed as still unwritten."""
    return r.status is not Status.MISSING and bool(r.cells) and all(
        c.score == 0 and getattr(c, "cause", "") == "notimpl" for c in r.cells)
