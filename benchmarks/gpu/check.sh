#!/usr/bin/env bash
# `make gpu-check`, on a bare lent GPU machine, as root, with .cache/gpu-check/part-* from `make gpu-bundle`
# beside the tree: installs the bundle's wheels into the image's python3 (NumPy 1.x: the Python backend
# stub's pybind11 misreads NumPy 2 arrays), then runs benchmarks.gpu_check into $OUT (else bench_results/gpu-check).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=.cache/gpu-check
OUT_DIR=${OUT:-bench_results/gpu-check}
STAGE=$(mktemp -d)
ls "$BUNDLE"/part-* >/dev/null 2>&1 || { echo "no $BUNDLE/part-*: run make gpu-bundle here and carry the parts" >&2; exit 2; }
cat "$BUNDLE"/part-* | tar -C "$STAGE" -xf -
# The image's SciPy and scikit-learn need NumPy 2, and transformers imports them when they are installed.
python3 -m pip uninstall --quiet -y scipy scikit-learn || true
python3 -m pip install --quiet --no-index --no-deps --no-compile "$STAGE"/wheels/*.whl
export MINIONS_DATASETS="$STAGE/datasets"
# The wheel's tritonserver, found without importing pytriton (whose client needs gevent, absent there).
SITE="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
export MINIONS_TRITON_HOME="$SITE/pytriton/tritonserver"
# The Python backend's stubs do not inherit PYTHONPATH: the package is made importable as `make venv` does.
printf '%s\n%s\n' "$PWD/python_backend" "$PWD" > "$SITE/minions-dev.pth"
export MINIONS_TRITON_ARGS="${MINIONS_TRITON_ARGS:---pinned-memory-pool-byte-size=0 --cuda-memory-pool-byte-size=0:0}"
export PYTHONUNBUFFERED=1
exec python3 -m benchmarks.gpu_check --out "$OUT_DIR" "$@"
