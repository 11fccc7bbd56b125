"""The regularisers of issue 28 (R-Drop, source word dropout, BPE-dropout, the learning rate's
cool-down, the weights' moving average) and the wave launcher, on the toy corpus with a tiny model:
each flag's code path trains a few steps, and each has a check that a plausible wrong version fails.
Off by default, they leave every recipe as it was. No Multi30k, no GPU, no timing assertions."""
from __future__ import annotations

import contextlib
import json
import random
from dataclasses import fields, replace

import pytest
import torch

from attention_course import bpe, data
from attention_course import train as training
from attention_course import wave as waves
from attention_course.batching import segmentation_stream, step_stream
from attention_course.checkpoints import same_recipe
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import CONFIGS, TrainConfig, get_config

from .layout import REPO

NEW = {"rdrop_alpha": 0.0, "word_dropout": 0.0, "bpe_dropout": 0.0, "lr_cooldown": 0.0, "ema_decay": 0.0}
TINY = dict(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64, max_steps=4,
            eval_every=100, checkpoint_every=100, average_last=1, val_bleu_sentences=4, num_threads=1)
QUIET = dict(progress=False, log=lambda *a: None)


def tiny(**overrides) -> TrainConfig:
    return get_config("toy", **{**TINY, **overrides})


def _model(cfg: TrainConfig, vocab: int = 60, seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(cfg.model_config(vocab))


def _batch(vocab: int = 60, n: int = 4, s: int = 7, t: int = 6) -> training.Batch:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, vocab, (n, s), generator=g)
    tgt = torch.randint(4, vocab, (n, t + 1), generator=g)
    src[:, -1], tgt[:, 0] = bpe.EOS_ID, bpe.BOS_ID
    src[1, 4:], tgt[1, 3:] = bpe.PAD_ID, bpe.PAD_ID              # padding, in both
    return training.Batch(src, tgt, int((tgt[:, 1:] != bpe.PAD_ID).sum()))


# --------------------------------------------------------------------------- off by default
def test_every_recipe_leaves_them_off_and_bad_values_are_refused():
    for cfg in CONFIGS.values():
        assert {k: getattr(cfg, k) for k in NEW} == NEW, cfg.name
    for bad in (dict(rdrop_alpha=-1), dict(word_dropout=1.0), dict(bpe_dropout=-0.1), dict(lr_cooldown=1.5),
                dict(ema_decay=1.0), dict(bpe_dropout_samples=0), dict(lr_cooldown=0.1, max_steps=None)):
        with pytest.raises(ValueError):
            replace(CONFIGS["quick"], **bad)


def test_a_run_recorded_before_the_new_settings_is_the_same_recipe():
    cfg = CONFIGS["toy"]
    recorded = json.loads(json.dumps({f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in NEW}))
    assert same_recipe(recorded, cfg)
    assert not same_recipe(recorded, replace(cfg, rdrop_alpha=1.0))
    assert not same_recipe({**recorded, "dropout": 0.5}, cfg)


@pytest.mark.parametrize("flag", [dict(rdrop_alpha=1.0, dropout=0.1), dict(word_dropout=0.2),
                                  dict(bpe_dropout=0.2, bpe_dropout_samples=2), dict(lr_cooldown=0.5),
                                  dict(ema_decay=0.9)], ids=lambda f: next(iter(f)))
def test_each_flag_trains_a_few_steps(flag, tmp_path):
    run = training.train(tiny(**flag, eval_every=20), "en", "de", out_dir=tmp_path, **QUIET)
    assert run.summary["steps"] == TINY["max_steps"] and (tmp_path / "model.pt").is_file()
    losses = [h["train_loss"] for h in run.history if h.get("train_loss") is not None]
    assert losses and all(loss == loss and loss < 20 for loss in losses)          # finite
    recorded = json.loads((tmp_path / "config.json").read_text())["train"]
    assert all(recorded[k] == v for k, v in flag.items())


# --------------------------------------------------------------------------- R-Drop
def test_symmetric_kl_is_zero_for_equal_halves_and_ignores_padding():
    torch.manual_seed(0)
    half = torch.randn(2, 5, 11)
    target = torch.randint(4, 11, (2, 5))
    target[1, 3:] = bpe.PAD_ID
    assert training.symmetric_kl(torch.cat([half, half]), torch.cat([target, target]), bpe.PAD_ID) == 0
    other = torch.randn(2, 5, 11)
    kl = training.symmetric_kl(torch.cat([half, other]), torch.cat([target, target]), bpe.PAD_ID)
    p, q = half.log_softmax(-1), other.log_softmax(-1)
    both = (torch.nn.functional.kl_div(q, p, log_target=True, reduction="none").sum(-1)
            + torch.nn.functional.kl_div(p, q, log_target=True, reduction="none").sum(-1)) / 2   # [2, 5]
    keep = target != bpe.PAD_ID
    torch.testing.assert_close(kl, both[keep].mean())
    noisy = other.clone()
    noisy[1, 3:] += 100 * torch.randn(2, 11)                       # padded positions: never counted
    torch.testing.assert_close(training.symmetric_kl(torch.cat([half, noisy]), torch.cat([target, target]),
                                                     bpe.PAD_ID), kl)


def test_rdrop_kl_comes_from_two_dropout_masks():
    batch = _batch()
    for dropout, positive in ((0.0, False), (0.3, True)):
        cfg = tiny(rdrop_alpha=2.0, dropout=dropout)
        model = _model(cfg).train()
        losses = training.batch_loss(model, batch, cfg, contextlib.nullcontext())
        assert (losses.kl > 1e-4) if positive else (losses.kl.abs() < 1e-6), (dropout, losses.kl)
        torch.testing.assert_close(losses.loss, losses.ce + 2.0 * losses.kl)
    plain = training.batch_loss(_model(tiny()).train(), batch, tiny(), contextlib.nullcontext())
    assert plain.kl is None and plain.loss is plain.ce


# --------------------------------------------------------------------------- word dropout
def test_word_dropout_hides_ordinary_tokens_only():
    src = _batch().src
    src[0, 0] = bpe.UNK_ID
    every = training.drop_source_tokens(src, 0.999999)
    special = src < len(bpe.SPECIALS)
    assert torch.equal(every[special], src[special]) and (every[~special] == bpe.UNK_ID).all()
    assert training.drop_source_tokens(src, 0.0) is src
    torch.manual_seed(0)
    big = torch.randint(4, 100, (200, 100))
    rate = (training.drop_source_tokens(big, 0.3) == bpe.UNK_ID).float().mean().item()
    assert 0.27 < rate < 0.33
    assert not torch.equal(training.drop_source_tokens(big, 0.3), training.drop_source_tokens(big, 0.3)), \
        "a new draw for every batch"


def test_word_dropout_acts_in_training_steps_and_never_in_evaluation():
    batch, cfg = _batch(), tiny(word_dropout=0.999999)          # every ordinary source token hidden
    hidden = training.Batch(batch.src.masked_fill(batch.src >= len(bpe.SPECIALS), bpe.UNK_ID), batch.tgt,
                            batch.target_tokens)
    grads = []
    for b, c in ((batch, cfg), (hidden, tiny())):
        model = _model(c)
        training.batch_loss(model, b, c, contextlib.nullcontext()).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.allclose(a, b) for a, b in zip(*grads, strict=True))
    tok = bpe.train_joint_bpe(data.load_toy("train", "en", "de"), 300, 1)
    val = data.load_toy("val", "en", "de")
    val_batches = training.padded_batches(training.encode_pairs(tok, val), 600, torch.device("cpu"))
    model = _model(cfg, tok.get_vocab_size())
    assert training.validation_check(model, tok, val, val_batches, cfg) == \
        training.validation_check(model, tok, val, val_batches, tiny())


# --------------------------------------------------------------------------- BPE-dropout
def test_bpe_dropout_changes_training_segmentations_and_nothing_else():
    cpu = torch.device("cpu")
    plain = training.load_data(tiny(), "en", "de", None, cpu)
    dropped = training.load_data(tiny(bpe_dropout=0.3, bpe_dropout_samples=3), "en", "de", None, cpu)
    assert len(plain.segmentations) == 1 and len(dropped.segmentations) == 3
    assert dropped.tok.to_str() == plain.tok.to_str() and '"dropout":null' in dropped.tok.to_str().replace(" ", "")
    rows = lambda batches: sorted(tuple(r) for b in batches for r in b.src.tolist())
    tokens = [rows(seg) for seg in dropped.segmentations]
    assert tokens[0] != tokens[1] != tokens[2] and rows(plain.train_batches) not in tokens
    # each segmentation has more tokens than the deterministic one (merges skipped) and spells the same text
    count = lambda batches: sum(int((b.src != bpe.PAD_ID).sum()) for b in batches)
    assert all(count(seg) > count(plain.train_batches) for seg in dropped.segmentations)
    sources = sorted(s for s, _ in data.load_toy("train", "en", "de"))
    assert all(sorted(bpe.decode(plain.tok, [list(r) for r in seg])) == sources for seg in tokens)
    assert all(torch.equal(a.src, b.src) and torch.equal(a.tgt, b.tgt)
               for a, b in zip(plain.val_batches, dropped.val_batches, strict=True))
    text = "A little girl climbing into a wooden playhouse ."
    assert len({tuple(bpe.encode(dropped.tok, [text])[0]) for _ in range(10)}) == 1
    noisy = bpe.with_dropout(dropped.tok, 0.5)
    assert len({tuple(bpe.encode(noisy, [text])[0]) for _ in range(10)}) > 1
    assert {tuple(bpe.decode(noisy, bpe.encode(noisy, [text])))} == {(text,)}


def test_segmentations_are_taken_in_turn_and_one_is_the_old_stream():
    one = [[f"b{i}" for i in range(7)]]
    old = step_stream(7, 2, random.Random(3))
    new = segmentation_stream(one, 2, random.Random(3))
    for _ in range(12):
        epoch, chosen = next(old)
        assert next(new) == (epoch, [one[0][i] for i in chosen])
    several = [[f"s{k}b{i}" for i in range(4 + k)] for k in range(3)]
    stream = segmentation_stream(several, 2, random.Random(0))
    seen = [next(stream) for _ in range(14)]
    for epoch, batches in seen:
        k = int(epoch - 1e-9) % 3                                  # epoch e's steps end in (e, e + 1]
        assert len(batches) == 2 and all(b.startswith(f"s{k}b") for b in batches), (epoch, batches)
    assert {int(epoch - 1e-9) for epoch, _ in seen} >= {0, 1, 2, 3}


# --------------------------------------------------------------------------- cool-down
def test_cooldown_schedule():
    cfg = tiny(max_steps=10, warmup=2, lr_cooldown=0.5, max_seconds=100)
    base = lambda step: training.inverse_sqrt_lr(step, 2, cfg.peak_lr)
    assert training.scheduled_lr(replace(cfg, lr_cooldown=0.0), 7) == base(7)
    assert training.scheduled_lr(cfg, 5) == base(5)                        # the cool-down starts after half
    assert training.scheduled_lr(cfg, 8) == pytest.approx(base(8) * 0.4)
    assert training.scheduled_lr(cfg, 10) == 0.0
    assert training.scheduled_lr(cfg, 2, seconds=90) == pytest.approx(base(2) * 0.2)   # the clock leads
    assert training.scheduled_lr(cfg, 2, seconds=120) == 0.0


def test_cooldown_reaches_lr_zero_at_the_last_step(tmp_path):
    run = training.train(tiny(max_steps=6, warmup=2, lr_cooldown=0.5, eval_every=20), "en", "de", out_dir=tmp_path,
                         **QUIET)
    lrs = {h["step"]: h["lr"] for h in run.history if "val_loss" not in h}
    base = lambda step: training.inverse_sqrt_lr(step, 2, tiny().peak_lr)
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]
    assert lrs[6] == 0.0 and lrs[5] > 0
    assert lrs[3] == pytest.approx(base(3)) and lrs[4] == pytest.approx(base(4) * 2 / 3)


# --------------------------------------------------------------------------- weight EMA
def test_ema_weights_are_the_average_and_are_what_is_saved(tmp_path):
    steps, decay = 5, 0.7                        # not 0.5: d and 1 - d must differ
    raw = training.train(tiny(max_steps=steps, checkpoint_every=1, average_last=10), "en", "de",
                         out_dir=tmp_path / "raw", **QUIET)
    ema = training.train(tiny(max_steps=steps, ema_decay=decay), "en", "de", out_dir=tmp_path / "ema", **QUIET)
    curve = lambda run: [(h["step"], h["train_loss"]) for h in run.history if "val_loss" not in h]
    assert curve(ema) == curve(raw), "the average must not change training"
    assert "moving average" in ema.summary["weights"]
    init = _model(tiny(), raw.tokenizer.get_vocab_size(), seed=tiny().seed).state_dict()
    expected = {k: v.clone() for k, v in init.items()}
    for step in range(1, steps + 1):
        w = torch.load(tmp_path / "raw" / "checkpoints" / f"step_{step:07d}.pt", weights_only=True)["model"]
        expected = {k: decay * expected[k] + (1 - decay) * w[k] if w[k].is_floating_point() else w[k] for k in w}
    saved = torch.load(tmp_path / "ema" / "model.pt", weights_only=True)
    last_raw = torch.load(tmp_path / "raw" / "checkpoints" / f"step_{steps:07d}.pt", weights_only=True)["model"]
    assert saved.keys() == expected.keys()
    for k in saved:
        torch.testing.assert_close(saved[k], expected[k], rtol=1e-5, atol=1e-6, msg=k)
    assert any(not torch.allclose(saved[k], last_raw[k]) for k in saved if saved[k].is_floating_point())
    shown = ema.model.state_dict()
    assert all(torch.equal(shown[k], saved[k]) for k in saved), "the returned model is the saved one"


# --------------------------------------------------------------------------- the wave launcher
def test_the_wave1_definition_is_valid():
    wave = waves.load_wave(REPO / "course_tools" / "waves" / "wave1.toml")
    names = [r["name"] for r in wave.runs]
    assert len(names) == 8 and wave.recipe == "gpu" and wave.beam_size == 5 and wave.length_penalty == 1.0
    configs = {r["name"]: wave.config(r) for r in wave.runs}
    assert all(c.max_steps == 8000 for c in configs.values())
    assert configs["base-s1"].seed != configs["base-s2"].seed
    assert sum(c.rdrop_alpha > 0 for c in configs.values()) >= 2 and configs["bpe-drop"].bpe_dropout > 0
    assert configs["wdrop-cool"].word_dropout > 0 and configs["wdrop-cool"].lr_cooldown > 0
    assert configs["drop-ls0.2"].label_smoothing == 0.2
    base = CONFIGS["gpu"]
    assert replace(configs["base-s1"], max_steps=base.max_steps, max_seconds=base.max_seconds) == base


def test_a_bad_wave_file_fails_before_any_training(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('recipe = "toy"\n[[run]]\nname = "a"\nrdrop_alfa = 1.0\n')
    with pytest.raises(ValueError, match="rdrop_alfa"):
        waves.load_wave(path)
    path.write_text('recipe = "toy"\n[[run]]\nname = "a/b"\n')
    with pytest.raises(ValueError, match="names"):
        waves.load_wave(path)


def test_launcher_runs_two_trainings_at_once_and_writes_the_table(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text('name = "two"\nrecipe = "toy"\n[[run]]\nname = "plain"\n[[run]]\nname = "rdrop"\n'
                    'seed = 2\nrdrop_alpha = 1.0\ndropout = 0.1\n')
    lines = []
    table = waves.launch(waves.load_wave(path, smoke=True), tmp_path / "out", poll=2.0, log=lines.append)
    assert table["totals"]["finished"] == table["totals"]["runs"] == 2, json.dumps(table, indent=1)
    rows = {r["name"]: r for r in table["runs"]}
    assert rows["rdrop"]["changes"] == {"seed": 2, "rdrop_alpha": 1.0, "dropout": 0.1} and rows["plain"]["changes"] == {}
    for name, row in rows.items():
        folder = tmp_path / "out" / name
        summary = json.loads((folder / "run" / "summary.json").read_text())
        assert summary["steps"] == row["steps"] == waves.SMOKE["max_steps"]
        for split, n in (("val", 50), ("test", 50)):
            assert len((folder / f"{split}.en-de.de").read_text(encoding="utf-8").splitlines()) == n
        assert row["val"]["sentences"] == 50 and "case:mixed" in row["val"]["signature"]
        assert set(row["tests"]) == {"test"} and (folder / "run" / "model.fp16.pt").is_file()
    assert table["totals"]["process_seconds"] >= max(r["process_seconds"] for r in table["runs"])
    assert json.loads((tmp_path / "out" / "table.json").read_text()) == table
    md = (tmp_path / "out" / "table.md").read_text()
    assert "| rdrop | dropout=0.1, rdrop_alpha=1.0, seed=2 |" in md and "never chosen on" in md
    assert any("plain" in line and "done" in line for line in lines)


def test_a_run_stopped_or_failed_still_reports_what_it_did(tmp_path):
    """The table from the runs' files: a run stopped at the deadline while decoding keeps its validation
    score (what decides); a run that failed while training says so, with the end of its log."""
    wave = waves.Wave(name="w", recipe="toy", runs=[{"name": "late"}, {"name": "broken"}], test_sets=("test",))
    procs = {}
    for name in ("late", "broken"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "spec.json").write_text(json.dumps({"changes": {}}))
        (tmp_path / name / "train.log").write_text("line\nTraceback: boom\n")
        procs[name] = (None, tmp_path / name, 0.0)
    waves.write_result(tmp_path / "late", {"name": "late", "status": "decoding", "changes": {}, "seed": 1, "steps": 6,
                                           "train_seconds": 3.0, "tokens_per_second": 10, "val_bleu_greedy": 1.0,
                                           "device": "CPU", "tests": {}, "val": {"bleu": 2.0, "bleu_lc": 2.5}})
    ended = {"late": {"returncode": -15, "process_seconds": 9.0, "stopped": True},
             "broken": {"returncode": 1, "process_seconds": 2.0, "stopped": False}}
    rows = waves.table_rows(wave, procs, ended)
    assert [r["name"] for r in rows] == ["late", "broken"]
    assert rows[0]["status"] == "stopped at the wave's deadline while decoding" and rows[0]["val"]["bleu"] == 2.0
    assert rows[1]["status"] == "failed (exit 1) while training" and "Traceback: boom" in rows[1]["log_tail"]
    md = waves.markdown({"wave": "w", "recipe": "toy", "src": "en", "tgt": "de", "test_sets": ["test"], "decoding": "",
                         "runs": rows, "totals": {"wall_seconds": 9, "device": "CPU", "process_seconds": 11,
                                                  "train_seconds": 3}})
    assert "| 2.00 | 2.50 | - | - |" in md and "failed (exit 1) while training" in md
