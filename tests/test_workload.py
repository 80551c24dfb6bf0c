"""The workload: length distributions, arrival processes, trace replay, and the stream discipline
that gives every batching mode the same requests.

Statistical checks use fixed seeds, so they are deterministic, but each tolerance is derived from
the sampling error (about 5 standard errors) rather than tuned to the seed: a correct sampler passes
for any seed, and a broken mechanism (wrong parameterization, an off-by-one bound) misses by far more.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

from simbatch.config import Arrival, Scenario
from simbatch.inputs.loading import ScenarioError, scenario_from_dict
from simbatch.model import streams
from simbatch.model.clock import snap_s
from simbatch.workload import WorkloadArrays, generate
from simbatch.workload.arrivals import arrival_times
from simbatch.workload.lengths import sample_lengths
from simbatch.workload.trace import SAMPLE_TRACE, load_trace

REPO = Path(__file__).resolve().parent.parent
N = 200_000  # draws per statistical check: tight tolerances, still milliseconds


def scenario(tmp_path: Path | None = None, **workload) -> Scenario:
    """A validated scenario with this workload section; relative paths resolve against tmp_path."""
    return scenario_from_dict({"workload": {"num_requests": 1, **workload}}, base_dir=tmp_path)


def lengths(spec: dict, n: int = N, seed: int = 0, tmp_path: Path | None = None) -> np.ndarray:
    sc = scenario(tmp_path, prompt_tokens=spec)
    return sample_lengths(sc.workload.prompt_tokens, n, np.random.default_rng(seed), sc,
                          where="workload.prompt_tokens")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def raises_at(call, line: int | None, *fragments: str) -> ScenarioError:
    """Assert ``call()`` raises a one-problem ScenarioError at ``line`` whose message has ``fragments``."""
    with pytest.raises(ScenarioError) as info:
        call()
    (problem,) = info.value.problems
    assert problem.line == line, str(problem)
    for fragment in fragments:
        assert fragment in str(problem), str(problem)
    return info.value


# --------------------------------------------------------------------------- lengths
def test_fixed_is_constant():
    assert np.array_equal(lengths({"dist": "fixed", "value": 37}, n=100), np.full(100, 37))


def test_uniform_hits_both_ends_and_nothing_outside():
    x = lengths({"dist": "uniform", "low": 3, "high": 9})
    assert x.dtype == np.int64
    assert set(np.unique(x)) == set(range(3, 10))
    # Mean (low + high)/2 = 6, sd of a discrete uniform on 7 values = 2; 5 standard errors.
    assert abs(x.mean() - 6) < 5 * 2 / math.sqrt(N)


def test_choice_follows_weights():
    x = lengths({"dist": "choice", "values": [10, 20, 30], "weights": [1, 2, 7]})
    for value, p in [(10, 0.1), (20, 0.2), (30, 0.7)]:
        # A frequency is binomial: standard error sqrt(p(1 - p)/N).
        assert abs((x == value).mean() - p) < 5 * math.sqrt(p * (1 - p) / N)


def test_choice_without_weights_is_even():
    x = lengths({"dist": "choice", "values": [5, 6]})
    assert abs((x == 5).mean() - 0.5) < 5 * math.sqrt(0.25 / N)
    assert set(np.unique(x)) == {5, 6}


def test_exponential_mean_is_that_of_its_ceiling():
    mean = 50.0
    x = lengths({"dist": "exponential", "mean": mean})
    # ceil(Exp) is geometric with q = exp(-1/mean): its mean is 1/(1 - q) (about mean + 0.5) and its
    # sd is about `mean`, so the sample mean's standard error is mean/sqrt(N).
    expected = 1 / (1 - math.exp(-1 / mean))
    assert abs(x.mean() - expected) < 5 * mean / math.sqrt(N)
    assert x.min() >= 1


def test_exponential_cap_is_respected_and_reached():
    x = lengths({"dist": "exponential", "mean": 100.0, "max": 150})
    assert x.min() >= 1 and x.max() == 150
    # P(Exp(100) > 150) = exp(-1.5) = 0.223 of the mass piles up exactly at the cap.
    p = math.exp(-1.5)
    assert abs((x == 150).mean() - p) < 5 * math.sqrt(p * (1 - p) / N)


def test_lognormal_mean_is_the_length_mean_not_the_log_mean():
    mean, sigma = 400.0, 0.8
    x = lengths({"dist": "lognormal", "mean": mean, "sigma": sigma})
    # Derivation of the tolerance: a lognormal with mean m and log-sd s has variance
    # (exp(s^2) - 1) m^2, so the sample mean of N draws has standard error
    #   se = m sqrt(exp(s^2) - 1) / sqrt(N)          (= 0.94 * 400 / 447 = 0.84 tokens here).
    # Rounding to the nearest integer adds at most 0.5 to |bias| (and about 0 on average), and
    # clipping at 1 moves essentially no mass at this mean. So |mean - m| < 5 se + 0.5.
    # Taking `mean` as the log-mean instead would be off by a factor exp(s^2/2) = 1.38: 150 tokens.
    se = mean * math.sqrt(math.exp(sigma**2) - 1) / math.sqrt(N)
    assert abs(x.mean() - mean) < 5 * se + 0.5
    # The sd of log-length is sigma (rounding barely matters at lengths in the hundreds).
    assert abs(np.log(x).std() - sigma) < 0.01


def test_lognormal_cap_is_respected():
    x = lengths({"dist": "lognormal", "mean": 500.0, "sigma": 1.5, "max": 1000})
    assert x.min() >= 1 and x.max() == 1000


def test_zipf_stays_in_bounds_and_hits_both():
    x = lengths({"dist": "zipf", "a": 1.5, "min": 5, "max": 8})
    assert set(np.unique(x)) == {5, 6, 7, 8}


def test_zipf_frequencies_follow_the_power_law():
    a, top = 2.0, 10
    x = lengths({"dist": "zipf", "a": a, "max": top})
    support = np.arange(1, top + 1)
    p = support**-a / (support**-a).sum()
    freq = np.bincount(x, minlength=top + 1)[1:] / N
    assert x.min() == 1 and x.max() == top
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / N))
    # With a = 2 even the closest neighbours (9 and 10) differ by over 5 standard errors.
    assert np.all(np.diff(freq) < 0)


def test_empirical_resamples_the_column(tmp_path):
    write(tmp_path / "lens.csv", "id,tokens\n1,10\n2,20\n\n3,70\n")
    x = lengths({"dist": "empirical", "path": "lens.csv", "column": "tokens"}, tmp_path=tmp_path)
    assert set(np.unique(x)) == {10, 20, 70}
    # Each observed value is drawn with probability 1/3.
    assert abs((x == 70).mean() - 1 / 3) < 5 * math.sqrt(2 / 9 / N)


def test_empirical_clips_at_max(tmp_path):
    write(tmp_path / "lens.csv", "tokens\n10\n20\n70\n")
    x = lengths({"dist": "empirical", "path": "lens.csv", "column": "tokens", "max": 25}, tmp_path=tmp_path)
    assert set(np.unique(x)) == {10, 20, 25}


PAIRS = "prompt,output\n10,1\n20,2\n\n70,7\n30,3\n"  # every row's output is a tenth of its prompt


def paired_workload(tmp_path: Path, output_path: str = "pairs.csv", **extra) -> WorkloadArrays:
    write(tmp_path / "pairs.csv", PAIRS)
    write(tmp_path / "copy.csv", PAIRS)
    return generate(scenario(tmp_path, num_requests=2000, **{
        "prompt_tokens": {"dist": "empirical", "path": "pairs.csv", "column": "prompt"},
        "output_tokens": {"dist": "empirical", "path": output_path, "column": "output"}, **extra}))


def test_prompt_and_output_from_one_file_are_resampled_as_pairs(tmp_path):
    w = paired_workload(tmp_path)
    assert np.array_equal(w.output_tokens * 10, w.prompt_tokens)
    assert set(np.unique(w.prompt_tokens)) == {10, 20, 30, 70}
    # The prompts are drawn as they were without pairing; only the outputs follow them.
    assert np.array_equal(paired_workload(tmp_path, "copy.csv").prompt_tokens, w.prompt_tokens)


def test_pairs_hold_per_class_and_files_apart_are_drawn_apart(tmp_path):
    classes = [{"name": "a"}, {"name": "b", "output_tokens": {"dist": "empirical", "path": "copy.csv",
                                                               "column": "output"}}]
    w = paired_workload(tmp_path, classes=classes)
    a = w.tenant == 0
    assert a.any() and (~a).any()
    assert np.array_equal(w.output_tokens[a] * 10, w.prompt_tokens[a])
    # Two files are two independent resamplings: about a quarter of the pairs match by chance.
    assert 0.15 < np.mean(w.output_tokens[~a] * 10 == w.prompt_tokens[~a]) < 0.35


@pytest.mark.parametrize(
    ("text", "line", "fragments"),
    [
        ("id,n\n1,10\n", 1, ["column 'tokens' not found", "'id', 'n'", "workload.prompt_tokens.column"]),
        ("id,tokens\n1,10\n2,12.5\n", 3, ["'12.5'", "whole number", "workload.prompt_tokens.path"]),
        ("id,tokens\n1,10\n\n2,0\n3,-4\n", 4, ["'0'", ">= 1", "and 1 more row like it"]),
        ("id,tokens\n1,\n", 2, ["''"]),
        ("id,tokens\n", 1, ["no data rows"]),
        ("", None, ["empty"]),
    ],
)
def test_empirical_bad_data_names_the_line(tmp_path, text, line, fragments):
    path = write(tmp_path / "lens.csv", text)
    error = raises_at(lambda: lengths({"dist": "empirical", "path": "lens.csv", "column": "tokens"},
                                      tmp_path=tmp_path), line, *fragments)
    assert error.problems[0].source == str(path)


# --------------------------------------------------------------------------- arrivals
def gaps_of(times: np.ndarray) -> np.ndarray:
    return np.diff(times, prepend=0.0)


def cv(x: np.ndarray) -> float:
    return float(x.std() / x.mean())


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    gaps = gaps_of(arrival_times(Arrival(process="poisson", rate=5.0), np.random.default_rng(0), N, None))
    # Exponential gaps: sd = mean = 0.2, so the mean's standard error is 0.2/sqrt(N). The sample CV's
    # standard error is about sqrt((kurtosis - 1)/(4N)) = sqrt(2/N) = 0.003; 0.02 is generous and still
    # far from any other process (constant: 0, gamma with shape 4: 0.5).
    assert abs(gaps.mean() - 0.2) < 5 * 0.2 / math.sqrt(N)
    assert abs(cv(gaps) - 1) < 0.02
    assert gaps.min() > 0  # the first request arrives one gap after t = 0


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_gaps_have_cv_one_over_sqrt_burstiness(burstiness):
    arrival = Arrival(process="gamma", rate=2.0, burstiness=burstiness)
    gaps = gaps_of(arrival_times(arrival, np.random.default_rng(1), N, None))
    expected_cv = 1 / math.sqrt(burstiness)
    assert abs(gaps.mean() - 0.5) < 5 * 0.5 * expected_cv / math.sqrt(N)
    # Relative standard error of the sample CV is at most sqrt((kurtosis - 1)/(4N)) with kurtosis
    # 3 + 6/shape: 0.006 at shape 0.25; 3% leaves room and still separates 0.5, 1 and 2.
    assert abs(cv(gaps) / expected_cv - 1) < 0.03


def test_constant_arrivals_are_exact_multiples_of_the_gap():
    times = arrival_times(Arrival(process="constant", rate=3.0), np.random.default_rng(0), 1000, None)
    assert np.array_equal(times, np.arange(1, 1001) / 3.0)


def test_infinite_rate_sends_everything_at_zero():
    times = arrival_times(Arrival(rate=math.inf), np.random.default_rng(0), 50, None)
    assert np.array_equal(times, np.zeros(50))


def test_num_requests_is_exact_and_times_nondecreasing():
    times = arrival_times(Arrival(process="gamma", rate=10.0, burstiness=0.3), np.random.default_rng(0),
                          12_345, None)
    assert len(times) == 12_345 and times.dtype == np.float64
    assert np.all(np.diff(times) >= 0)


@pytest.mark.parametrize("process", ["poisson", "gamma", "constant"])
def test_duration_keeps_exactly_the_arrivals_before_it(process):
    # For gamma, burstiness 0.02 makes gaps so lumpy that the first chunk of gaps often falls short of
    # the horizon (3 of these 10 seeds), so the chunk-growing loop is exercised too.
    arrival = Arrival(process=process, rate=1.0, burstiness=0.02)
    for seed in range(10):
        by_count = arrival_times(arrival, np.random.default_rng(seed), 100_000, None)
        by_time = arrival_times(arrival, np.random.default_rng(seed), None, 1000.0)
        # Same seed, same traffic: the duration only decides where it stops.
        assert np.array_equal(by_time, by_count[by_count < 1000.0])
        assert by_count[len(by_time)] >= 1000.0


def test_num_requests_and_duration_together_truncate_by_both():
    arrival = Arrival(rate=10.0)
    times = arrival_times(arrival, np.random.default_rng(3), 500, 20.0)
    assert len(times) < 500 and times.max() < 20.0
    assert np.array_equal(times, arrival_times(arrival, np.random.default_rng(3), 500, None)[: len(times)])
    assert len(arrival_times(arrival, np.random.default_rng(3), 50, 20.0)) == 50


# --------------------------------------------------------------------------- generate
BASE = {
    "num_requests": 2000,
    "arrival": {"process": "gamma", "rate": 4.0, "burstiness": 0.5},
    "prompt_tokens": {"dist": "lognormal", "mean": 800.0, "sigma": 1.0},
    "output_tokens": {"dist": "exponential", "mean": 150.0, "max": 1000},
}
TWO_CLASSES = [
    {"name": "chat", "share": 3.0, "priority": 0},
    {"name": "batch", "share": 1.0, "priority": 5, "output_tokens": {"dist": "fixed", "value": 7}},
]


def arrays_equal(a: WorkloadArrays, b: WorkloadArrays) -> bool:
    return a.tenant_names == b.tenant_names and all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in ("arrival_s", "prompt_tokens", "output_tokens", "tenant", "priority"))


def test_generate_shapes_and_types():
    w = generate(Scenario.model_validate({"workload": BASE}))
    assert len(w) == 2000
    assert w.arrival_s.dtype == np.float64 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.dtype == np.int64 and w.prompt_tokens.min() >= 1
    assert w.output_tokens.dtype == np.int64 and w.output_tokens.min() >= 1 and w.output_tokens.max() <= 1000
    assert w.tenant.dtype == np.int32 and w.priority.dtype == np.int64
    assert w.tenant_names == ("default",) and not w.tenant.any() and not w.priority.any()


def test_generated_arrays_are_read_only():
    w = generate(Scenario.model_validate({"workload": BASE}))
    with pytest.raises(ValueError, match="read-only"):
        w.prompt_tokens[0] = 1


def test_same_seed_same_workload_different_seed_different():
    a = generate(Scenario.model_validate({"seed": 7, "workload": BASE}))
    b = generate(Scenario.model_validate({"seed": 7, "workload": BASE}))
    c = generate(Scenario.model_validate({"seed": 8, "workload": BASE}))
    assert arrays_equal(a, b)
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    assert not np.array_equal(a.output_tokens, c.output_tokens)


def test_mode_device_and_policy_do_not_change_the_workload():
    # Common random numbers: the comparison between modes is only fair if the requests are identical.
    workload = {**BASE, "classes": TWO_CLASSES}
    reference = generate(Scenario.model_validate({"workload": workload}))
    for other in ({"batching": {"mode": "static"}}, {"batching": {"mode": "dynamic", "max_num_seqs": 8}},
                  {"device": {"tau0_ms": 5.0, "beta_ms": 1.0}}, {"scheduler": {"policy": "sjf"}},
                  {"cluster": {"replicas": 4}}):
        assert arrays_equal(reference, generate(Scenario.model_validate({"workload": workload, **other})))


def test_adding_a_class_leaves_arrivals_alone_and_each_class_its_own_lengths():
    one = generate(Scenario.model_validate({"workload": {**BASE, "classes": TWO_CLASSES[:1]}}))
    two = generate(Scenario.model_validate({"workload": {**BASE, "classes": TWO_CLASSES}}))
    assert np.array_equal(one.arrival_s, two.arrival_s)
    # Request j of class "chat" gets draw j of chat's own streams, whatever the other classes are.
    chat = two.tenant == 0
    assert np.array_equal(one.prompt_tokens[chat], two.prompt_tokens[chat])
    assert np.array_equal(one.output_tokens[chat], two.output_tokens[chat])


def test_classes_assign_tenant_priority_share_and_length_overrides():
    w = generate(Scenario.model_validate({"workload": {**BASE, "num_requests": 20_000,
                                                       "classes": TWO_CLASSES}}))
    assert w.tenant_names == ("chat", "batch")
    batch = w.tenant == 1
    assert abs(batch.mean() - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 20_000)
    assert np.all(w.priority[batch] == 5) and np.all(w.priority[~batch] == 0)
    assert np.all(w.output_tokens[batch] == 7)  # the class's own distribution
    assert w.output_tokens[~batch].mean() > 100  # the workload's exponential, mean ~150


def test_classes_sharing_a_name_are_one_tenant():
    classes = [{"name": "acme", "priority": 0}, {"name": "other"}, {"name": "acme", "priority": 9}]
    w = generate(Scenario.model_validate({"workload": {**BASE, "classes": classes}}))
    assert w.tenant_names == ("acme", "other")
    assert set(np.unique(w.priority[w.tenant == 0])) == {0, 9}


def test_duration_only_workload():
    w = generate(Scenario.model_validate({"workload": {**BASE, "num_requests": None, "duration_s": 100.0}}))
    assert len(w) > 0 and w.arrival_s.max() < 100.0
    assert abs(len(w) - 400) < 5 * 2 * math.sqrt(400)  # gamma shape 0.5: count variance ~ 2x Poisson's


def test_generate_uses_the_documented_streams():
    # Other modules (and saved results) rely on which stream feeds what; pin it.
    sc = Scenario.model_validate({"seed": 3, "workload": BASE})
    w = generate(sc)
    expected = arrival_times(sc.workload.arrival, streams.rng(3, streams.ARRIVALS), 2000, None)
    assert np.array_equal(w.arrival_s, snap_s(expected))  # on the clock's nanosecond grid
    assert np.abs(w.arrival_s - expected).max() <= 0.5e-9
    prompts = sample_lengths(sc.workload.prompt_tokens, 2000, streams.rng(3, streams.PROMPT_TOKENS, 0), sc)
    assert np.array_equal(w.prompt_tokens, prompts)


# --------------------------------------------------------------------------- traces
AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000000,879,12
2023-11-16 18:16:01.0000000,1000,1
"""


def trace_scenario(tmp_path: Path, text: str, **trace) -> Scenario:
    write(tmp_path / "trace.csv", text)
    return scenario(tmp_path, num_requests=None, trace={"path": "trace.csv", **trace})


def replay(sc: Scenario, num_requests: int | None = None, duration_s: float | None = None):
    """(arrival_s, prompt_tokens, output_tokens) of the trace."""
    return load_trace(sc.workload.trace, sc, num_requests, duration_s)[:3]


def test_trace_parses_azure_datetimes(tmp_path):
    arrival_s, prompt, output = replay(trace_scenario(tmp_path, AZURE))
    np.testing.assert_allclose(arrival_s, [0.0, 4.314579, 4.51941, 14.31941], atol=1e-6)
    assert np.array_equal(prompt, [374, 396, 879, 1000]) and np.array_equal(output, [44, 109, 12, 1])
    assert prompt.dtype == np.int64 and output.dtype == np.int64


def test_trace_numeric_seconds_and_custom_columns(tmp_path):
    sc = trace_scenario(tmp_path, "t,in,out\n100.5,10,1\n101.0,20,2\n103.5,30,3\n",
                        timestamp_column="t", prompt_column="in", output_column="out")
    arrival_s, prompt, output = replay(sc)
    assert np.array_equal(arrival_s, [0.0, 0.5, 3.0])
    assert np.array_equal(prompt, [10, 20, 30]) and np.array_equal(output, [1, 2, 3])


def test_trace_time_scale_stretches_gaps(tmp_path):
    base, _, _ = replay(trace_scenario(tmp_path, AZURE))
    slow, _, _ = replay(trace_scenario(tmp_path, AZURE, time_scale=2.0))
    np.testing.assert_allclose(slow, 2 * base)  # time_scale 2: gaps double, the rate halves


def test_trace_truncation_by_count_and_duration(tmp_path):
    sc = trace_scenario(tmp_path, AZURE)
    arrival_s, prompt, _ = replay(sc, num_requests=2)
    assert np.array_equal(prompt, [374, 396]) and len(arrival_s) == 2
    arrival_s, prompt, _ = replay(sc, duration_s=10.0)
    assert np.array_equal(prompt, [374, 396, 879]) and arrival_s.max() < 10.0


def test_trace_out_of_order_rows_are_sorted_stably(tmp_path):
    arrival_s, prompt, _ = replay(trace_scenario(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                           "5,50,1\n2,20,1\n5,51,1\n1,10,1\n"))
    assert np.array_equal(arrival_s, [0.0, 1.0, 4.0, 4.0])
    assert np.array_equal(prompt, [10, 20, 50, 51])


@pytest.mark.parametrize(
    ("text", "line", "fragments"),
    [
        (AZURE.replace("396,109", "396,0"), 3, ["'GeneratedTokens'", "'0'", "workload.trace"]),
        (AZURE.replace("879,12", "87.9,12"), 4, ["'ContextTokens'", "'87.9'", "whole number"]),
        (AZURE.replace("2023-11-16 18:15:51.2000000", "yesterday"), 4, ["'TIMESTAMP'", "'yesterday'", "date-time"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,1\n\n2,x,1\n", 4, ["'x'"]),  # blank line counted
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1,10,1\nsoon,10,1\n3,10,1\n", 3, ["'soon'", "seconds"]),
        ("TIMESTAMP,Prompt,GeneratedTokens\n1,10,1\n", 1, ["'ContextTokens' not found",
                                                           "workload.trace.prompt_column"]),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", 1, ["no data rows"]),
        ("", None, ["empty"]),
    ],
)
def test_trace_bad_rows_name_the_line(tmp_path, text, line, fragments):
    sc = trace_scenario(tmp_path, text)
    error = raises_at(lambda: replay(sc), line, *fragments)
    assert error.problems[0].source == str(tmp_path / "trace.csv")


def test_generate_with_a_trace_takes_times_and_lengths_from_it(tmp_path):
    write(tmp_path / "trace.csv", AZURE)
    sc = scenario(tmp_path, num_requests=3, trace={"path": "trace.csv"},
                  classes=[{"name": "a", "priority": 1}, {"name": "b", "priority": 2}])
    w = generate(sc)
    assert len(w) == 3 and np.array_equal(w.prompt_tokens, [374, 396, 879])
    assert np.array_equal(w.output_tokens, [44, 109, 12])
    assert np.array_equal(w.priority, w.tenant + 1)


def test_trace_priority_and_tenant_columns_ride_with_their_rows(tmp_path):
    write(tmp_path / "trace.csv", "t,in,out,prio,who\n5,50,1,2,bob\n1,10,1,0,alice\n3,30,1,-1, carol \n")
    sc = scenario(tmp_path, num_requests=None, trace={"path": "trace.csv", "timestamp_column": "t",
                                                      "prompt_column": "in", "output_column": "out",
                                                      "priority_column": "prio", "tenant_column": "who"})
    w = generate(sc)
    assert np.array_equal(w.prompt_tokens, [10, 30, 50])  # sorted by time, columns with their rows
    assert np.array_equal(w.priority, [0, -1, 2])
    assert w.tenant_names == ("alice", "carol", "bob") and np.array_equal(w.tenant, [0, 1, 2])


def test_trace_tenant_column_and_classes_cannot_both_assign_tenants(tmp_path):
    write(tmp_path / "trace.csv", "t,in,out,who\n1,10,1,a\n")
    with pytest.raises(ScenarioError, match="classes would be ignored"):
        scenario(tmp_path, num_requests=None, classes=[{"name": "x"}],
                 trace={"path": "trace.csv", "timestamp_column": "t", "prompt_column": "in",
                        "output_column": "out", "tenant_column": "who"})


def test_trace_bad_priority_names_the_row(tmp_path):
    write(tmp_path / "trace.csv", "t,in,out,prio\n1,10,1,0\n2,10,1,high\n")
    sc = scenario(tmp_path, num_requests=None, trace={"path": "trace.csv", "timestamp_column": "t",
                                                      "prompt_column": "in", "output_column": "out",
                                                      "priority_column": "prio"})
    raises_at(lambda: generate(sc), 3, "'prio'", "'high'", "priority")


def test_trace_keeps_its_own_time_origin_when_asked(tmp_path):
    text = "t,in,out\n100.5,10,1\n101.0,20,2\n"
    kept = trace_scenario(tmp_path, text, timestamp_column="t", prompt_column="in", output_column="out",
                          keep_time_origin=True, time_scale=2.0)
    assert np.array_equal(replay(kept)[0], [201.0, 202.0])
    # Date-times: seconds since midnight UTC of the first row's day (18:15:46.68 here).
    arrival_s, _, _ = replay(trace_scenario(tmp_path, AZURE, keep_time_origin=True))
    np.testing.assert_allclose(arrival_s[:2], [65746.68059, 65750.99517], atol=1e-6)
    negative = trace_scenario(tmp_path, "t,in,out\n-1,10,1\n", timestamp_column="t", prompt_column="in",
                              output_column="out", keep_time_origin=True)
    raises_at(lambda: replay(negative), 2, "negative time", "keep_time_origin")


def test_shipped_sample_trace_loads():
    w = generate(Scenario.model_validate({"workload": {"num_requests": None,
                                                       "trace": {"path": str(SAMPLE_TRACE)}}}))
    assert len(w) == 400 and w.arrival_s[0] == 0.0
    assert 2.5 < len(w) / w.arrival_s[-1] < 4.5  # about 3.3 requests/s
    assert 700 < w.prompt_tokens.mean() < 1400 and w.output_tokens.max() <= 1000


def test_shipped_sample_trace_is_what_its_script_makes():
    spec = importlib.util.spec_from_file_location("make_sample_trace", REPO / "scripts" / "make_sample_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert SAMPLE_TRACE.read_text(encoding="utf-8") == module.sample_trace_csv()
