"""The key/value-cached decoders (`attention_course.decoding`) give exactly the translations of
notebook 06's readable decoders (`attention_course.translate`), which recompute the prefix."""
from __future__ import annotations

import os

import pytest
import torch

from attention_course import bpe, checkpoints, data, decoding
from attention_course.model import Seq2SeqTransformer
from attention_course.train import collate, train
from attention_course.translate import beam_search, greedy_decode, make_masks, sample_decode

SPECIALS = (bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID)


@pytest.mark.parametrize("norm_first", [True, False])
def test_each_cached_step_gives_the_full_decoders_logits(norm_first):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(50, 50, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=3,
                               d_ff=64, dropout=0.3, share_embeddings=True, norm_first=norm_first).eval()
    src = torch.randint(4, 50, (3, 7))
    src[1, 5:] = bpe.PAD_ID                                                # a padded source
    tgt = torch.randint(4, 50, (3, 9))
    tgt[2, 4] = bpe.PAD_ID                                                 # a generated padding token
    src_mask, tgt_mask = make_masks(src, tgt, bpe.PAD_ID)
    with torch.no_grad():
        full = model.decode(tgt, model.encode(src, src_mask), tgt_mask, src_mask)   # [3, 9, V]
        cache = decoding.start_cache(model, src, src_mask, max_len=9, pad_id=bpe.PAD_ID)
        steps = torch.stack([decoding.decode_step(model, tgt[:, t], cache) for t in range(9)], dim=1)
    torch.testing.assert_close(steps, full, rtol=1e-5, atol=1e-5)
    assert cache.length == 9


def test_decode_step_refuses_training_mode():
    model = Seq2SeqTransformer(20, 20, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=32)
    src = torch.randint(4, 20, (1, 4))
    cache = decoding.start_cache(model.eval(), src, (src != bpe.PAD_ID)[:, None, None, :], 4)
    with pytest.raises(RuntimeError, match="eval"):
        decoding.decode_step(model.train(), src[:, 0], cache)


@pytest.fixture(scope="module")
def toy_model(tmp_path_factory):
    run = train("toy", "en", "de", out_dir=tmp_path_factory.mktemp("toy-decoding"), progress=False)
    pairs = data.load_pairs("toy", "test", "en", "de")
    src = collate(bpe.encode(run.tokenizer, [p[0] for p in pairs], bos=False, eos=True))
    return run.model.eval(), src


def test_cached_greedy_and_beam_equal_the_readable_decoders(toy_model):
    model, src = toy_model
    for max_len in (3, 25):                                                # cut short, and room to finish
        assert torch.equal(decoding.greedy_decode_cached(model, src, max_len, *SPECIALS),
                           greedy_decode(model, src, max_len, *SPECIALS))
        for k, lp in [(1, 1.0), (3, 0.6), (4, 1.0), (5, 0.0)]:
            assert torch.equal(decoding.beam_search_cached(model, src, k, max_len, *SPECIALS, length_penalty=lp),
                               beam_search(model, src, k, max_len, *SPECIALS, length_penalty=lp)), (max_len, k, lp)


def test_cached_sampling_draws_the_same_tokens(toy_model):
    model, src = toy_model
    for temperature, top_k in [(1.0, None), (1.5, 5)]:
        readable = sample_decode(model, src, 20, *SPECIALS, temperature=temperature, top_k=top_k,
                                 generator=torch.Generator().manual_seed(7))
        cached = decoding.sample_decode_cached(model, src, 20, *SPECIALS, temperature=temperature, top_k=top_k,
                                               generator=torch.Generator().manual_seed(7))
        assert torch.equal(cached, readable)


def test_beam_search_stops_early_and_drops_finished_sentences(toy_model, monkeypatch):
    """Exact early stopping: a trained model finishes well before max_len, and sentences that are done
    leave the batch, so the cached beam search runs far fewer row-steps than max_len x rows."""
    model, src = toy_model
    rows_per_step = []
    step = decoding.decode_step
    monkeypatch.setattr(decoding, "decode_step", lambda m, tok, c: rows_per_step.append(len(tok)) or step(m, tok, c))
    max_len = 60
    out = decoding.beam_search_cached(model, src, 4, max_len, *SPECIALS, length_penalty=1.0)
    assert out.size(1) < max_len // 2
    assert len(rows_per_step) < max_len                                    # stopped before max_len
    assert rows_per_step[-1] < rows_per_step[0]                            # finished sentences left
    assert torch.equal(out, beam_search(model, src, 4, max_len, *SPECIALS, length_penalty=1.0))


# --------------------------------------------------------------------------- ensembles
def _random_model(seed: int, vocab: int = 40) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(vocab, vocab, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                              d_ff=64, dropout=0.0, share_embeddings=True, norm_first=bool(seed % 2)).eval()


@torch.no_grad()
def _readable_ensemble_greedy(models, src, max_len):
    """Greedy decoding by the definition: recompute every member on the whole prefix, average the
    members' log-probabilities, take the best token."""
    bos, eos, pad = SPECIALS
    ys = torch.full((src.size(0), 1), bos, dtype=torch.long)
    finished = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len):
        src_mask, tgt_mask = make_masks(src, ys, pad)
        log_p = torch.stack([m.decode(ys, m.encode(src, src_mask), tgt_mask, src_mask)[:, -1].log_softmax(-1)
                             for m in models]).mean(0)
        token = log_p.argmax(-1).masked_fill(finished, pad)
        ys = torch.cat([ys, token[:, None]], dim=1)
        finished |= token == eos
        if finished.all():
            break
    return ys


def test_an_ensemble_of_one_decodes_as_its_model(toy_model):
    model, src = toy_model
    one = decoding.Ensemble([model]).eval()
    assert torch.equal(decoding.greedy_decode_cached(one, src, 25, *SPECIALS),
                       decoding.greedy_decode_cached(model, src, 25, *SPECIALS))
    assert torch.equal(decoding.beam_search_cached(one, src, 4, 25, *SPECIALS, length_penalty=1.0),
                       decoding.beam_search_cached(model, src, 4, 25, *SPECIALS, length_penalty=1.0))


def test_an_ensemble_decodes_with_the_mean_of_its_members_log_probabilities():
    models = [_random_model(seed) for seed in (1, 2, 3)]
    src = torch.randint(4, 40, (5, 9))
    src[2, 6:] = bpe.PAD_ID
    ensemble = decoding.Ensemble(models).eval()
    out = decoding.greedy_decode_cached(ensemble, src, 12, *SPECIALS)
    assert torch.equal(out, _readable_ensemble_greedy(models, src, 12))
    alone = [decoding.greedy_decode_cached(m, src, 12, *SPECIALS) for m in models]
    assert not all(torch.equal(out, a) for a in alone)          # the members disagree, and the mean decides


def test_an_ensemble_refuses_members_with_different_vocabularies():
    with pytest.raises(ValueError, match="different vocabularies"):
        decoding.Ensemble([_random_model(1, vocab=40), _random_model(2, vocab=50)])


def test_evaluate_ensemble_scores_seeds_as_one_and_refuses_a_different_tokenizer(tmp_path):
    from attention_course.evaluation import evaluate_ensemble

    quiet = dict(progress=False, log=lambda *a: None)
    runs = [train("toy", "en", "de", out_dir=tmp_path / f"seed{s}", seed=s, max_steps=40, **quiet).run_dir
            for s in (1, 2)]
    entries = evaluate_ensemble(runs, candidates=(0.6, 1.0), hypotheses_dir=tmp_path / "hyp", **quiet)
    (entry,) = entries
    assert entry["config"] == "toy-ensemble2" and len(entry["members"]) == 2
    assert entry["decoding"].startswith("beam 3, length penalty") and "(chosen on val)" in entry["decoding"]
    assert set(entry["val_bleu_by_length_penalty"]) == {"0.6", "1"}
    assert (tmp_path / "hyp" / "toy-ensemble2.en-de.test.de").read_text().count("\n") == len(
        data.load_pairs("toy", "test", "en", "de"))
    other = train("toy", "en", "de", out_dir=tmp_path / "other", vocab_size=200, max_steps=5, **quiet).run_dir
    with pytest.raises(ValueError, match="different tokenizer"):
        evaluate_ensemble([runs[0], other], **quiet)


# --------------------------------------------------------------------------- the shipped model
SHIPPED = "cpu-hour.en-de"


def test_shipped_model_loads_only_when_its_checksums_match(tmp_path):
    import shutil

    model, tok, info, summary, history = checkpoints.load_shipped(SHIPPED)
    assert summary["config"] == info["train"]["name"] == "cpu-hour" and not model.training
    assert sum(p.numel() for p in model.parameters()) == summary["parameters"]
    assert any("val_bleu" in h for h in history)
    copy = tmp_path / "models"
    shutil.copytree(checkpoints.MODELS, copy)
    weights = copy / SHIPPED / "model.fp16.pt"
    data_ = bytearray(weights.read_bytes())
    data_[-100] ^= 1                                                      # one flipped bit
    weights.write_bytes(bytes(data_))
    with pytest.raises(checkpoints.ShippedModelError, match="does not match its SHA-256"):
        checkpoints.load_shipped(SHIPPED, models=copy)
    weights.unlink()
    with pytest.raises(checkpoints.ShippedModelError, match="missing"):
        checkpoints.load_shipped(SHIPPED, models=copy)
    with pytest.raises(checkpoints.ShippedModelError, match="no checksum"):
        checkpoints.load_shipped("nonexistent.en-de", models=copy)


@pytest.mark.skipif(not os.environ.get(data.MIRROR_ENV), reason=f"{data.MIRROR_ENV} is not set: needs Multi30k's test set")
def test_cached_decoding_equals_readable_on_real_sentences_with_the_shipped_model():
    from attention_course.evaluation import translate_texts

    model, tok, *_ = checkpoints.load_shipped(SHIPPED)
    texts = [s for s, _ in data.load_multi30k("test_2016_flickr", "en", "de")[:100]]
    for beam in (1, 5):
        cached = translate_texts(model, tok, texts, beam_size=beam, length_penalty=1.2, cached=True)
        readable = translate_texts(model, tok, texts, beam_size=beam, length_penalty=1.2, cached=False)
        assert cached == readable, [(c, r) for c, r in zip(cached, readable, strict=True) if c != r][:3]
