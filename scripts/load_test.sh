#!/usr/bin/env bash
# The load test of issue 30: 1, 4 and 8 concurrent clients x 16 requests (spec_bench eval prompts, 96 tokens, greedy)
# against draftwise serve (the design's answer, suffix lookup at γ 2 on lean-int8, and plain lean-int8) and llama-server
# on the shipped Q4_1 file (plain and --spec-default), each started on 127.0.0.1 with 2 threads; writes runs/load/.
# The suffix corpus is the target's own continuations of 90 train prompts (gen-data, as scripts/bench_int8.sh builds
# it). CLIENTS, REQUESTS, OUT and CORPUS (a finished gen-data folder to use instead) override, e.g. a quick check:
#   CLIENTS=1,4 REQUESTS=4 OUT=runs/load/quick scripts/load_test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DW=.venv/bin/draftwise
R=runs/load
mkdir -p $R
if [ -z "${CORPUS:-}" ]; then
  CORPUS=$R/gen-data
  $DW gen-data --target default --limit 90 --max-new-tokens 96 --threads 2 --out $CORPUS  # a rerun resumes or skips
fi
$DW load-test --target default \
  --server "serve:--target default --dtype int8 --drafter 'suffix:$CORPUS,factor=2,min_prob=0.1' --gamma 2 --threads 2" \
  --server 'serve:--target default --dtype int8 --threads 2' \
  --server llama-server \
  --server 'llama-server:--spec-default' \
  --clients "${CLIENTS:-1,4,8}" --requests "${REQUESTS:-16}" --suite spec_bench --split eval --limit 16 \
  --max-new-tokens 96 --temperature 0 --threads 2 --out "${OUT:-$R/run}"
