"""What ``simbatch compare`` sets side by side: variants of one scenario, or runs that already exist.

**Variants** of a scenario are lists of overrides, one list per column:

- ``--vary KEY=A,B,C``: one column per value; several ``--vary`` give their product;
- ``--variant "KEY=V;KEY=V"``: one column per group of overrides, as many as given;
- neither: one column per batching mode (``--modes``).

Every variant keeps the scenario's seed (unless it sets ``seed`` itself), so every column sees
the same requests (common random numbers). When no variant touches ``workload`` or ``seed`` the requests are drawn once and handed
to every run; otherwise each variant draws its own from the same seeded streams.

**Sources** are result folders (``simbatch run`` or a subfolder of ``compare``) or the JSON file
``vllm bench serve --save-result`` writes, of any release (read by :mod:`simbatch.workload.bench_result`,
as ``calibrate`` and ``replay`` read it). A folder brings its frames, so it gets overlay plots; a
vLLM file brings its summary (same key names) and, when it holds ``ttfts``, its TTFT distribution.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import ValidationError

from simbatch.app.text import printable
from simbatch.config import Scenario
from simbatch.workload import bench_result
from simbatch.workload.bench_result import BenchResult


class CompareInputError(ValueError):
    """A ``--vary``, ``--variant`` or source that cannot be used; one line naming it and the fix."""


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def variants(vary: list[str], groups: list[str]) -> dict[str, list[str]]:
    """Column label -> its overrides (``--set`` syntax), from ``--vary`` and ``--variant`` texts."""
    axes = []
    for text in vary:
        key, sep, values = text.partition("=")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not items:
            raise CompareInputError(f"--vary {text}: expected KEY=A,B,C, e.g. --vary scheduler.policy=fcfs,sjf")
        if len(set(items)) < len(items):
            raise CompareInputError(f"--vary {text}: a value is listed twice; list each once")
        axes.append([(key.strip(), v) for v in items])
    columns: list[tuple[str, list[str]]] = []
    for combo in itertools.product(*axes) if axes else []:
        # A column says what it is: key=value (a bare true or 0.5 says nothing), but a batching mode names itself.
        label = combo[0][1] if len(combo) == 1 and combo[0][0] == "batching.mode" else \
            ",".join(f"{_short(k)}={v}" for k, v in combo)
        columns.append((label, [f"{k}={v}" for k, v in combo]))
    for text in groups:
        sets = [s.strip() for s in text.split(";") if s.strip()]
        if not sets or any("=" not in s for s in sets):
            raise CompareInputError(f"--variant {text!r}: expected KEY=VALUE;KEY=VALUE, "
                                    "e.g. --variant 'scheduler.policy=sjf;batching.max_num_seqs=32'")
        columns.append((",".join(f"{_short(k)}={v}" for k, _, v in (s.partition("=") for s in sets)), sets))
    out = dict(columns)
    if len(out) < len(columns) or len({frozenset(sets) for _, sets in columns}) < len(columns):
        raise CompareInputError("--vary/--variant: two variants give the same column; make each one different")
    return {_safe(label): sets for label, sets in out.items()}


def _safe(label: str) -> str:
    """A label that is also a folder name (each variant's run is written to a subfolder)."""
    return re.sub(r"[^\w.,=+-]", "_", label)


def shares_workload(overrides: list[list[str]]) -> bool:
    """Whether every variant leaves the requests alone, so one draw serves them all."""
    return not any(o.startswith(("workload", "seed=")) for sets in overrides for o in sets)


@dataclass
class Source:
    """One existing run: its summary, and its frames when it has them (None for a vLLM file)."""

    label: str
    summary: dict
    requests: pd.DataFrame | None = None
    iterations: pd.DataFrame | None = None
    scenario: Scenario | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)  # what a vLLM file lacks, or damage it shows


def _vllm_requests(result: BenchResult) -> pd.DataFrame | None:
    """A requests frame of what a vLLM result holds per request: TTFT only (its ``ttfts``, s), for the
    requests that streamed a token (vLLM writes 0.0 for the others)."""
    rq = result.requests
    if rq is None or rq.ttft_s is None or not len(rq):
        return None
    streamed = rq.streamed
    return pd.DataFrame({"ttft_s": np.where(streamed, rq.ttft_s, np.nan),
                         "status": np.where(streamed, "finished", "failed")})


def _vllm_source(path: Path) -> Source:
    """A ``vllm bench serve --save-result`` file (simbatch.workload.bench_result), with a note per
    thing it lacks or damage it shows."""
    try:
        result = bench_result.read(path)
    except bench_result.BenchResultError as exc:
        raise CompareInputError(str(exc)) from None
    latencies = [k for k in result.summary if bench_result.METRIC_KEY.fullmatch(k)]
    if not latencies and result.lacks(bench_result.THROUGHPUT):
        raise CompareInputError(f"{path}: not a vllm bench serve result, it lacks {', '.join(result.lacks(bench_result.THROUGHPUT))} "
                                "and every latency statistic (mean_ttft_ms, ...); give a file written with --save-result")
    notes = [f"{path.name}: {n}" for n in result.notes]
    if result.latency_only:
        notes.append(f"{path.name}: latency-only (no {', '.join(result.lacks(bench_result.THROUGHPUT))}), so no "
                     "throughput rows")
    if result.renamed:
        notes.append(f"{path.name}: read with today's names: " +
                     ", ".join(f"{old} as {new}" for old, new in result.renamed.items()))
    return Source(_safe(path.stem), dict(result.summary), _vllm_requests(result), notes=notes)


MAX_JSON_BYTES = 16_000_000
"""The largest summary.json or resolved_config.json read from a result folder: a run's are kilobytes."""
MAX_FRAME_BYTES = 1_000_000_000
"""The largest requests.csv or iterations.csv read without ``--force``: a run within the size guard
(:mod:`simbatch.inputs.guard`) writes a few hundred MB at most; read whole, a file costs about its size."""
REQUEST_COLUMNS = ("request_id", "replica", "tenant", "arrival_s", "first_scheduled_s", "first_token_s",
                   "finish_s", "prompt_tokens", "output_tokens", "num_preemptions", "status", "ttft_s", "tpot_s",
                   "e2e_s")
"""The columns of requests.csv that the table, the plots and the report read."""
ITERATION_COLUMNS = ("replica", "start_s", "num_steps", "duration_s", "num_running", "num_waiting", "batch_size",
                     "decode_tokens", "prefill_tokens", "padded_tokens", "itl_tokens", "kv_blocks_used", "end_s")
_FOLDER_FIX = "give a folder written by simbatch run (or a column of simbatch compare), as it was written"


def _damaged(path: Path, why: str) -> CompareInputError:
    return CompareInputError(f"{path}: {why}; {_FOLDER_FIX}")


def _size_checked(path: Path, limit: int, force: bool | None = None) -> None:
    """Refuse a file above ``limit`` bytes before reading it (``force``: None when there is no way past)."""
    size = path.stat().st_size
    if size > limit and not force:
        what = "more than simbatch writes there" if force is None else \
            "more than a run within the size guard writes (pass --force to read it anyway)"
        raise _damaged(path, f"larger than {limit:,} bytes ({size:,}), {what}")


def _read_json(path: Path) -> object:
    """A result folder's JSON file, or CompareInputError saying what is wrong with it."""
    _size_checked(path, MAX_JSON_BYTES)
    try:
        return json.loads(path.read_text(encoding="utf-8"), parse_constant=float)
    except RecursionError:
        raise _damaged(path, "nested too deep to be simbatch's") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(path, f"not valid JSON ({exc})") from None


def _read_frame(path: Path, columns: tuple[str, ...], force: bool) -> pd.DataFrame:
    """requests.csv or iterations.csv, every column the comparison reads present and numeric (but
    ``status`` and ``tenant``), or CompareInputError."""
    _size_checked(path, MAX_FRAME_BYTES, force)
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise _damaged(path, "the file is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise _damaged(path, f"not a well-formed CSV file ({str(exc).strip().splitlines()[0]})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise _damaged(path, f"no column {missing[0]!r}" + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
    text = [c for c in columns if c not in ("status", "tenant") and not pd.api.types.is_numeric_dtype(frame[c])]
    if text:
        raise _damaged(path, f"column {text[0]!r} holds text where numbers belong")
    return frame


def _numbers(path: Path, summary: dict, warn) -> dict:
    """The summary's metrics: numbers only (a value that is not one is reported and left out), with the
    run's ``mode`` and its ``stability`` check as they are."""
    out = {}
    for key, value in summary.items():
        if key == "mode" and isinstance(value, str) or key == "stability" and isinstance(value, dict) or \
                isinstance(value, int | float) and not isinstance(value, bool) or value is None:
            out[key] = value
        else:
            warn(f"{path}: {key} is {str(value)[:40]!r}, not a number; shown as n/a")
    return out


def _load_folder(path: Path, force: bool, warn) -> Source:
    """A result folder: its summary, frames and scenario, each file checked before it is trusted."""
    files = [path / n for n in ("summary.json", "requests.csv", "iterations.csv", "resolved_config.json")]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CompareInputError(f"{path}: not a result folder ({', '.join(missing)} missing); give a folder "
                                "written by simbatch run, or a vllm bench serve --save-result JSON file")
    summary = _read_json(files[0])
    if not isinstance(summary, dict):
        raise _damaged(files[0], f"not a JSON object of metrics (it holds a {type(summary).__name__})")
    config = _read_json(files[3])
    try:
        scenario = Scenario.model_validate(config)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise _damaged(files[3], f"not a scenario simbatch can read ({where + ': ' if where else ''}"
                                 f"{err['msg'].removeprefix('Value error, ')})") from None
    requests = _read_frame(files[1], REQUEST_COLUMNS, force)
    requests["status"] = pd.Categorical(requests["status"].astype(str))
    requests["tenant"] = pd.Categorical(requests["tenant"].astype(str))
    return Source(printable(scenario.name, 40), _numbers(files[0], summary, warn), requests,
                  _read_frame(files[2], ITERATION_COLUMNS, force), scenario)


def load_source(path: Path, force: bool = False, warn=lambda line: None) -> Source:
    """A result folder (summary.json, requests.csv, iterations.csv) or a vLLM ``--save-result`` file.

    ``force`` reads frames past ``MAX_FRAME_BYTES``; ``warn`` is told of each value left out.
    """
    if path.is_dir():
        return _load_folder(path, force, warn)
    if not path.is_file():
        raise CompareInputError(f"{path}: no such file or folder; give result folders or vLLM result JSON files")
    return _vllm_source(path)


def load_sources(paths: list[Path], force: bool = False, warn=lambda line: None) -> dict[str, Source]:
    """Label -> source; a result folder is labelled by its scenario's name (``name/folder`` when several
    share one), a vLLM file by its name; what is still alike gets a ``-2``, ``-3``."""
    sources = [load_source(path, force, warn) for path in paths]
    names = [s.label for s in sources]
    for path, source in zip(paths, sources, strict=True):
        if source.scenario is not None and names.count(source.label) > 1:
            source.label = f"{source.label}/{printable(path.name, 40)}"
    out: dict[str, Source] = {}
    for source in sources:
        label, n = source.label, 1
        while label in out:
            n += 1
            label = f"{source.label}-{n}"
        source.label = label
        out[label] = source
    return out


def write_sources(folder: Path, paths: list[Path], sources: dict[str, Source], with_plots: bool = True,
                  unique: bool = False) -> Path:
    """A comparison of existing runs: ``sources.json`` (label -> path), ``summary.json``, overlay plots.

    Returns where it went (``unique``: ``folder`` is a default name, another free one will do).
    """
    from simbatch.app import plots, results
    from simbatch.app.webreport import write_report

    with results.atomic_folder(folder, unique) as target:
        tmp = target.tmp
        for name, data in (("sources.json", {label: str(p) for label, p in zip(sources, paths, strict=True)}),
                           ("summary.json", {label: s.summary for label, s in sources.items()})):
            (tmp / name).write_text(json.dumps(results.json_safe(data), indent=2) + "\n", encoding="utf-8")
        if with_plots:
            (tmp / "plots").mkdir()
            plots.save_compare_plots(tmp / "plots", sources)
            write_report(tmp / "report.html", sources, f"simbatch compare: {', '.join(sources)}")
    return target.folder
