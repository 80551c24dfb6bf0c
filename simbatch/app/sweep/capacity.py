"""Capacity search: the highest arrival rate at which a configuration still meets its SLOs.

For each configuration (each point of the ``--param`` grid; the rate itself is what is searched),
bisection on ``workload.arrival.rate`` between

- a rate that meets the SLOs, found by halving from half the analytic capacity, and
- the analytic capacity ``capacity.stability(...).capacity_requests_per_s``, the rate at which the
  offered load ρ reaches 1 (a full batch at every step). It is never probed: at or above it the waiting
  queue grows for as long as arrivals last, so on a long enough run every latency percentile grows
  past any finite SLO. A finite run can still squeeze under an SLO there, and would report a rate
  that a production server could not hold.

The search stops when the bracket is narrower than ``tolerance`` times its upper end, and reports
its lower end: a rate that was simulated and met the SLOs. It assumes the latencies grow with the
rate, as they do for continuous batching and for dynamic batching with a short queue delay; static
batching that waits for a full batch (``max_wait_ms: null``) is slow at low rates as well, and the
search reports the edge of the range it finds.

**When does an SLO hold?** ``--slo ttft_p99_ms=500`` holds at a rate when the mean over the
replications of the run's p99 TTFT is at most 500 ms. The mean of per-run percentiles is the
estimate ``summary.csv`` reports for the point, so the search and a sweep agree on what a rate
achieves; a bound on the confidence interval instead would make the answer depend on R.

``capacity.csv`` has one row per configuration: its parameters; ``max_rate`` (requests/s), the
highest rate probed that met the SLOs; ``request_goodput`` there; ``capacity_requests_per_s``, the
analytic capacity; ``ratio`` = max_rate / capacity, the share of the device's analytic capacity that
is usable within the SLOs; the SLO metrics at ``max_rate`` (replication means); ``probes``, rates
simulated; ``error``, why a configuration has no answer. ``probes.csv`` has a row per rate simulated
(the SLO metrics there and whether they were met), drawn as ``slo_vs_rate.png``.

SLOs may name any percentile (``ttft_p95_ms``, ``p99.9_itl_ms``): the runs are told to compute it
(``metrics.metric_percentiles``). The default output folder is ``results/<name>/capacity-<YYYYmmdd-HHMMSS>``,
as ``run`` names its own: a new search never collides with another; ``--out`` an earlier one's folder
resumes it.

**Goodput** at the found rate is ``request_goodput``: completed requests per second whose own
latencies meet per-request limits. Those are the scenario's ``slo`` section when it sets one;
otherwise the loosest ``--slo`` limit given for each of TTFT, TPOT and E2E latency.

Replications, common random numbers, the executors and the store are the sweep's (:mod:`.runner`):
every probe is a point with R runs, and a restarted search finds its earlier probes on disk.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simbatch.analysis.capacity import expected_stability
from simbatch.analysis.stats import percentile_word
from simbatch.app.sweep.aggregate import combine, param_cells
from simbatch.app.sweep.plan import (
    SEED_IS_PER_REPLICATION,
    SweepInputError,
    default_out,
    open_store,
    valid_points,
)
from simbatch.app.sweep.runner import Executor, Point, Run, execute, load_point, runs_for
from simbatch.app.sweep.store import Store, write_atomic
from simbatch.config import Metrics
from simbatch.workload import generate

RATE = "workload.arrival.rate"
METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = {"mean": "mean", "median": "median", "p50": "median", "p90": "p90", "p99": "p99"}
PER_REQUEST_SLO = {"ttft": "slo.ttft_ms", "tpot": "slo.tpot_ms", "e2el": "slo.e2el_ms"}
# Halving below this fraction of capacity means the SLOs are out of reach at any useful load.
FLOOR_FRACTION = 2.0**-10
TRACE_HAS_ITS_RATE = "a trace sets its own arrival times; capacity-search varies the rate"

# Any percentile, as vLLM names it in a key: p95, p99.9 (0 < P < 100).
_STAT = rf"{'|'.join(STATS)}|p\d{{1,2}}(?:\.\d+)?"
_OURS = re.compile(rf"^({'|'.join(METRICS)})_({_STAT})_ms$")
_VLLM = re.compile(rf"^({_STAT})_({'|'.join(METRICS)})_ms$")


@dataclass(frozen=True)
class SLO:
    """A limit on one summary statistic: ``p99_ttft_ms <= 500``."""

    metric: str  # ttft, tpot, itl, e2el
    stat: str  # mean, median, or a percentile in vLLM's spelling: p90, p99, p99.9
    limit_ms: float

    @property
    def key(self) -> str:
        """The summary key it constrains (vLLM's spelling)."""
        return f"{self.stat}_{self.metric}_ms"

    def holds(self, value: float) -> bool:
        """Whether a value of the statistic meets the SLO; NaN (no request completed) does not."""
        return value <= self.limit_ms

    @property
    def percentile(self) -> float | None:
        """The percentile a pN SLO needs the runs to compute beyond the summary's own (p90, p99); else None."""
        p = float(self.stat[1:]) if self.stat.startswith("p") else None
        return None if p in (None, 90.0, 99.0) else p


def parse_slo(text: str) -> SLO:
    """``ttft_p99_ms=500`` or ``p99_ttft_ms=500`` -> SLO("ttft", "p99", 500.0)."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if m := _OURS.match(name):
        metric, stat = m[1], m[2]
    elif m := _VLLM.match(name):
        stat, metric = m[1], m[2]
    else:
        raise SweepInputError(
            f"--slo {text}: unknown SLO {name!r}; use <metric>_<stat>_ms=LIMIT with metric one of "
            f"{', '.join(METRICS)} and stat mean, median or any percentile pN (p95, p99.9), e.g. ttft_p99_ms=500")
    if stat not in STATS and not 0 < float(stat[1:]) < 100:
        raise SweepInputError(f"--slo {text}: percentile {stat[1:]} is not between 0 and 100, e.g. ttft_p99.9_ms=500")
    try:
        limit = float(raw)
    except ValueError:
        limit = math.nan
    if not sep or not (0 < limit < math.inf):
        raise SweepInputError(f"--slo {text}: the limit must be a positive number of ms, e.g. {name}=500")
    return SLO(metric, STATS.get(stat) or percentile_word(float(stat[1:])), limit)


def percentile_overrides(slos: list[SLO], base: Metrics) -> list[str]:
    """``metrics.*`` overrides that make every run compute the percentiles the SLOs name (none if it already does)."""
    needed = [(s.metric, s.percentile) for s in slos if s.percentile is not None]
    if not needed:
        return []
    metrics = list(dict.fromkeys([*base.percentile_metrics, *(m for m, _ in needed)]))
    percentiles = list(dict.fromkeys([*base.metric_percentiles, *(p for _, p in needed)]))
    return [f"metrics.percentile_metrics=[{', '.join(metrics)}]",
            f"metrics.metric_percentiles=[{', '.join(repr(p) for p in percentiles)}]"]


def goodput_overrides(slos: list[SLO]) -> list[str]:
    """Per-request limits for goodput: the loosest limit given on each of TTFT, TPOT, E2E."""
    loosest: dict[str, float] = {}
    for slo in slos:
        if slo.metric in PER_REQUEST_SLO:
            loosest[slo.metric] = max(loosest.get(slo.metric, 0.0), slo.limit_ms)
    return [f"{PER_REQUEST_SLO[m]}={v!r}" for m, v in loosest.items()]


@dataclass
class Search:
    """The bisection of one configuration; ``lo`` met the SLOs, ``hi`` did not (or is capacity)."""

    config: Point
    capacity: float  # analytic, requests/s
    tolerance: float
    error: str = ""
    hi: float = field(init=False)  # starts at capacity, never probed there
    lo: float | None = None
    at_lo: dict[str, Any] | None = None  # the combined replications at lo
    probes: int = 0
    trace: list[dict[str, Any]] = field(default_factory=list)  # one row per probe: rate, SLO metrics, met

    def __post_init__(self) -> None:
        self.hi = self.capacity

    def next_rate(self) -> float | None:
        """The next rate to probe, or None when the search is over."""
        if self.error:
            return None
        if self.lo is None:
            rate = self.hi / 2
            if rate < FLOOR_FRACTION * self.capacity:
                self.error = (f"SLOs missed even at {self.hi:.4g} req/s ({self.hi / self.capacity:.2%} of "
                              "capacity): out of reach for this configuration")
                return None
            return rate
        return None if self.hi - self.lo <= self.tolerance * self.hi else (self.lo + self.hi) / 2

    def record(self, rate: float, combined: dict[str, Any], slos: list[SLO]) -> None:
        """The replications at ``rate``: it becomes ``lo`` when every SLO holds, else ``hi``. Anything
        with a ``key`` and a ``holds(value)`` serves as an SLO (``simbatch plan``'s limits do)."""
        self.probes += 1
        if combined["replications"] == 0:
            self.error = f"at {rate:.4g} req/s: {combined['error']}"
            return
        values = {s.key: combined.get(f"{s.key}_mean", math.nan) for s in slos}
        met = all(s.holds(values[s.key]) for s in slos)
        self.trace.append({**param_cells(self.config.values), "rate": rate, **values, "met": met})
        if met:
            self.lo, self.at_lo = rate, combined
        else:
            self.hi = rate

    def row(self, slos: list[SLO]) -> dict[str, Any]:
        at = self.at_lo or {}
        max_rate = math.nan if self.lo is None else self.lo
        return {**param_cells(self.config.values), "max_rate": max_rate,
                "request_goodput": at.get("request_goodput_mean", math.nan),
                "capacity_requests_per_s": self.capacity, "ratio": max_rate / self.capacity,
                **{s.key: at.get(f"{s.key}_mean", math.nan) for s in slos},
                "probes": self.probes, "error": self.error or self.config.error or ""}


def _capacity(config: Point) -> float:
    """Analytic capacity, requests/s, from the configuration's workload at its base seed."""
    scenario = config.scenario
    return expected_stability(scenario, generate(scenario)).capacity_requests_per_s


@dataclass
class CapacitySearch:
    """A checked capacity search, ready to run."""

    scenario_path: Path
    sets: list[str]  # --set, then the per-request SLOs for goodput
    slos: list[SLO]
    configs: list[Point]
    replications: int
    tolerance: float
    store: Store
    keys: list[str] = field(default_factory=list)  # the swept parameters (besides the rate)
    probes: pd.DataFrame = field(default_factory=pd.DataFrame)  # after run(): every rate simulated

    @classmethod
    def plan(cls, scenario_path: Path, param_texts: list[str], sets: list[str], slo_texts: list[str],
             replications: int, tolerance: float, out: Path | None = None, force: bool = False) -> CapacitySearch:
        """Check every argument; raises :class:`SweepInputError` and creates nothing when one is bad."""
        scenario_path = Path(scenario_path)
        if not slo_texts:
            raise SweepInputError("--slo: give at least one, e.g. --slo ttft_p99_ms=500")
        slos = [parse_slo(t) for t in slo_texts]
        if not 0 < tolerance < 1:
            raise SweepInputError(f"--tolerance {tolerance}: must be between 0 and 1 (a fraction), e.g. 0.02")
        reserved = {"seed": SEED_IS_PER_REPLICATION,
                    RATE: "capacity-search searches the rate itself; sweep the other parameters"}
        params, configs = valid_points(scenario_path, param_texts, sets, reserved, replications, force)
        if not any(c.scenario.slo.model_dump(exclude_none=True) for c in configs if c.scenario is not None):
            sets = list(sets) + goodput_overrides(slos)
        valid = [c for c in configs if c.scenario is not None]
        if valid and all(c.scenario.workload.trace is not None for c in valid):
            raise SweepInputError(f"{scenario_path}: {TRACE_HAS_ITS_RATE}; use a scenario with synthetic "
                                  "arrivals (workload.arrival)")
        sets = list(sets) + percentile_overrides(slos, valid[0].scenario.metrics if valid else Metrics())
        manifest = {"slo": [[s.key, s.limit_ms] for s in slos], "tolerance": tolerance}
        store = open_store(Path(out) if out else default_out(configs, "capacity"), "capacity-search", scenario_path, sets,
                           configs,
                           **manifest)
        return cls(scenario_path, sets, slos, configs, replications, tolerance, store, [p.key for p in params])

    @property
    def out(self) -> Path:
        return self.store.out

    def _searches(self) -> list[Search]:
        searches = []
        for config in self.configs:
            if config.scenario is None:
                search = Search(config, math.nan, self.tolerance, error=config.error)
            elif config.scenario.workload.trace is not None:
                search = Search(config, math.nan, self.tolerance, error=TRACE_HAS_ITS_RATE)
            else:
                search = Search(config, _capacity(config), self.tolerance)
            searches.append(search)
        return searches

    def run(self, executor: Executor, on_config_done: Callable[[], None] | None = None) -> pd.DataFrame:
        """Bisect all configurations in step (a round's probes run in parallel); write capacity.csv."""
        self.store.create()
        searches = self._searches()
        finished: set[int] = set()
        while True:
            probes: list[tuple[Search, float, list[Run]]] = []
            for i, search in enumerate(searches):
                rate = search.next_rate()
                if rate is None:
                    if i not in finished and on_config_done:
                        on_config_done()
                    finished.add(i)
                    continue
                point = load_point(self.scenario_path, self.sets, {**search.config.values, RATE: rate})
                probes.append((search, rate, runs_for(point, self.replications)))
                if point.error:
                    search.error = point.error
            if not probes:
                break
            records = execute([run for _, _, runs in probes for run in runs], self.store, executor)
            for search, rate, runs in probes:
                if runs:
                    search.record(rate, combine([records[run.key] for run in runs]), self.slos)
        frame = pd.DataFrame([s.row(self.slos) for s in searches])
        write_atomic(self.out / "capacity.csv", frame.to_csv(index=False))
        self.probes = pd.DataFrame([{"config": i, **row} for i, s in enumerate(searches) for row in s.trace])
        write_atomic(self.out / "probes.csv", self.probes.to_csv(index=False))
        return frame
