# Settings for grading courses only (appended to a grading course's nbgrader_config.py, and
# loaded by the repository's own nbgrader_config.py): nbgrader runs nothing of the student's.
# Test cells get their verdicts from TrustedVerdicts (decided outside the student's process, in
# the sandbox); deleted test cells are put back so they count as failed, not as missing.
c.Autograde.autograde_preprocessors = [  # noqa: F821 - `c` comes from the file that loads this one
    "autograder.plugins.TrustedVerdicts",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
c.OverwriteCells.add_missing_cells = True  # noqa: F821
