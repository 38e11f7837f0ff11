"""The drafters `design` compares: candidates it builds (pruned, then distilled) and baselines it takes as they are.

  wide-shallow       k layers of the target at full width (the paper's recommendation)
  deep-narrow        the same non-embedding parameters spread over f·k layers of 1/f width (heads, KV heads, FFN ÷ f)
  self-speculative   the target with its middle half skipped, no training (Draft & Verify / LayerSkip style)
  first-k            the target's first k layers, untrained (what naive truncation gives)
  user               a drafter the user names, benchmarked as it is
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ... import cost


@dataclass(frozen=True)
class Candidate:
    name: str  # folder-safe: wide-L2, narrow-L6, self-spec, first-2, user
    role: str  # wide-shallow | deep-narrow | self-speculative | first-k | user
    shape: cost.Shape | None = None  # pruned candidates: the exact shape to carve out
    spec: str = ""  # drafters taken as they are: layers:i,j,... of the target or a checkpoint

    @property
    def trained(self) -> bool:
        """Pruned out of the target and distilled by `design` (the others are benchmarked as they are)."""
        return self.shape is not None

    def prune_shape(self) -> str:
        s = self.shape
        return f"layers={s.layers},hidden={s.hidden},heads={s.heads},kv_heads={s.kv_heads},ffn={s.ffn}"


def narrow_twin(target: cost.Shape, layers: int, factor: int) -> cost.Shape | None:
    """A shape with `factor`× the layers of a full-width `layers`-deep drafter and about its non-embedding parameters.

    Heads, KV heads and FFN shrink by `factor` when the KV heads divide evenly (GQA groups stay intact); otherwise
    the FFN alone shrinks until a layer holds 1/factor of the parameters. None when the target is too shallow."""
    if target.heads % factor == 0 and target.kv_heads % factor == 0:
        narrow = replace(target, layers=layers * factor, heads=target.heads // factor,
                         kv_heads=target.kv_heads // factor, ffn=target.ffn // factor)
    else:
        attention = target.layer_params() - 3 * target.hidden * target.ffn
        ffn = (target.layer_params() // factor - attention) // (3 * target.hidden)
        if ffn < 1:
            return None
        narrow = replace(target, layers=layers * factor, ffn=ffn)
    return narrow if narrow.layers <= target.layers else None


def self_speculative_layers(n_layers: int) -> list[int]:
    """The first and last quarter of the target's layers (the middle half skipped)."""
    keep = max(1, math.ceil(n_layers / 4))
    return sorted(set(range(keep)) | set(range(n_layers - keep, n_layers)))


def candidates(target: cost.Shape, wide_layers: tuple[int, ...], factor: int, user: str | None = None) -> list[Candidate]:
    out = []
    for k in wide_layers:
        if k >= target.layers:
            continue
        out.append(Candidate(f"wide-L{k}", "wide-shallow", replace(target, layers=k)))
        narrow = narrow_twin(target, k, factor)
        if narrow is not None:
            out.append(Candidate(f"narrow-L{narrow.layers}", "deep-narrow", narrow))
    k = min(wide_layers)
    out.append(Candidate(f"first-{k}", "first-k", spec="layers:" + ",".join(map(str, range(min(k, target.layers))))))
    if target.layers >= 4:
        out.append(Candidate("self-spec", "self-speculative",
                             spec="layers:" + ",".join(map(str, self_speculative_layers(target.layers)))))
    if user:
        out.append(Candidate("user", "user", spec=user))
    return out
