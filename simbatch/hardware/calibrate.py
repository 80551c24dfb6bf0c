"""Fit the device costs to a server's own measurements: per-step timings, or ``vllm bench serve`` results.

Both kinds of input become rows of one linear system in the five costs
``theta = (tau0_ms, beta_ms, prefill_ms_per_token, kv_read_ms_per_1k_tokens, prefill_attention_ms_per_1m_pairs)``,
the GEMM tile switch's ``gemm_tier_ms`` when a ``gemm_tier_tokens`` is given (a step of more tokens costs it
more: docs/hardware.md), and the fixed time a request spends outside the GPU, ``frontend_ms`` (F):
``measured_ms = X @ theta``.
Each row is divided by its measurement, so the fit minimises relative error, and the costs are found
by non-negative least squares (a cost cannot be negative).

**Per-step CSV** (columns ``batch_size``, ``prefill_tokens``, ``context_tokens``, ``step_ms``, and
optionally ``prefill_attention_pairs``): one row per step, ``X = [1, B, P, K/1e3, A/1e6, [B + P > G], 0]``
(``G`` the tile switch's tokens), exact up to the measurements' noise.

**vllm bench serve --save-result JSON** (any release, read by :mod:`simbatch.workload.bench_result`):
one file per request rate gives two equations, from the means it reports, by a closed-form
steady-state argument (no simulation). With ``lam`` the request throughput, ``Ein``/``Eout`` the mean
prompt/output lengths, ``h`` the prefix cache's hit rate (so ``Enew = Ein (1 - h)`` tokens are
prefilled), ``s`` the mean step time a decoding request sees:

- the step: ``s`` is the mean ITL when every token is streamed in its own chunk, and the mean TPOT
  when the file shows chunked streaming (ITL well above TPOT: a chunk's gap is several steps, as
  under multi-step scheduling; or well below it). Decoding requests (Little's law):
  ``Bbar = lam * (Eout - 1) * mean_tpot``; a decoding request sees itself and, arrivals being
  Poisson, the time-average of the others: ``B = Bbar + 1``, reading ``K = B * (Ein + Eout/2)`` KV
  tokens (cached or not); a step carries the new tokens of the prompts that arrived during one step:
  ``P = lam * Enew * s`` and ``A = lam * E[pairs] * s``, a prompt of ``c`` new tokens after ``k``
  cached having ``c (k + c/2)`` attention pairs. So ``s = tau0 + beta B + gamma P + delta K + eps A
  + tier p``, ``p`` the share of its steps above the tile switch's ``G`` tokens: the others decoding
  being Poisson with mean ``Bbar``, a step holds ``1 + Poisson(Bbar)`` decodes and, with probability
  ``lam s``, a prompt's new tokens.
- the first token (vLLM's engine loop and API server, docs/hardware.md): a request spends ``F``
  outside the GPU (HTTP and tokenisation in the API server, the engine's input queue, detokenisation and streaming back); if
  the engine is busy (probability ``1 - exp(-N)``, N requests in the system) it waits for the next
  ``schedule()``: the rest of the step in progress, half a step on average, and with async scheduling
  (vLLM's default since late 2025: the scheduler runs a step ahead, so a request arriving in step k is
  first scheduled in step k + 2) one whole step more; then comes out of a step carrying its own
  prefill on top of an average one:
  ``mean_ttft = F + c (1 - exp(-N)) s + s + gamma Enew + eps E[pairs] + tier (p_own - p)``, ``c = 1.5``
  async, ``0.5`` sync, ``p_own`` the chance that its own step (``Poisson(Bbar)`` decodes and its prompt's
  new tokens) is above the switch.
  Only the least loaded run of each prompt length gives this equation: under load TTFT also counts
  the wait for a slot, which it leaves out.

``F`` is held at a given value (``frontend_ms``; :data:`DEFAULT_FRONTEND_MS` for a real server, 0 for
simbatch's own summaries, whose engine has no time outside its steps) unless fitted, which needs
lightly loaded runs at two or more prompt lengths. A sweep over request rates at fixed lengths moves
B and K together, so it determines ``tau0``, ``beta`` and ``gamma`` but cannot tell ``beta`` from
``delta``: by default a bench fit holds delta and epsilon at the preset's values (``--preset``) or 0.

Never a confident wrong answer: a fit with fewer equations than unknowns, a cost pinned at its bound
(0), a TTFT below the wait and step the equation puts before its prefill (a negative implied
prefill), a point off by more than :data:`MAX_RELATIVE_ERROR`, or files from different models, each
adds a warning naming the cause and the data that would settle it (``Fit.warnings``; the command
exits 1). Prefix caching: a file whose prompts were found cached is fitted on the tokens prefilled,
from a stated hit rate (``hit_rates``, or simbatch's own ``prefix_cache_hit_rate``); two files that
sent the very same prompts (identical ``input_lens``) without one are refused: the later run found
them in the cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls
from scipy.stats import poisson

from simbatch.config import DEVICE_COSTS
from simbatch.workload import bench_result
from simbatch.workload.bench_result import BenchResult

PARAMS = DEVICE_COSTS
TIER = "gemm_tier_ms"
FRONTEND = "frontend_ms"
UNKNOWNS = (*PARAMS, TIER, FRONTEND)
STEP_COLUMNS = ("batch_size", "prefill_tokens", "context_tokens", "step_ms")
BENCH_KEYS = bench_result.MEANS

DEFAULT_FRONTEND_MS = 3.0
"""F for a real vLLM server when none is given: the API server's tokenizer waits up to 2 ms to batch
prompts (``AsyncMicrobatchTokenizer``), and the ways in and out (parsing, ZMQ to the engine,
detokenisation, the SSE event) are of the order of a millisecond together (an estimate from vLLM's
source, not a measurement: docs/hardware.md; fit it with runs at two prompt lengths, or give it)."""

ASYNC_DEFAULT_SINCE = datetime(2025, 12, 1)
"""Async scheduling became vLLM's default between 0.12 and 0.14 (PR #27614, late 2025); a file dated
after this is read as from a server with it on, unless told otherwise."""

MAX_RELATIVE_ERROR = 0.10
"""A fitted point further than this from its measurement is a warning: the equations do not describe that run."""

CHUNKED = 1.5
"""ITL over TPOT beyond this (or below its inverse): the file streamed several tokens per chunk."""

SEPARATE = {
    "tau0_ms": "runs at light load (a small batch: 1 req/s) beside loaded ones",
    "beta_ms": "runs at several loads, a rate sweep up to near saturation",
    "prefill_ms_per_token": "the TTFT of lightly loaded runs (1 req/s or less) at two or more prompt lengths",
    "kv_read_ms_per_1k_tokens": "runs at several prompt and output lengths (context growing apart from the batch), "
                                "or per-step timings",
    "prefill_attention_ms_per_1m_pairs": "runs at short and long prompts, or per-step timings",
    TIER: "runs loaded enough that some steps hold more tokens than gemm_tier_tokens (decodes and new prompt "
          "tokens), beside lighter ones, or per-step timings on both sides of it",
    FRONTEND: "lightly loaded runs at two or more prompt lengths (the fixed part is what does not grow with the prompt)",
}


class CalibrationError(ValueError):
    """Input that cannot be fitted; the message names the file or option and the fix."""


@dataclass
class Rows:
    """Equations ``measured = X @ theta``, one per row, with a label saying where each comes from.

    ``offset`` is a known part of the measurement taken out before the fit (the wait before a prefill):
    a point is shown and weighted as ``measured + offset``, the quantity measured."""

    X: np.ndarray
    measured: np.ndarray
    labels: list[str] = field(default_factory=list)
    offset: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.offset is None:
            self.offset = np.zeros(len(self.measured))

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        return Rows(np.vstack([p.X for p in parts]), np.concatenate([p.measured for p in parts]),
                    [lab for p in parts for lab in p.labels], np.concatenate([p.offset for p in parts]))

    def take(self, keep) -> Rows:
        return Rows(self.X[keep], self.measured[keep], [self.labels[i] for i in np.arange(len(self.labels))[keep]],
                    self.offset[keep])


def step_design(B, P, K, A, tier=0.0) -> np.ndarray:
    """The columns of the step-time model for arrays of B, P, K, A and the share of steps above the GEMM
    tile switch: [1, B, P, K/1e3, A/1e6, tier, 0]."""
    B = np.asarray(B, dtype=float)
    return np.column_stack([np.ones_like(B), B, np.asarray(P, float) + 0 * B, np.asarray(K, float) / 1e3 + 0 * B,
                            np.asarray(A, float) / 1e6 + 0 * B, np.asarray(tier, float) + 0 * B, 0 * B])


def _within(others: float, fixed, tier_tokens: tuple[int, int]) -> float:
    """P(low < X + fixed <= high) for X ~ Poisson(others), averaged over the array ``fixed``."""
    low, high = tier_tokens
    fixed = np.asarray(fixed, float)
    return float(np.mean(poisson.cdf(np.floor(high - fixed), others) - poisson.cdf(np.floor(low - fixed), others)))


def tier_share(others: float, new_tokens: np.ndarray, prefill_chance: float,
               tier_tokens: tuple[int, int] | None) -> float:
    """The share of the steps a decoding request sees holding ``low < tokens <= high`` (``tier_tokens``):
    itself, ``Poisson(others)`` other decodes and, with probability ``prefill_chance``, one prompt's new
    tokens (``new_tokens``: each prompt's, averaged over). 0 without a switch."""
    if not tier_tokens:
        return 0.0
    q = min(1.0, max(0.0, prefill_chance))
    return (1 - q) * _within(others, 1.0, tier_tokens) + q * _within(others, 1.0 + np.asarray(new_tokens, float),
                                                                      tier_tokens)


def own_step_share(others: float, new_tokens: np.ndarray, tier_tokens: tuple[int, int] | None) -> float:
    """The chance that the step carrying a prompt's new tokens (``new_tokens``, averaged over) beside
    ``Poisson(others)`` decodes holds ``low < tokens <= high``; 0 without a switch."""
    return _within(others, new_tokens, tier_tokens) if tier_tokens else 0.0


def steps_rows(path: Path, tier_tokens: tuple[int, int] | None = None) -> Rows:
    """A per-step CSV as equations (one per step); ``tier_tokens``: the GEMM tile switch, if any."""
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
    bad = ~np.isfinite(values.to_numpy(float)).all(axis=1) | (values < 0).any(axis=1).to_numpy() | \
        (values.step_ms <= 0).to_numpy() | (values.abs() > bench_result.MAX_VALUE).any(axis=1).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise CalibrationError(f"{path}: row {row + 2} has a missing, negative, infinite or non-numeric value (step_ms "
                               "must be > 0); fix or remove the row")
    if len(values) == 0:
        raise CalibrationError(f"{path}: no rows; give one row per measured step")
    A = values.prefill_attention_pairs if "prefill_attention_pairs" in values else 0.0
    tokens = (values.batch_size + values.prefill_tokens).to_numpy(float)
    tier = ((tokens > tier_tokens[0]) & (tokens <= tier_tokens[1])).astype(float) if tier_tokens else 0.0
    X = step_design(values.batch_size, values.prefill_tokens, values.context_tokens, A, tier)
    return Rows(X, values.step_ms.to_numpy(float), [f"{path.name}:{i + 2}" for i in range(len(values))])


# --------------------------------------------------------------------------- bench results
@dataclass(frozen=True)
class Outside:
    """How a bench file's first token is read: the fixed time outside the GPU, the step cadence, the
    prefix cache's hit rate, and where each setting came from."""

    frontend_ms: float
    frontend_from: str
    async_scheduling: bool
    async_from: str
    hit_rate: float
    hit_rate_from: str


def _dated(result: BenchResult) -> datetime | None:
    try:
        return None if result.date is None else datetime.strptime(result.date[:15], "%Y%m%d-%H%M%S")
    except ValueError:
        return None


def outside_of(result: BenchResult, frontend_ms: float | None, async_scheduling: bool | None,
               hit_rate: float | None) -> Outside:
    """The settings a file's TTFT equation uses: those given, else the defaults for its client."""
    own = result.client == "simbatch"
    if frontend_ms is not None:
        f, f_from = frontend_ms, "given"
    elif own:
        f, f_from = 0.0, "simbatch's engine has no time outside its steps"
    else:
        f, f_from = DEFAULT_FRONTEND_MS, "vLLM's frontend, an estimate: docs/hardware.md"
    if async_scheduling is not None:
        a, a_from = async_scheduling, "given"
    elif own:
        a, a_from = False, "simbatch's engine schedules step by step"
    else:
        date = _dated(result)
        a = date is not None and date >= ASYNC_DEFAULT_SINCE
        a_from = (f"the file is dated {date:%Y-%m}, {'after' if a else 'before'} vLLM made it the default"
                  if date else "the file has no date; vLLM made it the default in late 2025")
    if hit_rate is not None:
        h, h_from = hit_rate, "given"
    elif "prefix_cache_hit_rate" in result.summary:
        h, h_from = float(result.summary["prefix_cache_hit_rate"]), "the file's prefix_cache_hit_rate"
    else:
        h, h_from = 0.0, "assumed"
    return Outside(f, f_from, a, a_from, h, h_from)


def _means(result: BenchResult, notes: list[str]) -> tuple[float, float, float, np.ndarray | None]:
    """(mean prompt, mean output, mean TTFT ms, prompt lengths or None) over the requests that count:
    with per-request arrays, those that streamed a token (vLLM averages in the others' 0.0 TTFT)."""
    r, rq = result.summary, result.requests
    e_in, e_out = r["total_input_tokens"] / r["completed"], r["total_output_tokens"] / r["completed"]
    ttft = r["mean_ttft_ms"]
    if rq is None:
        return e_in, e_out, ttft, None
    streamed = rq.streamed
    if rq.ttft_s is not None and streamed.any() and not streamed.all():
        ttft_streamed = 1e3 * float(rq.ttft_s[streamed].mean())
        notes.append(f"{result.path.name}: mean TTFT {ttft_streamed:.4g} ms over the {int(streamed.sum())} requests "
                     f"that streamed a token (the file's {ttft:.4g} averages in {int((~streamed).sum())} zeros)")
        ttft = ttft_streamed
    lens = rq.input_lens[streamed] if streamed.any() else rq.input_lens
    return float(lens.mean()), float(rq.output_lens[streamed].mean()) if streamed.any() else e_out, ttft, lens


def _step_ms(result: BenchResult, notes: list[str]) -> float:
    """The mean step a decoding request sees: the mean ITL, or the mean TPOT when chunks carry several tokens."""
    r = result.summary
    tpot, itl = r["mean_tpot_ms"], r.get("mean_itl_ms")
    per_chunk = result.requests.tokens_per_chunk() if result.requests is not None else None
    if not itl:
        return tpot
    if itl > CHUNKED * tpot or itl < tpot / CHUNKED or (per_chunk and per_chunk > CHUNKED):
        chunk = f", {per_chunk:.1f} tokens per chunk" if per_chunk else ""
        notes.append(f"{result.path.name}: chunked streaming: mean ITL {itl:.4g} ms is {itl / tpot:.2g} x mean TPOT "
                     f"{tpot:.4g} ms{chunk}: a chunk's gap, not a step; the step is taken from TPOT")
        return tpot
    return itl


def bench_rows(result: BenchResult, label: str, outside: Outside, notes: list[str],
               warnings: list[str], tier_tokens: tuple[int, int] | None = None) -> tuple[Rows, Rows | None]:
    """A bench result as its step equation and its TTFT equation (None when it cannot hold)."""
    result.require(BENCH_KEYS, "calibrate needs")
    r = result.summary
    if result.spec_decode:
        raise CalibrationError(f"{result.path}: speculative decoding (spec_decode_* keys): each step verifies drafts, "
                               "which the five costs alone do not describe; calibrate on a run without speculation, "
                               "then set device.speculative (its acceptance from spec_decode_acceptance_rate)")
    if r["completed"] < 1 or r["request_throughput"] <= 0:
        raise CalibrationError(f"{result.path}: no completed requests; nothing to fit")
    e_in, e_out, ttft, lens = _means(result, notes)
    s = _step_ms(result, notes)
    if not s or s <= 0 or e_out <= 1:
        raise CalibrationError(f"{result.path}: no inter-token latency (outputs of one token?); runs with outputs of "
                               "several tokens are needed")
    lam = r["request_throughput"] / 1e3  # requests per ms
    h = outside.hit_rate
    prompts = np.asarray(lens, float) if lens is not None else np.array([e_in])
    new = prompts * (1 - h)
    pairs = float(np.mean(new * (prompts * h + new / 2))) if lens is not None else \
        e_in**2 * (1 - h) * (h + (1 - h) / 2)
    e_new = e_in * (1 - h)
    b_bar = lam * (e_out - 1) * r["mean_tpot_ms"]
    B = b_bar + 1
    tier = tier_share(b_bar, new, lam * s, tier_tokens)
    step = Rows(step_design(B, lam * e_new * s, B * (e_in + e_out / 2), lam * pairs * s, tier), np.array([s]),
                [f"{label} (rate {result.rate_text()}): mean step ({'ITL' if s != r['mean_tpot_ms'] else 'TPOT'})"])
    long = _long_step(result, tier, label)
    if long is not None:
        step = Rows.concat([step, long])
    busy = 1 - math.exp(-(b_bar + lam * ttft))
    cadence = 1.5 if outside.async_scheduling else 0.5
    known = s * (1 + cadence * busy)
    lhs = ttft - known
    ttft_label = f"{label} (rate {result.rate_text()}): mean TTFT"
    if math.isinf(result.request_rate or 0) and not result.max_concurrency:
        notes.append(f"{label}: rate inf, every request sent at t = 0: its TTFT counts the whole burst's queue, "
                     "which the equation leaves out; only its step is used")
        return step, None
    if lhs <= 0:
        warnings.append(f"{ttft_label} {ttft:.4g} ms is below the wait and the step the equation puts before a "
                        f"prefill ({known:.4g} ms, {'async' if outside.async_scheduling else 'sync'} scheduling): a "
                        "negative prefill; left out of the fit. Check the scheduling (--no-async-scheduling) and that "
                        "the file's TTFT counts every request; a lightly loaded run (1 req/s) gives a usable TTFT")
        return step, None
    X = np.array([[0.0, 0.0, e_new, 0.0, pairs / 1e6, own_step_share(b_bar, new, tier_tokens) - tier, 1.0]])
    return step, Rows(X, np.array([lhs]), [ttft_label], np.array([known]))


def _long_step(result: BenchResult, share: float, label: str) -> Rows | None:
    """The tile switch's cost read off the file's ITL percentiles: the steps above the switch are the
    slowest ``share`` of the gaps, so a percentile well inside them (its tail under half the share)
    less the median (an ordinary step) is one such step's extra time; None when no reported percentile
    lies that deep in them (``share`` under 2 %: the switch too rare to show)."""
    r = result.summary
    median = r.get("median_itl_ms")
    levels = sorted((float(k[1:-7]), v) for k, v in r.items()
                    if k.startswith("p") and k.endswith("_itl_ms") and _is_number(k[1:-7]) and v is not None)
    inside = [(q, v) for q, v in levels if (100 - q) / 100 < share / 2]
    if not median or not inside or inside[0][1] <= median:
        return None
    q, value = inside[0]
    X = np.zeros((1, len(UNKNOWNS)))
    X[0, UNKNOWNS.index(TIER)] = 1.0
    return Rows(X, np.array([value - median]),
                [f"{label} (rate {result.rate_text()}): p{q:g} ITL - median ITL (a step above the GEMM tile switch)"])


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _repeated_prompts(results: list[BenchResult], given: dict) -> None:
    """Refuse files that sent another file's very prompts when no hit rate says what the cache kept."""
    seen: dict[bytes, BenchResult] = {}
    for r in results:
        if r.requests is None or r.client == "simbatch":
            continue
        key = r.requests.input_lens.tobytes()
        first = seen.setdefault(key, r)
        if first is not r and len(r.requests) > 1 and r.path not in given and None not in given:
            raise CalibrationError(
                f"{r.path}: sent the same {len(r.requests)} prompts as {first.path} (identical input_lens): with "
                "prefix caching on (vLLM's default since its V1 engine) the later run found them cached and did not "
                f"prefill them; give --prefix-hit-rate {r.path.name}=H (vllm:prefix_cache_hits over "
                "vllm:prefix_cache_queries), or --prefix-hit-rate 0 if the server ran --no-enable-prefix-caching "
                "or was restarted between the runs")


@dataclass
class Inputs:
    """Every file's equations, and what was read and assumed in making them."""

    rows: Rows
    bench: list[BenchResult]
    outside: dict[Path, Outside]
    notes: list[str]
    warnings: list[str]


def rows_of(paths: list[Path], frontend_ms: float | None = None, async_scheduling: bool | None = None,
            hit_rates: dict | None = None, tier_tokens: tuple[int, int] | None = None) -> Inputs:
    """Every file's equations (module docstring). ``hit_rates``: path -> the prefix cache's hit rate of
    that file's run (key None: every file's); ``tier_tokens``: the GEMM tile switch, if any."""
    hit_rates = hit_rates or {}
    parts, benches = [], []
    for p in paths:
        if p.suffix.lower() == ".csv":
            parts.append(steps_rows(p, tier_tokens))
        elif p.suffix.lower() == ".json":
            try:
                benches.append(bench_result.read(p))
            except bench_result.BenchResultError as exc:
                raise CalibrationError(str(exc)) from None
        else:
            raise CalibrationError(f"{p}: give a per-step .csv file or a vllm bench serve --save-result .json file")
    unknown = [p for p in hit_rates if p is not None and p not in {b.path for b in benches}]
    if unknown:
        raise CalibrationError(f"--prefix-hit-rate {unknown[0]}: not one of the bench files given; name one of them")
    _repeated_prompts(benches, hit_rates)
    notes: list[str] = []
    warnings: list[str] = []
    models = {b.model_id for b in benches if b.model_id}
    if len(models) > 1:
        warnings.append(f"the files come from different models ({', '.join(sorted(models))}): one device cannot fit "
                        "them all; calibrate each server on its own runs")
    names = bench_result.labels(benches)
    outside, steps, ttfts = {}, [], []
    for b in benches:
        notes += [f"{names[b.path]}: {n}" for n in b.notes]
        o = outside_of(b, frontend_ms, async_scheduling, hit_rates.get(b.path, hit_rates.get(None)))
        outside[b.path] = o
        try:
            step, ttft = bench_rows(b, names[b.path], o, notes, warnings, tier_tokens)
        except bench_result.BenchResultError as exc:
            raise CalibrationError(str(exc)) from None
        steps.append(step)
        if ttft is not None:
            ttfts.append((b, ttft))
    # Of each prompt length's runs, only the least loaded one's TTFT: under load it counts the queue too.
    kept: list[tuple[BenchResult, Rows]] = []
    for b, rows in sorted(ttfts, key=lambda t: t[0].summary["request_throughput"]):
        e_in = b.summary["total_input_tokens"] / b.summary["completed"]
        if not any(abs(e_in - k.summary["total_input_tokens"] / k.summary["completed"]) <= 0.1 * e_in for k, _ in kept):
            kept.append((b, rows))
    parts += steps + [rows for _, rows in kept]
    if benches and not [b for b in benches if outside[b.path].hit_rate_from != "assumed"] and \
            any(b.client != "simbatch" for b in benches):
        notes.append("prefix caching: no hit rate given, so every prompt token is taken as prefilled (vLLM's "
                     "default is caching on; random and ShareGPT prompts seldom share blocks); if the prompts share "
                     "a prefix or were sent before, give --prefix-hit-rate")
    if not parts:
        raise CalibrationError("no files given; give per-step .csv or vllm bench serve .json files")
    return Inputs(Rows.concat(parts), benches, outside, notes, warnings)


@dataclass
class Fit:
    """The fitted costs, which were fitted and which held, every equation's fit, and what to distrust."""

    params: dict[str, float]
    fitted: tuple[str, ...]
    held: dict[str, str]  # name -> why
    points: pd.DataFrame  # label, measured_ms, fitted_ms, relative_error
    frontend_ms: float = 0.0
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    outside: dict[Path, Outside] = field(default_factory=dict)  # each bench file's TTFT settings
    tier_tokens: tuple[int, int] | None = None  # the GEMM tile switch the fit was told (params then hold gemm_tier_ms)

    @property
    def async_scheduling(self) -> bool | None:
        """The bench files' scheduling, when they agree (None without bench files, or when they differ)."""
        seen = {o.async_scheduling for o in self.outside.values()}
        return seen.pop() if len(seen) == 1 else None

    def yaml_snippet(self, preset: str | None = None) -> str:
        """A ``device:`` section with every cost (the preset, when given, stays for ``num_blocks: auto``);
        from bench results also the ``frontend:`` latency and the ``scheduler:`` cadence the TTFT equation
        used. The frontend's time is all given as request latency: TTFT and E2E see only its sum."""
        lines = [f"# simbatch calibrate: {len(self.warnings)} warning(s), see its output"] if self.warnings else []
        lines += ["device:"] + ([f"  preset: {preset}"] if preset else [])
        lines += [f"  {k}: {v:.6g}" for k, v in self.params.items()]
        lines += [f"  gemm_tier_tokens: [{self.tier_tokens[0]}, {self.tier_tokens[1]}]"] if self.tier_tokens else []
        if self.outside:
            lines += ["frontend:", f"  request_latency_ms: {self.frontend_ms:.6g}"]
        if self.async_scheduling is not None:
            lines += ["scheduler:", f"  async_scheduling: {str(self.async_scheduling).lower()}"]
        return "\n".join(lines) + "\n"

    def overrides(self, preset: str | None = None) -> list[str]:
        """The snippet as ``--set`` items (for a replay with the fitted device)."""
        out = [f"device.preset={preset}"] if preset else []
        out += [f"device.{k}={v!r}" for k, v in self.params.items()]
        out += [f"device.gemm_tier_tokens=[{self.tier_tokens[0]},{self.tier_tokens[1]}]"] if self.tier_tokens else []
        if self.outside:
            out.append(f"frontend.request_latency_ms={self.frontend_ms!r}")
        if self.async_scheduling is not None:
            out.append(f"scheduler.async_scheduling={str(self.async_scheduling).lower()}")
        return out


def _identifiable(X: np.ndarray, order: list[int]) -> list[int]:
    """The columns of ``order`` kept, in order, while the (column-normalised) system stays well-conditioned."""
    kept: list[int] = []
    for j in order:
        trial = X[:, [*kept, j]]
        norms = np.linalg.norm(trial, axis=0)
        if norms[-1] == 0:
            continue
        sv = np.linalg.svd(trial / norms, compute_uv=False)
        if trial.shape[0] >= trial.shape[1] and sv[-1] / sv[0] > 1e-3:  # fewer equations than unknowns: never
            kept.append(j)
    return kept


def fit(rows: Rows, free: list[str], held_values: dict[str, float], strict: bool,
        tier_tokens: tuple[int, int] | None = None) -> Fit:
    """Non-negative least squares of ``rows`` in relative error, the ``free`` unknowns fitted, the others
    at ``held_values`` (0 when absent). ``strict``: a free unknown the data cannot determine is an error,
    not held. The fit's warnings say what it could not determine and what came out at its bound.
    ``tier_tokens``: the GEMM tile switch the rows were made with (its cost is then among the params)."""
    costs = (*PARAMS, TIER) if tier_tokens else PARAMS
    idx = [UNKNOWNS.index(p) for p in free]
    held_idx = [j for j in range(len(UNKNOWNS)) if j not in idx]
    base = rows.X[:, held_idx] @ np.array([held_values.get(UNKNOWNS[j], 0.0) for j in held_idx])
    weights = 1 / np.abs(rows.measured + rows.offset)
    Xw = rows.X * weights[:, None]
    kept = _identifiable(Xw, idx)
    lost = [UNKNOWNS[j] for j in idx if j not in kept]
    if lost and strict:
        raise CalibrationError(f"--fit: these measurements cannot determine {', '.join(lost)} beside "
                               f"{', '.join(UNKNOWNS[j] for j in kept) or 'nothing'}; add runs that vary what they "
                               "multiply (batch, prompt or context lengths), or fit fewer costs")
    theta = np.array([held_values.get(p, 0.0) for p in UNKNOWNS])
    if kept:
        theta[kept] = nnls(Xw[:, kept], (rows.measured - base) * weights)[0]
    fitted_ms = rows.X @ theta + rows.offset
    measured = rows.measured + rows.offset
    held = {UNKNOWNS[j]: "held" for j in held_idx if UNKNOWNS[j] in costs} | \
        {p: "cannot be told apart from the others by these data" for p in lost}
    points = pd.DataFrame({"label": rows.labels, "measured_ms": measured, "fitted_ms": fitted_ms,
                           "relative_error": (fitted_ms - measured) / measured})
    warnings = []
    if lost:
        n = len(rows.measured)
        few = f"{n} point{'s' * (n != 1)} for {len(free)} unknowns ({', '.join(free)})" if n < len(free) else \
            f"{n} points that do not vary what {', '.join(lost)} multipl{'ies' if len(lost) == 1 else 'y'}"
        warnings.append(f"{few}: {', '.join(lost)} cannot be told apart from "
                        f"{', '.join(UNKNOWNS[j] for j in kept) or 'nothing'} by these data and "
                        f"{'is' if len(lost) == 1 else 'are'} held at "
                        f"{', '.join(f'{held_values.get(p, 0.0):g}' for p in lost)}; to separate them: "
                        + "; ".join(f"{p}: {SEPARATE[p]}" for p in lost))
    for j in kept:
        if theta[j] <= 1e-12:
            p = UNKNOWNS[j]
            warnings.append(f"{p} came out 0, its bound: these data ask for a negative value, so the other costs "
                            f"carry its part and none of them is trustworthy; to settle {p}: {SEPARATE[p]}")
    worst = points.relative_error.abs()
    if len(worst) and worst.max() > MAX_RELATIVE_ERROR:
        i = int(worst.idxmax())
        warnings.append(f"{points.label[i]}: fitted {points.fitted_ms[i]:.4g} ms against {points.measured_ms[i]:.4g} "
                        f"measured, {points.relative_error[i]:+.1%} (over {MAX_RELATIVE_ERROR:.0%}): the equations do "
                        "not describe this run (an oversubscribed rate, a burst at rate inf, another server); leave "
                        "it out or add runs that pin the costs")
    params = {k: float(theta[UNKNOWNS.index(k)]) for k in costs}
    return Fit(params, tuple(UNKNOWNS[j] for j in kept), held, points, float(theta[-1]), warnings,
               tier_tokens=tier_tokens)


def calibrate(paths: list[Path], fit_only: list[str] | None = None, start: dict[str, float] | None = None,
              frontend_ms: float | None = None, async_scheduling: bool | None = None,
              hit_rates: dict | None = None, tier_tokens: tuple[int, int] | None = None) -> Fit:
    """Fit the costs to ``paths`` (per-step CSV and bench JSON files together).

    ``fit_only`` lists the unknowns to fit (an error when the data cannot determine one; ``frontend_ms``
    among them fits F); by default, per-step data fit all five costs and bench results the first three,
    the rest held at ``start`` (a preset's values) or 0, F at ``frontend_ms`` or the file's default.
    ``tier_tokens`` (or ``start``'s ``gemm_tier_tokens``): the GEMM tile switch; given, ``gemm_tier_ms``
    is fitted too (held at ``start``'s or 0 when the data do not reach it).
    """
    start = dict(start or {})
    tier_tokens = tuple(tier_tokens or start.pop("gemm_tier_tokens", None) or ()) or None
    start.pop("gemm_tier_tokens", None)
    inputs = rows_of(paths, frontend_ms, async_scheduling, hit_rates, tier_tokens)
    frontends = {o.frontend_ms for o in inputs.outside.values()}
    held = dict(start or {}) | {FRONTEND: frontends.pop() if len(frontends) == 1 else DEFAULT_FRONTEND_MS}
    if fit_only is not None:
        unknown = [p for p in fit_only if p not in UNKNOWNS]
        if unknown or not fit_only or (TIER in fit_only and not tier_tokens):
            raise CalibrationError(f"--fit {','.join(fit_only)}: name costs among {', '.join(UNKNOWNS)} "
                                   f"({TIER} with --gemm-tier-tokens only)")
        result = fit(inputs.rows, list(fit_only), held, strict=True, tier_tokens=tier_tokens)
    else:
        free = list(PARAMS[:3] if inputs.bench else PARAMS) + ([TIER] if tier_tokens else [])
        result = fit(inputs.rows, free, held, strict=False, tier_tokens=tier_tokens)
    result.warnings = inputs.warnings + result.warnings
    result.outside = inputs.outside
    settings = dict.fromkeys(f"frontend_ms {o.frontend_ms:g} ({o.frontend_from}), {'async' if o.async_scheduling else 'sync'} "
                             f"scheduling ({o.async_from}), prefix hit rate {o.hit_rate:g} ({o.hit_rate_from})"
                             for o in inputs.outside.values())
    result.notes = [f"TTFT equation: {s}" for s in settings] + inputs.notes
    if FRONTEND not in result.fitted:
        result.frontend_ms = held[FRONTEND]
    return result
