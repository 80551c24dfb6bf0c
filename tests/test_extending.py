"""docs/extending.md's worked examples, run as the page gives them.

Each section's Python block is one module of one's own; it is executed with the registries restored
afterwards (``Registry.restoring``), its YAML block is simulated, what the section claims is checked
on the frames, and the reference-against-accelerated property (tests/test_fast_forward.py) runs with
the new entry drawn: the strategies read the registries when they draw, so no test names it.
"""

from __future__ import annotations

import re
import types
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from test_fast_forward import assert_same_run, examples, scenarios

from simbatch import simulate
from simbatch.config import Scenario
from simbatch.registry import FEATURES, MODES, POLICIES, ROUTERS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
BLOCK = re.compile(r"^```(python|yaml)\n(.*?)^```", re.S | re.M)


def sections() -> dict[str, dict[str, str]]:
    """Heading -> {"python": code, "yaml": scenario} of every section of the page with code."""
    out = {}
    for part in re.split(r"^## ", PAGE.read_text(encoding="utf-8"), flags=re.M)[1:]:
        heading = part.splitlines()[0]
        blocks = {kind: text for kind, text in BLOCK.findall(part)}
        if blocks:
            out[heading.split(":")[0]] = blocks
    return out


SECTIONS = sections()


@pytest.fixture
def example(request):
    """The section's module, executed with every registry restored afterwards; its scenario, as a dict."""
    blocks = SECTIONS[request.param]
    with ExitStack() as stack:
        for registry in (POLICIES, MODES, ROUTERS, FEATURES):
            stack.enter_context(registry.restoring())
        module = types.ModuleType(f"extending_{len(blocks['python'])}")
        exec(compile(blocks["python"], str(PAGE), "exec"), module.__dict__)  # noqa: S102  (the page's own code)
        yield module, yaml.safe_load(blocks["yaml"])


def test_the_page_has_three_worked_examples():
    assert set(SECTIONS) == {"A queue policy", "A batching mode", "A serving feature"}


def drawing(predicate, n: int):
    """Run the equivalence property on ``n`` drawn scenarios that ``predicate`` accepts."""

    @settings(max_examples=examples(n), deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(scenarios().filter(predicate))
    def prop(scenario):
        assert_same_run(scenario)

    prop()


@pytest.mark.parametrize("example", ["A queue policy"], indirect=True)
def test_a_policy_of_ones_own(example):
    _, scenario = example
    result = simulate(Scenario.model_validate(scenario))
    done = result.requests.sort_values("first_scheduled_s", kind="stable")
    # One slot, every request there at t = 0: served by priority, then by prompt length, then arrival.
    order = list(done.itertuples())
    keys = [(r.priority, r.prompt_tokens, r.request_id) for r in order]
    assert keys == sorted(keys) and len(set(done["priority"])) == 2
    assert_same_run(scenario)
    drawing(lambda s: s["scheduler"]["policy"] == "priority_sjf", 15)


@pytest.mark.parametrize("example", ["A batching mode"], indirect=True)
def test_a_batching_mode_of_ones_own(example):
    module, scenario = example
    result = simulate(Scenario.model_validate(scenario))
    rq = result.requests
    assert (rq["status"] == "finished").all()
    # Members of one batch are admitted together: each batch's prompts share a bucket.
    batches = rq.groupby("first_scheduled_s")["prompt_tokens"].agg(lambda p: {module.bucket(n) for n in p})
    assert (batches.map(len) == 1).all() and len(batches) > 1
    assert sum(len(g) > 1 for _, g in rq.groupby("first_scheduled_s")) > 0  # some batches hold several
    assert_same_run(scenario)
    drawing(lambda s: s["batching"]["mode"] == "bucketed", 15)


@pytest.mark.parametrize("example", ["A serving feature"], indirect=True)
def test_a_serving_feature_of_ones_own(example):
    _, scenario = example
    with_mask = simulate(Scenario.model_validate(scenario)).iterations
    without = simulate(Scenario.model_validate({**scenario, "features": {}})).iterations
    # Everything arrives at t = 0 with room for all: the same steps, each longer by 0.5 ms a decode
    # (a row is a run of identical steps, its decode tokens summed).
    assert len(with_mask) == len(without) and (with_mask["num_steps"] == without["num_steps"]).all()
    np.testing.assert_allclose(with_mask["duration_s"] - without["duration_s"],
                               0.5e-3 * with_mask["decode_tokens"], atol=1e-9)
    assert with_mask["decode_tokens"].sum() > 0
    assert_same_run(scenario)
    drawing(lambda s: "structured_output" in s["features"], 15)


def test_a_feature_needs_an_iteration_level_mode_and_its_own_options(example=None):
    with ExitStack() as stack:
        for registry in (POLICIES, MODES, ROUTERS, FEATURES):
            stack.enter_context(registry.restoring())
        module = types.ModuleType("extending_feature")
        exec(compile(SECTIONS["A serving feature"]["python"], str(PAGE), "exec"), module.__dict__)  # noqa: S102
        base = {"workload": {"num_requests": 5}}
        with pytest.raises(ValueError, match="request-level batching mode"):
            Scenario.model_validate({**base, "batching": {"mode": "static"}, "features": {"structured_output": {}}})
        with pytest.raises(ValueError, match=r"features\.structured_output\.mask_ms_per_seq"):
            Scenario.model_validate({**base, "features": {"structured_output": {"mask_ms_per_seq": -1}}})
    with pytest.raises(ValueError, match="no serving feature is called 'structured_output'"):
        Scenario.model_validate({**base, "features": {"structured_output": {}}})
