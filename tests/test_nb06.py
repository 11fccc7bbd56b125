"""Notebook 06 checks: the reference passes, other correct implementations pass too (another beam
search, other samplers, a loss built on F.cross_entropy without its label smoothing), every
catalogued mistake fails and is named, the built-ins and the reference are refused, and real
nbgrader takes points off in exactly the right cells."""
from __future__ import annotations

import inspect
import math
import textwrap

import nbformat
import numpy as np
import pytest
import torch

from attention_course import model as library_model
from attention_course import translate as ref
from attention_course.layers import DecoderLayer, EncoderLayer
from attention_course.positional import PositionalEncoding
from autograder import serialize
from autograder.checks import core, nb06
from autograder.checks.core import CheckFailed, Mistake, check_exercise

from .conftest import (
    assert_mistake_fails_and_is_named,
    autograde,
    catalogued_mistakes,
    failed_cells,
    fresh_copy,
    inject,
    judged_as_in_grading,
    patched,
    solved_notebook,
)
from .layout import REPO

ASSIGNMENT = "06_transformer_translator"
SOLUTION = REPO / "solutions" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"


def _solution_cell(grade_id: str) -> str:
    nb = nbformat.read(SOLUTION, as_version=4)
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _notebook_class(source: str | None = None):
    """The class the solution notebook's `Seq2SeqTransformer` cell defines, run beside the library's
    layers as the notebook imports them (not the library's model: the honesty guard refuses that)."""
    env = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional, "math": math, "EncoderLayer": EncoderLayer,
           "DecoderLayer": DecoderLayer, "PositionalEncoding": PositionalEncoding}
    exec(textwrap.dedent(source or _solution_cell("Seq2SeqTransformer")), env)
    return env["Seq2SeqTransformer"]


STUDENT = fresh_copy(ref)   # the notebook's exported code, Seq2SeqTransformer included
MISTAKES = catalogued_mistakes(nb06)   # in the catalogue's order, the same every run


def _exercises(graded):
    return [e for e in nb06.EXERCISES if e.graded == graded]


def _passes_everything(graded, impl):
    for exercise in _exercises(graded):
        check_exercise(exercise, impl)


def _build(code: str, name: str, extra: dict | None = None):
    env = {"torch": torch, "F": torch.nn.functional, "math": __import__("math"), **(extra or {})}
    exec(textwrap.dedent(code), env)
    return env[name]


@pytest.mark.parametrize("exercise", nb06.EXERCISES, ids=lambda e: e.name)
def test_reference_copy_passes(exercise):
    check_exercise(exercise, STUDENT[exercise.graded])


@pytest.mark.parametrize("mistake,graded", MISTAKES, ids=lambda x: getattr(x, "name", x))
def test_every_catalogued_mistake_fails_and_is_named(mistake, graded):
    """Named by *its own* name, not just by some catalogued mistake's (the sampler's and the loss's cases
    are compared after the grader's `derive`: the diagnosis derives each mistake's output the same way)."""
    assert_mistake_fails_and_is_named(nb06, mistake, graded)


def test_the_catalogue_order_is_fixed():
    """The diagnosis names the first mistake that matches: the catalogue is a sequence, not a set."""
    assert [m.name for m, g in MISTAKES if g == "beam_search"] == \
        [m.name for m in nb06._BEAM_DIAGNOSED + nb06.BEAM_MASK_MISTAKES]
    assert MISTAKES == catalogued_mistakes(nb06)


def _first_message(graded, impl) -> str:
    """The message of the first check of `graded` that fails (what the student's first failing test cell
    says), through the grader's judge."""
    for exercise in _exercises(graded):
        try:
            check_exercise(exercise, impl)
        except CheckFailed as err:
            return str(err)
    raise AssertionError(f"{graded} passed every check")


# --------------------------------------------------------------------------- the simulated class's answers
# Written as the students wrote them (not the catalogue's code): each was told "ignores the length
# penalty", or passed.
STOPS_AT_FIRST_FINISHED = """
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1]
            mask = (s != pad_id)[:, None, None, :]
            memory = model.encode(s, mask)
            beams = [([bos_id], 0.0)]
            done = None
            for t in range(1, max_len + 1):
                candidates = []
                for tokens, score in beams:
                    logits = model.decode(torch.tensor([tokens]), memory, None, mask)[0, -1]
                    logp = torch.log_softmax(logits.double(), -1)
                    for v in range(logp.numel()):
                        candidates.append((tokens + [v], score + float(logp[v])))
                candidates.sort(key=lambda c: -c[1])
                beams = candidates[:beam_size]
                ended = [(c[1] / t ** length_penalty, c[0]) for c in beams if c[0][-1] == eos_id or t == max_len]
                if ended:
                    done = max(ended)[1]        # the first hypothesis to finish wins
                    break
            rows.append(done)
    L = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
"""

COPIES_OF_BOS = """
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    B, k = src.size(0), beam_size
    with torch.no_grad():
        src_k = src.repeat_interleave(k, 0)
        mask = (src_k != pad_id)[:, None, None, :]
        memory = model.encode(src_k, mask)
        ys = torch.full((B * k, 1), bos_id, dtype=torch.long)
        scores = torch.zeros(B, k, dtype=torch.float64)          # every copy of <bos> starts at 0
        finished = [[] for _ in range(B)]
        for t in range(1, max_len + 1):
            logp = torch.log_softmax(model.decode(ys, memory, None, mask)[:, -1].double(), -1)
            V = logp.size(-1)
            top, idx = (scores[:, :, None] + logp.view(B, k, V)).view(B, -1).topk(k, -1)
            rows = (torch.arange(B)[:, None] * k + idx // V).view(-1)
            ys = torch.cat([ys[rows], (idx % V).view(-1, 1)], 1)
            ended = ((idx % V) == eos_id) | (t == max_len)
            for b, j in (ended & torch.isfinite(top)).nonzero().tolist():
                finished[b].append((float(top[b, j]) / t ** length_penalty, ys[b * k + j].tolist()))
            scores = top.masked_fill(ended, float("-inf"))
            if not torch.isfinite(scores).any():
                break
        best = [max(f)[1] for f in finished]
    L = max(len(h) for h in best)
    return torch.tensor([h + [pad_id] * (L - len(h)) for h in best])
"""

BOS_IN_LENGTH = COPIES_OF_BOS.replace(
    "scores = torch.zeros(B, k, dtype=torch.float64)          # every copy of <bos> starts at 0",
    "scores = torch.full((B, k), float('-inf'), dtype=torch.float64)\n        scores[:, 0] = 0.0").replace(
    "/ t ** length_penalty", "/ ys[b * k + j].numel() ** length_penalty")   # <bos> counted

# Finished hypotheses keep their places (and their raw scores) among the candidates: on the narrow beam
# two finished ones fill a beam of 2 and the search ends. It was told "stops at the first finished".
FINISHED_STAY_IN_THE_BEAM = """
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    with torch.no_grad():
        out = []
        for b in range(src.size(0)):
            beam, finished = [([bos_id], 0.0, False)], []
            for t in range(1, max_len + 1):
                ys = torch.tensor([h + [pad_id] * (t - len(h)) for h, _, _ in beam])
                s = src[b:b + 1].expand(len(beam), -1)
                m = (s != pad_id)[:, None, None, :]
                causal = torch.ones(t, t, dtype=torch.bool).tril()
                logp = torch.log_softmax(model.decode(ys, model.encode(s, m), causal, m)[:, -1].double(), -1)
                cands = []
                for i, (h, sc, done) in enumerate(beam):
                    if done:
                        cands.append((sc, h, True))
                        continue
                    for v in range(logp.size(-1)):
                        cands.append((sc + float(logp[i, v]), h + [v], v == eos_id))
                cands.sort(key=lambda c: -c[0])
                beam = []
                for sc, h, done in cands[:beam_size]:
                    if done and len(h) == t + 1:
                        finished.append((sc / t ** length_penalty, h))
                    beam.append((h, sc, done))
                if all(d for _, _, d in beam):
                    break
            finished += [(sc / (len(h) - 1) ** length_penalty, h) for h, sc, done in beam if not done]
            out.append(max(finished)[1])
        L = max(len(h) for h in out)
        return torch.tensor([h + [pad_id] * (L - len(h)) for h in out])
"""


@pytest.mark.parametrize("code,name", [
    (STOPS_AT_FIRST_FINISHED, "stops at the first finished hypothesis"),
    (COPIES_OF_BOS, "starts with beam_size identical copies of <bos>"),
    (BOS_IN_LENGTH, "counts <bos> in the length"),
    (FINISHED_STAY_IN_THE_BEAM, "keeps finished hypotheses in the beam"),
], ids=["stops at the first finished", "beam_size copies of <bos>", "<bos> in the length", "finished stay in the beam"])
def test_the_classes_beam_searches_are_told_their_own_mistake(code, name):
    assert BOS_IN_LENGTH != COPIES_OF_BOS
    message = _first_message("beam_search", _build(code, "beam_search"))
    assert f"This matches a known mistake: {name}" in message, message
    assert "length penalty" not in message.split("This matches", 1)[1].split("\n")[0], message


def test_a_beam_that_stops_once_beam_size_have_finished_is_told_so_on_the_narrow_beam():
    """A wrong-code audit: Hugging Face's early_stopping=True rule (stop once beam_size hypotheses have finished) ends
    on the hand-made narrow beam exactly as a beam that keeps finished hypotheses does, and was told only that, which
    sent a student whose beam was right to look there: the diagnosis names both."""
    impl = Mistake("", "", nb06._beam_code(stop="ys.size(0) == 0 or len(finished) >= beam_size")).build("beam_search")
    exercise = next(e for e in nb06.EXERCISES if e.name == "beam_search")
    case = next(c for c in core.cases_of(exercise) if "what a beam of 2 keeps" in c.description)
    message = core.judge(exercise, case, core.run_case(exercise, case, impl))
    assert "or stops once beam_size hypotheses have finished" in message, message


SEEDS_THE_GLOBAL_GENERATOR = """
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    if generator is not None:
        torch.manual_seed(generator.initial_seed())     # "use" the generator
    x = logits / temperature
    if top_k is not None:
        x = x.masked_fill(x < x.topk(min(top_k, x.size(-1)), -1).values[..., -1:], float("-inf"))
    p = torch.softmax(x, -1)
    return torch.multinomial(p.reshape(-1, p.size(-1)), 1).reshape(p.shape[:-1])
"""


def test_a_sampler_that_seeds_the_global_generator_fails_and_is_named():
    impl = _build(SEEDS_THE_GLOBAL_GENERATOR, "sample_next_token")
    for name in ("sample_next_token", "sample_next_token_top_k"):   # its draws have the right distribution
        check_exercise(_exercise(name), impl)
    with pytest.raises(CheckFailed, match="known mistake: seeds torch's global random generator"):
        check_exercise(_exercise("sample_next_token_generator"), impl)
    before = torch.random.get_rng_state()
    check_exercise(_exercise("sample_next_token_generator"), STUDENT["sample_next_token"])
    assert torch.equal(before, torch.random.get_rng_state())   # the grader's own generator is left alone


def test_the_generator_verdicts_are_decided_by_the_grader():
    """With torch.equal patched to say 'equal' where the cases run, the sampler that seeds the global
    generator still fails: the draws and the random states come back, and are compared here."""
    exercise = _exercise("sample_next_token_generator")
    impl = _build(SEEDS_THE_GLOBAL_GENERATOR, "sample_next_token")
    messages = [m for m in judged_as_in_grading(exercise, impl, *EQUAL) if m]
    # the cell reports its first failing case
    assert messages and "known mistake: seeds torch's global random generator" in messages[0], messages


# --------------------------------------------------------------------------- other correct solutions
ONE_SENTENCE_BEAM = Mistake("(correct)", "", nb06._beam_code()).build("beam_search")

GREEDY_ONE_AT_A_TIME = """
def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1]
            mask = (s != pad_id)[:, None, None, :]
            memory = model.encode(s, mask)
            ys = [bos_id]
            for _ in range(max_len):
                causal = torch.ones(len(ys), len(ys), dtype=torch.bool).tril()
                logits = model.decode(torch.tensor([ys]), memory, causal, mask)
                ys.append(int(logits[0, -1].argmax()))
                if ys[-1] == eos_id:
                    break
            rows.append(ys)
    L = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
"""

GUMBEL_SAMPLER = """
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    if temperature <= 0:
        raise ValueError("temperature")
    x = logits / temperature
    if top_k is not None:
        x = torch.where(x >= x.topk(min(top_k, x.size(-1)), -1).values[..., -1:], x, torch.tensor(float("-inf")))
    u = torch.rand(x.shape, generator=generator).clamp(1e-12, 1 - 1e-12)
    return (x - torch.log(-torch.log(u))).argmax(-1)
"""

INVERSE_CDF_SAMPLER = """
def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
    if not temperature > 0:
        raise ValueError("temperature")
    p = torch.softmax(logits / temperature, dim=-1)
    if top_k is not None:
        keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, p.topk(min(top_k, p.size(-1)), -1).indices, True)
        p = torch.where(keep, p, torch.zeros_like(p))
        p = p / p.sum(-1, keepdim=True)
    u = torch.rand(p.shape[:-1] + (1,), generator=generator)
    return (p.cumsum(-1) < u).sum(-1).clamp(max=p.size(-1) - 1)
"""

LOSS_FROM_CROSS_ENTROPY = """
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    x, y = logits.reshape(-1, V), target.reshape(-1)
    nll = F.cross_entropy(x, y, ignore_index=ignore_index)            # no label smoothing: allowed
    keep = y != ignore_index
    uniform = -F.log_softmax(x, -1).mean(-1)[keep].mean()
    return (1 - epsilon) * nll + epsilon * uniform
"""

NOAM_STYLE_LR = """
def inverse_sqrt_lr(step, warmup, peak_lr):
    return 0.0 if step == 0 else peak_lr * warmup ** 0.5 * min(step ** -0.5, step * warmup ** -1.5)
"""


@pytest.mark.parametrize("graded,code", [
    ("greedy_decode", GREEDY_ONE_AT_A_TIME),
    ("sample_next_token", GUMBEL_SAMPLER),
    ("sample_next_token", INVERSE_CDF_SAMPLER),
    ("label_smoothed_cross_entropy", LOSS_FROM_CROSS_ENTROPY),
    ("inverse_sqrt_lr", NOAM_STYLE_LR),
], ids=["greedy one sentence at a time", "Gumbel-max sampler", "inverse-CDF sampler",
        "loss from F.cross_entropy without smoothing", "Noam-style schedule"])
def test_other_correct_implementations_pass(graded, code):
    _passes_everything(graded, _build(code, graded))


def test_a_one_sentence_at_a_time_beam_search_passes():
    _passes_everything("beam_search", ONE_SENTENCE_BEAM)


# --------------------------------------------------------------------------- Seq2SeqTransformer
def test_the_notebooks_model_moves_state_dicts_both_ways_with_the_library():
    """The solution's class and the library's: one state dict, loaded either way (strict), the same logits."""
    assert "class Seq2SeqTransformer(nn.Module):" in _solution_cell("Seq2SeqTransformer")
    assert ref.Seq2SeqTransformer is not library_model.Seq2SeqTransformer, "exported beside the trainer's model"
    kwargs = dict(d_model=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2, d_ff=32, dropout=0.0,
                  max_len=12, share_embeddings=True, norm_first=True)
    torch.manual_seed(0)
    ours, library = STUDENT["Seq2SeqTransformer"](19, 19, **kwargs).eval(), library_model.Seq2SeqTransformer(19, 19, **kwargs).eval()
    ours.load_state_dict(library.state_dict())
    src, tgt = torch.randint(1, 19, (2, 6)), torch.randint(1, 19, (2, 4))
    src[1, 4:] = 0
    src_mask, tgt_mask = ref.make_masks(src, tgt, 0)
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt, src_mask, tgt_mask), library(src, tgt, src_mask, tgt_mask),
                                   rtol=1e-5, atol=1e-5)
        back = library_model.Seq2SeqTransformer(19, 19, **kwargs).eval()
        back.load_state_dict(ours.state_dict())
        torch.testing.assert_close(back(src, tgt, src_mask, tgt_mask), library(src, tgt, src_mask, tgt_mask),
                                   rtol=1e-5, atol=1e-5)
    torch.manual_seed(3)
    same_seed = STUDENT["Seq2SeqTransformer"](19, 19, **kwargs)
    torch.manual_seed(3)
    for (name, a), b in zip(same_seed.state_dict().items(), library_model.Seq2SeqTransformer(19, 19, **kwargs).state_dict().values(), strict=True):
        assert torch.equal(a, b), f"{name}: the given initialization draws as the library's does"


# Another correct assembly: the scale kept as a number, the tie made from the source side, the stacks
# unrolled through a helper. (Nothing the checks depend on but the function and the parameter names.)
OTHER_MODEL = """
class Seq2SeqTransformer(nn.Module):
    def __init__(self, src_vocab_size, tgt_vocab_size, d_model=256, num_heads=4, num_encoder_layers=3,
                 num_decoder_layers=3, d_ff=1024, dropout=0.1, max_len=256, share_embeddings=False, norm_first=False):
        super().__init__()
        self.scale = d_model ** 0.5
        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout)
        self.encoder_layers = nn.ModuleList([EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                             for _ in range(num_encoder_layers)])
        self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first)
                                             for _ in range(num_decoder_layers)])
        self.encoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        if share_embeddings:
            self.tgt_embed = self.src_embed
            self.generator.weight = self.src_embed.weight

    def _stack(self, layers, x, *args):
        for layer in layers:
            x = layer(x, *args)
        return x

    def encode(self, src, src_mask=None):
        x = self.positional(self.src_embed(src) * self.scale)
        return self.encoder_norm(self._stack(self.encoder_layers, x, src_mask))

    def decode(self, tgt, memory, tgt_mask=None, memory_mask=None):
        y = self.positional(self.tgt_embed(tgt) * self.scale)
        return self.generator(self.decoder_norm(self._stack(self.decoder_layers, y, memory, tgt_mask, memory_mask)))

    def forward(self, src, tgt, src_mask=None, tgt_mask=None):
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, tgt_mask, src_mask)
"""


def test_another_correct_model_passes():
    _passes_everything("Seq2SeqTransformer", _notebook_class(OTHER_MODEL))


def test_a_model_with_a_parameter_the_library_lacks_is_told_its_name():
    extra = OTHER_MODEL.replace("self.scale = d_model ** 0.5",
                                "self.scale = nn.Parameter(torch.tensor(float(d_model) ** 0.5))")
    message = _first_message("Seq2SeqTransformer", _notebook_class(extra))
    assert "unexpected: scale" in message, message


def test_a_model_with_a_buffer_the_library_lacks_fails_the_state_dict_round_trip():
    """A saved buffer (the scale, registered) changes no logit, but the model's state dict no longer loads
    into the library's: the last case says so."""
    extra = OTHER_MODEL.replace("self.scale = d_model ** 0.5",
                                "self.register_buffer('scale', torch.tensor(float(d_model) ** 0.5))")
    message = _first_message("Seq2SeqTransformer", _notebook_class(extra))
    assert "loads into the library's Seq2SeqTransformer with strict=True" in message
    assert "output[1]" in message and "expected True, got False" in message, message


def test_a_subclass_of_the_library_model_is_not_accepted():
    class Seq2SeqTransformer(library_model.Seq2SeqTransformer):
        pass

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb06.check("Seq2SeqTransformer", Seq2SeqTransformer)


def test_pytorchs_transformer_is_not_accepted():
    class Seq2SeqTransformer(STUDENT["Seq2SeqTransformer"]):
        def encode(self, src, src_mask=None):
            layer = torch.nn.TransformerEncoderLayer(self.d_model, 2, 8, dropout=0.0, batch_first=True)
            stack = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
            return stack(self.embed_tokens(self.src_embed, src))

    with pytest.raises(CheckFailed, match="built-in Transformer"):
        nb06.check("Seq2SeqTransformer", Seq2SeqTransformer)


def test_the_model_stub_is_reported_as_not_attempted():
    nb = nbformat.read(REPO / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    stub = next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "Seq2SeqTransformer")
    assert "raise NotImplementedError()" in stub and "### BEGIN SOLUTION" not in stub
    for name in ("Seq2SeqTransformer", "Seq2SeqTransformer_gradients"):
        with pytest.raises(CheckFailed, match="not attempted"):
            nb06.check(name, _notebook_class(stub))


def test_an_untied_generator_passes_the_logits_and_fails_the_gradients():
    untied = _notebook_class(_solution_cell("Seq2SeqTransformer").replace(
        "self.generator.weight = self.tgt_embed.weight", "pass"))
    nb06.check("Seq2SeqTransformer", untied)
    with pytest.raises(CheckFailed, match="known mistake: the generator not tied"):
        nb06.check("Seq2SeqTransformer_gradients", untied)


def test_a_library_not_implemented_error_is_a_crash_not_an_unwritten_stub():
    """A reader: make_masks with a float causal mask combined by `&` makes PyTorch raise NotImplementedError
    ('"bitwise_and_cpu" not implemented for 'Float''), and the student who had written it was told "not attempted
    yet". Only a `raise` of the notebook's code is an unwritten stub; the stub itself still is."""
    def make_masks(src, tgt_in, pad_id):
        causal = torch.ones(tgt_in.size(1), tgt_in.size(1)).tril()
        return (src != pad_id)[:, None, None, :], (tgt_in != pad_id)[:, None, None, :] & causal

    with pytest.raises(CheckFailed) as crashed:
        nb06.check("make_masks", make_masks)
    assert "raised NotImplementedError" in str(crashed.value) and "'Float'" in str(crashed.value), str(crashed.value)
    assert "not attempted" not in str(crashed.value)

    def stub(src, tgt_in, pad_id):
        raise NotImplementedError()

    stub.__name__ = stub.__qualname__ = "make_masks"
    with pytest.raises(CheckFailed, match="not attempted yet"):
        nb06.check("make_masks", stub)


def test_values_that_differ_inside_the_printed_arrays_elision_are_listed():
    """A reader: an inverse_sqrt_lr with step // warmup printed two identical-looking arrays (its wrong entries were
    inside the '...'); the message lists the entries that differ."""
    def inverse_sqrt_lr(step, warmup, peak_lr):
        return 0.0 if step <= 0 else peak_lr * min(step // warmup, math.sqrt(warmup / step))

    with pytest.raises(CheckFailed, match=r"4 of 11 entries differ: \(1,\): expected 1\.75e-07, got 0"):
        nb06.check("inverse_sqrt_lr", inverse_sqrt_lr)


def test_label_smoothing_written_with_view_fails_on_the_training_steps_own_slices():
    """A wrong-code audit: .view(-1, V) took 30/30 (every case's tensors were contiguous), then crashed the notebook's
    own training step, which passes tgt[:, 1:]; .reshape passes."""
    def with_view(logits, target, epsilon=0.1, ignore_index=-100):
        lp = torch.log_softmax(logits.view(-1, logits.size(-1)), -1)
        t = target.view(-1)
        keep = t != ignore_index
        nll = -lp.gather(-1, t.clamp(min=0)[:, None]).squeeze(-1)
        return ((1 - epsilon) * nll - epsilon * lp.mean(-1))[keep].mean()

    with pytest.raises(CheckFailed, match=r"(?s)view size is not compatible.*tgt\[:, 1:\]: not contiguous"):
        nb06.check("label_smoothed_cross_entropy", with_view)
    reshaped = textwrap.dedent(inspect.getsource(with_view)).replace(".view(", ".reshape(")
    env = {"torch": torch}
    exec(reshaped, env)
    nb06.check("label_smoothed_cross_entropy", env["with_view"])


# --------------------------------------------------------------------------- refused
def test_builtin_label_smoothing_is_not_accepted():
    def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
        V = logits.size(-1)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
                                                 label_smoothing=epsilon, ignore_index=ignore_index)

    with pytest.raises(CheckFailed, match="label_smoothing"):
        nb06.check("label_smoothed_cross_entropy", label_smoothed_cross_entropy)

    def via_module(logits, target, epsilon=0.1, ignore_index=-100):
        loss = torch.nn.CrossEntropyLoss(label_smoothing=epsilon, ignore_index=ignore_index)
        return loss(logits.reshape(-1, logits.size(-1)), target.reshape(-1))

    with pytest.raises(CheckFailed, match="not accepted"):
        nb06.check("label_smoothed_cross_entropy", via_module)


class _Eps(float):
    """A red team's epsilon: false to `if`, read as 0.1 by PyTorch (30/30, unflagged, in every sandbox)."""

    def __bool__(self):
        return False


def _smoothed_by_a_float_subclass(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=ignore_index,
                                             label_smoothing=_Eps(epsilon))


def _smoothed_by_the_kernel(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    return torch._C._nn.cross_entropy_loss(logits.reshape(-1, V), target.reshape(-1), None, 1, ignore_index, epsilon)


def _smoothed_by_torch_ops_by_a_computed_name(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    kernel = getattr(torch.ops.aten, "cross_" + "entropy_loss")
    return kernel(logits.reshape(-1, V), target.reshape(-1), None, 1, ignore_index, epsilon)


def _smoothed_by_a_torch_ops_overload(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    return torch.ops.aten.cross_entropy_loss.default(logits.reshape(-1, V), target.reshape(-1), None, 1,
                                                     ignore_index, epsilon)


def _own_smoothing_beside_a_plain_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    """Honest: the built-in without smoothing for the NLL part, the smoothing term written by hand."""
    V = logits.size(-1)
    flat, t = logits.reshape(-1, V), target.reshape(-1)
    keep = t != ignore_index
    nll = torch.nn.functional.cross_entropy(flat, t, ignore_index=ignore_index, label_smoothing=0.0)
    uniform = -(flat.log_softmax(-1).mean(-1) * keep).sum() / keep.sum()
    return (1 - epsilon) * nll + epsilon * uniform


def _smoothed_by_the_kernel_called_from_c(logits, target, epsilon=0.1, ignore_index=-100):
    """functools.partial calls the kernel from C: no profile event of its own (a reviewer's; took full points)."""
    import functools

    V = logits.size(-1)
    return functools.partial(torch._C._nn.cross_entropy_loss, logits.reshape(-1, V), target.reshape(-1), None, 1,
                             ignore_index, epsilon)()


def _smoothed_by_f_cross_entropy_mapped(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    [loss] = map(lambda pair: torch.nn.functional.cross_entropy(*pair, ignore_index=ignore_index,
                                                                 label_smoothing=epsilon),
                 [(logits.reshape(-1, V), target.reshape(-1))])
    return loss


def _smoothed_by_the_kernel_mapped(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    [loss] = map(torch._C._nn.cross_entropy_loss, [logits.reshape(-1, V)], [target.reshape(-1)], [None], [1],
                 [ignore_index], [epsilon])
    return loss


@pytest.mark.parametrize("impl", [_smoothed_by_a_float_subclass, _smoothed_by_the_kernel,
                                  _smoothed_by_torch_ops_by_a_computed_name, _smoothed_by_a_torch_ops_overload,
                                  _smoothed_by_the_kernel_called_from_c, _smoothed_by_f_cross_entropy_mapped,
                                  _smoothed_by_the_kernel_mapped],
                         ids=["float subclass", "kernel", "torch.ops, a computed name", "torch.ops overload",
                              "kernel through functools.partial", "map over F.cross_entropy", "map over the kernel"])
def test_builtin_label_smoothing_is_not_accepted_however_it_is_spelled(impl):
    with pytest.raises(CheckFailed, match="label_smoothing"):
        nb06.check("label_smoothed_cross_entropy", impl)


def _smoothed_in_a_new_thread(logits, target, epsilon=0.1, ignore_index=-100):
    """The built-in's smoothing in a worker thread started during the check (took full points: the exercise's
    own hook was on the checking thread only)."""
    import concurrent.futures

    V = logits.size(-1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(torch.nn.functional.cross_entropy, logits.reshape(-1, V), target.reshape(-1),
                           ignore_index=ignore_index, label_smoothing=epsilon).result()


def _smoothed_through_asyncio(logits, target, epsilon=0.1, ignore_index=-100):
    import asyncio

    V = logits.size(-1)

    async def loss():
        return await asyncio.to_thread(torch.nn.functional.cross_entropy, logits.reshape(-1, V), target.reshape(-1),
                                       ignore_index=ignore_index, label_smoothing=epsilon)

    return asyncio.run(loss())


_EARLY_POOL: list = []


def _smoothed_in_a_thread_started_before(logits, target, epsilon=0.1, ignore_index=-100):
    """A pool the notebook started before any check, handed the work during it."""
    import concurrent.futures

    if not _EARLY_POOL:
        _EARLY_POOL.append(concurrent.futures.ThreadPoolExecutor(1))
    V = logits.size(-1)
    return _EARLY_POOL[0].submit(torch._C._nn.cross_entropy_loss, logits.reshape(-1, V), target.reshape(-1),
                                 None, 1, ignore_index, epsilon).result()


@pytest.mark.parametrize("impl", [_smoothed_in_a_new_thread, _smoothed_through_asyncio],
                         ids=["worker thread", "asyncio.to_thread"])
def test_builtin_label_smoothing_in_another_thread_is_not_accepted(impl):
    with pytest.raises(CheckFailed, match="label_smoothing"):
        nb06.check("label_smoothed_cross_entropy", impl)


def test_the_kernel_in_a_thread_started_before_the_check_is_not_accepted():
    core.install_behaviour_watch()  # what the sandbox's runner does before any student code
    _EARLY_POOL.append(__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
    _EARLY_POOL[0].submit(int).result()  # its thread runs now, before the check
    try:
        with pytest.raises(CheckFailed, match="label_smoothing"):
            nb06.check("label_smoothed_cross_entropy", _smoothed_in_a_thread_started_before)
    finally:
        _EARLY_POOL.pop().shutdown()
        core.unwatch_thread_starts()  # the suite's later threads carry no dispatcher


def test_a_plain_cross_entropy_beside_ones_own_smoothing_passes():
    nb06.check("label_smoothed_cross_entropy", _own_smoothing_beside_a_plain_cross_entropy)


def test_the_kernel_without_smoothing_called_from_c_is_no_smoothing():
    """The function mode reads the kernel's own label_smoothing: 0.0 through functools.partial is honest."""
    import functools

    def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
        V = logits.size(-1)
        flat, t = logits.reshape(-1, V), target.reshape(-1)
        keep = t != ignore_index
        nll = functools.partial(torch._C._nn.cross_entropy_loss, flat, t, None, 1, ignore_index, 0.0)()
        uniform = -(flat.log_softmax(-1).mean(-1) * keep).sum() / keep.sum()
        return (1 - epsilon) * nll + epsilon * uniform

    nb06.check("label_smoothed_cross_entropy", label_smoothed_cross_entropy)


def test_a_zero_smoothing_as_a_numpy_float_is_no_smoothing():
    """A review's false refusal: label_smoothing=np.float64(0.0) is PyTorch's 0, not its built-in smoothing."""
    def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
        V = logits.size(-1)
        flat, t = logits.reshape(-1, V), target.reshape(-1)
        keep = t != ignore_index
        nll = torch.nn.functional.cross_entropy(flat, t, ignore_index=ignore_index, label_smoothing=np.float64(0.0))
        return (1 - epsilon) * nll + epsilon * (-(flat.log_softmax(-1).mean(-1) * keep).sum() / keep.sum())

    nb06.check("label_smoothed_cross_entropy", label_smoothed_cross_entropy)


def test_calling_the_reference_is_not_accepted():
    def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
        return ref.beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty)

    with pytest.raises(CheckFailed, match="reference implementation"):
        nb06.check("beam_search", beam_search)


def test_stub_is_reported_as_not_attempted():
    def sample_next_token(logits, temperature=1.0, top_k=None, generator=None):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="not attempted"):
        nb06.check("sample_next_token", sample_next_token)


# --------------------------------------------------------------------------- verdicts are decided by the grader
# In grading a case runs in the sandbox, in the student's process; whatever it computes there the
# student can monkeypatch. The cases now return the sampler's draws and the loss as they are, and the
# grader computes the frequencies, "the two seeded calls drew the same tokens" and "the loss is 0-d".
# Each patch below made the wrong implementation pass when that was computed inside the case.
_REAL_DIM = torch.Tensor.dim


def _exercise(name):
    return next(e for e in nb06.EXERCISES if e.name == name)


def _mistake(exercise, name):
    return next(m for m in exercise.mistakes if m.name == name).build(exercise.graded)


def _loss_of_shape_1(logits, target, epsilon=0.1, ignore_index=-100):
    return STUDENT["label_smoothed_cross_entropy"](logits, target, epsilon, ignore_index).reshape(1)


def _dim_0_for_shape_1(self):
    return 0 if tuple(self.shape) == (1,) else _REAL_DIM(self)


EQUAL = ((torch, "equal", lambda *a, **k: True), (torch.Tensor, "equal", lambda *a, **k: True))
NO_DISTANCE = ((np, "abs", np.zeros_like),)   # every frequency "within 0.01" of its probability
LIES = {
    "generator ignored, torch.equal patched":
        ("sample_next_token_generator", "ignores the generator (draws from the global random state)", EQUAL,
         "expected True, got False"),
    "logits times T, np.abs patched":
        ("sample_next_token", "multiplied the logits by the temperature instead of dividing", NO_DISTANCE,
         "values differ"),
    "top-k kept the k smallest, np.abs patched":
        ("sample_next_token_top_k", "top-k kept the k smallest logits", NO_DISTANCE, "values differ"),
    "loss of shape [1], Tensor.dim patched":
        ("label_smoothed_cross_entropy", None, ((torch.Tensor, "dim", _dim_0_for_shape_1),),
         ("output[1]: 1 entries differ, first at index (0,): expected True, got False",  # the 0-d check
          "output[0]: expected shape (), got shape (1,)")),  # the case that also takes the inputs back
}


@pytest.mark.parametrize("lie", LIES, ids=str)
def test_verdicts_cannot_be_patched_in_the_sandbox(lie):
    name, mistake, patches, how = LIES[lie]
    exercise = _exercise(name)
    impl = _loss_of_shape_1 if mistake is None else _mistake(exercise, mistake)
    messages = [m for m in judged_as_in_grading(exercise, impl, *patches) if m]
    assert messages, f"{lie}: passed, so the verdict was decided where the student's code runs"
    hows = how if isinstance(how, tuple) else (how,)
    assert all("gave a wrong result" in m and any(h in m for h in hows) for m in messages), messages
    if mistake:
        assert any(f"known mistake: {mistake}." in m for m in messages), messages


def test_the_patches_do_lie_and_are_undone():
    a, b = torch.zeros(3), torch.ones(3)
    with patched(*EQUAL, *NO_DISTANCE, (torch.Tensor, "dim", _dim_0_for_shape_1)):
        assert torch.equal(a, b) and a.equal(b) and np.abs(np.array([-3.0]))[0] == 0 and torch.zeros(1).dim() == 0
    assert not torch.equal(a, b) and np.abs(np.array([-3.0]))[0] == 3 and torch.zeros(1).dim() == 1
    assert not {"equal", "dim"} & set(torch.Tensor.__dict__)


@pytest.mark.parametrize("name", ["label_smoothed_cross_entropy", "label_smoothed_cross_entropy_stability",
                                  "sample_next_token", "sample_next_token_top_k", "sample_next_token_generator"])
def test_the_reference_passes_as_in_grading(name):
    """Through serialization too: a 0-d loss comes back 0-d, the draws come back as they were."""
    exercise = _exercise(name)
    assert judged_as_in_grading(exercise, STUDENT[exercise.graded]) == [None] * len(core.cases_of(exercise))


@pytest.mark.parametrize("garbage", [None, "text", 3, 2.5, (), (1, 2), [torch.zeros(2)], np.zeros(3),
                                     torch.zeros(2, 3), torch.zeros(0), torch.full((3, nb06.N_DRAWS), 10 ** 12),
                                     torch.full((2, nb06.N_DRAWS), -1.5), torch.ones(2, nb06.N_DRAWS, dtype=torch.bool),
                                     torch.zeros(2, nb06.N_DRAWS, dtype=torch.complex64), torch.tensor(float("nan")),
                                     (torch.zeros(200), "x"), (torch.zeros(200), torch.zeros(199)),
                                     (torch.zeros(200), torch.zeros(200, dtype=torch.int32)),
                                     serialize.Unsupported("function")], ids=repr)
@pytest.mark.filterwarnings("ignore:Casting complex values")
def test_garbage_is_judged_wrong_without_crashing(garbage):
    """(One case of each kind: judging runs every catalogued mistake on it, to diagnose.)"""
    for name in ("label_smoothed_cross_entropy", "sample_next_token", "sample_next_token_generator"):
        exercise = _exercise(name)
        case = next(c for c in core.cases_of(exercise) if c.derive is not None)
        assert core.judge(exercise, case, ("value", garbage)), (case.description, garbage)


# --------------------------------------------------------------------------- real nbgrader
def _code(graded, name):
    for e in nb06.EXERCISES:
        for m in e.mistakes:
            if e.graded == graded and m.name == name:
                return m.code
    raise KeyError(name)


DEMO = ("label_smoothed_cross_entropy", "smoothing mass spread over the V-1 wrong classes instead of all V classes",
        {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"})


@pytest.mark.slow
def test_nbgrader_demo_mistake_costs_exactly_its_cells(course):
    """The notebook-06 entry for the demo's typical-mistake student."""
    graded, name, cells = DEMO
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT), {graded: _code(graded, name)}))
    assert result.status == "ok"
    assert failed_cells(result) == cells
    assert result.score == result.max_score - 4
    assert "V-1 wrong classes" in " ".join(c.message for c in result.cells)


SMOOTHED_IN_A_WORKER_THREAD = '''
import concurrent.futures


def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(torch.nn.functional.cross_entropy, logits.reshape(-1, V), target.reshape(-1),
                           ignore_index=ignore_index, label_smoothing=epsilon).result()
'''


@pytest.mark.slow
def test_builtin_label_smoothing_in_a_worker_thread_gets_no_points(course):
    """A red team's way round the guard, graded for real: the built-in's smoothing called from a worker
    thread took the loss's 4 points; now its cells score 0 and say why, and nothing else is lost."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"label_smoothed_cross_entropy": SMOOTHED_IN_A_WORKER_THREAD}))
    assert result.status == "ok", result.status_text
    assert failed_cells(result) == {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"}
    assert result.score == result.max_score - 4
    assert "label_smoothing" in " ".join(c.message for c in result.cells)



SMOOTHED_IN_A_RAW_THREAD = '''
import sys
import threading


def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    box, done = [], threading.Event()

    def work():
        box.append(torch.nn.functional.cross_entropy(logits.reshape(-1, V), target.reshape(-1),
                                                     ignore_index=ignore_index, label_smoothing=epsilon))
        done.set()

    getattr(sys.modules["_th" + "read"], "start_new_" + "thread")(work, ())   # a thread with no profile hook
    done.wait()
    return box[0]
'''


@pytest.mark.slow
def test_builtin_label_smoothing_in_a_raw_thread_gets_no_points(course):
    """_thread.start_new_thread, by a name the static pass can only flag: its thread carried none of the guard
    and the built-in's smoothing took the loss's 4 points; now every thread starts watched."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"label_smoothed_cross_entropy": SMOOTHED_IN_A_RAW_THREAD}))
    assert result.status == "ok", result.status_text
    assert failed_cells(result) == {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"}
    assert "label_smoothing" in " ".join(c.message for c in result.cells)

LOSS_IN_FLOAT64 = '''
def label_smoothed_cross_entropy(logits, target, epsilon=0.1, ignore_index=-100):
    V = logits.size(-1)
    logp = torch.log_softmax(logits.double(), dim=-1).reshape(-1, V)   # float64, for accuracy
    t = target.reshape(-1)
    keep = t != ignore_index
    logp, t = logp[keep], t[keep]
    nll = -logp[torch.arange(len(t)), t]
    return ((1 - epsilon) * nll - epsilon * logp.mean(-1)).mean()
'''


def test_a_right_value_in_the_wrong_dtype_is_told_so():
    """The dtype decides (float32 is the course's convention), but a student whose values are right is told
    that only the cast is missing; wrong values in a wrong dtype are not said to be right."""
    right = core.difference(torch.tensor(1.5), torch.tensor(1.5, dtype=torch.float64))
    assert "expected dtype torch.float32, got torch.float64" in right.message
    assert "the values are right" in right.message and "return torch.float32: `.float()`" in right.message
    ids = core.difference(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]))  # token ids as floats: .long(), not .float()
    assert "return torch.int64: `.long()`" in ids.message, ids.message
    wrong = core.difference(torch.tensor(1.5), torch.tensor(2.5, dtype=torch.float64))
    assert "expected dtype" in wrong.message and "the values are right" not in wrong.message


@pytest.mark.slow
def test_a_loss_computed_in_float64_is_told_its_values_are_right(course):
    """Graded for real: the loss in float64 still loses its cells (the notebook's own test says float32 too),
    with a message that names the one thing to change."""
    result = autograde(course, ASSIGNMENT, inject(solved_notebook(course, ASSIGNMENT),
                                                  {"label_smoothed_cross_entropy": LOSS_IN_FLOAT64}))
    assert failed_cells(result) == {"test_label_smoothed_cross_entropy", "test_label_smoothed_cross_entropy_stability"}
    message = next(c.message for c in result.cells if c.grade_id == "test_label_smoothed_cross_entropy")
    assert "float64" in message and "the values are right" in message, message

@pytest.mark.slow
def test_nbgrader_takes_points_for_wrong_implementations(course):
    """Five functions wrong at once: each loses exactly its own cells (none feeds another's tests)."""
    nb = inject(solved_notebook(course, ASSIGNMENT), {
        "make_masks": _code("make_masks", "the target mask is only causal: target padding is not masked"),
        "inverse_sqrt_lr": _code("inverse_sqrt_lr", "decays like 1/step instead of 1/sqrt(step)"),
        "greedy_decode": _code("greedy_decode", "drops the eos token"),
        "beam_search": _code("beam_search", "ignores the length penalty (ranks finished hypotheses as the raw sum of log p does)"),
        "sample_next_token": _code("sample_next_token", "returned the most likely token (argmax) instead of sampling"),
        "Seq2SeqTransformer": _code("Seq2SeqTransformer", "the generator not tied to the target embedding (share_embeddings=True)"),
    })
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {
        "test_make_masks_padding", "test_inverse_sqrt_lr", "test_greedy_decode", "test_greedy_decode_source_padding",
        "test_beam_search", "test_beam_search_length_penalty", "test_sample_next_token", "test_sample_next_token_top_k",
        "test_sample_next_token_generator",   # argmax draws nothing from the generator: two calls agree
        "test_Seq2SeqTransformer_gradients",  # untied: the logits agree, the gradients do not
    }
    # test_make_masks, the loss (3 + 1), beam_size=1, the model's logits (3)
    assert result.score == 2 + 3 + 1 + 1 + 3
    messages = " ".join(c.message for c in result.cells)
    assert "drops the eos token" in messages and "argmax" in messages
    assert "the generator not tied to the target embedding" in messages


@pytest.mark.slow
def test_nbgrader_takes_the_models_points_for_unscaled_embeddings(course):
    """The model's two cells, and nothing else, for a model whose embeddings miss sqrt(d_model)."""
    nb = inject(solved_notebook(course, ASSIGNMENT),
                {"Seq2SeqTransformer": _code("Seq2SeqTransformer", "embeddings not scaled by sqrt(d_model)")})
    result = autograde(course, ASSIGNMENT, nb)
    assert result.status == "ok"
    assert failed_cells(result) == {"test_Seq2SeqTransformer", "test_Seq2SeqTransformer_gradients"}
    assert result.score == result.max_score - 5
    assert "embeddings not scaled by sqrt(d_model)" in " ".join(c.message for c in result.cells)


# A beam that is refilled after a hypothesis ends (fairseq's way): the best non-eos candidates take the
# finished ones' places, and the search goes on to max_len. With one beam it searches past greedy's eos.
REFILLED_BEAM = '''
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    out = []
    with torch.no_grad():
        for b in range(src.size(0)):
            beams, finished = [([bos_id], 0.0)], []
            for t in range(1, max_len + 1):
                ys = torch.tensor([h for h, _ in beams])
                s = src[b:b + 1].expand(len(beams), -1)
                m = (s != pad_id)[:, None, None, :]
                logp = torch.log_softmax(model.decode(ys, model.encode(s, m), None, m)[:, -1].double(), -1)
                cands = sorted(((sc + float(logp[i, v]), h + [v]) for i, (h, sc) in enumerate(beams)
                                for v in range(logp.size(-1))), key=lambda c: -c[0])
                beams = []
                for rank, (sc, h) in enumerate(cands):
                    if (h[-1] == eos_id and rank < beam_size) or (t == max_len and len(beams) < beam_size):
                        finished.append((sc / t ** length_penalty, h))
                    elif h[-1] != eos_id and len(beams) < beam_size and t < max_len:
                        beams.append((h, sc))                       # refilled: the beam stays beam_size wide
            out.append(max(finished)[1])
    L = max(len(h) for h in out)
    return torch.tensor([h + [pad_id] * (L - len(h)) for h in out])
'''


def test_a_refilled_beam_is_told_that_one_beam_is_greedy():
    """A refilled beam failed only 'beam_size=1 must equal greedy decoding' with 'expected shape (4, 6),
    got shape (4, 7)' and no word on why; the case now says what one beam does when its hypothesis ends."""
    message = str(pytest.raises(CheckFailed, check_exercise, _exercise("beam_search_greedy"),
                                _build(REFILLED_BEAM, "beam_search")).value)
    assert "when it ends with eos, the search ends; nothing refills the beam" in message, message


# A red team's 6/6: every case's beam was as wide as the vocabulary, where a beam search finds what searching every
# sequence finds. The case with a beam of 2 (judged against the course's beam search) tells them apart.
EVERY_SEQUENCE = '''
def beam_search(model, src, beam_size, max_len, bos_id, eos_id, pad_id, length_penalty=1.0):
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1]
            mask = (s != pad_id)[:, None, None, :]
            memory = model.encode(s, mask)
            live, best = [([bos_id], 0.0)], None
            for t in range(1, max_len + 1):
                grown = []
                for tokens, score in live:
                    causal = torch.ones(len(tokens), len(tokens), dtype=torch.bool).tril()
                    logp = torch.log_softmax(model.decode(torch.tensor([tokens]), memory, causal, mask)[0, -1].double(), -1)
                    for v in range(logp.numel()):
                        if v in (pad_id, bos_id):
                            continue
                        cand = (tokens + [v], score + float(logp[v]))
                        if v == eos_id or t == max_len:
                            normed = cand[1] / t ** length_penalty
                            best = max(best, (normed, cand[0])) if best else (normed, cand[0])
                        else:
                            grown.append(cand)
                live = grown if BEAM is None else sorted(grown, key=lambda c: -c[1])[:BEAM]
            rows.append(best[1])
    L = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
'''


@pytest.mark.parametrize("width", ["None", "model.tgt_embed.size(0) if hasattr(model, 'tgt_embed') else 5"],
                         ids=["every sequence", "a beam as wide as the vocabulary, whatever beam_size says"])
def test_searching_more_than_the_beam_is_not_a_beam_search(width):
    impl = _build(EVERY_SEQUENCE.replace("BEAM", width).replace(f"{width} is None", "False")
                  if width != "None" else EVERY_SEQUENCE.replace("BEAM", "None"), "beam_search")
    with pytest.raises(CheckFailed, match="a beam of 2"):
        check_exercise(_exercise("beam_search"), impl)


# A reviewer's correct decoders that the masked tiny model failed: each gives the course's greedy output on the real
# Seq2SeqTransformer too.
GREEDY_TRIMMED_SOURCE = '''
def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            s = src[b:b + 1][:, src[b] != pad_id]            # the padding cut off: no mask needed
            memory = model.encode(s, None)
            ys = [bos_id]
            for _ in range(max_len):
                causal = torch.ones(len(ys), len(ys), dtype=torch.bool).tril()
                ys.append(int(model.decode(torch.tensor([ys]), memory, causal, None)[0, -1].argmax()))
                if ys[-1] == eos_id:
                    break
            rows.append(ys)
    L = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (L - len(r)) for r in rows])
'''

GREEDY_QUERY_AND_KEY_MASK = '''
def greedy_decode(model, src, max_len, bos_id, eos_id, pad_id):
    with torch.no_grad():
        keep = src != pad_id
        memory = model.encode(src, keep[:, None, :, None] & keep[:, None, None, :])   # [B, 1, S, S]
        ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
        done = torch.zeros(src.size(0), dtype=torch.bool)
        for _ in range(max_len):
            T = ys.size(1)
            logits = model.decode(ys, memory, torch.ones(T, T, dtype=torch.bool).tril(), keep[:, None, None, :])
            nxt = logits[:, -1].argmax(-1).masked_fill(done, pad_id)
            ys = torch.cat([ys, nxt[:, None]], 1)
            done |= nxt == eos_id
            if done.all():
                break
        return ys
'''


@pytest.mark.parametrize("code", [GREEDY_TRIMMED_SOURCE, GREEDY_QUERY_AND_KEY_MASK], ids=["trimmed source", "q&k mask"])
def test_decoders_that_mask_otherwise_but_rightly_pass(code):
    _passes_everything("greedy_decode", _build(code, "greedy_decode"))
