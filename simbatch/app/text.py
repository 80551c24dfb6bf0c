"""Names from the user on their way to a terminal or a spreadsheet: made harmless, kept recognisable.

A scenario, tenant or class name is a label the user typed, and it reaches two places that
interpret text: a terminal (an ESC byte starts a control sequence; a newline breaks a table) and a
spreadsheet opening ``requests.csv`` (a cell starting with ``=`` is a live formula, the "CSV
injection" OWASP warns about). Both are neutralised here, in one place.
"""

from __future__ import annotations

import math
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""First characters that make a spreadsheet read a cell as a formula (OWASP, "CSV Injection")."""


def printable(text: object, limit: int | None = None) -> str:
    """``text`` with every control, format or lone surrogate character escaped (``\\x1b``, ``\\n``, ``\\u202e``),
    cut to ``limit`` characters with an ellipsis."""
    out = "".join(repr(ch)[1:-1] if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp") else ch
                  for ch in str(text))
    return out if limit is None or len(out) <= limit else out[: limit - 1] + "…"


def number(value: float, digits: int = 4) -> str:
    """``digits`` significant digits, but whole numbers from there on, with separators (12,340 rather
    than 1.234e+04; with 2 digits, 230 rather than 2.3e+02)."""
    return f"{value:,.0f}" if abs(value) >= min(1000, 10 ** (digits - 1)) else f"{value:.{digits}g}"


def mean_ci(mean: float, ci: float, ci_digits: int = 4) -> str:
    """``12.3 ± 0.4``: a mean and its confidence half-width (``-`` for no mean, no ``±`` without a width)."""
    if math.isnan(mean):
        return "-"
    return number(mean) if math.isnan(ci) else f"{number(mean)} ± {number(ci, ci_digits)}"


def spreadsheet_safe(value: str) -> str:
    """A text cell a spreadsheet shows as text: a leading formula character gets a ``'`` before it."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def spreadsheet_safe_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every text cell (object, string and categorical columns) made spreadsheet-safe,
    for writing as CSV. Numbers are left alone: -3 is a number to a spreadsheet, not a formula."""
    import pandas as pd  # only when writing frames: printing text must stay light

    out = frame
    for name in frame.columns:
        column = frame[name]
        if not (isinstance(column.dtype, pd.CategoricalDtype) or column.dtype == object
                or pd.api.types.is_string_dtype(column.dtype)):
            continue
        fixed = column.astype(object).map(lambda c: spreadsheet_safe(c) if isinstance(c, str) else c)
        if out is frame:
            out = frame.copy()
        out[name] = fixed
    return out
