"""``report.html``: one self-contained page of linked, zoomable views of a run or a comparison.

Drawn with Bokeh and written as standalone HTML with BokehJS inlined (``bokeh.resources.INLINE``),
so the file opens anywhere, offline, and can be mailed or archived with its folder. From top to
bottom, every time axis linked (pan or zoom one, the others follow):

- **the requests' timeline** (a Gantt per run): a bar per request, coloured by phase, queued (arrival
  to first admission), prefill (to the first token), decode (to the last); hover shows its id,
  arrival, queue, prefill and decode times and preemptions. A preempted request's bars include its
  time back in the queue (``simbatch run --trace`` writes the phases step by step, in trace.json).
- **running, waiting and KV usage over time**, summed over the replicas (time-weighted means over
  ``SERIES_BINS`` equal bins);
- **TTFT, TPOT and ITL distributions** (histograms on a log scale, every run overlaid), and TTFT by
  arrival time, a point per request with the same hover.

Beside the plots, at the top, the numbers: the result table as ``simbatch run`` prints it (a comparison's
table, a column per run), the stability check and its verdict (each column's), and the scenario as run,
folded (``scenario.yaml``), so the page alone says what was simulated and what came of it.

Bounded for big runs: a Gantt shows at most ``GANTT_MAX_REQUESTS`` requests (every k-th by arrival
when there are more; the page says so), a time series ``SERIES_BINS`` bins, so the
file stays a few MB whatever the run's size.

Runs come as a mapping ``label -> run`` where a run has ``requests`` and ``iterations`` frames (either
may be None: a vLLM result file brings TTFTs only), and optionally ``scenario``, ``summary`` and
``stall_gaps_s`` (a :class:`~simbatch.simulation.Result` has them all).
"""

from __future__ import annotations

import contextlib
import html
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from simbatch.analysis.summary import itl_sample
from simbatch.app.plots import series
from simbatch.app.plots.latency import histogram_edges
from simbatch.config import replica_scenarios

GANTT_MAX_REQUESTS = 2_000
SERIES_BINS = 2_000
HIST_BINS = 60
PHASE_COLORS = {"queued": "#b9b9b9", "prefill": "#f28e2b", "decode": "#4e79a7"}
RUN_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
              "#bcbd22", "#17becf")
WIDTH = 1100
TOOLTIPS = [("request", "@request_id"), ("arrival", "@arrival_s{0.000} s"), ("queue", "@queue_ms{0.0} ms"),
            ("prefill", "@prefill_ms{0.0} ms"), ("decode", "@decode_ms{0.0} ms"),
            ("preemptions", "@num_preemptions"), ("status", "@status")]


def _has(frame: pd.DataFrame | None, *columns: str) -> bool:
    return frame is not None and all(c in frame.columns for c in columns)


def sampled(requests: pd.DataFrame, cap: int | None = None) -> tuple[pd.DataFrame, int]:
    """The admitted requests a Gantt shows: all, or every k-th by arrival when more than ``cap``
    (default ``GANTT_MAX_REQUESTS``); and k."""
    cap = cap or GANTT_MAX_REQUESTS
    admitted = requests[requests["status"].astype(str) != "rejected"]
    stride = max(1, math.ceil(len(admitted) / cap))
    return admitted.iloc[::stride], stride


def request_columns(requests: pd.DataFrame, end_s: float) -> dict[str, np.ndarray]:
    """Per request: its phases' bounds (a phase not reached ends at ``end_s``) and the hover's fields."""
    arrival = requests["arrival_s"].to_numpy(float)
    scheduled, token, finish = (requests[c].to_numpy(float) for c in ("first_scheduled_s", "first_token_s", "finish_s"))
    until = lambda t: np.where(np.isnan(t), end_s, t)  # noqa: E731 - a phase still going at the end
    return {
        "request_id": requests["request_id"].to_numpy(), "arrival_s": arrival,
        "scheduled_s": until(scheduled), "token_s": until(token), "finish_s": until(finish),
        "reached_prefill": ~np.isnan(scheduled), "reached_decode": ~np.isnan(token),
        "queue_ms": (until(scheduled) - arrival) * 1e3,
        "prefill_ms": np.where(np.isnan(scheduled), np.nan, until(token) - until(scheduled)) * 1e3,
        "decode_ms": np.where(np.isnan(token), np.nan, until(finish) - until(token)) * 1e3,
        "num_preemptions": requests["num_preemptions"].to_numpy(), "status": requests["status"].astype(str).to_numpy(),
    }


def gantt_data(requests: pd.DataFrame, end_s: float) -> dict[str, np.ndarray]:
    """The Gantt's bars: one per phase each request reached, with the request's hover fields on each."""
    cols = request_columns(requests, end_s)
    parts = []
    for phase, left, right, reached in (("queued", "arrival_s", "scheduled_s", None),
                                        ("prefill", "scheduled_s", "token_s", "reached_prefill"),
                                        ("decode", "token_s", "finish_s", "reached_decode")):
        keep = np.ones(len(requests), bool) if reached is None else cols[reached]
        part = {k: v[keep] for k, v in cols.items() if not k.startswith("reached")}
        part |= {"left": cols[left][keep], "right": cols[right][keep], "phase": np.full(keep.sum(), phase),
                 "color": np.full(keep.sum(), PHASE_COLORS[phase])}
        parts.append(part)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def pool_series(run, end_s: float, bins: int = SERIES_BINS) -> dict[str, np.ndarray]:
    """Running, waiting and KV blocks in use over time, summed over replicas, as time-weighted means
    over ``bins`` equal bins (exact whatever the runs' lengths; see :mod:`simbatch.app.plots.series`).

    Waiting is the number in the system minus running, so it counts requests that wait while the
    engine idles (a static batch filling up), which the steps alone do not see.
    """
    edges = series.grid(end_s, bins)
    it = run.iterations
    running = series.step_mean(it, it["num_running"], edges)
    waiting = series.without_noise(np.maximum(series.in_system(run.requests, edges) - running, 0.0))
    return {"time_s": edges, "running": np.r_[running, running[-1:]], "waiting": np.r_[waiting, waiting[-1:]],
            "kv_blocks": np.r_[kv := series.step_mean(it, it["kv_blocks_used"], edges), kv[-1:]]}


def log_histogram(values: np.ndarray, weights: np.ndarray | None, edges: np.ndarray) -> np.ndarray:
    """Share of the (weighted) values in each bin."""
    counts, _ = np.histogram(values, bins=edges, weights=weights)
    total = counts.sum()
    return counts / total if total else counts


def _log_edges(samples: list[np.ndarray]) -> np.ndarray | None:
    """``HIST_BINS`` log-spaced bins over every positive finite value (None if there is none)."""
    positive = np.concatenate([s[(s > 0) & np.isfinite(s)] for s in samples] + [np.zeros(0)])
    return 10 ** histogram_edges(np.log10(positive), HIST_BINS) if len(positive) else None


def _latency_samples(run) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """TTFT, TPOT (ms, finished requests) and ITL (ms, every token gap, weighted) of one run."""
    out = {}
    rq, it = run.requests, run.iterations
    if _has(rq, "ttft_s", "status"):
        done = rq[rq["status"].astype(str) == "finished"]
        out["TTFT"] = (done["ttft_s"].to_numpy(float) * 1e3, None)
        if "tpot_s" in done.columns:
            tpot = done["tpot_s"].to_numpy(float) * 1e3
            out["TPOT"] = (tpot[np.isfinite(tpot)], None)
    stalls = getattr(run, "stall_gaps_s", None)
    if _has(it, "duration_s", "itl_tokens") and stalls is not None:
        values, weights = itl_sample(it, stalls)
        out["ITL"] = (values * 1e3, weights)
    return out


def _end_s(run) -> float:
    summary = getattr(run, "summary", None) or {}
    if summary.get("duration") is not None:
        return float(summary["duration"])
    ends = [run.iterations["end_s"].max()] if _has(run.iterations, "end_s") and len(run.iterations) else [0.0]
    return float(max(ends))


def _fleet_blocks(run) -> int | None:
    scenario = getattr(run, "scenario", None)
    return None if scenario is None else sum(s.kv_cache.num_blocks for s in replica_scenarios(scenario))


def _figure(title: str, **options):
    """A Bokeh figure with the page's size and tools (pan and wheel zoom along time)."""
    from bokeh.plotting import figure

    options = {"height": 260, "width": WIDTH, "tools": "xpan,xwheel_zoom,box_zoom,reset,save",
               "active_scroll": "xwheel_zoom", "sizing_mode": "stretch_width", **options}
    return figure(title=title, **options)


def _gantt(label: str, run, x_range):
    """One run's timeline (a bar per phase of each request shown), and a note when it is sampled."""
    from bokeh.models import ColumnDataSource, HoverTool, Range1d

    shown, stride = sampled(run.requests)
    data = gantt_data(shown, _end_s(run))
    ids = data["request_id"]
    lo, hi = (int(ids.min()), int(ids.max())) if len(ids) else (0, 1)
    p = _figure(f"{label}: requests (bar per phase: queued, prefill, decode)", x_range=x_range,
                y_range=Range1d(hi + 1, lo - 1), height=min(520, 160 + 2 * len(shown)), x_axis_label="time (s)",
                y_axis_label="request id")
    bars = p.hbar(y="request_id", left="left", right="right", height=0.8, color="color", legend_group="phase",
                  source=ColumnDataSource(data, name=f"gantt:{label}"))
    p.add_tools(HoverTool(renderers=[bars], tooltips=TOOLTIPS))
    p.legend.location = "top_right"
    admitted = int((run.requests["status"].astype(str) != "rejected").sum())
    note = None if stride == 1 else (f"{label}: the timeline shows {len(shown):,} of {admitted:,} requests (one in "
                                     f"{stride}, by arrival); the time series and distributions use them all.")
    return p, note


def _pools(timed: Mapping[str, object], colors: dict[str, str], x_range, end_s: float) -> list:
    """Running and waiting, then KV usage, over time: a line per run (and per pool)."""
    pools = {label: pool_series(run, end_s) for label, run in timed.items()}
    figures = []
    for what, lines, unit in (("requests running (solid) and waiting (dashed)",
                               (("running", "solid"), ("waiting", "dashed")), "requests"),
                              ("KV cache in use", (("kv_blocks", "solid"),), "% of device blocks")):
        p = _figure(f"{what}, all replicas; means over {end_s / SERIES_BINS * 1e3:,.4g} ms bins", x_range=x_range,
                    x_axis_label="time (s)", y_axis_label=unit)
        for label, pool in pools.items():
            blocks = _fleet_blocks(timed[label])
            for name, dash in lines:
                if name == "kv_blocks" and blocks is None:
                    continue  # a run without its scenario: its cache size is unknown
                scale = 100 / blocks if name == "kv_blocks" else 1
                p.step(pool["time_s"], pool[name] * scale, mode="after", color=colors[label], line_dash=dash,
                       line_width=1.5, legend_label=label if len(lines) == 1 else f"{label} {name}")
        p.legend.click_policy = "hide"
        p.legend.location = "top_left"
        figures.append(p)
    return figures


def _histograms(runs: Mapping[str, object], colors: dict[str, str]) -> list:
    """TTFT, TPOT and ITL distributions, every run overlaid, on shared log-spaced bins."""
    from bokeh.models import ColumnDataSource, HoverTool

    samples = {label: _latency_samples(r) for label, r in runs.items()}
    figures = []
    for metric in ("TTFT", "TPOT", "ITL"):
        got = {label: s[metric] for label, s in samples.items() if metric in s and len(s[metric][0])}
        edges = _log_edges([v for v, _ in got.values()])
        if edges is None:
            continue
        p = _figure(f"{metric} distribution", x_axis_type="log", height=300, width=WIDTH // 3,
                    x_axis_label=f"{metric} (ms)", y_axis_label="share", active_scroll=None)
        for label, (values, weights) in got.items():
            source = ColumnDataSource({"left": edges[:-1], "right": edges[1:],
                                       "top": log_histogram(values, weights, edges)}, name=f"hist:{metric}:{label}")
            p.quad(left="left", right="right", bottom=0, top="top", source=source, fill_color=colors[label],
                   fill_alpha=0.35, line_color=colors[label], legend_label=label)
        p.add_tools(HoverTool(tooltips=[(metric, "@left{0.00} to @right{0.00} ms"), ("share", "@top{0.0%}")]))
        p.legend.click_policy = "hide"
        figures.append(p)
    return figures


def _ttft_by_arrival(timed: Mapping[str, object], colors: dict[str, str], x_range):
    """A point per finished request (those the timelines show): TTFT against arrival, with the same hover."""
    from bokeh.models import ColumnDataSource, HoverTool

    p = _figure("TTFT by arrival time (a point per request)", x_range=x_range, y_axis_type="log", height=320,
                x_axis_label="arrival (s)", y_axis_label="TTFT (ms)")
    for label, run in timed.items():
        shown, _ = sampled(run.requests)
        shown = shown[shown["status"].astype(str) == "finished"]
        cols = request_columns(shown, _end_s(run)) | {"ttft_ms": shown["ttft_s"].to_numpy(float) * 1e3}
        dots = p.scatter("arrival_s", "ttft_ms", source=ColumnDataSource(cols, name=f"ttft:{label}"), size=4,
                         color=colors[label], alpha=0.6, legend_label=label)
        p.add_tools(HoverTool(renderers=[dots], tooltips=[*TOOLTIPS[:2], ("TTFT", "@ttft_ms{0.0} ms"), *TOOLTIPS[2:]]))
    p.legend.click_policy = "hide"
    return p


def _pre(text: str) -> str:
    return f"<pre style='font-size:12px;line-height:1.25'>{html.escape(text)}</pre>"


def numbers(runs: Mapping[str, object]) -> str:
    """The page's numbers as HTML, every text escaped: the result table (or the comparison's), the stability
    check (or each column's verdict), and each run's scenario, folded."""
    from simbatch.analysis.capacity import Stability
    from simbatch.app import report
    from simbatch.app.scenario_file import scenario_yaml

    summarized = {label: r for label, r in runs.items() if isinstance(getattr(r, "summary", None), Mapping)}
    parts = []
    if len(summarized) == 1:
        run = next(iter(summarized.values()))
        scenario, st = getattr(run, "scenario", None), getattr(run, "stability", None)
        # A summary from elsewhere may lack a key the table reads: then the page goes without it.
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if scenario is not None:
                parts.append(_pre(report.result_table(run.summary, scenario.metrics.percentile_metrics,
                                                      scenario.metrics.metric_percentiles)))
        if isinstance(st, Stability):
            parts.append(_pre(report.stability_block(st)))
    elif summarized:
        parts.append(_pre(report.compare_table(summarized)))
        parts.append(_pre("\n".join(report.verdict_lines(summarized))))
    for label, run in runs.items():
        scenario = getattr(run, "scenario", None)
        if scenario is not None:
            parts.append(f"<details><summary>scenario{': ' + html.escape(label) if len(runs) > 1 else ''} "
                         f"(scenario.yaml)</summary>{_pre(scenario_yaml(scenario))}</details>")
    return "".join(parts)


def build(runs: Mapping[str, object], title: str):
    """The page's Bokeh layout (see the module docstring)."""
    from bokeh.layouts import column, row
    from bokeh.models import Div, Range1d

    colors = dict(zip(runs, RUN_COLORS * (len(runs) // len(RUN_COLORS) + 1), strict=False))
    timed = {label: r for label, r in runs.items()
             if _has(r.requests, "arrival_s", "first_scheduled_s", "first_token_s", "finish_s") and r.iterations is not None}
    end_s = max([_end_s(r) for r in timed.values()], default=1.0) or 1.0
    x_range = Range1d(0.0, end_s * 1.01, bounds=(0.0, end_s * 1.05))  # one time axis for every view
    items, notes = [], []
    for label, run in timed.items():
        p, note = _gantt(label, run, x_range)
        items.append(p)
        notes += [note] if note else []
    if timed:
        items += _pools(timed, colors, x_range, end_s)
    if hists := _histograms(runs, colors):
        items.append(row(*hists, sizing_mode="stretch_width"))
    if timed:
        items.append(_ttft_by_arrival(timed, colors, x_range))
    header = f"<h2>{html.escape(title)}</h2>" + numbers(runs) + \
        "".join(f"<p><i>{html.escape(n)}</i></p>" for n in notes)
    if not items:
        header += "<p>These runs hold no per-request or per-step data to draw.</p>"
    return column(Div(text=header, sizing_mode="stretch_width"), *items, sizing_mode="stretch_width")


def write_report(path: Path, runs: Mapping[str, object], title: str) -> None:
    """Write ``report.html``: the views of ``runs``, BokehJS inlined (no network needed to open it)."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    path.write_text(file_html(build(runs, title), INLINE, title=title), encoding="utf-8")
