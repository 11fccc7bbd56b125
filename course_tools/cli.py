"""`attn-course`: build the course, check a notebook, grade a class, review it in formgrader, open JupyterLab."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
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

    from .build import CHANGED, StudentWorkError, build

    root = find_course_root()
    _working(f"building {root}: the library from solutions/, then the student notebooks")
    try:
        written = build(only=args.only or None, execute=args.execute,
                        overwrite_student_work=args.overwrite_student_work)
    except StudentWorkError as err:
        print(f"attn-course build: {err}", file=sys.stderr)
        return 1
    except PermissionError as err:  # a checkout the instructor may read, not write: the files need changing
        raise UsageError(f"cannot write {err.filename or 'a file of the course'}: this account may not change the "
                         f"course checkout. Build "
                         f"in a checkout of your own (or as its owner); grading needs no build, the built notebooks "
                         f"and library are part of the checkout") from None
    changed = set(CHANGED)
    for path in written:
        if path in changed:
            print("wrote", path.relative_to(root) if path.is_relative_to(root) else path)
    if len(changed & set(written)) < len(written):
        print(f"{len(set(written) - changed)} file(s) already up to date")
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


def unsupported_system(system: str = os.name) -> str:
    """Why `check` cannot run here ("" when it can): it needs POSIX signals and resource limits."""
    if system != "nt":
        return ""
    return ("`attn-course check` needs Linux or macOS: it runs your notebook in a process of its own under "
            "POSIX time and memory limits (signals, resource limits), which Windows does not have. On Windows, "
            "run it in WSL 2 (Ubuntu: `wsl --install`, then follow the README there), or open the notebook in "
            "Colab; the notebook's own test cells work everywhere")


def _check(args) -> int:
    if unsupported_system():
        raise UsageError(unsupported_system())
    _without_iri_parser()
    from autograder.selfcheck import format_report, self_check, self_check_data

    live = _JsonProgress() if args.progress == "json" else _CheckProgress() if args.progress == "bar" else None
    main_thread = threading.current_thread() is threading.main_thread()  # signal handlers can only be set there
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None  # Lab's Cancel: stop the sandbox too
    try:
        with live or contextlib.nullcontext():
            if args.notebook == "-":  # a live notebook's JSON (Colab's is no file on the machine)
                result, verdicts = self_check_data(sys.stdin.buffer.read(), args.name or "",
                                                   limits=_settings().limits, progress=live)
            else:
                result, verdicts = self_check(Path(args.notebook), limits=_settings().limits, progress=live)
    except KeyboardInterrupt:
        print("attn-course check: stopped before the end; nothing was checked", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(format_report(result, verdicts))
    return 0 if result.score == result.max_score else 1


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _check_description() -> str:
    from autograder.settings import GiB, Limits

    base = Limits()
    return ("Check one notebook as the grader will: per exercise pass, fail (and why) or not attempted, with a "
            "live line saying which cell runs. Limits (environment variables, defaults): each cell "
            f"ATTN_CELL_TIMEOUT seconds ({base.cell_seconds:g}), the whole notebook ATTN_NOTEBOOK_TIMEOUT "
            f"({base.notebook_seconds:g}), memory ATTN_MEMORY_GB GiB ({base.memory_bytes / GiB:g}), processes "
            f"ATTN_MAX_PROCESSES ({base.processes}). Exit status 0 when every exercise passes, else 1.")


class _CheckProgress:
    """`check`'s live line on stderr (tqdm): which cell runs, and how long of its limit it has used,
    so a loop in an exercise is seen while it runs, not two minutes later."""

    bar = None

    def __enter__(self):
        return self

    def __call__(self, index: int, cells: int, what: str, seconds: float, limit: float) -> None:
        if self.bar is None:  # made on the first news from the sandbox: nothing shows for a refused notebook
            from tqdm import tqdm

            # miniters=0: redrawn at most twice a second on any news, also while one slow cell runs (tqdm's
            # default learns a step from a burst of fast cells, and then stays silent until the count moves)
            self.bar = tqdm(total=cells, desc="checking", unit="cell", file=sys.stderr, leave=False, mininterval=0.5,
                            miniters=0, bar_format="{desc}: cell {n}/{total} {bar:10}{postfix}")
        self.bar.total, self.bar.n = cells, min(index + 1, cells)
        slow = f"{seconds:.0f} s of its {limit:g} s limit" if seconds >= 2 else ""
        self.bar.set_postfix_str(f"{what}{': ' + slow if slow else ''}", refresh=False)
        self.bar.update(0)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()


class _JsonProgress:
    """`check --progress json`: the same news as the live line, one JSON object per line on stderr
    (at most twice a second, and whenever the cell changes), for a program to show: Lab's Validate."""

    def __init__(self) -> None:
        self.last: tuple[int, float] = (-1, 0.0)

    def __enter__(self):
        return self

    def __call__(self, index: int, cells: int, what: str, seconds: float, limit: float) -> None:
        now = time.monotonic()
        if index == self.last[0] and now - self.last[1] < 0.5:
            return
        self.last = (index, now)
        from autograder.selfcheck import STARTING

        print(json.dumps({"cell": None if what == STARTING else index, "cells": cells, "what": what,
                          "seconds": round(seconds, 1),
                          "limit": limit}), file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        pass


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
    """The roster file, read once here so that a bad one stops the run before anything is set up: a
    missing 'id' column, an empty or repeated id are named with their line (autograder.grade.read_roster)."""
    from autograder.grade import RosterError, read_roster

    path = Path(value)
    if not path.is_file():
        raise UsageError(f"--roster: {path} does not exist" if not path.exists() else f"--roster: {path} is not a file")
    try:
        read_roster(path)
    except RosterError as err:
        raise UsageError(f"--roster: {err}") from None
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
                warm=settings.warm,
                due=_due_dates(args, known),
                roster=_check_roster(args.roster) if args.roster else None,
                remote=_remote_grader(_cluster_arguments(args, settings.cluster)))


def _remote_grader(cluster):
    """On a Dask cluster when --scheduler / --scheduler-file / --gateway name one, else None (this machine)."""
    if not cluster.remote:
        return None
    from autograder.cluster import on_cluster

    return on_cluster(cluster)


def _cluster_arguments(args, cluster):
    """--scheduler / --scheduler-file and the TLS files, or --gateway and its options, checked, onto the
    settings' cluster part."""
    from dataclasses import replace

    scheduler, scheduler_file = getattr(args, "scheduler", None), getattr(args, "scheduler_file", None)
    gateway, gateway_cluster = getattr(args, "gateway", None), getattr(args, "gateway_cluster", None)
    if sum(bool(x) for x in (scheduler, scheduler_file, gateway)) > 1:
        raise UsageError("give one of --scheduler, --scheduler-file and --gateway")
    if gateway_cluster and not gateway:
        raise UsageError("--gateway-cluster names a cluster of a Dask Gateway: give the gateway with --gateway URL")
    if gateway:
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", gateway):
            raise UsageError(f"--gateway {gateway!r}: give the Dask Gateway's address, http(s)://HOST[:PORT]")
        workers = getattr(args, "gateway_workers", None) or cluster.gateway_workers
        if workers < 1:
            raise UsageError(f"--gateway-workers {workers}: give at least 1")
        return replace(cluster, gateway=gateway, gateway_cluster=gateway_cluster or "", gateway_workers=workers)
    if scheduler and not re.fullmatch(r"(tcp|tls)://[^\s/]+:\d+", scheduler):
        raise UsageError(f"--scheduler {scheduler!r}: give the scheduler's address, tcp://HOST:PORT or tls://HOST:PORT")
    files = {"scheduler_file": scheduler_file, "tls_ca_file": getattr(args, "tls_ca_file", None),
             "tls_cert": getattr(args, "tls_cert", None), "tls_key": getattr(args, "tls_key", None)}
    for name, value in files.items():
        if value and not Path(value).is_file():
            raise UsageError(f"--{name.replace('_', '-')}: {value} is not a file")
    if (files["tls_cert"] is None) != (files["tls_key"] is None):
        raise UsageError("--tls-cert and --tls-key go together")
    return replace(cluster, scheduler=scheduler or "", **{k: str(v or "") for k, v in files.items()})


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
        found = [] if r.not_due_yet() else problems_of(r)  # not handed in before its due date: nothing wrong yet
        bad += bool(found)
        kinds.update(found)
    notebooks, students = _count(len(results), "notebook"), _count(len({r.student_id for r in results}), "student")
    not_yet = sum(1 for r in results if r.not_due_yet())
    if not bad and not_yet:
        return 0, (f"{len(results) - not_yet} of {notebooks} of {students} graded without problems; {not_yet} not "
                   "handed in yet (before the due date)")
    if not bad:
        return 0, f"{'the' if len(results) == 1 else 'all'} {notebooks} of {students} graded without problems"
    detail = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return 1, f"{bad} of {notebooks} ({students}) had problems: {detail}; see the status and notes columns"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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
    print(grading.format_table(results), flush=True)  # all of it before the summary on stderr: one log file of
    status, summary = outcome(results)                   # both had the summary glued inside the table
    print(summary, file=sys.stderr if status else sys.stdout)
    return status


def _demo(args) -> int:
    from .demo import print_demo, run_demo

    results, problems = run_demo(Path(args.out))
    print_demo(results, problems, Path(args.out))
    return 1 if problems else 0


def _export(args) -> int:
    """`export OUT --to FORMAT`: what was written, notes on stdout, what is not placed on stderr (exit 1)."""
    from autograder import lms

    if args.to not in lms.FORMATS:  # said before the work is announced (it announced, then refused the format)
        raise UsageError(f"--to {args.to!r}: not a format this exports; give one of {', '.join(lms.FORMATS)}")
    _working(f"exporting {args.out} to {args.to}: reading its gradebook, then rewriting its tables, report and "
             "feedback first, so a score typed in formgrader is in the export")
    try:
        done = lms.export(Path(args.out), args.to, Path(args.dest) if args.dest else None,
                          Path(args.canvas_roster) if args.canvas_roster else None)
    except lms.ExportError as err:
        raise UsageError(str(err)) from None
    print(f"{args.to}: {len(done.written)} file{'s' if len(done.written) != 1 else ''} -> {done.dest}")
    _readable(done.written)
    for note in done.notes:
        print(f"  {note}")
    sys.stdout.flush()
    if done.problems:
        print(f"{len(done.problems)} to look at before importing:", *(f"  {p}" for p in done.problems),
              sep="\n", file=sys.stderr)
    return 1 if done.problems else 0


def _remove_student(args) -> int:
    """`remove-student OUT ID ... [--yes]`: what is (or would be) taken out, and where it is kept."""
    from autograder.removal import RemovalError, remove_students

    if args.yes:  # seconds of reading the gradebook and rewriting the tables, with nothing on the screen
        _working(f"taking {', '.join(args.students)} out of {args.out}: the gradebook, then its tables, report and "
                 "feedback rewritten")
    try:
        done = remove_students(Path(args.out), args.students, yes=args.yes)
    except RemovalError as err:
        raise UsageError(str(err)) from None
    for student, folders in done.moved.items():
        files = ", ".join(folders) or "no files"
        print(f"{student}: out of the gradebook; {files} moved to {done.kept_at[student]}" if done.done else
              f"{student}: would be taken out of the gradebook; {files} would be moved to "
              f"{done.out / 'removed' / student}/<time>/")
    for student in done.on_roster:
        print(f"{student} is on the last roster given: the next `grade` with that roster lists them again "
              "(missing, or graded from their files); give a roster without them")
    if done.done:
        print("a later `grade` of a folder that still holds their files leaves them out and says so; "
              "`grade ... --student ID` grades one of them again")
    if not done.done:
        print(f"nothing was changed: run again with --yes to take {'them' if len(done.moved) > 1 else 'this student'} "
              "out", file=sys.stderr)
        return 2
    print(f"grades.csv, grades_wide.csv, report.html and the feedback pages of {done.out} rewritten without them")
    return 0


def _working(what: str) -> None:
    """Said at once on stderr, before work that takes seconds with nothing else to show (loading nbgrader and
    matplotlib, reading the gradebook): a command silent for 10 s looks stuck."""
    print(f"{what} ...", file=sys.stderr, flush=True)


def _extend(args) -> int:
    """`extend OUT ID NOTEBOOK --days N [--hours H]`: the student's own due date, and the outputs rewritten."""
    from autograder.extensions import ExtensionError, describe, grant

    _working(f"extending {args.student}'s {args.notebook}: the gradebook, then {args.out}'s tables, report and "
             "feedback rewritten")
    try:
        done = grant(Path(args.out), args.student, args.notebook, days=args.days, hours=args.hours)
    except ExtensionError as err:
        raise UsageError(str(err)) from None
    print(describe(done))
    print(f"grades.csv, grades_wide.csv, report.html and the feedback pages of {Path(args.out)} rewritten; "
          "`attn-course export` takes it to your LMS")
    return 0


def _bench(args) -> int:
    import json

    from .bench import benchmark

    print(json.dumps(benchmark(args.students, Path(args.out), args.assignment or None, _settings(),
                               cluster=args.cluster), indent=1))
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
    own_folder = _lab_folder(extra)
    cmd = [sys.executable, "-m", "jupyter", "lab", *([] if own_folder else [f"--notebook-dir={folder.notebooks}"]), *extra]
    # the server's folder is the one the file browser shows: a terminal opened from it starts there
    # (jupyter_server_terminals resolves the browser's relative folder against the server's own)
    start = own_folder or folder.notebooks
    if start.is_dir():  # else Jupyter says the folder does not exist
        os.chdir(start)
    os.execv(sys.executable, cmd)
    return 0  # pragma: no cover


def _lab_folder(extra: list[str]) -> Path | None:
    """The folder given with --notebook-dir / --ServerApp.root_dir (`=value` or the next argument),
    made absolute in `extra` itself (the server then starts inside it, where a relative one would
    no longer name it)."""
    for k, arg in enumerate(extra):
        name, equals, value = arg.partition("=")
        if name in ("--notebook-dir", "--ServerApp.root_dir"):
            at = k if equals else k + 1
            value = value if equals else (extra[at] if at < len(extra) else "")
            if not value:
                return None
            folder = Path(value).expanduser().resolve()
            extra[at] = f"{name}={folder}" if equals else str(folder)
            return folder
    return None


# --------------------------------------------------------------------------- formgrader
FORMGRADER = "nbgrader.server_extensions.formgrader"  # the server extension (nbgrader's manual grading)
TOKEN_OPTIONS = ("--IdentityProvider.token", "--ServerApp.token", "--NotebookApp.token")
GRADING_OUTPUT = ("give the folder a grading run wrote: `attn-course grade SUBMISSIONS --out OUT`, then "
                  "`attn-course formgrader OUT` (without --out, both use build/grading in the course folder)")


def grading_course(out: Path) -> Path:
    """The nbgrader course directory of the grading output `out` (OUT/course, beside OUT/gradebook.db),
    checked to be the one its nbgrader settings name; UsageError saying what to give otherwise."""
    if not out.is_dir():
        raise UsageError(f"{out} {'is not a folder' if out.exists() else 'does not exist'}: {GRADING_OUTPUT}")
    if out.name == "course" and (out.parent / "gradebook.db").is_file():
        out = out.parent  # the course folder inside a grading output: its output is meant
    missing = [name for name in ("gradebook.db", "course/nbgrader_config.py") if not (out / name).is_file()]
    if missing:
        inside = sorted(str(p) for p in out.iterdir() if (p / "gradebook.db").is_file() and (p / "course").is_dir())
        hint = f"; the grading output{'s' if len(inside) > 1 else ''} in it: {', '.join(inside)}" if inside else ""
        raise UsageError(f"{out} is not a grading output (it has no {' and no '.join(missing)}{hint}): {GRADING_OUTPUT}")
    course = (out / "course").resolve()
    _settle(course)
    _recorded_root(course)  # nbgrader (formgrader) can read the settings, which name this folder
    return course


def _settle(course: Path) -> None:
    """A grading output copied or moved after grading still names its old place, and formgrader would
    open that gradebook: its settings are pointed here first (as `grade` and `export` do), and said so."""
    from autograder.course import CourseMoved
    from autograder.lms import settled_course

    try:
        settled_course(course.parent)
    except CourseMoved as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{course / 'nbgrader_config.py'} cannot be pointed at {course.parent} ({err.strerror}): "
                         f"formgrader would open the folder it was graded as; make it writable, or grade the class "
                         f"again into a folder of your own") from None


def _recorded_root(course: Path) -> Path:
    """The course root the course's nbgrader_config.py names (what formgrader will open)."""
    from traitlets.config.loader import PyFileConfigLoader

    try:
        config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    except Exception as err:  # noqa: BLE001 - whatever stops nbgrader reading the file, said with its name
        raise UsageError(f"{course / 'nbgrader_config.py'} cannot be read ({type(err).__name__}: {err}); was the "
                         f"course checkout that graded this class moved? Grade the class again into a new folder") from None
    root = config.CourseDirectory.get("root")
    if not isinstance(root, str):
        raise UsageError(f"{course / 'nbgrader_config.py'} names no course root: not written by `attn-course grade`")
    return Path(root).resolve()


def _free_port(ip: str) -> int:
    """A port nothing listens on at `ip` now (the server is told not to try others: the URL printed holds)."""
    from .net import free_port

    try:
        return free_port(ip)
    except OSError as err:
        raise UsageError(f"--ip {ip}: cannot listen there ({err}); give an address of this machine") from None


def _token(extra: list[str]) -> tuple[str, list[str]]:
    """(the server's token, the Jupyter options without it): one given among them, else a new random one. The
    server gets it in its environment (JUPYTER_TOKEN, readable by its own user only), never on its command
    line, which every user of the machine reads in /proc: with it, a student on the same JupyterHub opened
    the instructor's terminals. An empty token (no login) stays an option: there is nothing to hide."""
    import secrets

    token, rest, i = None, [], 0
    while i < len(extra):  # every token option (--ServerApp.token and --IdentityProvider.token both given, say)
        name, sep, value = extra[i].partition("=")
        if name in TOKEN_OPTIONS:
            given = value if sep else extra[i + 1] if i + 1 < len(extra) else ""
            if not given:
                return "", extra  # no login, as asked
            token = token or given
            i += 1 if sep else 2
            continue
        rest.append(extra[i])
        i += 1
    return (token, rest) if token else (secrets.token_hex(24), extra)


def formgrader_url(ip: str, port: int, token: str) -> str:
    """Where formgrader answers (its own pages, without JupyterLab), the token included."""
    import socket

    host = socket.gethostname() if ip in ("", "0.0.0.0", "::", "*") else f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/formgrader" + (f"?token={token}" if token else "")


def formgrader_command(course: Path, ip: str, port: int, open_browser: bool, extra: list[str]) -> list[str]:
    """`jupyter server` on the grading course with formgrader on, even where the user's Jupyter settings
    turn it off (as `attn-course lab` does); no retry on another port; the browser sent to /formgrader;
    no picture fetched from another host (autograder.outputs.FORMGRADER_POLICY)."""
    from autograder.outputs import formgrader_policy_option

    return [sys.executable, "-m", "jupyter_server", f"--ServerApp.root_dir={course}", f"--ServerApp.ip={ip}",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.default_url=/formgrader",
            "--ServerApp.jpserver_extensions", f"{FORMGRADER}=True",
            "--ServerApp.jpserver_extensions", "course_tools.formgrader_offline=True", formgrader_policy_option(),
            *([] if open_browser else ["--no-browser"]), *extra]


def _formgrader(args) -> int:
    """nbgrader's formgrader on a grading output, to review and grade by hand: the server runs in the
    grading course (formgrader reads nbgrader_config.py from its working folder), on this machine only
    unless --ip says otherwise. Every other option goes to `jupyter server` as it is."""
    from autograder.course import bin_dir

    course = grading_course(Path(args.out))
    if args.port is not None and not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port}: give a port number from 1 to 65535")
    port = args.port or _free_port(args.ip)
    extra = list(args.jupyter_args)
    token, extra = _token(extra[1:] if extra[:1] == ["--"] else extra)
    print(f"formgrader on {course.parent} (gradebook {course.parent / 'gradebook.db'}):\n"
          f"  {formgrader_url(args.ip, port, token)}\n"
          "Grades, extra credit and comments are saved into the gradebook as you enter them;\n"
          f"`attn-course export {course.parent} --to FORMAT` (or the next `attn-course grade ... --out` there,\n"
          "which grades nothing again) writes them into grades.csv, grades_wide.csv, report.html, the feedback\n"
          "and the LMS file. Ctrl-C stops the server.", flush=True)
    os.environ["PATH"] = bin_dir() + os.pathsep + os.environ.get("PATH", "")
    if token:
        os.environ["JUPYTER_TOKEN"] = token  # not on the command line (see _token)
    os.chdir(course)
    os.execv(sys.executable, formgrader_command(course, args.ip, port, not args.no_browser, extra))
    return 0  # pragma: no cover


CORPUS_DESCRIPTIONS = {"multi30k": "about 29,000 captions of photos, Multi30k", "toy": "the course's toy corpus"}


def _translate(args) -> int:
    """`attn-course translate`: the shipped model on the reader's own sentences, with an honest note."""
    from attention_course import bpe
    from attention_course.checkpoints import ShippedModelError, load_shipped, models_dir
    from attention_course.evaluation import source_limit, translate_texts
    from attention_course.vocabulary_coverage import coverage, coverage_note

    sentences = [s.strip() for s in (args.sentences or sys.stdin.read().splitlines()) if s.strip()]
    if not sentences:
        raise UsageError('give a sentence to translate, e.g. attn-course translate "A man is riding a bicycle."')
    if args.beam < 1:
        raise UsageError(f"--beam {args.beam}: the beam size is 1 (greedy) or more")
    models = Path(args.models).expanduser() if args.models else models_dir()
    try:
        model, tok, info, summary, _history = load_shipped(args.model, device=args.device, models=models)
    except ShippedModelError as err:
        raise UsageError(str(err)) from None
    beam = 1 if args.greedy else args.beam
    chosen = summary.get("length_penalty") or {}  # chosen on the validation set for beam search, when it was
    translations = translate_texts(model, tok, sentences, beam_size=beam,
                                   length_penalty=chosen.get("chosen", 1.0) if isinstance(chosen, dict) else 1.0,
                                   device=args.device)
    corpus = info.get("train", {}).get("corpus", "")
    trained_on = CORPUS_DESCRIPTIONS.get(corpus, corpus or "its training text")
    limit = source_limit(model)
    for sentence, translation in zip(sentences, translations, strict=True):
        print(translation, flush=True)
        note = coverage_note(coverage(tok, sentence), trained_on)
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        tokens = len(bpe.encode(tok, [sentence], bos=False, eos=True)[0])
        if tokens > limit:
            print(f"note: this text is {tokens} tokens long and the model reads at most {limit} (it was trained on "
                  "single captions): only its beginning was translated; give one sentence at a time",
                  file=sys.stderr, flush=True)
    return 0


def _train(args) -> int:
    from attention_course.train import evaluate, parse_overrides, record, train, tune_length_penalty

    overrides = {"max_seconds": args.max_seconds, "max_steps": args.max_steps, "num_threads": args.threads,
                 **parse_overrides(args.set)}
    from attention_course.resume import ResumeMismatch

    try:
        run = train(args.config, args.src, args.tgt, args.out, mirror=args.mirror, device=args.device,
                    progress=not args.no_progress, resume=args.resume, **overrides)
    except ResumeMismatch as err:
        raise UsageError(f"--resume: {err}") from err
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


def _bench_peer(args) -> int:
    from attention_course.recipes import parse_overrides

    from .bench_peer import compare

    overrides = {"max_seconds": args.max_seconds, "max_steps": args.max_steps, "num_threads": args.threads,
                 **parse_overrides(args.set)}
    compare(args.config, args.peer, args.src, args.tgt, args.out, tuple(args.threshold or (38.0, 40.0)),
            args.test_set, args.beam, args.mirror, args.device, progress=not args.no_progress, init=args.peer_init,
            eval_every=args.eval_every, **overrides)
    return 0


def _bench_compile(args) -> int:
    from attention_course.recipes import parse_overrides

    from .bench_compile import compare

    compare(args.config, args.steps, args.bucket, args.backend, args.mode, args.src, args.tgt, args.out, args.mirror,
            args.device, num_threads=args.threads, **parse_overrides(args.set))
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
    p = sub.add_parser("check", help="self-check one notebook: per exercise pass / fail (why) / not attempted",
                       description=_check_description())
    p.add_argument("notebook", help="path of your .ipynb, or - to read the notebook's JSON from standard input")
    p.add_argument("--name", default=None, help="with -: the notebook's file name (else it is recognised by its cells)")
    p.add_argument("--progress", choices=("bar", "json", "none"), default="bar",
                   help="the live line on stderr (bar), one JSON object per line for a program to read (json: what "
                        "Lab's Validate shows), or nothing (none)")
    p.set_defaults(func=_check)
    p = sub.add_parser("grade", help="grade a class: a folder with one sub-folder or zip per student, or nbgrader's submitted/",
                       description="Grade a class: per-student folders or zips, nbgrader's submitted/ tree, or an LMS "
                                   "export (Canvas, Moodle, Blackboard file names; '_LATE_' is kept as lateness). "
                                   "The notebooks in play are those named with --assignment, those due by now, "
                                   "those graded before, and those handed in by at least two students and a quarter "
                                   "of the class (or, on a first run, the folder's most handed-in one); the run "
                                   "prints which and why. Exit status: 0 when every notebook in play "
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
    p.add_argument("--roster", metavar="CSV",
                   help="class list: a CSV file with an 'id' column (nbgrader's format), each id the name a student's "
                        "folder, zip or LMS files are graded under, case too (for a Canvas download: leave it out and "
                        "give `export --to canvas` --canvas-roster)")
    p.add_argument("--late-penalty", metavar="POLICY", default=None,
                   help="none (late work marked, no points taken; the default), zero (a late notebook scores 0) or "
                        "per-day:P (P%% of the points per day or part of a day late). Kept for later runs and applied "
                        "when the grades are written: changing it needs no --force")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on this Dask cluster: tcp://HOST:PORT or tls://HOST:PORT (see 'Grading on several "
                        "machines' in the README); without it, on this machine")
    p.add_argument("--scheduler-file", metavar="JSON", help="the cluster's scheduler file (`dask scheduler --scheduler-file`)")
    p.add_argument("--gateway", metavar="URL", help="grade on a cluster of this Dask Gateway, http(s)://HOST[:PORT] "
                   "(a new one, shut down afterwards, unless --gateway-cluster names a running one)")
    p.add_argument("--gateway-cluster", metavar="NAME", help="--gateway: the running cluster to grade on")
    p.add_argument("--gateway-workers", metavar="N", type=int, help="--gateway: a new cluster's workers (default 2)")
    p.add_argument("--tls-ca-file", metavar="PEM", help="tls://: the CA of the scheduler's certificate")
    p.add_argument("--tls-cert", metavar="PEM", help="tls://: this machine's certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="tls://: its private key")
    p.set_defaults(func=_grade)
    p = sub.add_parser("demo", help="generate the demo class from the solutions, grade it, print the table")
    p.add_argument("--out", default=None, help="default: build/demo in the course folder")
    p.set_defaults(func=_demo)
    p = sub.add_parser("export", help="the grades of a grading run as an LMS imports them: canvas, gradescope, "
                       "prairielearn or moodle",
                       description="Write the class graded into OUT (read from its gradebook now: grades typed in "
                                   "formgrader included) in a learning platform's import layout: Canvas's gradebook "
                                   "CSV, a Gradescope or PrairieLearn results.json per graded notebook, Moodle's grade "
                                   "import CSV. Exit status: 0 when every student and grade was placed, 1 when some "
                                   "are listed as not tied to a platform user or held back, 2 for a bad argument.")
    p.add_argument("out", metavar="OUT", help="the folder `attn-course grade SUBMISSIONS --out OUT` wrote")
    p.add_argument("--to", required=True, metavar="FORMAT", help="canvas, gradescope, prairielearn or moodle")
    p.add_argument("--canvas-roster", metavar="CSV", default=None,
                   help="with --to canvas: Canvas's own gradebook export, to fill in each student's Canvas ID, SIS "
                        "ids and section and the assignments' Canvas ids")
    p.add_argument("--dest", metavar="PATH", default=None,
                   help="where to write (default OUT/lms/canvas.csv, OUT/lms/moodle.csv, or the folder "
                        "OUT/lms/gradescope/ or OUT/lms/prairielearn/ with <student>/<notebook>/results.json)")
    p.set_defaults(func=_export)
    p = sub.add_parser("remove-student", help="take students graded by mistake out of a graded class (kept aside)",
                       description="Take students out of the class graded into OUT: out of nbgrader's gradebook, so "
                                   "out of every table, report and export, with everything the grader kept of theirs "
                                   "moved into OUT/removed/<student>/<time>/ (nothing is deleted). Without --yes it "
                                   "only says what it would do (exit 2).")
    p.add_argument("out", metavar="OUT", help="the folder `attn-course grade SUBMISSIONS --out OUT` wrote")
    p.add_argument("students", metavar="ID", nargs="+", help="student ids, as in grades.csv")
    p.add_argument("--yes", action="store_true", help="do it (without it, only say what would be done)")
    p.set_defaults(func=_remove_student)
    p = sub.add_parser("extend", help="give a student more time for one notebook (their own due date)",
                       description="Give a student an extension for one notebook of the class graded into OUT: "
                                   "nbgrader's extension, added to the notebook's due date for them alone. Their "
                                   "lateness and late penalty are worked out again at once, in every table, page and "
                                   "export, without grading again. A second extension replaces the first; --days 0 "
                                   "takes it back. Given before they hand the notebook in, it waits (their row is 'not handed "
                                   "in yet' until their own due date) and is given when it is first graded.")
    p.add_argument("out", metavar="OUT", help="the folder `attn-course grade SUBMISSIONS --out OUT` wrote")
    p.add_argument("student", metavar="ID", help="the student's id, as in grades.csv")
    p.add_argument("notebook", metavar="NOTEBOOK", help="the notebook, e.g. 01_similarity_attention")
    p.add_argument("--days", type=float, default=0.0, help="days after the due date (0: no extension)")
    p.add_argument("--hours", type=float, default=0.0, help="hours, added to --days")
    p.set_defaults(func=_extend)
    names = " | ".join(TRAIN_CONFIGS)
    p = sub.add_parser("train", help=f"train the notebook-06 translator (configs: {', '.join(TRAIN_CONFIGS)}, auto)")
    p.add_argument("--config", default="auto", help=f"{names} | auto (gpu if CUDA is available, else cpu)")
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
    p.add_argument("--resume", action="store_true",
                   help="go on from the run folder's last checkpoint (its resume.pt, written at every checkpoint) "
                        "when it holds a stopped run of the same recipe; put the folder on a mounted drive with "
                        "--out or $ATTN_RUNS_DIR so it outlives the machine")
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
    p = sub.add_parser("translate", help="translate your own sentences with a shipped model (notebook 06's)",
                       description="Translate sentences with a trained model shipped in the course's models/ "
                                   "(default gpu.en-de: English to German). Each translation is printed on a line "
                                   "of its own; a note on standard error names the words the model saw rarely or "
                                   "never (those its vocabulary spells in pieces). Example: attn-course translate "
                                   "\"A man is riding a bicycle.\"")
    p.add_argument("sentences", nargs="*", help="the sentences (none: read them from standard input, one per line)")
    p.add_argument("--model", default="gpu.en-de", help="a shipped model (default gpu.en-de; see models/)")
    p.add_argument("--models", default=None, metavar="DIR",
                   help="the folder holding the shipped models (default: the course's models/)")
    p.add_argument("--beam", type=int, default=5, help="beam size (default 5; 1 = greedy decoding)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding (the same as --beam 1)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, ...")
    p.set_defaults(func=_translate)
    p = sub.add_parser("bench", help="time plain serial nbgrader autograde against `grade` on a generated class")
    p.add_argument("--students", type=int, default=20)
    p.add_argument("--out", default=None, help="default: build/bench in the course folder")
    p.add_argument("--assignment", action="append", help="only these notebooks (repeatable; default: all)")
    p.add_argument("--cluster", action="store_true",
                   help="also grade the class through Dask distributed (a LocalCluster of as many one-thread worker "
                        "processes as the pool has, on 127.0.0.1) and print its time over the pool's")
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
    p = sub.add_parser("bench-peer", help="train the translator and a Hugging Face model of the same size (Marian) "
                       "on the same batches with the same loop: speed, seconds to a validation BLEU, test BLEU")
    p.add_argument("--config", default="gpu", help=f"{names} (default gpu)")
    p.add_argument("--peer", default="marian", choices=("marian", "m2m100"),
                   help="marian (MarianMTModel, post-norm; default) or m2m100 (pre-norm, as the gpu recipe)")
    p.add_argument("--peer-init", default="library", choices=("library", "course"),
                   help="library: the peer's own initialisation (default); course: the course model's, to tell "
                        "initialisation from architecture")
    p.add_argument("--src", default="en", help="source language: en, de or fr")
    p.add_argument("--tgt", default="de", help="target language: en, de or fr")
    p.add_argument("--out", default=None, help="where peer.json, peer.md and the hypotheses go (default build/peer)")
    p.add_argument("--mirror", default=None, help="folder with the Multi30k raw files (default: $ATTN_MULTI30K_MIRROR, else download)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--max-seconds", type=float, default=None, help="each model's training-time budget")
    p.add_argument("--max-steps", type=int, default=None, help="each model's step budget")
    p.add_argument("--eval-every", type=int, default=None, help="steps between validation BLEUs (default: the recipe's)")
    p.add_argument("--threshold", type=float, action="append",
                   help="validation BLEU to time (repeatable; default 38 and 40)")
    p.add_argument("--test-set", action="append", help="default test_2016_flickr (repeatable)")
    p.add_argument("--beam", type=int, default=None, help="the beam size scored beside greedy (default: the recipe's)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting of the recipe (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_bench_peer)
    p = sub.add_parser("bench-compile", help="the translator's training step eager against torch.compile (dynamic "
                       "shapes, lengths bucketed), on the same batches: speed ratio, compile time, graphs")
    p.add_argument("--config", default="gpu", help=f"{names} (default gpu)")
    p.add_argument("--steps", type=int, default=200, help="batches per pass; each variant takes two passes (default 200)")
    p.add_argument("--bucket", type=int, default=16, help="pad lengths up to a multiple of this (default 16; 1: off)")
    p.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor; aot_eager: no "
                   "code generation, to check the path)")
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead (CUDA graphs) or max-autotune")
    p.add_argument("--src", default="en", help="source language: en, de or fr")
    p.add_argument("--tgt", default="de", help="target language: en, de or fr")
    p.add_argument("--out", default=None, help="where compile.json goes (default build/compile)")
    p.add_argument("--mirror", default=None, help="folder with the Multi30k raw files (default: $ATTN_MULTI30K_MIRROR, else download)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a setting of the recipe (repeatable)")
    p.add_argument("--threads", type=int, default=None, help="PyTorch CPU threads")
    p.set_defaults(func=_bench_compile)
    p = sub.add_parser("formgrader", help="review and grade by hand: nbgrader's formgrader on the gradebook of a "
                       "grading run (other options go to `jupyter server`)",
                       usage="%(prog)s [OUT] [--port N] [--ip IP] [--no-browser] [JUPYTER SERVER OPTIONS ...]",
                       description="Start nbgrader's formgrader on a grading output and print its address. Manual "
                                   "grades and comments go into the gradebook; `attn-course export OUT` (or the next `attn-course "
                                   "grade` run into the same folder) writes them into grades.csv, grades_wide.csv, "
                                   "the report and the LMS file.")
    p.add_argument("out", nargs="?", default=None, metavar="OUT",
                   help="the folder `attn-course grade SUBMISSIONS --out OUT` wrote (default: build/grading in the "
                        "course folder)")
    p.add_argument("--port", type=int, default=None, help="the port to listen on (default: a free one)")
    p.add_argument("--ip", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--no-browser", action="store_true", help="only print the address, open no browser")
    p.set_defaults(func=_formgrader)
    p = sub.add_parser("lab", help="open JupyterLab on the student notebooks (other options go to `jupyter lab`)",
                       usage="%(prog)s [JUPYTER LAB OPTIONS ...], e.g. --no-browser --allow-root --port 8899")
    p.set_defaults(func=_lab)
    return parser


BUILD_OUTPUTS = {"grade": "build/grading", "demo": "build/demo", "bench": "build/bench",  # default --out, in the course
                 "formgrader": "build/grading", "bench-peer": "build/peer",
                 "bench-compile": "build/compile"}
PASS_THROUGH = ("lab", "formgrader")  # commands whose unknown options go to Jupyter
INTERRUPTED = {"grade": " Every notebook graded so far is kept: the same command grades the rest (nothing is graded twice).",
               "export": " Run it again: it rewrites every file it writes."}  # what a Ctrl-C left, per command


def use_course(folder: str) -> Path:
    """--course DIR: the course every command of this process (and the tools it starts) works on."""
    from attention_course.paths import ROOT_ENV, CourseNotFound, find_course_root

    try:
        root = find_course_root(folder)
    except CourseNotFound as err:
        raise UsageError(f"--course: {err}") from None
    os.environ[ROOT_ENV] = str(root)
    return root


def note_course_from_environment(command: str) -> None:
    """$ATTN_COURSE_ROOT wins over the folder a command is run in (as git's GIT_DIR does); where the two name
    different courses (a variable left from last term's course), say which one is used, so that nobody grades
    against another course's solutions without knowing it."""
    from attention_course.paths import ROOT_ENV, CourseNotFound, find_course_root

    named = os.environ.get(ROOT_ENV)
    if not named:
        return
    try:
        here, used = find_course_root(Path.cwd()), find_course_root()
    except CourseNotFound:
        return
    if here != used:
        print(f"attn-course {command}: using the course ${ROOT_ENV} names ({used}), not the one this folder is in "
              f"({here}); to use this one, unset {ROOT_ENV} or pass --course {here}", file=sys.stderr)


GRADING_COMMANDS = ("grade", "demo")  # an instructor's: results that depend on the grader's code and library


def note_grader_of_another_checkout(command: str) -> None:
    """A course folder that holds its own autograder/ or attention_course/ but is graded by another copy (a venv
    made in another checkout, shared): say so. An instructor's edit to a tolerance in the course's
    autograder/checks/ was silently not used (the grades came from the other checkout's code)."""
    from attention_course.paths import CourseNotFound, find_course_root
    from autograder.course import library_dir, package_dir

    try:
        root = find_course_root()
    except CourseNotFound:
        return
    for name, used in (("autograder", package_dir("autograder")), ("attention_course", library_dir())):
        own = root / name
        if own.is_dir() and used is not None and own.resolve() != Path(used).resolve():
            print(f"attn-course {command}: this course's {name}/ ({own}) is not the one used: {used} is (this Python "
                  f"imports it); edits to {own} take no effect. To use them, install this course into the Python "
                  f"that runs attn-course ({sys.executable} -m pip install -e {root}), or run its own "
                  f"{root / '.venv' / 'bin' / 'attn-course'}", file=sys.stderr)


# attention_course.recipes.CONFIGS, named here without importing PyTorch for every command (a test
# checks that the two agree)
TRAIN_CONFIGS = ("gpu", "gpu-wide", "cpu", "cpu-hour", "quick", "toy")


# the modules of pyproject.toml's extras that a command may import (a library-only install lacks them)
EXTRAS = {**dict.fromkeys(("nbgrader", "ipykernel", "nbformat", "nbconvert", "nbclient", "cloudpickle", "anyascii",
                           "psutil", "jinja2", "filelock", "dask", "distributed", "dask_gateway"), "grader"),
          **dict.fromkeys(("jupyterlab", "notebook"), "lab"), **dict.fromkeys(("sphinx", "myst_nb"), "book"),
          "jupyterhub": "hub", "transformers": "bench"}


def main(argv: list[str] | None = None) -> int:
    """`attn-course`: the exit status of the command. A reader that stops early (`attn-course check NB | head -1`)
    ends it quietly, as it ends any Unix tool (status 141, as after SIGPIPE): it printed a BrokenPipeError traceback."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit: where a closed pipe can still be answered
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to the closed pipe at exit
        return 141


def _main(argv: list[str] | None) -> int:
    from attention_course.paths import CourseNotFound

    group_readable_umask()
    cli = parser()
    try:
        args, unknown = cli.parse_known_args(argv)
        if args.command in PASS_THROUGH:
            args.jupyter_args = unknown
        elif unknown:
            cli.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as stop:  # --help, --version, argparse's own errors (status 2)
        return stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 2
    try:
        if args.course is not None:
            use_course(args.course)
        else:
            note_course_from_environment(args.command)
        if args.command in GRADING_COMMANDS:
            note_grader_of_another_checkout(args.command)
        if getattr(args, "out", None) is None and args.command in BUILD_OUTPUTS:
            from attention_course.paths import find_course_root

            args.out = str(find_course_root() / BUILD_OUTPUTS[args.command])
        return args.func(args)
    except UsageError as err:
        print(f"attn-course {args.command}: error: {err}", file=sys.stderr)
        return 2
    except CourseNotFound as err:
        print(f"attn-course {args.command}: error: {err}, or name it: attn-course --course DIR {args.command} ...",
              file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as err:
        print(f"attn-course {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # the course installed without the extra this command needs
        extra = EXTRAS.get(str(err.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"attn-course {args.command}: error: this command needs {err.name}, which comes with the course's "
              f"[{extra}] extra: pip install 'attention-course[{extra}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        said = INTERRUPTED.get(args.command, "")
        if args.command == "grade" and getattr(args, "force", False):  # --force would grade everything again
            said = (" Every notebook graded so far is kept: the same command without --force grades the rest "
                    "(with --force, everything is graded again).")
        print(f"\nattn-course {args.command}: interrupted (Ctrl-C)." + said, file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
