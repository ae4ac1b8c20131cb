# Minions on NVIDIA's Triton + TensorRT-LLM image: builds the engines (minions.deploy.trtllm_build), serves
# deploy.gpu.yaml (minions.deploy.server, the image's own /opt/tritonserver and backends), and runs the
# OpenAI frontend and the Locust load test. Built by docker-compose.yml (`docker compose build`).
#
# 25.05: the release whose tensorrtllm_backend (commit c2e65b8, May 2025) has the tensor interface that
# model_repository/tensorrt_llm_io.pbtxt declares.
ARG TRITON_VERSION=25.05
FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-trtllm-python-py3

# curl: the compose healthchecks. The image's Python is the system one, so pip may install into it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /workspace/minions
COPY docker/requirements.gpu.txt docker/requirements.gpu.txt
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --disable-pip-version-check \
    -r docker/requirements.gpu.txt

# The project itself (docker/triton.Dockerfile.dockerignore keeps out .venv, .cache, build, results).
COPY . /workspace/minions

# Triton's Python stubs are started by tritonserver, which minions.deploy.server starts with this
# environment; nothing is downloaded at run time: checkpoints and engines are mounted at .cache/minions.
ENV PYTHONPATH=/workspace/minions/python_backend:/workspace/minions \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PYTHONUNBUFFERED=1
