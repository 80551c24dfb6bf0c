"""Fit the device costs to a server's own measurements: per-step timings, or ``vllm bench serve`` results.

Both kinds of input become rows of one linear system in the five costs
``theta = (tau0_ms, beta_ms, prefill_ms_per_token, kv_read_ms_per_1k_tokens, prefill_attention_ms_per_1m_pairs)``:
``measured_ms = X @ theta``. Each row is divided by its measurement, so the fit minimises relative
error, and the costs are found by non-negative least squares (a cost cannot be negative).

**Per-step CSV** (columns ``batch_size``, ``prefill_tokens``, ``context_tokens``, ``step_ms``, and
optionally ``prefill_attention_pairs``): one row per step, ``X = [1, B, P, K/1e3, A/1e6]``, exact up to
the measurements' noise.

**vllm bench serve --save-result JSON**: one file per request rate gives two equations, from the
means it reports, by a closed-form steady-state argument (no simulation). With ``lam`` the request
throughput, ``Ein``/``Eout`` the mean prompt/output lengths, ``s`` the mean ITL (the mean step time a
decoding request sees):

- decoding requests (Little's law): ``Bbar = lam * (Eout - 1) * mean_tpot``; a decoding request
  sees itself and, arrivals being Poisson, the time-average of the others: ``B = Bbar + 1``, reading
  ``K = B * (Ein + Eout/2)`` KV tokens; a step carries the prompts that arrived during one step:
  ``P = lam * Ein * s`` and ``A = lam * E[in^2]/2 * s``. So ``s = tau0 + beta B + gamma P + delta K + eps A``.
- at the least loaded rate (only there: under load TTFT also counts the wait for a slot), a
  request's first token waits for the step in progress (half a step, when the engine is busy:
  probability ``1 - exp(-N)``, N requests in the system) and comes out of a step carrying its own
  prefill on top of an average one: ``mean_ttft - s (1 + (1 - exp(-N))/2) = gamma Ein + eps E[in^2]/2``.

A sweep over request rates at fixed lengths moves B and K together, so it determines ``tau0``,
``beta`` and ``gamma`` but cannot tell ``beta`` from ``delta``: by default a bench fit holds delta and
epsilon at the preset's values (``--preset``) or 0; runs at several prompt/output lengths can fit them
(``--fit``). A cost the data cannot separate from the others is held, and the fit says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from simbatch.config import DEVICE_COSTS

PARAMS = DEVICE_COSTS
STEP_COLUMNS = ("batch_size", "prefill_tokens", "context_tokens", "step_ms")
BENCH_KEYS = ("request_throughput", "completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms",
              "mean_tpot_ms")


class CalibrationError(ValueError):
    """Input that cannot be fitted; the message names the file or option and the fix."""


@dataclass
class Rows:
    """Equations ``measured = X @ theta``, one per row, with a label saying where each comes from."""

    X: np.ndarray
    measured: np.ndarray
    labels: list[str] = field(default_factory=list)

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        return Rows(np.vstack([p.X for p in parts]), np.concatenate([p.measured for p in parts]),
                    [lab for p in parts for lab in p.labels])


def step_design(B, P, K, A) -> np.ndarray:
    """The columns of the step-time model for arrays of B, P, K, A: [1, B, P, K/1e3, A/1e6]."""
    B = np.asarray(B, dtype=float)
    return np.column_stack([np.ones_like(B), B, np.asarray(P, float) + 0 * B, np.asarray(K, float) / 1e3 + 0 * B,
                            np.asarray(A, float) / 1e6 + 0 * B])


def steps_rows(path: Path) -> Rows:
    """A per-step CSV as equations (one per step)."""
    try:
        frame = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise CalibrationError(f"{path}: cannot read it as CSV: {exc}") from None
    missing = [c for c in STEP_COLUMNS if c not in frame.columns]
    if missing:
        raise CalibrationError(f"{path}: missing column(s) {', '.join(missing)}; a per-step CSV has "
                               f"{', '.join(STEP_COLUMNS)} (and optionally prefill_attention_pairs)")
    cols = [*STEP_COLUMNS, *(["prefill_attention_pairs"] if "prefill_attention_pairs" in frame.columns else [])]
    values = frame[cols].apply(pd.to_numeric, errors="coerce")
    bad = values.isna().any(axis=1) | (values < 0).any(axis=1) | (values.step_ms <= 0)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise CalibrationError(f"{path}: row {row + 2} has a missing, negative or non-numeric value (step_ms must "
                               "be > 0); fix or remove the row")
    if len(values) == 0:
        raise CalibrationError(f"{path}: no rows; give one row per measured step")
    A = values.prefill_attention_pairs if "prefill_attention_pairs" in values else 0.0
    X = step_design(values.batch_size, values.prefill_tokens, values.context_tokens, A)
    return Rows(X, values.step_ms.to_numpy(float), [f"{path.name}:{i + 2}" for i in range(len(values))])


def _bench_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(record, dict):
        raise CalibrationError(f"{path}: not a vllm bench serve --save-result file (expected a JSON object)")
    missing = [k for k in BENCH_KEYS if not isinstance(record.get(k), int | float)]
    if missing:
        raise CalibrationError(f"{path}: missing or non-numeric key(s) {', '.join(missing)}; give the JSON file "
                               "`vllm bench serve --save-result` writes")
    if record["completed"] < 1 or record["request_throughput"] <= 0:
        raise CalibrationError(f"{path}: no completed requests; nothing to fit")
    return record


def bench_rows(path: Path) -> Rows:
    """A ``vllm bench serve`` result as two equations: its mean ITL and its mean TTFT (module docstring)."""
    r = _bench_record(path)
    lam = r["request_throughput"] / 1e3  # requests per ms
    e_in, e_out = r["total_input_tokens"] / r["completed"], r["total_output_tokens"] / r["completed"]
    lens = r.get("input_lens")
    e_in2 = float(np.mean(np.square(lens, dtype=float))) if isinstance(lens, list) and lens else e_in**2
    s = r.get("mean_itl_ms") or r["mean_tpot_ms"]
    if not s or s <= 0 or e_out <= 1:
        raise CalibrationError(f"{path}: no inter-token latency (outputs of one token?); runs with outputs of "
                               "several tokens are needed")
    b_bar = lam * (e_out - 1) * r["mean_tpot_ms"]
    B = b_bar + 1
    itl = step_design(B, lam * e_in * s, B * (e_in + e_out / 2), lam * e_in2 / 2 * s)[0]
    in_system = b_bar + lam * r["mean_ttft_ms"]
    wait = s * (1 + (1 - math.exp(-in_system)) / 2)
    ttft = np.array([0.0, 0.0, e_in, 0.0, e_in2 / 2 / 1e6])
    rate = r.get("request_rate", "?")
    return Rows(np.vstack([itl, ttft]), np.array([s, r["mean_ttft_ms"] - wait]),
                [f"{path.name} (rate {rate}): mean ITL", f"{path.name} (rate {rate}): mean TTFT - wait"])


def rows_of(paths: list[Path]) -> tuple[Rows, bool]:
    """Every file's equations, and whether any came from a bench result.

    Of the bench results, only the least loaded one's TTFT equation is kept: under load, TTFT adds
    the time a request queues for a slot, which the equation leaves out.
    """
    parts, benches = [], []
    for p in paths:
        if p.suffix.lower() == ".csv":
            parts.append(steps_rows(p))
        elif p.suffix.lower() == ".json":
            benches.append((_bench_record(p)["request_throughput"], bench_rows(p)))
        else:
            raise CalibrationError(f"{p}: give a per-step .csv file or a vllm bench serve --save-result .json file")
    lightest = min(range(len(benches)), key=lambda i: benches[i][0]) if benches else None
    for i, (_, rows) in enumerate(benches):
        keep = slice(None) if i == lightest else slice(0, 1)
        parts.append(Rows(rows.X[keep], rows.measured[keep], rows.labels[keep]))
    return Rows.concat(parts), bool(benches)


@dataclass
class Fit:
    """The fitted costs, which were fitted and which held, and every equation's fit."""

    params: dict[str, float]
    fitted: tuple[str, ...]
    held: dict[str, str]  # name -> why
    points: pd.DataFrame  # label, measured_ms, fitted_ms, relative_error

    def yaml_snippet(self, preset: str | None = None) -> str:
        """A ``device:`` section with every cost; the preset, when given, stays for ``num_blocks: auto``."""
        lines = ["device:"] + ([f"  preset: {preset}"] if preset else [])
        lines += [f"  {k}: {v:.6g}" for k, v in self.params.items()]
        return "\n".join(lines) + "\n"


def _identifiable(X: np.ndarray, order: list[int]) -> list[int]:
    """The columns of ``order`` kept, in order, while the (column-normalised) system stays well-conditioned."""
    kept: list[int] = []
    for j in order:
        trial = X[:, [*kept, j]]
        norms = np.linalg.norm(trial, axis=0)
        if norms[-1] == 0:
            continue
        sv = np.linalg.svd(trial / norms, compute_uv=False)
        if sv[-1] / sv[0] > 1e-3:
            kept.append(j)
    return kept


def fit(rows: Rows, free: list[str], held_values: dict[str, float], strict: bool) -> Fit:
    """Non-negative least squares of ``rows`` in relative error, the ``free`` costs fitted, the others at
    ``held_values``. ``strict``: a free cost the data cannot determine is an error, not held."""
    idx = [PARAMS.index(p) for p in free]
    held_idx = [j for j in range(len(PARAMS)) if j not in idx]
    base = rows.X[:, held_idx] @ np.array([held_values.get(PARAMS[j], 0.0) for j in held_idx])
    weights = 1 / np.abs(rows.measured)
    Xw = rows.X * weights[:, None]
    kept = _identifiable(Xw, idx)
    lost = [PARAMS[j] for j in idx if j not in kept]
    if lost and strict:
        raise CalibrationError(f"--fit: these measurements cannot determine {', '.join(lost)} beside "
                               f"{', '.join(PARAMS[j] for j in kept) or 'nothing'}; add runs that vary what they "
                               "multiply (batch, prompt or context lengths), or fit fewer costs")
    theta = np.array([held_values.get(p, 0.0) for p in PARAMS])
    if kept:
        theta[kept] = nnls(Xw[:, kept], (rows.measured - base) * weights)[0]
    fitted_ms = rows.X @ theta
    held = {PARAMS[j]: "held" for j in held_idx} | {p: "cannot be told apart from the others by these data"
                                                       for p in lost}
    points = pd.DataFrame({"label": rows.labels, "measured_ms": rows.measured, "fitted_ms": fitted_ms,
                           "relative_error": (fitted_ms - rows.measured) / rows.measured})
    return Fit(dict(zip(PARAMS, map(float, theta), strict=True)), tuple(PARAMS[j] for j in kept), held, points)


def calibrate(paths: list[Path], fit_only: list[str] | None = None, start: dict[str, float] | None = None) -> Fit:
    """Fit the costs to ``paths`` (per-step CSV and bench JSON files together).

    ``fit_only`` lists the costs to fit (an error when the data cannot determine one); by default,
    per-step data fit all five and bench results the first three, the rest held at ``start`` (a
    preset's values) or 0, or held because the data cannot determine them.
    """
    rows, bench = rows_of(paths)
    if fit_only is not None:
        unknown = [p for p in fit_only if p not in PARAMS]
        if unknown or not fit_only:
            raise CalibrationError(f"--fit {','.join(fit_only)}: name costs among {', '.join(PARAMS)}")
        return fit(rows, list(fit_only), start or {}, strict=True)
    free = list(PARAMS[:3] if bench else PARAMS)
    return fit(rows, free, start or {}, strict=False)
