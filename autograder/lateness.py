"""Late work: the class's penalty policy, and what it takes from one notebook.

nbgrader's gradebook is the truth for *how late* (its submission time against the assignment's
due date: `SubmittedAssignment.total_seconds_late`, extensions included). The penalty is applied
when the grades are exported, from the policy in force then, so changing the policy changes every
export on the next run without regrading anything (no --force). nbgrader's own penalty plugin is
left at "none" in the grading course: it would fix the penalty into the gradebook at grading time.

Policies (`--late-penalty`, kept in the grading course's `late-penalty` file):
  none          late work is marked, no points taken (the default)
  zero          a late notebook scores 0
  per-day:P     P percent of the notebook's points per day or part of a day late (at most all)
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

POLICY_FILE = "late-penalty"  # in the grading course's folder, beside nbgrader_config.py
DAY = 86400.0


class PolicyError(ValueError):
    """A late-penalty policy that cannot be read: the message says what is accepted."""


@dataclass(frozen=True)
class LatePolicy:
    method: str = "none"  # none | zero | per-day
    percent_per_day: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LatePolicy:
        spec = text.strip().lower()
        if spec in ("none", "zero"):
            return cls(spec)
        if spec.startswith("per-day:"):
            try:
                percent = float(spec.split(":", 1)[1].rstrip("%"))
            except ValueError:
                percent = math.nan
            if 0 < percent <= 100:
                return cls("per-day", percent)
        raise PolicyError(f"late penalty {text!r} is not understood: use 'none' (marked, no points taken), 'zero' "
                          "(a late notebook scores 0) or 'per-day:P' (P percent of the points per day or part of "
                          "a day late, 0 < P <= 100), e.g. per-day:10")

    def __str__(self) -> str:
        return f"per-day:{self.percent_per_day:g}" if self.method == "per-day" else self.method

    def penalty(self, score: float, max_score: float, seconds_late: float) -> float:
        """The points taken from `score` for a notebook `seconds_late` seconds late (never more than the score)."""
        if seconds_late <= 0 or self.method == "none":
            return 0.0
        if self.method == "zero":
            return score
        days = math.ceil(seconds_late / DAY)
        return min(score, round(max_score * self.percent_per_day / 100 * days, 6))

    def describe(self) -> str:
        return {"none": "late work is marked, no points are taken",
                "zero": "a late notebook scores 0",
                "per-day": f"{self.percent_per_day:g}% of the notebook's points per day or part of a day late"}[self.method]


def read_policy(course_root: Path) -> LatePolicy:
    """The policy kept in the grading course (none when never set)."""
    path = Path(course_root) / POLICY_FILE
    return LatePolicy.parse(path.read_text()) if path.exists() else LatePolicy()


def write_policy(course_root: Path, policy: LatePolicy) -> None:
    (Path(course_root) / POLICY_FILE).write_text(f"{policy}\n")


def how_late(seconds: float) -> str:
    """'3 h 20 min late', '2 days 4 h late' ('' when on time): for tables and feedback pages."""
    if seconds <= 0:
        return ""
    minutes = math.ceil(seconds / 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [f"{days} day{'s' if days != 1 else ''}"] if days else []
    parts += [f"{hours} h"] if hours else []
    parts += [f"{minutes} min"] if minutes and not days else []
    return " ".join(parts) + " late"


# --------------------------------------------------------------------------- extensions given before a hand-in
# nbgrader keeps an extension on a submission: one given (`attn-course extend`) before the student has handed
# anything in waits here, beside the gradebook, and is given when their notebook is first graded (`give_pending`,
# run before the tables are written).
PENDING = "extensions-pending.json"  # {student: {notebook: hours}}


def read_pending(out: Path) -> dict[str, dict[str, float]]:
    try:
        found = json.loads((out / PENDING).read_text())
    except (OSError, ValueError):
        return {}
    return {s: {n: float(h) for n, h in nbs.items() if isinstance(h, (int, float))}
            for s, nbs in found.items() if isinstance(nbs, dict)} if isinstance(found, dict) else {}


def set_pending(out: Path, student: str, notebook: str, hours: float) -> None:
    """Keep (hours > 0) or drop the extension waiting for `student`'s `notebook`."""
    pending = read_pending(out)
    if hours > 0:
        pending.setdefault(student, {})[notebook] = hours
    elif notebook in pending.get(student, {}):
        del pending[student][notebook]
    else:
        return
    pending = {s: nbs for s, nbs in pending.items() if nbs}
    tmp = out / (PENDING + ".tmp")
    tmp.write_text(json.dumps(pending, indent=1, sort_keys=True))
    os.replace(tmp, out / PENDING)


def give_pending(db_url: str, out: Path) -> list[str]:
    """Give each waiting extension whose notebook the gradebook now holds; 'student notebook' for each given."""
    from nbgrader.api import Gradebook, MissingEntry

    pending, given = read_pending(out), []
    if not pending:
        return given
    with Gradebook(db_url) as gb:
        for student, notebooks in pending.items():
            for notebook, hours in notebooks.items():
                try:
                    gb.find_submission(notebook, student)
                except MissingEntry:
                    continue
                gb.grant_extension(notebook, student, hours=hours)
                given.append((student, notebook))
    for student, notebook in given:
        set_pending(out, student, notebook, 0)
    return [f"{student} {notebook}" for student, notebook in given]
