"""The timing helpers behind notebooks 05 and 07's measurements: interleaved rounds, medians, ratios.
No wall-clock assertion: the calls are counted and ordered, and fake clocks give exact medians."""
from __future__ import annotations

import types

import pytest

from attention_course import measure


def test_calls_are_interleaved_round_by_round_after_a_warm_up():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    measure.interleaved_seconds(calls, repeat=3)
    assert order == list("abc") * 4  # warm-up round, then 3 rounds, each call once per round, in turn


def test_the_median_of_the_timed_rounds_is_reported(monkeypatch):
    clock = iter([0, 1,  0, 5,  0, 2])  # the warm-up round is not timed; then 1, 5 and 2 s
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))  # only measure's clock
    assert measure.interleaved_seconds({"x": lambda: None}, repeat=3) == {"x": 2}


def test_ratios_divide_each_value_by_the_one_before():
    assert measure.ratios([1.0, 4.0, 16.0, 8.0]) == pytest.approx([4.0, 4.0, 0.5])
    assert measure.ratios([3.0]) == []
