"""How the static honesty pass reads a notebook: within a budget of work, and as IPython will run it.

Budget: alias chains in cells that never run (`if False:` then `v0 = v1.a`, ... `import numpy as
v1000`) made the scan cubic (a 696 KB notebook held a class's batch for minutes, in the trusted
process). Work is counted in steps (nodes, bindings, path names), never seconds: a notebook past
the budget is one review finding. Reading: a cell IPython runs but `ast.parse` refuses (autocall
`/f x`, every line indented, `>>> ` prompts, a one-line automagic) hid a forbidden call; it is now
read the way IPython transforms it, while a student's plain syntax error is still left alone."""
from __future__ import annotations

import importlib
import json

import pytest

from autograder import honesty
from autograder.honesty import FORBIDDEN, REVIEW, Finding, Rules, rules_for_exercises, scan
from tests.test_honesty import REPO

FORBIDDEN_SOFTMAX = '''import numpy as np, torch
def softmax(x, axis=-1):
    return torch.softmax(torch.from_numpy(np.asarray(x, dtype=np.float64)), dim=axis).numpy()
'''
WORKER = '''import threading, queue
import numpy as np, torch
_rq, _aq = queue.Queue(), queue.Queue()
def _worker():
    while True:
        x, axis = _rq.get()
        _aq.put(torch.softmax(torch.from_numpy(np.array(x, dtype=np.float64)), dim=axis).numpy())
threading.Thread(target=_worker, daemon=True).start()
def softmax(x, axis=-1):
    _rq.put((x, axis))
    return _aq.get()
'''
TOO_COMPLEX = "too complex for the grader's reading"


def rules(notebook: str = "01") -> list[Rules]:
    module = importlib.import_module(f"autograder.checks.nb{notebook}")
    return rules_for_exercises(module.check.exercises.values())


def chain_cell(k: int, length: int, attr: str = ".a") -> str:
    """The red team's cell: an alias chain that never runs, ending in an import."""
    lines = [f"    v{k}_{i} = v{k}_{i + 1}{attr}" for i in range(length)]
    return "\n".join(["if False:", *lines, f"    import numpy as v{k}_{length}"])


def solution_cells(notebook: str) -> list[str]:
    path = next((REPO / "solutions").glob(f"{notebook}_*/*.ipynb"))
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


# --------------------------------------------------------------------------- the budget
def test_the_red_teams_chain_notebook_is_left_to_a_person_within_the_budget():
    cells = [chain_cell(k, 1000) for k in range(8)] + [FORBIDDEN_SOFTMAX]
    budget = honesty.Budget()
    findings = scan(cells, rules(), budget)
    # left to a person, and nothing counted until then: padding must not switch the static pass off
    assert [(f.severity, f.exercises) for f in findings] == [(FORBIDDEN, ()), (REVIEW, ())], findings
    assert all(TOO_COMPLEX in f.reason and "a person should read it" in f.reason for f in findings)
    assert "none of its exercises is counted" in findings[0].reason
    assert honesty.WORK_BUDGET < budget.spent <= honesty.WORK_BUDGET + 2_000  # stopped at the budget, not read to the end


def test_an_alias_is_resolved_once_however_long_its_chain():
    """Plain aliases (`v0 = v1`, ..., `import numpy as vN`): the work grows with N, not N squared or cubed."""
    spent = {}
    for length in (500, 2000):
        budget = honesty.Budget()
        assert scan([chain_cell(0, length, attr=""), "def softmax(x, axis=-1):\n    return v0_0.exp(x)\n"],
                    rules(), budget) == []
        spent[length] = budget.spent
    assert spent[2000] < 5 * spent[500] and spent[2000] < 40 * 2000, spent


@pytest.mark.parametrize("notebook", ["01", "02", "05", "07"])
def test_honest_notebooks_spend_a_small_part_of_the_budget(notebook):
    budget = honesty.Budget()
    scan(solution_cells(notebook), rules(notebook), budget)
    assert 0 < budget.spent < honesty.WORK_BUDGET // 20, budget.spent


def test_an_alias_cycle_is_still_followed():
    """Cells can be run again in any order: `a` can come to stand for torch.softmax through `b`."""
    cells = ["import torch as t\na = t", "b = a.softmax", "a = b", "def softmax(x, axis=-1):\n    return a(x)\n"]
    found = [f for f in scan(cells, rules()) if f.severity == FORBIDDEN]
    assert found and {f.exercises for f in found} == {("softmax",)}, found


# --------------------------------------------------------------------------- reading as IPython does
def autocall(code: str) -> str:
    return code + "/len 'x'\n"  # IPython's autocall escape: /f x -> f(x)


def indented(code: str) -> str:
    return "".join(" " + line for line in code.splitlines(True))  # IPython dedents (leading_indent)


def prompts(code: str) -> str:  # IPython strips doctest prompts (classic_prompt)
    return "".join((">>> " if line.strip() and not line.startswith(" ") else "... ") + line
                   for line in code.splitlines(True))


@pytest.mark.parametrize("trick", [autocall, indented, prompts])
def test_a_forbidden_call_in_a_cell_only_ipython_can_parse_is_found(trick):
    cells = ["import math", trick(FORBIDDEN_SOFTMAX)]
    found = [f for f in scan(cells, rules()) if f.severity == FORBIDDEN]
    assert [(f.cell, f.line, f.exercises) for f in found] == [(1, 3, ("softmax",))], found
    assert "torch.softmax" in found[0].code


@pytest.mark.parametrize("trick", [autocall, indented, prompts])
def test_the_red_teams_worker_thread_is_flagged_whatever_the_trick(trick):
    findings = scan(["import math", trick(WORKER)], rules())
    assert any(f.severity == REVIEW and f.cell == 1 and "another thread" in f.reason for f in findings), findings


def test_a_one_line_automagic_cell_is_read_as_its_magic():
    """`time f(x)` on a cell of its own runs as `%time f(x)` (IPython's automagic)."""
    cells = ["import torch, threading", "time threading.Thread(target=lambda: torch.softmax(x, 0)).start()"]
    assert any(f.cell == 1 and "another thread" in f.reason for f in scan(cells, rules()))


HONEST_BROKEN = [
    "import numpy as np",
    "def softmax(x, axis=-1):\n    e = np.exp(x - x.max(axis=axis, keepdims=True)\n    return e / e.sum(axis=axis, keepdims=True)\n",
    'print "done"',
    "for i in range(3)\n    print(i)",
]


def test_an_honest_notebook_with_a_syntax_error_is_not_flagged():
    """A cell that IPython cannot run either just fails when the notebook runs: nothing to review."""
    assert scan(HONEST_BROKEN, rules()) == []


def test_a_cell_ipython_runs_but_the_pass_cannot_read_is_left_to_a_person():
    """Nesting too deep for the parser: named by its cell, for a person (Jupyter numbers it in the report)."""
    deep = "x = " + "-" * 200_000 + "1\n"
    findings: list[Finding] = scan(["import math", deep], rules())
    assert [(f.severity, f.cell) for f in findings] == [(REVIEW, 1)], findings
    assert "cannot read it as Python" in findings[0].reason


# --------------------------------------------------------------------------- red team 2: cells IPython reads otherwise
# Each trick hid a forbidden call from the pass with no flag at all (full marks). Each is now left to a person.
HIDDEN = "import torch\ndef softmax(x, axis=-1):\n    return torch.softmax(torch.as_tensor(x), dim=axis).numpy()"


def reviews(findings: list[Finding], cell: int) -> list[Finding]:
    return [f for f in findings if f.severity == REVIEW and f.cell == cell]


@pytest.mark.parametrize("switch", ["%autocall 1", "autocall 2", "%config InteractiveShell.autocall = 2"])
def test_an_autocall_line_is_read_as_the_call_ipython_runs(switch):
    """With autocall on, IPython's prefilter runs the one-line cell `exec "<source>"` as exec("<source>")."""
    cells = ["import numpy as np", switch, f"exec {HIDDEN!r}"]
    findings = scan(cells, rules())
    assert reviews(findings, 1), findings  # the switch itself
    on_line = [f for f in reviews(findings, 2) if f.line == 1]
    assert any("autocall" in f.reason and "exec(" in f.reason for f in on_line), findings
    assert any("exec" in f.reason and "run time" in f.reason for f in on_line), findings
    assert not [f for f in findings if f.severity == FORBIDDEN]  # left to a person, nothing taken


def test_a_cell_magic_made_by_alias_magic_is_left_to_a_person():
    cells = ["import numpy as np", "%alias_magic t time", "%%t\n" + HIDDEN]
    findings = scan(cells, rules())
    assert any("%alias_magic" in f.reason for f in reviews(findings, 1)), findings
    assert any(f.line == 1 and "%%t" in f.reason for f in reviews(findings, 2)), findings


def test_an_unknown_cell_magic_is_left_to_a_person_and_display_magics_are_not():
    findings = scan(["import numpy as np", "%%python3\n" + HIDDEN, "%%html\n<b>hi</b>", "%%markdown\n# x"], rules())
    assert [(f.severity, f.cell, f.line) for f in findings] == [(REVIEW, 1, 1)], findings
    assert "%%python3" in findings[0].reason


def test_the_setup_line_of_a_timeit_cell_is_read():
    """`%%timeit -n1 -r1 <setup>`: the first line runs once before the body (probe3 of the red team)."""
    setup = ("global softmax; import torch; "
             "softmax = lambda x, axis=-1: torch.softmax(torch.as_tensor(x), dim=axis).numpy()")
    found = [f for f in scan(["import numpy as np", f"%%timeit -n1 -r1 {setup}\npass"], rules())
             if f.severity == FORBIDDEN]
    assert [(f.cell, f.line, f.exercises) for f in found] == [(1, 1, ("softmax",))], found
    hidden = scan(["import numpy as np", f"%%timeit -n1 -r1 exec({HIDDEN!r}, globals())\npass"], rules())
    assert any(f.line == 1 and "exec" in f.reason for f in reviews(hidden, 1)), hidden


WRITE_MODULE = [
    "import numpy as np",
    f"import sys\nwith open('/tmp/helper_sm.py', 'w') as f:\n    f.write({HIDDEN.replace('def softmax', 'def sm')!r})\n"
    "sys.path.insert(0, '/tmp')\nimport helper_sm\n",
    "def softmax(x, axis=-1):\n    return helper_sm.sm(x, axis)\n",
]
BASH_MODULE = [
    "import numpy as np",
    f"%%bash\ncat > /tmp/helpers_sm.py <<'EOF'\n{HIDDEN.replace('def softmax', 'def sm')}\nEOF\n",
    "import sys\nsys.path.insert(0, '/tmp')\nfrom helpers_sm import sm as _sm\n"
    "def softmax(x, axis=-1):\n    return _sm(x, axis)\n",
]


def test_a_module_the_notebook_writes_and_imports_is_left_to_a_person():
    findings = scan(WRITE_MODULE, rules())
    cell = reviews(findings, 1)
    assert any(f.line == 2 and "writes a Python file" in f.reason for f in cell), findings
    assert any(f.line == 4 and "sys.path" in f.reason for f in cell), findings
    assert any(f.line == 5 and "helper_sm" in f.reason and "not installed" in f.reason for f in cell), findings
    assert not [f for f in findings if f.severity == FORBIDDEN]


def test_a_module_written_by_bash_and_imported_is_left_to_a_person():
    findings = scan(BASH_MODULE, rules())
    assert any(f.line == 1 and "%%bash" in f.reason for f in reviews(findings, 1)), findings
    assert any(f.line == 3 and "helpers_sm" in f.reason and "not installed" in f.reason
               for f in reviews(findings, 2)), findings
    shell = scan(["import numpy as np", f"!echo {HIDDEN.splitlines()[0]!r} > helpers_sm.py", "!ls", "!pip list"],
                 rules())
    assert [(f.cell, f.line) for f in shell] == [(1, 1)] and "shell command" in shell[0].reason, shell


def test_installed_modules_and_honest_magics_give_no_finding():
    cells = ["import numpy as np, nbformat, json\nfrom collections import OrderedDict\nimport attention_course",
             "%config InlineBackend.figure_format = 'retina'\n%matplotlib inline",
             "%%timeit -n1 -r1 x = np.ones(3)\nx.sum()", "%%capture out\nprint(1)", "files = !ls",
             "with open('notes.txt', 'w') as f:\n    f.write('hi')"]
    assert scan(cells, rules()) == []


def _every_code_cell(path) -> list[str]:
    """Every code cell as a person runs the notebook (the hidden test cells too), but the course's Colab
    install cell, which the grader never reads (trusted.normalize_submission marks it provided)."""
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"
            and "colab-install" not in c.get("metadata", {}).get("tags", [])]


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO) for folder in ("solutions", "notebooks")
                                        for p in (REPO / folder).glob("*/*.ipynb")), ids=str)
def test_the_course_notebooks_read_whole_give_only_the_grader_imports(path):
    """The new rules (magics, shell lines, modules not installed, sys.path, .py files written) find nothing
    in the course's own notebooks: read whole, their only findings are the hidden tests' grader imports."""
    findings = scan(_every_code_cell(REPO / path), rules(path.name[:2]))
    assert all("grader's own code (autograder" in f.reason for f in findings), findings


def test_a_look_piped_into_a_filter_is_no_finding_but_env_running_a_command_is_left_to_a_person():
    """`!pip list | head` was flagged for review (any pipe was); a pipe into filters that only read is a look.
    `env` with arguments runs a command (`!env python -c ...` could write a module the notebook imports), which
    passed as a look."""
    looks = ["!pip list | head", "!pip list | grep -i torch", "!nvidia-smi | head -5", "!ls -la | grep ipynb | wc -l",
             "!printenv HOME", "!env"]
    assert [(c, scan([c], rules())) for c in looks if scan([c], rules())] == []
    for hidden in ("!env python -c 'open(\"helpers.py\", \"w\").write(\"x = 1\")'", "!pip list | tee helpers.py",
                   "!cat notes.txt | python", "!ls || touch helpers.py", "!pip install x | head",
                   "!echo 'import torch' | uniq - helpers.py", "!cat notes.txt | sort -o helpers.py"):
        assert [f.severity for f in scan([hidden], rules())] == [REVIEW], hidden


def test_a_colab_students_own_cells_are_not_flagged():
    """Colab users add `!pip install NAME` cells and mount their Drive: packages by name from the index and
    the platform's own module are nothing the notebook wrote. An install from a path, a URL or a requirements
    file still is left to a person, as is any shell line that writes."""
    honest = ["!pip install -q sacrebleu", "!pip install sacrebleu==2.4.0 tokenizers",
              "from google.colab import drive\ndrive.mount('/content/drive')", "import google.colab.files"]
    assert [(c, scan([c], rules())) for c in honest if scan([c], rules())] == []
    for hidden in ("!pip install ./helpers", "!pip install -r req.txt", "!pip install git+https://example.org/x",
                   "!pip install x; echo 'import torch' > helpers.py"):
        assert [f.severity for f in scan([hidden], rules())] == [REVIEW], hidden


class _CountingTransformer:
    """IPython's input transformer, counted and made cheap: what the pass asks of it, not how long it takes."""

    def __init__(self, real: bool = False):
        self.calls: list[int] = []
        self.ipython = honesty._ipython()
        self.cleanup_transforms = self.ipython.cleanup_transforms
        self.real = real

    def transform_cell(self, text: str) -> str:
        self.calls.append(len(text))
        return self.ipython.transform_cell(text) if self.real else text


# 495 autocall escapes IPython expands one per round, re-tokenizing the whole 1.9 MB cell each round: a red
# team's cell held a grading thread for 11 minutes of work the budget never counted
SLOW_TO_TRANSFORM = "/f 1\n" * 495 + ("x = 1  # " + "p" * 90 + "\n") * 19000


def test_a_cell_ipython_would_take_minutes_to_transform_goes_to_a_person_unread(monkeypatch):
    counting = _CountingTransformer()
    monkeypatch.setattr(honesty, "_TRANSFORMER", counting)
    found = scan([SLOW_TO_TRANSFORM + "1 +\n"], rules_for_exercises(_nb01().EXERCISES))
    assert any(f.severity == FORBIDDEN and "too complex" in f.reason for f in found), found
    assert not counting.calls  # paid for before, and refused: IPython never started on it
    # without a budget (the hint naming a skipped cell's definitions): the cell is left unread, at once
    assert honesty.top_level_names(SLOW_TO_TRANSFORM + "y = 2\n") == set() and not counting.calls


def test_an_ordinary_cell_with_magics_is_still_transformed_and_read(monkeypatch):
    counting = _CountingTransformer(real=True)
    monkeypatch.setattr(honesty, "_TRANSFORMER", counting)
    cell = "%matplotlib inline\nimport numpy as np\nx = np.ones(3)\n/print x\n" + "y = x * 2\n" * 200
    assert honesty._transform_steps(cell) < honesty.WORK_BUDGET // 100
    names = honesty.top_level_names(cell)
    assert counting.calls and {"np", "x", "y"} <= names, (counting.calls, names)


def _nb01():
    return importlib.import_module("autograder.checks.nb01")
