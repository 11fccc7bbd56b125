"""`attn-course`: build the course, check a notebook, grade a class, open JupyterLab."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .build import NOTEBOOKS, REPO, bin_dir


def _build(args) -> int:
    from .build import build

    for path in build(only=args.only or None, execute=args.execute):
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
    print_demo(results, problems, Path(args.out))
    return 1 if problems else 0


def _bench(args) -> int:
    import json

    from autograder.bench import benchmark

    print(json.dumps(benchmark(args.students, Path(args.out), args.assignment or None), indent=1))
    return 0


def _lab(args) -> int:
    os.environ["PATH"] = bin_dir() + os.pathsep + os.environ.get("PATH", "")
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={NOTEBOOKS}", *args.extra]
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover


def _train(args) -> int:
    from .train import evaluate, parse_overrides, record, train

    overrides = {"max_seconds": args.max_seconds, "max_steps": args.max_steps, "num_threads": args.threads,
                 **parse_overrides(args.set)}
    run = train(args.config, args.src, args.tgt, args.out, mirror=args.mirror, device=args.device,
                progress=not args.no_progress, **overrides)
    if args.evaluate:
        entries = evaluate(run.run_dir, mirror=args.mirror, device=args.device, progress=not args.no_progress)
        if args.record is not None:
            print("recorded in", record(entries, *([args.record] if args.record else [])))
    print(run.run_dir)
    return 0


def _evaluate(args) -> int:
    from .train import evaluate, record

    entries = evaluate(args.run, test_sets=args.test_set or None, beam_size=args.beam,
                       length_penalty=args.length_penalty, mirror=args.mirror, device=args.device,
                       progress=not args.no_progress)
    if args.record is not None:
        print("recorded in", record(entries, *([args.record] if args.record else [])))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn-course", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="regenerate notebooks/ and the library code from solutions/")
    p.add_argument("--only", action="append", metavar="ASSIGNMENT", help="rebuild just this assignment (repeatable)")
    p.add_argument("--execute", action="store_true",
                   help="first run the solution notebooks top to bottom and save their outputs")
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
    p = sub.add_parser("train", help="train the notebook-06 translator (configs: gpu, cpu, quick, toy, auto)")
    p.add_argument("--config", default="auto", help="gpu | cpu | quick | toy | auto (gpu if CUDA is available, else cpu)")
    p.add_argument("--src", default="en", help="source language: en, de or fr")
    p.add_argument("--tgt", default="de", help="target language: en, de or fr")
    p.add_argument("--out", default=None, help="run directory (default runs/<config>-<src>-<tgt>)")
    p.add_argument("--mirror", default=None, help="folder with the Multi30k raw files (default: $ATTN_MULTI30K_MIRROR, else download)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--max-seconds", type=float, default=None, help="override the configuration's time budget")
    p.add_argument("--max-steps", type=int, default=None, help="override the configuration's step budget")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one setting of the configuration, e.g. --set dropout=0.2 --set d_model=512 (repeatable)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: all cores, or 1 if the machine is already busy)")
    p.add_argument("--evaluate", action="store_true", help="evaluate on the test sets afterwards")
    p.add_argument("--record", nargs="?", const="", default=None,
                   help="with --evaluate: add the results to this file (default results/translator.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_train)
    p = sub.add_parser("evaluate", help="sacreBLEU of a trained run on the Multi30k test sets (cased and -lc)")
    p.add_argument("run", help="run directory written by `attn-course train`")
    p.add_argument("--test-set", action="append", help="test_2016_flickr, test_2017_flickr, test_2017_mscoco (repeatable; default all)")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the configuration's; 1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=None)
    p.add_argument("--mirror", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--record", nargs="?", const="", default=None,
                   help="add the results to this file (default results/translator.json)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_evaluate)
    p = sub.add_parser("bench", help="time plain serial nbgrader autograde against `grade` on a generated class")
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--out", default="build/bench")
    p.add_argument("--assignment", action="append", help="only these notebooks (repeatable; default: all)")
    p.set_defaults(func=_bench)
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
