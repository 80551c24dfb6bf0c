"""The benchmarks' data files are what their script and sources say they are.

Speed itself is measured by ``make bench`` and ``python -m benchmarks.compare``, never here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data"


def make_bench_data():
    spec = importlib.util.spec_from_file_location("make_bench_data", REPO / "scripts" / "make_bench_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chapter_toy_trace_is_what_its_script_makes_and_extends_the_toys_own_200():
    text = make_bench_data().chapter_toy_csv(5000)
    assert (DATA / "chapter_toy_5000.csv").read_text(encoding="utf-8") == text
    scaled = pd.read_csv(DATA / "chapter_toy_5000.csv")
    own = pd.read_csv(REPO / "scenarios" / "data" / "chapter_toy.csv")  # recorded by running the chapter's code
    assert len(scaled) == 5000
    pd.testing.assert_frame_equal(scaled.head(len(own)), own)


def test_the_azure_lengths_are_the_conversation_traces_two_columns():
    lengths = pd.read_csv(DATA / "azure_conv_2023_lengths.csv")
    assert list(lengths.columns) == ["ContextTokens", "GeneratedTokens"]
    # The trace's published figures (shared/data/traces/NOTICE.md): 19,366 requests, means 1,155 and 211.
    assert len(lengths) == 19_366
    assert round(lengths["ContextTokens"].mean()) == 1155 and round(lengths["GeneratedTokens"].mean()) == 211
    assert lengths.iloc[0].tolist() == [374, 44]  # the trace's first row, 2023-11-16 18:15:46.68



# --------------------------------------------------------------------------- benchmarks.compare
def tiny(**sections) -> dict:
    return {"workload": {"num_requests": 40, "arrival": {"rate": 20.0},
                         "output_tokens": {"dist": "uniform", "low": 4, "high": 40}},
            "kv_cache": {"num_blocks": 64}, **sections}


def test_compare_hands_over_what_was_set_and_marks_what_is_at_its_default():
    from benchmarks.compare import portable
    from simbatch.config import Scenario

    spec = portable(Scenario.model_validate(tiny(kv_cache={"num_blocks": 64, "enable_prefix_caching": False},
                                                 sim={"fast_forward": True})))
    assert spec["scenario"]["kv_cache"] == {"num_blocks": 64, "enable_prefix_caching": False}
    assert "device" not in spec["scenario"]  # not set: the other commit applies its own default
    assert spec["droppable"] == [["kv_cache", "enable_prefix_caching"], ["sim", "fast_forward"]]


def test_the_compare_driver_drops_only_unknown_fields_at_their_default(tmp_path):
    from benchmarks.compare import ROOT, run_side

    def run(scenario: dict, droppable: list) -> dict:
        return run_side(sys.executable, ROOT, {"scenario": scenario, "droppable": droppable}, tmp_path)

    ran = run(tiny(sim={"warp_drive": False}), [["sim", "warp_drive"]])
    assert ran["dropped"] == ["sim.warp_drive"] and ran["completed"] == 40 and ran["cpu_s"] > 0
    refused = run(tiny(sim={"warp_drive": True}), [])
    assert refused["error"].startswith("sim.warp_drive: Extra inputs are not permitted")
    assert refused["workload_only"] is False


def test_a_workload_replayed_as_a_trace_is_the_same_simulation(tmp_path):
    from benchmarks.compare import ROOT, as_trace, portable, run_side
    from simbatch.config import Scenario

    scenario = Scenario.model_validate(tiny())
    drawn = run_side(sys.executable, ROOT, portable(scenario), tmp_path)
    replayed = run_side(sys.executable, ROOT, as_trace(scenario, tmp_path), tmp_path)
    assert (replayed["steps"], replayed["completed"]) == (drawn["steps"], drawn["completed"]) != (0, 0)
    # A trace carries times and lengths only: tenants or sessions cannot be handed over so.
    assert as_trace(Scenario.model_validate(tiny(workload={**tiny()["workload"], "num_sessions": 4})), tmp_path) is None


def test_instructions_leave_out_the_million_request_cases_unless_named():
    """Under --instructions a case runs tens of times slower: B2 and B9 (a million requests) would take half
    an hour or more a side, so they are counted only when named; timed, every case is compared."""
    from benchmarks.cases import CASES
    from benchmarks.compare import default_cases
    from benchmarks.run import LONG

    assert default_cases(instructions=False) == list(CASES)
    assert default_cases(instructions=True) == [name for name in CASES if name not in LONG]
    assert set(LONG) == {"B2", "B9"} and {"B1", "B3", "B7", "B8"} <= set(default_cases(instructions=True))


def test_counted_instructions_are_those_of_the_run_alone(tmp_path, monkeypatch):
    """--instructions: callgrind's count of a process that builds the engine and runs it, less that of one
    that stops once it is built (the driver stops where told; valgrind is stood in for: its count line)."""
    import benchmarks.compare as compare
    from simbatch.config import Scenario

    spec = compare.portable(Scenario.model_validate(tiny()))
    real_run_side, wrappers = compare.run_side, []

    def counted(python, tree, spec, folder, wrapper=()):
        wrappers.append(wrapper[:4])
        out = real_run_side(python, tree, spec, folder)  # the driver itself, without valgrind
        assert out["stop"] == spec["stop"]
        return {**out, "stderr": f"==1== Collected : {10_000 if spec['stop'] == 'built' else 12_345}\n"}

    monkeypatch.setattr(compare, "run_side", counted)
    assert compare.instructions(sys.executable, compare.ROOT, spec, tmp_path) == 2_345
    # Under valgrind with one BLAS thread (valgrind counts idle BLAS workers polling, the longer the run the more).
    assert wrappers == [("env", "OPENBLAS_NUM_THREADS=1", "valgrind", "--tool=callgrind")] * 2
