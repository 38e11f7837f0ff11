#!/usr/bin/env bash
# The README's round-scheduler benchmarks (issue 21): on each engine and temperature, the suffix drafter at γ = 1, 2
# and 6, each static and with the round scheduler (priced by that engine's profile), beside AR, on 2 eval prompts of
# every suite. Needs the runs of scripts/bench_engines.sh (profiles, the gen-data corpus, the GGUF copies).
set -euo pipefail
cd "$(dirname "$0")/.."
DW=.venv/bin/draftwise
R=runs/engines
SUFFIX="suffix:$R/gen-data,factor=2,min_prob=0.3"
run() {  # engine-name, then the target/engine arguments
  local name=$1; shift
  $DW bench "$@" --drafter "$SUFFIX@1" --drafter "$SUFFIX@2" --drafter "$SUFFIX@6" --schedule $R/profile-$name \
    --baseline ar --temperature 0,0.5,1 --suite all --limit 18 --max-new-tokens 96 --threads 2 --out runs/schedule/$name
}
run lean --target default
run q8_0 --target runs/gguf/smol-q8_0.gguf --backend llama.cpp --gguf-quant q8_0
run f32 --target runs/gguf/smol-f32.gguf --backend llama.cpp --gguf-quant f32
