"""``simbatch replay``: simulate the benchmark a ``vllm bench serve`` result file describes, and set
the simulation beside the measurement.

The file gives the traffic: its requests (lengths and send order when it has per-request arrays,
else its mean lengths), their send times or the rate and burstiness to draw them from
(:mod:`simbatch.workload.bench_client`), its ``max_concurrency``, the latencies and percentiles it
reports. The server it does not describe (the device, ``max_num_seqs``, the token budget, the KV
cache, prefix caching) comes from a scenario and ``--set``, and the replay says in one line which
of those values were given and which are simbatch's defaults.

Measured and simulated are compared on the same requests: where vLLM's own statistics average in
requests that streamed no token (a TTFT of 0.0, see :mod:`simbatch.workload.bench_result`), the
measured statistics are recomputed from the per-request arrays over the requests that streamed,
and the simulated ones over the same requests.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from simbatch.analysis.stats import describe_ms
from simbatch.config import Batching, Scenario
from simbatch.inputs.loading import apply_overrides, parse_override, read_text, read_yaml, scenario_from_dict
from simbatch.model import streams
from simbatch.model.clock import snap_s
from simbatch.registry import MODES
from simbatch.workload import WorkloadArrays, bench_client, generate
from simbatch.workload.bench_result import BenchResult

SERVER_KEYS = ("batching.max_num_seqs", "batching.max_num_batched_tokens", "kv_cache.num_blocks",
               "kv_cache.enable_prefix_caching", "scheduler.async_scheduling", "frontend.request_latency_ms",
               "frontend.response_latency_ms", "cluster.replicas")
"""The server settings a result file never records, named in the replay's "assumed" line."""


def base_data(scenario_file: Path | None, sets: list[str]) -> tuple[dict, str, Path | None]:
    """The scenario's data before the replay's workload goes in: the file's (or none) with ``--set``
    applied; (data, source name for errors, folder relative paths resolve against)."""
    parsed = [parse_override(s) for s in sets]
    if scenario_file is None:
        return apply_overrides({}, parsed), "--set", None
    _, data = read_yaml(read_text(scenario_file), str(scenario_file))
    return apply_overrides(data if isinstance(data, dict) else {}, parsed), str(scenario_file), \
        scenario_file.resolve().parent


def _get(data: dict, key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@dataclass
class Replay:
    """A benchmark made ready to simulate: the scenario, its requests, and what each came from."""

    result: BenchResult
    scenario: Scenario
    workload: WorkloadArrays
    requests: bench_client.BenchRequests
    assumed: str

    def lines(self) -> list[str]:
        """What the replay took from where, one line each."""
        r = self.result
        client = f"max_concurrency {r.max_concurrency} (the file's)" if r.max_concurrency else "no max_concurrency"
        shown = ", ".join(f"p{p:g}" for p in self.scenario.metrics.metric_percentiles)
        return [f"replay of {r.path} ({r.client}{f', {r.model_id}' if r.model_id else ''})",
                f"requests: {self.requests.lengths_from}",
                f"arrivals: {self.requests.arrivals_from} (seed {self.scenario.seed})",
                f"client: {client}; percentiles {shown} of {', '.join(self.scenario.metrics.percentile_metrics)}",
                f"server (not in the file): {self.assumed}"]


def _vllm_defaults(result: BenchResult, data: dict) -> tuple[dict, dict[str, str]]:
    """``data`` with the settings vLLM itself chose for that run where the scenario leaves them out, as
    ``simbatch calibrate`` reads them (simbatch.hardware.calibrate.outside_of): async scheduling from
    the file's date, the frontend's fixed latency; and the reason for each."""
    from simbatch.hardware.calibrate import outside_of

    outside = outside_of(result, None, None, None)
    extra, why = [], {}
    mode = _get(data, "batching.mode") or Batching.model_fields["mode"].default
    per_step = mode in MODES and MODES[mode].iteration_level  # async scheduling needs it
    if _get(data, "scheduler.async_scheduling") is None and outside.async_scheduling and per_step:
        extra.append(("scheduler.async_scheduling", True))
        why["scheduler.async_scheduling"] = outside.async_from
    if _get(data, "frontend.request_latency_ms") is None and _get(data, "frontend.response_latency_ms") is None \
            and outside.frontend_ms:
        extra.append(("frontend.request_latency_ms", outside.frontend_ms))
        why["frontend.request_latency_ms"] = outside.frontend_from
    return apply_overrides(data, extra), why


def _assumed(data: dict, scenario: Scenario, why: dict[str, str]) -> str:
    """The server settings, each with where it came from: given (scenario or --set) or simbatch's default."""
    device = scenario.device
    if device.preset is not None:
        parts = [f"device.preset {device.preset} (given)"]
    else:
        given = any(_get(data, f"device.{k}") is not None for k in ("tau0_ms", "beta_ms"))
        parts = [f"device tau0_ms {device.tau0_ms:g}, beta_ms {device.beta_ms:g}, prefill_ms_per_token "
                 f"{device.prefill_ms_per_token:g} ({'given' if given else 'simbatch defaults: set device.preset'})"]
    values = {"batching.max_num_seqs": scenario.batching.max_num_seqs,
              "batching.max_num_batched_tokens": scenario.batching.max_num_batched_tokens,
              "kv_cache.num_blocks": scenario.kv_cache.num_blocks,
              "kv_cache.enable_prefix_caching": str(scenario.kv_cache.enable_prefix_caching).lower(),
              "scheduler.async_scheduling": str(scenario.scheduler.async_scheduling).lower(),
              "frontend.request_latency_ms": f"{scenario.frontend.request_latency_ms:g}",
              "frontend.response_latency_ms": f"{scenario.frontend.response_latency_ms:g}",
              "cluster.replicas": scenario.cluster.replicas}
    resolution = scenario.resolution or {}
    for key in SERVER_KEYS:
        how = why.get(key, "given" if _get(data, key) is not None else "default")
        if key in resolution and resolution[key].decided:  # num_blocks: auto, from the preset
            how = resolution[key].source
        parts.append(f"{key} {values[key]} ({how})")
    return ", ".join(parts)


def plan(result: BenchResult, data: dict, source: str, base_dir: Path | None) -> Replay:
    """The scenario that replays ``result`` on the server ``data`` describes, and its requests.

    Raises :class:`~simbatch.inputs.loading.ScenarioError` for a scenario that does not validate,
    and ValueError (one line) for a file that says too little to replay.
    """
    given_lengths = {k: _get(data, f"workload.{k}") for k in ("prompt_tokens", "output_tokens")}
    seed = data.get("seed", 0) if isinstance(data.get("seed", 0), int) else 0
    requests = bench_client.requests_of(result, streams.rng(seed, streams.ARRIVALS), _get(data, "workload.num_requests"))
    if requests.prompt_tokens is None and None in given_lengths.values():
        raise ValueError(f"{result.path}: {result.kind()}, no lengths and no token counts to replay; give a scenario "
                         "(--scenario) whose workload.prompt_tokens and output_tokens say what the benchmark sent "
                         "(e.g. dist: sharegpt)")
    n = len(requests.arrival_s)
    rate = result.request_rate if result.request_rate is not None else math.inf
    arrival: dict[str, Any] = {"rate": "inf" if math.isinf(rate) else rate}
    if result.burstiness not in (None, 1.0) and not math.isinf(rate):
        arrival |= {"process": "constant"} if math.isinf(result.burstiness) else \
            {"process": "gamma", "burstiness": result.burstiness}
    workload: dict[str, Any] = {"num_requests": n, "arrival": arrival}
    if requests.prompt_tokens is not None:  # nominal: the requests go in as arrays
        workload |= {"prompt_tokens": {"dist": "fixed", "value": int(round(requests.prompt_tokens.mean()))},
                     "output_tokens": {"dist": "fixed", "value": int(round(requests.output_tokens.mean()))}}
    else:
        workload |= given_lengths
    if result.max_concurrency:
        workload["max_concurrency"] = result.max_concurrency
    metrics = {"percentile_metrics": list(result.percentile_metrics or ("ttft", "tpot", "itl", "e2el")),
               "metric_percentiles": list(result.percentiles or (99.0,))}
    given = data
    data, why = _vllm_defaults(result, data)
    full = {**data, "workload": workload, "metrics": metrics}
    scenario = scenario_from_dict(full, source, base_dir=base_dir)
    if requests.prompt_tokens is not None:
        arrays = WorkloadArrays(arrival_s=snap_s(np.sort(requests.arrival_s)),
                                prompt_tokens=requests.prompt_tokens[np.argsort(requests.arrival_s, kind="stable")],
                                output_tokens=requests.output_tokens[np.argsort(requests.arrival_s, kind="stable")],
                                tenant=np.zeros(n, np.int32), priority=np.zeros(n, np.int64),
                                tenant_names=("default",))
    else:
        drawn = generate(scenario)
        arrays = dataclasses.replace(drawn, arrival_s=snap_s(requests.arrival_s[:len(drawn)]))
    return Replay(result, scenario, arrays, requests, _assumed(given, scenario, why))


LATENCIES = (("ttft", "ttft_s"), ("tpot", "tpot_s"), ("e2el", "e2e_s"))


def measured_summary(result: BenchResult) -> tuple[dict, list[str]]:
    """The file's summary, with its latency statistics recomputed from the per-request arrays over the
    requests that streamed a token when vLLM's own average in others; and notes saying so."""
    summary, notes = dict(result.summary), []
    rq = result.requests
    if rq is None or rq.ttft_s is None or not len(rq) or "mean_ttft_ms" not in summary:
        return summary, notes
    streamed = rq.streamed
    if streamed.all() or not streamed.any():
        return summary, notes
    extra = list(result.percentiles)
    ttft = rq.ttft_s[streamed]
    summary |= describe_ms("ttft", ttft, percentiles=extra)
    recomputed = ["TTFT"]
    if rq.itls_s is not None:
        e2el = ttft + np.array([g.sum() for g, m in zip(rq.itls_s, streamed, strict=True) if m])
        out = rq.output_lens[streamed]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(out > 1, (e2el - ttft) / (out - 1), np.nan)
        gaps = np.concatenate([g for g, m in zip(rq.itls_s, streamed, strict=True) if m] or [np.zeros(0)])
        summary |= describe_ms("tpot", tpot[np.isfinite(tpot)], percentiles=extra)
        summary |= describe_ms("itl", gaps, percentiles=extra) | describe_ms("e2el", e2el, percentiles=extra)
        recomputed += ["TPOT", "ITL", "E2EL"]
    notes.append(f"measured {', '.join(recomputed)} recomputed from the per-request arrays over the "
                 f"{int(streamed.sum())} requests that streamed a token (the file's statistics average in "
                 f"{int((~streamed).sum())} zeros); simulated ones over the same requests")
    return summary, notes


def simulated_summary(replay: Replay, sim_summary: dict, requests) -> dict:
    """The simulation's summary, its per-request latencies taken over the requests the measurement counts."""
    keep = replay.requests.measured
    if keep is None or keep.all():
        return dict(sim_summary)
    order = np.argsort(replay.requests.arrival_s, kind="stable")
    counted = keep[order]  # the workload is in arrival order
    done = requests[(requests["status"] == "finished").to_numpy() & counted[requests["request_id"].to_numpy()]]
    out = dict(sim_summary)
    extra = list(replay.scenario.metrics.metric_percentiles)
    for metric, column in LATENCIES:
        values = done[column].to_numpy()
        out |= describe_ms(metric, values[np.isfinite(values)], percentiles=extra)
    return out


def notes(replay: Replay, measured: dict) -> list[str]:
    """What a reader of the table must know: chunked streaming, the file's own notes."""
    r = replay.result
    out = [str(n) for n in r.notes]
    duration, completed = r.summary.get("duration"), r.summary.get("completed")
    redrawn = r.requests is None or r.requests.start_s is None or r.max_concurrency
    if redrawn and r.request_rate and math.isfinite(r.request_rate) and not r.max_concurrency and duration and completed:
        sent = completed / duration
        if abs(sent / r.request_rate - 1) > 0.10:
            out.append(f"the run completed {completed:,} requests in {duration:,.1f} s ({sent:.3g} req/s at request_rate "
                       f"{r.request_rate:g}): its own arrival draw, which the redrawn one does not repeat; duration "
                       "and throughput differ by the draw as much as by the server")
    itl, tpot = measured.get("mean_itl_ms"), measured.get("mean_tpot_ms")
    per_chunk = replay.result.requests.tokens_per_chunk() if replay.result.requests is not None else None
    if itl and tpot and itl > 1.5 * tpot and not replay.result.spec_decode:
        out.append(f"the measured ITL is a streamed chunk's gap ({itl / tpot:.1f} x TPOT"
                   f"{f', {per_chunk:.1f} tokens per chunk' if per_chunk else ''}), the simulated one a token's: "
                   "compare TPOT")
    return out
