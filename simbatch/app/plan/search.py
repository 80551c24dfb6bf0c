"""The search: screen every configuration, then simulate only what can still win.

1. **Screen** (:mod:`.screen`): closed forms rule configurations out and give each survivor the
   fewest replicas that are stable, hence a lower bound on its cost (GPUs x price).
2. **Size** the survivors by simulation, cheapest bound first: the fewest replicas (or pool units) that
   meet every limit at the planned rate, from the stable minimum up, doubling the step until a size
   meets them, then bisecting between the last that missed and the first that met (meeting them is
   taken to be monotone in the fleet's size). Every probe is R replications; a probe is judged on
   the replications' means (:mod:`.limits`), with their 95 % intervals kept for the tables. A
   configuration whose bound cannot beat the ``top``-th best answer found so far is never simulated,
   and a sizing stops as soon as its next size could not: the top ``top`` configurations are exact
   (given the bounds and the monotonicity), and most of the space is never simulated.
3. **Headroom** of each ranked configuration at its size: the highest rate at which every limit
   still holds, by ``capacity-search``'s bisection (:class:`simbatch.app.sweep.capacity.Search`) between
   the planned rate (met) and the fleet's analytic capacity (never probed), to ``tolerance``.

Objectives: ``cost`` (lowest cost per hour; ties: fewer GPUs), ``gpus`` (fewest GPUs; ties: cost),
``goodput-per-dollar`` (the most requests served within the SLOs per dollar: headroom x 3600 / cost
per hour, DistServe's goodput per dollar; its bound is the analytic capacity's, and every
configuration it ranks is bisected for its headroom while the search runs).

Rounds run the probes of up to ``ROUND_CONFIGS`` configurations at once on the executor (this
process, local processes, Dask), and nothing is decided before a round's runs are all in: the runs
chosen, and so every output file, are the same whatever executes them and in whatever order they
finish. Runs are stored as a sweep's are (:mod:`simbatch.app.sweep.store`): rerunning resumes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simbatch.app.plan.limits import Limit, binding, failures, with_derived
from simbatch.app.plan.screen import Screen
from simbatch.app.sweep.aggregate import combine
from simbatch.app.sweep.capacity import Search
from simbatch.app.sweep.runner import Executor, Point, execute, load_point, runs_for
from simbatch.app.sweep.store import Store
from simbatch.inputs import guard
from simbatch.inputs.prices import Prices

OBJECTIVES = ("cost", "gpus", "goodput-per-dollar")
ROUND_CONFIGS = 8
"""Configurations probed per round. A constant, not the executor's width, so that the runs chosen do not
depend on where they execute."""


@dataclass(eq=False)
class Candidate:
    """One configuration through the search: its screening, its sizing, its headroom."""

    screen: Screen
    price: float  # per GPU-hour
    fail: float = 0  # the largest size known not to meet the limits (below the stable minimum: by the closed form)
    ok: int | None = None  # the smallest size known to meet them
    step: int = 1
    at: dict[int, dict[str, Any]] = field(default_factory=dict)  # size -> combined replications at the planned rate
    status: str = "queued"  # queued, sizing, sized, outranked, rejected; "screened" when the closed forms ruled it out
    note: str = ""
    headroom: Search | None = None
    at_rate: dict[float, dict[str, Any]] = field(default_factory=dict)  # headroom probes: rate -> combined

    def __post_init__(self) -> None:
        self.fail = self.screen.min_units - 1
        if not self.screen.survived:
            self.status = "screened"

    @property
    def config(self):
        return self.screen.config

    def cost(self, units: float) -> float:
        return self.config.gpus(units) * self.price

    def next_units(self, max_units: int) -> int | None:
        """The next fleet size to simulate, or None when the sizing is over."""
        if self.ok is None:
            if self.fail >= max_units:
                return None
            return int(min(self.screen.min_units if self.fail < self.screen.min_units else self.fail + self.step,
                           max_units))
        return None if self.ok - self.fail <= 1 else int((self.fail + self.ok) // 2)

    def record(self, units: int, combined: dict[str, Any], met: bool) -> None:
        self.at[units] = combined
        if met:
            self.ok = units
        else:
            self.fail = units
            if self.ok is None and units > self.screen.min_units:
                self.step *= 2
            elif self.ok is None:
                self.step = 1

    @property
    def headroom_rate(self) -> float:
        return math.nan if self.headroom is None or self.headroom.lo is None else self.headroom.lo

    def goodput_per_dollar(self) -> float:
        """Requests served within the SLOs per dollar at the edge: headroom x 3600 / cost per hour."""
        return self.headroom_rate * 3600 / self.cost(self.ok) if self.ok else math.nan


def sort_key(objective: str, cand: Candidate, units: float) -> tuple:
    """Smaller is better. Among fleets alike on the objective, the larger closed-form capacity first
    (it is known before any simulation, and more of it means more headroom), then the label, so no
    two configurations compare equal."""
    cost, gpus, capacity = cand.cost(units), cand.config.gpus(units), -cand.screen.capacity
    if objective == "gpus":
        return gpus, cost, capacity, cand.config.label
    if objective == "goodput-per-dollar":
        return -cand.goodput_per_dollar(), cost, capacity, cand.config.label
    return cost, gpus, capacity, cand.config.label


def bound_key(objective: str, cand: Candidate) -> tuple:
    """A key no fleet of this configuration beats: at its stable minimum, and for goodput per dollar the
    analytic capacity in place of the headroom (headroom < capacity = units x mu)."""
    units = cand.screen.min_units
    if objective == "goodput-per-dollar":
        return (-cand.screen.capacity * 3600 / cand.cost(1), cand.cost(units), -cand.screen.capacity,
                cand.config.label)
    return sort_key(objective, cand, units)


def group(cand: Candidate) -> tuple[str, str]:
    """What a ranked row stands for: a device (preset or calibrated) in one layout. The table ranks
    groups, each by its best configuration: ten settings of one GPU would say less than ten GPUs."""
    return cand.config.device, cand.config.layout.label


@dataclass
class Probe:
    """One simulation point of the search: a configuration at a size, at the planned rate or another."""

    cand: Candidate
    units: int
    rate: float | None = None  # None: the planned rate


@dataclass
class Question:
    """Everything the search needs, checked (see :mod:`simbatch.app.cli.plan`)."""

    scenario_path: Path
    sets: list[str]
    rate: float  # the planned rate, requests/s
    rate_override: Callable[[float], dict[str, Any]]  # a rate -> the scenario overrides that set it
    limits: list[Limit]
    screens: list[Screen]
    prices: Prices
    objective: str
    top: int
    replications: int
    tolerance: float
    max_units: int
    store: Store
    headroom: bool = True  # bisect each ranked fleet for its headroom
    force: bool = False  # lift the run-size guard (a probe at a high rate or a large fleet holds more)


@dataclass
class Plan:
    """What the search found: every candidate, the ranked ones, every probe."""

    question: Question
    candidates: list[Candidate]
    ranked: list[Candidate]
    probes: list[dict[str, Any]]
    runs: int  # simulations executed or resumed


class Searcher:
    """Runs the search of a :class:`Question` on an executor (module docstring)."""

    def __init__(self, question: Question, executor: Executor, on_run: Callable[[], None] | None = None):
        self.q, self.executor, self.on_run = question, executor, on_run
        self.probes: list[dict[str, Any]] = []
        self.runs = 0

    # ----------------------------------------------------------------------- simulation
    def _simulate(self, probes: list[Probe]) -> list[dict[str, Any]]:
        """Each probe's replications, combined (in the probes' order)."""
        q = self.q
        planned = []
        for probe in probes:
            values = probe.cand.config.at(probe.units)
            if probe.rate is not None:
                values |= q.rate_override(probe.rate)
            point = load_point(q.scenario_path, q.sets, values)
            if point.scenario is not None:
                guard.check_run(point.scenario, q.force)
            planned.append((point, runs_for(point, q.replications)))
        every = [run for _, runs in planned for run in runs]
        records = execute(every, q.store, self.executor, (lambda _: self.on_run()) if self.on_run else None)
        self.runs += len(every)
        out = []
        for probe, (point, runs) in zip(probes, planned, strict=True):
            combined = combine([with_derived(records[run.key]) for run in runs]) if runs else \
                {"replications": 0, "error": point.error}
            out.append(combined)
            self._log(probe, combined)
        return out

    def _log(self, probe: Probe, combined: dict[str, Any]) -> None:
        cand, q = probe.cand, self.q
        gpus = cand.config.gpus(probe.units)
        mean = lambda key: combined.get(f"{key}_mean", math.nan)  # noqa: E731
        tpot = mean("mean_tpot_ms")
        self.probes.append({
            "configuration": cand.config.label, "gpu": cand.config.gpu, "units": probe.units,
            "replicas": cand.config.replicas(probe.units), "gpus": gpus,
            "phase": "size" if probe.rate is None else "headroom",
            "rate": q.rate if probe.rate is None else probe.rate,
            "met": not failures(q.limits, combined),
            **{f"{lim.key}": mean(lim.key) for lim in q.limits},
            **{f"{lim.key}_ci95": combined.get(f"{lim.key}_ci95", math.nan) for lim in q.limits},
            "output_throughput": mean("output_throughput"),
            "output_tokens_per_s_per_gpu": mean("output_throughput") / gpus,
            "tokens_per_s_per_user": 1e3 / tpot if tpot > 0 else math.nan,
            "replications": combined.get("replications", 0), "error": combined.get("error", ""),
        })

    # ----------------------------------------------------------------------- the rounds
    def _known(self, cands: list[Candidate]) -> tuple[dict[tuple, tuple], tuple | None]:
        """The best key known for each group, and the ``top``-th best of those (None while fewer groups
        have one). A configuration matters only if it can beat both its own group's best and, when its
        group is not in the top, that bar."""
        q = self.q
        best: dict[tuple, tuple] = {}
        for c in cands:
            if c.ok is not None and (c.status == "sized" or q.objective != "goodput-per-dollar"):
                key = sort_key(q.objective, c, c.ok)
                best[group(c)] = min(key, best.get(group(c), key))
        keys = sorted(best.values())
        return best, keys[q.top - 1] if len(keys) >= q.top else None

    @staticmethod
    def _threshold(cand: Candidate, best: dict[tuple, tuple], bar: tuple | None) -> tuple | None:
        """The key ``cand`` must stay below to matter (None: no threshold yet)."""
        own = best.get(group(cand))
        if own is None or bar is None:
            return own if bar is None else bar
        return min(own, bar)

    def _size_step(self, cand: Candidate, threshold: tuple | None) -> Probe | None:
        """The candidate's next probe, or None (its status then says why it stopped)."""
        q = self.q
        if cand.ok is not None and cand.status == "sizing" and cand.next_units(q.max_units) is None:
            cand.status = "headroom" if q.objective == "goodput-per-dollar" else "sized"
        if cand.status == "headroom":
            return self._headroom_step(cand)
        if cand.status != "sizing":
            return None
        units = cand.next_units(q.max_units)
        if units is None:  # ok is None here: every size up to the largest missed
            cand.status = "rejected"
            cand.note = f"misses the limits even at {cand.config.replicas(q.max_units)} replicas (replicas.max)"
            return None
        key = bound_key(q.objective, cand) if q.objective == "goodput-per-dollar" else \
            sort_key(q.objective, cand, units)
        if threshold is not None and key >= threshold:
            if cand.ok is None:
                cand.status, cand.note = "outranked", f"stopped before {cand.config.replicas(units)} replicas: no " \
                    f"better than its device's best or the top {q.top}"
                return None
            cand.note = f"meets the limits at {cand.config.replicas(cand.ok)} replicas (fewer not simulated: " \
                "no better than what is ranked)"
            cand.status = "headroom" if q.objective == "goodput-per-dollar" else "sized"
            return self._headroom_step(cand) if cand.status == "headroom" else None
        return Probe(cand, units)

    def _headroom_step(self, cand: Candidate) -> Probe | None:
        q = self.q
        if cand.headroom is None:
            point = Point({"configuration": cand.config.label, "replicas": cand.config.replicas(cand.ok)}, [], None)
            cand.headroom = Search(point, cand.ok * cand.screen.capacity, q.tolerance)
            cand.headroom.lo, cand.headroom.at_lo = q.rate, cand.at[cand.ok]
        rate = cand.headroom.next_rate()
        if rate is None:
            cand.status = "sized"
            return None
        return Probe(cand, cand.ok, rate)

    def _record(self, probe: Probe, combined: dict[str, Any]) -> None:
        cand, q = probe.cand, self.q
        if probe.rate is None:
            cand.record(probe.units, combined, not failures(q.limits, combined))
        else:
            cand.at_rate[probe.rate] = combined
            cand.headroom.record(probe.rate, combined, q.limits)

    def _rounds(self, cands: list[Candidate], queue: list[Candidate], prune: bool) -> None:
        """Probe the active candidates round by round, admitting from ``queue`` (in bound order) as
        they finish; with ``prune``, a candidate whose bound cannot matter is never simulated."""
        q = self.q
        active: list[Candidate] = []
        while True:
            best, bar = self._known(cands) if prune else ({}, None)
            while len(active) < ROUND_CONFIGS and queue:
                cand = queue.pop(0)
                bound = bound_key(q.objective, cand)
                if bar is not None and bound >= bar:  # the queue is in bound order: nothing after it matters
                    for rest in [cand, *queue]:
                        rest.status, rest.note = "outranked", f"its closed-form bound is no better than the top {q.top}"
                    queue.clear()
                    break
                if group(cand) in best and bound >= best[group(cand)]:
                    cand.status, cand.note = "outranked", "its closed-form bound is no better than its device's best"
                    continue
                if cand.status == "queued":
                    cand.status = "sizing"
                active.append(cand)
            probes = [p for p in (self._size_step(c, self._threshold(c, best, bar) if prune else None)
                                  for c in active) if p is not None]
            active = [c for c in active if c.status in ("sizing", "headroom")]
            if not probes:
                if not queue and not active:
                    return
                continue
            for probe, combined in zip(probes, self._simulate(probes), strict=True):
                self._record(probe, combined)

    def run(self) -> Plan:
        q = self.q
        q.store.create()
        cands = [Candidate(s, q.prices.price(s.config.gpu)) for s in q.screens]
        queue = sorted((c for c in cands if c.status == "queued"), key=lambda c: bound_key(q.objective, c))
        self._rounds(cands, queue, prune=True)
        sized = sorted((c for c in cands if c.ok is not None and c.status == "sized"),
                       key=lambda c: sort_key(q.objective, c, c.ok))
        leaders: dict[tuple, Candidate] = {}
        for cand in sized:
            leaders.setdefault(group(cand), cand)
        ranked = list(leaders.values())[:q.top]
        if q.objective != "goodput-per-dollar" and q.headroom:
            for cand in ranked:
                cand.status = "headroom"
            self._rounds(cands, list(ranked), prune=False)
        for cand in sized:
            if cand not in ranked and not cand.note:
                cand.note = "meets the limits; " + ("its device has a better configuration" if leaders[group(cand)]
                                                    is not cand else f"its device is not in the top {q.top}")
        return Plan(q, cands, ranked, self.probes, self.runs)


def headroom_binding(cand: Candidate, limits: list[Limit]) -> str:
    """What ends the headroom: the limit that failed first above it, or stability when none did below
    the analytic capacity; with the closed form's binding resource."""
    search = cand.headroom
    resource = cand.screen.limited_by
    if search is None:
        return ""
    if search.hi < search.capacity and search.hi in cand.at_rate:
        return f"{binding(limits, cand.at_rate[search.hi])} ({resource})"
    return f"stability ({resource})"
