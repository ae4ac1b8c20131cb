# Minions: `make serve` serves the default deployment, `make test` runs the tests.
SHELL := /bin/bash
PYTHON_SYSTEM ?= /usr/bin/python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEPLOY ?= deploy.yaml
# llama.cpp (in llama-cpp-python, and llama-server for bench-peers) is compiled for AVX2, not for the build
# machine's own instruction set: a virtual CPU can advertise AVX-512 and AMX that it does not run, and every
# quantised GGUF (the default LLM's Q4_1) then dies with SIGILL (docs/operations.md). For a native build:
# make venv LLAMA_CMAKE_ARGS=-DGGML_NATIVE=ON (on a fresh .venv).
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv serve prepare engines test test-unit test-integration check-guards bench bench-peers bench-paired bench-openai-peers bench-aiperf gpu-bundle gpu-check soak chaos loadtest distill cluster bench-cluster clean

# The Triton stub links Debian's libpython3.11, so the venv must come from the system python3.11.
$(STAMP): requirements.txt patches/llama-cpp-python/install.sh patches/llama-cpp-python/apply.sh patches/llama-cpp-python/sdist.sha256 $(wildcard patches/llama-cpp-python/*.patch)
	@test -x $(PYTHON_SYSTEM) || { echo "need $(PYTHON_SYSTEM) (apt-get install python3.11-venv)"; exit 1; }
	test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	# llama-cpp-python from its sdist, with the project's patches to llama.cpp (patches/llama-cpp-python/README.md).
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" patches/llama-cpp-python/install.sh $(PY)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --no-cache-dir -r requirements.txt
	# Make the package importable by Triton's Python stubs, which do not inherit PYTHONPATH.
	printf '%s\n%s\n' "$(CURDIR)/python_backend" "$(CURDIR)" > $(VENV)/lib/python3.11/site-packages/minions-dev.pth
	touch $(STAMP)

venv: $(STAMP)

# llama-cpp-python built with the patches' guards off (no AVX2 or FMA, as -DGGML_AVX2=OFF builds do) into
# .cache/guards-off, beside the venv's, and the test that it refuses batch invariance and decodes without it
# (issue 66; about 8 minutes on 2 cores, so not part of `make test`).
GUARDS_OFF_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=ON
check-guards: $(STAMP)
	test -d .cache/guards-off/llama_cpp || CMAKE_ARGS="$(GUARDS_OFF_CMAKE_ARGS)" patches/llama-cpp-python/install.sh $(PY) .cache/guards-off
	MINIONS_GUARDS_OFF=.cache/guards-off $(PY) -m pytest -q tests/unit/test_guards_off_build.py

prepare: $(STAMP)
	$(PY) -m minions.deploy.server --deploy $(DEPLOY) --prepare-only

serve: $(STAMP)
	$(PY) -m minions.deploy.server --deploy $(DEPLOY)

# CLUSTER_REPLICAS replicas of DEPLOY on this host behind the SGLang Model Gateway with prefix affinity, each on
# its own ports (the deployment's + 10 per replica); prints the gateway's URL and every port; Ctrl-C stops all
# of it (docs/deployments.md). More: CLUSTER_ARGS="--pin --gateway-port 9100"; python -m minions.deploy.cluster --help.
CLUSTER_REPLICAS ?= 2
CLUSTER_ARGS ?=
cluster: $(STAMP)
	$(PY) -m minions.deploy.cluster --deploy $(DEPLOY) --replicas $(CLUSTER_REPLICAS) $(CLUSTER_ARGS)

# One replica direct vs CLUSTER_REPLICAS behind the gateway (affinity) vs round-robin on the multi-turn workloads:
# tokens/s, TTFT, prefix hit rate, prefill tokens, turns kept, spread; into bench_results/cluster/ (docs/benchmarks.md).
bench-cluster: $(STAMP)
	$(PY) -m benchmarks.bench_cluster --deploy $(DEPLOY) --replicas $(CLUSTER_REPLICAS) $(CLUSTER_ARGS)

# The TensorRT-LLM engines of DEPLOY's `engine: tensorrtllm` models (deploy.gpu.yaml); runs inside the Triton
# TRT-LLM container (its python3 has tensorrt_llm and trtllm-build), so not through .venv. Up-to-date engines are skipped.
engines:
	PYTHONPATH=python_backend python3 -m minions.deploy.trtllm_build --deploy $(DEPLOY)

test: $(STAMP)
	$(PY) -m pytest -q

test-unit: $(STAMP)
	$(PY) -m pytest -q -m "not integration"

test-integration: $(STAMP)
	$(PY) -m pytest -q -m integration

bench: $(STAMP)
	$(PY) -m benchmarks.bench_speculation
	$(PY) -m benchmarks.bench_load
	$(PY) -m benchmarks.trace_draft_length

# Minions against llama.cpp's own llama-server on the same GGUF (builds llama-server once under .cache/peers).
bench-peers: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m benchmarks.bench_peers --deploy $(DEPLOY)

# The same through both servers' OpenAI APIs, loaded by one Locust user (llama-server built as above).
bench-openai-peers: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m benchmarks.bench_openai_peers --deploy $(DEPLOY)

# The default against `off` prompt by prompt on one server: a cell to ~3%, where two servers taking turns spread 5-10%.
bench-paired: $(STAMP)
	$(PY) -m benchmarks.bench_paired --deploy $(DEPLOY)

# The GPU acceptance run (docs/benchmarks.md, "GPU check"). Here, with network: `make gpu-bundle` puts the
# wheels and prompt sets a bare lent GPU machine lacks into .cache/gpu-check/part-*. There, with the parts
# carried: `make gpu-check` (runs with the machine's own python3, not .venv) writes report.md into $$OUT.
gpu-bundle:
	bash benchmarks/gpu/bundle.sh

gpu-check:
	bash benchmarks/gpu/check.sh

# NVIDIA AIPerf against the OpenAI-compatible API of a server you started yourself (`make serve` first;
# this target does not start one): chat streaming, speculation off and vote, concurrency 1 and 4, into
# bench_results/aiperf/<endpoint>-<mode>-c<n>/ (summary: profile_export_aiperf.{json,csv}). aiperf has its
# own venv, .cache/aiperf-venv. Settings and what the summary holds: benchmarks/aiperf/run.sh;
# AIPERF_ARGS goes to every `aiperf profile`.
AIPERF_VENV := .cache/aiperf-venv
AIPERF_STAMP := $(AIPERF_VENV)/.installed
AIPERF_URL ?= http://127.0.0.1:9000
AIPERF_ARGS ?=
$(AIPERF_STAMP): benchmarks/aiperf/requirements.txt
	@test -x $(PYTHON_SYSTEM) || { echo "need $(PYTHON_SYSTEM) (apt-get install python3.11-venv)"; exit 1; }
	test -x $(AIPERF_VENV)/bin/python || $(PYTHON_SYSTEM) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install -r benchmarks/aiperf/requirements.txt
	touch $(AIPERF_STAMP)

bench-aiperf: $(AIPERF_STAMP)
	BENCH_AIPERF_BIN=$(AIPERF_VENV)/bin/aiperf AIPERF_URL=$(AIPERF_URL) bash benchmarks/aiperf/run.sh $(AIPERF_ARGS)

# 30 minutes of 8-16 streams; fails on a failed or hung request, a stub crash, steady memory growth
# or shared memory left behind (not in CI).
soak: $(STAMP)
	$(PY) -m benchmarks.soak --deploy $(DEPLOY)

# Load on a fresh server for 15 minutes while stubs are killed (SIGKILL) and models reloaded at seeded random
# intervals; fails on a hung or incomplete request, a crash, a stub not recovered within 90 s, leaked /dev/shm or
# steady memory growth; figures into bench_results/chaos/ (not in CI; docs/operations.md, "Chaos"). Options:
# CHAOS_ARGS="--minutes 5 --seed 7 --faults ssm_kill,reload"; all of them: python -m benchmarks.chaos --help.
# CI runs it short (tests/integration/test_chaos_run.py).
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(PY) -m benchmarks.chaos --deploy $(DEPLOY) $(CHAOS_ARGS)

# Locust's HTTP SSE and gRPC streaming users against a fresh server: TTFT, ITL, E2E, goodput and a PNG in
# bench_results/loadtest/ (loadtest/README.md). Options: LOADTEST_ARGS="--users 8 --time 60", or "--host URL"
# for a running server; all of them: python -m loadtest.run --help. CI runs it short (tests/integration/test_loadtest.py).
LOADTEST_ARGS ?=
loadtest: $(STAMP)
	$(PY) -m loadtest.run --deploy $(DEPLOY) $(LOADTEST_ARGS)

# Train the distilled SSMs (about 50 minutes on 2 cores); deploy.torch.yaml serves them when present.
distill: $(STAMP)
	$(PY) -m minions.distill --deploy $(DEPLOY)

clean:
	rm -rf build bench_results
