"""`attn-course bench-peer` (issue 28, item 4): the course's translator against Hugging Face models of
the same size, trained by the same loop on the same batches. On the toy corpus with tiny models: the
peer is the recipe's size, it is fed as its own library would feed it, its translations are its own
greedy search, and the whole comparison runs end to end through the command line. No Multi30k, no GPU,
no timing assertions (speeds are reported, never compared with a number)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from attention_course import bpe, data
from attention_course.batching import collate
from attention_course.model import Seq2SeqTransformer
from attention_course.recipes import get_config
from attention_course.translate import label_smoothed_cross_entropy
from course_tools import bench_peer
from course_tools.cli import main as cli

from .layout import REPO

TINY = dict(d_model=32, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, num_threads=1)


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("peer", sorted(bench_peer.PEERS))
def test_the_peer_is_the_recipes_model_in_size(peer):
    """The `gpu` recipe's sizes (d 128, 4+4 layers, ffn 256, 4 heads, shared embeddings): the same
    trainable parameters as ours but for two known differences: ours learns a bias on the output layer
    (one per vocabulary entry; the peers have none, or a fixed one), and a pre-norm stack ends with a
    LayerNorm, which post-norm Marian has not."""
    cfg = get_config("gpu")
    ours = Seq2SeqTransformer(cfg.model_config(10000))
    theirs = bench_peer.PeerTranslator(peer, cfg, 10000)
    hf = theirs.hf.config
    assert (hf.d_model, hf.encoder_layers, hf.decoder_layers, hf.encoder_ffn_dim, hf.encoder_attention_heads) == \
        (128, 4, 4, 256, 4)
    assert (hf.dropout, hf.attention_dropout, hf.activation_dropout, hf.activation_function) == (0.3, 0.0, 0.0, "relu")
    final_norms = 2 * (2 * 128) if peer == "marian" else 0          # encoder's and decoder's: weight and bias
    assert _trainable(ours) - _trainable(theirs) == 10000 + final_norms, (_trainable(ours), _trainable(theirs))
    assert theirs.hf.get_input_embeddings().weight is theirs.hf.get_output_embeddings().weight   # tied, as ours


def test_the_course_initialisation_is_drawn_as_the_course_model_draws_it():
    """--peer-init course: the peer's matrices Xavier-uniform and its shared embedding N(0, 1/d), the
    statistics of ours; the library's own draw (N(0, 0.02^2)) is not, and an unknown name is refused."""
    cfg = get_config("gpu")
    torch.manual_seed(0)
    ours = Seq2SeqTransformer(cfg.model_config(10000))
    course = bench_peer.PeerTranslator("marian", cfg, 10000, init="course").hf
    library = bench_peer.PeerTranslator("marian", cfg, 10000).hf
    q = "model.encoder.layers.0.self_attn.q_proj.weight"
    ours_q = next(p for n, p in ours.named_parameters() if n.endswith("weight") and p.shape == (128, 128))
    ours_ff = next(p for n, p in ours.named_parameters() if n.endswith("weight") and p.shape == (256, 128))
    for model, same in ((course, True), (library, False)):
        params = dict(model.named_parameters())
        pairs = [(params[q], ours_q), (params["model.encoder.layers.0.fc1.weight"], ours_ff),
                 (model.get_input_embeddings().weight, ours.src_embed.weight)]
        close = [abs(float(a.detach().std()) / float(b.detach().std()) - 1) < 0.1 for a, b in pairs]
        assert close == [same] * 3, (same, [(float(a.std()), float(b.std())) for a, b in pairs])
    assert course.get_input_embeddings().weight is course.get_output_embeddings().weight    # still tied
    with pytest.raises(ValueError, match="unknown initialisation 'zeros'"):
        bench_peer.PeerTranslator("marian", cfg, 100, init="zeros")


@pytest.mark.parametrize("peer", sorted(bench_peer.PEERS))
def test_the_peer_is_fed_as_its_own_library_feeds_it(peer):
    """Our loss through `PeerTranslator` (the course's <bos>-first target, ours shifted) equals the peer's
    own loss given only the labels (it shifts them itself, from its decoder start token); a target fed
    unshifted, or a wrong start token, gives another number."""
    cfg = get_config("toy", **TINY, dropout=0.0)
    tok = bpe.train_joint_bpe(data.load_toy("train", "en", "de"), 200, 1)
    pairs = data.load_toy("val", "en", "de")[:6]
    src = collate(bpe.encode(tok, [p[0] for p in pairs], eos=True))                     # [N, S]
    tgt = collate(bpe.encode(tok, [p[1] for p in pairs], bos=True, eos=True))           # [N, T + 1]
    torch.manual_seed(0)
    model = bench_peer.PeerTranslator(peer, cfg, tok.get_vocab_size()).eval()
    ours = label_smoothed_cross_entropy(model(src, tgt[:, :-1]).float(), tgt[:, 1:], 0.0, bpe.PAD_ID)
    labels = tgt[:, 1:].masked_fill(tgt[:, 1:] == bpe.PAD_ID, -100)
    theirs = model.hf(input_ids=src, attention_mask=(src != bpe.PAD_ID).long(), labels=labels).loss
    assert torch.allclose(ours, theirs, atol=1e-5), (float(ours), float(theirs))
    unshifted = label_smoothed_cross_entropy(model(src, tgt[:, 1:]).float(), tgt[:, 1:], 0.0, bpe.PAD_ID)
    assert not torch.allclose(unshifted, theirs, atol=1e-3)


def test_the_peers_translations_are_its_own_greedy_search():
    """`translate` (the peer's `generate`, batched by length) gives exactly the argmax-at-every-step
    translations of its forward pass, stopped at <eos>; after a little training, real words."""
    cfg = get_config("toy", **TINY, dropout=0.0, max_steps=40)
    data_ = bench_peer.load_data(cfg, "en", "de", None, torch.device("cpu"))
    contender, outcome = bench_peer.train_contender(bench_peer.contenders("marian", cfg, data_.tok, torch.device("cpu"))[1],
                                                    cfg, data_, torch.device("cpu"), thresholds=(), log=lambda *a: None)
    model, tok = contender.model.eval(), data_.tok
    texts = [s for s, _ in data_.val_pairs[:7]]
    expected = []
    with torch.no_grad():
        for ids in bpe.encode(tok, texts, eos=True):
            src = torch.tensor([ids])
            ys = [bpe.BOS_ID]
            for _ in range(int(len(ids) * 1.2) + 10):
                ys.append(int(model(src, torch.tensor([ys]))[0, -1].argmax()))
                if ys[-1] == bpe.EOS_ID:
                    break
            expected.append(bpe.decode(tok, [ys])[0])
    got = model.translate(tok, texts, beam_size=1, max_tokens=40)   # a small budget: several batches
    assert got == expected
    assert any(len(t.split()) >= 2 for t in got)


def test_bench_peer_trains_both_on_the_same_batches_and_reports_them(tmp_path, capsys):
    """The command end to end on the toy corpus: both models take the same steps over the same target
    tokens, both learn (ours past a validation BLEU the untrained model cannot have), each is scored on
    the test set greedy and with its beam, and the report, its table and the hypotheses are written."""
    out = tmp_path / "peer"
    status = cli(["bench-peer", "--config", "toy", "--peer", "marian", "--max-steps", "60", "--eval-every", "20",
                  "--threshold", "5", "--threshold", "99.5", "--threads", "1", "--out", str(out),
                  "--set", "d_model=32", "--set", "d_ff=64", "--set", "num_heads=2"])
    assert status == 0
    result = json.loads((out / "peer.json").read_text())
    ours, peer = result["models"]
    assert (ours["name"], peer["name"]) == ("ours", "marian")
    assert ours["steps"] == peer["steps"] == 60
    assert ours["target_tokens"] == peer["target_tokens"] > 0                # the same batches
    assert ours["seconds_to_bleu"]["5"] is not None and ours["history"][-1]["val_bleu"] > ours["history"][0]["val_bleu"]
    assert set(peer["seconds_to_bleu"]) == {"5", "99.5"}
    assert peer["final_loss"] < peer["history"][0]["train_loss"]             # the peer learns too
    assert [h["step"] for h in peer["history"]] == [20, 40, 60]
    for model in (ours, peer):
        assert model["steady_tokens_per_second"] > 0
        assert [(t["test_set"], t["beam"]) for t in model["test"]] == [("test", 1), ("test", 3)]
        for t in model["test"]:
            lines = (out / t["hypotheses"]).read_text(encoding="utf-8").splitlines()
            assert len(lines) == len(data.load_toy("test", "en", "de"))
    ratio = result["ratio_ours_over_peer"]
    assert ratio["tokens_per_second"] == pytest.approx(ours["steady_tokens_per_second"] / peer["steady_tokens_per_second"],
                                                       rel=1e-2)
    assert result["overrides"]["d_model"] == 32 and result["versions"]["transformers"]
    table = (out / "peer.md").read_text()
    assert table.splitlines()[2].startswith("| ours |") and "| marian |" in table
    assert "the steady training speed" in capsys.readouterr().out


def test_bench_peer_refuses_an_unknown_peer(tmp_path, capsys):
    assert cli(["bench-peer", "--config", "toy", "--peer", "fairseq", "--out", str(tmp_path)]) == 2
    assert "invalid choice: 'fairseq'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown peer 'fairseq'"):
        bench_peer.compare("toy", "fairseq", out=tmp_path)


def test_the_device_script_runs_the_comparison_end_to_end(tmp_path):
    """`course_tools/gpu_bench.sh peer --smoke` (what a GPU session runs, on the toy corpus): exit status
    0, and under $OUT the log, the report, the table and both models' translations."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    run = subprocess.run(["bash", "course_tools/gpu_bench.sh", "peer", "--smoke"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert {"peer.json", "peer.md", "peer.log", "ours.en-de.test.beam1.de", "marian.en-de.test.beam3.de"} <= set(names)
    assert json.loads((out / "peer.json").read_text())["models"][1]["name"] == "marian"
    assert "gpu_bench peer: exit status 0" in (out / "peer.log").read_text()
    assert subprocess.run(["bash", "course_tools/gpu_bench.sh", "wave"], cwd=REPO, capture_output=True).returncode == 2
