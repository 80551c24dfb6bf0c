"""Speed and memory benchmarks (``make bench``); targets are issue 8's B1-B4."""
