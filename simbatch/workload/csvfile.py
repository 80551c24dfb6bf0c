"""Reading the CSV and JSON-lines files a workload replays, with errors that point at the offending line.

Traces and empirical length columns are data the user brings, so a bad row must be reported as
``file:line`` with the value found and what was expected, not as a numpy traceback halfway
through a run. Everything is read as text first and converted here, so the raw value can be quoted
(a JSON-lines file's scalar fields too: :func:`read_jsonl`).

Line numbers assume one record per line (the header is line 1), which holds for the numeric CSVs
these files are; a quoted field spanning several lines would shift the numbers after it.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import json
import lzma
import math
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pandas as pd

from simbatch.config.problems import Problem, ScenarioError

_HEADER_LINE = 1  # CSV line numbers are 1-based and the header takes the first
_CHUNK = 1 << 22
_COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
MAX_LENGTH_FILE_BYTES = 1 << 30
"""The largest length file (``dist: empirical``) read, decompressed: a sample of lengths, not a census."""


@contextlib.contextmanager
def open_decompressed(path: Path) -> Iterator[BinaryIO]:
    """The file's bytes as pandas reads them: decompressed by suffix (.gz, .bz2, .xz; a .zip's one member)."""
    opener = _COMPRESSED.get(path.suffix.lower())
    if opener is not None:
        with opener(path, "rb") as f:
            yield f
    elif path.suffix.lower() == ".zip":
        with zipfile.ZipFile(path) as archive, archive.open(archive.namelist()[0]) as f:
            yield f
    else:
        with open(path, "rb") as f:
            yield f


def text_size(path: Path, cap_bytes: float) -> tuple[float, float]:
    """(bytes, newlines) of the file's text once decompressed, read a chunk at a time and never past
    ``cap_bytes`` (then both are infinite): what reading it will cost, whatever its size on disk.
    A file that cannot be read or decompressed counts as empty; reading it reports why, with its name."""
    size = lines = 0
    try:
        with open_decompressed(path) as f:
            while chunk := f.read(_CHUNK):
                size += len(chunk)
                lines += chunk.count(b"\n")
                if size > cap_bytes:
                    return math.inf, math.inf
    except (OSError, EOFError, ValueError, IndexError, zipfile.BadZipFile, lzma.LZMAError):
        return 0, 0
    return size, lines


def fail(path: Path, where: str, message: str, line: int | None = None) -> ScenarioError:
    """The error for one problem in a data file (the caller raises it, so tracebacks end at the cause)."""
    return ScenarioError([Problem(source=str(path), path=where, message=message, line=line, col=None)])


def read_table(path: Path, where: str, max_bytes: float | None = None) -> pd.DataFrame:
    """The file as a frame of strings, indexed by line number, blank lines dropped.

    ``where`` is the scenario field that named the file, used in every error; ``max_bytes`` refuses a file
    larger than that once decompressed, before it is parsed.
    """
    if max_bytes is not None and text_size(path, max_bytes)[0] > max_bytes:
        raise fail(path, where, f"larger than {max_bytes:,.0f} bytes once decompressed; keep a sample of its rows")
    try:
        # na_filter=False keeps empty fields as "" so they are reported as empty, not as "nan".
        frame = pd.read_csv(path, dtype=str, na_filter=False, skip_blank_lines=False)
    except pd.errors.EmptyDataError:
        raise fail(path, where, "the file is empty; expected a header line and at least one data row") from None
    except pd.errors.ParserError as exc:
        found = re.search(r"line (\d+)", str(exc))
        raise fail(path, where, f"not a well-formed CSV file: {str(exc).strip()}",
                   int(found.group(1)) if found else None) from None
    except UnicodeDecodeError as exc:
        raise fail(path, where, f"not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not "
                                "UTF-8); is this the trace CSV file?") from None
    except OSError as exc:
        raise fail(path, where, f"cannot read the file: {exc.strerror or exc}") from None
    # Blank lines were kept as rows so that the index still counts file lines; drop them now.
    frame.index = pd.RangeIndex(_HEADER_LINE + 1, _HEADER_LINE + 1 + len(frame))
    frame = frame[(frame != "").any(axis=1)]
    if frame.empty:
        raise fail(path, where, "the file has a header but no data rows; add at least one row",
                   _HEADER_LINE)
    return frame


def read_jsonl(path: Path, where: str, list_fields: list[str]) -> tuple[pd.DataFrame, dict[str, list]]:
    """A JSON-lines file (one object per line, as Mooncake's traces) as :func:`read_table` gives a CSV:
    a frame of the scalar fields as strings indexed by line number (the first line is 1), blank lines
    skipped; and the values of each of ``list_fields``, one per row."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(path, where, f"not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} is not "
                                "UTF-8); is this the trace file?") from None
    except OSError as exc:
        raise fail(path, where, f"cannot read the file: {exc.strerror or exc}") from None
    rows, lines, lists = [], [], {f: [] for f in list_fields}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise fail(path, where, f"not a JSON object on this line ({getattr(exc, 'msg', 'nested too deep')}); "
                                    "a JSON-lines trace has one object per line", number) from None
        if not isinstance(record, dict):
            raise fail(path, where, f"a JSON {type(record).__name__} on this line, expected an object of fields",
                       number)
        for name in list_fields:
            if name not in record:
                raise fail(path, where, f"field {name!r} is missing; every line needs it", number)
            lists[name].append(record[name])
        rows.append({k: "" if v is None else str(v) for k, v in record.items()
                     if not isinstance(v, list | dict)})
        lines.append(number)
    if not rows:
        raise fail(path, where, "the file has no JSON lines; expected one object per request")
    frame = pd.DataFrame(rows, index=pd.Index(lines), dtype=str).fillna("")
    return frame, lists


_COLUMN_NAME = re.compile(r"[\w .()/%#:-]{1,64}")
_MAX_QUOTED = 40  # characters of a bad cell quoted in an error: enough to recognise it, no more


def _looks_like_header(columns) -> bool:
    """Whether a first line reads as column names (so quoting it helps), not as someone's data."""
    names = [str(c) for c in columns]
    return len(names) >= 2 and all(_COLUMN_NAME.fullmatch(n) and not n.strip().replace(".", "").isdigit()
                                   for n in names)


def column(frame: pd.DataFrame, name: str, path: Path, where: str) -> pd.Series:
    """One column by name; ``where`` is the scenario field that chose the name.

    The header is quoted only when it looks like one: a file that is not a trace at all (a
    password file, a binary) must not have its first line echoed to the terminal or a log.
    """
    if name not in frame.columns:
        if not _looks_like_header(frame.columns):
            raise fail(path, where, f"column {name!r} not found, and the first line is not a header of column "
                                    f"names ({len(frame.columns)} field(s)); is this the trace CSV file?",
                       _HEADER_LINE)
        found = ", ".join(repr(str(c)) for c in frame.columns)
        raise fail(path, where, f"column {name!r} not found (the header has {found}); "
                                f"set {where} to one of those", _HEADER_LINE)
    return frame[name]


def first_bad(raw: pd.Series, bad: np.ndarray) -> tuple[int, str, str]:
    """(line, raw value, " (and N more rows like it)") of the first row flagged in ``bad``.

    One example per error: a column with ten thousand bad rows needs one line quoted, not ten thousand.
    """
    flagged = np.flatnonzero(bad)
    more = len(flagged) - 1
    tail = f" (and {more} more row{'s' if more > 1 else ''} like it)" if more else ""
    value = str(raw.iloc[flagged[0]])
    return int(raw.index[flagged[0]]), value if len(value) <= _MAX_QUOTED else value[:_MAX_QUOTED] + "…", tail


def whole_numbers(raw: pd.Series, path: Path, where: str, fix: str, minimum: int | None = None,
                  what: str = "a whole number") -> np.ndarray:
    """A text column as int64, every value a whole number (and at least ``minimum``, if given).

    ``fix`` ends the message, telling the user what to do about a bad row.
    """
    numbers = pd.to_numeric(raw.str.strip(), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    # "12.0" and "1e3" are whole numbers and pass; "12.5", "", "inf" and "n/a" do not.
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(numbers) | (numbers != np.floor(numbers)) | (np.abs(numbers) > 2**53)
        if minimum is not None:
            bad |= numbers < minimum
    if bad.any():
        line, value, tail = first_bad(raw, bad)
        bound = "" if minimum is None else f" >= {minimum}"
        raise fail(path, where, f"column {raw.name!r} has {value!r}, expected {what}{bound}{tail}; {fix}", line)
    return numbers.astype(np.int64)


def positive_ints(raw: pd.Series, path: Path, where: str, fix: str) -> np.ndarray:
    """A text column as int64 token counts, every one a whole number >= 1."""
    return whole_numbers(raw, path, where, fix, minimum=1, what="a whole number of tokens")
