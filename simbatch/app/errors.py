"""Errors a user's request can cause that are not a bad scenario (those are
:class:`~simbatch.inputs.loading.ScenarioError`): light enough for the command line to import before it
imports anything heavy."""

from __future__ import annotations


class OutputError(Exception):
    """The result folder cannot be written where asked; the message says why and what to do."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt, so cleanup runs the same way."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: raise :class:`Terminated` where the main thread is."""
    raise Terminated


class Interrupted(BaseException):
    """Ctrl-C before a command has started (:mod:`simbatch.app.console`): not a KeyboardInterrupt, which
    typer, parsing the command line then, would turn into a silent exit 130 instead of reporting it."""


def raise_interrupted(signum, frame) -> None:
    """The SIGINT handler until a command starts: raise :class:`Interrupted` where the main thread is."""
    raise Interrupted
