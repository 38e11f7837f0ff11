#!/usr/bin/env bash
# The int8 benchmarks (issue 28): verify curves per engine, lean-int8 AR and SD beside llama-server on the shipped Q4_1
# file (plain and its built-ins) and on a Q8_0 file, lean-int8 beside lean fp32 in one process, and quality against
# fp32; writes runs/int8/. About 25 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
DW=.venv/bin/draftwise
R=runs/int8
mkdir -p $R runs/gguf
[ -f runs/gguf/smol-q8_0.gguf ] || $DW export-gguf default --quant q8_0 --out runs/gguf/smol-q8_0.gguf
[ -d $R/gen-data ] || $DW gen-data --target default --limit 90 --max-new-tokens 96 --threads 2 --out $R/gen-data
SUFFIX="suffix:$R/gen-data,factor=1,min_prob=0.3"
SERVER=(--baseline llama-server --baseline 'llama-server:--spec-default'
        --baseline 'llama-server:--spec-type ngram-simple' --baseline 'llama-server:--spec-type ngram-map-k'
        --baseline 'llama-server:--spec-type ngram-mod' --baseline 'llama-server:--spec-type ngram-cache')
DRAFTERS=(--drafter "$SUFFIX@1" --drafter "$SUFFIX@2" --drafter "$SUFFIX@3" --drafter 'ngram:min=1,max=4@2'
          --drafter 'ngram:min=1,max=4@3')
# verify curves: the lean engine at int8 and fp32, llama.cpp on the Q4_1 file
$DW profile --target default --dtype int8 --depths 1 --gammas 1,2,3,4,6,8 --batch 1 --context 256 --threads 2 --out $R/profile-int8
$DW profile --target default --depths 1 --gammas 1,2,3,4,6,8 --batch 1 --context 256 --threads 2 --out $R/profile-fp32
$DW profile --target default --backend llama.cpp --gguf-quant q8_0 --depths 1 --gammas 1,2,3,4,6,8 --batch 1 --context 256 \
  --threads 2 --out $R/profile-q4_1
# lean-int8 beside llama-server on the shipped Q4_1 file: spec_bench 8 x 96, then the all-suite mix
$DW bench --target default --dtype int8 "${DRAFTERS[@]}" --baseline ar "${SERVER[@]}" --suite spec_bench --limit 8 \
  --max-new-tokens 96 --threads 2 --out $R/spec-q4_1
$DW bench --target default --dtype int8 "${DRAFTERS[@]}" --baseline ar "${SERVER[@]}" --suite all --limit 18 \
  --max-new-tokens 96 --threads 2 --out $R/suites-q4_1
# on a Q8_0 file (the same bytes per weight): lean-int8 of its weights beside llama-server on it
$DW bench --target runs/gguf/smol-q8_0.gguf --dtype int8 --drafter "$SUFFIX@2" --baseline ar,llama-server \
  --suite spec_bench --limit 8 --max-new-tokens 96 --threads 2 --out $R/spec-q8_0
# lean int8 beside lean fp32 and llama-server in one process
.venv/bin/python scripts/bench_runtimes.py --runtimes lean:fp32,lean:int8,llama-server --suite spec_bench --limit 8 \
  --out $R/runtimes
# quality: teacher-forced agreement with fp32 and NLL, beside the GGUF files in llama.cpp
$DW quality --target default --runtimes lean:int8,llama.cpp,llama.cpp:q8_0 --limit 24 --threads 2 --out $R/quality
# every option over llama-server's plain decoding of the same file (paired 95 % intervals)
for r in spec-q4_1 suites-q4_1 spec-q8_0; do .venv/bin/python scripts/speedups.py $R/$r --over llama-server; done
.venv/bin/python scripts/speedups.py $R/spec-q4_1 --over 'llama-server:--spec-type ngram-cache'
