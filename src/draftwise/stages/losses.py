"""Distillation losses between the target's distribution p and the drafter's q, on the target's top-k support.

gen-data stores p's k most likely tokens; every loss is computed on k + 1 bins — those k tokens and "the rest"
(p_rest = 1 − Σ p_k, q_rest = 1 − Σ q_k) — which is exact when k covers the vocabulary and otherwise a coarsening
that never hides mass q puts outside the target's top-k.
  fkl   Σ p log(p / q)                       forward KL: mass-covering
  rkl   Σ q log(q / p)                       reverse KL: mode-seeking
  tvd   ½ Σ |p − q| = 1 − Σ min(p, q)       total variation: 1 − TVD is the acceptance rate α of sampled SD
  jsd   ½ KL(p ‖ m) + ½ KL(q ‖ m), m = (p + q) / 2
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import LOSSES

EPS = 1e-8


def binned(
    topk_ids: torch.Tensor, topk_probs: torch.Tensor, student_logits: torch.Tensor, to_draft: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """p and q on k+1 bins: topk_ids/topk_probs [N, k], student_logits [N, V] -> ([N, k+1], [N, k+1]).

    `to_draft` [target vocab] maps a target id to its row of a reduced head (-1: not in it) when the student's
    logits are over a draft vocabulary: a target token the head cannot emit keeps its bin at q = 0, as in SD."""
    q = F.softmax(student_logits.float(), -1)
    if to_draft is None:
        return with_rest(topk_probs.float()), with_rest(q.gather(-1, topk_ids))
    rows = to_draft[topk_ids]
    q_k = q.gather(-1, rows.clamp_min(0)) * (rows >= 0)
    return with_rest(topk_probs.float()), with_rest(q_k)


def with_rest(top: torch.Tensor) -> torch.Tensor:
    """Probabilities of k tokens [N, k] and the "rest" bin: [N, k+1]."""
    return torch.cat([top, (1 - top.sum(-1, keepdim=True)).clamp_min(0)], -1)


def divergence(name: str, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Per-position divergence [N] between distributions p, q [N, bins]."""
    if name == "fkl":
        return (p * (torch.log(p + EPS) - torch.log(q + EPS))).sum(-1)
    if name == "rkl":
        return (q * (torch.log(q + EPS) - torch.log(p + EPS))).sum(-1)
    if name == "tvd":
        return 0.5 * (p - q).abs().sum(-1)
    if name == "jsd":
        m = 0.5 * (p + q)
        return 0.5 * (p * (torch.log(p + EPS) - torch.log(m + EPS))).sum(-1) + 0.5 * (
            q * (torch.log(q + EPS) - torch.log(m + EPS))
        ).sum(-1)
    raise ValueError(f"unknown loss {name!r}: choose from {', '.join(LOSSES)}")


def loss(
    name: str, topk_ids: torch.Tensor, topk_probs: torch.Tensor, student_logits: torch.Tensor, to_draft=None
) -> torch.Tensor:
    """Mean divergence over positions."""
    return divergence(name, *binned(topk_ids, topk_probs, student_logits, to_draft)).mean()
