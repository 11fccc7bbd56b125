"""`attn-course translate`: the shipped model on a reader's own sentence, and the honest note on
words the model saw rarely or never (those its BPE vocabulary spells in pieces)."""
from __future__ import annotations

import pytest
import torch

from attention_course import bpe
from attention_course.checkpoints import models_dir
from attention_course.vocabulary_coverage import FAR_SHARE, coverage, coverage_note
from course_tools import cli

RUNNING_EXAMPLE = "My favourite fruit is apple."  # notebook 01's sentence: not a photo caption
CAPTION = "A man is riding a bicycle."


@pytest.fixture(scope="module")
def tok():
    return bpe.load(models_dir() / "gpu.en-de")


def test_a_caption_is_all_whole_words_and_gets_no_note(tok):
    cov = coverage(tok, CAPTION)
    assert cov.words == ("A", "man", "is", "riding", "a", "bicycle")  # the full stop is not a word
    assert cov.in_pieces == () and not cov.far
    assert coverage_note(cov, "captions") == ""


def test_the_running_example_is_far_and_names_the_words_in_pieces(tok):
    cov = coverage(tok, RUNNING_EXAMPLE)
    assert cov.words == ("My", "favourite", "fruit", "is", "apple")
    assert [word for word, _ in cov.in_pieces] == ["My", "favourite"]
    assert dict(cov.in_pieces)["favourite"] == ("f", "av", "our", "ite")
    assert cov.share_in_pieces == pytest.approx(2 / 5) and cov.far and 2 / 5 >= FAR_SHARE
    note = coverage_note(cov, "about 29,000 captions of photos, Multi30k")
    assert note.startswith("2 of 5 words are not in the model's vocabulary as whole words")
    assert "favourite (f av our ite)" in note and "far from what the model learned from" in note


def test_one_rare_word_is_named_without_calling_the_sentence_far(tok):
    cov = coverage(tok, "A man with a xylophone walks down the street.")
    assert [word for word, _ in cov.in_pieces] == ["xylophone"] and not cov.far
    note = coverage_note(cov, "captions")
    assert "xylophone" in note and "far from" not in note


def test_characters_the_vocabulary_lacks_are_shown_as_written_not_as_unk(tok):
    """The note quoted the tokenizer's <unk> where the reader had written Ñ; words and pieces come from the
    reader's own text, and characters with no token at all are named."""
    cov = coverage(tok, "A man plays the ukulele near a Ñandú 🎸.")
    assert ("Ñandú", ("Ñ", "and", "ú")) in cov.in_pieces and set(cov.unknown) == {"Ñ", "ú", "🎸"}, cov
    note = coverage_note(cov, "captions")
    assert "<unk>" not in note and "ukulele (uk ule le)" in note and "no token at all for Ñ, ú, 🎸" in note, note


def test_an_emoji_in_a_familiar_sentence_is_named(tok):
    """A reader: every word whole, so no note at all, while the model wrote "mit Säge" (with a saw) for the dog emoji."""
    cov = coverage(tok, "A dog \U0001F436 runs.")
    assert cov.in_pieces == () and cov.unknown == ("\U0001F436",), cov
    note = coverage_note(cov, "captions")
    assert note.startswith("The model has no token at all for \U0001F436") and "mean nothing" in note, note


def test_a_sentence_that_starts_with_a_letter_the_vocabulary_lacks_quotes_it_once(tok):
    """At the very start the tokenizer gives a bare word-start mark the same offsets as the <unk> after it: the note
    said "Ñandú (Ñ Ñ and ú)", and a lone "Ñ" was a word in pieces, "Ñ (Ñ Ñ)"."""
    assert coverage(tok, "Ñandú.").in_pieces == (("Ñandú", ("Ñ", "and", "ú")),)
    alone = coverage(tok, "Ñ is a letter.")
    assert "Ñ" not in dict(alone.in_pieces) and alone.unknown == ("Ñ",), alone


def test_translate_prints_one_line_per_sentence_and_the_note_on_stderr(capsys):
    assert cli.main(["translate", CAPTION, RUNNING_EXAMPLE]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines == ["Ein Mann fährt Fahrrad.", "Mavidstern Obst-Wourt ist mit dem Apfel."], out  # as the README shows
    assert err.count("note: ") == 1 and "favourite (f av our ite)" in err, err


def test_translate_reads_standard_input_and_decodes_greedily(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("Two dogs play in the snow.\n\n"))
    assert cli.main(["translate", "--greedy"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["Zwei Hunde spielen im Schnee."], out
    assert err == ""


@pytest.mark.parametrize("argv, says", [
    (["translate", "--model", "nope.en-de", "x"], "is 'nope.en-de' a shipped model? Shipped: cpu-hour.en-de, gpu.en-de"),
    (["translate", "--beam", "0", "x"], "--beam 0: the beam size is 1 (greedy) or more"),
    (["translate", "--models", "/no/such/folder", "x"], "/no/such/folder holds no shipped models (no SHA256SUMS"),
    (["translate", "--device", "gpu", "x"], "--device gpu: not a device PyTorch knows; give cpu, cuda or cuda:N"),
    pytest.param(["translate", "--device", "cuda", "x"], "--device cuda: this PyTorch sees no CUDA GPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")),
])
def test_bad_arguments_say_what_to_do(capsys, argv, says):
    assert cli.main(argv) == 2
    assert says in capsys.readouterr().err


def test_nothing_to_translate_says_how(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["translate"]) == 2
    assert 'attn-course translate "A man is riding a bicycle."' in capsys.readouterr().err


def _never_ending_model(vocab: int, positions: int):
    """A small untrained translator that never says <eos>: every translation runs to the length allowance."""
    from attention_course.model import ModelConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    model = Seq2SeqTransformer(ModelConfig(vocab, vocab, d_model=16, num_heads=2, num_encoder_layers=1,
                                           num_decoder_layers=1, d_ff=32, max_len=positions))
    with torch.no_grad():
        model.generator.bias[bpe.EOS_ID] = -1e9
    return model.eval()


@pytest.mark.parametrize("beam, cached", [(1, True), (1, False), (3, True), (3, False)])
def test_a_text_longer_than_the_model_is_cut_and_translated_without_a_crash(tok, beam, cached):
    """The allowance (1.2 x the source + 10 tokens) ran past the positional table: IndexError."""
    from attention_course.evaluation import source_limit, translate_texts

    model = _never_ending_model(tok.get_vocab_size(), positions=24)
    long_text = " ".join(f"{i} dogs," for i in range(40))
    assert len(bpe.encode(tok, [long_text], bos=False, eos=True)[0]) > source_limit(model)
    (out,) = translate_texts(model, tok, [long_text], beam_size=beam, cached=cached)
    assert isinstance(out, str) and out


def test_translate_says_when_only_the_beginning_was_translated(capsys):
    long_text = " ".join(f"{i} dogs," for i in range(300))
    assert cli.main(["translate", "--greedy", long_text]) == 0
    err = capsys.readouterr().err
    assert "the model reads at most 245" in err and "only its beginning was translated" in err, err
