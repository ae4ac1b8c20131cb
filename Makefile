# Minions: `make serve` serves the default deployment, `make test` runs the tests.
SHELL := /bin/bash
PYTHON_SYSTEM ?= /usr/bin/python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEPLOY ?= deploy.yaml
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv serve prepare test test-unit test-integration bench bench-peers soak loadtest distill clean

# The Triton stub links Debian's libpython3.11, so the venv must come from the system python3.11.
$(STAMP): requirements.txt
	@test -x $(PYTHON_SYSTEM) || { echo "need $(PYTHON_SYSTEM) (apt-get install python3.11-venv)"; exit 1; }
	test -x $(PY) || $(PYTHON_SYSTEM) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -r requirements.txt
	# Make the package importable by Triton's Python stubs, which do not inherit PYTHONPATH.
	printf '%s\n%s\n' "$(CURDIR)/python_backend" "$(CURDIR)" > $(VENV)/lib/python3.11/site-packages/minions-dev.pth
	touch $(STAMP)

venv: $(STAMP)

prepare: $(STAMP)
	$(PY) -m minions.deploy.server --deploy $(DEPLOY) --prepare-only

serve: $(STAMP)
	$(PY) -m minions.deploy.server --deploy $(DEPLOY)

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
	$(PY) -m benchmarks.bench_peers --deploy $(DEPLOY)

# 30 minutes of 8-16 streams; fails on a failed or hung request, a stub crash, steady memory growth
# or shared memory left behind (not in CI).
soak: $(STAMP)
	$(PY) -m benchmarks.soak --deploy $(DEPLOY)

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
