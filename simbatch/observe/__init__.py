"""Watching a run: the observer protocol, the recorder that keeps its rows, the Perfetto trace."""
