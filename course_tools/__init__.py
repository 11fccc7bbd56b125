"""The tools that tie the library and the grader together: ``attn-course`` (cli), the build that
extracts the library and generates the student notebooks (build), the demo class, the grading
and translator benchmarks, the attack catalogue, and JupyterLab's Validate button (labcheck)."""
