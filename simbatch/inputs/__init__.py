"""From what a user brings to a scenario the engine can run.

:mod:`.loading` reads a YAML file and ``--set`` overrides into the schema (:mod:`simbatch.config`),
with errors that name the file, the line, the field and the fix; :mod:`.resolve` fills in what a
scenario leaves to derivation (presets from the model and GPU cards, vLLM's defaults for the GPU,
``num_blocks: auto``), recording where each value came from; :mod:`.guard` bounds what a run would
read and allocate before it starts. They sit above the hardware and workload models they call, so
the schema below them stays data.
"""
