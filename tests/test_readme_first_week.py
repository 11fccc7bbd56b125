"""What the README tells an instructor in their first week (instructor 11's report, findings 1-5 and 10): the
students' exchange commands with the course id, `collect --update` for resubmissions, `release_feedback` once per
exchange student, the two commands that make `.venv` with a CPU torch, and what a roster's ids must be (an LMS
download, ids that differ only in case). Text checks only: the commands themselves run in test_exchange.py and
test_readme_walkthrough.py."""
from __future__ import annotations

import re

from traitlets.config.loader import PyFileConfigLoader

from .layout import REPO

README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _exchange_paragraphs() -> str:
    instructors = _section("For instructors")
    start = instructors.index("With nbgrader's exchange")
    return instructors[start:instructors.index("\nEverything comes from `solutions/`", start)]


def _course_id() -> str:
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO / "autograder")).load_config()
    return config.CourseDirectory.course_id


def test_the_students_exchange_commands_name_the_course_id():
    """Finding 3: "No course id specified. Re-run with --course flag." was a student's first command."""
    course = _course_id()
    assert course == "attention-step-by-step"
    hub = (REPO / "deploy" / "jupyterhub" / "jupyter" / "nbgrader_config.py").read_text()
    assert f'"ATTN_HUB_COURSE_ID", "{course}"' in hub  # the hub's default is the same id
    text = _exchange_paragraphs()
    for command in ("fetch_assignment", "submit", "fetch_feedback"):
        assert re.search(rf"^nbgrader {command} 01_similarity_attention --course {course}$", text, re.M), command


def test_the_exchange_section_says_collect_update_for_resubmissions_and_release_feedback_once_per_student():
    """Findings 4 and 5: a resubmission is not collected without --update; `--student` given twice is refused."""
    text = " ".join(_exchange_paragraphs().split())
    assert "`nbgrader collect 01_similarity_attention --update`" in text
    assert "WARNING" in text  # the course's collect names the students it left
    assert "run it once per exchange student, adding `--student=ID`" in text
    assert "add `--student=ID` for each exchange student" not in text


def test_quick_start_gives_the_commands_that_make_the_venv_with_a_cpu_torch():
    """Finding 10: "install torch from PyTorch's CPU wheel index first into .venv", with no .venv yet and no command."""
    quick = _section("Quick start")
    blocks = re.findall(r"^```bash\n(.*?)^```$", quick, re.S | re.M)
    [block] = [b for b in blocks if "torch==2.13.0" in b]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert lines[0] == "python3.11 -m venv .venv"
    assert lines[1].startswith(".venv/bin/pip install torch==2.13.0 --index-url ")
    assert "make venv" in lines
    assert "://" not in block  # no registry named here: the index URL is the one PyTorch's selector gives


def test_the_roster_paragraph_says_what_ids_an_lms_download_needs_and_that_case_counts():
    """Findings 1 and 2: a roster of institutional ids split every Canvas student in two; Alice/ and alice too."""
    text = " ".join(_section("For instructors").split())
    assert "leave `--roster` out and give `attn-course export --to canvas` Canvas's own gradebook export with " \
           "`--canvas-roster`" in text
    assert "Canvas's `smithjohn_345678_9012_...` is `smithjohn`" in text
    assert "a folder `Alice/` and a roster id `alice` are two students" in text
