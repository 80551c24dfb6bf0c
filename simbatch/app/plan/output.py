"""What a plan writes: the ranked table, every candidate's fate, every probe, the Pareto front, a report.

Files of the result folder (beside the runs' store, ``manifest.json`` and ``points/``):

- ``plan.csv``: the ranked configurations, best first (columns below);
- ``candidates.csv``: every configuration of the search space: its closed-form capacity and stable
  minimum, its status (``ranked``, ``meets`` (not in the top), ``outranked`` (never simulated, or
  stopped, because its bound could not beat the top), ``rejected`` (by simulation), ``screened`` (by the
  closed forms)) and why;
- ``probes.csv``: every point simulated (configuration, size, rate, the limits' means and 95 %
  half-widths, output tokens/s per GPU, tokens/s per user, met);
- ``pareto.png``: output tokens/s per GPU against tokens/s per user (1000 / mean TPOT ms) of every
  probe, those meeting the SLOs filled, the front of those drawn, the winner starred;
- ``plan.json``: the winner, its ``vllm serve`` lines and replica counts, the SLOs and the objective;
- ``report.html``: all of it on one page (the figure inlined; ``simbatch view FOLDER`` opens it).

Columns of the ranked table: ``cost_per_hour`` (GPUs x price per GPU-hour), ``cost_per_million_output_tokens``
at the planned rate, ``gpus``, ``replicas``, ``headroom_rate`` (the highest rate, requests/s, at which every
limit still held; ``headroom_x`` that over the planned rate), ``binding`` (the limit that fails first above
the headroom, or stability, with the closed form's binding resource), each limit's mean (and
``_ci95``) at the planned rate, ``kwh_per_hour`` and ``output_tokens_per_joule``
(:mod:`simbatch.analysis.planning`'s power model; empty when the GPU's power is unknown),
``goodput_per_dollar`` (requests within the SLOs per dollar at the headroom).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from simbatch.analysis.planning import cost_per_million_tokens, gpu_watts, pareto_front
from simbatch.app.plan.launch import Launch, vllm_serve
from simbatch.app.plan.limits import failures
from simbatch.app.plan.search import Candidate, Plan, headroom_binding, sort_key
from simbatch.app.results import json_safe
from simbatch.app.sweep.store import write_atomic
from simbatch.app.text import spreadsheet_safe_frame

SHOWN_REJECTED = 5


def _mean(combined: dict[str, Any], key: str) -> float:
    return combined.get(f"{key}_mean", math.nan)


def _card(cand: Candidate):
    """The GPU card of the candidate: its preset's, or for a calibrated device the shipped card of its GPU."""
    from simbatch.hardware.cards import shipped
    from simbatch.inputs.resolve import deployment

    preset = deployment(cand.screen.point.scenario.device)
    if preset is not None:
        return preset.gpu
    return {name.lower(): card for name, card in shipped()[0].items()}.get(cand.config.gpu.lower())


def energy(plan: Plan, cand: Candidate) -> tuple[float, float]:
    """(kWh per hour, output tokens per joule) of the candidate's fleet at the planned rate (NaN if unknown)."""
    power = plan.question.prices.power(cand.config.gpu, _card(cand))
    if power is None:
        return math.nan, math.nan
    at = cand.at[cand.ok]
    watts = cand.config.gpus(cand.ok) * gpu_watts(power.idle_watts, power.max_watts, _mean(at, "busy_fraction"))
    return watts / 1e3, _mean(at, "output_throughput") / watts


def ranked_frame(plan: Plan) -> pd.DataFrame:
    """``plan.csv``: one row per ranked configuration, best first."""
    q = plan.question
    rows = []
    for rank, cand in enumerate(plan.ranked, 1):
        at, cost = cand.at[cand.ok], cand.cost(cand.ok)
        kwh, per_joule = energy(plan, cand)
        rows.append({
            "rank": rank, "configuration": cand.config.label, "gpu": cand.config.gpu,
            "tensor_parallel_size": cand.config.tensor_parallel_size, "max_num_seqs": cand.config.max_num_seqs,
            "max_num_batched_tokens": cand.config.max_num_batched_tokens, "split": cand.config.layout.label,
            "replicas": cand.config.replicas(cand.ok), "gpus": cand.config.gpus(cand.ok),
            "usd_per_gpu_hour": cand.price, "cost_per_hour": cost,
            "cost_per_million_output_tokens": cost_per_million_tokens(cost, _mean(at, "output_throughput")),
            "headroom_rate": cand.headroom_rate, "headroom_x": cand.headroom_rate / q.rate,
            "binding": headroom_binding(cand, q.limits),
            **{k: v for lim in q.limits for k, v in ((lim.key, _mean(at, lim.key)),
                                                      (f"{lim.key}_ci95", at.get(f"{lim.key}_ci95", math.nan)))},
            "output_throughput": _mean(at, "output_throughput"), "busy_fraction": _mean(at, "busy_fraction"),
            "kwh_per_hour": kwh, "output_tokens_per_joule": per_joule,
            "goodput_per_dollar": cand.goodput_per_dollar(),
            "capacity_requests_per_s": cand.ok * cand.screen.capacity,
        })
    return pd.DataFrame(rows)


def _status(cand: Candidate, ranked: set[int]) -> str:
    if id(cand) in ranked:
        return "ranked"
    return {"sized": "meets", "headroom": "meets", "queued": "outranked", "sizing": "outranked"}.get(
        cand.status, cand.status)


def candidates_frame(plan: Plan) -> pd.DataFrame:
    """``candidates.csv``: every configuration, in the search space's order."""
    ranked = {id(c) for c in plan.ranked}
    rows = []
    for cand in plan.candidates:
        s = cand.screen
        rows.append({"configuration": cand.config.label, "gpu": cand.config.gpu, "usd_per_gpu_hour": cand.price,
                     "capacity_requests_per_s": s.capacity, "limited_by": s.limited_by,
                     "min_replicas": cand.config.replicas(s.min_units) if math.isfinite(s.min_units) else math.inf,
                     "status": _status(cand, ranked),
                     "replicas": cand.config.replicas(cand.ok) if cand.ok else math.nan,
                     "cost_per_hour": cand.cost(cand.ok) if cand.ok else math.nan,
                     "simulated_sizes": len(cand.at),
                     "why": s.reason or cand.note,
                     **{f"bound_{k}": v for k, v in s.bounds.items()}})
    return pd.DataFrame(rows)


def rejected(plan: Plan) -> list[dict[str, Any]]:
    """The best rejected candidates (a configuration at a size), best first by the objective: each with
    its cost, what judged it (the closed forms or a simulation) and why it fails."""
    q = plan.question
    out = []
    for cand in plan.candidates:
        if cand.screen.reason.startswith("invalid"):
            continue  # not a candidate that fails: a combination that does not exist (candidates.csv has it)
        if not cand.screen.survived:
            units = cand.screen.min_units if math.isfinite(cand.screen.min_units) else 1
            out.append({"cand": cand, "units": units, "by": "closed form", "why": cand.screen.reason})
        for units, combined in cand.at.items():
            if why := failures(q.limits, combined):
                out.append({"cand": cand, "units": units, "by": f"simulated ({combined.get('replications', 0)} "
                            "replications)", "why": "; ".join(why)})
    objective = "cost" if q.objective == "goodput-per-dollar" else q.objective
    out.sort(key=lambda r: sort_key(objective, r["cand"], r["units"]))
    shown, devices = [], set()
    for r in out:  # the best of each device: five L4 settings failing alike say less than five devices
        if r["cand"].config.device not in devices and len(shown) < SHOWN_REJECTED:
            devices.add(r["cand"].config.device)
            shown.append(r)
    return [{**r, "replicas": r["cand"].config.replicas(r["units"]), "gpus": r["cand"].config.gpus(r["units"]),
             "cost_per_hour": r["cand"].cost(r["units"]), "configuration": r["cand"].config.label} for r in shown]


def launches(plan: Plan) -> list[Launch]:
    best = plan.ranked[0]
    return vllm_serve(best.config, best.screen.point.scenario, best.ok)


def plan_record(plan: Plan) -> dict[str, Any]:
    """``plan.json``: the question and the winner."""
    q, best = plan.question, plan.ranked[0]
    frame = ranked_frame(plan)
    return json_safe({
        "objective": q.objective, "rate": q.rate, "limits": [lim.text for lim in q.limits],
        "replications": q.replications, "tolerance": q.tolerance, "prices": q.prices.label,
        "winner": frame.iloc[0].to_dict(),
        "launch": [{"role": lc.role, "replicas": lc.replicas, "command": lc.command, "notes": list(lc.notes)}
                   for lc in launches(plan)],
        "router": best.screen.point.scenario.cluster.router,
    })


def pareto_figure(plan: Plan):
    """Output tokens/s per GPU against tokens/s per user of every probe (module docstring)."""
    from simbatch.app.plots.figure import colors, new_figure

    probes = pd.DataFrame(plan.probes)
    fig, ax = new_figure(height_in=5.0)
    if probes.empty:
        return fig
    palette = colors(sorted(probes["gpu"].unique()))
    for gpu, rows in probes.groupby("gpu", sort=True):
        met = rows["met"].astype(bool)
        ax.scatter(rows.loc[met, "tokens_per_s_per_user"], rows.loc[met, "output_tokens_per_s_per_gpu"],
                   color=palette[gpu], s=22, label=gpu)
        ax.scatter(rows.loc[~met, "tokens_per_s_per_user"], rows.loc[~met, "output_tokens_per_s_per_gpu"],
                   facecolors="none", edgecolors=palette[gpu], s=22, alpha=0.6)
    ax.scatter([], [], color="black", s=22, label="filled: meets the SLOs")
    ax.scatter([], [], facecolors="none", edgecolors="black", s=22, label="hollow: misses them")
    good = probes[probes["met"].astype(bool)]
    front = good[pareto_front(good["tokens_per_s_per_user"], good["output_tokens_per_s_per_gpu"])]
    front = front.sort_values("tokens_per_s_per_user")
    if len(front):
        ax.plot(front["tokens_per_s_per_user"], front["output_tokens_per_s_per_gpu"], "k-", lw=1,
                label="Pareto front of the points meeting the SLOs")
    best = plan.ranked[0] if plan.ranked else None
    if best is not None:
        at = best.at[best.ok]
        tpot = _mean(at, "mean_tpot_ms")
        ax.scatter([1e3 / tpot], [_mean(at, "output_throughput") / best.config.gpus(best.ok)], marker="*", s=220,
                   color="gold", edgecolors="black", zorder=5, label=f"chosen: {best.config.label}")
    ax.set_xlabel("tokens/s per user (1000 / mean TPOT ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"every simulated point of the plan at {plan.question.rate:.3g} req/s and above")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", loc="best", framealpha=0.9)
    return fig


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, metadata={"Software": None})
    return buffer.getvalue()


def _table_html(frame: pd.DataFrame) -> str:
    def cell(v):
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:,.4g}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def report_html(plan: Plan, png: bytes, lines: list[str]) -> str:
    """One self-contained page: the verdict lines, the ranked table, the rejected, the figure."""
    q = plan.question
    shown = ranked_frame(plan)
    misses = pd.DataFrame([{k: r[k] for k in ("configuration", "replicas", "gpus", "cost_per_hour", "by", "why")}
                           for r in rejected(plan)])
    image = base64.b64encode(png).decode("ascii")
    text = "\n".join(lines)
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right} th{background:#eee} pre{background:#f6f6f6;"
             "padding:1em;white-space:pre-wrap}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>simbatch plan</title><style>{style}</style>"
            f"</head><body><h1>simbatch plan: {html.escape(q.objective)} at {q.rate:.4g} req/s</h1>"
            f"<pre>{html.escape(text)}</pre><h2>Ranked configurations</h2>{_table_html(shown)}"
            f"<h2>Best rejected candidates</h2>{_table_html(misses) if len(misses) else '<p>none</p>'}"
            f"<h2>Pareto front</h2><img alt='Pareto front' src='data:image/png;base64,{image}'>"
            "</body></html>\n")


def _csv(frame: pd.DataFrame) -> str:
    """A frame as CSV whose text cells a spreadsheet shows as text (a device may be named ``=...``)."""
    return spreadsheet_safe_frame(frame).to_csv(index=False)


def write_unranked(plan: Plan, out: Path) -> list[Path]:
    """A plan with no answer: ``candidates.csv`` and ``probes.csv``, every candidate's fate."""
    write_atomic(out / "candidates.csv", _csv(candidates_frame(plan)))
    write_atomic(out / "probes.csv", _csv(pd.DataFrame(plan.probes)))
    return [out / "candidates.csv", out / "probes.csv"]


def write(plan: Plan, out: Path, lines: list[str]) -> list[Path]:
    """Every file of the module docstring, each written atomically; returns their paths."""
    from simbatch.app.plots.figure import save_figure

    files = {"plan.csv": _csv(ranked_frame(plan)), "candidates.csv": _csv(candidates_frame(plan)),
             "probes.csv": _csv(pd.DataFrame(plan.probes)),
             "plan.json": json.dumps(plan_record(plan), indent=2, allow_nan=False) + "\n"}
    for name, text in files.items():
        write_atomic(out / name, text)
    fig = pareto_figure(plan)
    figure = save_figure(fig, out / "pareto.png")
    write_atomic(out / "report.html", report_html(plan, _png(fig), lines))
    return [out / name for name in files] + [figure, out / "report.html"]

