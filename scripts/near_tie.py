"""Where greedy SD parts from greedy AR on llama.cpp: the target's top-2 logit gap at that position, by one-token steps
(the AR path) and by one pass over the whole prefix (the multi-token path). Not part of the package."""

import json
import statistics
import sys

import torch

from draftwise.config import BenchConfig
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load
from draftwise.stages.bench import encode_prompts

torch.set_num_threads(2)
run = sys.argv[1]
cfg = json.load(open(f"{run}/config.json"))["bench"]
config = BenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()})
target = load(config.target, ModelOptions(backend="llama.cpp", gguf_quant=config.gguf_quant))
prompts, encoded = encode_prompts(config, target)
ids = {p.id: e for p, e in zip(prompts, encoded)}
recs = [json.loads(l) for l in open(f"{run}/records.jsonl")]
ar = {r["prompt_id"]: r["tokens"] for r in recs if r.get("method") == "ar"}
lm = target.lm
gaps, others = [], []
for r in recs:
    if r.get("method") != "sd" or r["tokens"] == ar.get(r["prompt_id"]):
        continue
    a, s = ar[r["prompt_id"]], r["tokens"]
    d = next(i for i, (x, y) in enumerate(zip(a, s)) if x != y)
    prefix = ids[r["prompt_id"]] + a[:d]
    lm.reset(1, len(prefix) + 8)
    lm.forward(torch.tensor([prefix[:-1]]), 0, 0)
    step = lm.forward(torch.tensor([prefix[-1:]]), len(prefix) - 1, 1)[0, -1]  # [V]
    lm.reset(1, len(prefix) + 8)
    whole = lm.forward(torch.tensor([prefix]), 0, 1)[0, -1]  # [V]
    g = float(step[a[d]] - step[s[d]])
    gaps.append(abs(g))
    top2 = step.topk(2).values
    print(
        f"{r['prompt_id']} {r['drafter'][:12]} at {d}: step logit(AR tok) - logit(SD tok) = {g:+.4f}; "
        f"top-2 gap {float(top2[0] - top2[1]):.4f}; one-pass prefers {'AR' if whole[a[d]] > whole[s[d]] else 'SD'} tok"
    )
# typical top-2 gaps along AR outputs, for scale
for pid, a in list(ar.items())[:5]:
    prefix = ids[pid]
    lm.reset(1, len(prefix) + len(a) + 8)
    out = lm.forward(torch.tensor([prefix + a[:-1]]), 0, len(a))[0]  # [T, V]
    t2 = out.topk(2, dim=-1).values
    others += (t2[:, 0] - t2[:, 1]).tolist()
print(
    f"{len(gaps)} partings: |gap| median {statistics.median(gaps):.4f}, max {max(gaps):.4f}; "
    f"top-2 gap along AR text: median {statistics.median(others):.3f}, 5th pct {sorted(others)[len(others) // 20]:.3f}"
)
