"""Where the tests' own course lives: the checkout holding this folder (the tests are part of it)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"
