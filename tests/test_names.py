"""Students' names in any script, and zips with nothing to grade, through the real intake (issue 24).

Built from an instructor's report: "Иван Петров" and "王小明" both became `student` (then
`student-2`), "Ørsted" lost its first letter, and an empty zip became a student marked missing
with nothing said about the zip. Real files on disk: student folders, Canvas-style file names,
nbgrader's submitted/ tree and zips, collected as `attn-course grade` collects them.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

from autograder.submissions import STUDENT_ID, collect_all

from .test_intake import A01, A02, ASSIGNMENTS, marker, notebook, write


def _graded(root: Path) -> dict[str, dict]:
    """student id -> (what each graded notebook is, by its marker; the student's notes)."""
    found = collect_all(root, ASSIGNMENTS)
    assert all(STUDENT_ID.match(s.student_id) for s in found.students)
    return {s.student_id: {"graded": {a: marker(d) for a, d in s.notebooks.items()}, "notes": s.problems}
            for s in found.students}


def test_names_in_other_scripts_keep_a_readable_id_of_their_own(tmp_path):
    root = tmp_path / "class"
    write(root / "Иван Петров" / f"{A01}.ipynb", notebook(A01, "ivan"))
    write(root / "王小明" / f"{A01}.ipynb", notebook(A01, "wang"))
    write(root / "Ørsted" / f"{A01}.ipynb", notebook(A01, "orsted"))
    write(root / f"петроваанна_1001_11_{A01}.ipynb", notebook(A01, "anna"))  # Canvas: lower case, no spaces
    write(root / f"李雷_1002_12_{A02}.ipynb", notebook(A02, "lei"))
    write(root / "Αλέξανδρος Παππάς_1234_assignsubmission_file_" / f"{A01}.ipynb", notebook(A01, "alexandros"))
    got = _graded(root)
    assert {sid: s["graded"] for sid, s in got.items()} == {
        "Ivan_Petrov": {A01: "ivan"}, "WangXiaoMing": {A01: "wang"}, "Orsted": {A01: "orsted"},
        "petrovaanna": {A01: "anna"}, "LiLei": {A02: "lei"}, "Alexandros_Pappas": {A01: "alexandros"}}
    assert got["Ivan_Petrov"]["notes"] == {"Иван Петров": "student id 'Иван Петров' renamed to 'Ivan_Petrov'"}
    assert got["Orsted"]["notes"] == {"Ørsted": "student id 'Ørsted' renamed to 'Orsted'"}
    assert got["LiLei"]["notes"] == {f"李雷_1002_12_{A02}.ipynb": "student id '李雷' renamed to 'LiLei'"}


def test_students_whose_names_clean_up_alike_are_never_merged(tmp_path):
    """Within one layout (two folders, two Canvas users of one name) and across layouts (a folder
    and nbgrader's submitted/ tree): each keeps their own notebook, and both rows say why."""
    root = tmp_path / "class"
    write(root / "王小明" / f"{A01}.ipynb", notebook(A01, "wang folder"))
    write(root / "WangXiaoMing" / f"{A01}.ipynb", notebook(A01, "latin folder"))
    write(root / f"王小明_1002_12_{A02}.ipynb", notebook(A02, "wang canvas"))
    write(root / f"王小明_2003_13_{A02}.ipynb", notebook(A02, "another wang"))
    write(root / "Ørsted" / f"{A01}.ipynb", notebook(A01, "orsted folder"))
    write(root / "submitted" / "Orsted" / A02 / f"{A02}.ipynb", notebook(A02, "orsted exchange"))
    got = _graded(root)
    assert {sid: s["graded"] for sid, s in got.items()} == {  # in name order, the earlier entry keeps the id
        "WangXiaoMing": {A01: "latin folder"},
        "WangXiaoMing-2": {A01: "wang folder", A02: "wang canvas"},  # one name: the folder and its Canvas upload
        "WangXiaoMing-3": {A02: "another wang"},  # another Canvas user of the same name
        "Orsted": {A02: "orsted exchange"},
        "Orsted-2": {A01: "orsted folder"},  # 'Orsted' and 'Ørsted' are two names: not merged
    }
    assert got["Orsted-2"]["notes"] == {"Ørsted": (
        "graded as student id 'Orsted-2', because 'Orsted' is already graded as 'Orsted'; "
        "if both are the same student, keep one: move the notebooks you want graded into 'Orsted' and remove "
        "'Ørsted' (an unzipped copy beside its zip, say), then grade again")}
    assert got["Orsted"]["notes"] == {"Ørsted": "another submission, 'Ørsted', is graded separately as student id 'Orsted-2'"}
    assert got["WangXiaoMing"]["notes"] == {
        "王小明": "another submission, '王小明', is graded separately as student id 'WangXiaoMing-2'",
        f"王小明_2003_13_{A02}.ipynb": (f"another submission, '王小明_2003_13_{A02}.ipynb', is graded separately as "
                                        "student id 'WangXiaoMing-3'")}


def test_a_zip_with_no_notebook_is_named_in_its_students_notes(tmp_path):
    root = tmp_path / "class"
    root.mkdir()
    with zipfile.ZipFile(root / "erin.zip", "w"):
        pass  # an empty zip: the student zipped the wrong folder
    with zipfile.ZipFile(root / "frank.zip", "w") as zf:
        zf.writestr("homework/answers.py", "def softmax(x): ...")
        zf.writestr("homework/README.md", "see the .py")
    write(root / f"grace_123_456_{A01}.ipynb", notebook(A01, "grace"))
    with zipfile.ZipFile(root / "grace_123_457_work.zip", "w"):
        pass  # a second, empty upload of a student who has a notebook too
    found = collect_all(root, ASSIGNMENTS)
    subs = {s.student_id: s for s in found.students}
    assert subs["erin"].notebooks == {} and subs["erin"].problems == {"erin.zip": (
        "nothing graded from this zip: no notebook (.ipynb) in it (it is empty); zip the .ipynb files and upload again")}
    assert subs["frank"].problems == {"frank.zip": (
        "nothing graded from this zip: no notebook (.ipynb) in it (it holds 2 other files, listed among the files "
        "not graded); zip the .ipynb files and upload again")}
    assert marker(subs["grace"].notebooks[A01]) == "grace"
    assert "no notebook (.ipynb) in it (it is empty)" in subs["grace"].problems["grace_123_457_work.zip"]
    ignored = dict(found.ignored)
    assert {"erin.zip", "frank.zip", "grace_123_457_work.zip", "frank.zip/homework/README.md"} <= set(ignored)
