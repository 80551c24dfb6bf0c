"""A registry: named entries, each declaring what it is, and the implementations attached to them.

An entry is a plain declaration: a ``name`` (what a scenario writes), a one-line ``description``
(what the generated docs say) and the properties the rest of the simulator reads instead of the
name. Code never asks "is this the priority policy?"; it asks the entry whether it evicts at
admission. Implementations that live in higher layers (a scheduler class, a router class, an
accelerated twin) are *attached* to an entry by name where they are defined, in a named role
(:meth:`Registry.attach`), and looked up once, when an engine is built (:meth:`Registry.attached`).

Lookups happen at construction, never per step: a scheduler copies the properties it reads into
plain attributes, so a registry costs the hot path nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

NAME = re.compile(r"[a-z][a-z0-9_]*")
"""What a name may look like: a YAML scalar nobody has to quote, and a Python identifier."""


class Entry(Protocol):
    name: str
    description: str


E = TypeVar("E", bound=Entry)


class Registry(Generic[E]):
    """The entries of one kind (queue policies, batching modes, ...), in registration order.

    ``kind`` names an entry in messages ("queue policy"); ``key`` is the scenario key that names one
    ("scheduler.policy").
    """

    def __init__(self, kind: str, key: str):
        self.kind, self.key = kind, key
        self._entries: dict[str, E] = {}
        self._attached: dict[tuple[str, str], object] = {}

    def register(self, entry: E) -> E:
        """Add ``entry`` (returned, so that a class may register itself as a decorator)."""
        name = entry.name
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"a {self.kind} needs a name of lower-case letters, digits and underscores: {name!r}")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered already; give yours a name of its own")
        if not isinstance(entry.description, str) or not entry.description.strip() or "\n" in entry.description:
            raise ValueError(f"{self.kind} {name!r} needs a one-line description (the docs list it)")
        self._entries[name] = entry
        return entry

    def __getitem__(self, name: str) -> E:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no {self.kind} is called {name!r} ({self.key}: {self.expected()})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[E]:
        return iter(tuple(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def expected(self) -> str:
        """The names, as pydantic lists a Literal's values: ``'a', 'b' or 'c'``."""
        quoted = [repr(n) for n in self._entries]
        return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    # ---------------------------------------------------------------- implementations
    def attach(self, name: str, **roles: object) -> None:
        """Attach implementations to the entry ``name``, one per role: ``attach("static", scheduler=cls)``."""
        self[name]  # a declared entry, or KeyError naming the known ones
        for role, impl in roles.items():
            if (name, role) in self._attached:
                raise ValueError(f"{self.kind} {name!r} has a {role} attached already")
            self._attached[name, role] = impl

    def attached(self, name: str, role: str):
        """The implementation attached to ``name`` in ``role``; KeyError naming what is missing."""
        try:
            return self._attached[name, role]
        except KeyError:
            self[name]
            raise KeyError(f"{self.kind} {name!r} has no {role} attached: import the module that defines it "
                           "before building an engine") from None

    def find(self, name: str, role: str, default=None):
        """The implementation attached to ``name`` in ``role``, or ``default`` when there is none."""
        return self._attached.get((name, role), default)

    @contextmanager
    def restoring(self) -> Iterator[Registry[E]]:
        """Within the block, registrations and attachments are kept; after it, the registry is as before
        (for tests and worked examples that register entries of their own)."""
        entries, attached = dict(self._entries), dict(self._attached)
        try:
            yield self
        finally:
            self._entries, self._attached = entries, attached
