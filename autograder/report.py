"""The class report: one HTML page with, per notebook, the distribution of scores per exercise
(as pictures), the mistakes the grader recognised most often, and what went wrong (crashes,
timeouts, unreadable files)."""
from __future__ import annotations

import base64
import html
import io
from collections import Counter, defaultdict
from pathlib import Path

from .outcomes import Status


def _figure_png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _exercise_plot(notebook: str, per_exercise: dict[str, list[float]]) -> str:
    """One small histogram per exercise: how many students got which fraction of its points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(per_exercise)
    cols = min(4, len(names)) or 1
    rows = (len(names) + cols - 1) // cols or 1
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names, strict=False):
        fractions = per_exercise[name]
        ax.hist(fractions, bins=[0, 0.2, 0.4, 0.6, 0.8, 1.0001], color="#4c72b0", edgecolor="white")
        ax.set_title(f"{name}\nmean {100 * sum(fractions) / max(len(fractions), 1):.0f}%", fontsize=9)
        ax.set_xlabel("fraction of points", fontsize=8)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7)
    fig.suptitle(notebook, fontsize=11)
    fig.tight_layout()
    data = _figure_png(fig)
    plt.close(fig)
    return data


def _review_section(results) -> list[str]:
    """Code the static honesty pass could not decide (strings built into names, exec, gc, ...):
    listed for a human, never silently passed."""
    flagged = [r for r in results if getattr(r, "review", "")]
    if not flagged:
        return []
    parts = ["<h2>Flagged for review</h2><p>The grader could not decide whether this code is honest; "
             "the points stand until you look.</p><table><tr><th>student</th><th>notebook</th><th>what</th></tr>"]
    for r in sorted(flagged, key=lambda r: (r.student_id, r.notebook)):
        items = "".join(f"<li><code>{html.escape(item)}</code></li>" for item in r.review.split("; "))
        parts.append(f"<tr><td>{html.escape(r.student_id)}</td><td>{html.escape(r.notebook)}</td><td><ul>{items}</ul></td></tr>")
    parts.append("</table>")
    return parts


def mistake_counts(results) -> Counter:
    """How many students' notebooks each catalogued mistake was recognised in, from the cells'
    `mistake` field (never from the message's words). Once per notebook: a mistake named in several
    test cells (each test of the same function) counts once."""
    return Counter(m for r in results for m in {c.mistake for c in r.cells if c.mistake})


def class_report(results, path: Path) -> Path:
    """Write the report for a list of NotebookResult; returns its path."""
    by_notebook = defaultdict(list)
    for r in results:
        by_notebook[r.notebook].append(r)
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>Class report</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}</style></head><body>",
             "<h1>Class report</h1>",
             f"<p>{len({r.student_id for r in results})} students, {len(by_notebook)} notebooks.</p>"]
    for notebook in sorted(by_notebook):
        rows = [r for r in by_notebook[notebook] if r.status is not Status.MISSING]
        missing = len(by_notebook[notebook]) - len(rows)
        parts.append(f"<h2>{html.escape(notebook)}</h2>")
        if not rows:
            parts.append(f"<p>No submissions ({missing} missing).</p>")
            continue
        scores = [r.score / r.max_score if r.max_score else 0 for r in rows]
        parts.append(f"<p>{len(rows)} submitted, {missing} missing; mean score {100 * sum(scores) / len(scores):.0f}%.</p>")
        per_exercise: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
            for c in r.cells:
                totals[c.exercise][0] += c.score
                totals[c.exercise][1] += c.max_score
            for exercise, (got, top) in totals.items():
                per_exercise[exercise].append(got / top if top else 0.0)
        if per_exercise:
            parts.append(f"<img alt='score distribution per exercise of {html.escape(notebook)}' "
                         f"src='data:image/png;base64,{_exercise_plot(notebook, per_exercise)}'>")
        mistakes = mistake_counts(rows)
        if mistakes:
            parts.append("<h3>Most frequent recognised mistakes</h3><table><tr><th>mistake</th><th>students</th></tr>")
            parts += [f"<tr><td>{html.escape(m)}</td><td>{n}</td></tr>" for m, n in mistakes.most_common(10)]
            parts.append("</table>")
        problems = Counter(r.status.value for r in rows if r.status is not Status.OK)
        if problems:
            parts.append("<h3>Grading incidents</h3><table><tr><th>kind</th><th>notebooks</th></tr>")
            parts += [f"<tr><td>{html.escape(k)}</td><td>{n}</td></tr>" for k, n in problems.most_common()]
            parts.append("</table>")
    parts += _review_section(results)
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
    return path
