# nbgrader configuration shared by every course directory the tools create
# (`attn-course build`, `check`, `grade`). Each of those writes a small nbgrader_config.py
# that loads this file and then sets its own CourseDirectory.root.
c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads the file

c.CourseDirectory.course_id = "attention-step-by-step"
# No exchange (a class graded from an LMS's zip) is said once, not at every formgrader page (autograder.exchange)
c.ExchangeFactory.list = "autograder.exchange.ListWithoutExchangeSaidOnce"

# Student stubs: a clear instruction, and an exception the checks recognise as "not attempted".
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# The ungraded "Think about it" answer cells carry their reference answer between
# <!-- BEGIN SOLUTION --> and <!-- END SOLUTION --> in a plain markdown cell: no gradebook row,
# no points, and the student version shows YOUR ANSWER HERE. nbgrader only clears regions in
# cells without solution metadata when enforce_metadata is off; tests/test_build.py checks that
# no reference answer reaches notebooks/.
c.ClearSolutions.enforce_metadata = False

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
# The page (templates/feedback) names each test cell with its exercise, shows the
# student's own outputs (bounded when the submission was normalized, sanitized here), wraps
# long lines, and loads no script: math is drawn as SVG when the page is written
# (plugins.markdown2html), so it renders offline and the page is one self-contained file.
c.GenerateFeedback.preprocessors = [
    "autograder.plugins.GetGradesApart",
    "autograder.plugins.ScrubHiddenTests",
    "autograder.plugins.NameTestCells",
    "autograder.plugins.FeedbackLateness",  # handed in, due, how late, what it cost
    "nbconvert.preprocessors.sanitize.SanitizeHTML",  # student markdown and outputs: no <script>, no on* handlers
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.SanitizeHTML.enabled = True  # nbconvert's preprocessors are off unless enabled


def _feedback_templates():
    """autograder/templates (this file is exec'd from each course's config: no __file__ of its own)."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("autograder")
    return os.path.join(os.path.dirname(spec.origin), "templates") if spec and spec.origin else None


# The page is written by an exporter class of its own, configured under its own name: settings
# under HTMLExporter reach every HTML exporter in the process, formgrader's included, which
# renders a submission with its own 'formgrade' template (FormgradeExtension) and failed with
# TemplateNotFound when handed this one. nbgrader's settings for feedback under HTMLExporter
# (template_name "feedback", the folder of bootstrap.min.css) still reach this subclass; the
# settings below, under its own name, take precedence over them.
c.GenerateFeedback.exporter_class = "autograder.plugins.FeedbackExporter"
if _feedback_templates():
    c.FeedbackExporter.extra_template_basedirs = [_feedback_templates()]
    c.FeedbackExporter.template_name = "feedback"
    c.FeedbackExporter.filters = {"markdown2html": "autograder.plugins.markdown2html"}

# formgrader draws a submission (the autograded notebook) with a plain HTMLExporter on the Jupyter
# server's origin, in the instructor's session: a student's <script>, or an onerror=, would run as the
# instructor (it could start a kernel). Its exporter makes every cell and output inert first
# (plugins.StudentHTML), including notebooks an older grader wrote; formgrader's own scripts are the
# template's and stay. (HTMLExporter.sanitize_html does not reach the 'formgrade' template.) Every
# course's config loads this file when its server starts, so a grading output made before this is
# covered. The feedback page has its own sanitising (above) and keeps it alone.
c.HTMLExporter.preprocessors = ["autograder.plugins.StudentHTML"]
# No anchors on headings either: a student's `## test_softmax` became an element with id "test_softmax"
# ahead of the score box of that id, which formgrader's script then bound instead (outputs.SAFE_CLASSES).
c.HTMLExporter.exclude_anchor_links = True
c.FeedbackExporter.preprocessors = []
