"""The figures of a sweep, drawn from its ``summary.csv`` frame.

The x axis is the load, ``workload.arrival.rate``, when it is swept; otherwise the first swept
parameter. Every other swept parameter splits the points into series, one line each (for example
one per batching mode), coloured as everywhere else (:func:`simbatch.app.plots.figure.colors`: a batching
mode has its own colour). Error bars are the 95 % confidence intervals of ``summary.csv``, and say so.

- ``latency.png``: median and p99 of TTFT, TPOT and end-to-end latency: the hockey stick.
- ``throughput.png``: output tokens/s against the analytic capacity B/tau(B) of
  :func:`simbatch.analysis.capacity.stability` (and, against rate, the offered load lambda E[out]).
- ``goodput.png``: requests/s meeting the scenario's SLOs, next to all completed requests/s; drawn
  only when the scenario sets an ``slo``.
- ``batch_throughput.png``, when ``batching.max_num_seqs`` is swept: the device curve
  B/(tau0 + beta B) against each point's decode tokens per busy second at its mean batch size.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display, safe in worker processes and CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from simbatch.app.atomic import atomic_file  # noqa: E402
from simbatch.app.plots.figure import colors  # noqa: E402
from simbatch.app.sweep.runner import Point  # noqa: E402
from simbatch.model.cost import decode_throughput, roofline_tokens_per_s  # noqa: E402

RATE = "workload.arrival.rate"
BATCH = "batching.max_num_seqs"


def _x_key(keys: list[str], frame: pd.DataFrame) -> str:
    varied = [k for k in keys if frame[k].nunique() > 1]
    numeric = [k for k in varied if pd.api.types.is_numeric_dtype(frame[k])]
    if RATE in varied:
        return RATE
    return (numeric or varied or keys)[0]


def _series(frame: pd.DataFrame, keys: list[str], x: str) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows along x) per combination of the other varied parameters.

    Numbers are sorted; names (modes, policies) keep the order they were given in.
    """
    others = [k for k in keys if k != x and frame[k].nunique() > 1]

    def along(rows: pd.DataFrame) -> pd.DataFrame:
        return rows.sort_values(x, kind="stable") if pd.api.types.is_numeric_dtype(rows[x]) else rows

    if not others:
        return [("", along(frame))]
    groups = frame.groupby(others, sort=False, dropna=False)
    return [(", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(others, values, strict=True)), along(rows))
            for values, rows in groups]


CI_NOTE = "error bars: 95 % confidence interval of the mean over replications"


def _errorbar(ax, rows: pd.DataFrame, x: str, metric: str, label: str, **style) -> None:
    ax.errorbar(rows[x], rows[f"{metric}_mean"], yerr=rows[f"{metric}_ci95"].fillna(0), capsize=3,
                label=label, **style)


def _colors(series) -> list[str]:
    """A colour per series, from the one colour map every simbatch plot uses."""
    return list(colors([label for label, _ in series]).values())


def _finish(fig, axes, xlabel: str, path: Path, note: str | None = CI_NOTE) -> Path:
    for ax in np.atleast_1d(axes):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    if note:
        fig.text(0.995, 0.005, note, ha="right", va="bottom", fontsize="small", color="0.35")
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    try:
        with atomic_file(path) as tmp:  # a full disk leaves no truncated PNG beside summary.csv
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def _xlabel(x: str) -> str:
    return "arrival rate (requests/s)" if x == RATE else x


def _label(series: str, what: str) -> str:
    return f"{series}: {what}" if series else what


def _latency(series, x: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (metric, title) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "end-to-end latency")),
                                   strict=True):
        for color, (label, rows) in zip(_colors(series), series, strict=True):
            _errorbar(ax, rows, x, f"median_{metric}_ms", _label(label, "p50"), color=color, marker="o")
            _errorbar(ax, rows, x, f"p99_{metric}_ms", _label(label, "p99"), color=color, marker="s",
                      linestyle="--")
        ax.set_title(title)
        ax.set_ylabel("ms")
        columns = [f"median_{metric}_ms_mean", f"p99_{metric}_ms_mean"]
        values = np.concatenate([rows[columns].to_numpy().ravel() for _, rows in series])
        values = values[np.isfinite(values) & (values > 0)]
        if len(values) and values.max() > 50 * values.min():
            ax.set_yscale("log")  # a hockey stick spans decades; linear would flatten the knee
    return _finish(fig, axes, _xlabel(x), path)


def _reference(ax, series, x: str, column: str, what: str, linestyle: str) -> None:
    """An analytic line: once, in black, when every series shares it (same device, same traffic)."""
    curves = [rows[[x, column]].drop_duplicates().to_numpy().tolist() for _, rows in series]
    if all(c == curves[0] for c in curves):
        ax.plot(series[0][1][x], series[0][1][column], color="black", linestyle=linestyle, label=what)
        return
    for color, (label, rows) in zip(_colors(series), series, strict=True):
        ax.plot(rows[x], rows[column], color=color, linestyle=linestyle, label=_label(label, what))


def _throughput(series, x: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for color, (label, rows) in zip(_colors(series), series, strict=True):
        _errorbar(ax, rows, x, "output_throughput", _label(label, "simulated"), color=color, marker="o")
    _reference(ax, series, x, "capacity_tokens_per_s_mean", "capacity B/τ(B)", "--")
    if x == RATE:
        _reference(ax, series, x, "offered_tokens_per_s_mean", "offered λ·E[out]", ":")
    ax.set_ylabel("output tokens/s")
    ax.set_title("throughput")
    return _finish(fig, ax, _xlabel(x), path)


def _goodput(series, x: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for color, (label, rows) in zip(_colors(series), series, strict=True):
        _errorbar(ax, rows, x, "request_goodput", _label(label, "goodput"), color=color, marker="o")
        _errorbar(ax, rows, x, "request_throughput", _label(label, "completed"), color=color, marker=".",
                  linestyle=":")
    ax.set_ylabel("requests/s")
    ax.set_title("goodput (requests meeting every SLO)")
    return _finish(fig, ax, _xlabel(x), path)


def _batch_throughput(series, points: dict[int, Point], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for color, (label, rows) in zip(_colors(series), series, strict=True):
        replicas = np.array([points[j].scenario.cluster.replicas for j in rows.index])
        # Output tokens per busy second of one engine: the device's own rate, idle time taken out.
        busy_rate = rows["output_throughput_mean"] / (rows["busy_fraction_mean"] * replicas)
        ax.plot(rows["mean_batch_size_mean"], busy_rate, "o", color=color, label=_label(label, "simulated"))
        device = points[rows.index[0]].scenario.device
        b = np.linspace(1, max(float(rows["mean_batch_size_mean"].max()), float(rows[BATCH].max())), 200)
        ax.plot(b, [decode_throughput(device, v) for v in b], color=color, linestyle="--",
                label=_label(label, f"B/(τ0+βB), τ0={device.tau0_ms:g} ms, β={device.beta_ms:g} ms"))
        if np.isfinite(roofline_tokens_per_s(device)):
            ax.axhline(roofline_tokens_per_s(device), color=color, linestyle=":",
                       label=_label(label, "roofline 1/β"))
    ax.set_ylabel("output tokens per busy second")
    ax.set_title("decode throughput vs batch size")
    return _finish(fig, ax, "mean batch size (sequences per step)", path, note=None)


def plot_sweep(frame: pd.DataFrame, points: list[Point], keys: list[str], out: Path) -> list[Path]:
    """Draw every figure that applies to this sweep into ``out``; returns the files written."""
    good = frame[frame["replications"] > 0]
    if good.empty or not keys:
        return []
    x = _x_key(keys, good)
    series = _series(good, keys, x)
    written = [_latency(series, x, out / "latency.png"), _throughput(series, x, out / "throughput.png")]
    if "request_goodput_mean" in good:
        written.append(_goodput(series, x, out / "goodput.png"))
    # The device curve is one device's; a heterogeneous fleet has several, so it gets no such figure.
    if BATCH in keys and all(p.scenario is None or p.scenario.cluster.replica_specs is None for p in points):
        by_index = dict(enumerate(points))
        written.append(_batch_throughput(_series(good, [k for k in keys if k != RATE], BATCH), by_index,
                                         out / "batch_throughput.png"))
    return written


def plot_slo_vs_rate(probes: pd.DataFrame, slos: list, keys: list[str], capacity: pd.DataFrame, path: Path) -> Path:
    """``slo_vs_rate.png``: each SLO's metric at every rate the search simulated, against its limit.

    One panel per SLO, one line per configuration (its probes in rate order; filled where every SLO
    was met); the limit dashed, each configuration's ``max_rate`` dotted. The curve is where the
    search found the edge: it rises with the rate, and max_rate is the last rate under every limit.
    """
    fig, axes = plt.subplots(1, len(slos), figsize=(6.5 * len(slos), 4.5), squeeze=False)
    labels = [", ".join(f"{k.rsplit('.', 1)[-1]}={row[k]}" for k in keys) for _, row in capacity.iterrows()]
    palette = colors(labels)
    for ax, slo in zip(axes[0], slos, strict=True):
        for i, label in enumerate(labels):
            rows = probes[probes["config"] == i].sort_values("rate")
            if rows.empty:
                continue
            color = palette[label]
            ax.plot(rows["rate"], rows[slo.key], color=color, label=label or "probes")
            met = rows["met"].astype(bool)
            ax.scatter(rows["rate"][met], rows[slo.key][met], color=color, zorder=3)
            ax.scatter(rows["rate"][~met], rows[slo.key][~met], facecolors="white", edgecolors=color, zorder=3)
            if np.isfinite(capacity["max_rate"].iloc[i]):
                ax.axvline(capacity["max_rate"].iloc[i], color=color, linestyle=":", linewidth=1.2)
        ax.axhline(slo.limit_ms, color="0.35", linestyle="--", label=f"limit {slo.limit_ms:g} ms")
        ax.set_ylabel(f"{slo.key} (ms, mean over replications)")
        ax.set_title(f"{slo.key} against arrival rate (filled: every SLO met)")
    return _finish(fig, axes[0], _xlabel(RATE), path, note="dotted: max_rate, the highest rate meeting every SLO")
