"""Errors a user's request can cause that are not a bad scenario (those are
:class:`~simbatch.inputs.loading.ScenarioError`): light enough for the command line to import before it
imports anything heavy."""

from __future__ import annotations

import signal


class OutputError(Exception):
    """The result folder cannot be written where asked; the message says why and what to do."""


# The signals received since the command line (or a command) began, for an interruption that a library
# re-raised as an error of its own: pydantic-core, building a model's schema while its module is imported,
# reports whatever a callback raises, a signal handler's exception too, as a SchemaError.
_received: list[int] = []


def forget_signals() -> None:
    """A command line or a command begins: no signal has interrupted it."""
    _received.clear()


def interrupting_signal() -> int | None:
    """The signal received since :func:`forget_signals`, if any: whatever was raised after it is the interruption."""
    return _received[-1] if _received else None


def interruption(signum: int) -> tuple[str, int]:
    """What the command line says when ``signum`` stopped it, and its exit code (as a shell reports it)."""
    return ("interrupted (terminated)" if signum == signal.SIGTERM else "interrupted"), 128 + signum


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so cleanup runs the same way."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: raise :class:`Terminated` where the main thread is."""
    _received.append(signum)
    raise Terminated


def raise_keyboard_interrupt(signum, frame) -> None:
    """The SIGINT handler while a command runs: Python's own (KeyboardInterrupt), the signal noted."""
    _received.append(signum)
    raise KeyboardInterrupt


class Interrupted(BaseException):
    """Ctrl-C before a command has started (:mod:`simbatch.app.console`): not a KeyboardInterrupt, which
    typer, parsing the command line then, would turn into a silent exit 130 instead of reporting it."""


def raise_interrupted(signum, frame) -> None:
    """The SIGINT handler until a command starts: raise :class:`Interrupted` where the main thread is."""
    _received.append(signum)
    raise Interrupted
