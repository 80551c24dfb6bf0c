"""From a model and a GPU to the device section of a scenario.

- :mod:`.cards`: the model and GPU cards (public spec numbers, shipped in ``simbatch/data``);
- :mod:`.preset`: ``device.preset: <model>/<gpu>[/tpN][/fp8]`` -> the five step-time parameters,
  with efficiency constants fitted once to measured steps (:mod:`.measured`, ``scripts/fit_hardware.py``);
- :mod:`.memory`: ``kv_cache.num_blocks: auto``, the KV blocks left once the weights are loaded;
- :mod:`.calibrate`: the parameters fitted to a user's own measurements (per-step CSV, ``vllm bench serve``).
"""
