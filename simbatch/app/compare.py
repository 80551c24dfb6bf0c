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
        label = combo[0][1] if len(combo) == 1 else ",".join(f"{_short(k)}={v}" for k, v in combo)
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


def load_source(path: Path) -> Source:
    """A result folder (summary.json, requests.csv, iterations.csv) or a vLLM ``--save-result`` file."""
    if path.is_dir():
        files = [path / n for n in ("summary.json", "requests.csv", "iterations.csv", "resolved_config.json")]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CompareInputError(f"{path}: not a result folder ({', '.join(missing)} missing); give a folder "
                                    "written by simbatch run, or a vllm bench serve --save-result JSON file")
        summary = json.loads(files[0].read_text(encoding="utf-8"))
        scenario = Scenario.model_validate(json.loads(files[3].read_text(encoding="utf-8")))
        requests = pd.read_csv(files[1])
        requests["status"] = pd.Categorical(requests["status"])
        requests["tenant"] = pd.Categorical(requests["tenant"].astype(str))
        return Source(_safe(path.name), summary, requests, pd.read_csv(files[2]), scenario)
    if not path.is_file():
        raise CompareInputError(f"{path}: no such file or folder; give result folders or vLLM result JSON files")
    return _vllm_source(path)


def load_sources(paths: list[Path]) -> dict[str, Source]:
    """Label -> source; labels are the folder or file names, made unique with a ``-2``, ``-3``."""
    out: dict[str, Source] = {}
    for path in paths:
        source = load_source(path)
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
