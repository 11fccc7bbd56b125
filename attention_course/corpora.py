"""Texts the course ships as package data (attention_course/texts/): notebook 07's small GPT learns
from one. Read through the package, so an installed copy finds them from any folder."""
from __future__ import annotations

from importlib.resources import files


def shakespeare() -> str:
    """About 300 KB of Shakespeare's plays (public domain; the source is in texts/README.md)."""
    return (files("attention_course") / "texts" / "shakespeare.txt").read_text(encoding="utf-8")
