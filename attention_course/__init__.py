"""Attention, step by step: the library behind the course notebooks.

Reference components are *extracted* from the solution notebooks (cells marked ``#| export``)
by ``attn-course build``; the translator's engine (model, decoding, training, evaluation) and
the plotting helpers live beside them. This package needs neither the grader nor nbgrader, and
finds a course's files (data, models, results) from the current folder (see ``paths``).
"""

__version__ = "0.1.0"
