#!/usr/bin/env bash
# Applies this folder's patches to SOURCE (a tree laid out as the llama-cpp-python sdist: the patches
# name vendor/llama.cpp/...), in name order and without fuzz: a patch whose context moved must be
# rebased, not guessed. REBASED/<name>, where given and present, is taken instead of <name>. Says which
# apply; exits 1 if any does not. The one applier: install.sh, rebase-check.sh, the tests and
# bench-peers' patched llama-server all apply the patches through it.
# Usage: patches/llama-cpp-python/apply.sh SOURCE [REBASED]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source=${1:?usage: $0 SOURCE [REBASED]}
rebased=${2:-}
[ -z "$rebased" ] || [ -d "$rebased" ] || rebased=$here/$rebased
failed=0
for patch in "$here"/*.patch; do
    name=$(basename "$patch")
    if [ -n "$rebased" ] && [ -f "$rebased/$name" ]; then
        patch=$rebased/$name
        name="$name (rebased)"
    fi
    if out=$(patch -p1 --forward --fuzz=0 -d "$source" < "$patch" 2>&1); then
        echo "applies: $name"
        echo "$out" | grep -E "offset" | sed 's/^/         /'
    else
        echo "FAILS:   $name"
        echo "$out" | grep -E "FAILED|malformed|not found|Reversed" | sed 's/^/         /'
        failed=1
    fi
done
exit $failed
