"""Text reports: the tables ``simbatch`` prints.

The result table follows ``vllm bench serve``'s layout and wording (a 40-column label, the value
after it), so a simulated run reads like a benchmark of a real server and the two can be set side
by side. Every number is taken from the summary (see :mod:`simbatch.analysis.summary` for the
definitions) or from :mod:`simbatch.model.cost`; nothing is recomputed here except two per-frame
aggregates defined below (padded share and per-tenant latency).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from simbatch.analysis.capacity import Stability, token_step_s
from simbatch.analysis.stats import describe_ms, percentile_word
from simbatch.app.text import printable
from simbatch.config import LATENCY_METRICS, Device
from simbatch.features import speculative
from simbatch.model.cost import LinearCost, batch_for_fraction, roofline_tokens_per_s

WIDTH = 50
_LABEL = 40


def _title(text: str, fill: str = "-") -> str:
    return f"{' ' + text + ' ' if text else '':{fill}^{WIDTH}}"


def _fmt(value: float | int | str | None, digits: int = 2) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if isinstance(value, int | np.integer):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _row(label: str, value: float | int | str | None, digits: int = 2) -> str:
    return f"{label:<{_LABEL}} {_fmt(value, digits)}"


_LATENCY_BLOCKS = (("ttft", "TTFT", "Time to First Token"),
                   ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
                   ("itl", "ITL", "Inter-token Latency"),
                   ("e2el", "E2EL", "End-to-end Latency"))


def result_table(summary: Mapping, percentile_metrics: Sequence[str] = LATENCY_METRICS,
                 metric_percentiles: Sequence[float] = (99,)) -> str:
    """The ``vllm bench serve`` result block, plus the simulator's queueing figures.

    As vLLM's, a block per latency of ``percentile_metrics`` with its mean, median and each of
    ``metric_percentiles`` (the scenario's ``metrics`` section).
    """
    lines = [_title("Serving Benchmark Result", "="),
             _row("Successful requests:", summary["completed"]),
             _row("Rejected requests:", summary["rejected"])]
    if summary["unfinished"]:
        lines.append(_row("Unfinished requests (clock stopped):", summary["unfinished"]))
    lines += [_row("Benchmark duration (s):", summary["duration"]),
              _row("Total input tokens:", summary["total_input_tokens"]),
              _row("Total generated tokens:", summary["total_output_tokens"]),
              _row("Request throughput (req/s):", summary["request_throughput"]),
              _row("Output token throughput (tok/s):", summary["output_throughput"]),
              _row("Total Token throughput (tok/s):", summary["total_token_throughput"])]
    if "request_goodput" in summary:
        lines.append(_row("Request goodput (req/s):", summary["request_goodput"]))
    stats = [("Mean", "mean"), ("Median", "median"),
             *((percentile_word(p).upper(), percentile_word(p)) for p in metric_percentiles)]
    for key, short, title in _LATENCY_BLOCKS:
        if key not in percentile_metrics:
            continue
        lines.append(_title(title))
        lines += [_row(f"{stat} {short} (ms):", summary[f"{prefix}_{key}_ms"]) for stat, prefix in stats]
    if "mean_client_wait_ms" in summary:
        lines += [_title("Client (max_concurrency)"),
                  _row("Mean client wait (ms):", summary["mean_client_wait_ms"]),
                  _row("P99 client wait (ms):", summary["p99_client_wait_ms"])]
    lines += [_title("Engine"),
              _row("Mean batch size (seqs/step):", summary["mean_batch_size"]),
              _row("Mean KV cache usage (%):", 100 * summary["mean_kv_usage"], 1),
              # Busy, not "utilization": a batching engine steps whenever any request is running, so it
              # is busy nearly all the time at any load; the offered load ρ above says how loaded it is.
              _row("Busy fraction (%):", 100 * summary["busy_fraction"], 1),
              _row("Preemptions:", summary["num_preemptions"]),
              _row("Mean queue time Wq (s):", summary["Wq_s"])]
    if "prefix_cache_hit_rate" in summary:
        lines.insert(len(lines) - 2, _row("Prefix cache hit rate (%):", 100 * summary["prefix_cache_hit_rate"], 1))
    if "spec_decode_acceptance_length" in summary:
        lines.insert(len(lines) - 2, _row("Mean acceptance length (tok/step):", summary["spec_decode_acceptance_length"], 2))
        lines.insert(len(lines) - 2, _row("Draft acceptance rate (%):", summary["spec_decode_acceptance_rate"], 1))
    if "prefill_busy_fraction" in summary:
        lines += [_title("Disaggregated pools (prefill / decode)")]
        lines += [_row(f"{name}:", " / ".join(fmt(summary[f"{pool}_{key}"]) for pool in ("prefill", "decode")))
                  for name, key, fmt in (("Busy fraction (%)", "busy_fraction", lambda v: f"{100 * v:.1f}"),
                                         ("Mean batch size (seqs/step)", "mean_batch_size", lambda v: f"{v:.2f}"),
                                         ("Mean KV cache usage (%)", "mean_kv_usage", lambda v: f"{100 * v:.1f}"),
                                         ("Tokens computed (tok/s)", "token_throughput", lambda v: f"{v:,.0f}"))]
        lines += [_row("Mean wait for a decode slot (ms):", summary["mean_decode_queue_ms"]),
                  _row("Mean KV transfer (ms):", summary["mean_kv_transfer_ms"])]
    replicas = sorted(int(k.split("_")[1]) for k in summary if k.startswith("replica_") and k.endswith("_L"))
    if replicas:
        lines += [_title("Replicas"),
                  _row("Load imbalance (max/mean L):", summary["load_imbalance"], 3)]
        lines += [_row(f"Replica {r} output (tok/s), busy (%):",
                       f"{summary[f'replica_{r}_output_throughput']:,.0f}, "
                       f"{100 * summary[f'replica_{r}_busy_fraction']:.1f}") for r in replicas]
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _batch(b: float) -> str:
    return f"{b:g}" if float(b).is_integer() else f"{b:.1f}"


def _burst_block(st: Stability) -> str:
    """The check of a finite burst (every request at t = 0): no rate to carry, a time to drain."""
    slots = st.batch_size * st.replicas
    lines = [_title("Stability check", "="),
             f"A burst: {st.burst:,} requests at t = 0 (rate inf), no steady rate to carry",
             _row("Mean output tokens E[out]:", st.mean_output_tokens, 1),
             _row(f"Capacity {'' if st.replicas == 1 else f'{st.replicas} × '}B/τ(B) at B = {_batch(st.batch_size)} "
                  "(tok/s):", st.capacity_tokens_per_s),
             _row("Full batches the burst fills:", st.burst / slots, 1),
             _row("Burst drains in about (s):", st.drain_s),
             _row("Limit that binds:", {"slots": "slots (max_num_seqs)", "memory": "KV memory",
                                        "compute": "compute (work no batch shares)"}[st.limited_by]),
             f"Verdict: {st.verdict}", "=" * WIDTH]
    return "\n".join(lines)


def stability_block(st: Stability) -> str:
    """The check to run before any simulation: can this device carry this traffic at all?"""
    if st.burst:
        return _burst_block(st)
    per = "" if st.replicas == 1 else f"{st.replicas} × "
    slots = st.batch_size * st.replicas  # a mixed fleet's batch_size is its mean full batch
    lines = [_title("Stability check", "="),
             _row("Arrival rate λ (req/s):", st.arrival_rate)]
    if st.pool:
        lines += [_row("Prefill pool capacity (req/s):", st.prefill_capacity_requests_per_s),
                  _row("Decode pool capacity (req/s):", st.decode_capacity_requests_per_s),
                  _row("Pool that binds:", st.pool),
                  "(ρ, replicas: the binding pool's; the rest: the decode pool's)"]
    lines += [_row("Mean output tokens E[out]:", st.mean_output_tokens, 1),
              _row("Offered token load λ·E[out] (tok/s):", st.offered_tokens_per_s)]
    if st.limited_by == "memory":
        lines.append(_row("Batch KV memory holds (slots):", f"{st.memory_batch:,.1f} (of {_batch(st.slots)}): "
                                                            "memory binds"))
    if st.context_cost:
        lines.append(_row("Mean context per decode step (tokens):", st.mean_context_tokens, 0))
    lines += [_row(f"Capacity {per}B/τ(B) at B = {_batch(st.batch_size)} (tok/s):", st.capacity_tokens_per_s),
              _row("Offered load ρ (demand / capacity):", st.offered_load),
              _row("Replicas the traffic needs (ρ < 1):", st.replicas_needed)]
    if st.client_concurrency is not None:
        lines += [_row(f"Client: {st.client_concurrency} in flight carry (req/s):", st.client_capacity_requests_per_s)]
    lines += [_row("Limit that binds:", {"slots": "slots (max_num_seqs)", "memory": "KV memory",
                                         "compute": "compute (work no batch shares)"}[st.limited_by]),
              f"Verdict: {st.verdict}",
              _title("Concurrency (Little's law)"),
              # Not "unloaded": every step is charged at the full batch, the latency when the slots
              # are all busy but nobody queues; a request alone would step at τ(1), much faster.
              _row("Latency at a full batch W_B (s):", st.full_batch_latency_s),
              _row("Concurrency demanded L = λ·W_B:", st.demanded_concurrency, 1),
              _row(f"Slots available ({_batch(st.batch_size)} × {st.replicas} replica{'s' * (st.replicas > 1)}):",
                   round(slots))]
    excess = st.demanded_concurrency - slots
    if excess > 0:
        lines.append(f"Traffic needs {excess:,.0f} more requests resident than there are slots: "
                     "they wait, so W (and L) exceed these figures.")
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def client_note(workload) -> str:
    """What a client (``workload.max_concurrency`` or ``closed_loop``) changes in the check above; "" without one."""
    if workload.closed_loop is not None:
        users = workload.closed_loop
        return (f"Closed loop: {users.concurrency} users, think time {users.think_time_s:g} s; the rate above is what "
                "they send at the full-batch latency W_B. They never hold more than that many requests in the server, so "
                "no queue grows without bound: past capacity, latency rises until the users slow down.")
    if workload.max_concurrency is not None:
        return (f"Client: at most {workload.max_concurrency} requests in flight (max_concurrency). Requests beyond "
                "wait at the client, reported as client wait; past capacity that wait grows, not the server's queue.")
    return ""


def littles_law_line(summary: Mapping) -> str:
    """L measured from the engine's state against λ·W from the request rows."""
    lam_w = summary["arrival_rate"] * summary["W_s"]
    return (f"L (time-averaged, from engine state) = {_fmt(summary['L'])}; λ·W (from request rows) = "
            f"{_fmt(lam_w)}; difference {_fmt(100 * summary['littles_law_rel_error'], 4)} %")


def autoscale_lines(summary: Mapping) -> str:
    """An autoscaled fleet's account: replicas, GPU-hours and cost, and the fixed fleet of the same
    cost on the same requests (simbatch.app.equal_cost); "" for a fixed fleet."""
    if "gpu_hours" not in summary:
        return ""
    cost = f", ${summary['cost_usd']:.2f} at ${summary['usd_per_gpu_hour']:.4g}/GPU-h" if "cost_usd" in summary else \
        " (no price: set cluster.autoscale.usd_per_gpu_hour, or a device.preset whose GPU the prices file lists)"
    text = (f"Autoscaled fleet: {summary['mean_replicas']:.2f} replicas on average (peak {summary['peak_replicas']}), "
            f"{summary['scale_ups']} started, {summary['scale_downs']} drained; {summary['gpu_hours']:.2f} GPU-hours{cost}")
    if "fixed_fleet_replicas" in summary:
        def pct(x: float) -> str:
            return "n/a (no slo set)" if math.isnan(x) else f"{100 * x:.1f} %"

        text += (f"\nA fixed fleet of the same cost ({summary['fixed_fleet_replicas']} replicas): SLO missed by "
                 f"{pct(summary['fixed_fleet_slo_violation_rate'])} of requests (autoscaled: "
                 f"{pct(summary['autoscaled_slo_violation_rate'])}), p99 TTFT {_fmt(summary['fixed_fleet_p99_ttft_ms'])} ms "
                 f"(autoscaled: {_fmt(summary['autoscaled_p99_ttft_ms'])} ms)")
    return text


def tenant_table(requests: pd.DataFrame) -> str:
    """Latency per tenant (finished requests), or "" when there is one tenant only."""
    tenants = requests["tenant"].cat.categories
    if len(tenants) < 2:
        return ""
    head = f"{'Tenant':<16}{'prio':>5}{'done':>7}{'rejected':>9}{'mean TTFT':>12}{'p99 TTFT':>12}{'mean E2EL':>12}"
    lines = [_title("Per tenant (ms)"), head]
    for tenant in tenants:
        rows = requests[requests["tenant"] == tenant]
        done = rows[rows["status"] == "finished"]
        ttft, e2el = describe_ms("ttft", done["ttft_s"].to_numpy()), describe_ms("e2el", done["e2e_s"].to_numpy())
        priority = ",".join(str(p) for p in sorted(rows["priority"].unique()))
        lines.append(f"{printable(tenant, 15):<16}{priority:>5}{len(done):>7}{int((rows['status'] == 'rejected').sum()):>9}"
                     f"{_fmt(ttft['mean_ttft_ms'], 0):>12}{_fmt(ttft['p99_ttft_ms'], 0):>12}"
                     f"{_fmt(e2el['mean_e2el_ms'], 0):>12}")
    return "\n".join(lines)


def rejections_line(requests: pd.DataFrame) -> str:
    """How many requests were turned away, by reason (see ``reason`` in requests.csv); "" if none."""
    reasons = requests.loc[requests["status"] == "rejected", "reason"].value_counts()
    return "Rejected by reason: " + ", ".join(f"{r} {n:,}" for r, n in reasons.items()) if len(reasons) else ""


def padded_share(iterations: pd.DataFrame) -> float:
    """Share of computed tokens that were padding: pad tokens / (decode + prefill + pad tokens).

    Only request-level batching pads (idle slots of finished requests, prompts padded to the
    longest); every padded token costs device time like a real one.
    """
    steps = iterations["num_steps"]
    padded = (iterations["padded_tokens"] * steps).sum()
    total = ((iterations["decode_tokens"] + iterations["prefill_tokens"]) * steps).sum() + padded
    return float(padded / total) if total else 0.0


# (label, summary key or callable on the Result-like run, digits)
_COMPARE_ROWS = (
    ("Successful requests", "completed", 0),
    ("Rejected requests", "rejected", 0),
    ("Benchmark duration (s)", "duration", 2),
    ("Request throughput (req/s)", "request_throughput", 2),
    ("Output token throughput (tok/s)", "output_throughput", 1),
    ("Total Token throughput (tok/s)", "total_token_throughput", 1),
    ("Request goodput (req/s)", "request_goodput", 2),
    ("Mean TTFT (ms)", "mean_ttft_ms", 1),
    ("P99 TTFT (ms)", "p99_ttft_ms", 1),
    ("Mean TPOT (ms)", "mean_tpot_ms", 2),
    ("P99 TPOT (ms)", "p99_tpot_ms", 2),
    ("Mean ITL (ms)", "mean_itl_ms", 2),
    ("P99 ITL (ms)", "p99_itl_ms", 2),
    ("Mean E2EL (ms)", "mean_e2el_ms", 1),
    ("P99 E2EL (ms)", "p99_e2el_ms", 1),
    ("Mean client wait (ms)", "mean_client_wait_ms", 1),
    ("P99 client wait (ms)", "p99_client_wait_ms", 1),
    ("Mean batch size (seqs/step)", "mean_batch_size", 1),
    ("Padded tokens share (%)", lambda r: math.nan if r.iterations is None else 100 * padded_share(r.iterations), 1),
    ("Mean queue time Wq (s)", "Wq_s", 2),
    ("Preemptions", "num_preemptions", 0),
    ("Prefix cache hit rate", "prefix_cache_hit_rate", 3),
    ("Mean acceptance length (tok/step)", "spec_decode_acceptance_length", 2),
    ("Draft acceptance rate (%)", "spec_decode_acceptance_rate", 1),
    ("Drafts (steps with drafts)", "spec_decode_num_drafts", 0),
    ("Draft tokens", "spec_decode_draft_tokens", 0),
    ("Accepted draft tokens", "spec_decode_accepted_tokens", 0),
)


MAX_REPLICA_ROWS = 16  # beyond this many replicas, per-replica rows stay in summary.json
_TENANT_STATS = {"request_throughput": ("req/s", 2), "mean_ttft_ms": ("mean TTFT (ms)", 1),
                 "p99_ttft_ms": ("P99 TTFT (ms)", 1), "mean_e2el_ms": ("mean E2EL (ms)", 1)}
_TENANT_KEY = re.compile(rf"tenant_(.+)_({'|'.join(_TENANT_STATS)})")


def _keyed_rows(summaries: list[Mapping]) -> list[tuple[str, str, int]]:
    """Rows for the per-tenant and per-replica keys any column has (see :mod:`simbatch.analysis.summary`)."""
    keys = list(dict.fromkeys(k for s in summaries for k in s))
    rows = []
    for key in keys:
        if m := _TENANT_KEY.fullmatch(key):
            what, digits = _TENANT_STATS[m[2]]
            rows.append((f"{m[1]}: {what}", key, digits))
    replicas = sorted({int(m[1]) for k in keys if (m := re.fullmatch(r"replica_(\d+)_L", k))})
    if len(replicas) <= MAX_REPLICA_ROWS:
        rows += [(f"replica {r}: {what}", f"replica_{r}_{key}", d) for r in replicas
                 for what, key, d in (("output (tok/s)", "output_throughput", 1), ("L", "L", 2))]
    return rows


def _stability(run) -> Stability | Mapping | None:
    """A run's stability check: its own (a simulated run), or its summary.json's record (a result folder)."""
    st = getattr(run, "stability", None)
    if isinstance(st, Stability):
        return st
    record = (getattr(run, "summary", None) or {}).get("stability")
    return record if isinstance(record, Mapping) else None


def verdict_lines(results: Mapping) -> list[str]:
    """Each column's verdict, in full: ``label: verdict: ...`` (a column without a check has none)."""
    out = []
    for label, run in results.items():
        st = _stability(run)
        verdict = st.verdict if isinstance(st, Stability) else None if st is None else st.get("verdict")
        if isinstance(verdict, str):
            out.append(f"{label}: verdict: {verdict}")
    return out


_STATS = re.compile(r"(median|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms")
_METRIC_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def _percentile_rows(summary: Mapping, shown: set) -> list[tuple[str, str, int]]:
    """A row for each median and percentile statistic ``summary`` has that the fixed rows leave out."""
    found = [(50.0 if m[1] == "median" else float(m[2]), m) for key in summary
             if (m := _STATS.fullmatch(key)) and key not in shown]
    return [(f"{'Median' if m[1] == 'median' else m[1].upper()} {_METRIC_NAMES[m[3]]} (ms)", m[0],
             1 if m[3] in ("ttft", "e2el") else 2) for _, m in sorted(found, key=lambda f: f[0])]


def _error(value, reference) -> str:
    """(value - reference) / reference, signed, or "" when either is missing or the reference is 0."""
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (value, reference)) or reference == 0:
        return ""
    return f"{(value - reference) / reference:+.1%}"


def compare_table(results: Mapping, against: str | None = None) -> str:
    """One column per run (``results``: label -> anything with ``summary`` and ``iterations``, which may be None).

    Each column's stability verdict (its own closed-form check, shortened: :func:`verdict_lines` has it
    whole), the metrics that tell runs apart, then the per-tenant and per-replica ones (replicas only up
    to ``MAX_REPLICA_ROWS``). A row that no column has is left out; a value a column lacks is n/a.
    ``against``: the label of a measured run; every other column is then followed by its signed
    error against it, (column - measured) / measured, and the rows include every median and
    percentile the measured run reports (``simbatch replay``, ``calibrate --check``).
    """
    width = max(14, *(len(m) + 2 for m in results))
    summaries = [r.summary for r in results.values()]
    labels = [f"{label:>{width}}" + (f"{'error':>9}" if against is not None and label != against else "")
              for label in results]
    lines = [f"{'':<34}" + "".join(labels), "-" * (34 + sum(map(len, labels)))]
    checks = [_stability(r) for r in results.values()]
    if any(c is not None for c in checks):
        cells = [c.short_verdict if isinstance(c, Stability) else "n/a" if c is None else str(c.get("short_verdict",
                 "stable" if c.get("stable") else "not stable")) for c in checks]
        lines.append(f"{'Stability (closed form)':<34}" + "".join(
            f"{printable(c, width - 1):>{width}}" + (" " * 9 if against is not None and label != against else "")
            for c, label in zip(cells, results, strict=True)))
    rows = [*_COMPARE_ROWS, *_keyed_rows(summaries)]
    if against is not None:  # each metric's other statistics, in order, around its P99 row
        for row in _percentile_rows(results[against].summary, {key for _, key, _ in rows}):
            metric, p = row[1].rsplit("_", 2)[-2], _STATS.fullmatch(row[1])[2]
            at = next(i for i, r in enumerate(rows) if r[1] == f"p99_{metric}_ms")
            if p is not None and float(p) > 99:  # after P99 and the higher ones placed already
                at += 1 + sum(1 for r in rows[at + 1:] if isinstance(r[1], str) and r[1].endswith(f"_{metric}_ms")
                              and r[1].startswith("p"))
            rows.insert(at, row)
    for label, key, digits in rows:
        if isinstance(key, str) and not any(key in s for s in summaries):
            continue
        values = {name: key(r) if callable(key) else r.summary.get(key) for name, r in results.items()}
        cells = []
        for name, v in values.items():
            cells.append(f"{_fmt(v, digits):>{width}}")
            if against is not None and name != against:
                cells.append(f"{_error(v, values[against]):>9}")
        lines.append(f"{label[:33]:<34}" + "".join(cells))
    return "\n".join(lines)


def capacity_curve(device: Device, max_num_seqs: int, context_tokens: float = 0.0) -> list[dict[str, float]]:
    """The analytic throughput curve at B = 1, 2, 4, ... and at max_num_seqs, one replica: per B its step
    time τ(B) (ms; with speculative decoding the speculating step) and tokens/s B / τ(B) (B·E / τ(B))."""
    sizes = sorted({*(2**k for k in range(max_num_seqs.bit_length()) if 2**k < max_num_seqs), max_num_seqs})
    spec, cost = device.speculative, LinearCost.of(device)
    return [{"batch_size": b, "step_ms": speculative.step_ms(cost, b, spec.num_speculative_tokens if spec else 0,
                                                               context_tokens, spec),
             "tokens_per_s": b / token_step_s(device, b, context_tokens)} for b in sizes]


def capacity_table(device: Device, max_num_seqs: int, replicas: int = 1, context_tokens: float = 0.0) -> str:
    """The analytic throughput curve B / τ(B) at B = 1, 2, 4, ... and at max_num_seqs, each sequence
    reading ``context_tokens`` of cached context (which costs only with device.kv_read_ms_per_1k_tokens)."""
    roofline = roofline_tokens_per_s(device, context_tokens)
    per = " per replica" if replicas > 1 else ""
    if device.kv_read_ms_per_1k_tokens:
        formula = (f"Step time τ(B) = {device.tau0_ms:g} + ({device.beta_ms:g} + {device.kv_read_ms_per_1k_tokens:g}"
                   f"·{context_tokens / 1e3:,.3g}k)·B ms at a context of {context_tokens:,.0f} tokens; roofline 1/(β + δ·c̄) = ")
    else:
        formula = f"Step time τ(B) = {device.tau0_ms:g} + {device.beta_ms:g}·B ms; roofline 1/β = "
    lines = [_title("Capacity (analytic)", "="),
             f"{formula}{_fmt(roofline, 0)} tok/s{per}",
             f"{'B':>8}{'τ(B) (ms)':>12}{'tokens/s' + per:>{14 + len(per)}}{'% of roofline':>16}"]
    spec = device.speculative
    if spec is not None:
        k, alpha = spec.num_speculative_tokens, spec.acceptance_rate
        lines.insert(2, f"Speculative decoding, k = {k}, α = {alpha:g}: "
                        f"{speculative.tokens_per_step(spec):.2f} tokens per step; τ(B) below is the "
                        f"speculating step, tokens/s B·E/τ(B)")
    for row in capacity_curve(device, max_num_seqs, context_tokens):
        b, step_ms, tps = row["batch_size"], row["step_ms"], row["tokens_per_s"]
        share = "n/a" if math.isinf(roofline) else f"{100 * tps / roofline:.1f} %"
        lines.append(f"{b:>8}{step_ms:>12.2f}{tps:>{14 + len(per)},.2f}{share:>16}")
    if replicas > 1:
        lines.append(f"With {replicas} replicas at B = {max_num_seqs}: "
                     f"{_fmt(replicas * max_num_seqs / token_step_s(device, max_num_seqs, context_tokens))} "
                     "tok/s in all")
    half = batch_for_fraction(device, 0.5, context_tokens)
    if math.isinf(half):
        lines.append("Batch size for 50 % of the roofline: none (β = 0: throughput grows without bound)")
    else:
        reach = "within" if half <= max_num_seqs else "beyond"
        lines.append(f"Batch size for 50 % of the roofline: B = {half:,.1f} ({reach} max_num_seqs = {max_num_seqs})")
    lines.append("=" * WIDTH)
    return "\n".join(lines)
