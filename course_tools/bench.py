"""`attn-course bench`: the same class graded two ways, timed on this machine.

* baseline: plain nbgrader — `nbgrader autograde <assignment>` over the whole class, serially,
  executing every notebook in a Jupyter kernel (no sandbox, verdicts taken from the kernel);
* ours: `attn-course grade` — every protection on (namespace sandbox, trusted verdicts,
  per-cell and per-notebook limits), students in parallel across the cores.

The class is generated from the solutions: students cycle through full marks, the blank
release and the typical mistake, so both graders do the same work.
"""
from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from autograder import timings
from autograder.course import notebook_path, prepare_source_course, tool_env
from autograder.grade import Course, grade
from autograder.outcomes import Status
from autograder.sandbox import isolation_mode
from autograder.settings import GradingSettings

from .demo import DEMO_MISTAKES, find_mistake, solved, with_mistake


def make_class(course: Course, folder: Path, students: int, assignments: list[str]) -> list[str]:
    """`students` folders with every notebook, cycling full marks / blank / typical mistake."""
    variants = ["full", "blank", "mistake"]
    ids = []
    for k in range(students):
        sid = f"student{k + 1:02d}"
        ids.append(sid)
        for a in assignments:
            release = course.release(a)
            full = solved(release, nbformat.read(notebook_path(a), as_version=4))
            kind = variants[k % 3]
            if kind == "blank":
                nb = release
            elif kind == "mistake" and a in DEMO_MISTAKES:
                module, graded, name, _ = DEMO_MISTAKES[a]
                nb = with_mistake(full, graded, find_mistake(module, graded, name))
            else:
                nb = full
            path = folder / sid / f"{a}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, path)
    return ids


def plain_nbgrader(folder: Path, ids: list[str], work: Path, assignments: list[str]) -> dict[str, float]:
    """Seconds per assignment for stock `nbgrader autograde`, one assignment at a time, over the class."""
    course = work / "plain"
    assignments = prepare_source_course(course, only=assignments)
    for sid in ids:
        for a in assignments:
            target = course / "submitted" / sid / a
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / sid / f"{a}.ipynb", target / f"{a}.ipynb")
    seconds = {}
    for a in assignments:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "nbgrader", "autograde", a, "--force"], cwd=course,
                       env=tool_env(), capture_output=True, check=True)
        seconds[a] = round(time.perf_counter() - started, 1)
    return seconds


def plain_scores(work: Path) -> dict[tuple[str, str], float]:
    """(student, notebook) -> score from the plain run's gradebook, via `nbgrader export`."""
    course = work / "plain"
    subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to", "grades.csv"], cwd=course,
                   env=tool_env(), capture_output=True, check=True)
    with open(course / "grades.csv", newline="") as f:
        return {(r["student_id"], r["assignment"]): float(r["score"]) for r in csv.DictReader(f)}


def grade_on_local_cluster(folder: Path, out: Path, workers: int, settings: GradingSettings) -> tuple[list, float]:
    """The class graded through Dask distributed: a LocalCluster of `workers` one-thread worker
    processes on 127.0.0.1 (what `grade --scheduler` does, with the cluster on this machine).
    (results, seconds), the cluster's start-up left out of the time."""
    from dataclasses import replace

    from distributed import LocalCluster

    from autograder.cluster import on_cluster
    from autograder.course import CourseFolder

    # its nannies live in this process: a worker they restart starts in this process's folder, which nbgrader's
    # autograde changes for a moment; the course is named, not found from there
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None, env={"ATTN_COURSE_ROOT": str(CourseFolder.find().root)}) as cluster:
        # the settings' own cluster options (tries, ATTN_SANDBOX's allowance of a weaker sandbox), on this cluster
        remote = on_cluster(replace(settings.cluster, scheduler=cluster.scheduler_address))
        started = time.perf_counter()
        results = grade(folder, out, progress=False, limits=settings.limits, remote=remote)
        return results, time.perf_counter() - started


def where_the_time_goes(taken: dict[str, dict], notebooks: int) -> dict[str, float]:
    """Seconds per graded notebook in each phase of `attn-course grade` (summed over its worker
    threads, so with 2 workers they add up to about twice the wall-clock time): the sandbox runs,
    the judging around them, nbgrader's autograde and feedback page, and the class's outputs."""
    def seconds(name: str) -> float:
        return taken.get(name, {}).get("seconds", 0.0)

    per = max(notebooks, 1)
    return {"sandbox": round(seconds(timings.SANDBOX) / per, 2),
            "judging": round((seconds(timings.TRUSTED) - seconds(timings.SANDBOX)) / per, 2),
            "nbgrader_autograde_and_feedback": round(seconds(timings.NBGRADER) / per, 2),
            "report_csvs_feedback_folder": round(seconds(timings.OUTPUTS) / per, 2)}


def _table(results) -> dict[tuple[str, str], float]:
    return {(r.student_id, r.notebook): r.score for r in results}


def benchmark(students: int = 20, work: Path = Path("build/bench"), assignments: list[str] | None = None,
              settings: GradingSettings | None = None, cluster: bool = False) -> dict:
    """Plain serial nbgrader against `attn-course grade` on one generated class; with `cluster`, the
    same class graded a third time through a Dask LocalCluster of as many workers as the pool has."""
    settings = settings or GradingSettings.from_env()  # ATTN_* as `attn-course grade` reads them
    workers = settings.worker_count
    work = Path(work).resolve()
    shutil.rmtree(work, ignore_errors=True)
    staging = Course(work / "staging" / "course").setup(only=assignments)
    assignments = staging.assignments
    folder = work / "class"
    ids = make_class(staging, folder, students, assignments)
    per_assignment = plain_nbgrader(folder, ids, work, assignments)
    baseline = sum(per_assignment.values())
    timings.reset()
    started = time.perf_counter()
    results = grade(folder, work / "ours", progress=False, workers=workers, limits=settings.limits, warm=settings.warm)
    ours = time.perf_counter() - started
    taken = timings.taken()
    phases = where_the_time_goes(taken, len(results))
    plain = plain_scores(work)
    disagree = sorted(f"{r.student_id}/{r.notebook}: plain {plain.get((r.student_id, r.notebook))}, ours {r.score}"
                      for r in results
                      if r.notebook in assignments and plain.get((r.student_id, r.notebook)) != r.score)
    report = {
        "students": students,
        "notebooks": assignments,
        "plain_nbgrader_serial_seconds": round(baseline, 1),
        "plain_nbgrader_seconds_per_notebook": per_assignment,
        "attn_course_grade_seconds": round(ours, 1),
        "speedup": round(baseline / ours, 2),
        "plain_nbgrader_seconds_per_graded_notebook": round(baseline / max(len(results), 1), 2),
        "attn_course_grade_seconds_per_notebook_by_phase": phases,
        "attn_course_grade_phase_runs": {name: entry["times"] for name, entry in taken.items()},
        "workers": workers,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "sandbox": isolation_mode(),
        "graded_notebooks": len([r for r in results if r.status is not Status.MISSING]),
        "all_as_designed": all(r.status is Status.OK for r in results if r.notebook in assignments),
        "same_scores_as_plain_nbgrader": not disagree,
        **({"score_disagreements": disagree} if disagree else {}),
    }
    if cluster:
        on_cluster, seconds = grade_on_local_cluster(folder, work / "cluster", workers, settings)
        report.update({"attn_course_grade_cluster_seconds": round(seconds, 1),
                       "cluster_over_pool": round(seconds / ours, 2),
                       "same_scores_on_cluster": _table(on_cluster) == _table(results)})
    (work / "benchmark.json").write_text(json.dumps(report, indent=1))
    return report
