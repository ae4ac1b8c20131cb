"""Peers to measure Minions against: llama.cpp's llama-server (built once, run on the deployment's GGUF),
driven through the same concurrent-stream harness as Minions (`python -m benchmarks.bench_peers`)."""
