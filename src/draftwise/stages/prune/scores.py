"""Importance scores on calibration data, all measured against the target's own distribution p.

teacher      log p at every scored position of the calibration batches (positions that predict a target token)
layers       greedy elimination: drop, step by step, the layers whose removal raises the divergence of q (the
             remaining stack's output) from p the least — TVD by default (1 − TVD is sampled SD's acceptance rate,
             and being bounded, a few hopeless positions cannot dominate it as they can KL), or KL. Scoring end to
             end minds what a per-layer similarity (1 − cos of a block's input and output) misses: the last layer
             feeds the final norm and head, so an early layer plus the last one can be a poor pair. The cosine
             block influence is recorded beside it.
units        first-order Taylor scores |∂KL/∂z| of every head, FFN channel and hidden dimension mask at z = 1, on the
             model of the kept layers: the loss change expected from removing each unit.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ...continuations import Sequence, batches
from ...targets.layers import layer_subset
from .masks import MaskedLM, Masks

Batch = tuple[torch.Tensor, list[int], torch.Tensor, int]


def teacher(lm, seqs: list[Sequence], batch_size: int) -> list[tuple[Batch, torch.Tensor]]:
    """Calibration batches with the target's log-probabilities at their scored positions [N_scored, V] (bf16)."""
    out = []
    for ids, start, scored, n in batches(seqs, batch_size):
        lm.reset(ids.shape[0], ids.shape[1])
        logits = lm.forward(ids, 0, n, start)  # [B, n, V]
        out.append(((ids, start, scored, n), F.log_softmax(logits[scored].float(), -1).to(torch.bfloat16)))
    return out


def kl(log_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p || q) = Σ p (log p − log q); log_p [N, V], logits_q [N, V]."""
    log_p = log_p.float()
    return (log_p.exp() * (log_p - F.log_softmax(logits_q.float(), -1))).sum(-1).mean()


def tvd(log_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Mean over positions of TVD(p, q) = ½ Σ |p − q|."""
    return 0.5 * (log_p.float().exp() - F.softmax(logits_q.float(), -1)).abs().sum(-1).mean()


CRITERIA = {"kl": kl, "tvd": tvd}


def _mask(T: int, start: list[int]) -> torch.Tensor:
    """[B, 1, T, T]: causal, each row's keys from its first real token (a padding query sees itself)."""
    keys = torch.arange(T)
    return (keys <= keys[:, None])[None, None] & (
        (keys >= torch.tensor(start)[:, None, None, None]) | (keys == keys[:, None])
    )


def _layer(lean, index: int, x: torch.Tensor, mask: torch.Tensor, start: list[int]) -> torch.Tensor:
    """One lean layer over a whole left-padded batch from position 0, with a scratch KV cache."""
    B, T, _ = x.shape
    layer = lean.layers[index]
    if layer.window is not None:  # a sliding-window layer also hides keys older than its window
        keys = torch.arange(T)
        mask = mask & ((keys > keys[:, None] - layer.window) | (keys == keys[:, None]))
    k = torch.zeros(B, lean.shape.num_kv_heads, T, lean.shape.head_dim, dtype=x.dtype)
    return layer(x, lean.rotations(T)[layer.rope_key], k, torch.zeros_like(k), 0, mask, start)


def _stack_loss(lean, layers: list[int], calib, criterion, skip: int | None = None, cache: dict | None = None) -> float:
    """Divergence from p of the target's layer stack `layers` (without position `skip`), reusing hidden states
    cached at each layer's input when given (a removal only changes what comes after it)."""
    total, count = 0.0, 0
    for b, ((ids, start, scored, n), log_p) in enumerate(calib):
        mask = _mask(ids.shape[1], start)
        resume = cache is not None and skip is not None
        x = cache[b][skip] if resume else lean.embed_tokens(ids)
        for idx in range(skip if resume else 0, len(layers)):
            if idx == skip:
                continue
            if cache is not None and skip is None:
                cache[b][idx] = x
            x = _layer(lean, layers[idx], x, mask, start)
        logits = lean.logits(x[:, -n:])[scored]
        total += float(criterion(log_p, logits)) * len(log_p)
        count += len(log_p)
    return total / count


def eliminate_layers(
    lean, n_keep: int, calib, log: Callable[[dict], None], kept: list[int] | None = None, criterion: str = "tvd"
) -> list[int]:
    """Greedy backward elimination to `n_keep` layers; removes ~1/4 of the surplus per step (at least one)."""
    loss = CRITERIA[criterion]
    kept = list(kept or range(lean.shape.num_layers))
    steps = 0
    with (
        torch.inference_mode(),
        tqdm(
            total=len(kept) - n_keep, desc="layer elimination", unit="layer", file=sys.stderr, dynamic_ncols=True
        ) as bar,
    ):
        while len(kept) > n_keep:
            cache = [dict() for _ in calib]
            base = _stack_loss(lean, kept, calib, loss, cache=cache)
            values = [_stack_loss(lean, kept, calib, loss, skip=i, cache=cache) for i in range(len(kept))]
            drop = max(1, (len(kept) - n_keep) // 4)
            order = sorted(range(len(kept)), key=lambda i: (values[i], i))[:drop]
            removed = [kept[i] for i in order]
            log(
                {
                    "event": "eliminate",
                    "step": steps,
                    "criterion": criterion,
                    "kept_before": kept,
                    "before": base,
                    "without": dict(zip(kept, values)),
                    "removed": removed,
                }
            )
            kept = [l for l in kept if l not in removed]
            steps += 1
            bar.update(len(removed))
    return kept


def block_influence(lean, calib) -> list[float]:
    """1 − mean cos(h_in, h_out) of each layer over scored positions (Men et al., ShortGPT), full target stack."""
    out = torch.zeros(lean.shape.num_layers)
    count = 0
    with torch.inference_mode():
        for (ids, start, scored, n), _ in calib:
            mask = _mask(ids.shape[1], start)
            x = lean.embed_tokens(ids)
            for i in range(len(lean.layers)):
                y = _layer(lean, i, x, mask, start)
                out[i] += F.cosine_similarity(x[:, -n:][scored], y[:, -n:][scored], dim=-1).sum()
                x = y
            count += int(scored.sum())
    return (1 - out / count).tolist()


def taylor_scores(config, state_dict: dict[str, torch.Tensor], layers: list[int], calib) -> Masks:
    """|∂KL/∂z| summed over calibration batches for head, intermediate and hidden masks of the kept-layer model,
    returned in the target's numbering (rows of dropped layers are 0)."""
    sub_config, sub_sd = layer_subset(config, state_dict, layers)
    model = MaskedLM(sub_config, sub_sd)
    masks = Masks.ones(sub_config, requires_grad=True)
    grads = {name: torch.zeros_like(t) for name, t in masks.items()}
    for (ids, start, scored, n), log_p in tqdm(
        calib, desc="taylor scores", unit="batch", file=sys.stderr, dynamic_ncols=True
    ):
        # MaskedLM is causal without a padding mask, so each row runs unpadded; logit j of the batch's last n
        # sits at row position T - n + j - start[b]
        T = ids.shape[1]
        for b in range(ids.shape[0]):
            positions = [T - n + j - start[b] for j in range(n) if scored[b, j]]
            logits = model(ids[b : b + 1, start[b] :], masks)[0, positions]
            rows = slice(int(scored[:b].sum()), int(scored[: b + 1].sum()))
            loss = kl(log_p[rows], logits)
            loss.backward()
            for name, t in masks.items():
                grads[name] += t.grad.abs()
                t.grad = None
    full = Masks.ones(config)
    for name, t in full.items():
        t.zero_()
        if name == "hidden":
            t += grads[name]
        elif name != "layer":
            t[layers] = grads[name]
    return full


def describe_scores(masks: Masks) -> dict:
    return {
        name: [round(float(v), 6) for v in t.flatten()]
        if t.dim() == 1
        else [[round(float(v), 6) for v in row] for row in t]
        for name, t in masks.items()
        if name != "layer"
    }
