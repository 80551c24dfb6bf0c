"""The ``vllm serve`` command line of a planned configuration, with vLLM's flag names.

Every setting the simulation depended on is spelled out, including those where simbatch's default is
not vLLM's (prefix caching: off in a scenario unless set, on in vLLM), so the server runs what was
simulated: ``--tensor-parallel-size``, ``--enable-expert-parallel``, ``--quantization fp8``,
``--max-num-seqs``, ``--max-num-batched-tokens``, ``--gpu-memory-utilization``, ``--kv-cache-dtype``,
``--block-size``, ``--enable-prefix-caching`` / ``--no-enable-prefix-caching``,
``--enable-chunked-prefill`` / ``--no-enable-chunked-prefill``, ``--async-scheduling`` /
``--no-async-scheduling`` (off in a scenario unless set, on in vLLM), ``--long-prefill-token-threshold``,
``--scheduling-policy priority``, ``--num-gpu-blocks-override`` (a calibrated device's block count),
and for disaggregated pools ``--kv-transfer-config`` with vLLM's NIXL connector. What vLLM has no
flag for (simbatch's ``sjf`` and ``fair`` policies, a speculative drafter without its model) is said
in a note beside the command.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from simbatch.app.plan.space import Config
from simbatch.config import Scenario, replica_scenarios
from simbatch.registry import POLICIES

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
VLLM_DEFAULT_POLICY = "fcfs"  # vLLM's --scheduling-policy default: not repeated on the command line


@dataclass(frozen=True)
class Launch:
    """One pool of alike servers: its role, how many, the command each runs, and notes."""

    role: str  # "replica", "prefill" or "decode"
    replicas: int
    command: str
    notes: tuple[str, ...] = ()


def _flags(config: Config, scenario: Scenario) -> tuple[list[str], list[str]]:
    kv, b, sched = scenario.kv_cache, scenario.batching, scenario.scheduler
    flags = ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.expert_parallel:
        flags.append("--enable-expert-parallel")
    if config.quantization == "fp8":
        flags += ["--quantization", "fp8"]
    flags += ["--max-num-seqs", str(b.max_num_seqs), "--max-num-batched-tokens", str(b.max_num_batched_tokens),
              "--gpu-memory-utilization", f"{kv.gpu_memory_utilization:g}",
              "--kv-cache-dtype", str(getattr(kv, "dtype", None) or "auto"), "--block-size", str(kv.block_size),
              "--enable-prefix-caching" if kv.enable_prefix_caching else "--no-enable-prefix-caching",
              "--enable-chunked-prefill" if b.enable_chunked_prefill else "--no-enable-chunked-prefill",
              "--async-scheduling" if sched.async_scheduling else "--no-async-scheduling"]
    if b.long_prefill_token_threshold is not None:
        flags += ["--long-prefill-token-threshold", str(b.long_prefill_token_threshold)]
    if scenario.device.preset is None:
        flags += ["--num-gpu-blocks-override", str(kv.num_blocks)]
    notes = []
    vllm_policy = POLICIES[sched.policy].vllm
    if vllm_policy is None:
        notes.append(f"simulated with scheduler.policy {sched.policy}, which vLLM does not have (it runs "
                     f"{' or '.join(p.vllm for p in POLICIES if p.vllm)})")
    elif vllm_policy != VLLM_DEFAULT_POLICY:
        flags += ["--scheduling-policy", vllm_policy]
    spec = scenario.device.speculative
    if spec is not None:
        notes.append(f"simulated with speculative decoding ({spec.num_speculative_tokens} draft tokens, "
                     f"acceptance {spec.acceptance_rate:g}): add --speculative-config with your drafter, e.g. "
                     f"'{{\"model\": \"DRAFT\", \"num_speculative_tokens\": {spec.num_speculative_tokens}}}'")
    return flags, notes


def vllm_serve(config: Config, scenario: Scenario, units: int) -> list[Launch]:
    """The servers of ``config`` at ``units`` replicas (or pool units), ``scenario`` being the configuration
    loaded (any size: the flags are per server)."""
    model = config.model_id or "MODEL"
    notes_model = () if config.model_id else ("MODEL: the model your calibrated device serves (give it as "
                                              "devices[].model in the search space)",)
    pools = scenario.cluster.disaggregated
    if pools is None:
        flags, notes = _flags(config, scenario)
        return [Launch("replica", config.replicas(units), shlex.join(["vllm", "serve", model, *flags]),
                       (*notes_model, *notes))]
    specs = replica_scenarios(scenario)
    out = []
    for role, spec, count in (("prefill", specs[0], units * config.layout.prefill),
                              ("decode", specs[-1], units * config.layout.decode)):
        flags, notes = _flags(config, spec)
        flags += ["--kv-transfer-config", json.dumps(NIXL, separators=(",", ":"))]
        out.append(Launch(role, count, shlex.join(["vllm", "serve", model, *flags]), (*notes_model, *notes)))
    return out


def describe(launches: list[Launch], router: str) -> list[str]:
    """The launch as lines to print: each pool's count, then its command, then its notes."""
    lines = []
    for launch in launches:
        who = "replica" if launch.role == "replica" else f"{launch.role} replica"
        where = f"behind a {router} router" if launch.role == "replica" else \
            "(a disaggregation proxy sends each request to a prefill replica, then a decode replica)"
        lines.append(f"{launch.replicas} {who}{'s' * (launch.replicas != 1)} {where}, each:")
        lines.append(f"  {launch.command}")
        lines += [f"  note: {note}" for note in launch.notes]
    return lines
