"""`layers:i,j,...`: a model made of some of another's layers (renumbered, sharing its embeddings and head)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import DraftwiseError
from .checkpoint import read_weights

PREFIX = "layers:"


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """`layers:0,29` -> [0, 29], checked against the target's depth."""
    body = spec.split(":", 1)[1]
    try:
        ids = [int(tok) for tok in body.split(",") if tok.strip()]
    except ValueError:
        raise DraftwiseError(f"bad layer list {spec!r}: expected layers:i,j,... with integers") from None
    if not ids:
        raise DraftwiseError(f"bad layer list {spec!r}: name at least one layer")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise DraftwiseError(f"bad layer list {spec!r}: the target has layers 0..{num_layers - 1}, not {bad}")
    if len(set(ids)) != len(ids):
        raise DraftwiseError(f"bad layer list {spec!r}: a layer is repeated")
    return ids


def layer_subset(config, state_dict: dict[str, torch.Tensor], ids: list[int]):
    """Config and weights of a model made of layers `ids` of another (renumbered 0..k-1), sharing its embeddings."""
    sub = config.__class__.from_dict(config.to_dict())
    sub.num_hidden_layers = len(ids)
    if getattr(sub, "layer_types", None):
        sub.layer_types = [config.layer_types[i] for i in ids]
    out = {k: v for k, v in state_dict.items() if not k.startswith("model.layers.")}
    for new, old in enumerate(ids):
        prefix = f"model.layers.{old}."
        out.update({f"model.layers.{new}.{k[len(prefix) :]}": v for k, v in state_dict.items() if k.startswith(prefix)})
    return sub, out


def checkpoint_of(spec: str, config, path: Path):
    """Config and weights of the model `layers:i,j,...` names, cut from the checkpoint at `path` (whose config is
    `config`)."""
    return layer_subset(config, read_weights(path), parse_layers(spec, config.num_hidden_layers))
