"""Errors a user's request can cause that are not a bad scenario (those are
:class:`~simbatch.loading.ScenarioError`): light enough for the command line to import before it
imports anything heavy."""

from __future__ import annotations


class OutputError(Exception):
    """The result folder cannot be written where asked; the message says why and what to do."""
