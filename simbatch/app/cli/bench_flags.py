"""``vllm bench serve``'s flags, spelled as vLLM spells them, turned into scenario overrides.

Each flag is a shorthand for a scenario key (the table in docs/concepts.md maps them all), applied
after ``--set`` like any dedicated option, so its errors read as the file's would:

- ``--request-rate R`` -> ``workload.arrival.rate`` (``inf`` sends everything at t = 0);
- ``--burstiness B`` -> ``workload.arrival.process=gamma``, ``workload.arrival.burstiness=B``
  (gamma gaps of shape B; 1 is Poisson);
- ``--num-prompts N`` -> ``workload.num_requests``;
- ``--max-concurrency N`` -> ``workload.max_concurrency``;
- ``--percentile-metrics ttft,tpot`` -> ``metrics.percentile_metrics``;
- ``--metric-percentiles 50,90,99.9`` -> ``metrics.metric_percentiles``;
- ``--goodput ttft:500 tpot:50`` -> ``slo.ttft_ms``, ``slo.tpot_ms`` (and ``e2el``), in ms.
  As in vLLM, the pairs are separate words after one flag (:class:`BenchCommand` gathers them);
  one quoted value (``--goodput "ttft:500 tpot:50"``) or the flag repeated do the same.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

import typer
from typer.core import TyperCommand

from simbatch.app.cli.common import BadInput

GOODPUT_METRICS = ("ttft", "tpot", "e2el")

RequestRateOpt = Annotated[str | None, typer.Option(
    "--request-rate", metavar="R", help="Mean arrival rate, requests/s; inf sends all at t=0 "
    "(sets workload.arrival.rate).", show_default=False)]
BurstinessOpt = Annotated[float | None, typer.Option(
    "--burstiness", metavar="B", help="Gamma-shaped arrival gaps of shape B: 1 Poisson, <1 burstier "
    "(sets workload.arrival.process=gamma and .burstiness).", show_default=False)]
NumPromptsOpt = Annotated[int | None, typer.Option(
    "--num-prompts", metavar="N", help="Requests to send (sets workload.num_requests).", show_default=False)]
MaxConcurrencyOpt = Annotated[int | None, typer.Option(
    "--max-concurrency", metavar="N", help="At most N requests in flight; later ones wait at the client "
    "(sets workload.max_concurrency).", show_default=False)]
PercentileMetricsOpt = Annotated[str | None, typer.Option(
    "--percentile-metrics", metavar="M1,M2", help="Latencies to report percentiles of: "
    "ttft,tpot,itl,e2el (sets metrics.percentile_metrics).", show_default=False)]
MetricPercentilesOpt = Annotated[str | None, typer.Option(
    "--metric-percentiles", metavar="P1,P2", help="Percentiles to report, e.g. 50,90,99.9 "
    "(sets metrics.metric_percentiles).", show_default=False)]
GoodputOpt = Annotated[list[str] | None, typer.Option(
    "--goodput", metavar="METRIC:MS", help="Per-request SLOs for goodput, vLLM's syntax: "
    "--goodput 'ttft:500 tpot:50' (ttft, tpot, e2el; ms; sets slo.*_ms).", show_default=False)]


_PAIR = re.compile(rf"(?:{'|'.join(GOODPUT_METRICS)}):\S*")
_MS_PER_UNIT = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3, "min": 6e4, "m": 6e4}
_WITH_UNIT = re.compile(rf"\s*([-+]?[0-9.]+(?:e[-+]?[0-9]+)?)\s*({'|'.join(_MS_PER_UNIT)})\s*", re.IGNORECASE)


def gather_goodput(args: list[str]) -> list[str]:
    """``--goodput ttft:500 tpot:50`` (vLLM's syntax: one flag, then pair after pair) as one value,
    ``--goodput "ttft:500 tpot:50"``; the pairs end at the first word that is not one (or at ``--``)."""
    out: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--":
            out += [word, *words]
            break
        out.append(word)
        if word == "--goodput" or word.startswith("--goodput="):
            if word == "--goodput":
                value = next(words, None)
                if value is None:
                    break
                out.append(value)
            for following in words:
                if not _PAIR.fullmatch(following):
                    out.append(following)
                    break
                out[-1] += " " + following
    return out


class BenchCommand(TyperCommand):
    """A command taking ``vllm bench serve``'s flags as vLLM spells them, ``--goodput``'s pairs included."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, gather_goodput(args))


def _number(flag: str, text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and (math.isfinite(value) or what == "rate")):
        raise BadInput(f"{flag} {text}: expected a positive number ({what}), e.g. {flag} 4")
    return value


def goodput_limits(items: list[str]) -> dict[str, float]:
    """``["ttft:500 tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (ms)."""
    out = {}
    for pair in (p for item in items for p in item.split()):
        metric, sep, limit = pair.partition(":")
        if not sep or metric not in GOODPUT_METRICS:
            raise BadInput(f"--goodput {pair}: expected METRIC:MS with METRIC one of {', '.join(GOODPUT_METRICS)}, "
                           "e.g. --goodput 'ttft:500 tpot:50'")
        out[metric] = _limit_ms(pair, metric, limit)
    return out


def goodput_overrides(items: list[str]) -> list[str]:
    """``["ttft:500 tpot:50"]`` -> ``["slo.ttft_ms=500.0", "slo.tpot_ms=50.0"]``."""
    return [f"slo.{metric}_ms={limit!r}" for metric, limit in goodput_limits(items).items()]


def _limit_ms(pair: str, metric: str, limit: str) -> float:
    """A goodput limit: a positive number of milliseconds. A unit is refused with the value in ms."""
    try:
        value = float(limit)
    except ValueError:
        value = math.nan
    if value > 0 and math.isfinite(value):
        return value
    example = 500 if metric == "ttft" else 50 if metric == "tpot" else 2000
    unit = _WITH_UNIT.fullmatch(limit)
    if unit and float(unit[1]) > 0:
        ms = float(unit[1]) * _MS_PER_UNIT[unit[2].lower()]
        raise BadInput(f"--goodput {pair}: the limit is a number of milliseconds, without a unit; "
                       f"e.g. --goodput {metric}:{ms:g}")
    raise BadInput(f"--goodput {pair}: expected a positive number of milliseconds, e.g. --goodput {metric}:{example}")


def _list(flag: str, text: str, allowed: tuple[str, ...] | None = None) -> str:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise BadInput(f"{flag} {text!r}: give a comma-separated list")
    if allowed is not None:
        unknown = [t for t in items if t not in allowed]
        if unknown:
            raise BadInput(f"{flag} {text}: {unknown[0]!r} is not one of {', '.join(allowed)}")
        return "[" + ", ".join(items) + "]"
    percentiles = [_number(flag, t, "a percentile") for t in items]
    if fractions := [t for t, p in zip(items, percentiles, strict=True) if p < 1]:
        raise BadInput(f"{flag} {text}: percentiles are in percent, as vLLM takes them ({fractions[0]} is "
                       f"P{fractions[0]}, not P{float(fractions[0]) * 100:g}); e.g. {flag} "
                       f"{','.join(f'{p * 100:g}' if p < 1 else t for t, p in zip(items, percentiles, strict=True))}")
    return "[" + ", ".join(repr(p) for p in percentiles) + "]"


def bench_overrides(request_rate: str | None = None, burstiness: float | None = None,
                    num_prompts: int | None = None, max_concurrency: int | None = None,
                    percentile_metrics: str | None = None, metric_percentiles: str | None = None,
                    goodput: list[str] | None = None) -> list[str]:
    """The scenario overrides these flags stand for, in ``--set`` syntax (None: flag not given)."""
    from simbatch.config import LATENCY_METRICS

    out = []
    if request_rate is not None:
        out.append(f"workload.arrival.rate={_number('--request-rate', request_rate, 'rate')!r}")
    if burstiness is not None:
        out += ["workload.arrival.process=gamma", f"workload.arrival.burstiness={burstiness!r}"]
    if num_prompts is not None:
        out.append(f"workload.num_requests={num_prompts}")
    if max_concurrency is not None:
        out.append(f"workload.max_concurrency={max_concurrency}")
    if percentile_metrics is not None:
        out.append(f"metrics.percentile_metrics={_list('--percentile-metrics', percentile_metrics, LATENCY_METRICS)}")
    if metric_percentiles is not None:
        out.append(f"metrics.metric_percentiles={_list('--metric-percentiles', metric_percentiles)}")
    return out + goodput_overrides(goodput or [])
