"""What the validation checks found, row by row, and ``docs/validation.md`` written from it.

Each test records its comparisons through a :class:`Checker`; the rows of the whole session go to
one :class:`Ledger`, which the full mode renders as a Markdown table followed by each check's
formula and source, taken from the check module's and the test's own docstrings, so the report
and the code cannot drift apart.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import replicate
from replicate import EXACT_REL, Estimate, seeds_label


@dataclass(frozen=True)
class Row:
    module: str
    test: str
    quantity: str
    theory: float
    mean: float
    half_width: float
    passed: bool
    replications: int
    seeds: str
    kind: str  # "CI", "paired CI", "bound", "exact"

    @property
    def rel_error(self) -> float:
        return abs(self.mean - self.theory) / abs(self.theory) if self.theory else abs(self.mean)


@dataclass
class Ledger:
    """Every row of the session, and the Little's-law errors of every simulation run."""

    mode: str
    rows: list[Row] = field(default_factory=list)
    modules: dict[str, ModuleType] = field(default_factory=dict)
    tests: dict[str, str] = field(default_factory=dict)  # test function name -> docstring, per module key
    little_runs: int = 0
    little_max_rel: dict[str, float] = field(default_factory=lambda: {"L": 0.0, "Lq": 0.0})
    partial: bool = False  # some validation tests were not run: the report would be incomplete
    failed_tests: list[str] = field(default_factory=list)  # failed or errored, rows recorded or not
    sections: dict[str, list[str]] = field(default_factory=dict)  # module -> Markdown blocks a test wrote

    def little(self, name: str, rel_error: float) -> None:
        self.little_max_rel[name] = max(self.little_max_rel[name], rel_error)


class Checker:
    """One test's comparisons. Rows that fail are collected, and the test fails after it returns."""

    def __init__(self, ledger: Ledger, module: ModuleType, test: str, function):
        self.ledger, self.module, self.test = ledger, module, test
        key = module.__name__
        ledger.modules[key] = module
        ledger.tests[f"{key}::{function.__name__}"] = inspect.getdoc(function) or ""
        self.failures: list[str] = []

    def _add(self, quantity: str, theory: float, mean: float, half_width: float, passed: bool,
             replications: int, seeds: str, kind: str) -> bool:
        row = Row(self.module.__name__, self.test, quantity, theory, mean, half_width, passed, replications,
                  seeds, kind)
        self.ledger.rows.append(row)
        if not passed:
            self.failures.append(f"{quantity}: theory {theory:.6g}, simulated {mean:.6g} +- {half_width:.3g} "
                                 f"({kind}, {replications} replications, seeds {seeds})")
        return passed

    def ci(self, quantity: str, theory: float, samples, seeds) -> Estimate:
        """Theory must lie within the replications' t interval."""
        est = Estimate.of(samples)
        self._add(quantity, theory, est.mean, est.half_width, est.contains(theory), est.replications,
                  seeds_label(seeds), "CI")
        return est

    def paired(self, quantity: str, theory_samples, samples, seeds) -> Estimate:
        """Theory computed per replication from that replication's own measurements: the interval of
        the paired differences must contain 0."""
        theory_samples, samples = list(theory_samples), list(samples)
        diff = Estimate.of(s - t for s, t in zip(samples, theory_samples, strict=True))
        theory = sum(theory_samples) / len(theory_samples)
        self._add(quantity, theory, theory + diff.mean, diff.half_width, diff.contains(0.0),
                  diff.replications, seeds_label(seeds), "paired CI")
        return diff

    def upper_bound(self, quantity: str, bound: float, samples, seeds) -> Estimate:
        """The simulated mean must not exceed the bound by more than its half-width."""
        est = Estimate.of(samples)
        self._add(quantity, bound, est.mean, est.half_width, est.mean - est.half_width <= bound,
                  est.replications, seeds_label(seeds), "bound")
        return est

    def table(self, markdown: str) -> None:
        """A Markdown block for this check's section of the report (an account that is not a row of
        theory against simulation, such as a comparison with another simulator)."""
        self.ledger.sections.setdefault(self.module.__name__, []).append(markdown)

    def exact(self, quantity: str, expected: float, measured: float, seeds=(0,)) -> bool:
        """A deterministic quantity: equal to rounding (relative 1e-9). ``seeds=()`` for no simulation."""
        ok = math.isclose(measured, expected, rel_tol=EXACT_REL, abs_tol=EXACT_REL * 1e-3)
        return self._add(quantity, expected, measured, 0.0, ok, len(list(seeds)), seeds_label(seeds), "exact")


# --------------------------------------------------------------------------- the document
def _title(module: ModuleType) -> str:
    return (inspect.getdoc(module) or module.__name__).splitlines()[0]


def _order(title: str) -> tuple:
    """Numbered sections by number (10 after 9), then the others by title."""
    number = title.split(":", 1)[0]
    return (0, int(number), title) if number.isdigit() else (1, 0, title)


def _body(doc: str) -> str:
    return "\n".join(doc.splitlines()[1:]).strip()


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def row_line(r: Row) -> str:
    """One row as plain text, for the terminal."""
    return (f"{'pass' if r.passed else 'FAIL'}  {r.test}  {r.quantity}: theory {_fmt(r.theory)}, simulated "
            f"{_fmt(r.mean)} +- {r.half_width:.3g} (rel. error {r.rel_error:.2e}, {r.kind}, R={r.replications or '-'})")


def render(ledger: Ledger) -> str:
    modules = sorted(ledger.modules.values(), key=lambda m: _order(_title(m)))
    titles = {m.__name__: _title(m) for m in modules}
    rows = sorted(ledger.rows, key=lambda r: _order(titles[r.module]))
    failed = sum(not r.passed for r in rows)
    lines = [
        "# Validation: simbatch against queueing theory",
        "",
        "Generated by `make validate` (`SIMBATCH_VALIDATION=full`) from `tests/validation`; do not edit by "
        "hand. The quick mode of the same checks, `make validate-quick`, runs in CI after `make test`.",
        "",
        "## Method",
        "",
        inspect.getdoc(replicate),
        "",
        f"**{len(rows)} comparisons, {len(rows) - failed} pass, {failed} fail; "
        f"{len(ledger.failed_tests)} tests failed or errored{': ' if ledger.failed_tests else ''}"
        f"{', '.join(f'`{t}`' for t in ledger.failed_tests)}.** "
        "Half-width: t_{R-1, 0.999} x SE for statistical rows, 0 for exact ones "
        f"(equal to a relative {EXACT_REL:g}). Little's law is checked on every one of the "
        f"{ledger.little_runs} simulation runs of the suite: the largest relative errors were "
        f"{ledger.little_max_rel['L']:.1e} for L = lambda W and {ledger.little_max_rel['Lq']:.1e} "
        "for Lq = lambda Wq.",
        "",
        "| Check | Test | Quantity | Theory | Simulated (mean +- half-width) | Rel. error | Kind | Result "
        "| R | Seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        number = titles[r.module].split(":")[0]
        lines.append(f"| {number} | `{r.test}` | {r.quantity} | {_fmt(r.theory)} | {_fmt(r.mean)} +- "
                     f"{r.half_width:.3g} | {r.rel_error:.2e} | {r.kind} | {'pass' if r.passed else '**FAIL**'} "
                     f"| {r.replications or '-'} | {r.seeds} |")
    for module in modules:
        lines += ["", f"## {titles[module.__name__]}", "", _body(inspect.getdoc(module) or "")]
        for key, doc in ledger.tests.items():
            if key.startswith(module.__name__ + "::"):
                lines += ["", f"**`{key.split('::')[1]}`**: {doc}"]
        for block in ledger.sections.get(module.__name__, []):
            lines += ["", block]
    return "\n".join(lines) + "\n"


def write(ledger: Ledger, path: Path) -> None:
    """Write the report atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(render(ledger), encoding="utf-8")
    os.replace(tmp, path)
    print(f"\nwrote {path}", file=sys.stderr)
