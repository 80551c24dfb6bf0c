"""Accelerations of the engine: the same frames as the reference, bit for bit, in fewer events."""
