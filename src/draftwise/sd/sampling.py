"""From logits to the distribution a token is drawn from, and the draw itself.

Greedy decoding is temperature 0: its distribution is the one-hot of the argmax, so greedy and sampled decoding
share every code path (the rejection test then accepts exactly when the argmaxes agree). Randomness only comes
from the `torch.Generator` passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DraftwiseError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of most likely tokens whose mass reaches top_p

    def __post_init__(self):
        if self.temperature < 0:
            raise DraftwiseError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise DraftwiseError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature and top-p."""
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    p = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # a token is kept if the mass of those before it is < top_p
        sorted_p = sorted_p.masked_fill(mass_before >= params.top_p, 0.0)
        p = torch.zeros_like(p).scatter_(-1, order, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of [..., V] probabilities (deterministic for one-hot rows)."""
    flat = p.reshape(-1, p.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(p.shape[:-1])
