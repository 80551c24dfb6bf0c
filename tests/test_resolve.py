"""Resolution (simbatch/inputs/resolve.py): a pure, idempotent function from a validated scenario to the
one the engine runs, with a record of where each value came from; and the import structure that keeps
the schema apart from the hardware model it resolves with."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from simbatch.config import DEVICE_COSTS, Device, Scenario, replica_scenarios
from simbatch.engine import Engine
from simbatch.hardware.memory import kv_budget
from simbatch.hardware.preset import fitted, parse
from simbatch.inputs.loading import ScenarioError, load_scenario, scenario_from_dict
from simbatch.inputs.resolve import STEPS, resolve, resolve_device
from simbatch.simulation import simulate
from simbatch.workload import generate

ROOT = Path(__file__).resolve().parents[1]
H100, H200 = "llama-3.1-8b/H100-SXM", "llama-3.1-8b/H200"


def validated(**sections) -> Scenario:
    return Scenario.model_validate({"workload": {"num_requests": 20, "arrival": {"rate": 5}}, **sections})


# Scenarios that exercise every step: presets on the scenario and on groups, blocks from memory and
# from vLLM's token count, a group sized for its own GPU, disaggregated pools with derived KV bytes.
CASES = {
    "plain": validated(),
    "preset": validated(device={"preset": H100, "beta_ms": 0.05}, kv_cache={"num_blocks": "auto"}),
    "fleet": validated(device={"preset": H100}, kv_cache={"num_blocks": "auto"},
                       cluster={"replica_specs": [{"count": 1}, {"count": 2, "device": {"preset": H200}},
                                                  {"count": 1, "batching": {"max_num_seqs": 32,
                                                                            "max_num_batched_tokens": 1024}},
                                                  {"count": 1, "kv_cache": {"gpu_kv_cache_tokens": 50_000}}]}),
    "logged_tokens": validated(kv_cache={"gpu_kv_cache_tokens": 100_000}),
    "tiers_and_adapters": validated(device={"preset": H100},
                                    kv_cache={"enable_prefix_caching": True, "host_blocks": 1000, "dtype": "fp8"},
                                    lora={"max_loras": 2}),
    "disaggregated": validated(device={"preset": H100}, kv_cache={"num_blocks": "auto"},
                               cluster={"disaggregated": {"prefill": {"count": 1, "device": {"preset": H200}},
                                                          "decode": {"count": 2},
                                                          "kv_transfer": {"bandwidth_gb_s": 50}}}),
}


# --------------------------------------------------------------------------- a function
@pytest.mark.parametrize("name", CASES)
def test_resolve_never_changes_its_input(name):
    given = CASES[name]
    before, fields = given.model_dump(), given.device.model_fields_set.copy()
    resolved = resolve(given)
    assert given.model_dump() == before and given.device.model_fields_set == fields
    assert given.resolution is None and resolved.resolution is not None
    assert resolved is not given


@pytest.mark.parametrize("name", CASES)
def test_resolve_is_idempotent(name):
    once = resolve(CASES[name])
    twice = resolve(once)
    assert twice == once  # fields and record alike
    assert twice.model_dump() == once.model_dump()
    assert dict(twice.resolution) == dict(once.resolution)
    # What was decided is not marked as given, so it is decided again, alike.
    assert once.device.model_fields_set == CASES[name].device.model_fields_set


def test_validation_writes_nothing_and_resolution_fills_in():
    given = CASES["preset"]
    assert given.kv_cache.num_blocks == "auto" and given.device.tau0_ms == Device().tau0_ms  # as the file says
    resolved = resolve(given)
    assert isinstance(resolved.kv_cache.num_blocks, int) and resolved.device.tau0_ms != given.device.tau0_ms


def test_each_preset_cost_records_its_source_and_value():
    resolved = resolve(CASES["preset"])
    derived = parse(H100).device_ms(fitted()[0])
    record = resolved.resolution
    for key in DEVICE_COSTS:
        p = record[f"device.{key}"]
        assert p.value == getattr(resolved.device, key)
        if key == "beta_ms":
            assert (p.source, p.value, p.decided) == ("explicit", 0.05, False)
        else:
            assert (p.source, p.note, p.decided) == ("preset", H100, True)
            assert p.value == float(f"{derived[key]:.6g}")
    assert resolve(CASES["plain"]).resolution.sources("device") == dict.fromkeys(DEVICE_COSTS, "default")
    assert resolve(validated(device={"tau0_ms": 5})).resolution.sources("device")["tau0_ms"] == "explicit"


def test_a_groups_own_preset_has_its_own_record():
    resolved = resolve(CASES["fleet"])
    assert resolved.resolution.sources("cluster.replica_specs.1.device") == \
        dict.fromkeys((*DEVICE_COSTS, "weights_ms"), "preset")
    assert resolved.resolution["cluster.replica_specs.1.device.tau0_ms"].note == H200
    assert resolved.cluster.replica_specs[1].device.tau0_ms == resolve_device(Device(preset=H200)).tau0_ms


def test_auto_blocks_for_the_scenario_and_every_group():
    resolved = resolve(CASES["fleet"])
    record = resolved.resolution
    # The scenario's batching is vLLM's on an H100 (the keys it leaves out: 8192 tokens, 1024 slots).
    assert record["batching.max_num_seqs"].source == "vllm"
    h100 = kv_budget(parse(H100), 16, 0.9, 8192, 1024)
    top = record["kv_cache.num_blocks"]
    assert (top.value, top.source, top.note) == (h100.blocks, "preset", f"{H100}: {h100.describe()}")
    # A group on its own GPU, or with its own batching, gets the scenario's auto cache sized for itself.
    h200 = record["cluster.replica_specs.1.kv_cache.num_blocks"]
    assert h200.source == "preset" and h200.value == kv_budget(parse(H200), 16, 0.9, 8192, 1024).blocks
    small = record["cluster.replica_specs.2.kv_cache.num_blocks"]
    assert small.value == kv_budget(parse(H100), 16, 0.9, 1024, 32).blocks
    logged = record["cluster.replica_specs.3.kv_cache.num_blocks"]
    assert (logged.value, logged.source, logged.note) == (3125, "derived", "gpu_kv_cache_tokens 50,000 / block_size 16")
    assert "cluster.replica_specs.0.kv_cache.num_blocks" not in record  # it runs the scenario's cache
    fleet = replica_scenarios(resolved)
    assert [s.kv_cache.num_blocks for s in fleet] == [top.value, h200.value, h200.value, small.value, 3125]
    assert "cluster.replica_specs.1.kv_cache" not in CASES["fleet"].cluster.replica_specs[1].model_fields_set


def test_the_pools_blocks_and_kv_bytes_are_resolved():
    resolved = resolve(CASES["disaggregated"])
    record = resolved.resolution
    assert record["cluster.disaggregated.prefill.kv_cache.num_blocks"].note.startswith(H200)
    assert "cluster.disaggregated.decode.kv_cache.num_blocks" not in record  # the scenario's device and cache
    kv = record["cluster.disaggregated.kv_bytes_per_token"]
    assert (kv.value, kv.source) == (131072, "preset")  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    assert resolved.cluster.disaggregated.kv_bytes_per_token == 131072
    given = validated(cluster={"disaggregated": {"prefill": {"count": 1}, "decode": {"count": 1},
                                                 "kv_transfer": {"bandwidth_gb_s": 50}, "kv_bytes_per_token": 1000}})
    assert resolve(given).resolution["cluster.disaggregated.kv_bytes_per_token"].source == "explicit"


def test_a_number_made_from_auto_keeps_its_record():
    once = resolve(CASES["preset"])
    assert once.kv_cache.num_blocks != "auto" and "num_blocks" in once.kv_cache.model_fields_set
    assert resolve(once).resolution["kv_cache.num_blocks"] == once.resolution["kv_cache.num_blocks"]
    # A result folder's resolved config holds the number itself: given, when validated again.
    again = resolve(Scenario.model_validate(once.model_dump(mode="json")))
    assert again.kv_cache.num_blocks == once.kv_cache.num_blocks
    assert again.resolution["kv_cache.num_blocks"].source == "explicit"


def test_a_resolved_scenario_changed_is_resolved_anew():
    once = resolve(CASES["preset"])
    other = once.model_copy(update={"device": Device(preset=H200)})
    assert resolve(other).device.weights_ms == resolve_device(Device(preset=H200)).weights_ms != once.device.weights_ms


def test_the_steps_are_in_order():
    # Blocks from memory read the resolved devices; the KV transfer reads the prefill pool's preset.
    # vLLM's defaults come first: the blocks read the batching they set.
    # The host tier and adapters come last: their KV bytes are for the cache its dtype resolved.
    assert [s.__name__ for s in STEPS] == ["_vllm_defaults", "_device_costs", "_kv_blocks", "_kv_transfer",
                                           "_tiers_and_adapters"]


# --------------------------------------------------------------------------- who resolves
def test_simulate_and_the_engine_resolve_what_they_are_given():
    given = validated(device={"preset": H100}, kv_cache={"num_blocks": "auto"})
    result = simulate(given)
    assert result.scenario == resolve(given)
    assert simulate(resolve(given)).requests.equals(result.requests)
    assert Engine(given, generate(given)).scenario == resolve(given)


def test_resolve_is_public():
    import simbatch

    assert simbatch.resolve is resolve and "resolve" in simbatch.__all__


def test_the_loader_resolves():
    loaded = load_scenario(ROOT / "scenarios" / "llama3_8b_h100.yaml")
    assert loaded.resolution is not None and isinstance(loaded.kv_cache.num_blocks, int)
    assert loaded._base_dir == (ROOT / "scenarios").resolve()
    assert resolve(loaded) == loaded


# --------------------------------------------------------------------------- failures
def test_resolution_failures_are_located_as_validation_locates_them(tmp_path):
    bad = validated(cluster={"replica_specs": [{"count": 1, "device": {"preset": "llama-9/H200"}},
                                               {"count": 1, "device": {"preset": "llama-3.1-8b/TPU-v5e"}}]})
    with pytest.raises(ValidationError) as info:
        resolve(bad)
    assert [(e["loc"], e["msg"].split(";")[0]) for e in info.value.errors()] == [
        (("cluster", "replica_specs", 0, "device"), "Value error, unknown model 'llama-9'"),
        (("cluster", "replica_specs", 1, "device"), "Value error, unknown GPU 'TPU-v5e'")]
    text = ("workload: {num_requests: 5}\ncluster:\n  replica_specs:\n    - count: 1\n"
            "      device: {preset: llama-9/H200}\n")
    path = tmp_path / "s.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as loaded:
        load_scenario(path)
    assert str(loaded.value).startswith(f"{path}:5:15: cluster.replica_specs.0.device: unknown model 'llama-9'")


def test_a_mapping_is_validated_then_resolved():
    with pytest.raises(ScenarioError, match="no room for the KV cache"):
        scenario_from_dict({"workload": {"num_requests": 1}, "device": {"preset": "llama-3.1-70b/L4"},
                            "kv_cache": {"num_blocks": "auto"}})


# --------------------------------------------------------------------------- import structure
CONFIG = ROOT / "simbatch" / "config"
RESOLUTION = {"resolve.py", "loading.py"}  # the modules that meet the hardware model; the rest is schema


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every simbatch module a file imports, at any depth of its code, with the packages that importing
    it runs first (``simbatch.config.cards`` runs ``simbatch.config`` from outside that package)."""
    me, out = _module(path), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "simbatch":
                out |= {m for m in (".".join(parts[:i]) for i in range(2, len(parts) + 1))
                        if m == name or not (me == m or me.startswith(m + "."))}
    return out


def test_the_schema_imports_nothing_of_hardware():
    for path in sorted(CONFIG.glob("*.py")):
        if path.name not in RESOLUTION:
            hardware = {m for m in _imports(path) if m.startswith("simbatch.hardware")}
            assert not hardware, f"{path.name} imports {hardware}"
    # And importing the schema loads none of it.
    code = "import sys, simbatch.config; print(sorted(m for m in sys.modules if m.startswith('simbatch.hardware')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_and_hardware_import_no_circle():
    files = sorted([*CONFIG.glob("*.py"), *(ROOT / "simbatch" / "hardware").glob("*.py")])
    graph = {_module(p): {m for m in _imports(p) if m.startswith(("simbatch.config", "simbatch.hardware"))}
             for p in files}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path[path.index(module):], module))}"
        if module in done:
            return
        for imported in graph.get(module, ()):
            if imported != module:
                visit(imported, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())
    # Every hardware module can be imported first, in an interpreter that has imported no simbatch module
    # (no circle at run time either).
    hardware = sorted(m for m in graph if m.startswith("simbatch.hardware"))
    out = subprocess.run([sys.executable, "-c", IMPORTED_FIRST, *hardware], capture_output=True, text=True)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stdout + out.stderr


# Each module named in argv imported in a child forked from an interpreter holding the third-party
# libraries alone: as first as a fresh interpreter's import, without loading NumPy, pandas, SciPy and
# pydantic again for every module. Prints the modules that failed.
IMPORTED_FIRST = """
import os, sys, traceback
import numpy, pandas, pydantic, scipy.optimize, yaml
assert not [m for m in sys.modules if m.startswith("simbatch")]
failed = []
for module in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(module)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(module)
print(failed)
"""
