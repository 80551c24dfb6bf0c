"""What is computed from a scenario or a run without simulating: capacity, queueing theory, frames and summaries."""
