# The SGLang Model Gateway for Kubernetes (k8s/base/gateway.yaml): sglang-router at the version requirements.txt
# pins, nothing else. Built from the repository root:
#
#   docker build -f docker/gateway.Dockerfile -t minions-gateway:0.3.2 .
FROM python:3.11-slim-bookworm

COPY requirements.txt /tmp/requirements.txt
RUN python -m pip install --no-cache-dir --disable-pip-version-check \
        "$(grep -o '^sglang-router==[^ #]*' /tmp/requirements.txt)" \
    && rm /tmp/requirements.txt

# The gateway's command line is the Deployment's; 30000: the API, 29000: its Prometheus metrics.
EXPOSE 30000 29000
