"""Grading for "Attention, step by step": the engine. Handed a course (``course.CourseFolder``),
it runs student code in the sandbox, judges the returned values outside it with the checks that
compare student code with the reference, and keeps the grades in nbgrader's gradebook. It imports
the learners' library (for the reference), never the tools (``course_tools``)."""
