"""`make book`: the course as a static site, built from the solved notebooks in solutions/.

    python -m course_tools.book [--out build/book] [--repository OWNER/NAME[@REF]]

Lays out a staging folder (<out>/source): each solution notebook, scrubbed of the grader
(`course_tools.book.scrub`), a landing page with the curriculum (read from the notebooks' first
cells) and the architecture figure (drawn here with matplotlib), MathJax copied from the
jupyter-server-mathjax package, and the Sphinx configuration (`sphinx_conf.py`). Then Sphinx
(myst-nb, sphinx-book-theme) writes <out>/html/, with warnings as errors. The notebooks are not
executed: their committed outputs are the book's.

Colab / Binder buttons need the repository the notebooks are published in, which the checkout does
not know: ``--repository owner/name@ref`` or ``$ATTN_BOOK_REPOSITORY`` (``make book
BOOK_REPOSITORY=owner/name@ref``). Without it the book has no launch buttons and its landing page
says how to open a notebook in Colab by uploading it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..publishing import Repository, parse_repository, published
from .figure import ALT, draw_architecture
from .scrub import ScrubError, find_plumbing, scrub_notebook

__all__ = ["Chapter", "Repository", "ScrubError", "build_book", "chapters", "main", "parse_repository"]

REPOSITORY_ENV = "ATTN_BOOK_REPOSITORY"
MATHJAX_CONFIG = ["TeX-AMS-MML_HTMLorMML-full.js", "Safe.js"]  # files of MathJax's config/ folder
HERE = Path(__file__).resolve().parent

BOOK_CSS = """\
/* the course's book: small additions to sphinx-book-theme */
.attn-launch { margin: 0.5rem 0 1.5rem; }
.attn-launch p { margin: 0.2rem 0; }
figure.attn-architecture img { max-width: 100%; height: auto; }
"""


# --------------------------------------------------------------------------- chapters
@dataclass(frozen=True)
class Chapter:
    name: str       # 01_similarity_attention
    title: str      # 01 — Attention from similarity
    tagline: str    # numpy only, no learned parameters
    summary: str    # the first paragraph after the title (markdown)

    @property
    def docname(self) -> str:
        return f"{self.name}/{self.name}"

    @property
    def solution_path(self) -> str:
        return f"solutions/{self.name}/{self.name}.ipynb"

    @property
    def student_path(self) -> str:
        return f"notebooks/{self.name}/{self.name}.ipynb"


def _describe(name: str, nb: nbformat.NotebookNode) -> Chapter:
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is None:
        raise ValueError(f"{name}: the notebook has no markdown cell to take its title from")
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", first.source) if p.strip()]
    title = next((p[2:].strip() for p in paragraphs if p.startswith("# ")), name)
    tagline, summary = "", ""
    for p in paragraphs:
        if p.startswith("#"):
            continue
        if not tagline and p.startswith("*Attention, step by step*"):
            tagline = p.split("·", 2)[-1].strip() if p.count("·") >= 2 else ""
            continue
        summary = _whole_sentences(" ".join(line.strip() for line in p.splitlines()))
        break
    return Chapter(name, title, tagline, summary)


def _whole_sentences(paragraph: str) -> str:
    """The paragraph up to its last full stop when it ends by introducing what follows it (a colon before a
    list or table the landing page does not show)."""
    if not paragraph.endswith(":"):
        return paragraph
    cut = max(paragraph.rfind(". "), paragraph.rfind(".) "))
    return paragraph[:paragraph.index(".", cut) + 1 + (paragraph[cut + 1] == ")")] if cut > 0 else paragraph


def _assignments(solutions: Path) -> list[str]:
    return sorted(p.name for p in solutions.iterdir() if (p / f"{p.name}.ipynb").is_file())


def chapters(solutions: Path) -> list[tuple[Chapter, nbformat.NotebookNode]]:
    """Every chapter in order (01, 02, ...), with its scrubbed notebook. ScrubError if any grader is left."""
    out = []
    for name in _assignments(solutions):
        nb = scrub_notebook(nbformat.read(solutions / name / f"{name}.ipynb", as_version=4))
        left = find_plumbing(nb)
        if left:
            raise ScrubError(f"{name}: the scrubber left the grader's plumbing in the book:\n  " + "\n  ".join(left))
        out.append((_describe(name, nb), nb))
    if not out:
        raise FileNotFoundError(f"no solution notebooks in {solutions}")
    return out


def _launch_cell(chapter: Chapter, repo: Repository) -> nbformat.NotebookNode:
    text = (
        ":::{admonition} Open this chapter in Colab\n"
        ":class: tip attn-launch\n"
        f"**Work the exercises:** [the student notebook in Colab]({repo.colab(chapter.student_path)}) "
        f"(or [on Binder]({repo.binder(chapter.student_path)})) — the exercises to fill in, with their checks.\n\n"
        f"**Read and run this solved notebook:** [in Colab]({repo.colab(chapter.solution_path)}) "
        f"(or [on Binder]({repo.binder(chapter.solution_path)})): the course's source notebook, not this page, "
        f"so its test cells also run the checks an instructor grades with (they pass) and its answers are marked "
        f"out for the student version.\n"
        ":::"
    )
    return nbformat.v4.new_markdown_cell(text)


# --------------------------------------------------------------------------- the landing page
def _index(chapter_list: list[Chapter], repo: Repository | None) -> str:
    items = []
    for i, ch in enumerate(chapter_list, 1):
        tagline = f" *{ch.tagline}.*" if ch.tagline else ""
        items.append(f"{i}. **{{doc}}`{ch.title} <{ch.docname}>`**{tagline} {ch.summary}")
    if repo:
        colab = (f"Every chapter has an **Open in Colab** box under its introduction: one link opens the "
                 f"student notebook (the exercises to fill in, from `notebooks/`), the other this solved "
                 f"notebook (from `solutions/`), both from [{repo.name}](https://github.com/{repo.name}/tree/{repo.ref}) "
                 f"at `{repo.ref}`. The rocket button at the top of a chapter launches the solved notebook in "
                 f"Colab or on Binder (a CPU-only environment, set up by the repository's `binder/` folder). The "
                 f"solved notebook is the course's source, not this page: its test cells also run the checks an "
                 f"instructor grades with (they pass), and its answers are marked out for the student version.")
    else:
        colab = ("This copy of the book was built without a repository setting, so its chapters have no "
                 "launch buttons. To work a chapter in Colab, bring the whole course along, since a notebook's "
                 "first cell installs the course's library and checks from it. Zip your copy of the course "
                 "without its environment and build outputs: in a git clone of the course (the folder with "
                 "`pyproject.toml`), `git archive --format=zip --prefix=attention-course/ -o course.zip HEAD` (a few "
                 "tens of MB; a plain zip of the folder after `make` is over 2 GB, most of it `.venv`). Open <https://colab.research.google.com>, "
                 "upload the zip in the **Files** pane, and run `!unzip -q course.zip -d /content` in a cell, so "
                 "that `/content/attention-course/pyproject.toml` exists (the notebook's first cell says the same "
                 "if it is missing). Then choose **File → Upload notebook** "
                 "and pick `notebooks/NN_name/NN_name.ipynb` for the exercises, or "
                 "`solutions/NN_name/NN_name.ipynb` for the solved chapter, and run its first cell. The download "
                 "button at the top of each chapter gives the notebook as this book shows it, to read: it has no "
                 "install cell. Whoever builds the book for a published copy of the course adds the buttons with "
                 "the repository setting (see the README's \"The course as a book\").")
    toc = "\n".join(ch.docname for ch in chapter_list)
    nl = "\n"
    return f"""# Attention, step by step

A course in {len(chapter_list)} notebooks, from a hand-made similarity matrix to a Transformer that
translates, and on to the attention of today's large language models. Each chapter is a solved
notebook — motivation, math, code, picture, check — shown here with the outputs it was committed
with: nothing is run to build this book, and it reads offline.

:::{{figure}} figures/architecture.svg
:alt: {ALT}
:class: attn-architecture
:width: 720px

The model the course builds, piece by piece, in chapters 02–06 (the curriculum below says which part each writes).
:::

## Curriculum

{nl.join(items)}

## Working the exercises

On your own computer: clone the course, run `make lab` and work the notebooks in `notebooks/` in
order; the cell under each exercise checks it, and `attn-course check <notebook>` runs the full
checks and says what is right, what is wrong and why.

(colab)=
### In Colab

{colab}

```{{toctree}}
:hidden:
:maxdepth: 2
:caption: Chapters

{toc}
```
"""


# --------------------------------------------------------------------------- the build
def _mathjax_source() -> Path:
    import jupyter_server_mathjax

    static = Path(jupyter_server_mathjax.__file__).resolve().parent / "static"
    if not (static / "MathJax.js").is_file():
        raise FileNotFoundError(f"no MathJax.js in {static}: reinstall jupyter-server-mathjax")
    return static


def stage(source: Path, solutions: Path, repo: Repository | None) -> list[Chapter]:
    """Lay out the Sphinx source folder `source` (replaced if it exists)."""
    if source.exists():
        shutil.rmtree(source)
    (source / "_static").mkdir(parents=True)
    listed = []
    for chapter, nb in chapters(solutions):
        if repo:
            nb.cells.insert(1, _launch_cell(chapter, repo))
        target = source / chapter.name / f"{chapter.name}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
        listed.append(chapter)
    draw_architecture(source / "figures" / "architecture.svg")
    (source / "index.md").write_text(_index(listed, repo), encoding="utf-8")
    shutil.copytree(_mathjax_source(), source / "_static" / "mathjax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.py", "*.pyc"))
    (source / "_static" / "book.css").write_text(BOOK_CSS, encoding="utf-8")
    settings = {"mathjax_path": "mathjax/MathJax.js", "mathjax_config": MATHJAX_CONFIG,
                "repository": repo.name if repo else None, "ref": repo.ref if repo else None}
    (source / "book_settings.json").write_text(json.dumps(settings, indent=1), encoding="utf-8")
    shutil.copy(HERE / "sphinx_conf.py", source / "conf.py")
    return listed


def launch_mismatch(repo: Repository | None, root: Path) -> str:
    """Why the book's Colab buttons would open notebooks that cannot install themselves ("" when they can): the
    buttons open the committed notebooks of `repo`, whose first cell installs the repository pyproject.toml names
    (course_tools.colab), so the two must agree."""
    if repo is None:
        return ""
    name, _tag = published(root)
    if name == repo.name:
        return ""
    cells = f"install {name!r}" if name else "name no repository and stop on Colab"
    return (f"the Colab buttons open {repo.name}@{repo.ref}, but the notebooks' install cells {cells} "
            f"(pyproject.toml: [tool.attention-course] repository). Set repository = \"{repo.name}\" there, run "
            "`make build` and publish that commit, so that a notebook opened from the book installs its course.")


def build_book(out: str | Path = "build/book", repository: str | Repository | None = None,
               solutions: str | Path | None = None, verbose: bool = False) -> Path:
    """Build the book into <out>/html (fresh each time); return the path of its index.html.

    `repository`: 'owner/name[@ref]' for the Colab/Binder buttons; None reads $ATTN_BOOK_REPOSITORY,
    else pyproject.toml's [tool.attention-course] repository (empty: no buttons). `solutions`: the solved notebooks (the course's solutions/ by default).
    Raises ScrubError if the grader would show, RuntimeError if Sphinx warns or fails."""
    out = Path(out).resolve()
    if solutions is None:
        from autograder.course import solutions_dir

        solutions = solutions_dir()
    if repository is None and not os.environ.get(REPOSITORY_ENV):
        name, tag = published(Path(solutions).resolve().parent)  # the setting the Colab install cells use
        repository = f"{name}@{tag}" if name else None
    repo = repository if isinstance(repository, Repository) else \
        parse_repository(repository if repository is not None else os.environ.get(REPOSITORY_ENV))
    mismatch = launch_mismatch(repo, Path(solutions).resolve().parent)
    if mismatch:
        print(f"warning: {mismatch}", file=sys.stderr)
    source, html, doctrees = out / "source", out / "html", out / "doctrees"
    stage(source, Path(solutions).resolve(), repo)
    for old in (html, doctrees):
        if old.exists():
            shutil.rmtree(old)
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-j", "1",
               "-d", str(doctrees), str(source), str(html)]
    if not verbose:
        command.insert(3, "-q")  # warnings and errors only
    proc = subprocess.run(command, cwd=out, text=True, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sphinx-build failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    if verbose and proc.stdout:
        print(proc.stdout.rstrip())
    return html / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_tools.book", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="build/book", help="output folder (the site goes to OUT/html)")
    parser.add_argument("--repository", default=None,
                        help=f"owner/name[@ref] on GitHub for the Colab/Binder buttons (default: ${REPOSITORY_ENV})")
    parser.add_argument("--solutions", default=None, help="the solved notebooks (default: the course's solutions/)")
    parser.add_argument("-v", "--verbose", action="store_true", help="Sphinx's own progress too")
    args = parser.parse_args(argv)
    start = time.monotonic()
    try:
        index = build_book(args.out, args.repository, args.solutions, verbose=args.verbose)
    except (ScrubError, RuntimeError, ValueError, FileNotFoundError) as exc:
        print(f"make book: {exc}", file=sys.stderr)
        return 1
    pages = sum(1 for p in index.parent.rglob("*.html") if "_static" not in p.relative_to(index.parent).parts)
    print(f"the book: {index} ({pages} pages, {time.monotonic() - start:.0f} s); open it in a browser, no server needed")
    return 0
