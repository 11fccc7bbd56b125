"""Honesty judged by behaviour as well as spelling (issue 23, F6 and F8), graded for real in the
sandbox: notebook 02's scaled dot-product attention handed to another process that calls the
forbidden built-in (a `python -c` child, os.fork), or fetched by name through an unpickler. None
of them scores the exercise, each is flagged for review, and the honest notebook keeps full marks
with nothing flagged."""
from __future__ import annotations

import json

import pytest

from autograder.selfcheck import self_check

from .layout import SOLUTIONS

A02 = "02_queries_keys_values"
SDPA = "scaled_dot_product_attention"

# The child computes with the built-in and sends raw float32 bytes back (no pickle: only the process counts).
CHILD = '''import sys, torch, numpy as np
import torch.nn.functional as F
d = np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32)
n = int(d[0]); shapes = d[1:1 + 3 * n].astype(int).reshape(3, n); flat = d[1 + 3 * n:]
sizes = [int(np.prod(s)) for s in shapes]
q, k, v = (torch.from_numpy(flat[a:a + s].copy()).reshape(*sh) for a, s, sh in
           zip(np.cumsum([0] + sizes[:-1]), sizes, shapes))
out = F.scaled_dot_product_attention(q, k, v)
sys.stdout.buffer.write(out.numpy().astype(np.float32).tobytes())
'''

ATTACKS = {
    "subprocess": '''def scaled_dot_product_attention(q, k, v, mask=None):
    import subprocess, sys, numpy as np
    shapes = np.array([list(t.shape) for t in (q, k, v)], dtype=np.float32).ravel()
    data = np.concatenate([[q.dim()], shapes, *(t.detach().numpy().ravel() for t in (q, k, v))]).astype(np.float32)
    done = subprocess.run([sys.executable, "-c", CHILD], input=data.tobytes(), capture_output=True)
    out = torch.from_numpy(np.frombuffer(done.stdout, dtype=np.float32).copy()).reshape(*q.shape[:-1], v.shape[-1])
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return out, torch.nan_to_num(torch.softmax(scores, dim=-1))
''',
    "fork": '''def scaled_dot_product_attention(q, k, v, mask=None):
    import os, sys, numpy as np
    shapes = np.array([list(t.shape) for t in (q, k, v)], dtype=np.float32).ravel()
    data = np.concatenate([[q.dim()], shapes, *(t.detach().numpy().ravel() for t in (q, k, v))]).astype(np.float32)
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    if os.fork() == 0:
        os.dup2(r_in, 0)
        os.dup2(w_out, 1)
        os.execv(sys.executable, [sys.executable, "-c", CHILD])
    os.close(r_in)
    os.close(w_out)
    os.write(w_in, data.tobytes())
    os.close(w_in)
    raw = b"".join(iter(lambda: os.read(r_out, 1 << 16), b""))
    out = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).reshape(*q.shape[:-1], v.shape[-1])
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return out, torch.nan_to_num(torch.softmax(scores, dim=-1))
''',
    "unpickled-name": '''def scaled_dot_product_attention(q, k, v, mask=None):
    import pickle
    found = pickle.loads(bytes([99]) + b"torch.nn.functional" + bytes([10]) + b"softmax" + bytes([10, 46]))
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(found(scores, dim=-1))
    return weights @ v, weights
''',
}


def _notebook(tmp_path, code: str | None):
    nb = json.loads((SOLUTIONS / A02 / f"{A02}.ipynb").read_text())
    if code is not None:
        for cell in nb["cells"]:
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == SDPA:
                cell["source"] = f"#| export\nCHILD = {CHILD!r}\n" + code
    path = tmp_path / f"{A02}.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_the_honest_notebook_keeps_full_marks_and_nothing_is_flagged(tmp_path):
    result, verdicts = self_check(_notebook(tmp_path, None))
    assert result.score == result.max_score and not result.review, (result.status_text, result.review)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_work_done_elsewhere_scores_nothing_and_is_flagged(tmp_path, attack):
    result, verdicts = self_check(_notebook(tmp_path, ATTACKS[attack]))
    assert verdicts[SDPA] == "fail", (attack, verdicts)
    sdpa = [c for c in result.cells if c.exercise == SDPA]
    assert sdpa and all(c.score == 0 for c in sdpa), [(c.grade_id, c.score, c.message[:200]) for c in sdpa]
    messages = " ".join(c.message for c in sdpa)
    if attack == "unpickled-name":
        assert "unpickling" in messages, messages[:600]
        assert "deserialises" in result.review, result.review
    else:
        assert "starts another process" in messages, messages[:600]
        assert "process" in result.review, result.review
