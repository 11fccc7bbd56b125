"""grades.csv's note for an exercise refused for academic honesty: the reason, shortened at a word."""
from __future__ import annotations

from autograder.grade import refusal_notes
from autograder.outcomes import Verdict


def test_a_long_reason_is_shortened_at_a_word_not_mid_word():
    why = ("it switches PyTorch's dispatch modes off (_pop_mode), which is how the grader measures the memory your "
           "online softmax uses: this exercise needs no such thing (where it is measured)")
    verdict = Verdict(False, f"online_softmax_attention: not accepted, because {why}", cause="forbidden")
    [note] = refusal_notes({"test_online_softmax_attention": verdict})
    assert note.startswith("not accepted: online_softmax_attention (it switches PyTorch's dispatch modes off")
    assert note.endswith(" ...)") and "(w)" not in note, note  # it ended "no such thing (w)"
    assert len(note) < 220
