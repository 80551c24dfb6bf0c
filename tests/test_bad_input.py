"""Bad input, every kind the issue lists: one clear line per problem, exit code 2, no traceback, no folder.

Each case is a scenario file (or command line) with one thing wrong. The command must name the
file and, where the file has one, the line and column of the offending value (``file:line:col:``),
the dotted field, the value found and what to do about it; print nothing on stdout; and leave no
result folder, not even a temporary one.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_cli import SCENARIOS, invoke

GOOD = """\
name: bad
workload:
  num_requests: 10
  arrival:
    rate: 2
device:
  tau0_ms: 20
  beta_ms: 0.2
kv_cache:
  block_size: 16
  num_blocks: 1024
batching:
  max_num_seqs: 8
  max_num_batched_tokens: 512
"""


DISAGGREGATED = """\
cluster:
  disaggregated:
    prefill: {count: 1}
    decode: {count: 2}
    kv_transfer: {latency_ms: 1, bandwidth_gb_s: 50}
    kv_bytes_per_token: 131072
"""


def edited(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


TRACE_SCENARIO = """\
name: bad_trace
workload:
  trace:
    path: trace.csv
"""

SPECULATIVE = "  beta_ms: 0.2\n  speculative:\n    num_speculative_tokens: 2\n    acceptance_rate: 0.5\n"
WITH_DRAFTS = SPECULATIVE + "    draft_cost_ms: 1\n"

# (id, scenario text, extra CLI args, expected "file:line:col: path: ..." prefix, words the line must contain)
CASES = [
    ("unknown_key", edited("  num_requests: 10\n", "  num_requests: 10\n  colour: red\n"), (),
     "s.yaml:4:3: workload.colour: unknown key", ["spelling", "simbatch schema"]),
    ("wrong_type", edited("max_num_seqs: 8", "max_num_seqs: lots"), (),
     "s.yaml:13:17: batching.max_num_seqs:", ["valid integer", "'lots'"]),
    ("negative_rate", edited("rate: 2", "rate: -2"), (),
     "s.yaml:5:11: workload.arrival.rate:", ["greater than 0", "-2"]),
    ("zero_rate", edited("rate: 2", "rate: 0"), (),
     "s.yaml:5:11: workload.arrival.rate:", ["greater than 0", "got 0"]),
    ("zero_size", edited("num_blocks: 1024", "num_blocks: 0"), (),
     "s.yaml:11:15: kv_cache.num_blocks:", ["greater than 0", "got 0"]),
    ("fractional_block_size", edited("block_size: 16", "block_size: 16.5"), (),
     "s.yaml:10:15: kv_cache.block_size:", ["integer", "16.5"]),
    ("budget_below_max_num_seqs", edited("max_num_batched_tokens: 512", "max_num_batched_tokens: 4"), (),
     "s.yaml:13:3: batching:", ["max_num_batched_tokens (4)", "max_num_seqs (8)", "raise the budget"]),
    ("missing_trace", TRACE_SCENARIO.replace("trace.csv", "nowhere.csv"), (),
     "s.yaml:4:11: workload.trace.path:", ["file not found", "nowhere.csv"]),
    ("trace_bad_row", TRACE_SCENARIO, (),
     "trace.csv:3: workload.trace:", ["'ContextTokens'", "'many'", "fix or delete that row"]),
    ("not_yaml", "workload: [1, 2\nbatching: {}\n", (), "s.yaml:2:", ["not valid YAML"]),
    ("empty", "", (), "s.yaml: ", ["empty", "expected a YAML mapping"]),
    ("not_a_mapping", "- 1\n- 2\n", (), "s.yaml: ", ["a list", "expected a YAML mapping"]),
    ("not_utf8", b"name: caf\xe9\n", (), "s.yaml:1: ", ["cannot read the file", "not UTF-8"]),
    ("bad_set_syntax", GOOD, ("--set", "nonsense"), "--set: nonsense:", ["expected dotted.key=value"]),
    ("bad_set_value", GOOD, ("--set", "workload.arrival.rate=-3"),
     "--set: workload.arrival.rate:", ["greater than 0", "-3"]),
    ("bad_set_below_a_value", GOOD, ("--set", "workload.num_requests.x=1"),
     "--set: workload.num_requests.x:", ["not a mapping"]),
    ("bad_mode", GOOD, ("--mode", "eager"), "--set: batching.mode:", ["'static', 'dynamic' or 'continuous'",
                                                                       "'eager'"]),
    ("bad_seed", GOOD, ("--seed", "-1"), "--set: seed:", ["greater than or equal to 0", "-1"]),
    ("disaggregated_static", edited("batching:\n", "batching:\n  mode: static\n") + DISAGGREGATED, (),
     "s.yaml:1:1: cluster.disaggregated.prefill runs", ["cluster.disaggregated.prefill runs batching.mode static", "use batching.mode: continuous"]),
    ("disaggregated_no_kv_bytes", GOOD + DISAGGREGATED.replace("    kv_bytes_per_token: 131072\n", ""), (),
     "s.yaml:", ["cluster.disaggregated.kv_bytes_per_token is missing", "give kv_bytes_per_token"]),
    ("disaggregated_zero_bandwidth", GOOD + DISAGGREGATED.replace("bandwidth_gb_s: 50", "bandwidth_gb_s: 0"),
     (), "s.yaml:19:50: cluster.disaggregated.kv_transfer.bandwidth_gb_s:", ["greater than or equal to 0.001", "got 0"]),
    ("disaggregated_max_in_flight", GOOD + DISAGGREGATED + "  max_in_flight: 10\n", (),
     "s.yaml:16:3: cluster:", ["cluster.max_in_flight (10) with cluster.disaggregated", "remove max_in_flight"]),
    ("speculative_without_draft_cost", edited("  beta_ms: 0.2\n", SPECULATIVE), (),
     "s.yaml:10:5: device.speculative:", ["draft_cost_ms and draft_cost_fraction", "neither", "set exactly one"]),
    ("speculative_with_both_draft_costs", edited("  beta_ms: 0.2\n", WITH_DRAFTS + "    draft_cost_fraction: 0.1\n"),
     (), "s.yaml:10:5: device.speculative:", ["both given", "set exactly one"]),
    ("speculative_certain_acceptance", edited("  beta_ms: 0.2\n", WITH_DRAFTS.replace("0.5", "1")), (),
     "s.yaml:11:22: device.speculative.acceptance_rate:", ["less than 1", "got 1"]),
    ("speculative_spread_of_nothing", edited("  beta_ms: 0.2\n", WITH_DRAFTS.replace("0.5", "0") +
                                             "    acceptance_rate_concentration: 4\n"), (),
     "s.yaml:10:5: device.speculative:", ["acceptance_rate_concentration with acceptance_rate 0", "remove"]),
    ("rate_with_rate_curve", edited("rate: 2", "rate: 2\n    rate_curve: {kind: sinusoidal, mean: 3}"), (),
     "s.yaml:5:5: workload.arrival:", ["rate (2) with rate_curve", "remove rate"]),
    ("rate_curve_unordered", edited("rate: 2", "rate_curve: {kind: piecewise, points: [[10, 1], [5, 2]]}"), (),
     "s.yaml:5:17: workload.arrival.rate_curve.piecewise:", ["must increase strictly", "sort them"]),
    ("rate_curve_bad_kind", edited("rate: 2", "rate_curve: {kind: weekly, mean: 3}"), (),
     "s.yaml:5:17: workload.arrival.rate_curve:", ["'weekly'", "piecewise"]),
    ("autoscale_min_above_max", GOOD + "cluster:\n  autoscale: {target: 0.7, min_replicas: 4, max_replicas: 2}\n", (),
     "s.yaml:16:14: cluster.autoscale:", ["min_replicas (4) is above max_replicas (2)", "raise max_replicas"]),
    ("autoscale_busy_target_above_one", GOOD + "cluster:\n  autoscale: {target: 70, max_replicas: 4}\n", (),
     "s.yaml:16:14: cluster.autoscale:", ["target 70 for busy_fraction", "0.7"]),
    ("autoscale_replicas_outside", GOOD + "cluster:\n  replicas: 9\n  autoscale: {target: 0.7, max_replicas: 4}\n",
     (), "s.yaml:16:3: cluster:", ["cluster.replicas (9)", "[1, 4]", "set it within them"]),
    ("speculative_static", edited("  beta_ms: 0.2\n", WITH_DRAFTS), ("--set", "batching.mode=static"),
     "s.yaml:1:1: device.speculative with a request-level batching mode", ["use batching.mode: continuous"]),
]


def prepare(tmp_path: Path, text: str | bytes) -> Path:
    scenario = tmp_path / "s.yaml"
    if isinstance(text, bytes):
        scenario.write_bytes(text)
    else:
        scenario.write_text(text, encoding="utf-8")
    (tmp_path / "trace.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.0,10,5\n0.5,many,5\n")
    return scenario


def assert_rejected(result, tmp_path: Path, prefix: str, words: list[str]) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    line = lines[0]
    assert "Traceback" not in result.stderr and "Error" not in line
    where = line.removeprefix(f"{tmp_path}/")  # files are named as given: with their folder
    assert where.startswith(prefix), line
    for word in words:
        assert word in line, (word, line)
    # Nothing was written: the only things in tmp_path are what the test put there.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml", "trace.csv"]


@pytest.mark.parametrize(("text", "args", "prefix", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_run_rejects_bad_input(tmp_path, text, args, prefix, words):
    scenario = prepare(tmp_path, text)
    result = invoke("run", scenario, *args, "--out", tmp_path / "out")
    assert_rejected(result, tmp_path, prefix, words)


@pytest.mark.parametrize("command", ["validate", "compare"])
@pytest.mark.parametrize("case", ["unknown_key", "trace_bad_row", "bad_set_value"])
def test_validate_and_compare_report_alike(tmp_path, command, case):
    _, text, args, prefix, words = next(c for c in CASES if c[0] == case)
    scenario = prepare(tmp_path, text)
    out = ("--out", tmp_path / "out") if command == "compare" else ()
    result = invoke(command, scenario, *args, *out)
    assert_rejected(result, tmp_path, prefix, words)


def test_every_problem_gets_its_own_line(tmp_path):
    text = edited("rate: 2", "rate: -2").replace("block_size: 16", "block_size: 16.5").replace(
        "  num_requests: 10\n", "  num_requests: 10\n  colour: red\n")
    result = invoke("validate", prepare(tmp_path, text))
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 3
    assert all(re.match(r".*s\.yaml:\d+:\d+: [a-z_.]+: ", line) for line in lines)


def test_missing_and_unreadable_scenario_files(tmp_path):
    for path, words in ((tmp_path / "absent.yaml", "file not found"), (tmp_path, "cannot read the file")):
        result = invoke("run", path, "--out", tmp_path / "out")
        assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr
        assert result.stderr.startswith(str(path))
    assert not (tmp_path / "out").exists()


def test_a_shipped_scenario_with_a_bad_override_writes_nothing(tmp_path):
    result = invoke("compare", SCENARIOS / "heavy_tail.yaml", "--set", "batching.max_num_seqs=0",
                    "--out", tmp_path / "out")
    assert result.exit_code == 2 and "--set: batching.max_num_seqs:" in result.stderr
    assert list(tmp_path.iterdir()) == []
