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
