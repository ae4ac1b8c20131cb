#!/usr/bin/env bash
# `make gpu-bundle`: everything `make gpu-check` needs that a bare lent GPU machine lacks (it has no network):
# the wheels of benchmarks/gpu/requirements.txt for Python 3.12 and the larger prompt sets where present (the
# shipped ones, datasets/, travel with the tree), as one tar
# split into parts small enough for one device call each (64 MiB carried per call, the tree included).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=.cache/gpu-check
DATASETS=${MINIONS_DATASETS:-../shared/datasets}
PART_SIZE=${GPU_BUNDLE_PART_SIZE:-56m}
rm -rf "$BUNDLE" && mkdir -p "$BUNDLE/stage/wheels" "$BUNDLE/stage/datasets"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$BUNDLE/stage/wheels" -r benchmarks/gpu/requirements.txt
if [ -d "$DATASETS" ]; then cp "$DATASETS"/*.jsonl "$BUNDLE/stage/datasets/"; fi
tar -C "$BUNDLE/stage" -cf - . | split -b "$PART_SIZE" -d - "$BUNDLE/part-"
rm -rf "$BUNDLE/stage"
ls -l "$BUNDLE"
echo "carry each of these in its own device call (the machine keeps them while warm), the last with: make gpu-check"
