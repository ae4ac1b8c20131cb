"""What the tests and the tools (benchmarks, the load test, chaos, soak) both stand on: a real
tritonserver as a process, the OpenAI frontend in front of it, killing a stub outside its locks,
reading Triton's metrics port, and the prompts kept with the project. Nothing here imports `tests`."""
