"""Serving techniques beyond plain batching, one module each."""
