"""Python syntax trees built in the grader's worker threads, one thread at a time.

CPython 3.11 counts the depth of every syntax tree it builds in one counter per process, shared by
its threads (python/cpython#106905 and its like): two threads building trees at once can fail
with "SystemError: AST constructor recursion depth mismatch". The grader judges notebooks in
worker threads, and two of its steps build trees: the honesty scan (`ast.parse` of every cell)
and reading the sandbox's arrays (numpy parses each .npy header with `ast.literal_eval`). In CI
one such collision came back as an unflagged "error" for a notebook the scan should have flagged.
Both steps take turns here; a library parsing in yet another thread cannot be made to wait, so
work that meets the counter's error is done again: the error is about the process, never about
the input.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

TURN = threading.Lock()
TRIES = 3  # a collision needs another thread mid-parse; three in a row is no longer one
_COLLISION = "recursion depth mismatch"


def in_turn(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, which builds syntax trees, while no other grader thread does; done again when
    a parse elsewhere spoilt the counter."""
    for attempt in range(1, TRIES + 1):
        with TURN:
            try:
                return work(*args)
            except SystemError as err:
                if _COLLISION not in str(err) or attempt == TRIES:
                    raise
    raise AssertionError("unreachable")
