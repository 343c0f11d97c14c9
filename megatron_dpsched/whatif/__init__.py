"""The planner as a what-if tool: compare a plan with Megatron's fixed micro-batches and per-rank packing.

* :mod:`.inputs`: sample lengths from a length file, a JSONL corpus or an indexed dataset.
* :mod:`.analysis`: per-step figures and simulated step times of every strategy, warnings.
* :mod:`.report`: the side-by-side table and the JSON document.
* :mod:`.plots`: PNGs of a step's per-rank load, the micro-batch sizes and the pipeline timeline.
* :mod:`.sweep`: several token caps side by side (``--max-tokens-per-gpu A,B,...``) and the recommended one.
* :mod:`.caps`: a sweep's figures per cap and the cap it recommends (what :mod:`.sweep` prints and
  :mod:`.plots` draws).

Pure Python except :mod:`.plots` (matplotlib, imported when called); indexed datasets are read with NumPy
(:mod:`megatron_dpsched.data.indexed_file`).
"""
