# nbgrader configuration shared by every course directory the tools create
# (`attn-course build`, `check`, `grade`). Each of those writes a small nbgrader_config.py
# that loads this file and then sets its own CourseDirectory.root.
c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads the file

c.CourseDirectory.course_id = "attention-step-by-step"

# Student stubs: a clear instruction, and an exception the checks recognise as "not attempted".
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Per-cell time limit. The default (30 s) is tight for a first torch import on a busy 2-core
# laptop; the whole-notebook wall clock is enforced by the grader around nbgrader.
c.Execute.timeout = 120
c.Execute.startup_timeout = 120
c.Execute.interrupt_on_timeout = True

# nbgrader scores a test cell 0 when it wrote *anything* to stderr. Library warnings
# (RuntimeWarning, UserWarning, DeprecationWarning, ...) must not cost a student points.
# IgnorePattern needs both settings: enabled alone does nothing, pattern alone is ignored.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"Warning"

# Feedback: never show hidden tests, nor tracebacks that could quote them (see plugins.py).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "autograder.plugins.ScrubHiddenTests",
    "nbconvert.preprocessors.sanitize.SanitizeHTML",  # student markdown and outputs: no <script>, no on* handlers
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.SanitizeHTML.enabled = True  # nbconvert's preprocessors are off unless enabled
