"""Named length shapes: vLLM's random and ShareGPT datasets and the lognormals fitted to public traces."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simbatch.inputs.loading import scenario_from_dict
from simbatch.workload import generate
from simbatch.workload.shapes import SHAPES, sharegpt_pairs

ROOT = Path(__file__).resolve().parent.parent


def lengths(prompt: dict, output: dict, n: int = 20_000):
    wl = generate(scenario_from_dict({"workload": {"num_requests": n, "prompt_tokens": prompt,
                                                   "output_tokens": output}}))
    return wl.prompt_tokens, wl.output_tokens


@pytest.mark.parametrize(("length", "ratio", "low", "high"), [(100, 0.5, 50, 150), (7, 0.3, 4, 10), (1, 0.9, 1, 2),
                                                               (64, 0.0, 64, 64)])
def test_random_is_vllms_uniform_range(length, ratio, low, high):
    prompts, _ = lengths({"dist": "random", "len": length, "range_ratio": ratio}, {"dist": "fixed", "value": 1})
    assert prompts.min() == low and prompts.max() == high  # both ends drawn, nothing outside
    assert np.bincount(prompts - low).min() > 0.5 * len(prompts) / (high - low + 1)


def test_random_range_ratio_must_be_below_one():
    with pytest.raises(Exception, match=r"workload.prompt_tokens.range_ratio: Input should be less than 1 \(got 1.0\)"):
        scenario_from_dict({"workload": {"num_requests": 1, "prompt_tokens": {"dist": "random", "len": 5,
                                                                              "range_ratio": 1.0}}})


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_shape_draws_its_prompt_fit_for_prompts_and_its_output_fit_for_outputs(shape):
    prompts, outputs = lengths({"dist": shape}, {"dist": shape})
    for drawn, fit in ((prompts, SHAPES[shape]["prompt"]), (outputs, SHAPES[shape]["output"])):
        assert drawn.max() <= fit.max
        # log-lengths are normal with the fit's sigma; the cap trims only the far tail
        mu = math.log(fit.mean) - fit.sigma**2 / 2
        assert np.median(np.log(drawn)) == pytest.approx(mu, abs=0.05)


def test_the_fit_script_recovers_a_lognormal(tmp_path):
    spec = importlib.util.spec_from_file_location("fit", ROOT / "scripts" / "fit_length_shapes.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    rng = np.random.default_rng(7)
    for name in fit.TRACES.values():
        n = 5000
        pd.DataFrame({"TIMESTAMP": np.arange(n), "ContextTokens": np.rint(rng.lognormal(6.0, 0.8, n)).clip(1),
                      "GeneratedTokens": np.rint(rng.lognormal(3.0, 1.2, n)).clip(1)}).to_csv(tmp_path / name)
    got = fit.fit(np.rint(rng.lognormal(6.0, 0.8, 50_000)).clip(1))
    assert got["sigma"] == pytest.approx(0.8, abs=0.02)
    assert got["mean"] == pytest.approx(math.exp(6.0 + 0.8**2 / 2), rel=0.02)
    fit.main([str(tmp_path)])  # reads both files without error


def test_sharegpt_is_what_vllm_bench_serve_sends():
    """Real (prompt, output) pairs under vLLM's sampling rule (simbatch/data/README.md): a run draws
    rows without replacement, both lengths of one row, and a whole pass is the file's own means."""
    pairs = sharegpt_pairs()
    assert len(pairs) == 15_822 and pairs[:, 0].min() >= 4 and pairs[:, 1].min() >= 4
    assert pairs[:, 0].max() <= 1024 and (pairs.sum(axis=1) <= 2048).all()  # vLLM's filter
    assert pairs[:, 0].mean() == pytest.approx(221.1, abs=0.05) and pairs[:, 1].mean() == pytest.approx(198.9, abs=0.05)
    prompts, outputs = lengths({"dist": "sharegpt"}, {"dist": "sharegpt"}, n=len(pairs))
    assert sorted(zip(prompts.tolist(), outputs.tolist(), strict=True)) == sorted(map(tuple, pairs.tolist()))
    assert np.corrcoef(np.log(prompts), np.log(outputs))[0, 1] == pytest.approx(-0.449, abs=0.01)
    # 300 prompts, as the H200 sweep sent: within the spread of a 300-row sample of the real means.
    prompts, outputs = lengths({"dist": "sharegpt"}, {"dist": "sharegpt"}, n=300)
    assert abs(prompts.mean() - 221.1) < 3 * 13.8 and abs(outputs.mean() - 198.9) < 3 * 11.9
    # Alone, a part is that column's marginal; a run longer than the file takes a fresh pass.
    alone, _ = lengths({"dist": "sharegpt"}, {"dist": "fixed", "value": 5}, n=2 * len(pairs) + 7)
    assert np.array_equal(np.bincount(alone[:len(pairs)]), np.bincount(pairs[:, 0]))
