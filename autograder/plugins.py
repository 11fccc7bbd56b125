"""nbgrader preprocessors of our own."""
from __future__ import annotations

import re

from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ScrubHiddenTests(NbGraderPreprocessor):
    """Make a feedback notebook safe to hand to a student.

    Hidden-test regions are removed from test cells, and every error output is reduced to
    its exception type and message: a traceback quotes source lines, and those lines can be
    hidden tests or the grader's own checks. The message is written for the student.
    """

    def preprocess(self, nb, resources):
        clear = ClearHiddenTests(enforce_metadata=False)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            clear._remove_hidden_test_region(cell)
            for output in cell.get("outputs", []):
                if output.output_type == "error":
                    message = _ANSI.sub("", f"{output.ename}: {output.evalue}")
                    output.traceback = [message]
        return nb, resources
