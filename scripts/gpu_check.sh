#!/usr/bin/env bash
# The GPU check: one prepared run on a GPU machine with no network and no model files (torch, transformers, pytest,
# tqdm, matplotlib and safetensors installed; draftwise runs from src/). About 5 minutes on one H200. It
#   1. runs the CUDA-marked tests;
#   2. sweeps drafter shapes with random weights at LLaMA-7B width (d=4096, 32 heads, FFN 11008), bf16: the target's
#      first 1..32 layers (latency vs depth), 5 layers at widths 1024..8192 (latency vs width), and equal-parameter
#      shapes at the budget of 5 full-width layers (the paper's depth-vs-width question);
#   3. profiles a random LLaMA-7B-shaped target with a 5-layer wide drafter and a 24-layer narrow drafter of about the
#      same non-embedding parameters, predicts tokens/s at α = 0.7 from that profile (the cost model), and benchmarks
#      both with synthetic acceptance α = 0.7 beside AR (the measured system cost);
#   4. prints a summary. Everything lands in one folder: $1, else $OUT, else runs/gpu-check.
# DRAFTWISE_GPU_CHECK=tiny runs the same steps on the CPU with tiny shapes and no tests (a dry run of this script).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-runs/gpu-check}}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$OUT_DIR"
dw() { "$PY" -m draftwise.cli "$@"; }

if [ "${DRAFTWISE_GPU_CHECK:-full}" = tiny ]; then
  DEV=(--device cpu --dtype fp32 --threads 2)
  TARGET="random:layers=8,hidden=128,heads=4,kv_heads=4,ffn=344,vocab=2000"
  WIDE=5 NARROW=8 TRUNC=1,2,4,8 WIDTHS=64,128,256 CONTEXT=128 TOKENS=16 PROMPTS=2
else
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "gpu_check: torch sees no CUDA GPU")'
  DEV=(--device cuda --dtype bf16)
  TARGET="random:"  # LLaMA-7B's shape: 32 layers, d=4096, 32 heads, FFN 11008, vocabulary 32000
  WIDE=5 NARROW=24 TRUNC=1,2,4,8,12,16,24,32 WIDTHS=1024,2048,4096,8192 CONTEXT=1024 TOKENS=128 PROMPTS=4
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$OUT_DIR/gpu.txt" || true
  set +e
  "$PY" -m pytest -q -m cuda tests -p no:cacheprovider 2>&1 | tee "$OUT_DIR/cuda_tests.txt"
  TESTS=${PIPESTATUS[0]}
  set -e
fi

# the deep-narrow drafter: NARROW layers at about WIDE full-width layers' non-embedding parameters
read -r BUDGET NARROW_SPEC < <("$PY" - "$TARGET" "$WIDE" "$NARROW" <<'EOF'
import sys
from draftwise import cost
from draftwise.shapes import Shape, shape_for_budget
from draftwise.targets import random
target, wide, narrow = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shape = Shape.of(random.llama_config(random.parse(target)))
budget = shape.layer_params() * wide
s = shape_for_budget(shape, narrow, budget)
print(budget, f"random:layers={s.layers},hidden={s.hidden},heads={s.heads},kv_heads={s.kv_heads},ffn={s.ffn},seed=2")
EOF
)
WIDE_SPEC="random:layers=$WIDE,seed=1"
echo "wide drafter: $WIDE_SPEC   narrow drafter: $NARROW_SPEC   (budget $BUDGET non-embedding parameters)"

dw sweep --target "$TARGET" "${DEV[@]}" --truncations "$TRUNC" --widths "$WIDTHS" --width-depth "$WIDE" \
  --budget "$BUDGET" --layers "$WIDE,$NARROW" --context "$CONTEXT" --batch 1 --memory 120GiB --warmup 5 --repeats 20 \
  --out "$OUT_DIR/sweep"
dw profile --target "$TARGET" "${DEV[@]}" --drafter "$WIDE_SPEC" --drafter "$NARROW_SPEC" --depths "" \
  --gammas 1,2,3,4,6,8 --batch 1 --context 256 --warmup 5 --repeats 20 --out "$OUT_DIR/profile"
dw predict --profile "$OUT_DIR/profile" --alpha 0.7 --out "$OUT_DIR/predict.json"
dw bench --target "$TARGET" "${DEV[@]}" --drafter "$WIDE_SPEC" --drafter "$NARROW_SPEC" --gamma 2,4 \
  --synthetic-alpha 0.7 --limit "$PROMPTS" --max-new-tokens "$TOKENS" --baseline ar --warmup 1 --out "$OUT_DIR/bench"

"$PY" - "$OUT_DIR" <<'EOF' | tee "$OUT_DIR/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
sweep = json.loads((out / "sweep" / "sweep.json").read_text())
print("machine:", sweep["machine"])
rows = sweep["rows"]
depth = sorted((r["shape"]["layers"], r["step_ms"]) for r in rows if r["family"] == "truncation")
print("step ms vs layers at full width:", ", ".join(f"{k}L {ms:.2f}" for k, ms in depth))
width = sorted((r["shape"]["hidden"], r["step_ms"]) for r in rows if r["family"] == "width")
print("step ms vs width at 5 layers:", ", ".join(f"d{d} {ms:.2f}" for d, ms in width))
eq = sorted((r["shape"]["layers"], r["label"], r["step_ms"]) for r in rows if r["family"] == "equal_budget")
print("equal budget:", "; ".join(f"{label}: {ms:.2f} ms" for _, label, ms in eq))
if len(eq) == 2:
    print(f"deep / wide step at equal parameters: {eq[1][2] / eq[0][2]:.2f}x (paper, 1.3B drafters: 13.13 / 6.69 = 1.96x)")
for line in sweep["findings"]:
    print(line)
predicted = {(r["drafter"], r["gamma"]): r["tokens_per_s"] for r in json.loads((out / "predict.json").read_text())["rows"]}
grid = json.loads((out / "bench" / "grid.json").read_text())
for p in grid["points"]:
    ar = p["baselines"]["ar"]["tokens_per_s"]
    print(f"bench α=0.7 {p['drafter']} γ={p['gamma']}: SD {p['tokens_per_s']:.1f} tok/s, AR {ar:.1f}, "
          f"×{p['speedup_vs_ar']:.2f}, TAR {p['tar']:.2f}, draft step {p['draft_step_ms']:.2f} ms, verify {p['verify_ms']:.2f} ms; "
          f"cost model {predicted.get((p['drafter'], p['gamma']), float('nan')):.1f} tok/s")
EOF
echo "gpu_check: results in $OUT_DIR"
exit "${TESTS:-0}"
