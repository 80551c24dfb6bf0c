"""Draw ``docs/img/static_vs_continuous.png``, the README's picture, from two simbatch runs.

The same seeded traffic (Poisson arrivals, heavy-tailed output lengths) is served by static and by
continuous batching on the same device with 32 slots. Left: sequences computing a token at each
step, where static batches drain to a straggler while continuous batching backfills. Right:
requests completed against requests arrived, where the static server falls behind.

    .venv/bin/python scripts/make_readme_figure.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

import simbatch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "static_vs_continuous.png"
RATE = 4.5  # requests/s: continuous batching keeps up (utilization ~0.85), static batching cannot
COLORS = {"static": "#d1495b", "continuous": "#00798c"}


def scenario(mode: str, num_requests: int) -> simbatch.Scenario:
    return simbatch.Scenario.model_validate({
        "name": f"readme_{mode}",
        "seed": 7,
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": RATE},
                     "prompt_tokens": {"dist": "choice", "values": [20, 40, 80, 600]},
                     "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 1.0, "max": 2000}},
        "device": {"tau0_ms": 20, "beta_ms": 0.2, "prefill_ms_per_token": 0.01},
        "batching": {"mode": mode, "max_num_seqs": 32},
    })


def draw(results: dict[str, simbatch.Result], window_s: float) -> Figure:
    fig = Figure(figsize=(11, 4.2), dpi=110, layout="constrained")
    busy, done = fig.subplots(1, 2)
    for mode, r in results.items():
        it = r.iterations[r.iterations["start_s"] < window_s]
        busy.step(it["start_s"], it["batch_size"], where="post", color=COLORS[mode], lw=1.2,
                  label=f"{mode}: {r.summary['output_throughput']:,.0f} tokens/s")
        finish = np.sort(r.requests["finish_s"].dropna().to_numpy())
        done.step(finish, np.arange(1, len(finish) + 1), where="post", color=COLORS[mode], label=f"{mode}: completed")
    arrivals = np.sort(next(iter(results.values())).requests["arrival_s"].to_numpy())
    done.step(arrivals, np.arange(1, len(arrivals) + 1), where="post", color="grey", ls="--", label="arrived")
    busy.axhline(32, color="black", lw=0.8, ls=":")
    busy.set(xlim=(0, window_s), ylim=(0, 34), xlabel="time (s)", ylabel="sequences computing a token",
             title="Slots doing useful work (max_num_seqs = 32)")
    busy.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8)
    done.set(xlabel="time (s)", ylabel="requests", title="Same traffic: completed vs arrived")
    done.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    for ax in (busy, done):
        ax.grid(alpha=0.3)
    fig.suptitle("Static batching idles finished slots until the longest request ends; continuous batching refills them every step",
                 fontsize=10)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--small", action="store_true", help="fewer requests (a quick check, not the README image)")
    args = parser.parse_args(argv)
    num_requests = 60 if args.small else 360
    results = {mode: simbatch.simulate(scenario(mode, num_requests)) for mode in ("static", "continuous")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    draw(results, window_s=num_requests / RATE).savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
