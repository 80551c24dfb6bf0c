"""``sim``: the simulation's own controls, not the server's: when to stop, and which engine runs.

``fast_forward`` picks the accelerated engine or the reference one; both give the same frames, bit
for bit (tests/test_fast_forward.py), so it changes how long a run takes, never what it says.
"""

from __future__ import annotations

from pydantic import Field

from simbatch.config.base import ClockS, _Model


class Sim(_Model):
    """Simulation controls."""

    max_time_s: ClockS | None = Field(
        default=None, description="Stop the clock here; requests still in the system are `unfinished`."
    )
    fast_forward: bool = Field(
        default=True,
        description="The accelerated engine: decodes advanced in lockstep, runs of identical steps in one go, "
        "a lone replica running ahead (the same frames, bit for bit). false: the reference engine, one "
        "SimPy event per step and every request scheduled one at a time.",
    )
