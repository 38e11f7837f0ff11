"""From logits to the distribution a token is drawn from, and the draw itself.

Greedy decoding is temperature 0: its distribution is the one-hot of the argmax, and the rejection test then accepts
exactly when the argmaxes agree (`verify.verify_greedy` is that limit, without building one-hot vectors).
Randomness only comes from the `torch.Generator` passed in.

Speed matters here: at a 49k vocabulary `torch.multinomial` takes ~1.3 ms and `torch.argmax` ~55 us on a CPU, a
few percent of a decoding step each; inverse-CDF sampling and numpy's argmax take ~0.1 ms and ~6 us.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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
        return torch.zeros_like(logits).scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    p = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p  # a token is kept if the mass of those before it is < top_p
        sorted_p = sorted_p.masked_fill(mass_before >= params.top_p, 0.0)
        p = torch.zeros_like(p).scatter_(-1, order, sorted_p)
        p = p / p.sum(-1, keepdim=True)
    return p


def sample(p: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token id per row of [..., V] probabilities, by inverting the CDF (fp64 sums: exact up to 1e-16;
    a token of probability 0 is never drawn; a one-hot row always gives its token)."""
    flat = p.reshape(-1, p.shape[-1])
    cdf = flat.double().cumsum(-1)  # [N, V]
    u = torch.rand(flat.shape[0], 1, generator=generator, dtype=torch.float64, device=p.device) * cdf[:, -1:]
    ids = torch.searchsorted(cdf, u, right=True).clamp_max_(p.shape[-1] - 1)  # first index with cdf > u
    return ids.view(p.shape[:-1])


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the first maximum over the last dimension (numpy's argmax on CPU fp32: ~10x faster than torch's)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.as_tensor(np.argmax(logits.detach().numpy(), axis=-1))
    return logits.argmax(-1)
