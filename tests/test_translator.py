"""The translator library: tokenizer, model (fused attention == the course's readable attention),
batching, checkpoint averaging, a short end-to-end training run on the toy corpus with evaluation,
and the committed results file."""
from __future__ import annotations

import json
import os

import pytest
import torch

from attention_course import bpe, data, translate
from attention_course import train as training
from attention_course.model import FusedMultiHeadAttention, Seq2SeqTransformer, readable_attention, set_fused
from attention_course.multihead import MultiHeadAttention
from attention_course.results import table

MIRROR = os.environ.get(data.MIRROR_ENV)


# --------------------------------------------------------------------------- tokenizer
@pytest.fixture(scope="module")
def toy_tokenizer():
    return bpe.train_joint_bpe(data.load_toy("train", "en", "de"), vocab_size=300, min_frequency=1)


def test_bpe_round_trip_and_specials(toy_tokenizer, tmp_path):
    tok = toy_tokenizer
    assert [tok.token_to_id(s) for s in bpe.SPECIALS] == [0, 1, 2, 3]
    for split in data.TOY_SPLITS:
        for lang in ("en", "de", "fr"):
            texts = [s for s, _ in data.load_toy(split, lang, "en" if lang != "en" else "de")]
            ids = bpe.encode(tok, texts, bos=True, eos=True)
            assert all(row[0] == bpe.BOS_ID and row[-1] == bpe.EOS_ID for row in ids)
            if lang != "fr":   # French was not in the training text: unknown characters may become <unk>
                assert bpe.decode(tok, ids) == texts
    bpe.save(tok, tmp_path)
    again = bpe.load(tmp_path)
    assert again.encode("Ein kleiner Hund läuft.").ids == tok.encode("Ein kleiner Hund läuft.").ids


def test_bpe_decode_stops_at_eos(toy_tokenizer):
    ids = bpe.encode(toy_tokenizer, ["A dog runs."], bos=True)[0]
    assert bpe.decode(toy_tokenizer, [ids + [5, 6, 0, 0]]) == ["A dog runs."]


@pytest.mark.skipif(not MIRROR, reason="ATTN_MULTI30K_MIRROR is not set: needs the real Multi30k training split")
def test_bpe_on_multi30k_round_trips_exactly():
    pairs = data.load_multi30k("train", "en", "de")
    tok = bpe.train_joint_bpe(pairs, vocab_size=3000)
    sample = [t for pair in pairs[:3000] for t in pair]
    assert bpe.decode(tok, bpe.encode(tok, sample, bos=True)) == sample


# --------------------------------------------------------------------------- model
def _batch(V=50, B=3, S=7, T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (B, S), generator=g)
    tgt = torch.randint(4, V, (B, T), generator=g)
    src[1, 4:] = 0
    src[2, 2:] = 0
    tgt[1, 3:] = 0
    return src, tgt


def test_fused_attention_equals_the_course_attention():
    torch.manual_seed(0)
    readable = MultiHeadAttention(24, 4)
    fused = MultiHeadAttention(24, 4)
    fused.load_state_dict(readable.state_dict())
    set_fused(fused, True)
    assert isinstance(fused, FusedMultiHeadAttention)
    q, kv = torch.randn(2, 5, 24), torch.randn(2, 7, 24)
    mask = torch.rand(2, 1, 5, 7) < 0.6
    mask[1, 0, 2] = False                                       # a query with no allowed key: zero output
    out_r, w = readable(q, kv, kv, mask=mask)
    out_f, none = fused(q, kv, kv, mask=mask)
    assert none is None and w.shape == (2, 4, 5, 7)
    torch.testing.assert_close(out_f, out_r, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_f[1, 2], readable.out_proj.bias, msg="empty row: zero attention, bias only")


def test_fused_model_equals_readable_model_forward_and_backward():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(50, 50, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                               d_ff=64, dropout=0.0, share_embeddings=True, norm_first=False, fused=True)
    src, tgt = _batch()
    src_mask, tgt_mask = translate.make_masks(src, tgt, 0)
    out_f = model(src, tgt, src_mask, tgt_mask)
    out_f.square().mean().backward()
    grads_f = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with readable_attention(model):
        out_r = model(src, tgt, src_mask, tgt_mask)
        out_r.square().mean().backward()
        assert model.cross_attention()[0].shape == (3, 4, 6, 7), "the readable path keeps the weights"
    torch.testing.assert_close(out_f, out_r, rtol=1e-5, atol=1e-5)
    for gf, p in zip(grads_f, model.parameters(), strict=True):
        torch.testing.assert_close(gf, p.grad, rtol=1e-4, atol=1e-6)
    assert all(m.fused for m in model.modules() if isinstance(m, MultiHeadAttention)), "fused again after the block"


def test_model_interface_and_shared_embeddings():
    shared = Seq2SeqTransformer(60, 60, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                d_ff=32, share_embeddings=True, norm_first=True)
    separate = Seq2SeqTransformer(60, 60, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                                  d_ff=32, share_embeddings=False, norm_first=True)
    assert shared.src_embed.weight is shared.tgt_embed.weight is shared.generator.weight
    n = lambda m: sum(p.numel() for p in m.parameters())
    assert n(separate) - n(shared) == 2 * 60 * 16
    src, tgt = _batch(V=60)
    src_mask, tgt_mask = translate.make_masks(src, tgt, 0)
    memory = shared.encode(src, src_mask)
    assert memory.shape == (3, 7, 16)
    assert shared.decode(tgt, memory, tgt_mask, src_mask).shape == (3, 6, 60)
    with pytest.raises(ValueError, match="joint vocabulary"):
        Seq2SeqTransformer(60, 70, share_embeddings=True)


def test_decoding_is_causal_and_ignores_source_padding():
    torch.manual_seed(1)
    model = Seq2SeqTransformer(40, 40, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
                               d_ff=32, dropout=0.0).eval()
    src, tgt = _batch(V=40)
    src_mask, tgt_mask = translate.make_masks(src, tgt, 0)
    logits = model(src, tgt, src_mask, tgt_mask)
    changed_future = tgt.clone()
    changed_future[:, 4:] = 7
    _, tgt_mask2 = translate.make_masks(src, changed_future, 0)
    logits2 = model(src, changed_future, src_mask, tgt_mask2)
    torch.testing.assert_close(logits[:, :4], logits2[:, :4], rtol=1e-5, atol=1e-5)
    longer = torch.cat([src, torch.zeros(3, 3, dtype=torch.long)], 1)   # more padding changes nothing
    longer_mask, _ = translate.make_masks(longer, tgt, 0)
    torch.testing.assert_close(model(longer, tgt, longer_mask, tgt_mask), logits, rtol=1e-5, atol=1e-5)


def test_decoding_speedup_returns_the_last_position_only():
    torch.manual_seed(2)
    model = Seq2SeqTransformer(40, 40, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                               d_ff=32, dropout=0.0).eval()
    src, tgt = _batch(V=40)
    src_mask, tgt_mask = translate.make_masks(src, tgt, 0)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, tgt_mask, src_mask)
    with model.decoding_speedup():
        last = model.decode(tgt, memory, tgt_mask, src_mask)
    assert last.shape == (3, 1, 40) and not model.last_position_only
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- training pieces
def test_library_uses_the_notebook_functions():
    from attention_course import decoding, evaluation

    for name in ("make_masks", "label_smoothed_cross_entropy", "inverse_sqrt_lr"):
        assert getattr(training, name) is getattr(translate, name)
    for name in ("greedy_decode", "beam_search", "make_masks", "label_smoothed_cross_entropy"):
        assert getattr(evaluation, name) is getattr(translate, name)     # the readable decoders, cached=False
    assert decoding.sample_next_token is translate.sample_next_token
    assert translate.__file__.endswith("translate.py")
    assert open(translate.__file__).readline().startswith("# GENERATED by `attn-course build` from solutions/06")


def test_token_batches_cover_everything_within_budget():
    import random

    rows = [([5] * random.Random(i).randint(1, 30), [1] + [6] * random.Random(-i).randint(1, 30)) for i in range(500)]
    batches = training.token_batches(rows, max_tokens=200, shuffle=True, rng=random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(max(len(rows[i][0]), len(rows[i][1])) for i in b) <= 200


def test_checkpoint_averaging(tmp_path):
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    for i, m in enumerate((a, b)):
        torch.save({"model": m.state_dict(), "step": i}, tmp_path / f"step_{i:07d}.pt")
    avg = training.average_state_dicts(sorted(tmp_path.glob("*.pt")))
    torch.testing.assert_close(avg["weight"], (a.weight + b.weight).detach() / 2)


def test_configs_are_complete():
    assert {"gpu", "cpu", "quick", "toy"} <= set(training.CONFIGS)
    gpu = training.CONFIGS["gpu"]
    assert gpu.bf16 and gpu.fused and gpu.average_last > 1 and gpu.beam_size > 1 and gpu.share_embeddings
    quick = training.CONFIGS["quick"]  # a fixed number of steps: what CI learns does not depend on machine speed
    assert quick.max_seconds is None and quick.max_steps <= 400 and training.CONFIGS["cpu"].max_seconds <= 25 * 60
    assert training.get_config("auto").name == ("gpu" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown configuration"):
        training.get_config("huge")


# --------------------------------------------------------------------------- end to end (toy corpus)
@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy-run")
    return training.train("toy", "en", "de", out_dir=out, progress=False, log=lambda *a: None)


def test_toy_training_learns_and_writes_a_run(toy_run):
    run = toy_run
    for name in ("tokenizer.json", "model.pt", "config.json", "history.json", "summary.json"):
        assert (run.run_dir / name).is_file(), name
    evals = run.evaluations
    assert evals[0]["val_loss"] > evals[-1]["val_loss"]
    assert len(run.history) > len(evals), "training-curve points between the evaluations"
    assert run.summary["val_bleu_greedy"] > 80, run.summary
    # model.pt holds the weights the summary names, and they score the validation BLEU it reports
    checkpoints = sorted((run.run_dir / "checkpoints").glob("step_*.pt"))
    expected = (training.average_state_dicts(checkpoints) if run.summary["weights"].startswith("average of the last")
                else torch.load(checkpoints[-1], weights_only=True)["model"])
    saved = torch.load(run.run_dir / "model.pt", weights_only=True)
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    model, tok, _ = training.load_run(run.run_dir)
    val = data.load_toy("val", "en", "de")[:run.summary["val_bleu_sentences"]]
    score, _ = training.bleu(training.translate_texts(model, tok, [s for s, _ in val]), [t for _, t in val])
    assert score == pytest.approx(run.summary["val_bleu_greedy"], abs=0.01)
    assert len(list((run.run_dir / "checkpoints").glob("step_*.pt"))) == training.CONFIGS["toy"].average_last
    assert training.run_is_complete(run.run_dir, training.CONFIGS["toy"], "en", "de")
    loaded = training.train_or_load("toy", "en", "de", out_dir=run.run_dir)
    assert loaded.summary == run.summary, "a finished run is loaded, not retrained"


def test_toy_decoders_agree(toy_run):
    model, tok = toy_run.model, toy_run.tokenizer
    texts = [s for s, _ in data.load_toy("test", "en", "de")[:8]]
    src = training.collate(bpe.encode(tok, texts))
    greedy = translate.greedy_decode(model, src, 30, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID)
    assert torch.equal(translate.beam_search(model, src, 1, 30, bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID), greedy)
    beam = training.translate_texts(model, tok, texts, beam_size=3)
    assert beam == [t for _, t in data.load_toy("test", "en", "de")[:8]]


def test_toy_evaluation_and_results_table(toy_run, tmp_path):
    entries = training.evaluate(toy_run.run_dir, hypotheses_dir=tmp_path, progress=False, log=lambda *a: None)
    (entry,) = entries
    assert entry["test_set"] == "test" and entry["bleu"] > 80 and entry["bleu_lc"] >= entry["bleu"] - 1e-9
    assert "case:mixed" in entry["signature"] and "case:lc" in entry["signature_lc"]
    assert len((tmp_path / "toy.en-de.test.de").read_text().splitlines()) == 50
    results = training.record(entries, tmp_path / "translator.json")
    assert "| `toy` | en→de | test |" in table(results)


# --------------------------------------------------------------------------- the committed results
REQUIRED = {"src", "tgt", "test_set", "bleu", "bleu_lc", "signature", "device", "train_seconds",
            "tokens_per_second", "config", "commit", "hypotheses"}


def test_committed_results_file(repo):
    path = repo / "results" / "translator.json"
    runs = json.loads(path.read_text())
    assert isinstance(runs, list) and runs
    for r in runs:
        assert REQUIRED <= set(r), REQUIRED - set(r)
        hyp = repo / r["hypotheses"]
        assert hyp.is_file(), f"{r['hypotheses']} is not committed"
        assert "nrefs:1|case:mixed" in r["signature"] and "tok:13a" in r["signature"]
        if MIRROR:   # anyone can re-score the committed output
            refs = [t for _, t in data.load_multi30k(r["test_set"], r["src"], r["tgt"])]
            hyps = hyp.read_text(encoding="utf-8").splitlines()
            assert len(hyps) == len(refs)
            assert training.bleu(hyps, refs)[0] == pytest.approx(r["bleu"], abs=0.01)
            assert training.bleu(hyps, refs, lowercase=True)[0] == pytest.approx(r["bleu_lc"], abs=0.01)
    assert "| BLEU -lc |" in table(path)


def test_gpu_recipe_runs_end_to_end_on_cpu(tmp_path):
    """The `gpu` recipe (Transformer-Tiny: 4+4 pre-norm layers, checkpoint averaging, beam 5) for a few steps on the toy
    corpus: a GPU session's first full run must not be the first time this path executes."""
    lines = []
    run = training.train("gpu", "en", "de", out_dir=tmp_path, progress=False, log=lines.append, corpus="toy",
                         vocab_size=300, min_frequency=1, max_tokens=600, max_steps=6, max_seconds=None,
                         checkpoint_every=2, eval_every=3, val_bleu_sentences=4)
    gpu = training.CONFIGS["gpu"]
    assert run.summary["steps"] == 6 and (tmp_path / "model.pt").is_file()
    assert json.loads((tmp_path / "config.json").read_text())["model"]["num_encoder_layers"] == gpu.num_encoder_layers
    assert any("averaged the last 3 checkpoints" in line for line in lines), lines
    hyps = training.translate_texts(run.model, run.tokenizer, ["a dog runs ."], beam_size=gpu.beam_size,
                                    length_penalty=gpu.length_penalty)
    assert len(hyps) == 1 and isinstance(hyps[0], str)
