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


class TrustedVerdicts(NbGraderPreprocessor):
    """Stands in for nbgrader's Execute during `autograde`: nothing of the student's runs here.

    The verdict of every test cell was decided beforehand, outside the student's process, by
    comparing the values the student's code produced with the reference (autograder/trusted.py).
    This writes each verdict into its cell as nbgrader expects it — no output for a pass, an
    error output carrying the message for a fail — so nbgrader's own SaveAutoGrades records the
    points, and feedback and exports work unchanged.
    """

    def preprocess(self, nb, resources):
        import json
        import os

        from nbformat.v4 import new_output

        path = os.environ.get("ATTN_VERDICTS")
        if not path:
            raise RuntimeError("ATTN_VERDICTS is not set: run grading through `attn-course grade`")
        with open(path) as fh:
            verdicts = json.load(fh)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            cell.outputs = []
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade") and not meta.get("solution"):
                verdict = verdicts.get(meta.get("grade_id"), {"passed": False, "message": "not graded"})
                if not verdict["passed"]:
                    cell.outputs = [new_output("error", ename="Failed", evalue=verdict["message"],
                                               traceback=[f"Failed: {verdict['message']}"])]
        return nb, resources
