"""The pip path (requirements.txt) and the conda path (environment.yml) pin the same versions."""
from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .layout import REPO


def _pins(lines):
    return {m.group(1).lower(): m.group(2) for line in lines
            if (m := re.match(r"^\s*(?:-\s+)?([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line))}


def test_pip_and_conda_pin_the_same_versions():
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    yml = (REPO / "environment.yml").read_text()
    conda = _pins(yml.split("- pip:", 1)[1].splitlines())
    assert pip == conda
    assert pip["torch"] == "2.13.0"
    assert "python=3.11" in yml


def test_constraints_agree_with_direct_pins():
    pip = _pins((REPO / "requirements.txt").read_text().splitlines())
    constraints = _pins((REPO / "constraints.txt").read_text().splitlines())
    assert "torch" not in constraints, "torch is pinned once, in requirements.txt"
    for name, version in pip.items():
        if name in constraints:
            assert constraints[name] == version, f"{name}: requirements {version} vs constraints {constraints[name]}"


def test_every_pin_is_exact():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "-c")):
            assert "==" in line, f"unpinned requirement: {line}"


def test_readme_results_table_is_generated_from_the_results_file():
    from attention_course.results import RESULTS_FILE, table

    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- results table: generated -->\n", 1)[1].split("<!-- end results table -->", 1)[0]
    assert block == table(RESULTS_FILE), "README's results table is stale: regenerate it with python -m attention_course.results"


def _declared():
    """{name: (Requirement, where)} for pyproject's dependencies and optional extras."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    groups = [("dependencies", project.get("dependencies", []))]
    groups += [(f"optional-dependencies.{k}", v) for k, v in project.get("optional-dependencies", {}).items()]
    for where, specs in groups:
        for spec in specs:
            req = Requirement(spec)
            declared[canonicalize_name(req.name)] = (req, where)
    return declared


def test_pyproject_declares_every_pinned_package_with_a_range_admitting_the_pin():
    from packaging.utils import canonicalize_name

    declared = _declared()
    pins = {canonicalize_name(name): version for name, version in _pins((REPO / "requirements.txt").read_text().splitlines()).items()}
    for name, version in pins.items():
        assert name in declared, f"{name}=={version} is in requirements.txt but not declared in pyproject.toml"
        req, where = declared[name]
        assert req.specifier.contains(version, prereleases=True), \
            f"pyproject.toml {where}: {req} does not admit the pinned {name}=={version}"
    for name, (req, where) in declared.items():
        if name == "attention-course":   # an extra naming another of this package's extras ([lab] -> [grader])
            assert req.extras and not req.specifier, f"{req} ({where}): name an extra of this package, no version"
            continue
        ops = {s.operator for s in req.specifier}
        assert "==" not in ops and "===" not in ops, f"{req}: pyproject declares ranges, the pins are in requirements.txt"
        assert ops & {">=", ">", "~="} and ops & {"<", "<=", "~="}, f"{req} ({where}): give a bounded range, e.g. >=X.Y,<X+1"
        assert name in pins, f"{req} ({where}) is declared in pyproject.toml but not pinned in requirements.txt"
    assert declared["torch"][0].specifier.contains("2.13.0") and declared["torch"][1] == "dependencies"


def test_runtime_and_test_dependencies_are_separated():
    declared = _declared()
    for name in ("pytest", "nbval"):
        assert declared[name][1] == "optional-dependencies.test", f"{name} is test-only: it belongs in the test extra"
    for name in ("torch", "numpy", "tqdm", "sacrebleu", "tokenizers"):
        assert declared[name][1] == "dependencies", f"{name} is the library's: a light install needs it"
    for name in ("nbgrader", "nbformat", "nbclient", "cloudpickle", "dask"):
        assert declared[name][1] == "optional-dependencies.grader", f"{name} is the grader's: the [grader] extra"
    for name in ("jupyterlab", "notebook"):
        assert declared[name][1] == "optional-dependencies.lab", f"{name} is the [lab] extra's"


def test_the_courses_venv_imports_nbformat_without_compiling_grammars():
    """`make venv` installs course_tools/venv_sitecustomize.py: rfc3987-syntax, whose import compiles three
    Lark grammars (0.8 s in every process that imports nbformat), is imported only when an IRI is checked,
    and then checks as the real package does."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip("only the Makefile's .venv has the course's sitecustomize; this Python is another environment")
    code = """if True:
        import sys, nbformat, jsonschema
        nbformat.validate(nbformat.v4.new_notebook())
        print(sorted(m for m in ("lark", "sitecustomize") if m in sys.modules))
        check = jsonschema.FormatChecker()
        print([check.conforms(v, f) for v, f in [("http://例え.jp/パス", "iri"), ("not an iri", "iri"),
                                                   ("#frag", "iri-reference"), ("a b", "iri-reference")]])
        import rfc3987_syntax
        print("lark" in sys.modules, rfc3987_syntax.is_valid_syntax_iri("http://a.b"), type(rfc3987_syntax).__name__)
    """
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert found.splitlines() == ["['sitecustomize']", "[True, False, True, False]", "True True module"], found


def test_the_longest_first_files_exist():
    """tests/conftest.py starts these files first (xdist balance): a renamed file would lose its place unseen."""
    from .conftest import LONGEST_FIRST

    missing = [path for path in LONGEST_FIRST if not (REPO / path).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names files that are gone: {missing}"


def test_only_attn_course_leaves_other_copies_of_the_course_off_its_path(tmp_path):
    """The sitecustomize's PYTHONPATH rule, on its own: it acts for the `attn-course` command alone, on
    folders that hold a course package, and never on the folder of the environment's own install."""
    from course_tools import venv_sitecustomize as site

    other, plain = tmp_path / "other", tmp_path / "plain"
    (other / "autograder").mkdir(parents=True)
    (other / "autograder" / "__init__.py").write_text("")
    plain.mkdir()
    own = str(REPO)
    pythonpath = os.pathsep.join([str(other), str(plain), own])
    for argv, left_out in ((["/x/bin/attn-course", "grade"], [str(other)]), (["-c"], []), (["/x/bin/jupyter"], [])):
        environ, said = {"PYTHONPATH": pythonpath}, io.StringIO()
        saved = sys.path[:]
        sys.path[:0] = [str(other), str(plain)]
        try:
            assert site.leave_other_copies_out(argv, environ, said) == left_out
            assert (str(other) in sys.path) == (not left_out)
        finally:
            sys.path[:] = saved
        expected = os.pathsep.join([str(plain), own]) if left_out else pythonpath
        assert environ["PYTHONPATH"] == expected and (str(other) in said.getvalue()) == bool(left_out)


def test_the_venvs_own_tools_are_found_without_activating_it(tmp_path):
    """`.venv/bin/nbgrader ...` typed with the environment not activated: nbgrader shells out to `alembic` when it
    makes a gradebook, and found none on PATH (FileNotFoundError). The course's sitecustomize puts the environment's
    bin first on PATH where it is missing, so a gradebook is made; a PATH that has it already is left as it is."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip("only the Makefile's .venv has the course's sitecustomize; this Python is another environment")
    from course_tools import venv_sitecustomize as site

    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    db = tmp_path / "gradebook.db"
    made = subprocess.run([str(Path(sys.prefix) / "bin" / "nbgrader"), "db", "assignment", "add", "ps1",
                           f"--CourseDirectory.db_url=sqlite:///{db}", f"--CourseDirectory.root={tmp_path}"],
                          cwd=tmp_path, env=bare, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0 and db.is_file(), made.stdout[-2000:] + made.stderr[-3000:]
    assert "alembic" not in made.stderr
    environ = {"PATH": f"{sys.prefix}/bin:/usr/bin"}
    assert not site.own_tools_on_path(environ) and environ["PATH"] == f"{sys.prefix}/bin:/usr/bin"
    environ = {"PATH": "/usr/bin"}
    assert site.own_tools_on_path(environ) and environ["PATH"] == f"{sys.prefix}/bin:/usr/bin"
    environ = {}  # no PATH at all (env -i): the default search path stays behind the environment's bin (a reviewer)
    assert site.own_tools_on_path(environ) and environ["PATH"] == os.pathsep.join([f"{sys.prefix}/bin", *filter(None, os.defpath.split(os.pathsep))])
    listed = subprocess.run([sys.executable, "-c", "import subprocess; subprocess.run(['ls', '-d', '/'], check=True)"],
                            env={}, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and listed.stdout.strip() == "/", listed.stderr[-2000:]


def test_an_empty_pythonpath_entry_in_another_copy_of_the_course_is_left_out_too(tmp_path, monkeypatch):
    """A red team: `PYTHONPATH=$PYTHONPATH:/x` with nothing before gives an empty entry, which Python reads as the
    current folder; run from inside an older clone, that clone's grader and library graded the class (honest
    students 14/17 for 17/17, "graded without problems"). The empty entry is that folder, and is left out."""
    from course_tools import venv_sitecustomize as site

    other, plain = tmp_path / "oldclone", tmp_path / "plain"
    (other / "attention_course").mkdir(parents=True)
    (other / "attention_course" / "__init__.py").write_text("")
    plain.mkdir()
    monkeypatch.chdir(other)
    for pythonpath in (os.pathsep + str(plain), str(plain) + os.pathsep):
        environ, said = {"PYTHONPATH": pythonpath}, io.StringIO()
        saved = sys.path[:]
        sys.path[:0] = ["", str(plain)]
        try:
            assert site.leave_other_copies_out(["/x/bin/attn-course", "grade"], environ, said) == \
                [os.path.realpath(other)]
            assert "" not in sys.path and str(plain) in sys.path
        finally:
            sys.path[:] = saved
        assert environ["PYTHONPATH"] == str(plain) and str(other) in said.getvalue()
    if Path(sys.prefix).resolve() == (REPO / ".venv").resolve():  # the real command, from inside the other copy
        done = subprocess.run([str(Path(sys.prefix) / "bin" / "attn-course"), "--course", str(REPO), "--help"],
                              cwd=other, env={**os.environ, "PYTHONPATH": os.pathsep + str(plain)},
                              capture_output=True, text=True, timeout=300)
        assert f"PYTHONPATH names another copy of the course, {os.path.realpath(other)}: left out" in done.stderr, \
            done.stderr[-2000:]
