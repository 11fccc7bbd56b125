"""The course the grader is handed (autograder/course.py): its folder, and the prepared grading
courses reused between grading folders (one nbgrader run per notebook per machine, not per run)."""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder import course as course_module
from autograder.course import CourseFolder, prepare_grading_course, prepared_courses_dir

from .layout import REPO

A01 = "01_similarity_attention"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return prepared_courses_dir()


@pytest.fixture
def solutions(tmp_path):
    folder = tmp_path / "solutions"
    shutil.copytree(REPO / "solutions" / A01, folder / A01)
    return folder


def _entries(cache) -> list[Path]:
    """The prepared entries (not the lock files beside them)."""
    return [p for p in cache.iterdir() if not p.name.startswith(".")] if cache.exists() else []


def _no_nbgrader(*args, **kwargs):
    raise AssertionError("nbgrader ran although the prepared course was in the cache")


def _max_points(db_path) -> float:
    with Gradebook(f"sqlite:///{db_path}") as gb:
        return sum(c.max_score for c in gb.find_notebook(A01, A01).grade_cells)


def test_a_second_grading_folder_is_copied_not_generated(tmp_path, cache, solutions, monkeypatch):
    first = tmp_path / "one" / "course"
    assert prepare_grading_course(first, first.parent / "gradebook.db", solutions) == [A01]
    assert _entries(cache) and all((p / "ready").is_file() for p in _entries(cache))
    monkeypatch.setattr(course_module, "nbgrader", _no_nbgrader)
    second = tmp_path / "two" / "course"
    assert prepare_grading_course(second, second.parent / "gradebook.db", solutions) == [A01]
    for part in ("source", "release"):
        a, b = (c / part / A01 / f"{A01}.ipynb" for c in (first, second))
        assert nbformat.read(a, as_version=4) == nbformat.read(b, as_version=4)
    assert _max_points(second.parent / "gradebook.db") == _max_points(first.parent / "gradebook.db") == 17
    config = (second / "nbgrader_config.py").read_text()
    assert str(second) in config and str(second.parent / "gradebook.db") in config and str(first) not in config


def test_a_changed_notebook_is_prepared_afresh(tmp_path, cache, solutions):
    prepare_grading_course(tmp_path / "a" / "course", tmp_path / "a" / "gradebook.db", solutions)
    path = solutions / A01 / f"{A01}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("A note added by the instructor."))
    nbformat.write(nb, path)
    prepare_grading_course(tmp_path / "b" / "course", tmp_path / "b" / "gradebook.db", solutions)
    assert len(_entries(cache)) == 2
    release = nbformat.read(tmp_path / "b" / "course" / "release" / A01 / f"{A01}.ipynb", as_version=4)
    assert release.cells[-1].source == "A note added by the instructor."


def test_an_existing_gradebook_is_never_replaced(tmp_path, cache, solutions, monkeypatch):
    """A gradebook may hold grades: the cache's copy never lands on it (nbgrader updates it instead)."""
    db = tmp_path / "gradebook.db"
    db.write_bytes(b"the grades of last week")
    calls = []
    monkeypatch.setattr(course_module, "prepare_source_course", lambda *a, **k: calls.append(a) or [A01])
    prepare_grading_course(tmp_path / "course", db, solutions)
    assert db.read_bytes() == b"the grades of last week" and len(calls) == 1
    assert not _entries(cache)


def test_a_broken_entry_is_replaced(tmp_path, cache, solutions):
    data = (solutions / A01 / f"{A01}.ipynb").read_bytes()
    broken = cache / course_module._entry_key({A01: data})
    (broken / "course").mkdir(parents=True)  # no "ready": never used
    prepare_grading_course(tmp_path / "course", tmp_path / "gradebook.db", solutions)
    assert (broken / "ready").is_file() and _max_points(tmp_path / "gradebook.db") == 17


def test_an_unwritable_cache_falls_back_to_nbgrader(tmp_path, solutions, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    prepare_grading_course(tmp_path / "course", tmp_path / "gradebook.db", solutions)
    assert _max_points(tmp_path / "gradebook.db") == 17


def test_the_course_folder_of_the_checkout():
    folder = CourseFolder.find(REPO / "notebooks")
    assert folder.root == REPO and folder.solutions == REPO / "solutions"
    assert {p.name for p in folder.private} >= {"solutions", ".git", "tests", "autograder", "course_tools"}


def test_student_code_never_sees_the_answers_wherever_things_are_installed(tmp_path, monkeypatch):
    """The namespaces fallback's deny-list: the graded course's and the library checkout's private
    folders, a course's own extracted library when another one is imported, the grader and the tools
    as installed (the hidden checks), and both caches of prepared notebooks."""
    from autograder import grade, selfcheck

    library = REPO / "attention_course"
    alone = set(grade.never_seen(None, library))  # solutions given as a bare folder, run from elsewhere
    for name in ("solutions", "tests", ".git", "autograder", "course_tools", "build"):
        assert str(REPO / name) in alone, name
    assert {str(prepared_courses_dir()), str(selfcheck.cache_root())} <= alone

    other = tmp_path / "other-course"
    (other / "solutions").mkdir(parents=True)
    (other / "nbgrader_config.py").write_text("")
    (other / "attention_course").mkdir()  # `attn-course build` wrote the reference modules here
    site = tmp_path / "site-packages"
    installed = {"autograder": site / "autograder", "course_tools": site / "course_tools"}
    monkeypatch.setattr(grade, "package_dir", lambda name: installed.get(name))
    hidden = set(grade.never_seen(CourseFolder(other), library))
    assert {str(other / "solutions"), str(other / "attention_course"), str(REPO / "solutions")} <= hidden
    assert {str(site / "autograder"), str(site / "course_tools")} <= hidden
    assert str(library) not in hidden


def test_bubblewrap_hides_the_grader_inside_an_installed_python(tmp_path):
    """A `pip install .` puts the grader in site-packages, inside a folder the sandbox must bind
    (the Python itself): it is covered by an empty folder there."""
    import sys

    from autograder import sandbox

    roots = sandbox._python_roots()
    inside = Path(roots[0]) / "lib"
    world = sandbox.World(readonly=[], hide=[str(inside), str(tmp_path)], kit=str(tmp_path))
    args = sandbox.bwrap_command(world)
    assert ["--tmpfs", str(inside)] in [args[i:i + 2] for i in range(len(args) - 1)]
    assert str(tmp_path) not in [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]  # not bound: nothing to hide
    assert sys.prefix in roots or any(Path(sys.prefix).is_relative_to(r) for r in roots)


def test_a_damaged_entry_falls_back_to_nbgrader(tmp_path, cache, solutions):
    prepare_grading_course(tmp_path / "a" / "course", tmp_path / "a" / "gradebook.db", solutions)
    [entry] = _entries(cache)
    shutil.rmtree(entry / "course" / "release")  # "ready" is there, the release is not
    prepare_grading_course(tmp_path / "b" / "course", tmp_path / "b" / "gradebook.db", solutions)
    assert _max_points(tmp_path / "b" / "gradebook.db") == 17
    assert (tmp_path / "b" / "course" / "release" / A01 / f"{A01}.ipynb").is_file()
    assert not entry.exists(), "a damaged entry is removed (the next folder makes a good one)"


def test_a_cache_others_can_write_is_not_used(tmp_path, cache, solutions):
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    prepare_grading_course(tmp_path / "course", tmp_path / "gradebook.db", solutions)
    assert not _entries(cache) and _max_points(tmp_path / "gradebook.db") == 17


def test_two_graders_at_once_prepare_the_course_once(tmp_path, cache, solutions, monkeypatch):
    """Two processes (here: threads) setting up grading folders at the same moment: the second waits
    for the first's entry instead of running nbgrader again."""
    import threading

    real, calls = course_module.prepare_source_course, []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(course_module, "prepare_source_course", counted)
    jobs = [threading.Thread(target=prepare_grading_course,
                             args=(tmp_path / n / "course", tmp_path / n / "gradebook.db", solutions)) for n in "ab"]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert len(calls) == 1, calls
    assert _max_points(tmp_path / "a" / "gradebook.db") == _max_points(tmp_path / "b" / "gradebook.db") == 17


def test_a_grading_folder_used_by_another_copy_of_the_grader_is_not_called_copied_or_moved(tmp_path):
    """Only the line naming the grader's shared settings differed (the course's venv or checkout moved): the
    run said "OUT was graded as OUT before (copied or moved)", the same folder twice (an instructor's walkthrough)."""
    from autograder.course import write_course_config
    from autograder.grade import Course

    root = tmp_path / "grading" / "course"
    config = write_course_config(root, f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}")
    first, *rest = config.read_text().splitlines()
    config.write_text("\n".join(["exec(open('/elsewhere/autograder/nbgrader_config.py').read())", *rest]) + "\n")
    said = Course(root).settle()
    assert said == (f"{root.parent}: its nbgrader settings were brought up to date (they name this grader's shared "
                    "settings and the course's own folders)")
    assert config.read_text().splitlines()[0] == first
    assert Course(root).settle() is None


def test_a_grading_folder_made_before_its_settings_named_its_folders_is_brought_up_to_date(tmp_path):
    """The grading course names its own folders (nbgrader started in the checkout read the checkout's
    build/nbgrader/ ones: `release_feedback` released nothing); a folder graded before that gets them on its next run."""
    from autograder.course import COURSE_FOLDERS, write_course_config
    from autograder.grade import Course

    root = tmp_path / "grading" / "course"
    config = write_course_config(root, f"sqlite:///{tmp_path / 'grading' / 'gradebook.db'}")
    named = [line for line in config.read_text().splitlines() if "_directory =" in line]
    assert named == [f"c.CourseDirectory.{kind}_directory = {kind!r}" for kind in COURSE_FOLDERS]
    config.write_text("".join(line + "\n" for line in config.read_text().splitlines() if "_directory =" not in line)
                      + "# the instructor's own line\n")
    assert Course(root).settle() is not None
    lines = config.read_text().splitlines()
    assert [line for line in lines if "_directory =" in line] == named and lines[-1] == "# the instructor's own line"
    assert Course(root).settle() is None
    # a folder setting of the instructor's own is kept (a reviewer: the next run put the default back, unsaid)
    config.write_text(config.read_text().replace("c.CourseDirectory.feedback_directory = 'feedback'",
                                                 "c.CourseDirectory.feedback_directory = 'handed-back'"))
    assert Course(root).settle() is None
    assert "c.CourseDirectory.feedback_directory = 'handed-back'" in config.read_text().splitlines()
