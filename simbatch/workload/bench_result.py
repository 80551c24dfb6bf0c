"""``vllm bench serve --save-result`` files, of every release that wrote one, read into one shape.

A result file is an input the way a trace is: ``simbatch compare`` sets it beside simulated runs,
``simbatch calibrate`` fits device costs to it, ``simbatch replay`` simulates the benchmark it
describes. All three read it through :func:`read`, so they accept the same files and refuse the
same ones, with the same one-line reason (:class:`BenchResultError`: the file, the key, the value,
the fix). The module belongs to the workload layer because a result file's per-request arrays *are*
a workload (its requests' lengths and send order); nothing here imports the engine.

What the releases wrote (their keys, renamed here to today's where they changed):

- ``benchmarks/benchmark_serving.py`` (2024, vLLM 0.4 to 0.6): ``duration, completed,
  total_input_tokens, total_output_tokens, request_throughput, input_throughput, output_throughput``,
  ``{mean,median,std,p99}_{ttft,tpot,itl}_ms``, and always the per-request arrays ``input_lens,
  output_lens, ttfts, itls, generated_texts, errors``. Forks added ``{mean,median,std,p99}_latency_ms``,
  the end-to-end latency: read as ``*_e2el_ms``. From late 2024, ``total_token_throughput`` replaced
  ``input_throughput`` (the total is derived from the two throughputs where it is missing), then
  ``burstiness``, ``max_concurrency``, ``--percentile-metrics``/``--metric-percentiles`` (keys
  ``p{P}_{metric}_ms``, P printed as an integer when it is one: ``p99_ttft_ms``, ``p99.9_itl_ms``),
  e2el and goodput (a 2025 client spelled it ``"request_goodput:"``; read as ``request_goodput``).
- ``vllm bench serve`` (2025 on): ``endpoint_type``, ``label``, then ``failed``,
  ``max_output_tokens_per_s``, ``max_concurrent_requests``, ``rtfx``; with speculative decoding
  ``spec_decode_acceptance_rate`` (percent), ``spec_decode_acceptance_length`` (1 + accepted per draft
  step), ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens`` and
  ``spec_decode_per_position_acceptance_rates``. The per-request arrays only with ``--save-detailed``,
  which from 0.19 adds ``start_times`` (each request's send, ``time.perf_counter()`` seconds).
- Files with latencies only (the vllm-ascend nightly of 2025): no duration, completion count,
  token totals or throughputs.
- simbatch's own ``summary.json``, which uses the same key names.

Every value is checked before use: a number where one goes (not a string, not ``true``), finite
(NaN and infinities refused, but for ``request_rate`` and ``burstiness``, where infinity means
something), not negative, below 1e15; whole numbers for counts; per-request arrays all of one
length, numbers inside; the file itself at most :data:`MAX_BYTES`, checked before it is read.
Damage vLLM itself writes is reported as notes, not refused: a run in which nothing completed
(its latencies are placeholders, 0.0: they are dropped), prompts neither completed nor counted as
failed, requests counted as completed that streamed no token (their TTFT of 0.0 is in the means).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_BYTES = 256 * 2**20
"""The largest result file read: a --save-detailed run of 100,000 requests of 1,000 tokens is about
this size once its ``generated_texts`` are dropped; beyond it, a file is not read at all."""

MAX_VALUE = 1e15
"""The largest number a result may hold (a count, a latency in ms, a rate): 31 years in ms; above it, damage."""

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
METRIC_KEY = re.compile(r"(mean|median|std|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms")
COUNT_KEYS = ("completed", "failed", "num_prompts", "total_input_tokens", "total_output_tokens",
              "max_concurrent_requests", "max_concurrency", "spec_decode_num_drafts", "spec_decode_draft_tokens",
              "spec_decode_accepted_tokens")
RATE_KEYS = ("duration", "request_throughput", "output_throughput", "total_token_throughput", "input_throughput",
             "request_goodput", "max_output_tokens_per_s", "rtfx", "spec_decode_acceptance_rate",
             "spec_decode_acceptance_length")
SPEC_DECODE_KEYS = ("spec_decode_acceptance_rate", "spec_decode_acceptance_length", "spec_decode_num_drafts",
                    "spec_decode_draft_tokens", "spec_decode_accepted_tokens")
ARRAYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors", "generated_texts")
RENAMED = {"request_goodput:": "request_goodput"} | {
    f"{stat}_latency_ms": f"{stat}_e2el_ms" for stat in ("mean", "median", "std", "p99", "p90", "p95", "p50")}

THROUGHPUT = ("duration", "completed")
"""What throughput needs: the latency-only files have neither."""
MEANS = ("request_throughput", "completed", "total_input_tokens", "total_output_tokens", "mean_ttft_ms",
         "mean_tpot_ms")
"""What the closed-form calibration reads of a file (simbatch.hardware.calibrate)."""


class BenchResultError(ValueError):
    """A result file that cannot be used: one line naming the file, the key, the value and the fix."""


@dataclass(frozen=True)
class Requests:
    """A file's per-request arrays, one entry per request in send order (failed ones included, as vLLM
    writes them): prompt and output lengths (tokens), TTFT (s), the gaps between streamed chunks (s),
    the send times when recorded (s, ``perf_counter`` values), and whether the request succeeded."""

    input_lens: np.ndarray
    output_lens: np.ndarray
    ttft_s: np.ndarray | None
    itls_s: tuple[np.ndarray, ...] | None
    start_s: np.ndarray | None
    ok: np.ndarray

    def __len__(self) -> int:
        return len(self.input_lens)

    @property
    def streamed(self) -> np.ndarray:
        """Succeeded and streamed a token: vLLM counts a request that streamed nothing (an end of sequence
        at once, in the 2024 clients) as completed, with a TTFT of 0.0."""
        return self.ok & (self.output_lens > 0)

    def tokens_per_chunk(self) -> float | None:
        """Output tokens after the first per streamed chunk gap, over the streamed requests with gaps: 1
        when every token came in its own chunk; several under multi-step scheduling or a client that
        read several events at once. None without ``itls``."""
        if self.itls_s is None:
            return None
        mask = self.streamed
        gaps = sum(len(g) for g, m in zip(self.itls_s, mask, strict=True) if m)
        tokens = int((self.output_lens[mask] - 1).clip(0).sum())
        return tokens / gaps if gaps else None


@dataclass(frozen=True)
class BenchResult:
    """One result file, its keys under today's names (:attr:`summary`, numbers only) and what it says
    about the run it measured."""

    path: Path
    summary: dict[str, float | int]
    client: str  # "vllm bench serve", "benchmark_serving.py" or "simbatch"
    request_rate: float | None  # requests/s; inf: every request sent at t = 0; None: not recorded
    burstiness: float | None
    max_concurrency: int | None
    num_prompts: int | None
    model_id: str | None
    date: str | None  # as the client wrote it, YYYYMMDD-HHMMSS
    percentiles: tuple[float, ...]  # the p<P>_ keys' P, sorted
    percentile_metrics: tuple[str, ...]  # the latencies the file has statistics of
    requests: Requests | None
    renamed: dict[str, str] = field(default_factory=dict)  # key in the file -> key in summary
    notes: tuple[str, ...] = ()

    @property
    def spec_decode(self) -> bool:
        return any(k in self.summary for k in SPEC_DECODE_KEYS)

    @property
    def latency_only(self) -> bool:
        return not any(k in self.summary for k in THROUGHPUT)

    def kind(self) -> str:
        """A few words on what the file holds, for messages: latency-only, summary, or per-request."""
        if self.latency_only:
            return "latency-only"
        return "per-request" if self.requests is not None else "summary-only"

    def lacks(self, keys: tuple[str, ...]) -> list[str]:
        return [k for k in keys if k not in self.summary]

    def require(self, keys: tuple[str, ...], purpose: str) -> None:
        """Refuse, in one line, a file that lacks any of ``keys`` for ``purpose`` (e.g. "calibrate needs")."""
        missing = self.lacks(keys)
        if not missing:
            return
        what = f"{self.kind()}: no {', '.join(missing)}"
        if self.latency_only:
            what = f"latency-only: no {', '.join(missing)} (the file has TTFT/TPOT/ITL statistics only)"
        raise BenchResultError(f"{self.path}: {what}; {purpose} {', '.join(keys)}; give the file "
                               "vllm bench serve --save-result writes with its whole summary")

    def rate_text(self) -> str:
        r = self.request_rate
        return "?" if r is None else "inf" if math.isinf(r) else f"{r:g}"

    def stat(self, key: str) -> float | None:
        value = self.summary.get(key)
        return None if value is None else float(value)


def _fail(path: Path, key: str, value, why: str, fix: str) -> BenchResultError:
    shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40] + "…")
    return BenchResultError(f"{path}: key {key!r} is {shown}: {why}; {fix}")


def _number(path: Path, key: str, value, *, whole: bool = False, infinite: bool = False) -> float | int:
    """A finite, non-negative number (an int when ``whole``), or the error naming it."""
    fix = "fix the value or give the file vllm bench serve wrote"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(path, key, value, "expected a number", fix)
    if isinstance(value, float) and math.isnan(value):
        raise _fail(path, key, value, "NaN is no measurement", fix)
    if math.isinf(value) and not infinite:
        raise _fail(path, key, value, "an infinity is no measurement", fix)
    if value < 0:
        raise _fail(path, key, value, "a negative value cannot be measured", fix)
    if value > MAX_VALUE and not math.isinf(value):
        raise _fail(path, key, value, f"beyond {MAX_VALUE:.0e}, no benchmark measures this", fix)
    if whole:
        if isinstance(value, float) and not value.is_integer():
            raise _fail(path, key, value, "expected a whole number", fix)
        return int(value)
    return value


def _load(path: Path) -> dict:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BenchResultError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if size > MAX_BYTES:
        raise BenchResultError(f"{path}: {size / 2**20:,.0f} MiB, above the {MAX_BYTES // 2**20} MiB a result file "
                               "may have (a --save-detailed run of 100k requests is less once generated_texts are "
                               "dropped); drop them, e.g. jq 'del(.generated_texts)'")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise BenchResultError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BenchResultError(f"{path}: not a text file (byte {exc.object[exc.start]:#04x} at offset {exc.start} "
                               "is not UTF-8); give the JSON file vllm bench serve --save-result writes") from None
    try:
        record = json.loads(text, parse_constant=float)
    except json.JSONDecodeError as exc:
        raise BenchResultError(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); give the "
                               "file vllm bench serve --save-result writes") from None
    except RecursionError:
        raise BenchResultError(f"{path}: JSON nested deeper than Python reads; a result file is one flat object "
                               "of keys and per-request lists") from None
    if not isinstance(record, dict):
        raise BenchResultError(f"{path}: a JSON {type(record).__name__}, not an object; give the file vllm bench "
                               "serve --save-result writes (one JSON object)")
    return record


def _client(record: dict) -> str:
    if "littles_law_rel_error" in record:
        return "simbatch"
    if "endpoint_type" in record:
        return "vllm bench serve"
    return "benchmark_serving.py"


def _rate(path: Path, key: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    rate = _number(path, key, value, infinite=True)
    if rate == 0:
        why = "a rate of 0 sends nothing" if key == "request_rate" else "a gamma shape must be above 0"
        raise _fail(path, key, value, why, "fix the value")
    return float(rate)


def _array(path: Path, key: str, values, n: int | None, whole: bool) -> np.ndarray:
    if not isinstance(values, list):
        raise _fail(path, key, type(values).__name__, "expected a list, one entry per request",
                    "give the file vllm bench serve --save-detailed writes")
    if n is not None and len(values) != n:
        raise _fail(path, key, f"{len(values)} entries", f"input_lens has {n} (ragged per-request arrays)",
                    "give the file as vllm wrote it: every per-request list has one entry per request")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 or v > MAX_VALUE \
                or whole and v != int(v):
            raise _fail(path, f"{key}[{i}]", v, f"expected a {'whole number' if whole else 'number'} >= 0",
                        "fix the entry or give the file vllm bench serve wrote")
    return np.array(values, dtype=np.int64 if whole else np.float64)


def _requests(path: Path, record: dict) -> Requests | None:
    if "input_lens" not in record:
        present = [k for k in ARRAYS[1:5] if k in record]
        if present:
            raise _fail(path, present[0], "a list", "per-request arrays without input_lens",
                        "give the file as vllm bench serve --save-detailed wrote it")
        return None
    lens = _array(path, "input_lens", record["input_lens"], None, whole=True)
    n = len(lens)
    if "output_lens" not in record:
        raise _fail(path, "output_lens", None, "input_lens without output_lens",
                    "give the file as vllm bench serve --save-detailed wrote it")
    out = _array(path, "output_lens", record["output_lens"], n, whole=True)
    ttft = _array(path, "ttfts", record["ttfts"], n, whole=False) if "ttfts" in record else None
    start = _array(path, "start_times", record["start_times"], n, whole=False) if "start_times" in record else None
    itls = None
    if "itls" in record:
        raw = record["itls"]
        if not isinstance(raw, list) or len(raw) != n:
            raise _fail(path, "itls", f"{len(raw) if isinstance(raw, list) else type(raw).__name__} entries",
                        f"expected a list of {n} lists (ragged per-request arrays)",
                        "give the file as vllm bench serve --save-detailed wrote it")
        itls = tuple(_array(path, f"itls[{i}]", gaps, None, whole=False) for i, gaps in enumerate(raw))
    ok = np.ones(n, dtype=bool)
    if "errors" in record:
        errors = record["errors"]
        if not isinstance(errors, list) or len(errors) != n or not all(isinstance(e, str | None) for e in errors):
            raise _fail(path, "errors", type(errors).__name__, f"expected {n} strings (ragged per-request arrays)",
                        "give the file as vllm bench serve --save-detailed wrote it")
        ok = np.array([not e for e in errors], dtype=bool)
    return Requests(lens, out, ttft, itls, start, ok)


def read(path: Path) -> BenchResult:
    """The result file at ``path``, checked (module docstring), or :class:`BenchResultError`."""
    record = _load(path)
    summary: dict[str, float | int] = {}
    renamed: dict[str, str] = {}
    for raw_key, value in record.items():
        key = RENAMED.get(raw_key, raw_key)
        if key in ARRAYS or key in ("request_rate", "burstiness") or value is None:
            continue
        if raw_key != key:
            if key in record:
                continue  # today's key is there too; it wins
            renamed[raw_key] = key
        if key in COUNT_KEYS or key in RATE_KEYS or METRIC_KEY.fullmatch(key):
            summary[key] = _number(path, raw_key, value, whole=key in COUNT_KEYS)
        elif isinstance(value, float) and not math.isfinite(value):
            raise _fail(path, raw_key, value, "NaN and infinities are no measurement", "fix the value")
        elif isinstance(value, int | float) and not isinstance(value, bool) and abs(value) <= MAX_VALUE:
            summary[key] = value  # another number (metadata, simbatch's own keys): kept as it is
    if "spec_decode_acceptance_rate" in summary and summary["spec_decode_acceptance_rate"] > 100:
        raise _fail(path, "spec_decode_acceptance_rate", summary["spec_decode_acceptance_rate"],
                    "a percentage is at most 100", "fix the value")
    requests = _requests(path, record)
    notes = []
    if "total_token_throughput" not in summary and "input_throughput" in summary and "output_throughput" in summary:
        summary["total_token_throughput"] = summary["input_throughput"] + summary["output_throughput"]
        renamed["input_throughput"] = "total_token_throughput (input + output throughput)"
    if "request_throughput" not in summary and summary.get("duration") and "completed" in summary:
        summary["request_throughput"] = summary["completed"] / summary["duration"]
    completed = summary.get("completed")
    placeholders = completed == 0 or (completed and summary.get("total_output_tokens") == 0)
    if placeholders:
        dropped = [k for k in summary if METRIC_KEY.fullmatch(k)]
        for k in dropped:
            del summary[k]
        what = "no request completed" if completed == 0 else f"{completed} requests completed with no output token"
        failed = f" ({summary['failed']} failed)" if summary.get("failed") else ""
        notes.append(f"{what}{failed}: its latencies are placeholders (0.0), read as missing")
    prompts = record.get("num_prompts")
    if completed is not None and isinstance(prompts, int) and completed < prompts and "failed" not in summary:
        notes.append(f"{prompts - completed} of {prompts} prompts neither completed nor counted as failed "
                     "(the file has no failed key)")
    if requests is not None and not placeholders:
        silent = int((requests.ok & (requests.output_lens == 0)).sum())
        if silent:
            notes.append(f"{silent} of {len(requests)} requests counted as completed streamed no token (output_lens 0, "
                         "ttft 0.0): their zeros are in the file's TTFT statistics")
    metrics = tuple(m for m in LATENCY_METRICS if any(k.endswith(f"_{m}_ms") for k in summary))
    percentiles = sorted({float(m[2]) for k in summary if (m := METRIC_KEY.fullmatch(k)) and m[2]})
    return BenchResult(
        path=path, summary=summary, client=_client(record),
        request_rate=_rate(path, "request_rate", record.get("request_rate")),
        burstiness=_rate(path, "burstiness", record.get("burstiness")),
        max_concurrency=None if record.get("max_concurrency") is None else
        _number(path, "max_concurrency", record["max_concurrency"], whole=True) or None,
        num_prompts=None if prompts is None else _number(path, "num_prompts", prompts, whole=True),
        model_id=record.get("model_id") if isinstance(record.get("model_id"), str) else None,
        date=record.get("date") if isinstance(record.get("date"), str) else None,
        percentiles=tuple(percentiles), percentile_metrics=metrics, requests=requests, renamed=renamed,
        notes=tuple(notes))


def labels(results: list[BenchResult]) -> dict[Path, str]:
    """A label per file for tables and fit points: its name, or its full path where two share a name."""
    names = [r.path.name for r in results]
    return {r.path: str(r.path) if names.count(r.path.name) > 1 else r.path.name for r in results}
