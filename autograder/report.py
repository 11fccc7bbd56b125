"""The class report: one HTML page (templates/report.html.j2, Jinja2 with autoescape) an instructor
reads first: who needs attention (incidents, missing and blank notebooks, lateness, code flagged
for review), every student's scores per notebook linked to their feedback, and per notebook the
distribution of scores per exercise (a picture, its numbers in the alt text and in a table), the
mistakes the grader recognised most often, and the incidents with the students they happened to."""
from __future__ import annotations

import base64
import io
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .lateness import LatePolicy, how_late
from .outcomes import BY_HAND, EXTENDED, GRADERS_OWN, KEPT_OVER_A_FAILURE, REFUSED, Status, is_blank

TEMPLATES = Path(__file__).resolve().parent / "templates"
BINS = [0, 0.2, 0.4, 0.6, 0.8, 1.0001]  # fractions of an exercise's points, as the picture groups them


BAND_COLOURS = ["#c0392b", "#e67e22", "#f1c40f", "#7fb3d5", "#2a5599"]  # 0-20 % ... 80-100 %: red to blue


def _band_counts(fractions: list[float]) -> list[int]:
    """How many of `fractions` fall in each fifth of the points (BINS)."""
    return [sum(1 for f in fractions if lo <= f < hi) for lo, hi in zip(BINS, BINS[1:], strict=False)]


def _exercise_plot(notebook: str, per_exercise: dict[str, list[float]]) -> str:
    """One bar per exercise, split by how many students got which fraction of its points (a PNG,
    base64). One axes for the whole notebook: a glance compares the exercises, and it draws in a
    third of the time of one histogram per exercise (the report is rebuilt after every run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = sorted(per_exercise)[::-1]  # barh draws bottom-up: the first exercise on top
    labels = [f"{name} (mean {_mean(per_exercise[name])}%)" for name in names]
    counts = [_band_counts(per_exercise[name]) for name in names]  # [exercise][band]
    fig, ax = plt.subplots(figsize=(7.0, 1.0 + 0.3 * len(names)), layout="constrained")
    left = [0] * len(names)
    for band, colour in enumerate(BAND_COLOURS):
        widths = [row[band] for row in counts]
        ax.barh(labels, widths, left=left, color=colour, edgecolor="white", label=f"{20 * band}-{20 * (band + 1)}%")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("students", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, ncols=5, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False,
              title="fraction of the exercise's points", title_fontsize=7)
    ax.set_title(notebook, fontsize=10, pad=30)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def mistake_counts(results) -> Counter:
    """How many students' notebooks each catalogued mistake was recognised in, from the cells'
    `mistake` field (never from the message's words). Once per notebook: a mistake named in several
    test cells (each test of the same function) counts once."""
    return Counter(m for r in results for m in {c.mistake for c in r.cells if c.mistake})


@dataclass
class _Cell:
    """One student's notebook in the per-student table."""

    kind: str  # ok | missing | blank | a status value
    final: float  # after the late penalty
    penalty: float
    late: str  # "3 h late" or ""
    review: bool
    feedback: str  # relative link to the feedback page, or ""
    by_hand: bool = False  # a score or extra credit set in formgrader
    extension: str = ""  # the row's extension note, where the student's own due date is later than the class's


def _cell(r, out: Path) -> _Cell:
    page = out / "feedback" / r.student_id / f"{r.notebook}.html"
    kind = ("not yet" if r.not_due_yet() else "missing") if r.status is Status.MISSING else \
        "blank" if is_blank(r) else r.status.value
    return _Cell(kind, max(r.score - r.late_penalty, 0.0), r.late_penalty, how_late(getattr(r, "seconds_late", 0.0)),
                 bool(r.review), page.relative_to(out).as_posix() if page.exists() else "",
                 any(n.startswith(BY_HAND) for n in r.notes),
                 next((n for n in r.notes if n.startswith(EXTENDED + ": ")), ""))


NOT_ON_ROSTER = "not on the roster: graded all the same; add them to the roster, or check whose folder or file this is"


def _attention(results, not_on_roster=(), differ_in_case=None) -> list[tuple[str, list[str]]]:
    """Per student (in order), what an instructor should look at; first, for `not_on_roster`, that
    they are not on the class's roster (and, from `differ_in_case`, the roster id theirs differs from only in case)."""
    found: dict[str, list[str]] = defaultdict(list)
    for sid in not_on_roster:
        twin = (differ_in_case or {}).get(sid)
        found[sid].append(NOT_ON_ROSTER + (f" (the roster has {twin}, which differs from this id only in case: ids "
                                           "are exact, so these are two students)" if twin else ""))
    for r in sorted(results, key=lambda r: (r.student_id, r.notebook)):
        if r.status is Status.MISSING:
            found[r.student_id].append(f"{r.notebook}: not handed in yet (due {r.due})" if r.not_due_yet()
                                       else f"{r.notebook}: missing (nothing handed in)")
            continue
        if r.status is not Status.OK:
            found[r.student_id].append(f"{r.notebook}: {r.status_text}")
        if is_blank(r):
            found[r.student_id].append(f"{r.notebook}: blank (handed in, no exercise attempted)")
        if getattr(r, "seconds_late", 0) > 0:
            penalty = f", {r.late_penalty:g} point{'' if r.late_penalty == 1 else 's'} taken" if r.late_penalty else ""
            found[r.student_id].append(f"{r.notebook}: {how_late(r.seconds_late)} (due {r.due}){penalty}")
        if r.review:
            found[r.student_id].append(f"{r.notebook}: code flagged for review")
        for note in (n for n in r.notes if n.startswith(BY_HAND)):  # a grade a person made: the report says so
            found[r.student_id].append(f"{r.notebook}: {note}")
        for note in (n for n in r.notes if n.startswith(REFUSED + ": ")):  # (no entry for a student with none)
            found[r.student_id].append(f"{r.notebook}: {note}")
        for note in (n for n in r.notes if n.startswith(KEPT_OVER_A_FAILURE)):  # the run failed; an older grade shows
            found[r.student_id].append(f"{r.notebook}: {note}")
    return sorted(found.items())


def _exercises(rows) -> dict[str, list[float]]:
    per_exercise: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for c in r.cells:
            totals[c.exercise][0] += c.earned()  # extra credit apart: 3 + 2 extra + 1 of 6 hid a failed test
            totals[c.exercise][1] += c.max_score
        for exercise, (got, top) in totals.items():
            per_exercise[exercise].append(min(got / top, 1.0) if top else 0.0)
    return per_exercise


def _alt_text(notebook: str, per_exercise: dict[str, list[float]]) -> str:
    """The picture in words: per exercise, how many students fell in each fifth of the points."""
    parts = []
    for name in sorted(per_exercise):
        fractions = per_exercise[name]
        counts = _band_counts(fractions)
        bands = ", ".join(f"{20 * i}-{20 * (i + 1)}%: {n}" for i, n in enumerate(counts))
        parts.append(f"{name}: {len(fractions)} students ({bands}), mean {_mean(fractions)}%")
    return f"Score distribution per exercise of {notebook}. " + "; ".join(parts) + "."


def _mean(fractions: list[float]) -> int:
    return round(100 * sum(fractions) / max(len(fractions), 1))


def _notebook_section(name: str, results) -> dict:
    rows = [r for r in results if r.status is not Status.MISSING]
    graded = [r for r in rows if r.status not in GRADERS_OWN]  # the grader's failures: no 0 in a mean
    per_exercise = _exercises(rows)
    incident_rows = sorted((r for r in rows if r.status is not Status.OK), key=lambda r: r.student_id)
    return {
        "name": name, "submitted": len(rows), "not_yet": sum(1 for r in results if r.not_due_yet()),
        "missing": sum(1 for r in results if r.status is Status.MISSING and not r.not_due_yet()),
        "blank": sum(1 for r in rows if is_blank(r)),
        "mean": _mean([r.score / r.max_score if r.max_score else 0 for r in graded]),
        "picture": _exercise_plot(name, per_exercise) if per_exercise else "",
        "alt": _alt_text(name, per_exercise),
        "exercises": [{"name": e, "n": len(f), "mean": _mean(f), "full": sum(1 for x in f if x >= 1),
                       "zero": sum(1 for x in f if x == 0)} for e, f in sorted(per_exercise.items())],
        "mistakes": mistake_counts(rows).most_common(10),
        "incidents": Counter(r.status.value for r in incident_rows).most_common(),
        "incident_rows": incident_rows,
    }


def unreadable_feedback(r, path: Path) -> Path:
    """The feedback page of a notebook the grader could not read (nbgrader makes none): its score, what was
    wrong with the file, and how to hand it in again. `r` is its NotebookResult."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    env.filters["points"] = lambda x: f"{x:g}"
    # the student's own file name: source_file is '<path> (<where its time came from>[; in <class folder>])', and
    # the path or the folder may hold ' (' themselves ('01 (1).ipynb', 'week1 (copy)')
    graded = re.split(r" \((?=file time|timestamp\.txt|the zip's file time)", r.source_file)[0] if r.source_file else ""
    file = PurePosixPath(graded).name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(env.get_template("unreadable_feedback.html.j2").render(r=r, file=file), encoding="utf-8")
    return path


def class_report(results, path: Path, policy: LatePolicy | None = None, not_on_roster=(),
                 differ_in_case: dict[str, str] | None = None) -> Path:
    """Write the report for a list of NotebookResult (feedback pages are linked where they exist
    beside it, in feedback/<student>/<notebook>.html); returns its path. `not_on_roster`: the students
    graded who are not on the class's roster, named first under "Who needs attention"; `differ_in_case`:
    those of them whose id differs from a roster id only in case, with that roster id (grade.differ_in_case)."""
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    out = Path(path).resolve().parent
    by_notebook: dict[str, list] = defaultdict(list)
    by_student: dict[str, dict] = defaultdict(dict)
    for r in results:
        by_notebook[r.notebook].append(r)
        by_student[r.student_id][r.notebook] = r
    notebooks = sorted(by_notebook)
    tops = {n: max(r.max_score for r in by_notebook[n]) for n in notebooks}
    students = []
    for sid in sorted(by_student):
        cells = {n: _cell(r, out) for n, r in by_student[sid].items()}
        students.append({"id": sid, "results": cells, "total": sum(c.final for c in cells.values())})
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]))
    env.filters["points"] = lambda x: f"{x:g}"
    page = env.get_template("report.html.j2").render(
        students=students, notebooks=notebooks, tops=tops, max_total=sum(tops.values()),
        policy=(policy or LatePolicy()).describe(), attention=_attention(results, not_on_roster, differ_in_case),
        per_notebook=[_notebook_section(n, by_notebook[n]) for n in notebooks],
        flagged=sorted((r for r in results if r.review), key=lambda r: (r.student_id, r.notebook)))
    path.write_text(page, encoding="utf-8")
    return path
