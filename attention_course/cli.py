"""`attn-course`: build the course, check a notebook, grade a class, open JupyterLab."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .build import NOTEBOOKS, REPO, bin_dir


def _build(args) -> int:
    from .build import build

    for path in build(only=args.only or None):
        print("wrote", path.relative_to(REPO))
    return 0


def _check(args) -> int:
    from autograder.selfcheck import format_report, self_check

    result, verdicts = self_check(Path(args.notebook))
    print(format_report(result, verdicts))
    return 0 if result.score == result.max_score else 1


def _grade(args) -> int:
    from autograder.grade import format_table, grade

    results = grade(Path(args.submissions), Path(args.out))
    print(format_table(results))
    return 0


def _demo(args) -> int:
    from autograder.demo import print_demo, run_demo

    results, problems = run_demo(Path(args.out))
    print_demo(results, problems)
    return 1 if problems else 0


def _lab(args) -> int:
    os.environ["PATH"] = bin_dir() + os.pathsep + os.environ.get("PATH", "")
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={NOTEBOOKS}", *args.extra]
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn-course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="regenerate notebooks/ and the library code from solutions/")
    p.add_argument("--only", action="append", metavar="ASSIGNMENT", help="rebuild just this assignment (repeatable)")
    p.set_defaults(func=_build)
    p = sub.add_parser("check", help="self-check one notebook: per exercise pass / fail (why) / not attempted")
    p.add_argument("notebook", help="path of your .ipynb")
    p.set_defaults(func=_check)
    p = sub.add_parser("grade", help="grade a class: a folder with one sub-folder or zip per student, or nbgrader's submitted/")
    p.add_argument("submissions")
    p.add_argument("--out", default="build/grading", help="where the gradebook, grades.csv and feedback go")
    p.set_defaults(func=_grade)
    p = sub.add_parser("demo", help="generate the demo class from the solutions, grade it, print the table")
    p.add_argument("--out", default="build/demo")
    p.set_defaults(func=_demo)
    p = sub.add_parser("lab", help="open JupyterLab on the student notebooks")
    p.add_argument("extra", nargs=argparse.REMAINDER)
    p.set_defaults(func=_lab)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"attn-course {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
