# Minions' CPU replica for Kubernetes (k8s/cpu): the default deployment, deploy.yaml (SmolLM2 on llama.cpp), served by
# the tritonserver of the nvidia-pytriton wheel with the OpenAI frontend beside it, as `make serve` does. Built from
# the repository root:
#
#   docker build -f docker/cpu.Dockerfile -t minions-cpu:latest .
#
# Debian bookworm: its python3.11 is the one the Triton Python stub links (libpython3.11), so the venv comes from
# /usr/bin/python3.11, as the Makefile requires.
FROM debian:bookworm-slim

# build-essential, cmake, patch: llama-cpp-python from its sdist with the project's patches (`make venv`);
# python3.11-venv and libpython3.11: the venv and the stub's libpython; ca-certificates: pip over HTTPS.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake patch make ca-certificates curl \
       python3.11 python3.11-venv libpython3.11 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/minions
# The project (docker/cpu.Dockerfile.dockerignore keeps out .venv, .cache, build, results).
COPY . /workspace/minions

# The pinned dependencies, llama.cpp compiled for AVX2 (the Makefile's LLAMA_CMAKE_ARGS), not for the build machine.
# PyTorch's CPU wheels: PyPI's default torch brings CUDA libraries this image never uses.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL} make venv \
    && rm -rf .cache/llama-cpp-python /root/.cache/pip

# deploy.yaml binds 127.0.0.1; in a pod every port must answer on the pod's address. Only server.host changes.
RUN sed -e 's/^\(  host:\) *127\.0\.0\.1/\1 0.0.0.0/' deploy.yaml > deploy.container.yaml

# Render the repository and prepare the model into .cache/minions now (the transformers tokenizer converted from
# the GGUF, llama.cpp's load-and-decode probe), so that a pod starts with nothing to download or convert.
RUN make prepare DEPLOY=deploy.container.yaml

ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PYTHONUNBUFFERED=1
# KServe v2 HTTP, gRPC, Prometheus metrics, OpenAI-compatible API.
EXPOSE 8000 8001 8002 9000
CMD ["/workspace/minions/.venv/bin/python", "-m", "minions.deploy.server", "--deploy", "deploy.container.yaml"]
