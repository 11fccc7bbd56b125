# The repository is an nbgrader course root: an instructor's usual commands work from here.
#
#   nbgrader generate_assignment 01_similarity_attention   # solutions/ -> build/nbgrader/release/
#   nbgrader collect / zip_collect ...                      # -> build/nbgrader/submitted/<student>/<assignment>/
#   nbgrader autograde 01_similarity_attention             # student code runs in the course's sandbox,
#                                                            verdicts are judged outside it (TrustedVerdicts)
#   nbgrader generate_feedback / export / formgrader        # as usual
#
# The source notebooks are solutions/ (reference answers and hidden tests). The student release
# the course ships, notebooks/, is written by `attn-course build`, which also extracts the library
# and refuses to overwrite a student's edits: nbgrader's own release goes to build/nbgrader/release.
# Everything nbgrader writes here lives under build/nbgrader/ (ignored by git).
import importlib.util
import os

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads the file
_root = os.path.dirname(os.path.abspath(__file__))
_engine = os.path.dirname(importlib.util.find_spec("autograder").origin)  # the grader, wherever it is installed
exec(open(os.path.join(_engine, "nbgrader_config.py")).read())  # the course's shared settings

c.CourseDirectory.root = _root
# collect never takes a submission another user put in a student's name (the inbound is writable by all)
c.ExchangeFactory.collect = "autograder.exchange.OwnerCheckedCollect"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = os.path.join("build", "nbgrader", "release")
c.CourseDirectory.submitted_directory = os.path.join("build", "nbgrader", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("build", "nbgrader", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("build", "nbgrader", "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(_root, "build", "nbgrader", "gradebook.db")
os.makedirs(os.path.join(_root, "build", "nbgrader"), exist_ok=True)

# autograde never runs student code in nbgrader's own kernel: TrustedVerdicts runs it in the
# sandbox and judges the returned values outside (the same path as `attn-course grade`).
exec(open(os.path.join(_engine, "nbgrader_grading_config.py")).read())
