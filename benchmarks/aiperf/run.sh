#!/usr/bin/env bash
# Profile the running server's OpenAI-compatible API with NVIDIA AIPerf (`make bench-aiperf`).
#
# It does not start a server: run `make serve` first (the OpenAI API listens on deploy.yaml's
# server.openai_port, 9000). For each speculation mode (request field "speculation") and each
# concurrency it runs one `aiperf profile`: streaming, synthetic prompts of ISL tokens asking for
# exactly OSL tokens (min_tokens = max tokens), greedy (temperature 0), REQUESTS requests. Each run
# writes bench_results/aiperf/<endpoint>-<mode>-c<concurrency>/; its summary is
# profile_export_aiperf.json (metric -> {unit, avg, min, max, p50, p90, p99, ...}), the same as CSV
# in profile_export_aiperf.csv, and the printed tables in profile_export_console.txt.
#
# Each run gets its own prompts (random seed SEED + run index): ssm_suffix drafts from recently
# finished requests, so replaying prompts an earlier run already answered would flatter speculation.
#
# Tokens are counted with the LLM's tokenizer directory that `make serve` saves. aiperf 0.13.0
# cannot load a local directory when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (it then looks
# the path up as a hub repo id), so both are unset for aiperf; given an absolute directory it
# loads it from disk, and a run opens no connection beyond AIPERF_URL.
#
# Settings (environment; defaults below): AIPERF_URL and BENCH_AIPERF_<X> for X in BIN, MODEL,
# TOKENIZER, ENDPOINT (chat or completions), MODES, CONCURRENCY, REQUESTS, ISL, OSL, SEED, OUT.
# Not AIPERF_<X>: aiperf reads AIPERF_* as its own settings, and AIPERF_ENDPOINT or
# AIPERF_TOKENIZER holding a plain value makes it fail. Arguments are passed to every
# `aiperf profile` (not flags set here: aiperf refuses a flag given twice, except --extra-inputs,
# which adds fields), e.g. --server-metrics http://127.0.0.1:8002/metrics for Triton's metrics.
set -euo pipefail
cd "$(dirname "$0")/../.."

AIPERF=${BENCH_AIPERF_BIN:-.cache/aiperf-venv/bin/aiperf}
URL=${AIPERF_URL:-http://127.0.0.1:9000}
MODEL=${BENCH_AIPERF_MODEL:-minions}
TOKENIZER=$(realpath -m "${BENCH_AIPERF_TOKENIZER:-.cache/minions/smollm2-135m-instruct-fp32}")
ENDPOINT=${BENCH_AIPERF_ENDPOINT:-chat}
MODES=${BENCH_AIPERF_MODES:-off vote}
CONCURRENCY=${BENCH_AIPERF_CONCURRENCY:-1 4}
REQUESTS=${BENCH_AIPERF_REQUESTS:-16}
ISL=${BENCH_AIPERF_ISL:-128}
OSL=${BENCH_AIPERF_OSL:-64}
SEED=${BENCH_AIPERF_SEED:-1}
OUT=${BENCH_AIPERF_OUT:-bench_results/aiperf}

[[ -x $AIPERF ]] || { echo "no $AIPERF: run make bench-aiperf" >&2; exit 1; }
[[ -f $TOKENIZER/tokenizer.json ]] || { echo "no tokenizer in $TOKENIZER: run make serve once" >&2; exit 1; }
curl -sf -o /dev/null "$URL/v1/models" || { echo "no OpenAI API at $URL: start it with make serve" >&2; exit 1; }

summaries=()
for mode in $MODES; do
  for c in $CONCURRENCY; do
    label=$ENDPOINT-$mode-c$c
    echo "== aiperf $label"
    env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE -u AIPERF_URL -u AIPERF_ARGS "$AIPERF" profile \
      --model "$MODEL" --url "$URL" --endpoint-type "$ENDPOINT" --streaming \
      --tokenizer "$TOKENIZER" \
      --isl "$ISL" --isl-stddev 0 --osl "$OSL" --osl-stddev 0 \
      --concurrency "$c" --request-count "$REQUESTS" --random-seed "$SEED" \
      --extra-inputs "speculation:$mode" temperature:0 "min_tokens:$OSL" \
      --artifact-dir "$OUT/$label" --ui none "$@"
    summaries+=("$OUT/$label/profile_export_console.txt ($OUT/$label/profile_export_aiperf.json)")
    SEED=$((SEED + 1))
  done
done
echo "== summaries"
printf '%s\n' "${summaries[@]}"
