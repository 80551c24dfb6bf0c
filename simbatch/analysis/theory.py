"""Exact results the simulator can be held against: queueing formulas and order statistics.

Pure functions of the scenario's parameters, no simulation. The validation suite
(``tests/validation``) compares each with the simulator's replications; notebooks can call them
to put a theoretical curve next to a simulated one.

Lengths are the simulator's *discrete* distributions, not their continuous idealizations: an
``exponential`` length is ``ceil(Exp(mean))``, a geometric variable, so its moments and the
expected maximum of ``n`` of them are computed exactly from its probability mass function.
Times are in seconds unless a name says otherwise.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from simbatch.config import Choice, Device, Exponential, Fixed, LengthDist, Uniform, Zipf
from simbatch.model.cost import step_time_s

# An uncapped exponential length is cut where its survival probability falls below exp(-TAIL_MEANS)
# (~1e-22): what is left out moves no moment by a relative 1e-15.
_TAIL_MEANS = 50


# --------------------------------------------------------------------------- lengths
def length_pmf(dist: LengthDist) -> tuple[np.ndarray, np.ndarray]:
    """(values, probabilities) of a length distribution, values increasing.

    Exact for fixed, uniform, choice, zipf and exponential (``P(L = k) = q^(k-1) (1 - q)`` with
    ``q = exp(-1/mean)``, the cap taking the whole tail; uncapped, the support runs to 50 means, so
    its size grows with the mean). Lognormal and empirical lengths have no closed form here.
    """
    if isinstance(dist, Fixed):
        return np.array([dist.value]), np.array([1.0])
    if isinstance(dist, Uniform):
        values = np.arange(dist.low, dist.high + 1)
        return values, np.full(len(values), 1.0 / len(values))
    if isinstance(dist, Choice):
        weights = np.ones(len(dist.values)) if dist.weights is None else np.asarray(dist.weights, float)
        values, where = np.unique(dist.values, return_inverse=True)
        return values, np.bincount(where, weights=weights) / weights.sum()
    if isinstance(dist, Zipf):
        values = np.arange(dist.min, dist.max + 1)
        mass = values.astype(float) ** -dist.a
        return values, mass / mass.sum()
    if isinstance(dist, Exponential):
        last = dist.max if dist.max is not None else math.ceil(_TAIL_MEANS * dist.mean) + 1
        values = np.arange(1, last + 1)
        q = math.exp(-1.0 / dist.mean)
        survival = q ** (values - 1.0)  # P(L >= k)
        probs = survival - np.append(survival[1:], 0.0)
        return values, probs
    raise ValueError(f"no exact distribution for {dist.dist!r} lengths; use fixed, uniform, choice, "
                     "zipf or exponential")


def length_moments(dist: LengthDist) -> tuple[float, float]:
    """(E[L], E[L^2]) of a length distribution, exactly."""
    values, probs = length_pmf(dist)
    values = values.astype(float)
    return float(probs @ values), float(probs @ values**2)


def expected_max_length(dist: LengthDist, n: int) -> float:
    """E[max of ``n`` i.i.d. lengths] = sum_v v (F(v)^n - F(v-)^n), exactly.

    For continuous exponential lengths this would be ``H_n * mean``
    (:func:`expected_max_exponential`); the ceiling adds a little under one token.
    """
    values, probs = length_pmf(dist)
    cdf_n = np.minimum(np.cumsum(probs), 1.0) ** n
    return float(values.astype(float) @ np.diff(cdf_n, prepend=0.0))


def harmonic_number(n: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n."""
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def expected_max_exponential(n: int, mean: float) -> float:
    """E[max of ``n`` i.i.d. Exp(mean)] = H_n * mean: the max is a sum of independent exponential
    gaps with means mean/n, mean/(n-1), ..., mean (Renyi's representation of order statistics)."""
    return harmonic_number(n) * mean


# --------------------------------------------------------------------------- one sequence at a time
def single_sequence_service_moments_s(device: Device, prompt: LengthDist,
                                      output: LengthDist) -> tuple[float, float]:
    """(E[S], E[S^2]) of a request served alone (``max_num_seqs: 1``), prompt and output independent.

    S = (tau0 + gamma P) + (O - 1)(tau0 + beta): one prefill step that also samples the first token,
    then one single-sequence decode step per further token.
    """
    p1, p2 = length_moments(prompt)
    o1, o2 = length_moments(output)
    tau0, gamma = device.tau0_s, device.prefill_s_per_token
    c = step_time_s(device, 1)
    a1, a2 = tau0 + gamma * p1, tau0**2 + 2 * tau0 * gamma * p1 + gamma**2 * p2  # prefill step
    d1, d2 = o1 - 1, o2 - 2 * o1 + 1  # E[O - 1], E[(O - 1)^2]
    return a1 + c * d1, a2 + 2 * a1 * c * d1 + c**2 * d2


def pk_mean_wait_s(arrival_rate: float, service_mean_s: float, service_second_moment_s2: float) -> float:
    """Pollaczek-Khinchine: the M/G/1 FCFS mean wait in queue, Wq = lambda E[S^2] / (2 (1 - rho))."""
    rho = arrival_rate * service_mean_s
    if rho >= 1:
        raise ValueError(f"offered load {rho:.3f} >= 1: the queue has no steady state")
    return arrival_rate * service_second_moment_s2 / (2 * (1 - rho))


# --------------------------------------------------------------------------- saturated batching
def static_saturated_tokens_per_s(device: Device, batch_size: int, prompt_tokens: int,
                                  output: LengthDist) -> float:
    """Output tokens/s of static batching with a queue that never empties, fixed prompts.

    A batch is one prefill step (which samples every first token) and then ``max(L) - 1`` decode
    steps in which every slot, done or not, is computed. By renewal-reward over i.i.d. batches:
    B E[L] / (tau(0, B p) + (E[max of B lengths] - 1) tau(B)).
    """
    cycle_s = step_time_s(device, 0, batch_size * prompt_tokens) + \
        (expected_max_length(output, batch_size) - 1) * step_time_s(device, batch_size)
    return batch_size * length_moments(output)[0] / cycle_s


def continuous_request_cost_s(device: Device, batch_size: int, mean_output_tokens: float,
                              mean_prompt_tokens: float) -> float:
    """Device-seconds per request when continuous batching keeps all ``batch_size`` slots busy.

    Every step holds ``batch_size`` sequences and samples one token for each, so a request's L
    tokens take L/B of the steps' fixed cost; its slot costs beta in its L - 1 decode steps (its
    prefill step charges gamma per prompt token instead). So tau0 E[L]/B + beta (E[L] - 1) + gamma E[P].
    Its inverse is the saturated request rate (``capacity.stability`` charges beta for all L tokens, a
    slightly conservative capacity); E[L] over it the saturated output tokens/s.
    """
    tau0, beta, gamma = device.tau0_s, device.beta_s, device.prefill_s_per_token
    return tau0 * mean_output_tokens / batch_size + beta * (mean_output_tokens - 1) + gamma * mean_prompt_tokens


# --------------------------------------------------------------------------- dynamic batching (Inoue 2021)
def inoue_batch_moments(arrival_rate: float, alpha_s: float, tau0_s: float) -> tuple[float, float]:
    """(E[B], E[B^2]) of the batch size when an idle server takes everything waiting.

    Y. Inoue, Performance Evaluation 147 (2021), arXiv:1912.06322: with Poisson arrivals and batch
    time alpha b + tau0, the next batch holds the A arrivals during this one, or the single next
    arrival if A = 0; A | B = b ~ Poisson(lambda (alpha b + tau0)). The batch sizes are a Markov
    chain; its stationary law, on a support grown until the tail is below 1e-15, gives the moments.
    """
    if arrival_rate * alpha_s >= 1:
        raise ValueError(f"lambda alpha = {arrival_rate * alpha_s:.3f} >= 1: batches grow without bound")
    # Start the support at a few times the mean, E[B] ~ (lambda tau0 + 1) / (1 - lambda alpha).
    size = 64 * math.ceil((arrival_rate * tau0_s + 1) / (1 - arrival_rate * alpha_s) / 8)
    while True:
        b = np.arange(1, size + 1)
        means = arrival_rate * (alpha_s * b + tau0_s)
        move = stats.poisson.pmf(b[None, :], means[:, None])  # move[i, j] = P(A = j + 1 | B = i + 1)
        move[:, 0] += stats.poisson.pmf(0, means)  # no arrival: the next batch is the next single arrival
        move[:, -1] += 1 - move.sum(axis=1)  # the truncated tail, measured below
        # pi (P - I) = 0 has rank size - 1: replace its last equation by sum(pi) = 1.
        system = (move - np.eye(size)).T
        system[-1] = 1.0
        pi = np.linalg.solve(system, np.append(np.zeros(size - 1), 1.0))
        if pi[-1] < 1e-15:
            return float(pi @ b), float(pi @ b.astype(float) ** 2)
        size *= 2


def inoue_mean_latency_s(arrival_rate: float, alpha_s: float, tau0_s: float, mean_batch: float,
                         mean_batch_sq: float) -> float:
    """Mean latency of a job under take-everything dynamic batching with batch time alpha b + tau0.

    E[W] = alpha + tau0 + (1 + 2 lambda alpha)(E[B^2] - E[B]) / (2 lambda E[B])  (Inoue 2021).
    A job waits out the batch in service (lambda E[S^2] / (2 E[B]) per job on average) and then its
    own batch, of size-biased mean alpha E[B^2]/E[B] + tau0; Poisson arrivals during a batch give
    E[B^2] - E[B] = lambda^2 E[S^2].
    """
    lam, a = arrival_rate, alpha_s
    return a + tau0_s + (1 + 2 * lam * a) * (mean_batch_sq - mean_batch) / (2 * lam * mean_batch)


def inoue_latency_bound_s(arrival_rate: float, alpha_s: float, tau0_s: float) -> float:
    """Closed-form upper bound on :func:`inoue_mean_latency_s` (Inoue 2021, Theorem 2): min(phi0, phi1).

    Substituting E[B] = (lambda tau0 + P(A = 0)) / (1 - lambda alpha) and
    E[B^2] - E[B] = lambda^2 E[(alpha B + tau0)^2] makes E[W] decreasing in E[B]; the two lower
    bounds E[B] >= 1 and E[B] >= lambda tau0 / (1 - lambda alpha) give

        phi0 = (alpha + tau0) / (2 (1 - lambda alpha)) (1 + 2 lambda tau0 + (1 - lambda tau0) / (1 + lambda alpha))
        phi1 = 3 tau0 / (2 (1 - lambda alpha)) + alpha (2 + lambda alpha) / (2 (1 - (lambda alpha)^2))
    """
    lam, a, t0 = arrival_rate, alpha_s, tau0_s
    x = lam * a
    if x >= 1:
        raise ValueError(f"lambda alpha = {x:.3f} >= 1: batches grow without bound")
    phi0 = (a + t0) / (2 * (1 - x)) * (1 + 2 * lam * t0 + (1 - lam * t0) / (1 + x))
    phi1 = 1.5 * t0 / (1 - x) + a * (2 + x) / (2 * (1 - x * x))
    return min(phi0, phi1)


# --------------------------------------------------------------------------- general arrivals, one server
def kingman_mean_wait_s(arrival_rate: float, service_mean_s: float, arrival_scv: float,
                        service_scv: float) -> float:
    """Kingman's approximation of the G/G/1 FCFS mean wait in queue:

        Wq ~ rho / (1 - rho) * (c_a^2 + c_s^2) / 2 * E[S]

    with c_a^2 and c_s^2 the squared coefficients of variation of the inter-arrival gaps and of the
    service times (J. F. C. Kingman, 1961). Exact for Poisson arrivals (c_a^2 = 1: it is then
    Pollaczek-Khinchine, since E[S^2] = (1 + c_s^2) E[S]^2) and tight in heavy traffic; gamma gaps of
    shape k (``arrival.burstiness``) have c_a^2 = 1/k. The wait is linear in the variability of
    both sides: burstier arrivals cost as much as more variable service.
    """
    rho = arrival_rate * service_mean_s
    if rho >= 1:
        raise ValueError(f"offered load {rho:.3f} >= 1: the queue has no steady state")
    return rho / (1 - rho) * (arrival_scv + service_scv) / 2 * service_mean_s



# --------------------------------------------------------------------------- several servers, one queue
def erlang_c(servers: int, offered_erlangs: float) -> float:
    """P(an arrival waits) in the M/M/c queue with c = ``servers`` and a = lambda E[S] (Erlang's C formula):

        C(c, a) = (a^c / c!) (c / (c - a)) / (sum_{n<c} a^n / n! + (a^c / c!) (c / (c - a))).

    Computed by the stable recursion on Erlang's B formula, B(n) = a B(n-1) / (n + a B(n-1)), then
    C = c B / (c - a (1 - B)).
    """
    if offered_erlangs >= servers:
        raise ValueError(f"offered load {offered_erlangs / servers:.3f} per server >= 1: the queue has no steady state")
    blocking = 1.0
    for n in range(1, servers + 1):
        blocking = offered_erlangs * blocking / (n + offered_erlangs * blocking)
    return servers * blocking / (servers - offered_erlangs * (1 - blocking))


def mgc_mean_wait_s(arrival_rate: float, service_mean_s: float, service_scv: float, servers: int) -> float:
    """Mean wait in queue of ``servers`` servers fed by one FCFS queue, Poisson arrivals:

        Wq ~ (1 + c_s^2) / 2 * C(c, a) E[S] / (c - a),   a = lambda E[S]

    the M/M/c wait (exact when c_s^2 = 1) scaled by the Pollaczek-Khinchine factor, the
    Allen-Cunneen approximation for M/G/c; exact for c = 1 (it is then Pollaczek-Khinchine).
    """
    offered = arrival_rate * service_mean_s
    return (1 + service_scv) / 2 * erlang_c(servers, offered) * service_mean_s / (servers - offered)

# --------------------------------------------------------------------------- continuous batching as a queue
def ps_fixed_point_latency_s(device: Device, arrival_rate: float, mean_output_tokens: float) -> float:
    """Mean latency of decode-only continuous batching below the slot limit, by the fixed point of
    processor sharing and Little's law.

    With nobody waiting for a slot, the B requests in the system share every step: a request's
    latency is W = E[out] tau(B), and Little's law makes B = lambda W, so
    W = E[out] (tau0 + beta lambda W), whose solution is

        W = E[out] tau0 / (1 - lambda E[out] beta).

    A mean-field value: it puts the *mean* batch into tau(B). It holds while lambda W stays well
    below ``max_num_seqs``; :func:`batching_occupancy_pmf` keeps the fluctuations and the slot limit.
    """
    share = arrival_rate * mean_output_tokens * device.beta_s
    if share >= 1:
        raise ValueError(f"lambda E[out] beta = {share:.3f} >= 1: the batch grows without bound")
    return mean_output_tokens * device.tau0_ms / 1e3 / (1 - share)


def batching_occupancy_pmf(device: Device, max_num_seqs: int, arrival_rate: float,
                           mean_output_tokens: float) -> np.ndarray:
    """P(N = n), n = 0, 1, ..., of the number of requests in a decode-only continuous-batching server.

    The server as a birth-death chain: arrivals at rate lambda; with n requests inside, min(n, B_max)
    of them run, each step takes tau(min(n, B_max)) and yields one token per running request, so
    requests complete at rate mu(n) = min(n, B_max) / (E[out] tau(min(n, B_max))). Then

        P(N = n) = P(N = 0) prod_{k=1..n} lambda / mu(k).

    Up to B_max the server is processor sharing with a rate that depends on the number inside, a
    symmetric queue, so this law is *insensitive*: it holds for any output-length distribution with
    mean E[out] (F. P. Kelly, *Reversibility and Stochastic Networks*, 1979, ch. 3). Above B_max the
    extra requests wait first-come first-served for B_max slots, as in an M/G/c queue, and the law
    is exact only for exponential outputs (for less variable ones fewer wait). Steps are treated as
    continuous service, which is close when E[out] is many tokens. The support grows until the tail
    beyond it is below 1e-15; requires lambda < B_max / (E[out] tau(B_max)).
    """
    full_rate = max_num_seqs / (mean_output_tokens * step_time_s(device, max_num_seqs))
    r = arrival_rate / full_rate
    if r >= 1 - 1e-9:  # at r = 1 up to rounding the geometric tail would never end
        raise ValueError(f"arrival rate {arrival_rate:.3f}/s >= {full_rate:.3f}/s, the completion rate of a full "
                         "batch: the queue has no steady state")
    n = np.arange(1, max_num_seqs + 1)
    log_ratio = np.log(arrival_rate * mean_output_tokens * step_time_s(device, n) / n)
    # Beyond B_max the ratio is constant, r < 1: a geometric tail, cut where what is left,
    # r^k / (1 - r) of its start, falls below 1e-15.
    tail = math.ceil(math.log(1e-15 * (1 - r)) / math.log(r)) if r > 0 else 0
    log_ratio = np.concatenate([log_ratio, np.full(tail, math.log(r))]) if r > 0 else log_ratio
    log_weights = np.concatenate([[0.0], np.cumsum(log_ratio)])
    weights = np.exp(log_weights - log_weights.max())  # scaled: at high load the products overflow
    return weights / weights.sum()


def batching_mean_latency_s(device: Device, max_num_seqs: int, arrival_rate: float,
                            mean_output_tokens: float) -> float:
    """Mean time in the system, E[N] / lambda (Little's law) over :func:`batching_occupancy_pmf`."""
    pmf = batching_occupancy_pmf(device, max_num_seqs, arrival_rate, mean_output_tokens)
    return float(pmf @ np.arange(len(pmf))) / arrival_rate
