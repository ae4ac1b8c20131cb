#!/usr/bin/env bash
# Installs the llama-cpp-python that requirements.txt pins, built from its sdist with this folder's patches
# to the llama.cpp it vendors applied in name order (README.md here says what each changes and why).
# Usage: patches/llama-cpp-python/install.sh PYTHON; CMAKE_ARGS is read by the build as pip's is.
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
rm -rf "$src"
tar -xzf "$archive" -C "$cache"
for patch in "$here"/*.patch; do
    echo "applying $(basename "$patch")"
    patch -p1 --forward --quiet -d "$src" < "$patch"
done
"$py" -m pip install --no-cache-dir --force-reinstall --no-deps "$src"
