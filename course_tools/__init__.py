"""The tools that tie the library and the grader together: ``attn-course`` (cli), the build that
extracts the library and generates the student notebooks (build), the demo class, the grading
and translator benchmarks, the attack catalogue, and JupyterLab's Validate button (labcheck)."""

import autograder  # noqa: F401  (first: it puts the library beside the grader ahead of PYTHONPATH)
