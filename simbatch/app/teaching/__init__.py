"""Helpers for the teaching notebooks (``notebooks/``): code a lesson would otherwise repeat."""
