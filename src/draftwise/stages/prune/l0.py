"""L0 pruning as in Sheared-LLaMA (Xia et al. 2024): a hard-concrete gate per prunable unit (Louizos et al. 2018)
and a Lagrangian that drives the expected shape to exactly the requested one.

For each dimension (layer, head, intermediate, hidden) a log α per unit; a training step samples gates
z = clamp(sigmoid((log u − log(1 − u) + log α) / β)·(ζ − γ) + γ, 0, 1) and minimises
    KL(p || q_z) + Σ_dim λ1 (ŝ − t) + λ2 (ŝ − t)²
where ŝ is the dimension's expected size (Σ P(z > 0), per layer for heads and channels), t its target and λ1, λ2 are
trained by gradient ascent, so the constraint tightens until it holds. The weights stay frozen here (a CPU-budget
choice): the masks find which units to keep, and distillation then trains the sliced model.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable

import torch
from tqdm import tqdm

from .masks import MaskedLM, Masks
from .scores import kl
from .slicing import PruneShape

BETA, GAMMA, ZETA = 2 / 3, -0.1, 1.1


class HardConcrete(torch.nn.Module):
    def __init__(self, size: tuple[int, ...], init: float = 1.0):
        super().__init__()
        self.log_alpha = torch.nn.Parameter(torch.full(size, init))

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(self.log_alpha.shape, generator=generator).clamp(1e-6, 1 - 1e-6)
        s = torch.sigmoid((u.log() - (-u).log1p() + self.log_alpha) / BETA)
        return (s * (ZETA - GAMMA) + GAMMA).clamp(0, 1)

    def p_open(self) -> torch.Tensor:
        """P(z > 0) per unit."""
        return torch.sigmoid(self.log_alpha - BETA * math.log(-GAMMA / ZETA))


def expected_sizes(gates: dict[str, HardConcrete]) -> dict[str, torch.Tensor]:
    return {
        "layer": gates["layer"].p_open().sum(),
        "head": gates["head"].p_open().sum(-1).mean(),
        "intermediate": gates["intermediate"].p_open().sum(-1).mean(),
        "hidden": gates["hidden"].p_open().sum(),
    }


def train(
    config,
    state_dict,
    shape: PruneShape,
    calib,
    steps: int,
    log: Callable[[dict], None],
    seed: int = 0,
    lr: float = 0.2,
    lambda_lr: float = 2.0,
) -> dict[str, torch.Tensor]:
    """Trains the gates on the calibration batches (one row per step, cycling); returns log α per dimension.

    Gates start open with P(z > 0) ≈ 0.9 (log α = 1) and move at most `lr` per step (Adam), so a gate can close in
    ~15 steps: a CPU budget of tens of steps, where Sheared-LLaMA runs thousands with trainable weights."""
    model = MaskedLM(config, state_dict)
    full = Masks.ones(config)
    gates = {name: HardConcrete(tuple(t.shape)) for name, t in full.items()}
    targets = {"layer": shape.layers, "head": shape.heads, "intermediate": shape.ffn, "hidden": shape.hidden}
    scale = {name: float(t.shape[-1]) for name, t in full.items()}
    lambdas = torch.nn.Parameter(torch.zeros(4, 2))  # (λ1, λ2) per dimension
    opt = torch.optim.Adam([g.log_alpha for g in gates.values()], lr=lr)
    opt_lambda = torch.optim.SGD([lambdas], lr=lambda_lr, maximize=True)
    gen = torch.Generator().manual_seed(seed)
    rows = [(b, r) for b, ((ids, _, _, _), _) in enumerate(calib) for r in range(ids.shape[0])]
    for step in tqdm(range(steps), desc="L0 masks", unit="step", file=sys.stderr, dynamic_ncols=True):
        b, r = rows[step % len(rows)]
        (ids, start, scored, n), log_p = calib[b]
        T = ids.shape[1]
        positions = [T - n + j - start[r] for j in range(n) if scored[r, j]]
        sel = slice(int(scored[:r].sum()), int(scored[: r + 1].sum()))
        masks = Masks(**{name: g.sample(gen) for name, g in gates.items()})
        distill = kl(log_p[sel], model(ids[r : r + 1, start[r] :], masks)[0, positions])
        sizes = expected_sizes(gates)
        gaps = torch.stack([(sizes[k] - targets[k]) / scale[k] for k in targets])  # relative: every dimension alike
        lagrangian = (lambdas[:, 0] * gaps + lambdas[:, 1] * gaps**2).sum()
        opt.zero_grad()
        opt_lambda.zero_grad()
        (distill + lagrangian).backward()
        opt.step()
        opt_lambda.step()
        log(
            {
                "event": "l0",
                "step": step,
                "kl": float(distill),
                "lagrangian": float(lagrangian),
                **{f"expected_{k}": round(float(v), 2) for k, v in sizes.items()},
            }
        )
    return {name: g.log_alpha.detach().clone() for name, g in gates.items()}
