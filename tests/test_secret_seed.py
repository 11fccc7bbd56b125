"""F10: the hidden inputs of a graded class are not computable from the public repository. Each
class (output folder) draws a secret salt on its first run, kept beside the gradebook (0600) so
a regrade draws the same inputs; ATTN_CHECK_SEED still fixes it (the suite sets the public one)."""
from __future__ import annotations

import stat

import numpy as np

from autograder import trusted
from autograder.checks.core import PUBLIC_SALT
from autograder.grade import SEED_FILE, checks_salted, grade

from .setups import notebook_variants


def _references(salt: str) -> list[np.ndarray]:
    """The reference outputs of notebook 01's softmax check on the cases drawn under `salt`."""
    ref = trusted.CheckRef("nb01", "softmax", "softmax")
    with checks_salted(salt):
        return [np.asarray(x, dtype=float) for x in _leaves(trusted.expected(ref))]


def _leaves(values) -> list:
    """Every array of the references, nested tuples flattened (a case that also returns its inputs' check)."""
    found = []
    for x in values:
        found += _leaves(x) if isinstance(x, (tuple, list)) else [x]
    return found


def test_another_salt_draws_other_inputs_and_their_own_references():
    public, secret = _references(PUBLIC_SALT), _references("a-secret-of-this-class")
    assert len(public) == len(secret) > 0
    assert not all(a.shape == b.shape and np.allclose(a, b) for a, b in zip(public, secret, strict=True))
    again = _references(PUBLIC_SALT)  # cached per salt, never across salts
    assert all(np.array_equal(a, b) for a, b in zip(public, again, strict=True))


def test_a_class_draws_a_secret_salt_once_and_keeps_it(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTN_CHECK_SEED", raising=False)
    notebook_variants(tmp_path / "submissions")
    out = tmp_path / "out"
    first = {r.student_id: r.score for r in grade(tmp_path / "submissions", out, progress=False, workers=1,
                                                  assignments=["01_similarity_attention"])}
    seed = out / SEED_FILE
    salt = seed.read_text().strip()
    assert len(salt) == 32 and salt != PUBLIC_SALT
    assert stat.S_IMODE(seed.stat().st_mode) == 0o600
    assert first["solved"] == 17 and first["blank"] == 0 and first["mistake"] < 17
    records = sorted((out / "students").rglob("*.json"))
    stamps = [p.stat().st_mtime_ns for p in records]
    again = {r.student_id: r.score for r in grade(tmp_path / "submissions", out, progress=False, workers=1,
                                                  assignments=["01_similarity_attention"])}
    assert again == first and seed.read_text().strip() == salt
    assert [p.stat().st_mtime_ns for p in records] == stamps, "the same salt: nothing regraded"
    assert salt not in "".join(p.read_text() for p in records), "a saved record never holds the secret"
