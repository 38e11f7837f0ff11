"""The verification step of speculative decoding (SD): which drafted tokens to keep, and which token comes next.

Glossary (names in the code follow it):
  p            the target's distribution at a position; q: the drafter's. γ (gamma): tokens drafted per round.
  round        γ draft steps + one target verify pass over the γ+1 positions they span.
  accepted     a drafted token x kept by the test u < p(x)/q(x), u ~ U(0, 1) — i.e. with probability min(1, p/q).
               Under greedy decoding p and q are one-hot, so this is exactly "the argmaxes agree".
  recovered    at the first rejection, a token drawn from norm(max(0, p - q)) (greedy: the target's argmax).
  bonus        when all γ are accepted, a token drawn from p at position γ+1.
  emitted      accepted + 1 (the recovered or bonus token): TAR is emitted tokens per round.
Each emitted token is then distributed exactly as p (Leviathan et al. 2023; Chen et al. 2023), provided q is the
distribution the draft was really sampled from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass(frozen=True)
class Verdict:
    accepted: int  # n: the first n drafted tokens are kept
    next_token: int  # recovered token (n < γ) or bonus token (n == γ)


def verify_greedy(drafts: list[int], targets: list[int]) -> Verdict:
    """The greedy limit of `verify`: drafts [γ] against the target's argmaxes [γ+1] at the same positions."""
    n = 0
    while n < len(drafts) and drafts[n] == targets[n]:
        n += 1
    return Verdict(n, targets[n])


def verify(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator) -> Verdict:
    """drafts [γ] sampled from q [γ, V]; p [γ+1, V] the target's distributions at the same positions (+ one)."""
    gamma = drafts.shape[0]
    rows = torch.arange(gamma, device=drafts.device)
    p_x, q_x = p[rows, drafts], q[rows, drafts]  # [γ]; q_x > 0 since x was drawn from q
    u = torch.rand(gamma, generator=generator, device=p.device)
    rejected = (u * q_x >= p_x).nonzero()
    n = int(rejected[0]) if len(rejected) else gamma
    if n == gamma:
        return Verdict(n, int(sample(p[gamma], generator)))
    residual = (p[n] - q[n]).clamp_min(0)  # [V]
    mass = residual.sum()
    # mass > 0 whenever a rejection happened (p(x) < q(x) leaves mass where p > q); the guard covers rounding
    dist = residual / mass if mass > 0 else p[n]
    return Verdict(n, int(sample(dist, generator)))


def verify_synthetic(gamma: int, targets: list[int], alpha: float, generator: torch.Generator) -> Verdict:
    """Synthetic acceptance (cost measurement only, NOT lossless): each of γ drafts is kept with probability α,
    independently of p and q; the next token is the target's own at the first rejection (or the bonus position).
    `targets` [γ+1] are the target's tokens at the verified positions. E[accepted] = Σ_k α^k, as for i.i.d. α."""
    u = torch.rand(gamma, generator=generator, device=generator.device).tolist()
    n = next((i for i, x in enumerate(u) if x >= alpha), gamma)
    return Verdict(n, targets[n])
