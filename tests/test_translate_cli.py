"""`attn-course translate`: the shipped model on a reader's own sentence, and the honest note on
words the model saw rarely or never (those its BPE vocabulary spells in pieces)."""
from __future__ import annotations

import pytest

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
])
def test_bad_arguments_say_what_to_do(capsys, argv, says):
    assert cli.main(argv) == 2
    assert says in capsys.readouterr().err


def test_nothing_to_translate_says_how(capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["translate"]) == 2
    assert 'attn-course translate "A man is riding a bicycle."' in capsys.readouterr().err
