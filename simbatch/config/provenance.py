"""Where each value of a resolved scenario came from: the record that resolution keeps.

A scenario file gives some values and leaves others out; resolution (:mod:`simbatch.inputs.resolve`)
fills in what follows from the rest (a preset's costs, ``num_blocks: auto``, the KV bytes a
disaggregated cluster moves) and writes down, for each value it decided, a :class:`Provenance`: the
value, its source and one line saying how. The record is keyed by the dotted key a scenario file
would use (``device.tau0_ms``, ``cluster.replica_specs.1.kv_cache.num_blocks``), so any section's
keys can have entries, and ``simbatch run`` prints them (:mod:`simbatch.hardware.report`).

The sources (a new kind of resolution adds its own):

- ``explicit``: given in the scenario (the file, ``--set``, or the mapping validated);
- ``default``: the schema's default, the scenario gave none;
- ``preset``: from ``device.preset``, its cards and the fitted efficiencies; the note names it;
- ``derived``: computed from other keys the scenario gives; the note says from which.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GIVEN = ("explicit", "default")
"""The sources of values the scenario itself holds, as opposed to values resolution decided."""


@dataclass(frozen=True)
class Provenance:
    """One resolved value: what it is, where it came from, and how (one line, "" when nothing to add)."""

    value: Any
    source: str
    note: str = ""

    @property
    def decided(self) -> bool:
        """True when resolution made the value (not given, not the schema's default)."""
        return self.source not in GIVEN


class Resolution(Mapping[str, Provenance]):
    """The record of one resolution: dotted key -> :class:`Provenance`, in the order the keys were resolved.

    Read-only once made; two records are equal when they hold the same entries.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[str, Provenance] | None = None):
        self._entries = dict(entries or {})

    def __getitem__(self, key: str) -> Provenance:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Resolution({self._entries!r})"

    def within(self, section: str) -> dict[str, Provenance]:
        """The entries of the keys directly in ``section`` (``"device"``, ``"cluster.replica_specs.1.device"``),
        by their name in it."""
        return {key.rpartition(".")[2]: p for key, p in self._entries.items() if key.rpartition(".")[0] == section}

    def sources(self, section: str) -> dict[str, str]:
        """Where each key of ``section`` came from, by its name: ``{"tau0_ms": "preset", ...}``."""
        return {name: p.source for name, p in self.within(section).items()}
