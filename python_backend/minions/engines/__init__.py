"""What the engine models (`llm`, `ssm_*`) run, without Triton.

- api.py: EngineRequest / EngineResult and the capability protocols (Engine, BatchEngine,
  InflightEngine, MeteredEngine); tensors.py: the `tensorrt_llm` tensors they travel in.
- factory.py: builds the engine an EngineSettings names.
- torch_engine.py (+ packed_forward.py), llamacpp_engine.py (+ inflight_batching.py), ngram_engine.py:
  the engines; sequence_cache.py: the per-sequence state they keep.

Nothing is imported here, so a model loads torch or llama.cpp only if its engine needs it.
"""
