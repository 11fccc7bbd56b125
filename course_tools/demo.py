"""The demo class for `make grade`, generated from the solutions (never hand-edited):

* ``full-marks``: every solution cell filled in with the reference solution;
* ``blank``: the student notebooks exactly as released;
* ``typical-mistake``: full marks except one catalogued mistake per notebook (DEMO_MISTAKES),
  which must cost exactly the points of the test cells listed beside it.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import nbformat

from autograder.course import CourseFolder, notebook_path
from autograder.grade import Course, NotebookResult, format_table, grade
from autograder.outcomes import Status
from autograder.sandbox import Limits

from . import adversarial

# The demo's hang must not hold `make grade` for a minute: a shorter cell limit.
DEMO_LIMITS = Limits(cell_seconds=10)

# assignment -> (checks module, graded name, mistake name, test cells it must fail)
DEMO_MISTAKES = {
    "01_similarity_attention": ("nb01", "softmax", "softmax without subtracting the max",
                                {"test_softmax_stability"}),
    "02_queries_keys_values": ("nb02", "SelfAttention", "no 1/sqrt(d_k) scaling",
                               {"test_SelfAttention", "test_SelfAttention_mask", "test_SelfAttention_gradients"}),
    "03_multi_head_attention": ("nb03", "MultiHeadAttention",
                                "out_proj missing (the merged heads are returned without the output projection)",
                                {"test_MultiHeadAttention", "test_MultiHeadAttention_mask", "test_MultiHeadAttention_cross",
                                 "test_MultiHeadAttention_gradients", "test_MultiHeadAttention_matches_torch",
                                 "test_MultiHeadAttention_keras_example"}),
    "04_positional_encoding": ("nb04", "PositionalEncoding",
                               "PE indexed by the batch axis, x.size(0) (sequence-first code on batch-first input)",
                               {"test_PositionalEncoding"}),
    "05_masked_cross_attention": ("nb05", "causal_mask",
                                  "off-by-one diagonal: strictly below the diagonal (a token may not attend to itself)",
                                  {"test_causal_mask"}),
    "06_transformer_translator": ("nb06", "inverse_sqrt_lr", "decays like 1/step instead of 1/sqrt(step)",
                                  {"test_inverse_sqrt_lr"}),
    "07_attention_at_scale": ("nb07", "KVCache",
                              "keys and values share one list (self.keys = self.values = [None] * num_layers)",
                              {"test_KVCache"}),
    "08_long_context": ("nb08", "sliding_window_mask", "off-by-one window: window + 1 keys (i - j <= window)",
                        {"test_sliding_window_mask"}),
}


def strip_solution_delimiters(source: str) -> str:
    return "\n".join(line for line in source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def solved(release, source) -> nbformat.NotebookNode:
    """The release notebook with each solution cell filled from the source notebook."""
    answers = {c.metadata["nbgrader"]["grade_id"]: strip_solution_delimiters(c.source)
               for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and gid in answers:
            cell.source = answers[gid]
    return nb


def with_mistake(nb, graded: str, code: str) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == graded:
            cell.source = "#| export\n# (demo: a typical mistake)\n" + code.strip() + "\n"
    return nb


def find_mistake(module: str, graded: str, name: str) -> str:
    checks = importlib.import_module(f"autograder.checks.{module}")
    for exercise in checks.EXERCISES:
        for mistake in exercise.mistakes:
            if exercise.graded == graded and mistake.name == name:
                return mistake.code
    raise KeyError(f"no mistake {name!r} for {graded} in autograder.checks.{module}")


def make_demo_submissions(out: Path, course: Course, solutions: Path | None = None) -> Path:
    folder = out / "submissions"
    for assignment in course.assignments:
        release = course.release(assignment)
        full = solved(release, nbformat.read(notebook_path(assignment, solutions), as_version=4))
        notebooks = {"full-marks": full, "blank": release}
        if assignment in DEMO_MISTAKES:
            module, graded, name, _ = DEMO_MISTAKES[assignment]
            notebooks["typical-mistake"] = with_mistake(full, graded, find_mistake(module, graded, name))
        for student, nb in notebooks.items():
            path = folder / student / f"{assignment}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
    return folder


def expectations(results: list[NotebookResult]) -> list[str]:
    """Problems with the demo's outcome (empty when every demo student scored as designed)."""
    problems = []
    hostile = {a.name: a for a in adversarial.CATALOGUE if a.name in adversarial.DEMO}
    for r in results:
        if r.student_id in hostile and r.notebook == adversarial.ASSIGNMENT:
            a = hostile[r.student_id]
            if r.score != adversarial.expected_score(a, r.max_score) or not adversarial.status_as_designed(a, r.status):
                problems.append(f"{a.name} scored {r.score:g} with status {r.status_text!r}")
        failed = {c.grade_id for c in r.cells if c.score < c.max_score}
        if r.student_id == "full-marks" and (r.score != r.max_score or r.status is not Status.OK):
            problems.append(f"full-marks lost points in {r.notebook}: {sorted(failed)} {r.status_text}")
        if r.student_id == "blank" and r.score != 0:
            problems.append(f"blank earned {r.score:g} points in {r.notebook}")
        if r.student_id == "typical-mistake" and r.notebook in DEMO_MISTAKES:
            expected = DEMO_MISTAKES[r.notebook][3]
            if failed != expected:
                problems.append(f"typical-mistake in {r.notebook} failed {sorted(failed)}, expected {sorted(expected)}")
    return problems


def run_demo(out: Path, solutions: Path | None = None) -> tuple[list[NotebookResult], list[str]]:
    """Build the demo class (three honest students, and a few hostile ones on notebook 01), grade it."""

    out = Path(out).resolve()
    staging = Course(out / "staging" / "course").setup(solutions)
    submissions = make_demo_submissions(out, staging, solutions)
    a = adversarial.ASSIGNMENT
    solved01 = solved(staging.release(a), nbformat.read(notebook_path(a, solutions), as_version=4))
    adversarial.write_class(submissions, solved01, staging.release(a),
                            adversarial.probe_paths(CourseFolder.find().root, out / "graded"), adversarial.DEMO)
    results = grade(submissions, out / "graded", solutions, limits=DEMO_LIMITS)
    return results, expectations(results)


def print_demo(results, problems, out: Path = Path("build/demo")) -> None:
    print()
    print(format_table(results, hide_missing=True))
    print()
    for r in results:
        if r.student_id == "typical-mistake":
            for c in r.cells:
                if c.score < c.max_score:
                    print(f"typical-mistake, {c.grade_id} (-{c.max_score - c.score:g}): {c.message.splitlines()[0] if c.message else ''}")
    print(f"grades: {out / 'graded' / 'grades.csv'}   feedback: {out / 'graded' / 'feedback'}   "
          f"class report: {out / 'graded' / 'report.html'}")
    print("demo outcome:", "as designed (full marks / zero / exactly the mistake's points; "
          "hostile notebooks earned nothing extra and did not stop the batch)" if not problems
          else "UNEXPECTED\n  " + "\n  ".join(problems))
