"""Watching a run as it goes: the engine's events, for whoever subscribes.

``simulate(scenario, observers=[...])`` calls every observer's methods at the instants things
happen, in simulation order. An observer overrides the methods it wants; the others do nothing
(and one that does not override ``steps`` costs nothing per step). The recorder, which builds the
frames and the summary, is the first observer of every run (:mod:`simbatch.observe.recorder`);
another is for what the frames do not keep: a trace of which requests rode in which step, a live view.

Steps come as *runs*: ``steps(..., count, plan, done)`` is ``count`` identical consecutive steps of
one replica, ``step_s`` long on average (each, unless the step time grows with the context read:
``device.kv_read_ms_per_1k_tokens``), whose membership is ``plan.scheduled`` (every (request, tokens) of
each step: prefill chunks, and decodes of one token). The reference engine (``sim.fast_forward:
false``) reports every step alone; the accelerated one may report a run of identical steps at once,
and cut one run into several reports: the steps, tokens and memberships add up to the same.
A step the clock stop interrupted is reported with ``done`` False: it began, its tokens never came.

The requests handed to an observer are the engine's live objects: read them, never change them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simbatch.model.request import Request
    from simbatch.schedulers.base import StepPlan


class Observer:
    """Subscribe to a run's events by overriding any of these methods (each does nothing here)."""

    def arrival(self, t_s: float, request: Request) -> None:
        """``request`` reached ``request.replica`` at ``t_s`` and joined its waiting queue."""

    def rejection(self, t_s: float, request_id: int, reason: str) -> None:
        """Request ``request_id`` was turned away at ``t_s`` (``reason`` as in the requests frame)."""

    def steps(self, replica: int, start_s: float, step_s: float, count: int, plan: StepPlan, done: bool) -> None:
        """``count`` identical steps of ``replica`` from ``start_s``, with ``plan``'s membership."""

    def completion(self, t_s: float, requests: list[Request]) -> None:
        """``requests`` sampled their last token at ``t_s`` and left."""
