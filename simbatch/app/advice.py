"""Warnings for scenarios that are valid but do not do what they seem to.

Validation refuses what cannot run; these are settings that run and silently do nothing, or
traffic the engine will turn away whole. Each warning is one line naming the setting and the fix;
``validate`` and ``run`` print them on stderr before anything is simulated.
"""

from __future__ import annotations

import numpy as np

from simbatch.config import Scenario, replica_scenarios, sized_caches
from simbatch.engine import rejection_reasons
from simbatch.registry import MODES, POLICIES
from simbatch.workload import WorkloadArrays


def _rejected_everywhere(scenario: Scenario, workload: WorkloadArrays) -> str | None:
    """A warning when no replica can ever serve any request of the workload (every one a 429)."""
    if not len(workload):
        return None
    # Reasons depend on the lengths alone, so each distinct (prompt, output) pair is checked once.
    pairs = np.unique(np.stack([workload.prompt_tokens, workload.output_tokens]), axis=1)
    why: dict[str, int] = {}
    distinct = {s.model_dump_json(include={"kv_cache", "batching"}): s for s in replica_scenarios(scenario)}
    for replica in distinct.values():
        reasons = rejection_reasons(replica, pairs[0], pairs[1])
        if len(reasons) < pairs.shape[1]:
            return None
        for reason in reasons.values():
            why[reason] = why.get(reason, 0) + 1
    fixes = {"never_fits": "a request's KV (prompt + output tokens) exceeds kv_cache.num_blocks x block_size; "
                           "raise num_blocks or shorten the requests",
             "prompt_exceeds_budget": "prompts exceed batching.max_num_batched_tokens with chunked prefill off; "
                                      "raise the budget or set enable_chunked_prefill: true"}
    main = max(why, key=why.get)
    return f"every request would be rejected ({main}): {fixes[main]}"


PLAUSIBLE_MS = {"tau0_ms": (0.5, 5_000.0), "weights_ms": (1e-3, 10_000.0), "beta_ms": (2e-5, 100.0),
                "prefill_ms_per_token": (2e-5, 100.0), "kv_read_ms_per_1k_tokens": (2e-5, 1_000.0),
                "prefill_attention_ms_per_1m_pairs": (1e-3, 10_000.0)}
"""What a GPU's step costs can be, ms: about ten times wider on each side than every preset there is
(every shipped model on every shipped GPU, tp1 to tp8, bf16 and fp8: tau0 1.3 to 13 ms, the weights'
stream 0.015 to 590, beta and gamma 0.00015 to 8.9, delta 0.0004 to 9.0, epsilon 0.009 to 100; a step
has at least the fitted 0.97 ms of fixed overhead). Outside it a value is likely in the wrong unit:
seconds, or microseconds, typed as ms. Zero is an idealisation (that cost left out), not a typo, and so
is no weights' stream (the costs added). tests/test_sharp_edges.py keeps the band true."""


def _implausible_costs(scenario: Scenario) -> list[str]:
    """A warning per device cost outside :data:`PLAUSIBLE_MS`, with the value it may have meant."""
    devices = [("device", scenario.device)] + [(f"{where}.device", spec.device)
                                               for where, spec in scenario.cluster.named_groups() if spec.device]
    out = []
    for where, device in devices:
        for key, (low, high) in PLAUSIBLE_MS.items():
            value = getattr(device, key)
            if value is None:
                continue
            if 0 < value < low:
                out.append(f"{where}.{key} is {value:g} ms, below what any GPU's step costs (at least {low:g} ms); "
                           f"is it in seconds? {value * 1e3:g} ms")
            elif value > high:
                out.append(f"{where}.{key} is {value:g} ms, above what any GPU's step costs (at most {high:g} ms); "
                           f"is it in microseconds? {value / 1e3:g} ms")
    return out


def _blocks_beyond_memory(scenario: Scenario) -> list[str]:
    """A warning when a cache of a given number of blocks (not sized by resolution) is more than the preset's
    GPU holds, as vLLM sizes it."""
    from simbatch.hardware.memory import kv_budget, weights_problem
    from simbatch.inputs.resolve import deployment

    record = scenario.resolution or {}
    out = []
    for where, _, kv, device, b in sized_caches(scenario):
        made = record.get(f"{where}.num_blocks")
        if device.preset is None or made is not None and made.decided:
            continue
        if problem := weights_problem(deployment(device), kv.gpu_memory_utilization):
            out.append(f"{where.removesuffix('kv_cache')}device.preset {problem}: the run models a deployment that "
                       "cannot load")
            continue
        try:
            budget = kv_budget(deployment(device), kv.block_size, kv.gpu_memory_utilization,
                               b.max_num_batched_tokens, b.max_num_seqs, kv.activation_reserve_gib)
            room, why = budget.blocks, budget.describe()
        except ValueError:
            room, why = 0, "no room beside the weights and activations"
        if kv.num_blocks > room:
            out.append(f"{where}.num_blocks {kv.num_blocks:,} is more than {device.preset} holds ({room:,} blocks "
                       f"of {kv.block_size} tokens: {why}); num_blocks: auto sizes the cache as vLLM does")
    return out


def _unused_knobs(section: str, settings, running: str, entries, declared: str, kind: str, where: str) -> list[str]:
    """Settings of ``section`` that only other entries than ``running`` read (each entry declares its
    own in its ``declared`` mapping: knob -> what it does there), each once, naming who reads it:
    ``kind`` is what an entry is called ("policy"), ``where`` the phrase that places the running one."""
    out, readers = [], {}
    for entry in entries:
        for knob, what in getattr(entry, declared).items():
            readers.setdefault(knob, []).append((entry.name, what))
    for knob, names in readers.items():
        if running in (n for n, _ in names) or knob not in settings.model_fields_set or \
                getattr(settings, knob) in (None, {}):
            continue
        out.append(f"{section}.{knob} has no effect {where.format(running)}; {names[0][1]} "
                   f"({kind}: {', '.join(n for n, _ in names)})")
    return out


def advisories(scenario: Scenario, workload: WorkloadArrays, mode_fixed: bool = True) -> list[str]:
    """One line per setting that has no effect here, or per reason nothing would be served.

    ``mode_fixed``: the batching mode is the scenario's (``run``). A scenario checked for
    ``compare`` (or by ``validate``, which cannot know) keeps each mode's knobs without a warning.
    """
    out = _implausible_costs(scenario) + _blocks_beyond_memory(scenario)
    rejected = _rejected_everywhere(scenario, workload)
    if rejected:
        out.append(rejected)
    arrival, sched, batching = scenario.workload.arrival, scenario.scheduler, scenario.batching
    if "burstiness" in arrival.model_fields_set and arrival.process != "gamma" and scenario.workload.trace is None:
        out.append(f"workload.arrival.burstiness has no effect with process {arrival.process}; "
                   "set process: gamma to use it")
    out += _unused_knobs("scheduler", sched, sched.policy, POLICIES, "reads", "policy", "under policy {}")
    unknown = sorted(set(sched.tenant_weights) - set(workload.tenant_names))
    if unknown:
        out.append(f"scheduler.tenant_weights names {', '.join(map(repr, unknown))}, which no class of "
                   f"workload.classes is called (tenants: {', '.join(map(repr, workload.tenant_names))})")
    if mode_fixed:
        out += _unused_knobs("batching", batching, batching.mode, MODES, "knobs", "mode", "in {} mode")
    if scenario.kv_cache.swap_blocks and sched.preemption != "swap":
        out.append("kv_cache.swap_blocks has no effect with preemption: recompute; set preemption: swap")
    return out
