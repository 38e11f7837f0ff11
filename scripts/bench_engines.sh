#!/usr/bin/env bash
# The README's engine benchmarks (issue 20): verify curves, spec_bench 8x96 and every suite, per engine; writes runs/engines/
set -euo pipefail
cd "$(dirname "$0")/.."
DW=.venv/bin/draftwise
R=runs/engines
mkdir -p $R runs/gguf
[ -f runs/gguf/smol-f32.gguf ] || $DW export-gguf default --quant f32 --out runs/gguf/smol-f32.gguf
[ -f runs/gguf/smol-q8_0.gguf ] || $DW export-gguf default --quant q8_0 --out runs/gguf/smol-q8_0.gguf
$DW gen-data --target default --limit 90 --max-new-tokens 96 --threads 2 --out $R/gen-data
SUFFIX="suffix:$R/gen-data,factor=2,min_prob=0.3"
SERVER=(--baseline llama-server --baseline 'llama-server:--spec-default'
        --baseline 'llama-server:--spec-type ngram-simple' --baseline 'llama-server:--spec-type ngram-map-k'
        --baseline 'llama-server:--spec-type ngram-mod' --baseline 'llama-server:--spec-type ngram-cache')
declare -A TARGET=([f32]=runs/gguf/smol-f32.gguf [q8_0]=runs/gguf/smol-q8_0.gguf [q4_1]=default)
declare -A DQ=([f32]=f32 [q8_0]=q8_0 [q4_1]=q8_0)
for e in f32 q8_0 q4_1; do
  $DW profile --target ${TARGET[$e]} --backend llama.cpp --gguf-quant ${DQ[$e]} --depths 1,2,4,8 --gammas 1,2,3,4,6,8 \
    --batch 1 --context 256 --threads 2 --out $R/profile-$e
done
$DW profile --target default --depths 1,2,4,8 --gammas 1,2,3,4,6,8 --batch 1 --context 256 --threads 2 --out $R/profile-lean
for e in f32 q8_0 q4_1; do
  $DW bench --target ${TARGET[$e]} --backend llama.cpp --gguf-quant ${DQ[$e]} --drafter 'ngram:min=1,max=4@1' \
    --drafter 'ngram:min=1,max=4@2' --drafter "$SUFFIX@1" --drafter "$SUFFIX@2" \
    --baseline ar,llama-cpp,llama-cpp-prompt-lookup "${SERVER[@]}" \
    --limit 8 --max-new-tokens 96 --threads 2 --out $R/spec-$e
done
$DW bench --target default --drafter 'ngram:min=1,max=4@2' --drafter "$SUFFIX@2" --baseline ar \
  --limit 8 --max-new-tokens 96 --threads 2 --out $R/spec-lean
for e in f32 q8_0 q4_1; do
  $DW bench --target ${TARGET[$e]} --backend llama.cpp --gguf-quant ${DQ[$e]} --drafter 'ngram:min=1,max=4@2' \
    --drafter "$SUFFIX@2" --baseline ar,llama-cpp --baseline llama-server --baseline 'llama-server:--spec-default' \
    --suite all --limit 45 --max-new-tokens 96 --threads 2 --out $R/suites-$e
done
$DW bench --target default --drafter 'ngram:min=1,max=4@2' --drafter "$SUFFIX@2" --baseline ar \
  --suite all --limit 45 --max-new-tokens 96 --threads 2 --out $R/suites-lean
for e in f32 q8_0; do
  $DW sweep --target ${TARGET[$e]} --backend llama.cpp --gguf-quant ${DQ[$e]} --budget 7M --layers 1,2,4,8 \
    --widths 192,384,576,768 --width-depth 2 --truncations 1,2,4,8 --batch 1 --context 256 --repeats 7 --threads 2 --out $R/sweep-$e
done
# llama.cpp with an f32 KV cache and no flash attention: its multi-token passes round as its steps do
$DW bench --target ${TARGET[f32]} --backend llama.cpp --llama-exact --drafter 'ngram:min=1,max=4@2' --drafter "$SUFFIX@2" \
  --baseline ar --suite all --limit 45 --max-new-tokens 96 --threads 2 --out $R/suites-f32-exact
# where greedy SD parted from AR at Q8_0: the target's logit gap there
.venv/bin/python scripts/near_tie.py $R/suites-q8_0
