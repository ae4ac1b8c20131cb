"""What the engine models (`llm`, `ssm_*`) run, without Triton.

- api.py: the capability protocols (Engine, BatchEngine, InflightEngine, MeteredEngine) over
  decoding/engine_call.py's EngineRequest / EngineResult; tensors.py: the `tensorrt_llm` tensors they
  travel in; compat.py: the tensorrt_llm inputs they refuse unless neutral.
- factory.py: builds the engine an EngineSettings names.
- torch_engine.py (+ packed_forward.py over a paged KV pool, step_plan.py, graph_plan.py, cuda_graphs.py),
  llamacpp_engine.py, both batched in flight (inflight_batching.py), ngram_engine.py, suffix_engine.py,
  distilled_model.py: the engines and models; sequence_cache.py: the per-sequence state they keep;
  dispatch_count.py: the operators a step dispatches (benchmarks/bench_forward_ops.py).

Nothing is imported here, so a model loads torch or llama.cpp only if its engine needs it.
"""
