"""From ``simbatch plan``'s arguments to a checked :class:`~simbatch.app.plan.search.Question`.

Everything a user can get wrong is checked before the output folder is touched: the SLOs, the search
space (file and flags), the traffic (an arrival rate or a trace; not closed-loop users, who set their
own rate), the prices (a price for every GPU the space names), and then the closed forms themselves:
when they rule out every configuration, the question has no answer, and the reply is one line
naming the closest miss (:func:`no_answer`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simbatch.analysis.capacity import expected_stability
from simbatch.app.plan.limits import ATTAINMENT, Limit, completion
from simbatch.app.plan.screen import Screen, screen
from simbatch.app.plan.search import OBJECTIVES, Question
from simbatch.app.plan.space import SearchSpace, SpaceError, configurations
from simbatch.app.results import file_sha256
from simbatch.app.sweep.capacity import goodput_overrides, parse_slo, percentile_overrides
from simbatch.app.sweep.plan import SweepInputError, default_out, open_store
from simbatch.app.sweep.runner import Point
from simbatch.inputs import guard
from simbatch.inputs.loading import load_model, load_scenario
from simbatch.inputs.prices import Prices
from simbatch.workload import generate

RATE = "workload.arrival.rate"
TIME_SCALE = "workload.trace.time_scale"
GOODPUT = ("ttft", "tpot", "e2el")  # the per-request limits, as vLLM's --goodput names them


class PlanInputError(SweepInputError):
    """Bad input to ``simbatch plan``; the message is one line naming the argument and the fix."""


@dataclass(frozen=True)
class Flags:
    """The search-space flags, each a comma-separated list as typed (None: not given)."""

    model: str | None = None
    gpu: str | None = None
    tensor_parallel_size: str | None = None
    quantization: str | None = None
    max_num_seqs: str | None = None
    max_num_batched_tokens: str | None = None
    split: str | None = None
    max_replicas: int | None = None


_FLAG_FIELDS = {"model": "models", "gpu": "gpus", "tensor_parallel_size": "tensor_parallel_size",
                "quantization": "quantization", "max_num_seqs": "max_num_seqs",
                "max_num_batched_tokens": "max_num_batched_tokens"}


def _items(flag: str, text: str, number: bool) -> list[Any]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise PlanInputError(f"--{flag.replace('_', '-')} {text!r}: give a comma-separated list, e.g. 1,2")
    if number:
        try:
            return [int(t) for t in items]
        except ValueError:
            raise PlanInputError(f"--{flag.replace('_', '-')} {text}: expected whole numbers, e.g. 64,128") from None
    return items


def search_space(path: Path | None, flags: Flags) -> SearchSpace:
    """The space file (if any) with the flags laid over it, validated."""
    data = load_model(path, SearchSpace, "search space").model_dump(exclude_unset=True) if path else {}
    given = []
    for flag, key in _FLAG_FIELDS.items():
        text = getattr(flags, flag)
        if text is not None:
            data[key] = _items(flag, text, key in ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens"))
            given.append((key, flag))
    if flags.split is not None:
        data["disaggregated"] = {**data.get("disaggregated", {}), "splits": _items("split", flags.split, False)}
        given.append(("disaggregated", "split"))
    if flags.max_replicas is not None:
        data["replicas"] = {**data.get("replicas", {}), "max": flags.max_replicas}
        given.append(("replicas", "max_replicas"))
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        where = next((f"--{f.replace('_', '-')}" for k, f in given if k == key), f"search space: {key}")
        raise PlanInputError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None


def limits_for(slo_texts: list[str], goodput: dict[str, float], attainment: float) -> list[Limit]:
    """The limits a fleet must meet: each --slo, the --goodput attainment, and every request completed."""
    if not slo_texts and not goodput:
        raise PlanInputError("--slo or --goodput: give at least one, e.g. --slo ttft_p99_ms=500 --slo tpot_p99_ms=50")
    if not 0 < attainment <= 1:
        raise PlanInputError(f"--attainment {attainment:g}: must be a share in (0, 1], e.g. 0.99")
    limits = [Limit(s.key, s.limit_ms) for s in (parse_slo(t) for t in slo_texts)]
    if goodput:
        limits.append(Limit(ATTAINMENT, attainment, at_most=False))
    return [*limits, completion()]


def no_answer(screens: list[Screen], limits: list[Limit]) -> str:
    """One line for a question the closed forms answer "no": the closest configuration and why."""
    def miss(s: Screen) -> float:
        excesses = [lim.excess(s.bounds[lim.key]) for lim in limits if lim.key in s.bounds]
        return min([e for e in excesses if e > 1], default=math.inf)

    invalid = [s for s in screens if s.reason.startswith("invalid")]
    if len(invalid) == len(screens):
        return f"search space: every configuration is invalid, e.g. {screens[0].config.label}: {screens[0].reason}"
    valid = [s for s in screens if not s.reason.startswith("invalid")]
    best = min(valid, key=miss)
    return (f"no configuration can meet the SLOs ({len(screens)} ruled out by the closed forms, none simulated); "
            f"the closest, {best.config.label}: {best.reason}; loosen the SLOs or widen the search space")


def _slug(parts: dict[str, Any]) -> str:
    return "plan-" + hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]


def ask(scenario_path: Path, space_path: Path | None, flags: Flags, slo_texts: list[str], goodput: dict[str, float],
        attainment: float, prices_path: Path | None, objective: str, top: int, replications: int,
        tolerance: float, sets: list[str], out: Path | None, force: bool, headroom: bool = True) -> Question:
    """Check every argument and screen every configuration; raises PlanInputError (or ScenarioError,
    TooLarge) and creates nothing when one is bad or nothing can meet the SLOs."""
    if objective not in OBJECTIVES:
        raise PlanInputError(f"--objective {objective}: choose one of {', '.join(OBJECTIVES)}")
    if top < 1:
        raise PlanInputError(f"--top {top}: must be at least 1")
    if objective == "goodput-per-dollar" and not headroom:
        raise PlanInputError("--no-headroom with --objective goodput-per-dollar: that objective ranks by the "
                             "headroom; drop --no-headroom or choose --objective cost")
    if not 0 < tolerance < 1:
        raise PlanInputError(f"--tolerance {tolerance:g}: must be between 0 and 1 (a fraction), e.g. 0.05")
    limits = limits_for(slo_texts, goodput, attainment)
    space = search_space(space_path, flags)
    if not scenario_path.is_file():
        raise PlanInputError(f"SCENARIO {scenario_path}: file not found; pass the path of a scenario file")
    base = load_scenario(scenario_path, sets)
    slos = [parse_slo(t) for t in slo_texts]
    if goodput:
        sets = sets + [f"slo.{m}_ms={goodput[m]!r}" if m in goodput else f"slo.{m}_ms=null" for m in GOODPUT]
    elif not base.slo.model_dump(exclude_none=True):
        sets = sets + goodput_overrides(slos)
    sets = sets + percentile_overrides(slos, base.metrics)
    base = load_scenario(scenario_path, sets)
    guard.check_run(base, force)
    wl = base.workload
    if wl.closed_loop is not None:
        raise PlanInputError(f"{scenario_path}: workload.closed_loop: plan sizes a fleet for an arrival rate, and "
                             "closed-loop users set their own; give workload.arrival (or a trace)")
    if wl.trace is None and math.isinf(wl.arrival.rate):
        raise PlanInputError(f"{scenario_path}: workload.arrival.rate is inf (every request at t = 0): plan sizes a "
                             "fleet for a steady rate; give requests/s, e.g. --request-rate 5")
    workloads = [generate(base.model_copy(update={"seed": base.seed + r})) for r in range(replications)]
    rate = expected_stability(base, workloads[0]).arrival_rate
    if wl.trace is None:
        def rate_override(r: float) -> dict[str, Any]:
            return {RATE: r}
    else:
        scale = wl.trace.time_scale

        def rate_override(r: float) -> dict[str, Any]:
            return {TIME_SCALE: scale * rate / r}
    try:
        configs = configurations(space, base, force)
    except SpaceError as exc:
        raise PlanInputError(str(exc)) from None
    prices = Prices.load(prices_path)
    for gpu in dict.fromkeys(c.gpu for c in configs):
        if not prices.has(gpu):
            raise PlanInputError(f"--prices {prices.path}: no price for GPU {gpu!r} (in the search space); add "
                                 f"gpus.{gpu}.usd_per_gpu_hour to the file, or take {gpu} out of the search space")
    screens = [screen(c, scenario_path, sets, workloads, rate, limits, space.replicas.max, space.replicas.min)
               for c in configs]
    if not any(s.survived for s in screens):
        raise PlanInputError(no_answer(screens, limits))
    anchor = Point({}, sets, base)
    slug = _slug({"space": space.model_dump(mode="json"), "limits": [lim.text for lim in limits],
                  "objective": objective, "top": top, "prices": file_sha256(prices.path), "sets": sets,
                  "replications": replications, "tolerance": tolerance, "headroom": headroom})
    store = open_store(Path(out) if out else default_out([anchor], slug), "plan", scenario_path, sets, [anchor])
    return Question(scenario_path, sets, rate, rate_override, limits, screens, prices, objective, top,
                    replications, tolerance, space.replicas.max, store, headroom, force)
