#!/usr/bin/env bash
# The load test of issues 30 and 39: 1, 2, 4, 8 and 16 concurrent clients x 16 requests (spec_bench eval prompts, 96
# tokens, greedy) against draftwise serve (the design's answer, suffix lookup at γ 2 on lean-int8: its continuous batch
# of 8 with γ priced per batch size, and one request at a time as before) and llama-server on the shipped Q4_1 file
# (plain and --spec-default, -np = clients), each started on 127.0.0.1 with 2 threads; writes runs/load/.
# MIXED=1: a mixed workload instead — the 8 shortest and 8 longest spec_bench eval prompts, alternating, asking for
# 32, 64, 128 and 256 new tokens in turn (runs/load/mixed.jsonl, each line's max_tokens).
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
PROMPTS=(--suite spec_bench --split eval --limit 16)
if [ -n "${MIXED:-}" ]; then
  .venv/bin/python - "$R/mixed.jsonl" <<'PY'
import json, sys
from draftwise import data
by_length = sorted(data.load_prompts("spec_bench", "eval"), key=lambda p: len(p.text))
picked = [p for pair in zip(by_length[:8], by_length[::-1][:8]) for p in pair]
with open(sys.argv[1], "w") as f:
    for i, p in enumerate(picked):
        f.write(json.dumps({"id": p.id, "prompt": p.text, "max_tokens": (32, 64, 128, 256)[i % 4]}) + "\n")
PY
  PROMPTS=(--prompts "$R/mixed.jsonl")
fi
SUFFIX="suffix:$CORPUS,factor=2,min_prob=0.1"
$DW load-test --target default \
  --server "serve:--target default --dtype int8 --drafter '$SUFFIX' --gamma 2 --threads 2" \
  --server "serve:--target default --dtype int8 --drafter '$SUFFIX' --gamma 2 --threads 2 --max-batch 1" \
  --server llama-server \
  --server 'llama-server:--spec-default' \
  --clients "${CLIENTS:-1,2,4,8,16}" --requests "${REQUESTS:-16}" "${PROMPTS[@]}" \
  --max-new-tokens 96 --temperature 0 --threads 2 --out "${OUT:-$R/run}"
