"""Attention, step by step: the library behind the course notebooks.

Reference components are *extracted* from the solution notebooks (cells marked ``#| export``)
by ``attn-course build``; hand-written helpers (plotting, the build and the CLI) live beside them.
"""

__version__ = "0.1.0"
