"""Grading for "Attention, step by step": nbgrader configuration, the self-check and class
grading commands, and the checks that compare student code with the reference."""
