"""Plausible wrong answers that a wrong-code audit found taking full points, graded for real (nbgrader, the sandbox).

Notebook 06's tiny decoding model ignored the encoder's mask and the target mask (it was causal by construction),
so greedy decoding and beam search that passed neither still scored 4/4 and 6/6; a beam search that stopped once a
finished hypothesis beat every live one's score so far scored 6/6 under most classes' secrets; notebook 05's
LayerNorm with the variance as E[x²] − E[x]² matched nn.LayerNorm only because no test had a large mean. Each now
loses its exercise's points and is told its mistake (the catalogue tests in test_nb05/06 name each one).
"""
from __future__ import annotations

import pytest

from .conftest import autograde, failed_cells, inject, solved_notebook

A05, A06 = "05_masked_cross_attention", "06_transformer_translator"

_MASKS = '''
def _masks(src, ys, pad_id):
    T = ys.size(1)
    return (src != pad_id)[:, None, None, :], torch.ones(T, T, dtype=torch.bool).tril() & (ys != pad_id)[:, None, None, :]
'''

GREEDY = _MASKS + '''
def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):
    with torch.no_grad():
        B = src.size(0)
        ys = torch.full((B, 1), bos_id, dtype=torch.long)
        src_mask, _ = _masks(src, ys, pad_id)
        memory = model.encode(src, ENCODER_MASK)
        finished = torch.zeros(B, dtype=torch.bool)
        for _ in range(max_len):
            _, tgt_mask = _masks(src, ys, pad_id)
            logits = model.decode(ys, memory, TARGET_MASK, src_mask)
            nxt = logits[:, -1].argmax(-1).masked_fill(finished, pad_id)
            ys = torch.cat([ys, nxt[:, None]], 1)
            finished |= nxt == eos_id
            if finished.all():
                break
        return ys
'''

BEAM = _MASKS + '''
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    with torch.no_grad():
        B, k = src.size(0), beam_size
        src_k = src.repeat_interleave(k, dim=0)
        ys = torch.full((B * k, 1), bos_id, dtype=torch.long)
        src_mask, _ = _masks(src_k, ys, pad_id)
        memory = model.encode(src_k, ENCODER_MASK)
        scores = torch.full((B, k), float("-inf"))
        scores[:, 0] = 0.0
        finished = [[] for _ in range(B)]
        for t in range(1, max_len + 1):
            _, tgt_mask = _masks(src_k, ys, pad_id)
            log_probs = F.log_softmax(model.decode(ys, memory, TARGET_MASK, src_mask)[:, -1].float(), dim=-1)
            V = log_probs.size(-1)
            top, index = (scores[:, :, None] + log_probs.view(B, k, V)).view(B, k * V).topk(k, dim=-1)
            beam, token = index // V, index % V
            ys = torch.cat([ys[(torch.arange(B)[:, None] * k + beam).view(-1)], token.view(-1, 1)], dim=1)
            ended = (token == eos_id) | (t == max_len)
            for b, j in (ended & torch.isfinite(top)).nonzero().tolist():
                finished[b].append((top[b, j].item() / t ** length_penalty, ys[b * k + j]))
            scores = top.masked_fill(ended, float("-inf"))
            if not torch.isfinite(scores).any() or (EARLY_STOP and all(
                    finished[b] and max(x[0] for x in finished[b]) >= scores[b].max().item() / t ** length_penalty
                    for b in range(B))):
                break
        best = [max(h, key=lambda x: x[0])[1] for h in finished]
        out = torch.full((B, max(len(h) for h in best)), pad_id, dtype=torch.long)
        for b, h in enumerate(best):
            out[b, :len(h)] = h
        return out
'''


def _decoders(encoder_mask="src_mask", target_mask="tgt_mask", early_stop="False") -> dict[str, str]:
    fill = {"ENCODER_MASK": encoder_mask, "TARGET_MASK": target_mask, "EARLY_STOP": early_stop}
    code = {"greedy_decode": GREEDY, "beam_search": BEAM}
    for name in code:
        for key, value in fill.items():
            code[name] = code[name].replace(key, value)
    return code


@pytest.mark.parametrize("changes, lost", [
    ({}, set()),  # the same code with every mask: full marks (the cases accept it)
    (dict(target_mask="None"), {"test_greedy_decode", "test_beam_search_greedy"}),  # each case reads one mask
    (dict(encoder_mask="None"), {"test_greedy_decode_source_padding", "test_beam_search_greedy"}),
    (dict(early_stop="True"), {"test_beam_search"}),
], ids=["right", "no target mask", "encoder without the source mask", "stops when a finished one leads"])
def test_decoders_that_skip_a_mask_or_stop_early_lose_their_points(course, changes, lost):
    result = autograde(course, A06, inject(solved_notebook(course, A06), _decoders(**changes)))
    decoding = {c.grade_id for c in result.cells if "decode" in c.grade_id or "beam" in c.grade_id}
    assert failed_cells(result) & decoding == lost, (failed_cells(result), result.status)


LAYER_NORM_E_X2 = '''
class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - m * m
        return (x - m) / torch.sqrt(var + self.eps) * self.weight + self.bias
'''


def test_layer_norm_with_the_variance_as_mean_square_minus_square_mean_loses_its_points(course):
    result = autograde(course, A05, inject(solved_notebook(course, A05), {"LayerNorm": LAYER_NORM_E_X2}))
    assert "test_LayerNorm" in failed_cells(result), result.cells
    message = next(c.message for c in result.cells if c.grade_id == "test_LayerNorm")
    assert "E[x²] − E[x]²" in message, message
