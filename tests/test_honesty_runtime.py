"""Honesty judged by behaviour as well as spelling (issue 23, item 6: families F6 and F8).

F6: an exercise that hands its inputs to another process, which calls the forbidden built-in there
(the grader's runtime check watches only its own process). F8: a forbidden function fetched by a
deserialiser (pickle and friends) from a name stored in data, which the static pass cannot read.
The grader's answer: while an exercise is checked, an audit hook (core, installed by the runner
before any student code) refuses every event that starts a process and every pickle lookup; the
static pass flags both for review. Where no audit event is raised (multiprocessing's spawn starts its
child through _posixsubprocess.fork_exec) the profile guard refuses the call, and it refuses to run a
case at all when PyTorch's hooks were left switched off (a cell's unpickled payload can do that,
outside any check). The attacks are graded for real, through the sandbox; the rules are also tested
one by one on core.run_case and on the static pass."""
from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import queue
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autograder.checks import core, nb02
from autograder.honesty import FORBIDDEN, REVIEW, scan

from .conftest import autograde, failed_cells, inject, solved_notebook
from .test_honesty import HEAD, HONEST_SDPA, _honest, rules

ASSIGNMENT = "02_queries_keys_values"
SDPA_CELLS = {"test_scaled_dot_product_attention", "test_scaled_dot_product_attention_mask",
              "test_scaled_dot_product_attention_matches_torch"}
NO_PROCESSES = "the grader does not allow starting processes while an exercise is checked"

# F6: the inputs go to a child `python -c` as .npz on its stdin; the child calls the built-in (with
# v = the identity for the weights) and sends both back as .npy on its stdout. Nothing is pickled.
BY_SUBPROCESS = '''import io
import subprocess
import sys

import numpy as np
import torch

CHILD = """
import io, sys
import numpy as np, torch
import torch.nn.functional as F
data = np.load(io.BytesIO(sys.stdin.buffer.read()))
q, k, v = (torch.from_numpy(data[n]) for n in "qkv")
mask = torch.from_numpy(data["mask"]) if "mask" in data.files else None
eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
buf = io.BytesIO()
np.savez(buf, out=F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy(),
         weights=F.scaled_dot_product_attention(q, k, eye, attn_mask=mask).numpy())
sys.stdout.buffer.write(buf.getvalue())
"""


def scaled_dot_product_attention(q, k, v, mask=None):
    arrays = {"q": q.detach().numpy(), "k": k.detach().numpy(), "v": v.detach().numpy()}
    if mask is not None:
        arrays["mask"] = mask.numpy()
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    child = subprocess.run([sys.executable, "-c", CHILD], input=buf.getvalue(), capture_output=True, check=True)
    back = np.load(io.BytesIO(child.stdout))
    out, weights = torch.from_numpy(back["out"]), torch.from_numpy(back["weights"])
    return torch.nan_to_num(out), torch.nan_to_num(weights)
'''

# F8: pickle's GLOBAL opcode fetches the built-in by name and, through operator.methodcaller, enters
# PyTorch's switches that hide calls from the grader's torch modes; map() then calls it from C, where
# the grader's profile hook does not look. Before the audit hook, this defeated every runtime check.
PAYLOAD = (b"coperator\nmethodcaller\n(S'__enter__'\ntRp0\n0"
           b"g0\n(ctorch._C\nDisableTorchFunction\n)RtR0"
           b"g0\n(ctorch._C\n_DisableTorchDispatch\n)RtR0"
           b"ctorch.nn.functional\nscaled_dot_product_attention\n.")
BY_PICKLE = f'''import pickle

import torch

PAYLOAD = {PAYLOAD!r}


def scaled_dot_product_attention(q, k, v, mask=None):
    attend = pickle.loads(PAYLOAD)
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    out = next(map(attend, [q], [k], [v], [mask]))
    weights = next(map(attend, [q], [k], [eye], [mask]))
    return torch.nan_to_num(out), torch.nan_to_num(weights)
'''


# F6 through multiprocessing's spawn start method: its child is started by _posixsubprocess.fork_exec,
# which raises no audit event; the child gets the inputs as arguments and sends raw .npz bytes back.
BY_SPAWN = '''import io
import multiprocessing

import numpy as np
import torch

CHILD = """
import io
import numpy as np, torch
import torch.nn.functional as F
q, k, v, mask = (None if a is None else torch.from_numpy(a) for a in inputs)
eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
buf = io.BytesIO()
np.savez(buf, out=F.scaled_dot_product_attention(q, k, v, attn_mask=mask).numpy(),
         weights=F.scaled_dot_product_attention(q, k, eye, attn_mask=mask).numpy())
conn.send_bytes(buf.getvalue())
"""


def scaled_dot_product_attention(q, k, v, mask=None):
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    inputs = [None if t is None else t.detach().numpy() for t in (q, k, v, mask)]
    child = ctx.Process(target=exec, args=(CHILD, {"conn": theirs, "inputs": inputs}))
    child.start()
    back = np.load(io.BytesIO(mine.recv_bytes()))
    child.join()
    return torch.nan_to_num(torch.from_numpy(back["out"])), torch.nan_to_num(torch.from_numpy(back["weights"]))
'''

# F8 outside the check: the cell itself unpickles the payload when it runs, so nothing is unpickled
# while a case runs; PyTorch's hooks stay switched off, and the grader's torch modes would see nothing.
BY_A_CELLS_PICKLE = f'''import pickle

import torch

attend = pickle.loads({PAYLOAD!r})


def scaled_dot_product_attention(q, k, v, mask=None):
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
    out = next(map(attend, [q], [k], [v], [mask]))
    weights = next(map(attend, [q], [k], [eye], [mask]))
    return torch.nan_to_num(out), torch.nan_to_num(weights)
'''
HOOKS_OFF = "PyTorch's function or dispatch hooks switched off"

# A worker thread, started when the cell runs (before any check), calls the built-in; the answer hands it
# the inputs through a queue. The guard watched the checking thread only (a red team's: full marks).
BY_A_THREAD = '''import queue
import threading

import torch
import torch.nn.functional as F

_requests, _answers = queue.Queue(), queue.Queue()


def _worker():
    while True:
        q, k, v, mask = _requests.get()
        eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-2], k.shape[-2], k.shape[-2])
        try:
            _answers.put((F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                          F.scaled_dot_product_attention(q, k, eye, attn_mask=mask)))
        except BaseException:  # the grader's refusal, swallowed: the answer comes another way
            _answers.put((torch.zeros(q.shape[:-1] + v.shape[-1:]), torch.zeros(q.shape[:-1] + k.shape[-2:])))


threading.Thread(target=_worker, daemon=True).start()


def scaled_dot_product_attention(q, k, v, mask=None):
    _requests.put((q, k, v, mask))
    out, weights = _answers.get()
    return torch.nan_to_num(out), torch.nan_to_num(weights)
'''
SDPA_BUILTIN = "it calls torch.nn.functional.scaled_dot_product_attention, the built-in"

# A red team's answer to notebook 02: softmax(q k^T / sqrt(d)), masked, taken from the weights PyTorch's
# multi-head attention returns with one head, identity projections and need_weights=True (a path that never
# reaches the fused kernel). It scored 14/14, unflagged, when only scaled_dot_product_attention was forbidden.
BY_MULTI_HEAD_FORWARD = '''import torch
import torch.nn.functional as F


def scaled_dot_product_attention(q, k, v, mask=None):
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Tq, Tk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    qq = q.expand(*lead, Tq, d).reshape(-1, Tq, d).transpose(0, 1)
    kk = k.expand(*lead, Tk, d).reshape(-1, Tk, d).transpose(0, 1)
    n, eye, blocked = qq.shape[1], torch.eye(d, dtype=q.dtype), None
    if mask is not None:
        allowed = mask.expand(*lead, Tq, Tk).reshape(n, Tq, Tk)
        blocked = ~allowed & allowed.any(-1, keepdim=True)
    attend = getattr(F, "multi_head_" + "attention_forward")  # no name for the static pass to read
    _, w = attend(qq, kk, kk, d, 1, None, None, None, None, False, 0.0, eye, None, training=False,
                  need_weights=True, attn_mask=blocked, use_separate_proj_weight=True, q_proj_weight=eye,
                  k_proj_weight=eye, v_proj_weight=eye, average_attn_weights=False)
    w = w.reshape(n, Tq, Tk)
    if mask is not None:
        w = w * allowed
    w = w.reshape(*lead, Tq, Tk)
    return w @ v, w
'''
MULTI_HEAD_FORWARD = "it calls torch.nn.functional.multi_head_attention_forward, PyTorch's own attention"
BY_TORCHSCRIPT = '''import torch


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    # PyTorch's own multi_head_attention_forward (identity projections, one head) computes the weights,
    # reached through a TorchScript string (a red team's: it scored 14/14, unflagged).
    _cu = torch.jit.CompilationUnit(\"\"\"
def w(q: Tensor, k: Tensor, e: Tensor, m: Optional[Tensor]):
    return torch.nn.functional.multi_head_attention_forward(q, k, k, q.shape[-1], 1, e, None, None, None, False, 0.0, e, None, False, attn_mask=m, need_weights=True, use_separate_proj_weight=False)
\"\"\")
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    T_q, T_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    qq = q.expand(*lead, T_q, d).reshape(-1, T_q, d).transpose(0, 1)
    kk = k.expand(*lead, T_k, d).reshape(-1, T_k, d).transpose(0, 1)
    eye = torch.eye(d, dtype=q.dtype)
    m = full = None
    if mask is not None:
        full = mask.expand(*lead, T_q, T_k)
        empty = ~full.any(-1, keepdim=True)
        m = (~(full | empty)).reshape(-1, T_q, T_k)
    _, weights = _cu.w(qq, kk, torch.cat([eye, eye, eye]), m)
    weights = weights.reshape(*lead, T_q, T_k)
    if full is not None:
        weights = weights.masked_fill(~full, 0.0)
    return weights @ v, weights
'''
TORCHSCRIPT = "it runs TorchScript (torch.jit) while the grader checks it"


def _sdpa_messages(result) -> str:
    return " ".join(c.message for c in result.cells if c.grade_id in SDPA_CELLS)


# --------------------------------------------------------------------------- graded for real
# Each attack: the exercise's source, what its SDPA cells' messages say, what the review says.
ATTACKS = {
    "a child process (subprocess)": (BY_SUBPROCESS, NO_PROCESSES, ("subprocess", "process")),
    "a name fetched by pickle": (BY_PICKLE, "unpickling", ("deserialises objects (pickle)",)),
    "a spawned child (multiprocessing)": (BY_SPAWN, NO_PROCESSES, ("process",)),
    "hooks switched off by a cell's unpickling": (BY_A_CELLS_PICKLE, HOOKS_OFF, ("deserialises objects (pickle)",)),
    "a thread started before the check": (BY_A_THREAD, SDPA_BUILTIN, ("thread",)),
    "PyTorch's multi-head attention, by a computed name": (BY_MULTI_HEAD_FORWARD, MULTI_HEAD_FORWARD, ("getattr",)),
    "PyTorch's multi-head attention, scripted (TorchScript)": (BY_TORCHSCRIPT, TORCHSCRIPT, ("torch.jit",)),
}


@pytest.mark.slow
@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_builtin_reached_another_way_gets_no_points_and_is_flagged(course, attack):
    source, message, review_words = ATTACKS[attack]
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"scaled_dot_product_attention": source}))
    assert result.status == "ok", result.status_text
    assert all(c.score == 0 for c in result.cells if c.grade_id in SDPA_CELLS), \
        [(c.grade_id, c.score, c.message[:300]) for c in result.cells]
    assert message in _sdpa_messages(result), _sdpa_messages(result)[:500]
    for word in review_words:
        assert word in result.review, result.review


@pytest.mark.slow
def test_the_honest_solution_still_scores_full_marks_unflagged(course):
    result = autograde(course, ASSIGNMENT, solved_notebook(course, ASSIGNMENT))
    assert result.status == "ok" and result.score == result.max_score == 14, (result.status_text, failed_cells(result))
    assert not result.review, result.review


# --------------------------------------------------------------------------- the runtime rule, case by case
@pytest.fixture()
def watch():
    """The runner installs the watch in the sandbox before any student code; here, in this process
    (once: an audit hook stays, but it acts only while run_case runs an implementation). The threads
    started meanwhile carry its dispatcher; the suite's later threads do not."""
    core.install_behaviour_watch()
    yield
    core.unwatch_thread_starts()


def _outcomes(impl) -> set[tuple]:
    """The distinct outcomes of nb02's scaled_dot_product_attention cases on `impl` (values elided)."""
    ex = nb02.check.exercises["scaled_dot_product_attention"]
    found = set()
    for case in core.cases_of(ex)[:2]:
        outcome = core.run_case(ex, case, impl)
        found.add(("value",) if outcome[0] == "value" else outcome[:2])
    return found


def _refused(outcomes: set[tuple], *words: str) -> bool:
    return len(outcomes) == 1 and all(o[0] == "forbidden" and all(w in o[1] for w in words) for o in outcomes)


def test_starting_a_process_during_a_check_is_refused(watch):
    def by_subprocess(q, k, v, mask=None):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        return _honest(q, k, v, mask)

    def by_system(q, k, v, mask=None):
        os.system("true")
        return _honest(q, k, v, mask)

    def swallowed(q, k, v, mask=None):  # tries, catches the refusal, then answers honestly: still refused
        try:
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        except Exception:  # noqa: BLE001
            pass
        return _honest(q, k, v, mask)

    for impl in (by_subprocess, by_system, swallowed):
        outcomes = _outcomes(impl)
        assert _refused(outcomes, NO_PROCESSES, "subprocess.Popen" if impl is not by_system else "os.system"), \
            (impl.__name__, outcomes)


FORKED_CHILD = """
import io, sys
import numpy as np, torch
import torch.nn.functional as F
data = np.load(io.BytesIO(sys.stdin.buffer.read()))
q, k, v = (torch.from_numpy(data[n]) for n in "qkv")
sys.stdout.buffer.write(F.scaled_dot_product_attention(q, k, v).numpy().tobytes())
"""


def test_forking_during_a_check_is_refused(watch):
    def by_fork(q, k, v, mask=None):
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()[::-1]
        pid = os.fork()
        if pid == 0:  # the child (only where the refusal failed): a fresh Python, which nothing watches
            try:
                os.dup2(to_child, 0)
                os.dup2(from_child, 1)
                os.execv(sys.executable, [sys.executable, "-c", FORKED_CHILD])
            finally:
                os._exit(127)
        os.close(to_child)
        os.close(from_child)
        buf = io.BytesIO()
        np.savez(buf, q=q.detach().numpy(), k=k.detach().numpy(), v=v.detach().numpy())
        with os.fdopen(from_parent, "wb") as fh:
            fh.write(buf.getvalue())
        with os.fdopen(to_parent, "rb") as fh:
            data = fh.read()
        os.waitpid(pid, 0)
        out = torch.frombuffer(bytearray(data), dtype=q.dtype).reshape(*q.shape[:-1], v.shape[-1])
        return out, _honest(q, k, v, mask)[1]

    assert _refused(_outcomes(by_fork), NO_PROCESSES, "os.fork")


def _child_sum(values, queue):  # module level: the spawn context imports it in the child
    queue.put(sum(values))


def test_multiprocessing_during_a_check_is_refused(watch):
    """The spawn start method starts its child through _posixsubprocess.fork_exec, which raises no
    audit event: the profile hook refuses that call."""
    def by_spawn(q, k, v, mask=None):
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_sum, args=([1, 2], queue))
        child.start()
        child.join(60)
        assert queue.get(timeout=60) == 3
        return _honest(q, k, v, mask)

    assert _refused(_outcomes(by_spawn), NO_PROCESSES)


def test_unpickling_during_a_check_is_refused(watch):
    def by_pickle(q, k, v, mask=None):
        attend = pickle.loads(b"ctorch.nn.functional\nscaled_dot_product_attention\n.")
        return attend(q, k, v, attn_mask=mask), _honest(q, k, v, mask)[1]

    def harmless_pickle(q, k, v, mask=None):  # any lookup by name is refused while a check runs
        pickle.loads(pickle.dumps(torch.nn.Linear))
        return _honest(q, k, v, mask)

    assert _refused(_outcomes(by_pickle), "torch.nn.functional.scaled_dot_product_attention", "unpickling")
    assert _refused(_outcomes(harmless_pickle), "torch.nn.modules.linear.Linear", "unpickling")


def test_pytorch_hooks_left_switched_off_before_a_check_are_refused(watch):
    """What a cell's unpickled payload can leave behind (BY_A_CELLS_PICKLE), here entered and left
    around the check: the guard refuses to run a case it could not watch."""
    def from_c(q, k, v, mask=None):
        return next(map(F.scaled_dot_product_attention, [q], [k], [v])), _honest(q, k, v, mask)[1]

    for switch in (torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch):
        with switch():
            assert _refused(_outcomes(from_c), HOOKS_OFF), switch
            assert _refused(_outcomes(_honest), HOOKS_OFF), switch
    assert _outcomes(_honest) == {("value",)}


def test_outside_a_check_processes_and_pickle_work_and_honest_code_passes(watch):
    assert _outcomes(_honest) == {("value",)}
    assert pickle.loads(pickle.dumps(torch.nn.Linear)) is torch.nn.Linear
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


# --------------------------------------------------------------------------- the static pass
def _reviews(source: str, head: str = HEAD) -> list:
    findings = scan([head, source], rules("02"))
    assert not [f for f in findings if f.severity == FORBIDDEN], findings
    return [f for f in findings if f.severity == REVIEW]


def test_starting_processes_is_flagged_for_review():
    spellings = {
        "subprocess": "import subprocess\ndef scaled_dot_product_attention(q, k, v, mask=None):\n"
                      "    subprocess.run(['python', '-c', 'pass'])\n    return q, k\n",
        "multiprocessing": "from multiprocessing import Pool\ndef scaled_dot_product_attention(q, k, v, mask=None):\n"
                           "    with Pool(1) as p:\n        return p.map(abs, [q])[0], k\n",
        "os.fork": "import os\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    os.fork()\n    return q, k\n",
        "os.system": "import os\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    os.system('true')\n"
                     "    return q, k\n",
        "os.execv": "import os\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    os.execv('x', ['x'])\n",
        "pty": "import pty\ndef scaled_dot_product_attention(q, k, v, mask=None):\n    pty.spawn(['x'])\n",
        "ProcessPoolExecutor": "from concurrent.futures import ProcessPoolExecutor\n"
                               "def scaled_dot_product_attention(q, k, v, mask=None):\n"
                               "    return ProcessPoolExecutor().submit(abs, q).result(), k\n",
    }
    for name, source in spellings.items():
        found = _reviews(source)
        assert any(("process" in f.reason or "another program" in f.reason) and f.exercises == ("scaled_dot_product_attention",) for f in found), \
            (name, found)


def test_deserialisers_are_flagged_for_review():
    spellings = {
        "pickle.loads": "import pickle\nDATA = b''\n",
        "pickle.Unpickler": "import io, pickle\nDATA = b''\n",
        "cloudpickle": "import cloudpickle as pickle\nDATA = b''\n",
        "dill": "import dill as pickle\nDATA = b''\n",
        "shelve": "import shelve\nDATA = b''\n",
    }
    uses = {"pickle.Unpickler": "pickle.Unpickler(io.BytesIO(DATA)).load()", "shelve": "shelve.open('x')['f']"}
    for name, head in spellings.items():
        use = uses.get(name, "pickle.loads(DATA)")
        source = f"{head}def scaled_dot_product_attention(q, k, v, mask=None):\n    return {use}(q, k, v), None\n"
        found = _reviews(source)
        assert any(f.exercises == ("scaled_dot_product_attention",) and f.line == 4 for f in found), (name, found)
    loaders = ["torch.load(path, weights_only=False)", "torch.load(path, weights_only=flag)",
               "joblib.load(path)", "yaml.unsafe_load(text)", "yaml.load(text, Loader=yaml.Loader)",
               "numpy.load(path, allow_pickle=True)", "jsonpickle.decode(text)"]
    for call in loaders:
        source = (f"import torch, joblib, yaml, numpy, jsonpickle\n"
                  f"def scaled_dot_product_attention(q, k, v, mask=None, path='', text='', flag=False):\n"
                  f"    return {call}(q, k, v), None\n")
        found = _reviews(source, head="")
        assert any(f.exercises == ("scaled_dot_product_attention",) and f.line == 3 for f in found), (call, found)


def test_a_thread_started_before_the_check_is_watched_as_the_checking_one(watch):
    """Threads the notebook starts carry the runner's dispatcher (threading.setprofile, before any student
    code): while a case runs, a forbidden call in any of them ends the case forbidden, even when the thread
    swallows the refusal; the thread stays watched for the next cases; honest work in a thread passes."""
    namespace = {}
    exec(BY_A_THREAD, namespace)
    outcomes = _outcomes(namespace["scaled_dot_product_attention"])
    assert _refused(outcomes, SDPA_BUILTIN), outcomes

    requests, answers = queue.Queue(), queue.Queue()

    def honest_worker():
        while True:
            answers.put(_honest(*requests.get()))

    threading.Thread(target=honest_worker, daemon=True).start()

    def by_honest_thread(q, k, v, mask=None):
        requests.put((q, k, v, mask))
        return answers.get()

    assert _outcomes(by_honest_thread) == {("value",)}


# --------------------------------------------------------------------------- PyTorch's other attention entries
def test_every_entry_to_pytorchs_attention_is_refused_while_an_exercise_is_checked(watch):
    namespace: dict = {}
    exec(compile(BY_MULTI_HEAD_FORWARD, "<answer>", "exec"), namespace)
    assert _refused(_outcomes(namespace["scaled_dot_product_attention"]), MULTI_HEAD_FORWARD)

    def by_the_layer(q, k, v, mask=None):  # nn.MultiheadAttention: its weights, one head
        layer = torch.nn.MultiheadAttention(q.shape[-1], 1, bias=False, batch_first=True)
        _, w = layer(q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:]))
        return w @ v, w

    assert _refused(_outcomes(by_the_layer), "it calls torch.nn.MultiheadAttention, PyTorch's own attention")


def test_a_decorated_helper_of_the_students_own_is_not_the_courses_reference():
    """contextlib's @contextmanager wrapper is one code object for every decorated function: the
    reference guard once banned it (the library's model has a context manager), and every model that
    entered a context manager of its own, or that PyTorch's function modes entered, was 'calling the
    course's reference implementation'."""
    from autograder.checks import nb06
    from autograder.checks.core import Mistake, check_exercise

    exercise = nb06.check.exercises["Seq2SeqTransformer"]
    forward = "        return self.decode(tgt, self.encode(src, src_mask), tgt_mask, src_mask)\n"
    own = ("import contextlib\n\n\n@contextlib.contextmanager\ndef _quietly():\n    yield\n\n\n"
           + nb06.MODEL_SOURCE.replace(forward, "        with _quietly():\n    " + forward, 1))
    assert own.count("with _quietly()") == 1
    impl = Mistake("a helper of its own", "", own).build("Seq2SeqTransformer", exercise.namespace)
    check_exercise(exercise, impl)  # raises CheckFailed when refused
    assert not any("contextlib" in code.co_filename for code, _ in core._CallGuard(exercise.forbidden).codes.values())


def test_torchscript_loaded_from_bytes_is_refused_while_an_exercise_is_checked(watch):
    """The red team's second spelling: the scripted function saved as an archive and pasted in as bytes,
    loaded with torch.jit.load: no source anywhere for the static pass; the call refuses at run time."""
    import io

    d = 4

    class Weights(torch.nn.Module):
        def forward(self, q, k):
            eye = torch.eye(q.shape[-1])
            return F.multi_head_attention_forward(q, k, k, q.shape[-1], 1, torch.cat([eye, eye, eye]), None, None,
                                                  None, False, 0.0, eye, None, False, need_weights=True)[1]

    blob = io.BytesIO()
    torch.jit.save(torch.jit.script(Weights()), blob)
    loaded = torch.jit.load(io.BytesIO(blob.getvalue()))

    def by_the_archive(q, k, v, mask=None):
        w = loaded(q.reshape(-1, *q.shape[-2:]).transpose(0, 1), k.reshape(-1, *k.shape[-2:]).transpose(0, 1))
        w = w.reshape(*q.shape[:-1], k.shape[-2])
        return w @ v, w

    assert _refused(_outcomes(by_the_archive), TORCHSCRIPT)
    assert loaded(torch.zeros(2, 1, d), torch.zeros(2, 1, d)).shape == (1, 2, 2)  # outside a check it runs


# --------------------------------------------------------------------------- threads without the watch
RAW_THREAD_STARTS = {
    "_thread.start_new_thread": lambda fn: __import__("_thread").start_new_thread(fn, ()),
    "its alias _thread.start_new": lambda fn: __import__("_thread").start_new(fn, ()),
    "threading's own copy": lambda fn: threading._start_new_thread(fn, ()),
    "found by a computed name": lambda fn: getattr(sys.modules["_th" + "read"], "start_new_" + "thread")(fn, ()),
    "a _thread module made afresh": lambda fn: _fresh_thread_module().start_new_thread(fn, ()),
}


def _fresh_thread_module():
    import _imp
    import types

    module = _imp.create_builtin(types.SimpleNamespace(name="_th" + "read"))
    _imp.exec_builtin(module)
    return module


def _in_a_thread(start):
    """nb02's exercise done by PyTorch's built-in in a thread `start` starts (the refusal swallowed, if any)."""
    def by_a_thread(q, k, v, mask=None):
        box, done = [], threading.Event()

        def work():
            try:
                box.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            finally:
                done.set()

        start(work)
        done.wait(5)
        w = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        return (box[0] if box else _honest(q, k, v, mask)[0]), w

    return by_a_thread


@pytest.mark.parametrize("start", list(RAW_THREAD_STARTS.values()), ids=list(RAW_THREAD_STARTS))
def test_a_raw_thread_is_watched_as_threadings_are(watch, start):
    """A raw thread carried no profile hook (Python 3.11 has no hook for every thread, and raises no audit event
    for a new one): F.scaled_dot_product_attention or label smoothing computed there took full points. Every
    thread now starts with the dispatcher as its first code, however it was started, so the case ends
    forbidden for what was called there."""
    assert _refused(_outcomes(_in_a_thread(start)), SDPA_BUILTIN), _outcomes(_in_a_thread(start))
    hooks = []
    done = threading.Event()
    start(lambda: (hooks.append(sys.getprofile()), done.set()))
    assert done.wait(5) and hooks == [core._thread_dispatch]


class _Subverted(threading.Thread):
    """A Thread whose own bootstrap runs run() without threading's hook (a reviewer's way round the check that
    only threading's bootstrap starts threads)."""

    def _bootstrap_inner(self):
        self._set_ident()
        self._set_tstate_lock()
        self._started.set()
        self.run()


class _AlwaysEqual:
    """A profile hook that says it is the grader's (==) and does nothing."""

    def __call__(self, *args):
        return None

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def test_threads_of_threading_start_watched_and_a_hook_taken_away_is_seen(watch):
    """threading.Thread and the executors built on it start as before (tqdm's monitor, a student's pool), watched;
    a Thread subclass with a bootstrap of its own is watched all the same; a thread handed another profile
    hook (threading's, replaced by one that claims to equal the grader's) never runs its work, and every
    later case ends forbidden."""
    done = threading.Event()
    threading.Thread(target=done.set).start()
    assert done.wait(5)
    with __import__("concurrent.futures").futures.ThreadPoolExecutor(2) as pool:
        assert pool.submit(sum, [1, 2]).result() == 3
    assert _refused(_outcomes(_in_a_thread(lambda fn: _Subverted(target=fn).start())), SDPA_BUILTIN)
    assert _outcomes(_honest) == {("value",)}
    ran = threading.Event()
    setattr(threading, "_profile" + "_hook", _AlwaysEqual())
    try:
        worker = threading.Thread(target=ran.set)
        worker.start()
        worker.join(5)
    finally:
        threading.setprofile(core._thread_dispatch)
    assert not ran.is_set()
    assert _refused(_outcomes(_honest), "takes the grader's check of the built-ins you call away from a thread")


@pytest.mark.parametrize("spelling", ["import _thread\n_thread.start_new_thread(print, ())\n",
                                      "from _thread import start_new as go\ngo(print, ())\n",
                                      "import threading\nthreading._start_new_thread(print, ())\n",
                                      "import logging\nlogging.threading._start_new_thread(print, ())\n",  # re-exported
                                      "import queue\nqueue.threading._start_new_thread(print, ())\n"])
def test_a_raw_thread_start_anywhere_is_forbidden(spelling):
    """Statically: anywhere in the notebook, like switching the profile hook off, for every exercise with
    built-ins to refuse; threading.Thread stays a matter for review."""
    found = scan([HEAD, spelling, HONEST_SDPA], rules("02"))
    assert any(f.severity == FORBIDDEN and "starts a thread with" in f.reason for f in found), found
    plain = scan([HEAD, "import threading\nthreading.Thread(target=print).start()\n", HONEST_SDPA], rules("02"))
    assert plain and all(f.severity == REVIEW for f in plain), plain


def test_taking_threadings_hook_away_during_a_check_is_seen(watch):
    """The hook threading hands new threads, set to None by a computed name during a case: the case ends
    forbidden (the guard puts the hook back as it leaves)."""
    def sly(q, k, v, mask=None):
        setattr(threading, "_profile" + "_hook", None)
        return _honest(q, k, v, mask)

    try:
        assert _refused(_outcomes(sly), "hook threading gives new threads"), _outcomes(sly)
    finally:
        threading.setprofile(core._thread_dispatch)


def test_threading_reached_through_another_module_and_the_import_machinery_are_flagged():
    """A module another one imports is read as itself (logging.threading.Thread is threading.Thread: it was no
    finding at all), and the interpreter's own import machinery (_imp) is left to a person."""
    for cell in ("import logging\nlogging.threading.Thread(target=print).start()\n",
                 "import _imp\nm = _imp.create_builtin(None)\n"):
        found = scan([HEAD, cell, HONEST_SDPA], rules("02"))
        assert found and all(f.severity == REVIEW for f in found), (cell, found)


@pytest.mark.parametrize("cell", [
    'from traitlets import import_item\nf = import_item("torch.nn.functional." + "scaled_dot_product_" + "attention")\n',
    'import traitlets\nf = traitlets.import_item("torch." + "softmax")\n',
    'from IPython.utils.importstring import import_item\nf = import_item("torch." + "softmax")\n',
    'import string\nf = string.Formatter().get_field("0.nn.functional", [__import__("torch")], {})\n',
    'import jinja2\nf = jinja2.Environment().getattr(__import__("torch"), "soft" + "max")\n',
], ids=["traitlets import_item", "traitlets module", "IPython import_item", "string.Formatter", "jinja2"])
def test_other_lookups_by_a_name_built_at_run_time_are_flagged(cell):
    """A red team named PyTorch's fused attention with traitlets' import_item, and the static pass said nothing;
    string formatting's field lookup and jinja2's getattr do the same. Each is left to a person, like
    pydoc.locate."""
    found = scan([HEAD, cell, HONEST_SDPA], rules("02"))
    assert found and all(f.severity == REVIEW for f in found), found
    assert any("looks up an object by a name built at run time" in f.reason for f in found), found


def _built_in_by_name():
    import pydoc

    return pydoc.locate("torch.nn.functional." + "_".join(["scaled", "dot", "product", "attention"]))


def _pair(fn, q, k, v, mask):
    eye = torch.eye(k.shape[-2], dtype=q.dtype).expand(*k.shape[:-1], k.shape[-2])
    return list(map(fn, [q, q], [k, k], [v, eye], [mask, mask]))  # called from C: no profile event


def _through_apply(q, k, v, mask=None):
    """The built-in from inside a Tensor.apply_ callback, where PyTorch runs it with the guard's function mode
    off, called from C (map), on 3-D inputs (the math path, whose kernels the dispatch mode does not name)."""
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2], *([] if mask is None else [mask.shape[:-2]]))
    flat = [t.expand(*batch, *t.shape[-2:]).reshape(-1, *t.shape[-2:]) for t in (q, k, v)]
    m3 = None if mask is None else mask.expand(*batch, q.shape[-2], k.shape[-2]).reshape(-1, q.shape[-2], k.shape[-2])
    box = []
    torch.zeros(1).apply_(lambda x: (box.extend(_pair(_built_in_by_name(), *flat, m3)), x)[1])
    o, w = box
    return o.reshape(*batch, q.shape[-2], v.shape[-1]), w.reshape(*batch, q.shape[-2], k.shape[-2])


def _in_a_worker(q, k, v, mask=None):
    import asyncio

    return tuple(asyncio.run(asyncio.to_thread(_pair, _built_in_by_name(), q, k, v, mask)))


def _after_a_profiler(q, k, v, mask=None):
    import asyncio
    import cProfile

    def work():
        cProfile.Profile().enable()  # the thread's profile function replaced from C: the grader's hook gone
        fn = _built_in_by_name()
        return fn(q, k, v, attn_mask=mask), _pair(fn, q, k, v, mask)[1]

    return tuple(asyncio.run(asyncio.to_thread(work)))


@pytest.mark.parametrize("impl, why", [(_through_apply, "Tensor.apply_"), (_in_a_worker, SDPA_BUILTIN),
                                       (_after_a_profiler, SDPA_BUILTIN)],
                         ids=["an apply_ callback", "map in a worker thread", "a profiler in a worker thread"])
def test_the_builtin_called_where_only_a_profile_hook_watched_is_refused(watch, impl, why):
    """A second red team's three ways to full marks, unflagged: a worker thread had the profile hook only (which
    sees no call made from C, and which cProfile replaces from C, unseen), and a Tensor.apply_ callback ran with
    the guard's PyTorch mode off. Every thread now has PyTorch modes of its own for whatever case is running, and
    callback methods are refused while an exercise with built-ins to refuse is checked."""
    assert _refused(_outcomes(impl), why), _outcomes(impl)
