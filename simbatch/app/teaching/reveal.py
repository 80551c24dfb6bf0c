"""Predictions that answer back: the learner's guess beside what the run measured.

Every lesson asks for predictions first: a ``my_prediction = {"<what, with unit>": None, ...}`` cell
that the learner fills in before the cell that computes the answer. That cell ends with
``reveal(my_prediction, {"<the same key>": measured, ...})``, which prints one line per answered key:
the guess, the value the lesson computed and how far apart they are. A guess left at None (always so
when CI runs the lessons headless) prints "no guess" and nothing fails.

Numbers are compared by their difference and its ratio to the measured value; a range the lesson
can only bracket, given as ``(low, high)``, by whether the guess falls in it; words ("better",
"worse", "code") by whether the guess names the answer. A key that the prediction does not ask is an
error: a typo would otherwise leave a question silently unanswered.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

NO_GUESS = "no guess (fill in my_prediction above and run again)"


@dataclass(frozen=True)
class Answer:
    """One key of a prediction: what the learner guessed, what the run says, and the verdict."""

    question: str
    guess: object
    actual: object
    verdict: str


def _as_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.replace(",", "").replace("%", "").strip())
        except ValueError:
            return None
    return None


def _words(value: object) -> str:
    text = str(value).lower()
    for mark in "/,;:!?()\"'":
        text = text.replace(mark, " ")
    return " ".join(text.split())


def judge(guess: object, actual: object) -> str:
    """How ``guess`` compares with ``actual``: the error of a number, or whether words match."""
    want = None if isinstance(actual, (tuple, str)) else _as_number(actual)
    if want is not None and math.isnan(want):
        return "not computed in this run (a short run: see the lesson's SMALL switch)"
    if guess is None:
        return NO_GUESS
    if isinstance(actual, tuple):
        low, high = actual
        got = _as_number(guess)
        if got is None:
            return "the answer is a number"
        if low <= got <= high:
            return "inside the range"
        return f"off by {got - low:+.3g} (below the range)" if got < low else f"off by {got - high:+.3g} (above the range)"
    got = _as_number(guess)
    if want is not None and got is not None and math.isfinite(want) and math.isfinite(got):
        diff = got - want
        if want == 0:
            return f"off by {diff:+.3g}"
        return f"off by {diff:+.3g} ({diff / abs(want):+.0%})" if diff else "exact"
    if want is not None and got is None:
        return "the answer is a number"
    truth, said = _words(actual), _words(guess)
    if said == truth or f" {truth} " in f" {said} ":
        return "right"
    return "not what the run says"


def compare(my_prediction: Mapping[str, object], actual: Mapping[str, object]) -> list[Answer]:
    """One :class:`Answer` per key of ``actual``, in its order; each key must be one ``my_prediction`` asks."""
    unknown = [k for k in actual if k not in my_prediction]
    if unknown:
        raise KeyError(f"reveal: {unknown[0]!r} is not a question of my_prediction "
                       f"(it asks {', '.join(repr(k) for k in my_prediction)})")
    return [Answer(k, my_prediction[k], v, judge(my_prediction[k], v)) for k, v in actual.items()]


def _shown(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return " to ".join(_shown(v) for v in value)
    number = _as_number(value) if not isinstance(value, str) else None
    if number is not None:
        return f"{number:,.0f}" if abs(number) >= 1000 else f"{number:.4g}"
    return str(value)


def format_answers(answers: list[Answer]) -> str:
    """The answers as a small table: question, your guess, the lesson's value, the verdict."""
    width = max(len(a.question) for a in answers)
    rows = [f"{'':{width}s}  {'your guess':>12s}  {'this lesson':>12s}"]
    rows += [f"{a.question:{width}s}  {_shown(a.guess):>12s}  {_shown(a.actual):>12s}  {a.verdict}" for a in answers]
    return "\n".join(rows)


def reveal(my_prediction: Mapping[str, object], actual: Mapping[str, object]) -> None:
    """Print the learner's guesses beside the lesson's values (see the module docstring)."""
    print(format_answers(compare(my_prediction, actual)))
