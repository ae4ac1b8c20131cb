#!/usr/bin/env bash
# Installs the llama-cpp-python that requirements.txt pins, built from its sdist with this folder's patches
# to the llama.cpp it vendors applied in name order (README.md here says what each changes and why).
# Usage: patches/llama-cpp-python/install.sh PYTHON [TARGET]; CMAKE_ARGS is read by the build as pip's is.
# With TARGET, the build goes into that folder (pip --target) instead of PYTHON's environment: the
# guards-off build `make check-guards` tests beside the venv's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${1:?usage: $0 PYTHON}
version=$(sed -n 's/^llama-cpp-python==\([^[:space:];#]*\).*/\1/p' "$root/requirements.txt")
if [ -z "$version" ]; then
    echo "$root/requirements.txt pins no llama-cpp-python==<version>" >&2
    exit 1
fi
cache=$root/.cache/llama-cpp-python
archive=$cache/llama_cpp_python-$version.tar.gz
src=$cache/llama_cpp_python-$version
if [ ! -f "$archive" ]; then
    "$py" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$cache"
fi
# The sdist the patches were written against, by its sha256 (sdist.sha256: one line per pinned version).
expected=$(awk -v name="$(basename "$archive")" '$2 == name {print $1}' "$here/sdist.sha256")
if [ -z "$expected" ]; then
    echo "$here/sdist.sha256 pins no hash for $(basename "$archive"): check the patches against it, then add its sha256" >&2
    exit 1
fi
actual=$(sha256sum "$archive" | cut -d' ' -f1)
if [ "$actual" != "$expected" ]; then
    echo "$archive: sha256 $actual, expected $expected (sdist.sha256); removed, run again to download it anew" >&2
    rm -f "$archive"
    exit 1
fi
rm -rf "$src"
tar -xzf "$archive" -C "$cache"
"$here/apply.sh" "$src"
if [ -n "${2:-}" ]; then
    "$py" -m pip install --no-cache-dir --no-deps --upgrade --target "$2" "$src"
else
    "$py" -m pip install --no-cache-dir --force-reinstall --no-deps "$src"
fi
