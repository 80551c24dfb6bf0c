"""Sliders for the lessons: move one, and a small simulation reruns and redraws.

:func:`explore` is the whole lesson-sized experiment, a pure function of its parameters: Poisson
arrivals of exponential-length answers to ``replicas`` continuous-batching engines of
``max_num_seqs`` slots each, one step over ``B`` sequences taking ``tau0 + beta B``. It simulates
:data:`HORIZON_S` seconds of arrivals (a few hundred requests, well under a second of computing),
puts the queueing theory of lesson 9 next to the measurement, and draws one figure. A lesson calls it
once with fixed values for a static figure, which is what a notebook viewer without a kernel shows,
and then :func:`sliders`, which binds :func:`show` to one slider per parameter for a live kernel.

ipywidgets is imported only by :func:`sliders`: the rest runs wherever simbatch does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import numpy as np

from simbatch.analysis import capacity, theory
from simbatch.config import Device, Exponential, Scenario
from simbatch.simulation import Result, simulate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HORIZON_S = 60.0  # seconds of arrivals per redraw: enough to see a queue build, fast enough to drag a slider
PROMPT_TOKENS = 32  # prefill is free here (gamma = 0): the sliders are about decoding
ROUTERS = ("least_outstanding", "power_of_two", "round_robin", "random")
POLICIES = ("fcfs", "sjf")
DEFAULTS = {"rate": 3.0, "mean_output_tokens": 500, "max_num_seqs": 64, "tau0_ms": 20.0, "beta_ms": 0.2,
            "replicas": 1, "router": "least_outstanding", "policy": "fcfs"}


@dataclass(frozen=True)
class Exploration:
    """One slider setting: the run, the per-replica prediction and the figure drawn from them.

    ``offered_load`` is the stability check's rho (per replica, traffic split evenly).
    ``predicted_latency_s`` is the mean latency of lesson 9's birth-death chain for one replica at
    lambda / replicas (exact below the slot limit for any length law, random routing's value for a
    fleet, which informed routers beat), or None where rho >= 1 and no steady state exists.
    """

    result: Result
    offered_load: float
    predicted_latency_s: float | None
    figure: Figure


def scenario(rate: float, mean_output_tokens: float, max_num_seqs: int, tau0_ms: float, beta_ms: float,
             replicas: int, router: str, policy: str, seed: int = 0) -> Scenario:
    """The lesson-sized scenario the sliders set."""
    return Scenario.model_validate({
        "seed": seed,
        "workload": {"duration_s": HORIZON_S, "arrival": {"rate": rate},
                     "prompt_tokens": {"dist": "fixed", "value": PROMPT_TOKENS},
                     "output_tokens": {"dist": "exponential", "mean": mean_output_tokens}},
        "device": {"tau0_ms": tau0_ms, "beta_ms": beta_ms},
        "batching": {"max_num_seqs": max_num_seqs},
        "scheduler": {"policy": policy},
        "cluster": {"replicas": replicas, "router": router},
    })


def explore(rate: float = DEFAULTS["rate"], mean_output_tokens: float = DEFAULTS["mean_output_tokens"],
            max_num_seqs: int = DEFAULTS["max_num_seqs"], tau0_ms: float = DEFAULTS["tau0_ms"],
            beta_ms: float = DEFAULTS["beta_ms"], replicas: int = DEFAULTS["replicas"],
            router: str = DEFAULTS["router"], policy: str = DEFAULTS["policy"]) -> Exploration:
    """Simulate one slider setting and draw it: requests running and waiting over time, beside the
    latency histogram with the measured and the predicted mean."""
    sc = scenario(rate, mean_output_tokens, max_num_seqs, tau0_ms, beta_ms, replicas, router, policy)
    result = simulate(sc)
    device = Device(tau0_ms=tau0_ms, beta_ms=beta_ms)
    # E[out] of ceil(Exp(mean)), exactly: the chain needs the mean the simulator draws.
    mean_out = theory.length_moments(Exponential(dist="exponential", mean=mean_output_tokens))[0]
    rho = capacity.stability(device, max_num_seqs, rate, mean_out, replicas=replicas).offered_load
    predicted = theory.batching_mean_latency_s(device, max_num_seqs, rate / replicas, mean_out) if rho < 1 else None
    return Exploration(result, rho, predicted, _draw(result, rho, predicted, max_num_seqs * replicas))


def show(**settings) -> None:
    """The slider callback: :func:`explore` with the sliders' values, the figure shown and released."""
    exploration = explore(**settings)
    plt.show()
    plt.close(exploration.figure)


HEADLESS_ENV = "SIMBATCH_HEADLESS_KERNEL"
"""Set by scripts/run_notebooks.py for the kernels it runs lessons in, which have no one to show controls to."""


def sliders(**initial):
    """One slider or menu per parameter of :func:`explore`, bound to :func:`show` (needs ipywidgets).

    In a headless kernel (:data:`HEADLESS_ENV`) there are none, and None is returned: a panel there
    draws into a live Output widget nobody sees, and now and then that left nbclient and the kernel
    waiting on each other for the whole cell timeout (both idle; jupyter/nbclient#312). The saved
    lesson shows the static figure drawn just before either way.
    """
    return panel(show, {**DEFAULTS, **initial}, {
        "rate": ("float", "λ (requests/s)", 0.1, 40.0, 0.1),
        "mean_output_tokens": ("int", "E[out] (tokens)", 20, 1000, 10),
        "max_num_seqs": ("int", "B_max (slots)", 1, 256, 1),
        "tau0_ms": ("float", "τ0 (ms)", 1.0, 50.0, 0.5),
        "beta_ms": ("float", "β (ms)", 0.0, 1.0, 0.01),
        "replicas": ("int", "replicas", 1, 8, 1),
        "router": ROUTERS,
        "policy": POLICIES,
    })


def panel(callback, values: dict, controls: dict):
    """``callback`` bound to one control per entry of ``controls``, starting at ``values`` (needs ipywidgets).

    A control is ``(kind, description, low, high, step)`` with kind ``"int"`` or ``"float"`` (a
    slider), or a tuple of option strings (a menu). In a headless kernel (:data:`HEADLESS_ENV`) no
    panel is built and None is returned (see :func:`sliders`). Every lesson's sliders come through here.
    """
    if os.environ.get(HEADLESS_ENV) == "1":
        return None
    import ipywidgets

    def control(name: str, spec):
        if isinstance(spec[0], str) and spec[0] in ("int", "float"):
            kind, description, low, high, step = spec
            # Redraw on release, not on every pixel of a drag: a redraw may be a whole simulation.
            return (ipywidgets.IntSlider if kind == "int" else ipywidgets.FloatSlider)(
                value=values[name], min=low, max=high, step=step, description=description, continuous_update=False,
                style={"description_width": "150px"}, layout=ipywidgets.Layout(width="480px"))
        return ipywidgets.Dropdown(options=spec, value=values[name], description=name,
                                   style={"description_width": "150px"})

    return ipywidgets.interactive(callback, **{name: control(name, spec) for name, spec in controls.items()})


def _in_system(result: Result, grid_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(running, waiting) summed over replicas at each instant of ``grid_s``, from the iterations frame."""
    running, waiting = np.zeros(len(grid_s)), np.zeros(len(grid_s))
    for _, rows in result.iterations.groupby("replica"):
        at = np.searchsorted(rows["start_s"].to_numpy(), grid_s, side="right") - 1
        live = at >= 0
        running[live] += rows["num_running"].to_numpy()[at[live]]
        waiting[live] += rows["num_waiting"].to_numpy()[at[live]]
    return running, waiting


def _draw(result: Result, rho: float, predicted_s: float | None, slots: int) -> Figure:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    end_s = float(result.iterations["end_s"].max()) if len(result.iterations) else HORIZON_S
    grid_s = np.linspace(0.0, end_s, 400)
    running, waiting = _in_system(result, grid_s)
    left.plot(grid_s, running, label="running")
    left.plot(grid_s, waiting, label="waiting for a slot")
    left.axhline(slots, color="grey", lw=0.8, ls=":", label=f"{slots} slots")
    left.axvline(HORIZON_S, color="k", lw=0.8, label="arrivals stop")
    left.set(xlabel="simulated time (s)", ylabel="requests",
             title=f"offered load ρ = {rho:.2f}: {'stable' if rho < 1 else 'the queue grows'}")
    left.legend(fontsize=8)
    e2e_s = result.requests["e2e_s"].dropna().to_numpy()
    right.hist(e2e_s, bins=30, color="C0", alpha=0.7)
    measured = float(e2e_s.mean()) if len(e2e_s) else math.nan
    right.axvline(measured, color="C1", lw=2, label=f"measured mean {measured:.1f} s")
    if predicted_s is not None:
        right.axvline(predicted_s, color="k", ls="--", label=f"birth–death chain {predicted_s:.1f} s")
    right.set(xlabel="E2E latency (s)", ylabel="requests", title=f"{len(e2e_s)} requests, p99 TTFT "
              f"{result.summary['p99_ttft_ms']:,.0f} ms")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
