"""Parameter grids: from ``--param key=spec`` to the list of points a sweep runs.

A spec is a comma-separated list of items, and each item is one of

- a value, read as YAML exactly like ``--set`` reads it: ``4``, ``0.5``, ``continuous``, ``inf``;
- a linear range ``start:stop:step``, from ``start`` up to ``stop`` included when it falls on the
  grid: ``1:40:2`` is 1, 3, ..., 39 and ``0.5:2:0.5`` is 0.5, 1, 1.5, 2;
- a log range ``log:start:stop:n``, ``n`` points spaced evenly in log from ``start`` to ``stop``
  (both included): ``log:1:64:7`` is 1, 2, 4, 8, 16, 32, 64.

Ranges whose bounds (and step) are all integers give integers, because counts such as
``batching.max_num_seqs`` must be integers; a log range over integers is rounded, and a point that
rounds onto its neighbour is dropped, so ``log:1:10:10`` has fewer than 10 points. Items combine:
``1,2,log:4:64:5``. The grid is the Cartesian product of the parameters, the last one varying
fastest, so a point's position in the grid, and in ``summary.csv``, follows the command line.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from simbatch.inputs.loading import ScenarioError, parse_override

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_LINEAR = re.compile(rf"^({_NUMBER}):({_NUMBER}):({_NUMBER})$")
_LOG = re.compile(rf"^log:({_NUMBER}):({_NUMBER}):(\d+)$")
# Enough digits for any value typed on a command line, few enough to hide 0.1 + 0.2 = 0.30000000000000004.
_SIGNIFICANT = 12


class GridError(ValueError):
    """A ``--param`` that cannot be expanded; the message names the parameter and how to fix it."""


@dataclass(frozen=True)
class Param:
    """One swept parameter: a dotted scenario key and the values it takes, in order."""

    key: str
    values: tuple[Any, ...]


def _number(text: str) -> int | float:
    return int(text) if re.fullmatch(r"[-+]?\d+", text) else float(text)


def _tidy(x: float) -> float:
    return float(f"{x:.{_SIGNIFICANT}g}")


MAX_VALUES = 100_000
"""Values one range may expand to; more is a typo, and listing them would take minutes."""


def _check_count(count: int) -> None:
    if count > MAX_VALUES:
        raise ValueError(f"{count:,} values, more than {MAX_VALUES:,}; use a larger step or a log range "
                         "(log:start:stop:n)")


def linear_range(start: int | float, stop: int | float, step: int | float) -> list[int | float]:
    """``start, start + step, ...`` up to ``stop`` (included when it falls on the grid)."""
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    if stop < start:
        raise ValueError(f"stop ({stop}) is below start ({start})")
    # The small slack keeps a stop that is on the grid but off by float rounding, as in 0.1:0.3:0.1.
    count = math.floor((stop - start) / step + 1e-9) + 1
    _check_count(count)
    if all(isinstance(v, int) for v in (start, stop, step)):
        return [start + i * step for i in range(count)]
    return [_tidy(start + i * step) for i in range(count)]


def log_range(start: int | float, stop: int | float, n: int) -> list[int | float]:
    """``n`` points evenly spaced in log from ``start`` to ``stop`` (integers: rounded, deduplicated)."""
    if n < 2:
        raise ValueError(f"a log range needs at least 2 points, got {n}")
    if start <= 0 or stop <= start:
        raise ValueError(f"a log range needs 0 < start < stop, got {start} and {stop}")
    _check_count(n)
    ratio = (stop / start) ** (1 / (n - 1))
    points = [start * ratio**i for i in range(n - 1)] + [stop]
    if isinstance(start, int) and isinstance(stop, int):
        return list(dict.fromkeys(round(p) for p in points))
    return [_tidy(p) for p in points]


def _items(spec: str) -> list[str]:
    """Split on commas outside brackets: a YAML value such as ``{dist: fixed, value: 8}`` stays whole."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            items.append(spec[start:i].strip())
            start = i + 1
    return items + [spec[start:].strip()]


def parse_values(key: str, spec: str) -> tuple[Any, ...]:
    """The values of one parameter's spec (see the module docstring)."""
    values: list[Any] = []
    for item in _items(spec):
        if not item:
            raise GridError(f"--param {key}={spec}: empty item; separate values with one comma, e.g. 1,2,4")
        try:
            if m := _LOG.match(item):
                values += log_range(_number(m[1]), _number(m[2]), int(m[3]))
            elif m := _LINEAR.match(item):
                values += linear_range(*(_number(g) for g in m.groups()))
            elif item.startswith("log:"):
                raise ValueError("expected log:start:stop:n with a whole number of points, e.g. log:1:64:7")
            elif re.fullmatch(rf"{_NUMBER}(?::{_NUMBER})+", item):
                # YAML would read 1:10 as the base-60 number 70; nobody means that.
                raise ValueError("a range is start:stop:step, e.g. 1:10:1")
            else:
                values.append(parse_override(f"{key}={item}")[1])
        except ScenarioError as exc:
            raise GridError(f"--param {key}={spec}: {exc.problems[0].message}") from None
        except ValueError as exc:
            raise GridError(f"--param {key}={spec}: {item!r}: {exc}") from None
    return tuple(values)


def parse_param(text: str) -> Param:
    """``workload.arrival.rate=1:8:1`` -> Param("workload.arrival.rate", (1, 2, ..., 8))."""
    key, sep, spec = text.partition("=")
    key = key.strip()
    if not sep or not key or not spec.strip():
        raise GridError(f"--param {text!r}: expected dotted.key=values, e.g. workload.arrival.rate=1,2,4")
    return Param(key, parse_values(key, spec))


def parse_params(texts: list[str], reserved: dict[str, str] | None = None) -> list[Param]:
    """Every ``--param``; a key given twice, or one the command sets itself (``reserved``), is an error."""
    params = [parse_param(t) for t in texts]
    seen: set[str] = set()
    for p in params:
        if p.key in seen:
            raise GridError(f"--param {p.key} is given twice; list all its values in one --param")
        seen.add(p.key)
        if reserved and p.key in reserved:
            raise GridError(f"--param {p.key}: {reserved[p.key]}")
    return params


def expand(params: list[Param]) -> list[dict[str, Any]]:
    """The Cartesian product, one ``{key: value}`` per point; one empty point when nothing is swept."""
    return [dict(zip([p.key for p in params], combo, strict=True))
            for combo in itertools.product(*(p.values for p in params))]


def format_value(value: Any) -> str:
    """A value as YAML text that ``--set`` parsing reads back to the same value (floats exactly)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


def overrides_for(point: dict[str, Any]) -> list[str]:
    """A point as ``load_scenario`` overrides: ``["workload.arrival.rate=4", ...]``."""
    return [f"{key}={format_value(value)}" for key, value in point.items()]
