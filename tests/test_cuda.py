"""Before the first GPU run (`make gpu-check`): the fused bf16 attention path the GPU recipe trains with
gives what the readable fp32 path gives (forward and backward, with padding and causal masks), the
cached decoders agree with the readable ones on the GPU, and a few training steps run and learn.
PyTorch has had silent wrong-result bugs in fused attention with CUDA + boolean masks + bf16: this
is the place they would show. Skipped without CUDA (CI has none)."""
from __future__ import annotations

import pytest
import torch

from attention_course import bpe, decoding
from attention_course import train as training
from attention_course.model import Seq2SeqTransformer, set_fused
from attention_course.translate import beam_search, greedy_decode, label_smoothed_cross_entropy, make_masks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: run on a GPU (make gpu-check)")
SPECIALS = (bpe.BOS_ID, bpe.EOS_ID, bpe.PAD_ID)


def _batch(device, B=8, S=23, T=19, V=300):
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, V, (B, S), generator=g), torch.randint(4, V, (B, T), generator=g)
    for b in range(B):                                   # ragged: padding on both sides
        src[b, S - b:] = bpe.PAD_ID
        tgt[b, T - b:] = bpe.PAD_ID
    tgt[:, 0] = bpe.BOS_ID
    return src.to(device), tgt.to(device)


def _loss_and_grads(model, src, tgt, bf16: bool):
    model.zero_grad(set_to_none=True)
    src_mask, tgt_mask = make_masks(src, tgt[:, :-1], bpe.PAD_ID)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(src, tgt[:, :-1], src_mask, tgt_mask)
    loss = label_smoothed_cross_entropy(logits.float(), tgt[:, 1:], 0.1, bpe.PAD_ID)
    loss.backward()
    return logits.float().detach(), loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("norm_first", [True, False])
def test_fused_bf16_matches_readable_fp32_forward_and_backward(norm_first):
    torch.manual_seed(0)
    model = Seq2SeqTransformer(300, 300, d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                               d_ff=256, dropout=0.0, share_embeddings=True, norm_first=norm_first).cuda().train()
    src, tgt = _batch("cuda")
    set_fused(model, False)
    ref_logits, ref_loss, ref_grads = _loss_and_grads(model, src, tgt, bf16=False)
    set_fused(model, True)
    logits, loss, grads = _loss_and_grads(model, src, tgt, bf16=True)
    real = (tgt[:, :-1] != bpe.PAD_ID)                           # padded query rows are never used
    assert torch.isfinite(logits).all() and torch.isfinite(loss)
    torch.testing.assert_close(logits[real], ref_logits[real], rtol=5e-2, atol=5e-2)
    assert abs(float(loss) - float(ref_loss)) < 1e-2 * float(ref_loss)
    # A gradient that is zero in exact arithmetic (the key projection's bias: adding one vector to every
    # key shifts all of a query's scores equally, and softmax ignores that) holds only rounding noise,
    # whose direction means nothing: such gradients must be tiny on both paths; the others point the same way.
    scale = torch.stack([g.norm() for g in ref_grads.values()]).mean()
    wrong = []
    for name, g in grads.items():
        ref = ref_grads[name]
        if ref.norm() < 1e-4 * scale:
            if g.float().norm() > 1e-2 * scale:
                wrong.append(f"{name}: gradient {float(g.float().norm()):.2e} where the fp32 path has ~0")
            continue
        cos = torch.nn.functional.cosine_similarity(g.flatten().float(), ref.flatten(), dim=0)
        if cos <= 0.99:
            wrong.append(f"{name}: cosine {float(cos):.4f} with the fp32 gradient")
    assert not wrong, "\n".join(wrong)


def test_cached_decoders_equal_readable_on_the_gpu(tmp_path):
    run = training.train("toy", "en", "de", out_dir=tmp_path, device="cuda", progress=False, log=lambda *a: None)
    src, _ = _batch("cuda", V=run.tokenizer.get_vocab_size())
    model = run.model.eval()
    assert torch.equal(decoding.greedy_decode_cached(model, src, 20, *SPECIALS), greedy_decode(model, src, 20, *SPECIALS))
    assert torch.equal(decoding.beam_search_cached(model, src, 4, 20, *SPECIALS, length_penalty=1.0),
                       beam_search(model, src, 4, 20, *SPECIALS, length_penalty=1.0))


def test_gpu_recipe_trains_a_few_steps_in_bf16(tmp_path):
    run = training.train("gpu", "en", "de", out_dir=tmp_path, device="cuda", progress=False, log=lambda *a: None,
                         corpus="toy", vocab_size=300, min_frequency=1, max_tokens=600, max_steps=60, warmup=20,
                         max_seconds=None, checkpoint_every=20, eval_every=30, val_bleu_sentences=20)
    losses = [h["train_loss"] for h in run.history if "val_loss" not in h]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 1.0, losses
    assert run.summary["device"] == torch.cuda.get_device_name()
