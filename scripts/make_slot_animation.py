"""Draw ``docs/img/slot_timeline.gif``, the README's animation of static against continuous batching.

The same seeded requests reach two 6-slot servers, one batching statically and one continuously.
Each panel has one row per slot: a bar is a request in its slot, coloured by request; a hatched bar
is a slot whose request has finished but which static batching keeps locked (computed as padding)
until the batch's last member finishes. Beside each, the waiting queue: the requests that have
arrived and have no slot yet. Continuous batching hands a freed slot to the head of the queue at the
next step; static batching makes the queue wait for the whole batch.

    .venv/bin/python scripts/make_slot_animation.py           # writes docs/img/slot_timeline.gif
    .venv/bin/python scripts/make_slot_animation.py --out /tmp/x.gif --frames 20

Pillow, which ships with matplotlib, writes the GIF.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import simbatch
from simbatch.app.teaching.timeline import slot_timeline

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img" / "slot_timeline.gif"
SLOTS = 6
QUEUE_COLUMNS = 3  # waiting requests drawn in columns of SLOTS boxes beside the lanes
MODES = ("static", "continuous")


def scenario(mode: str) -> simbatch.Scenario:
    """Poisson arrivals of heavy-tailed answers (a few long ones among many short), fast enough that
    static batching's queue builds while continuous batching keeps up."""
    return simbatch.Scenario.model_validate({
        "name": f"slot_timeline_{mode}", "seed": 3,
        "workload": {"num_requests": 30, "arrival": {"rate": 6},
                     "prompt_tokens": {"dist": "fixed", "value": 16},
                     "output_tokens": {"dist": "lognormal", "mean": 40, "sigma": 1.0, "max": 300}},
        "device": {"tau0_ms": 20, "beta_ms": 0.2},
        "batching": {"mode": mode, "max_num_seqs": SLOTS},
    })


def animate(frames: int, out: Path) -> Path:
    runs = {mode: simbatch.simulate(scenario(mode)).requests for mode in MODES}
    timelines = {mode: slot_timeline(runs[mode], SLOTS, static=mode == "static") for mode in MODES}
    end_s = max(float(t["release_s"].max()) for t in timelines.values())
    colors = colormaps["tab20"]
    fig = Figure(figsize=(11, 3.6), dpi=72, layout="constrained")
    axes = dict(zip(MODES, fig.subplots(1, 2), strict=True))

    def draw(now_s: float) -> None:
        for mode, ax in axes.items():
            ax.clear()
            t, req = timelines[mode], runs[mode]
            for row in t.itertuples():
                if row.start_s > now_s:
                    continue
                color = colors(row.request_id % 20)
                ran_to = min(row.finish_s, now_s)
                ax.add_patch(Rectangle((row.start_s, row.slot + 0.1), ran_to - row.start_s, 0.8, color=color))
                if row.release_s > row.finish_s and now_s > row.finish_s:  # finished, slot still locked
                    ax.add_patch(Rectangle((row.finish_s, row.slot + 0.1), min(row.release_s, now_s) - row.finish_s,
                                           0.8, facecolor="white", edgecolor=color, hatch="////", lw=0.8))
            waiting = req[(req["arrival_s"] <= now_s) & ~(req["first_scheduled_s"] <= now_s)]
            queue_x0 = end_s * 1.04
            box_w = end_s * 0.05
            for i, request_id in enumerate(waiting["request_id"]):
                col, slot = divmod(i, SLOTS)
                if col < QUEUE_COLUMNS:
                    ax.add_patch(Rectangle((queue_x0 + col * box_w, slot + 0.15), box_w * 0.85, 0.7,
                                           color=colors(request_id % 20)))
            if len(waiting) > QUEUE_COLUMNS * SLOTS:
                ax.text(queue_x0 + QUEUE_COLUMNS * box_w, SLOTS - 0.05, f"+{len(waiting) - QUEUE_COLUMNS * SLOTS}",
                        ha="right", va="bottom", fontsize=8)
            ax.axvline(now_s, color="k", lw=0.8)
            ax.axvline(queue_x0 - end_s * 0.01, color="grey", lw=0.6)
            done = int((req["finish_s"] <= now_s).sum())
            ax.set(xlim=(0, queue_x0 + QUEUE_COLUMNS * box_w), ylim=(SLOTS, 0), yticks=np.arange(SLOTS) + 0.5,
                   yticklabels=[f"slot {s}" for s in range(SLOTS)], xlabel="time (s)",
                   title=f"{mode}: {done} done, {len(waiting)} waiting (right) at t = {now_s:4.1f} s")
        axes["static"].text(end_s * 0.99, SLOTS - 0.05, "hatched: finished, slot locked", ha="right", va="bottom",
                            fontsize=8)

    animation = FuncAnimation(fig, draw, frames=np.linspace(0, end_s, frames))
    out.parent.mkdir(parents=True, exist_ok=True)
    animation.save(out, writer=PillowWriter(fps=8))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"GIF to write (default {OUT.relative_to(ROOT)})")
    parser.add_argument("--frames", type=int, default=96, help="frames, spread evenly over the runs (8 per second)")
    args = parser.parse_args(argv)
    if args.frames < 2:
        print(f"--frames {args.frames}: an animation needs at least 2 frames; give --frames 2 or more", file=sys.stderr)
        return 2
    print(f"wrote {animate(args.frames, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
