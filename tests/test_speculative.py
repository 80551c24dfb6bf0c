"""Speculative decoding, by hand and against its closed form: drafts, acceptance, KV, cost, metrics.

Cases use ``builders.BASE`` (4-token blocks, 64 of them, a 16-token budget, 4 slots, 1 s steps; a
step costs 10 ms + 1 ms per decoding sequence + 0.1 ms per prefill or draft token) with
``device.speculative`` on; the acceptances are forced (:class:`Forced`) so every count is known.
"""

from __future__ import annotations

import numpy as np
import pytest
from builders import Driver, at_once, fixed, make_scenario, req, tokens

from simbatch.config import Speculative
from simbatch.features.speculative import (
    AcceptanceStream,
    SpeculativeDecoding,
    expected_tokens_per_step,
    speedup,
    step_ms,
)
from simbatch.model.cost import LinearCost
from simbatch.simulation import simulate


def spec(k: int = 3, alpha: float = 0.5, **cost) -> dict:
    return {"num_speculative_tokens": k, "acceptance_rate": alpha, **(cost or {"draft_cost_ms": 2.0})}


class Forced:
    """An acceptance source that hands out given counts, and says how many it handed out."""

    def __init__(self, *counts: int):
        self.counts, self.used = list(counts), 0

    def next(self) -> int:
        self.used += 1
        return self.counts[self.used - 1]


@pytest.fixture(params=[False, True], ids=["reference", "lockstep"])
def fast_forward(request) -> bool:
    """The hand-stepped cases run on the model and on its accelerated twin alike."""
    return request.param


@pytest.fixture
def spec_driver(fast_forward):
    def make(**overrides) -> Driver:
        return Driver(make_scenario(**{"device__speculative": spec(), "sim__fast_forward": fast_forward, **overrides}))
    return make


# --------------------------------------------------------------------------- one request by hand
def test_a_decode_verifies_its_drafts_and_emits_the_accepted_ones_plus_one(spec_driver):
    d = spec_driver()
    r = req(0, 6, 8)
    r.acceptance = Forced(1, 5, 0)
    d.add(r)
    d.run()  # the prefill: 6 tokens, the first token, no drafts
    assert (r.num_computed_tokens, r.num_generated, r.blocks) == (6, 1, 2)
    # Token 7 and 3 drafts: 4 tokens of the budget, slots up to token 10 (3 blocks).
    plan, out = d.run()
    assert tokens(plan) == {0: 4} and r.blocks == 3
    assert (plan.decode_seqs, plan.draft_tokens) == (1, 3)
    # The drafter: 3 sequential passes over the one speculating sequence and its 6 cached tokens.
    assert SpeculativeDecoding(d.sched.scenario).step_ms(plan) == pytest.approx(3 * 2.0)
    # One draft accepted: 2 tokens, in one chunk (one gap); the 2 rejected slots roll back, the block stays.
    assert (r.num_computed_tokens, r.num_generated, r.blocks) == (8, 3, 3) and out.itl_tokens == 1
    # All 3 accepted (the draw was 5, capped at the 3 proposed): 4 tokens, no new block (12 slots).
    plan, _ = d.run()
    assert tokens(plan) == {0: 4} and (r.num_computed_tokens, r.num_generated, r.blocks) == (12, 7, 3)
    # One token left to emit: no drafts past it, a plain decode that draws nothing.
    plan, out = d.run()
    assert tokens(plan) == {0: 1} and plan.draft_tokens == 0 and plan.slices == [] and out.finished == [r]
    assert (r.num_generated, r.acceptance.used) == (8, 2)
    assert (r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens) == (2, 6, 4)
    assert d.sched.kv.device.num_free == 64


def test_the_accelerated_scheduler_declines_speculating_decodes():
    """No lockstep group forms and no plan repeats: every step is planned by the model's rules."""
    d = Driver(make_scenario(device__speculative=spec(alpha=0.9), sim__fast_forward=True))
    rs = [req(i, 5, 40) for i in range(3)]
    d.add(*rs)
    while d.sched.running or d.sched.num_waiting:
        plan = d.plan()
        assert not d.sched._group and d.sched.repeatable_steps(plan, d.step) == 1
        d.finish(plan)
    assert sum(r.num_accepted_tokens for r in rs) > 0


def test_drafts_leave_every_later_decode_its_verified_token(spec_driver):
    # Budget 8, three decodes, k = 4: 1 + 4, then 1 + 1 (8 - 5 - 1 for the last), then 1.
    d = spec_driver(batching__max_num_batched_tokens=8, device__speculative=spec(k=4))
    rs = [req(i, 2, 20) for i in range(3)]
    for r in rs:
        r.acceptance = Forced(*[0] * 20)
    d.add(*rs)
    d.run()
    plan, out = d.run()
    assert tokens(plan) == {0: 5, 1: 2, 2: 1}
    assert (plan.draft_tokens, plan.decode_seqs, len(plan.slices)) == (5, 3, 2)  # two decodes speculate
    assert SpeculativeDecoding(d.sched.scenario).step_ms(plan) == pytest.approx(4 * 2.0)  # the most drafts: 4
    assert [r.num_generated for r in rs] == [2, 2, 2] and out.itl_tokens == 3


def test_the_lookahead_takes_blocks_and_preempts_for_them(spec_driver):
    # 5 blocks of 4: two requests of prompt 7 hold 2 blocks each after their prefills; r0's decode of
    # token 8 with 3 drafts needs slots up to 11: a third block (1 free), then r1's with drafts needs a
    # third too: none free, and r1 is the newest, so it cannot preempt: it stalls.
    d = spec_driver(kv_cache__num_blocks=5)
    r0, r1 = req(0, 7, 30), req(1, 7, 30)
    r0.acceptance, r1.acceptance = Forced(*[0] * 30), Forced(*[0] * 30)
    d.add(r0, r1)
    d.run()
    plan, _ = d.run()
    assert tokens(plan) == {0: 4} and (r0.blocks, r1.blocks) == (3, 2) and plan.num_preempted == 0
    # Nothing accepted: r0 at 8 computed keeps its 3 blocks (slots to 12), and r1 stalls again.
    assert (r0.num_computed_tokens, r1.num_computed_tokens) == (8, 7)
    plan, _ = d.run()
    assert tokens(plan) == {0: 4}


def test_a_swapped_speculating_request_returns_with_its_computed_tokens(spec_driver):
    # r1 is preempted by swap when r0's lookahead needs its blocks; it comes back and goes on drafting.
    d = spec_driver(kv_cache__num_blocks=6, kv_cache__swap_blocks=8, scheduler__preemption="swap",
                    device__speculative=spec(k=4))
    r0, r1 = req(0, 8, 12), req(1, 8, 12)
    r0.acceptance, r1.acceptance = Forced(*[4] * 12), Forced(*[4] * 12)
    d.add(r0, r1)
    d.run()  # both prefills: 2 + 2 blocks
    plan, _ = d.run()  # r0: slots to 13 (4 blocks); r1 then needs a 4th too: 0 free, and it is the newest
    assert tokens(plan) == {0: 5}
    plan, _ = d.run()  # r0 at 13 computed: slots to 18 need a 5th block: r1 is swapped out for it
    assert plan.num_preempted == 1 and r1.swapped_blocks == 2 and tokens(plan) == {0: 5}
    while r0.status.name != "FINISHED":
        d.run()
    while r1.status.name != "FINISHED":
        d.run()
    assert r1.num_generated == 12 and r1.num_drafts > 0 and d.sched.kv.host.num_free == 8


# --------------------------------------------------------------------------- cost
def test_the_step_costs_the_drafts_at_gamma_and_the_drafter_per_pass(spec_driver):
    d = spec_driver()
    r = req(0, 6, 8)
    r.acceptance = Forced(0, 0, 0, 0, 0, 0, 0)
    d.add(r)
    d.run()
    plan = d.plan()
    scenario = d.sched.scenario
    cost, drafter = LinearCost.of(scenario.device), SpeculativeDecoding(scenario)
    assert cost.plan_ns(plan, drafter.step_ms(plan)) == 17_300_000  # 10 + 1 + 0.1 x 3 + 3 x 2 ms
    assert cost.plan_ns(plan) == 11_300_000  # the target's verification alone
    by_fraction = make_scenario(device__speculative=spec(draft_cost_fraction=0.5))
    assert cost.plan_ns(plan, SpeculativeDecoding(by_fraction).step_ms(plan)) == 27_800_000  # + 3 x 0.5 x (10 + 1)
    assert step_ms(cost, 1, 3, spec=scenario.device.speculative) == pytest.approx(17.3)
    assert step_ms(cost, 1, 3, spec=by_fraction.device.speculative) == pytest.approx(27.8)
    d.finish(plan)


def test_speedup_helps_at_small_batch_and_hurts_when_compute_bound():
    # A decode token and a draft cost alike (beta = gamma), as the presets have them.
    sc = make_scenario(device__speculative=spec(k=4, alpha=0.8, draft_cost_fraction=0.05), device__beta_ms=0.1)
    cost, s = LinearCost.of(sc.device), sc.device.speculative
    e = expected_tokens_per_step(4, 0.8)
    assert e == pytest.approx(3.3616)
    # E tau(B) / (tau(B) (1 + 4 x 0.05) + 4 gamma B), tau(B) = 10 + 0.1 B: 2.7 at B = 1, 0.69 at 1000.
    for b in (1, 1000):
        assert speedup(cost, s, b) == pytest.approx(e * (10 + 0.1 * b) / ((10 + 0.1 * b) * 1.2 + 0.4 * b))
    assert speedup(cost, s, 1) > 2.7 and speedup(cost, s, 1000) < 0.7


# --------------------------------------------------------------------------- acceptance
def test_acceptance_streams_are_the_requests_own_and_follow_the_geometric_law():
    a, b = AcceptanceStream(7, 3, 0.6), AcceptanceStream(7, 3, 0.6)
    draws = np.array([a.next() for _ in range(20_000)])
    assert draws.tolist() == [b.next() for _ in range(20_000)]
    assert [AcceptanceStream(7, 4, 0.6).next() for _ in range(50)] != draws[:50].tolist()
    for j in (1, 2, 3):  # P(G >= j) = alpha^j, within 4 standard errors
        p = 0.6 ** j
        assert abs((draws >= j).mean() - p) < 4 * np.sqrt(p * (1 - p) / len(draws))
    assert {AcceptanceStream(1, 0, 0.0).next() for _ in range(10)} == {0}


def test_a_run_counts_drafts_as_vllm_and_both_engines_agree():
    sc = at_once(12, {"dist": "uniform", "low": 4, "high": 40}, {"dist": "uniform", "low": 1, "high": 60},
                 device__speculative=spec(k=3, alpha=0.7), kv_cache__num_blocks=30)
    ref = simulate(sc.model_copy(update={"sim": sc.sim.model_copy(update={"fast_forward": False})}),
                   check_invariants=True)
    fast = simulate(sc, check_invariants=True)
    assert ref.requests.equals(fast.requests) and ref.iterations.equals(fast.iterations)
    s, rq = ref.summary, ref.requests
    assert s["num_preemptions"] > 0 and (rq["status"] == "finished").all()
    assert s["spec_decode_draft_tokens"] == rq["num_draft_tokens"].sum() > 0
    # vLLM's keys and units (vllm bench serve --save-result): the rate in percent.
    assert s["spec_decode_acceptance_rate"] == 100 * s["spec_decode_accepted_tokens"] / s["spec_decode_draft_tokens"]
    assert s["spec_decode_acceptance_length"] == 1 + rq["num_accepted_tokens"].sum() / rq["num_drafts"].sum()
    # Without preemptions (no recompute), every output token after the first is a plain decode's or
    # one of a speculating step's A + 1, and a decode step computes its token and its drafts.
    ample = simulate(sc.model_copy(update={"kv_cache": sc.kv_cache.model_copy(update={"num_blocks": 1000})}))
    it, rq = ample.iterations, ample.requests
    assert ample.summary["num_preemptions"] == 0
    assert (it["decode_tokens"] * it["num_steps"]).sum() == rq["output_tokens"].sum() - len(rq) + \
        rq["num_draft_tokens"].sum() - rq["num_accepted_tokens"].sum()
    plain = simulate(at_once(12, 10, 10))
    assert not any(k.startswith("spec_decode") for k in plain.summary)


def test_a_lone_request_streams_chunks_one_step_apart():
    """ITL is the step time (one chunk a step); TPOT is the step time over the tokens per step."""
    sc = make_scenario(workload__num_requests=1, workload__prompt_tokens=fixed(16),
                       workload__output_tokens=fixed(201), device__speculative=spec(k=2, alpha=0.5))
    run = simulate(sc)
    rq, s = run.requests.iloc[0], run.summary
    steps = rq["num_drafts"]  # every decode step but the last ones, capped, had 2 drafts
    assert steps > 0 and rq["num_accepted_tokens"] + steps == 200 - (run.summary["num_steps"] - 1 - steps)
    gaps = run.summary["num_steps"] - 1
    assert s["mean_itl_ms"] * gaps == pytest.approx((rq["e2e_s"] - rq["ttft_s"]) * 1e3)
    assert s["mean_tpot_ms"] == pytest.approx(s["mean_itl_ms"] * gaps / 200)


# --------------------------------------------------------------------------- settings (bad input: tests/test_bad_input.py)
def test_speculative_settings_map_one_to_one():
    s = Speculative(num_speculative_tokens=3, acceptance_rate=0.25, draft_cost_fraction=0.1)
    assert s.model_dump() == {"num_speculative_tokens": 3, "acceptance_rate": 0.25, "acceptance_rate_concentration": None,
                              "draft_cost_ms": None, "draft_cost_fraction": 0.1}


def test_the_stability_check_charges_a_token_the_speculating_step_over_e():
    """Capacity with speculation: B E / tau_spec(B) tokens/s; a saturated run delivers it."""
    from simbatch.analysis.capacity import stability

    sc = at_once(24, 16, 4000, device__beta_ms=0.1, device__speculative=spec(k=4, alpha=0.8),
                 batching__max_num_seqs=8, batching__max_num_batched_tokens=512, kv_cache__num_blocks=10_000)
    cost, e = LinearCost.of(sc.device), expected_tokens_per_step(4, 0.8)
    check = stability(sc.device, 8, 1.0, 4000)
    assert check.capacity_tokens_per_s == pytest.approx(8 * e / step_ms(cost, 8, 4, spec=sc.device.speculative) * 1e3)
    run = simulate(sc)
    it = run.iterations
    full = it[(it["prefill_tokens"] == 0) & (it["batch_size"] == 8)]
    assert full["num_steps"].sum() > 0.9 * run.summary["num_steps"]
    # Nearly every step a full batch of speculating decodes: 8 E tokens per tau_spec(8), less the
    # prefills and the drain.
    assert run.summary["output_throughput"] == pytest.approx(check.capacity_tokens_per_s, rel=0.02)


def test_a_speculative_run_plots_its_speedup(tmp_path):
    from simbatch.app.plots import save_run_plots

    sc = at_once(16, 16, 120, device__speculative=spec(k=3, alpha=0.7), batching__max_num_batched_tokens=256)
    written = {p.name for p in save_run_plots(tmp_path, simulate(sc))}
    assert "speculative_decoding.png" in written and (tmp_path / "speculative_decoding.png").stat().st_size > 0


def test_the_capacity_table_shows_the_speculating_step():
    from simbatch.app.report import capacity_table

    device = make_scenario(device__speculative=spec(k=4, alpha=0.8), device__beta_ms=0.1).device
    row = next(line.split() for line in capacity_table(device, 8).splitlines() if line.split()[:1] == ["8"])
    tau = step_ms(LinearCost.of(device), 8, 4, spec=device.speculative)  # 10 + 0.8 + 0.1 x 32 + 4 x 2 = 22 ms
    assert tau == pytest.approx(22.0) and row[1] == "22.00"
    assert float(row[2].replace(",", "")) == pytest.approx(8 * expected_tokens_per_step(4, 0.8) / tau * 1e3, abs=0.01)


def test_each_request_may_draw_its_own_acceptance_rate():
    """With a concentration, a request's first draw is its alpha, from Beta(c alpha, c (1 - alpha))."""
    from simbatch.features.speculative import tokens_per_step

    alphas = np.array([AcceptanceStream(3, i, 0.6, 5.0).alpha for i in range(4000)])
    assert abs(alphas.mean() - 0.6) < 4 * np.sqrt(0.6 * 0.4 / 6 / len(alphas))
    assert abs(alphas.var() - 0.6 * 0.4 / 6) < 0.1 * 0.6 * 0.4 / 6
    assert AcceptanceStream(3, 7, 0.6, 5.0).alpha == AcceptanceStream(3, 7, 0.6, 5.0).alpha != alphas[0]
    one, spread = Speculative(**spec(k=4, alpha=0.6)), Speculative(**spec(k=4, alpha=0.6), acceptance_rate_concentration=5)
    # The harmonic mean of E(alpha_i) over the Beta, by sampling, against the integral.
    e_i = np.array([expected_tokens_per_step(4, a) for a in alphas])
    assert tokens_per_step(spread) == pytest.approx(1 / (1 / e_i).mean(), rel=0.01)
    assert tokens_per_step(spread) < tokens_per_step(one) == expected_tokens_per_step(4, 0.6)


@pytest.mark.parametrize(("alpha", "concentration", "tokens"), [(1e-71, 1.0, 1.0), (1 - 1e-16, 0.5, 5.0)])
def test_a_spread_squeezed_against_an_end_of_its_range_is_that_end(alpha, concentration, tokens):
    """A Beta parameter too small for a float (c alpha or c (1 - alpha) below 1e-16) is a point mass at
    0 or 1: one token a step, or all k + 1 (found by hypothesis: the quadrature refused it)."""
    from simbatch.features.speculative import tokens_per_step

    spread = Speculative(**spec(k=4, alpha=alpha), acceptance_rate_concentration=concentration)
    assert tokens_per_step(spread) == pytest.approx(tokens, rel=1e-9)


@pytest.mark.parametrize("concentration", [1e-3, 0.01, 1e3, 1e4, 1e6])
@pytest.mark.parametrize("alpha", [1e-9, 0.5, 0.99, 1 - 1e-12])
def test_a_spread_at_any_concentration_gives_a_number_of_tokens_a_step_within_its_range(alpha, concentration):
    """scipy's Gauss-Jacobi weights overflow to infinity above a concentration of ~1,000 (their total
    mass is 2^(c+1) B(...)), and its nodes may fall a hair outside [-1, 1]: the run's tokens a step came
    out NaN (found by hypothesis, as a RuntimeWarning). Normalised weights and clipped nodes keep it
    between 1 and k + 1, and a tight spread at the point mass's value."""
    from simbatch.features.speculative import tokens_per_step

    spread = Speculative(**spec(k=4, alpha=alpha), acceptance_rate_concentration=concentration)
    with np.errstate(all="raise"):
        tokens = tokens_per_step(spread)
    assert 1.0 - 1e-12 <= tokens <= 5.0 + 1e-12
    if concentration >= 1e6:
        assert tokens == pytest.approx(expected_tokens_per_step(4, alpha), rel=1e-5)


def test_a_tight_spread_is_its_monte_carlo_harmonic_mean():
    """At a concentration of 5,000 (where scipy's weights overflow) the quadrature against 4M draws."""
    from simbatch.features.speculative import tokens_per_step

    draws = np.random.default_rng(0).beta(5000 * 0.7, 5000 * 0.3, 4_000_000)
    sample = 1 / (1 / expected_tokens_per_step(4, draws)).mean()
    spread = Speculative(**spec(k=4, alpha=0.7), acceptance_rate_concentration=5000)
    assert tokens_per_step(spread) == pytest.approx(sample, rel=2e-5)  # the sample's error: ~5e-6


def test_a_rate_whose_spread_underflows_is_the_point_mass_at_its_end():
    """c alpha below the smallest float (found by hypothesis: alpha = 5e-324, c = 0.5): numpy's Beta
    refuses a zero parameter; the request's rate is then 0, and it never accepts a draft."""
    stream = AcceptanceStream(0, 0, 5e-324, 0.5)
    assert stream.alpha == 0.0 and {stream.next() for _ in range(50)} == {0}
