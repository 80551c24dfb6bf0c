"""The lessons' reveal: a guess beside the lesson's value, with the error, and no failure without a guess."""

from __future__ import annotations

import pytest

from simbatch.app.teaching.reveal import NO_GUESS, compare, format_answers, judge, reveal


def test_a_number_is_judged_by_its_error():
    assert judge(4.0, 3.9) == "off by +0.1 (+3%)"
    assert judge("3.9", 3.9) == "exact"  # typed as text, read as a number
    assert judge("1,951", 1951) == "exact"
    assert judge(2, 0) == "off by +2"  # no ratio to a zero
    assert judge("fast", 3.9) == "the answer is a number"


def test_words_are_judged_by_naming_the_answer():
    assert judge("Worse", "worse") == "right"
    assert judge("a bit worse, I think", "worse") == "right"
    assert judge("better", "worse") == "not what the run says"
    assert judge("random > round_robin", "random > round_robin") == "right"


def test_a_range_is_judged_by_falling_in_it():
    assert judge(1000, (800, 1200)) == "inside the range"
    assert judge(700, (800, 1200)) == "off by -100 (below the range)"
    assert judge(1500, (800, 1200)) == "off by +300 (above the range)"
    assert judge("many", (800, 1200)) == "the answer is a number"


def test_no_guess_and_no_value_fail_nothing():
    assert judge(None, 3.9) == NO_GUESS
    assert judge(None, (1, 2)) == NO_GUESS
    assert judge(5, float("nan")).startswith("not computed in this run")


def test_reveal_prints_every_answered_question_in_order(capsys):
    guesses = {"mu (req/s)": 4, "queue growth (req/s)": None, "better / worse": "worse"}
    reveal(guesses, {"better / worse": "better", "mu (req/s)": 3.901})
    lines = capsys.readouterr().out.splitlines()
    assert "your guess" in lines[0] and "this lesson" in lines[0]
    assert lines[1].startswith("better / worse") and lines[1].endswith("not what the run says")
    assert lines[2].split()[:4] == ["mu", "(req/s)", "4", "3.901"]


def test_values_are_shown_at_a_readable_precision():
    (answer,) = compare({"p99 TTFT (ms)": None}, {"p99 TTFT (ms)": 16_315.15})
    assert "16,315" in format_answers([answer])
    (answer,) = compare({"range": 900}, {"range": (800, 1200)})
    assert "800 to 1,200" in format_answers([answer])


def test_a_key_the_prediction_does_not_ask_is_refused():
    with pytest.raises(KeyError, match="'mu' is not a question of my_prediction"):
        compare({"mu (req/s)": None}, {"mu": 3.9})
