"""How far simbatch is from real vLLM servers: every end-to-end measurement the project holds, simulated.

Each :class:`Case` is one real benchmark run: the server as it ran (its vLLM version's defaults and
flags, as a scenario with a ``device.preset``), the requests it served (their own lengths and send
times where the run recorded them, else lengths drawn from what ``vllm bench serve --dataset-name
sharegpt`` sends and arrivals as its client draws them, with a fixed seed), and the metrics it
measured, under vLLM's names. Each is simulated twice:

- **preset**: from the preset alone. Nothing is tuned to the case: the efficiencies are fitted to the
  hardware measurements (``scripts/fit_hardware.py``), the memory model to vLLM's start-up logs, and no
  end-to-end run is used for either;
- **calibrated**: from costs ``simbatch calibrate`` fits to the *other* runs of the same server (the
  cases of a group split in two halves, alternating by rate; each half predicted from the other), the
  preset's delta and epsilon held. A server measured once has no calibrated prediction.

``scripts/gen_accuracy.py`` runs every case and writes ``docs/accuracy.json`` (the record) and
``docs/accuracy.md`` (the page); ``tests/test_accuracy.py`` checks that the page renders the record,
that every case's scenario still resolves to the costs the record was made with, and re-simulates
one case. A change to the costs, the memory model or the engine therefore fails the test until the
page is regenerated.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from simbatch.analysis.stats import describe_ms
from simbatch.config import Scenario
from simbatch.workload.generate import WorkloadArrays

METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms",
           "request_throughput")
"""What the page compares, with vLLM's key names (``vllm bench serve --save-result``)."""

_SERVING = "data/measured/serving"


def _data(name: str) -> Path:
    return Path(str(resources.files("simbatch").joinpath(f"{_SERVING}/{name}")))


@dataclass(frozen=True)
class Case:
    """One real benchmark run and the server that ran it.

    ``scenario``: the server as a scenario (no workload: the requests are built by :meth:`workload`).
    ``requests``: (send s, prompt tokens, output tokens) per request when the run recorded them, else
    ``num_prompts`` ShareGPT pairs are drawn and sent at ``rate`` (inf: all at once). ``warm``: the rate
    of a previous run of the same prompts on the same server, whose prefix cache they then find warm;
    ``warm_prompts``: how many of the leading prompts it sent (None: all; a warm-up sends a few).
    ``group``/``half``: the server whose other runs calibrate this one, and which half it is in.
    """

    name: str
    group: str
    server: str
    source: str
    scenario: dict
    measured: dict[str, float]
    requests: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    num_prompts: int = 0
    rate: float = math.inf
    warm: float | None = None
    warm_prompts: int | None = None
    itl_percentiles: dict[str, float] = field(default_factory=dict)  # the run's median/p95/p99 ITL, for calibrate
    half: int = -1
    client_side: bool = True  # the metrics are the client's (vllm bench serve), not the server's timestamps
    note: str = ""

    def resolved(self, device: dict | None = None, num_requests: int = 1) -> Scenario:
        """The case's scenario, resolved (vLLM's defaults and the preset's costs filled in), ``device``
        replacing the device section's costs."""
        from simbatch.inputs.resolve import resolve

        data = {**self.scenario, "workload": {"num_requests": num_requests}}
        if device is not None:
            data["device"] = {**data["device"], **device}
        return resolve(Scenario.model_validate(data))

    def workload(self, seed: int = 0) -> tuple[WorkloadArrays, int, float]:
        """The requests to simulate, the index of the first one measured (a warm-up pass before it), and
        when the measured run starts (its client's clock at 0), s."""
        if self.requests is not None:
            send, prompt, output = self.requests
            return _arrays(send, prompt, output, np.arange(len(send))), 0, float(np.min(send))
        rng = np.random.default_rng(seed)
        pairs = sharegpt_pairs()
        rows = rng.choice(len(pairs), self.num_prompts, replace=False)
        prompt, output = pairs[rows, 0], pairs[rows, 1]
        send = bench_send_times(self.num_prompts, self.rate, rng)
        stream = np.arange(self.num_prompts)
        if self.warm is None:
            return _arrays(send, prompt, output, stream), 0, 0.0
        # The same prompts (or the leading few) sent before, at the previous rate: the server was idle in between.
        n = self.num_prompts if self.warm_prompts is None else self.warm_prompts
        before = bench_send_times(n, self.warm, rng)
        start = before[-1] + 60.0
        return _arrays(np.concatenate([before, start + send]), np.concatenate([prompt[:n], prompt]),
                       np.concatenate([output[:n], output]), np.concatenate([stream[:n], stream])), n, float(start)


def _arrays(send, prompt, output, stream) -> WorkloadArrays:
    n = len(send)
    return WorkloadArrays(np.asarray(send, dtype=np.float64), np.asarray(prompt, dtype=np.int64),
                          np.asarray(output, dtype=np.int64), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.int64),
                          ("default",), prefix_stream=np.asarray(stream, dtype=np.int64))


def sharegpt_pairs() -> np.ndarray:
    """(prompt, output) token counts of what ``vllm bench serve --dataset-name sharegpt`` sends
    (``simbatch/data/sharegpt_lengths.csv``, Llama 3's tokenizer; its README gives the source)."""
    with resources.files("simbatch").joinpath("data/sharegpt_lengths.csv").open(encoding="utf-8") as f:
        return pd.read_csv(f).to_numpy(dtype=np.int64)


def bench_send_times(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """When ``vllm bench serve`` (0.14 on) sends ``n`` requests at ``rate``: Poisson gaps, cumulated and
    rescaled so the last is sent at ``n / rate``; all at 0 for an infinite rate."""
    if math.isinf(rate):
        return np.zeros(n)
    send = np.cumsum(rng.exponential(1 / rate, n))
    return send * (n / rate) / send[-1]


def measured_metrics(requests: pd.DataFrame, first: int, start_s: float) -> dict[str, float]:
    """The simulated run's metrics over the measured requests (from index ``first``), as vLLM's client
    computes them: TPOT per request, ITL over every gap (one token a chunk), throughput over the span
    from the measured pass's start to its last completion."""
    done = requests.iloc[first:]
    done = done[done["status"] == "finished"]
    out = describe_ms("ttft", done["ttft_s"].to_numpy()) | describe_ms("tpot", done["tpot_s"].to_numpy()) | \
        describe_ms("e2el", done["e2e_s"].to_numpy())
    gaps = (done["output_tokens"] - 1).sum()
    out["mean_itl_ms"] = 1e3 * float((done["e2e_s"] - done["ttft_s"]).sum()) / gaps if gaps else math.nan
    span = float(done["finish_s"].max()) - start_s
    out["request_throughput"] = len(done) / span if span > 0 else math.nan
    return {k: float(out[k]) for k in METRICS}


def simulate_case(case: Case, device: dict | None = None) -> dict[str, float]:
    """The case simulated (with ``device``'s costs instead of the preset's, when given): its metrics."""
    from simbatch.simulation import simulate

    arrays, first, start = case.workload()
    result = simulate(case.resolved(device, len(arrays)), workload=arrays)
    return measured_metrics(result.requests, first, start)


def fingerprint(case: Case) -> dict[str, float]:
    """What the case's simulation depends on besides the engine: its resolved device costs and KV blocks."""
    sc = case.resolved()
    out = {}
    for key, p in sc.resolution.items():
        out |= {f"{key}.{k}": v for k, v in p.value.model_dump().items()} if key.endswith(".moe") else {key: p.value}
    return out


# --------------------------------------------------------------------------- the cases
def _h200_sweep() -> list[Case]:
    """vLLM 0.14.1 on an H200: Llama-3.1-70B-Instruct-FP8 with an fp8 cache, a ShareGPT rate sweep."""
    rows = pd.read_csv(_data("vllm0141_h200_llama70b_fp8_sharegpt_rates.csv"))
    # The server's own flags: the preset, its fp8 cache; every other setting is vLLM's default for an H200.
    # Its fp8 GEMMs are vLLM's CUTLASS kernels for Hopper, which use a wider tile for 16 < tokens <= 64 (Device.gemm_tier_tokens).
    scenario = {"device": {"preset": "llama-3.1-70b/H200/fp8", "gemm_tier_tokens": [16, 64]},
                "kv_cache": {"dtype": "fp8", "num_blocks": "auto"}}
    # The split, fixed before any error was seen: the rates in order, alternating, so each half spans the
    # sweep; the first run (0.5/s) is the only cold one, so the half holding it (half 0: 0.5, 1, 1.5, 2.5)
    # is the one that measures every cost and the claim is the other half predicted from it.
    # Before the sweep a warm-up (its warmup.log: vllm bench serve, the same dataset and seed 0, 10
    # prompts at 0.5/s) sent the first 10 of the same 300: even the first run found those cached.
    cases, previous, warm_prompts = [], 0.5, 10
    for i, row in enumerate(rows.sort_values("request_rate").itertuples()):
        measured = {k: float(getattr(row, k)) for k in METRICS}
        cases.append(Case(
            f"H200 70B fp8 @ {row.request_rate:g}/s", "h200", "vLLM 0.14.1, 1x H200, Llama-3.1-70B-Instruct-FP8, "
            "fp8 KV cache, max_num_batched_tokens 8192, prefix caching, async scheduling",
            "DO-Solutions/gtc-2026-doks @ c70febac (simbatch/data/measured/serving)", scenario, measured,
            num_prompts=int(row.num_prompts), rate=float(row.request_rate), warm=previous, warm_prompts=warm_prompts, half=i % 2,
            itl_percentiles={k: float(getattr(row, k)) for k in ("median_itl_ms", "p95_itl_ms", "p99_itl_ms")},
            note=f"the same {int(row.num_prompts)} prompts were sent at every rate to one running server, so from "
            "the second rate on they found their prefixes cached: each of those runs is simulated after a pass of "
            "the same prompts at the previous rate (only its own pass measured), and calibrated with the hit rate "
            "that leaves (every full block before a prompt's last token); the first run after a warm-up that "
            "sent its first 10 prompts. The split: the rates in order, "
            "alternating (0.5, 1, 1.5, 2.5 against 0.75, 1.25, 2, 3), fixed before any error was computed. Only the "
            "first run, 0.5/s, prefilled whole prompts, so only the half holding it measures the prefill cost: "
            "that half calibrates, the other is predicted, and that is the held-out claim (rows 0.75, 1.25, 2, 3). "
            "The other direction is shown too (rows 0.5, 1, 1.5, 2.5): its runs never prefilled a whole prompt, so "
            "its fit holds the prefill cost at the preset's. The fp8 GEMMs are vLLM's CUTLASS kernels for Hopper, "
            "whose wider tile for 16 < tokens <= 64 shows in the ITL percentiles (p95/p99 ITL 27-28 ms against a "
            "21 ms median from 1.5/s on): the scenario names the window (device.gemm_tier_tokens [16, 64]) and "
            "calibrate fits its cost, gemm_tier_ms, about 7 ms"))
        previous, warm_prompts = float(row.request_rate), None
    return cases


def _per_request_metrics(reqs: pd.DataFrame) -> dict[str, float]:
    """vLLM's metrics from a run's per-request server-side times (``ttft_ms``, ``e2e_ms`` and ``tpot_ms``
    from the engine's arrival, ``arrival_s`` and ``last_token_s`` from the run's first arrival)."""
    ttft, e2e = reqs.ttft_ms.to_numpy(), reqs.e2e_ms.to_numpy()
    span = float(reqs.last_token_s.max() - reqs.arrival_s.min())
    return {"mean_ttft_ms": float(ttft.mean()), "median_ttft_ms": float(np.median(ttft)),
            "p99_ttft_ms": float(np.percentile(ttft, 99)), "mean_tpot_ms": float(reqs.tpot_ms.mean()),
            "mean_itl_ms": float((e2e - ttft).sum() / (reqs.output_toks - 1).sum()),
            "mean_e2el_ms": float(e2e.mean()), "request_throughput": len(reqs) / span}


def _per_request_case(name: str, group: str, server: str, source: str, reqs: pd.DataFrame, preset: str,
                      prefix_caching: bool, max_num_seqs: int, max_num_batched_tokens: int,
                      cluster: dict | None = None) -> Case:
    """A run that recorded every request (LLMServingSim's vLLM bench): its own requests, sent when they
    arrived, and the server's timestamps, which start at the engine: no API server in front of them."""
    scenario = {"device": {"preset": preset},
                "kv_cache": {"num_blocks": "auto", "enable_prefix_caching": prefix_caching},
                "batching": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens},
                "frontend": {"request_latency_ms": 0.0, "response_latency_ms": 0.0}} | \
        ({"cluster": cluster} if cluster else {})
    return Case(name, group, server, source, scenario, _per_request_metrics(reqs),
                requests=(reqs.arrival_s.to_numpy(), reqs.input_toks.to_numpy(), reqs.output_toks.to_numpy()),
                client_side=False, note="server-side timestamps (from the engine's arrival: no HTTP or tokenizer)")


def _rtx4090_run() -> list[Case]:
    """vLLM 0.19 on an RTX 4090: Llama-3.1-8B in bf16, 300 ShareGPT requests at about 10/s, per request."""
    reqs = pd.read_csv(_data("vllm019_rtx4090_llama31_8b_requests.csv"))
    server = pd.read_csv(_data("vllm019_rtx4090_llama31_8b_server.csv")).iloc[0]
    return [_per_request_case("RTX 4090 8B @ 10/s", "rtx4090", "vLLM 0.19.0, 1x RTX 4090, Llama-3.1-8B bf16, "
                              "max_num_seqs 256, max_num_batched_tokens 2048, prefix caching, async scheduling",
                              "casys-kaist/LLMServingSim @ 5daddb2 (simbatch/data/measured/serving)", reqs,
                              "llama-3.1-8b/RTX-4090", bool(server.prefix_caching), int(server.max_num_seqs),
                              int(server.max_num_batched_tokens))]


def bench_requests(path: Path) -> pd.DataFrame:
    """LLMServingSim's ``requests.jsonl`` (one vLLM ``RequestStateStats`` a line: the client's wall-clock
    ``arrival_time``, the engine's monotonic ``queued_ts``, ``first_token_ts``, ``last_token_ts``) as the
    per-request columns :func:`_per_request_metrics` reads, each latency from the engine's arrival."""
    rows = pd.DataFrame([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line])
    queued = rows.queued_ts
    return pd.DataFrame({"input_toks": rows.input_toks, "output_toks": rows.output_toks,
                         "arrival_s": rows.arrival_time - rows.arrival_time.min(),
                         "last_token_s": rows.last_token_ts - queued.min(),
                         "ttft_ms": 1e3 * (rows.first_token_ts - queued), "e2e_ms": 1e3 * (rows.last_token_ts - queued),
                         "tpot_ms": 1e3 * (rows.last_token_ts - rows.first_token_ts) / (rows.output_toks - 1)})


RTXPRO6000 = {"llama31_8b": ("llama-3.1-8b/RTX-PRO-6000", "Llama-3.1-8B bf16", "8B", None),
              "qwen3_32b_tp2": ("qwen3-32b/RTX-PRO-6000/tp2", "Qwen3-32B bf16, TP2", "Qwen3-32B TP2", None),
              # One engine (scheduler, KV cache) per data-parallel rank, the two stepping in lockstep
              # (simbatch.engine.dp_group); vLLM's front end sends a request to the rank with the fewest
              # waiting and running ones.
              "qwen3_30b_a3b_dp2_ep": ("qwen3-30b-a3b/RTX-PRO-6000/ep2", "Qwen3-30B-A3B-Instruct-2507 bf16, DP2 "
                                       "with expert parallelism (EP2)", "Qwen3-30B-A3B DP2 EP2",
                                       {"replicas": 2, "router": "least_outstanding"})}
"""LLMServingSim's RTX PRO 6000 runs: the preset, the model as the page names it, the run's short name, the cluster."""


def _rtxpro6000_runs() -> list[Case]:
    """vLLM 0.19 on RTX PRO 6000s: three models in bf16, the same 300 ShareGPT requests at about 10/s, per request."""
    cases = []
    for stem, (preset, model, short, cluster) in RTXPRO6000.items():
        meta = json.loads(_data(f"vllm019_rtxpro6000_{stem}_meta.json").read_text(encoding="utf-8"))
        kw = meta["engine_kwargs"]
        gpus = kw["tensor_parallel_size"] * kw["data_parallel_size"]
        # The runs record no cache settings: vLLM 0.19's default, prefix caching on.
        cases.append(_per_request_case(
            f"RTX PRO 6000 {short} @ 10/s", f"rtxpro6000-{stem}",
            f"vLLM {meta['vllm_version']}, {gpus}x RTX PRO 6000 Blackwell, {model}, max_num_seqs "
            f"{kw['max_num_seqs']}, max_num_batched_tokens {kw['max_num_batched_tokens']}, prefix caching, "
            "async scheduling", "casys-kaist/LLMServingSim @ 5daddb2 (simbatch/data/measured/serving)",
            bench_requests(_data(f"vllm019_rtxpro6000_{stem}_requests.jsonl")), preset, True,
            int(kw["max_num_seqs"]), int(kw["max_num_batched_tokens"]), cluster))
    return cases


NIGHTLY = {"llama8B_tp1": ("llama-3.1-8b/A100-80GB", 8192, "Llama-3-8B-Instruct"),
           "llama70B_tp4": ("llama-3.1-70b/A100-80GB/tp4", 8192, "Llama-3-70B-Instruct, TP4"),
           "mixtral8x7B_tp2": ("mixtral-8x7b/A100-80GB/tp2", 32768, "Mixtral-8x7B-Instruct-v0.1, TP2")}
"""The nightly's models: the preset, max_model_len (V0's token budget without chunked prefill), the name."""


def _nightly(file: str, version: str) -> list[Case]:
    """vLLM's own nightly benchmark (V0 engine) on A100-80GB: three models at ShareGPT rates 2, 4, 8, 16, inf."""
    rows = json.loads(_data(file).read_text(encoding="utf-8"))
    cases = []
    for row in rows:
        test = row["Test name"]
        model = next(m for m in NIGHTLY if m in test)
        preset, budget, name = NIGHTLY[model]
        rate = test.rsplit("_", 1)[1]
        rate_value = math.inf if rate == "inf" else float(rate)
        # vLLM 0.5's V0 engine: no prefix caching, no async scheduling, no tokenizer batching window.
        scenario = {"device": {"preset": preset}, "kv_cache": {"num_blocks": "auto", "enable_prefix_caching": False},
                    "batching": {"max_num_seqs": 256, "max_num_batched_tokens": budget,
                                 "enable_chunked_prefill": False},
                    "scheduler": {"async_scheduling": False},
                    "frontend": {"request_latency_ms": 1.0, "response_latency_ms": 1.0}}
        measured = {"mean_ttft_ms": row["Mean TTFT (ms)"], "mean_tpot_ms": row["Mean TPOT (ms)"],
                    "request_throughput": row["Tput (req/s)"]}
        cases.append(Case(f"A100 {model} vLLM {version} @ {rate}", f"nightly-{version}-{model}",
                          f"vLLM {version} (V0 engine) nightly, A100-SXM4-80GB, {name}, max_num_seqs 256, "
                          "no chunked prefill", f"vllm-project/vllm @ a0a944d, benchmarks/results/ "
                          f"(simbatch/data/measured/serving/{file})", scenario, measured,
                          num_prompts=int(row["Successful req."]), rate=rate_value,
                          half=[2, 4, 8, 16, math.inf].index(rate_value) % 2,
                          note="V0 engine: its CPU time per step is not modelled"))
    return cases


CASE_SETS: tuple[Callable[[], list[Case]], ...] = (
    _h200_sweep, _rtx4090_run, _rtxpro6000_runs,
    lambda: _nightly("vllm055_nightly_a100_sharegpt.json", "0.5.5"),
    lambda: _nightly("vllm053post1_nightly_a100_sharegpt.json", "0.5.3.post1"))


def cases() -> list[Case]:
    """Every case, in the page's order."""
    return [case for make in CASE_SETS for case in make()]


# --------------------------------------------------------------------------- calibration on the other runs
def bench_json(case: Case) -> dict:
    """A case's measured metrics as the ``vllm bench serve --save-result`` keys calibrate reads."""
    arrays, first, _ = case.workload()
    prompt, output = arrays.prompt_tokens[first:], arrays.output_tokens[first:]
    n = len(prompt)
    return {**case.measured, **case.itl_percentiles, "completed": n, "num_prompts": n, "total_input_tokens": int(prompt.sum()),
            "total_output_tokens": int(output.sum()), "request_rate": case.rate,
            "input_lens": prompt.tolist(), "output_lens": output.tolist()}


def warm_hit_rate(case: Case) -> float:
    """The share of the measured prompts' tokens the prefix cache holds when they arrive: 0 for a cold
    run; for a run that re-sent the previous run's prompts (or the leading ``warm_prompts`` of them),
    every full block before each of those prompts' last token (vLLM computes a prompt's last token
    whatever the cache holds), as the simulation finds them."""
    if case.warm is None or not case.resolved().kv_cache.enable_prefix_caching:
        return 0.0
    arrays, first, _ = case.workload()
    prompt = arrays.prompt_tokens[first:]
    sent = prompt[:first]
    block = case.resolved().kv_cache.block_size
    return float((block * ((sent - 1) // block)).sum() / prompt.sum())


def calibrated_device(case: Case, group: list[Case]) -> dict | None:
    """The five costs ``simbatch calibrate`` fits to the other half of the case's group, its preset's delta and
    epsilon held; None for a case measured alone. The fit is told what the simulated server does outside
    the GPU (its scheduling, its frontend's latency) and what each run found cached (:func:`warm_hit_rate`),
    as a user who knows their server would tell it; left to guess, it reads these files as undated, so
    synchronous, and uncached, and puts the re-sent prompts' prefill into every step."""
    from simbatch.hardware.calibrate import PARAMS, calibrate

    others = [c for c in group if c.half != case.half and c.half >= 0]
    if case.half < 0 or len(others) < 2:
        return None
    preset = case.resolved()
    start = {k: getattr(preset.device, k) for k in PARAMS} | \
        ({"gemm_tier_tokens": preset.device.gemm_tier_tokens} if preset.device.gemm_tier_tokens else {})
    frontend_ms = preset.frontend.request_latency_ms + preset.frontend.response_latency_ms
    with tempfile.TemporaryDirectory() as tmp:
        paths, hit_rates = [], {}
        for i, other in enumerate(others):
            paths.append(Path(tmp) / f"{i}.json")
            paths[-1].write_text(json.dumps(bench_json(other), default=float), encoding="utf-8")
            hit_rates[paths[-1]] = warm_hit_rate(other)
        # Runs that all found their prompts cached never prefilled a whole one: they cannot fit the prefill
        # cost (their TTFT holds a block's worth), which stays at the preset's.
        cold = any(h < 0.5 for h in hit_rates.values())
        fit_only = None if cold else ["tau0_ms", "beta_ms", *(["gemm_tier_ms"] if "gemm_tier_tokens" in start else [])]
        fit = calibrate(paths, fit_only, start=start, frontend_ms=frontend_ms,
                        async_scheduling=preset.scheduler.async_scheduling, hit_rates=hit_rates)
    return {k: float(f"{v:.6g}") for k, v in fit.params.items()}


@dataclass
class Record:
    """Every case's measurement and simulations (what docs/accuracy.json holds)."""

    rows: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"cases": self.rows}, indent=1, sort_keys=False, allow_nan=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Record:
        return cls(json.loads(text)["cases"])


def evaluate(selected: list[Case] | None = None) -> Record:
    """Simulate every case from its preset and, where its server has other runs, calibrated on them."""
    all_cases = cases()
    groups: dict[str, list[Case]] = {}
    for case in all_cases:
        groups.setdefault(case.group, []).append(case)
    rows = []
    for case in selected if selected is not None else all_cases:
        device = calibrated_device(case, groups[case.group])
        rows.append({"name": case.name, "group": case.group, "server": case.server, "source": case.source,
                     "note": case.note, "client_side": case.client_side, "measured": case.measured,
                     "preset": simulate_case(case), "calibrated": None if device is None else simulate_case(case, device),
                     "calibrated_device": device, "fingerprint": fingerprint(case)})
    return Record(rows)


def signed_error(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or measured is None or not measured or math.isnan(simulated) or math.isnan(measured):
        return None
    return simulated / measured - 1


# --------------------------------------------------------------------------- the page
LABELS = {"mean_ttft_ms": "TTFT mean", "median_ttft_ms": "TTFT median", "p99_ttft_ms": "TTFT p99",
          "mean_tpot_ms": "TPOT mean", "mean_itl_ms": "ITL mean", "mean_e2el_ms": "E2E mean",
          "request_throughput": "req/s"}

HEADER = """\
# How close simbatch is to real vLLM servers

<!-- Generated by scripts/gen_accuracy.py from docs/accuracy.json. Do not edit by hand. -->

Every end-to-end measurement of a real vLLM server the project holds, simulated. For each run, the
signed error of the simulation, `simulated / measured - 1`, in two ways:

- **preset**: the server's scenario with `device.preset` and nothing tuned to it. The costs come from
  the model and GPU cards and efficiencies fitted to kernel and step measurements
  ([hardware_fit.md](hardware_fit.md)); the KV cache from `num_blocks: auto`, vLLM's memory profiling;
  the engine as vLLM runs it (async scheduling from vLLM 0.12, the API server's latency). No end-to-end
  run was used to fit anything;
- **calibrated**: the same scenario with the costs `simbatch calibrate` fits to the *other* runs of
  the same server. The rule, fixed before any error was computed: a server's runs, in order of rate,
  are split in two halves, alternating, so each spans the sweep, and each half is predicted from the
  other (the preset's delta and epsilon held; the fit told the server's scheduling, its frontend's
  latency, each run's prefix-cache hit rate and, where the server's kernels have one, the GEMM tile
  switch). A half whose runs all found their prompts cached never prefilled a whole one: its fit holds
  the prefill cost at the preset's. Where only one half holds the run that exercises a cost (the H200
  sweep's cold first run), the claim is the direction calibrated on that half; both are shown. A
  server measured once has none.

Requests: the run's own (lengths and send times) where it recorded them; otherwise as many ShareGPT
pairs as it sent, drawn from what `vllm bench serve --dataset-name sharegpt` sends
(simbatch/data/sharegpt_lengths.csv), at its rate as its client draws arrivals, one fixed seed for all.
So a run's measured means differ from the simulated workload's by the sample too (about 5 % on 300
prompts). A run that re-sent an earlier run's prompts to the same server (the H200 sweep sent the same
300 at every rate) found them in the prefix cache: it is simulated after a pass of those prompts at the
earlier rate, with prefix caching on as the server had it, so its prompts prefill only their last
partial block; the calibration is told that hit rate. Metrics are vLLM's (`vllm bench serve`): TTFT
from the request's send, TPOT per request over its tokens after the first, ITL over every gap, E2E,
throughput over the run. Regenerate with

    .venv/bin/python scripts/gen_accuracy.py

`tests/test_accuracy.py` fails when a change to the costs, the memory model or the engine would
change this page.
"""


def _pct(value: float | None) -> str:
    if value is None:
        return "—"
    return "0%" if abs(value) < 0.005 else f"{value:+.0%}".replace("-", "−")


def _measured(value: float | None, key: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if key == "request_throughput":
        return f"{value:.3g}/s"
    return f"{value / 1e3:,.1f} s" if value >= 10_000 else f"{value:,.4g} ms"


def errors(row: dict, kind: str) -> dict[str, float | None]:
    """A record row's signed error per metric, ``kind`` "preset" or "calibrated" (None where unmeasured)."""
    simulated = row[kind]
    return {k: None if simulated is None else signed_error(simulated.get(k), row["measured"].get(k)) for k in METRICS}


def summary_table(rows: list[dict]) -> list[str]:
    """Median |error| per metric over every run that measured it, preset and calibrated, and how many runs:
    over every run, then over the V1 engine's alone (vLLM's engine today)."""
    out = ["| | " + " | ".join(LABELS[k] for k in METRICS) + " |", "| --- |" + " ---: |" * len(METRICS)]
    for runs, which in ((rows, ""), ([r for r in rows if "V0 engine" not in r["server"]], ", V1 engine")):
        for kind in ("preset", "calibrated"):
            cells = []
            for k in METRICS:
                values = [abs(e) for r in runs if (e := errors(r, kind)[k]) is not None]
                cells.append("—" if not values else f"{np.median(values):.1%} ({len(values)})")
            out.append(f"| median \\|error\\|, {kind}{which} (runs) | " + " | ".join(cells) + " |")
    return out


def render(record: Record, kv_logs: pd.DataFrame | None = None) -> str:
    """docs/accuracy.md from the record (and vLLM's KV-cache logs against num_blocks: auto)."""
    from simbatch.hardware.memory import logged_kv_caches

    lines = [HEADER, "## Summary", "", *summary_table(record.rows), ""]
    lines += ["Per run below: the measured value, then the preset's error and, after the slash, the calibrated",
              "one. A positive error is a simulation above the measurement (slower, for latencies).", ""]
    groups: dict[str, list[dict]] = {}
    for row in record.rows:
        groups.setdefault(row["group"], []).append(row)
    for rows in groups.values():
        first = rows[0]
        lines += [f"## {first['server']}", "", f"Source: {first['source']}." +
                  (f" {first['note'][0].upper()}{first['note'][1:]}." if first["note"] else ""), ""]
        keys = [k for k in METRICS if any(r["measured"].get(k) is not None for r in rows)]
        lines += ["| run | " + " | ".join(LABELS[k] for k in keys) + " |", "| --- |" + " ---: |" * len(keys)]
        for row in rows:
            preset, calibrated = errors(row, "preset"), errors(row, "calibrated")
            cells = [f"{_measured(row['measured'].get(k), k)}: {_pct(preset[k])}" +
                     (f" / {_pct(calibrated[k])}" if row["calibrated"] is not None else "") for k in keys]
            lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
        lines.append("")
    logs = logged_kv_caches() if kv_logs is None else kv_logs
    lines += ["## KV cache capacity: `num_blocks: auto` against vLLM's logs", "",
              "What vLLM logged at start-up (\"GPU KV cache size\" or \"Available KV cache memory\") against what",
              "`num_blocks: auto` computes for the same model, GPU and settings (simbatch/data/measured/kv_logs.csv,",
              "with sources). The sampler's profiled peak is fitted to the llm-d rows; the H200 and RTX 4090 check it.",
              "vLLM 0.10 profiled a lighter sampler: its caches come out larger than `auto` says.", "",
              "| server log | vLLM | logged | auto | error |", "| --- | --- | ---: | ---: | ---: |"]
    for r in logs.itertuples():
        tokens = not (isinstance(r.logged_tokens, float) and math.isnan(r.logged_tokens))
        logged = f"{int(r.logged_tokens):,} tokens" if tokens else f"{r.logged_kv_gib:.2f} GiB"
        auto = f"{int(r.predicted_tokens):,} tokens" if tokens else f"{r.predicted_kv_gib:.2f} GiB"
        lines.append(f"| {r.case} | {r.vllm} | {logged} | {auto} | {f'{r.error:+.1%}'.replace('-', '−')} |")
    return "\n".join(lines) + "\n"
