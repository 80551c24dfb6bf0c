"""Recorders, frames and the summary (definitions in :mod:`simbatch.metrics.summary`)."""
