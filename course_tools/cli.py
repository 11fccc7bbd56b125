"""`attn-course`: build the course, check a notebook, grade a class, open JupyterLab."""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from datetime import date, datetime, timezone
from pathlib import Path

# course_tools.build (nbformat, ...) is imported by each command that needs it, not here:
# `check` first keeps a slow import out of its way (_without_iri_parser).
DISTRIBUTION = "attention-course"


class UsageError(ValueError):
    """A bad command-line argument, found before any work starts (exit status 2)."""


def version() -> str:
    """The installed distribution's version; from pyproject.toml when running from a bare checkout."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        import tomllib

        from attention_course.paths import CourseNotFound, find_course_root  # no nbgrader needed here

        try:
            return tomllib.loads((find_course_root() / "pyproject.toml").read_text())["project"]["version"]
        except (OSError, KeyError, ValueError, CourseNotFound):
            return "unknown"


def _build(args) -> int:
    from attention_course.paths import find_course_root

    from .build import StudentWorkError, build

    root = find_course_root()

    try:
        written = build(only=args.only or None, execute=args.execute,
                        overwrite_student_work=args.overwrite_student_work)
    except StudentWorkError as err:
        print(f"attn-course build: {err}", file=sys.stderr)
        return 1
    for path in written:
        print("wrote", path.relative_to(root) if path.is_relative_to(root) else path)
    return 0


def _without_iri_parser() -> None:
    """Keep jsonschema from importing rfc3987_syntax (installed for jupyter-events), which builds
    an Earley parser for IRIs when imported: 2.5 s of every `attn-course check`, spent under
    nbformat, which validates no IRI. Only in a process that has not loaded jsonschema yet (a
    command-line run), where nothing else can be counting on it."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # jsonschema then skips its "iri" formats


def _settings():
    """The grading settings: defaults, with the ATTN_* overrides read here, once (autograder/settings.py)."""
    from autograder.settings import GradingSettings, SettingError

    try:
        return GradingSettings.from_env()
    except SettingError as err:
        raise UsageError(str(err)) from None


def _check(args) -> int:
    _without_iri_parser()
    from autograder.selfcheck import format_report, self_check

    result, verdicts = self_check(Path(args.notebook), limits=_settings().limits)
    print(format_report(result, verdicts))
    return 0 if result.score == result.max_score else 1


# --------------------------------------------------------------------------- grade: arguments
def _parse_due_date(assignment: str, value, where: str) -> datetime:
    """An aware datetime in UTC; a date-time without a timezone is refused (it would be ambiguous)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise UsageError(f"{where}: due date {text!r} for {assignment} is not an ISO 8601 date-time; "
                             f"write e.g. 2026-12-01T23:59:00+00:00 or 2026-12-01T23:59:00Z") from None
    if not isinstance(value, datetime):
        kind = "a date without a time" if isinstance(value, date) else type(value).__name__
        raise UsageError(f"{where}: due date for {assignment} is {kind}; give a date-time with a timezone, "
                         f"e.g. 2026-12-01T23:59:00Z")
    if value.tzinfo is None or value.utcoffset() is None:
        raise UsageError(f"{where}: due date {value.isoformat()} for {assignment} has no timezone; "
                         f"add one (2026-12-01T23:59:00+01:00) or give it in UTC (2026-12-01T23:59:00Z)")
    return value.astimezone(timezone.utc)


def _known_assignment(name: str, known: list[str], where: str) -> str:
    if name not in known:
        raise UsageError(f"{where}: unknown assignment {name!r}; choose from {', '.join(known)}")
    return name


def _due_dates(args, known: list[str]) -> dict[str, datetime]:
    due: dict[str, datetime] = {}
    if args.due_file:
        import tomllib

        path = Path(args.due_file)
        if not path.is_file():
            raise UsageError(f"--due-file: {path} does not exist" if not path.exists() else f"--due-file: {path} is not a file")
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
            raise UsageError(f"--due-file: {path} is not valid TOML ({err}); write one line per assignment, "
                             f'e.g. "01_similarity_attention" = 2026-12-01T23:59:00Z') from None
        for name, value in table.items():
            where = f"--due-file {path}"
            due[_known_assignment(name, known, where)] = _parse_due_date(name, value, where)
    for item in args.due or []:
        name, sep, when = item.partition("=")
        if not sep or not name.strip() or not when.strip():
            raise UsageError(f"--due {item!r}: write ASSIGNMENT=DATE, e.g. --due 01_similarity_attention=2026-12-01T23:59:00Z")
        name = _known_assignment(name.strip(), known, "--due")
        due[name] = _parse_due_date(name, when, "--due")
    return due


def _check_roster(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise UsageError(f"--roster: {path} does not exist" if not path.exists() else f"--roster: {path} is not a file")
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh), None)
    except (UnicodeDecodeError, csv.Error) as err:
        raise UsageError(f"--roster: {path} is not a readable CSV file ({err})") from None
    columns = [c.strip() for c in header or []]
    if "id" not in columns:
        raise UsageError(f"--roster: {path} needs a header row with an 'id' column (found: "
                         f"{', '.join(columns) if columns else 'no header'}), e.g. id,first_name,last_name,email")
    return path


def _grade_arguments(args) -> dict:
    """Check every argument of `grade` before any setup; the keyword arguments of grade()."""
    from autograder.course import assignments

    submissions = Path(args.submissions)
    if not submissions.exists():
        raise UsageError(f"{submissions} does not exist: give the folder holding the submissions")
    if not submissions.is_dir():
        raise UsageError(f"{submissions} is not a folder: give the folder holding one sub-folder or zip per student")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out: {out} exists and is not a folder")
    known = assignments()
    chosen = [_known_assignment(a, known, "--assignment") for a in args.assignment or []]
    students = []
    for s in args.student or []:
        if not s.strip() or "/" in s or "\\" in s or s in (".", ".."):
            raise UsageError(f"--student {s!r}: give a student id (the name of their folder or zip)")
        students.append(s.strip())
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give at least 1")
    settings = _settings()
    if args.late_penalty is not None:
        from autograder.lateness import LatePolicy, PolicyError

        try:
            LatePolicy.parse(args.late_penalty)
        except PolicyError as err:
            raise UsageError(f"--late-penalty: {err}") from None
    return dict(late_penalty=args.late_penalty, assignments=list(dict.fromkeys(chosen)) or None, students=list(dict.fromkeys(students)) or None,
                force=args.force, workers=args.workers or settings.worker_count, limits=settings.limits,
                due=_due_dates(args, known),
                roster=_check_roster(args.roster) if args.roster else None)


# --------------------------------------------------------------------------- grade: outcome
PROBLEMS = ("missing", "error", "crash", "timeout", "exit", "memory", "unreadable notebook",
            "wrong notebook", "grader incident")   # Status values


def problems_of(result) -> list[str]:
    """The kinds of trouble a graded notebook met (its typed `kinds`, never its status text)."""
    return list(dict.fromkeys(k.value for k in result.kinds if k.value in PROBLEMS))


def outcome(results) -> tuple[int, str]:
    """(exit status, one-line summary): 1 when any notebook crashed, timed out, errored or is missing."""
    from collections import Counter

    kinds = Counter()
    bad = 0
    for r in results:
        found = problems_of(r)
        bad += bool(found)
        kinds.update(found)
    students = len({r.student_id for r in results})
    if not bad:
        return 0, f"all {len(results)} notebooks of {students} students graded without problems"
    detail = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return 1, f"{bad} of {len(results)} notebooks ({students} students) had problems: {detail}; see the status column"


def _readable(paths) -> None:
    """Group- and world-readable outputs whatever created them (a temporary file is made 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    want = 0o044 & ~mask
    for path in paths:
        try:
            mode = path.stat().st_mode & 0o777
            if mode & want != want:
                path.chmod(mode | want)
        except OSError:
            pass


def _grade(args) -> int:
    from autograder import grade as grading

    options = _grade_arguments(args)  # UsageError -> exit 2, before any setup
    out = Path(args.out)
    results = grading.grade(Path(args.submissions), out, **options)
    _readable(out / name for name in ("grades.csv", "grades_wide.csv", "report.html", "results.json"))
    print(grading.format_table(results))
    status, summary = outcome(results)
    print(summary, file=sys.stderr if status else sys.stdout)
    return status


def _demo(args) -> int:
    from .demo import print_demo, run_demo

    results, problems = run_demo(Path(args.out))
    print_demo(results, problems, Path(args.out))
    return 1 if problems else 0


def _bench(args) -> int:
    import json

    from .bench import benchmark

    print(json.dumps(benchmark(args.students, Path(args.out), args.assignment or None, _settings()), indent=1))
    return 0


def _lab(args) -> int:
    """JupyterLab on notebooks/, set up for students (see course_tools/labcheck.py): the Validate
    button answers with `attn-course check`'s report, nbgrader's instructor tools (formgrader,
    create assignment, assignment and course lists) are off. Every option after `lab` goes to
    `jupyter lab` as it is; with a folder of its own (--notebook-dir / --ServerApp.root_dir: work
    copied out of notebooks/), Lab opens there instead."""
    from autograder.course import CourseFolder, bin_dir

    from .labcheck import lab_environment

    folder = CourseFolder.find()
    os.environ["ATTN_COURSE_ROOT"] = str(folder.root)  # the server's Validate button checks against this course
    os.environ["PATH"] = bin_dir() + os.pathsep + os.environ.get("PATH", "")
    os.environ.update(lab_environment())
    extra = list(args.jupyter_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    own_folder = any(a.split("=", 1)[0] in ("--notebook-dir", "--ServerApp.root_dir") for a in extra)
    cmd = [sys.executable, "-m", "jupyter", "lab", *([] if own_folder else [f"--notebook-dir={folder.notebooks}"]), *extra]
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover


def _train(args) -> int:
    from attention_course.train import evaluate, parse_overrides, record, train, tune_length_penalty

    overrides = {"max_seconds": args.max_seconds, "max_steps": args.max_steps, "num_threads": args.threads,
                 **parse_overrides(args.set)}
    run = train(args.config, args.src, args.tgt, args.out, mirror=args.mirror, device=args.device,
                progress=not args.no_progress, **overrides)
    if not run.summary:      # under torchrun: not the main process, which evaluates and records
        return 0
    if args.evaluate and args.tune_length_penalty:
        tune_length_penalty(run.run_dir, mirror=args.mirror, device=args.device, progress=not args.no_progress)
    if args.evaluate:
        entries = evaluate(run.run_dir, mirror=args.mirror, device=args.device, progress=not args.no_progress)
        if args.record is not None:
            print("recorded in", record(entries, *([args.record] if args.record else [])))
    print(run.run_dir)
    return 0


def _ship(args) -> int:
    from attention_course.checkpoints import ship_run

    run = Path(args.run)
    info = json.loads((run / "config.json").read_text())
    name = args.name or f"{info['train']['name']}.{info['src']}-{info['tgt']}"
    dest = ship_run(run, name)
    print(f"shipped {run} as {dest} (half precision; SHA-256 sums in models/SHA256SUMS). Evaluate and "
          f"record what ships: attn-course evaluate {dest} --record")
    return 0


def _bench_translator(args) -> int:
    from .bench_translator import main as bench

    bench(args.sentences, args.steps, args.threads)
    return 0


def _evaluate(args) -> int:
    from attention_course.evaluation import evaluate, evaluate_ensemble, record, tune_length_penalty

    if len(args.run) > 1:
        if args.length_penalty is not None:
            raise SystemExit("attn-course evaluate: an ensemble's length penalty is always chosen on the "
                             "validation set; leave out --length-penalty")
        entries = evaluate_ensemble(args.run, name=args.name, test_sets=args.test_set or None, beam_size=args.beam,
                                    mirror=args.mirror, device=args.device, progress=not args.no_progress)
    else:
        if args.tune_length_penalty:
            tune_length_penalty(args.run[0], beam_size=args.beam, mirror=args.mirror, device=args.device,
                                progress=not args.no_progress)
        entries = evaluate(args.run[0], test_sets=args.test_set or None, beam_size=args.beam,
                           length_penalty=args.length_penalty, mirror=args.mirror, device=args.device,
                           progress=not args.no_progress)
    if args.record is not None:
        print("recorded in", record(entries, *([args.record] if args.record else [])))
    return 0


def group_readable_umask() -> int:
    """Let the group and others read what we write (grades, feedback): clear the umask's read and
    search bits for them, keep the rest of the user's umask. Returns the previous umask."""
    old = os.umask(0)
    os.umask(old & ~0o055)
    return old


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attn-course", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    parser.add_argument("--course", metavar="DIR", default=None,
                        help="the course folder (default: $ATTN_COURSE_ROOT, else found from the current folder "
                             "upwards, like git: the folder holding solutions/ and nbgrader_config.py)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="regenerate notebooks/ and the library code from solutions/",
                       description="Regenerate notebooks/ and the library code from solutions/. Refuses to replace "
                                   "a notebook in notebooks/ whose answer cells someone has edited.")
    p.add_argument("--only", action="append", metavar="ASSIGNMENT", help="rebuild just this assignment (repeatable)")
    p.add_argument("--execute", action="store_true",
                   help="first run the solution notebooks top to bottom and save their outputs")
    p.add_argument("--overwrite-student-work", action="store_true",
                   help="replace notebooks in notebooks/ even when their answer cells were edited (the edits are lost)")
    p.set_defaults(func=_build)
    p = sub.add_parser("check", help="self-check one notebook: per exercise pass / fail (why) / not attempted")
    p.add_argument("notebook", help="path of your .ipynb")
    p.set_defaults(func=_check)
    p = sub.add_parser("grade", help="grade a class: a folder with one sub-folder or zip per student, or nbgrader's submitted/",
                       description="Grade a class: per-student folders or zips, nbgrader's submitted/ tree, or an LMS "
                                   "export (Canvas, Moodle, Blackboard file names; '_LATE_' is kept as lateness). "
                                   "The notebooks in play are those named with --assignment, those with a due "
                                   "date, and those anyone submitted. Exit status: 0 when every notebook in play "
                                   "was graded, 1 when any crashed, timed out, errored or is missing, 2 for a bad "
                                   "argument.")
    p.add_argument("submissions", help="folder with one sub-folder or zip per student, or nbgrader's submitted/")
    p.add_argument("--out", default=None, help="where the gradebook, grades.csv and feedback go "
                                               "(default: build/grading in the course folder)")
    p.add_argument("--assignment", action="append", metavar="NAME", help="grade only this notebook (repeatable)")
    p.add_argument("--student", action="append", metavar="ID", help="grade only this student (repeatable)")
    p.add_argument("--force", action="store_true", help="regrade even what an earlier run already graded")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="students graded in parallel (default: $ATTN_GRADE_WORKERS, else one per core)")
    p.add_argument("--due", action="append", metavar="NAME=DATE",
                   help="due date of a notebook, ISO 8601 with a timezone, e.g. "
                        "01_similarity_attention=2026-12-01T23:59:00Z (repeatable; overrides --due-file)")
    p.add_argument("--due-file", metavar="TOML",
                   help='due dates, one line per notebook: "01_similarity_attention" = 2026-12-01T23:59:00Z')
    p.add_argument("--roster", metavar="CSV", help="class list: a CSV file with an 'id' column (nbgrader's format)")
    p.add_argument("--late-penalty", metavar="POLICY", default=None,
                   help="none (late work marked, no points taken; the default), zero (a late notebook scores 0) or "
                        "per-day:P (P%% of the points per day or part of a day late). Kept for later runs and applied "
                        "when the grades are written: changing it needs no --force")
    p.set_defaults(func=_grade)
    p = sub.add_parser("demo", help="generate the demo class from the solutions, grade it, print the table")
    p.add_argument("--out", default=None, help="default: build/demo in the course folder")
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
    p.add_argument("--tune-length-penalty", action="store_true",
                   help="with --evaluate: first choose beam search's length penalty on the validation set")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_train)
    p = sub.add_parser("evaluate", help="sacreBLEU of a trained run on the Multi30k test sets (cased and -lc)")
    p.add_argument("run", nargs="+", help="run directory written by `attn-course train` (or a shipped model in "
                   "models/); several: decode as an ensemble (the mean of their log-probabilities)")
    p.add_argument("--name", default=None, help="an ensemble's name in the results (default <config>-ensemble<N>)")
    p.add_argument("--test-set", action="append", help="test_2016_flickr, test_2017_flickr, test_2017_mscoco (repeatable; default all)")
    p.add_argument("--beam", type=int, default=None, help="beam size (default: the configuration's; 1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=None)
    p.add_argument("--mirror", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--record", nargs="?", const="", default=None,
                   help="add the results to this file (default results/translator.json)")
    p.add_argument("--tune-length-penalty", action="store_true",
                   help="first choose the length penalty on the validation set (saved with the run, used from then on)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_evaluate)
    p = sub.add_parser("bench", help="time plain serial nbgrader autograde against `grade` on a generated class")
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--out", default=None, help="default: build/bench in the course folder")
    p.add_argument("--assignment", action="append", help="only these notebooks (repeatable; default: all)")
    p.set_defaults(func=_bench)
    p = sub.add_parser("ship", help="copy a finished run into models/ in half precision, with SHA-256 sums "
                       "(what notebook 06 reads)")
    p.add_argument("run", help="run directory written by `attn-course train`")
    p.add_argument("--name", default=None, help="default <config>.<src>-<tgt>")
    p.set_defaults(func=_ship)
    p = sub.add_parser("bench-translator", help="decoding with and without the KV cache, and training against "
                       "torch.nn.Transformer: speed ratios measured side by side")
    p.add_argument("--sentences", type=int, default=200, help="test sentences to decode (default 200)")
    p.add_argument("--steps", type=int, default=20, help="training steps per model and round (default 20)")
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads")
    p.set_defaults(func=_bench_translator)
    p = sub.add_parser("lab", help="open JupyterLab on the student notebooks (other options go to `jupyter lab`)",
                       usage="%(prog)s [JUPYTER LAB OPTIONS ...], e.g. --no-browser --allow-root --port 8899")
    p.set_defaults(func=_lab)
    return parser


BUILD_OUTPUTS = {"grade": "build/grading", "demo": "build/demo", "bench": "build/bench"}  # default --out, in the course


def use_course(folder: str) -> Path:
    """--course DIR: the course every command of this process (and the tools it starts) works on."""
    from attention_course.paths import ROOT_ENV, CourseNotFound, find_course_root

    try:
        root = find_course_root(folder)
    except CourseNotFound as err:
        raise UsageError(f"--course: {err}") from None
    os.environ[ROOT_ENV] = str(root)
    return root


def main(argv: list[str] | None = None) -> int:
    group_readable_umask()
    cli = parser()
    try:
        args, unknown = cli.parse_known_args(argv)
        if args.command == "lab":
            args.jupyter_args = unknown
        elif unknown:
            cli.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help, --version, argparse's own errors (status 2)
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    try:
        if args.course is not None:
            use_course(args.course)
        if getattr(args, "out", None) is None and args.command in BUILD_OUTPUTS:
            from attention_course.paths import find_course_root

            args.out = str(find_course_root() / BUILD_OUTPUTS[args.command])
        return args.func(args)
    except UsageError as err:
        print(f"attn-course {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as err:
        print(f"attn-course {args.command}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
