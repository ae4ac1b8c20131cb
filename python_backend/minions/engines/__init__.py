"""What the engine models (`llm`, `ssm_*`) run, without Triton.

- api.py: the capability protocols (Engine, BatchEngine, InflightEngine, MeteredEngine) over
  decoding/engine_call.py's EngineRequest / EngineResult; tensors.py: the `tensorrt_llm` tensors they
  travel in; compat.py: the tensorrt_llm inputs they refuse unless neutral.
- factory.py: builds the engine an EngineSettings names.
- torch_engine.py (+ packed_forward.py), llamacpp_engine.py (+ inflight_batching.py), ngram_engine.py,
  suffix_engine.py, distilled_model.py: the engines and models; sequence_cache.py: the per-sequence state they keep.

Nothing is imported here, so a model loads torch or llama.cpp only if its engine needs it.
"""
