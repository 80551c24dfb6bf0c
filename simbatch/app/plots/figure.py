"""Figures without pyplot: every plot is a fresh ``Figure`` on its own Agg canvas.

Nothing is registered with pyplot's global figure manager, so no state leaks from one plot to the
next, nothing needs closing, and plotting works the same on a headless server as in a notebook.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simbatch.app.atomic import atomic_file
from simbatch.registry import MODES

# One colour per batching mode across every plot, so a student can follow a mode from plot to plot: the
# modes of simbatch.registry.MODES in registration order (static red, dynamic orange, continuous blue),
# then the others' cycle for modes registered later.
_MODE_PALETTE = ("#d62728", "#ff7f0e", "#1f77b4")
_OTHERS = ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
MODE_COLORS = dict(zip(MODES.names(), _MODE_PALETTE + _OTHERS, strict=False))


class Frames(Protocol):
    """What a plot reads from one simulation (a :class:`~simbatch.simulation.Result` qualifies)."""

    iterations: pd.DataFrame
    requests: pd.DataFrame


class Run(NamedTuple):
    """The two frames of one simulation, e.g. read back from a result folder's CSV files."""

    iterations: pd.DataFrame
    requests: pd.DataFrame


_MODE_IN_LABEL = re.compile(r"(?:^|[ ,])mode=([a-z][a-z0-9_]*)(?:$|[ ,])")


def mode_of(label: str) -> str | None:
    """The batching mode a label names: ``static``, or ``mode=static`` among other settings."""
    if label in MODE_COLORS:
        return label
    found = _MODE_IN_LABEL.search(label)
    return found.group(1) if found and found.group(1) in MODE_COLORS else None


def colors(labels: Iterable[str]) -> dict[str, str]:
    """A colour per label, the one colour map of every simbatch plot (runs, comparisons, sweeps).

    When each label names a different batching mode (``static``, or ``mode=static, rate=4``), it
    gets its mode's colour, so static is the same red in every figure; otherwise a fixed cycle.
    """
    labels = list(labels)
    modes = [mode_of(label) for label in labels]
    if None not in modes and len(set(modes)) == len(modes):
        return {label: MODE_COLORS[mode] for label, mode in zip(labels, modes, strict=True)}
    others = iter(_OTHERS * (1 + len(labels) // len(_OTHERS)))
    return {label: MODE_COLORS.get(label) or next(others) for label in labels}


def new_figure(nrows: int = 1, height_in: float = 4.2, **subplots: Any) -> tuple[Figure, Any]:
    """A figure with ``nrows`` stacked axes, attached to an Agg canvas."""
    fig = Figure(figsize=(9.0, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, 1, **subplots)


def finish_axes(ax: Axes, ylabel: str, *, xlabel: str | None = "simulated time (s)", legend: bool = True) -> None:
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.grid(True, alpha=0.3)
    ax.margins(x=0)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best", fontsize="small", framealpha=0.9)


def step_line(ax: Axes, edges: np.ndarray, values: np.ndarray, **style: Any) -> None:
    """Bin means drawn as one line at ``values[i]`` over ``[edges[i], edges[i+1])``; a NaN bin is a gap.

    As ``Axes.stairs`` draws them, but a line: matplotlib finds a patch's data limits curve by curve
    (30 ms for 600 bins), a line's from its vertices at once.
    """
    ax.plot(np.repeat(edges, 2)[1:-1], np.repeat(values, 2), **style)


def step_band(ax: Axes, edges: np.ndarray, low: np.ndarray | float, high: np.ndarray, **style: Any) -> None:
    """The area between two series of bin means, each flat over its bin (see :func:`step_line`)."""
    x = np.repeat(edges, 2)[1:-1]
    ax.fill_between(x, np.repeat(np.broadcast_to(low, np.shape(high)), 2), np.repeat(high, 2), **style)


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as a PNG (whole or not at all) and return the path."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path
