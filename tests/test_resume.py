"""Training resumes where it stopped (issue 25: a Colab runtime disconnects; the run folder lives on a
mounted drive). A run killed part-way and resumed ends with the same weights, history and step
count as one that never stopped, on the toy corpus with a tiny model (CPU, bit for bit). Without the
saved optimizer moments, generators or data position, the weights differ: each is checked."""
from __future__ import annotations

import json

import pytest
import torch

from attention_course import resume
from attention_course import train as training
from attention_course.recipes import get_config

TINY = dict(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_steps=12,
            eval_every=4, checkpoint_every=4, average_last=2, val_bleu_sentences=4, num_threads=1,
            word_dropout=0.1, ema_decay=0.5)
QUIET = dict(progress=False, log=lambda *a: None)


class Killed(RuntimeError):
    """Stands for the runtime going away mid-run."""


def tiny(**overrides):
    return get_config("toy", **{**TINY, **overrides})


def _killed_after(monkeypatch, steps: int) -> None:
    """train_step raises on its (steps+1)-th call: the run dies after `steps` steps."""
    real, calls = training.train_step, {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > steps:
            raise Killed(f"killed after {steps} steps")
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "train_step", dying)


def _weights(folder):
    return torch.load(folder / "model.pt", map_location="cpu", weights_only=True)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    training.train(tiny(), "en", "de", out_dir=out, **QUIET)
    return out


def _interrupted_then_resumed(monkeypatch, out, kill_after: int, **resume_kwargs):
    with monkeypatch.context() as m:
        _killed_after(m, kill_after)
        with pytest.raises(Killed):
            training.train(tiny(), "en", "de", out_dir=out, **QUIET)
    assert (out / resume.FILE).is_file() and not (out / "model.pt").exists()
    lines = []
    run = training.train(tiny(), "en", "de", out_dir=out, progress=False, log=lines.append, resume=True,
                         **resume_kwargs)
    return run, lines


def test_a_killed_run_resumed_ends_exactly_like_one_that_never_stopped(uninterrupted, tmp_path, monkeypatch):
    run, lines = _interrupted_then_resumed(monkeypatch, tmp_path, kill_after=6)   # dies between checkpoints 4 and 8
    assert any(line.startswith("resumed from step 4") for line in lines), lines
    assert _same(_weights(tmp_path), _weights(uninterrupted))
    whole, resumed = (json.loads((f / "history.json").read_text()) for f in (uninterrupted, tmp_path))
    drop = ("seconds",)
    assert [{k: v for k, v in h.items() if k not in drop} for h in resumed] == \
           [{k: v for k, v in h.items() if k not in drop} for h in whole]
    assert run.summary["steps"] == 12 and not (tmp_path / resume.FILE).exists()   # a finished run keeps none


@pytest.mark.parametrize("lost", ["optimizer", "rng", "stream"])
def test_resuming_without_each_saved_piece_would_change_the_weights(uninterrupted, tmp_path, monkeypatch, lost):
    """The test above can fail: drop one piece of the resume point and the weights come out different."""
    if lost == "optimizer":
        monkeypatch.setattr(training, "restore", _without_optimizer(training.restore))
    elif lost == "rng":
        monkeypatch.setattr(resume, "restore_rng", lambda point: None)
    else:
        monkeypatch.setattr(training, "replay", lambda stream, steps: None)   # the first batches again
    _interrupted_then_resumed(monkeypatch, tmp_path, kill_after=6)
    assert not _same(_weights(tmp_path), _weights(uninterrupted))


def _without_optimizer(restore):
    def wrong(point, model, opt, *rest):
        point = {**point, "optimizer": opt.state_dict()}   # fresh Adam moments
        return restore(point, model, opt, *rest)
    return wrong


def test_resume_of_another_recipe_is_refused_and_nothing_is_deleted(tmp_path, monkeypatch):
    with monkeypatch.context() as m:
        _killed_after(m, 5)
        with pytest.raises(Killed):
            training.train(tiny(), "en", "de", out_dir=tmp_path, **QUIET)
    before = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(resume.ResumeMismatch, match="d_model"):
        training.train(tiny(d_model=48), "en", "de", out_dir=tmp_path, resume=True, **QUIET)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == before
    assert (tmp_path / resume.FILE).is_file()


def test_train_or_load_resumes_by_default_and_runs_live_where_ATTN_RUNS_DIR_says(tmp_path, monkeypatch):
    """A runs folder on a mounted drive: $ATTN_RUNS_DIR; train_or_load picks the stopped run up."""
    monkeypatch.setenv(training.RUNS_ENV, str(tmp_path / "drive" / "runs"))
    cfg = tiny()
    folder = training.default_run_dir(cfg.name, "en", "de")
    assert folder.parent == tmp_path / "drive" / "runs"
    monkeypatch.setattr(training, "get_config", lambda config, **kw: cfg)
    with monkeypatch.context() as m:
        _killed_after(m, 9)
        with pytest.raises(Killed):
            training.train_or_load("toy", "en", "de", progress=False, log=lambda *a: None)
    lines = []
    run = training.train_or_load("toy", "en", "de", progress=False, log=lines.append)
    assert any(line.startswith("resumed from step 8") for line in lines), lines
    assert run.summary["steps"] == 12 and (folder / "model.pt").is_file()


def test_the_command_line_resumes_and_refuses_another_recipe_with_a_clear_error(tmp_path, monkeypatch, capsys):
    from course_tools.cli import main

    sets = [a for k, v in TINY.items() if k != "num_threads" for a in ("--set", f"{k}={v}")]
    command = ["train", "--config", "toy", "--out", str(tmp_path), "--no-progress", "--threads", "1", *sets]
    with monkeypatch.context() as m:
        _killed_after(m, 5)
        with pytest.raises(Killed):
            main(command)
    assert main([*command, "--set", "d_model=48", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume:" in err and "d_model" in err and "same recipe" in err
    assert main([*command, "--resume"]) == 0
    assert "resumed from step 4" in capsys.readouterr().out and (tmp_path / "model.pt").is_file()
