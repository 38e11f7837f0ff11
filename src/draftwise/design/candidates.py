"""The drafters `design` compares: candidates it builds (pruned, then distilled) and baselines it takes as they are.

trained shapes     chosen before any training from the sweep's fitted step model (`choose_shapes`): the predicted-
                   fastest shape at the parameter budget, and its equal-parameter opposite as the control — the
                   full-width (wide-shallow) shape when the fastest is narrower, else the deep-narrow twin.
                   `--wide-layers k` overrides: k full-width layers and their deep-narrow twin, as the paper draws them;
                   a target that cannot train here (a q4 study) has them cut from its sibling instead (`cuts`)
wide-shallow       k layers of the target at full width (the paper's recommendation)
deep-narrow        the same non-embedding parameters spread over f·k layers of 1/f width (heads, KV heads, FFN ÷ f)
self-speculative   the target with its middle half skipped, no training (Draft & Verify / LayerSkip style)
first-k            the target's first k layers, untrained (what naive truncation gives)
feature            a feature-level drafter (EAGLE-style head on the target's features, `runtimes.lean.feature_head`),
                   trained on the teacher data
family             a small model of the target's tokenizer family, taken as it is: the packaged default model
                   (SmolLM2-135M-Instruct) where it speaks the target's vocabulary and the target is at least
                   FAMILY_RATIO × its size — the pairing people run (a 135M drafting for a 1.7B)
user               a drafter the user names, benchmarked as it is
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .. import cost
from ..errors import DraftwiseError
from ..shapes import Shape, shape_for_budget

FEATURE = "feature"  # the role (and name) of the feature-level candidate
FAMILY = "family"  # the role of the family's small model
FAMILY_RATIO = 2.0  # a target this many times the small model's non-embedding parameters gets it as a candidate


@dataclass(frozen=True)
class Candidate:
    name: str  # folder-safe: wide-L2, narrow-L6, self-spec, first-2, user
    role: str  # wide-shallow | deep-narrow | self-speculative | first-k | feature | family | user
    shape: Shape | None = None  # pruned candidates: the exact shape to carve out
    spec: str = ""  # drafters taken as they are: layers:i,j,... of the target or a checkpoint
    source: str = ""  # pruned candidates: the model the shape is cut from ("" the target; a sibling: `cuts`)

    @property
    def trained(self) -> bool:
        """Pruned out of the target and distilled by `design` (the others are benchmarked as they are)."""
        return self.shape is not None

    def prune_shape(self) -> str:
        s = self.shape
        return f"layers={s.layers},hidden={s.hidden},heads={s.heads},kv_heads={s.kv_heads},ffn={s.ffn}"


def narrow_twin(target: Shape, layers: int, factor: int) -> Shape | None:
    """A shape with `factor`× the layers of a full-width `layers`-deep drafter and about its non-embedding parameters.

    Heads, KV heads and FFN shrink by `factor` when the KV heads divide evenly (GQA groups stay intact); otherwise
    the FFN alone shrinks until a layer holds 1/factor of the parameters. None when the target is too shallow."""
    if target.heads % factor == 0 and target.kv_heads % factor == 0:
        narrow = replace(
            target,
            layers=layers * factor,
            heads=target.heads // factor,
            kv_heads=target.kv_heads // factor,
            ffn=target.ffn // factor,
        )
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


def budget_shapes(target: Shape, budget: int) -> list[Shape]:
    """A shape of `budget` non-embedding parameters at every depth below the target's where one exists inside the
    target (pruning cannot make a dimension larger: a shallower shape that would need more width is left out)."""
    out = []
    for layers in range(1, target.layers):
        try:
            s = shape_for_budget(target, layers, budget)
        except DraftwiseError:
            break  # deeper shapes only get narrower than the narrowest head layout
        if s.hidden <= target.hidden and s.heads <= target.heads and s.ffn <= target.ffn:
            out.append(s)
    return out


def choose_shapes(target: Shape, budget: int, model: cost.StepModel, factor: int) -> tuple[Shape, Shape]:
    """(the shape the fitted step model predicts fastest at the budget, its equal-parameter control): the control of a
    full-width shape is its deep-narrow twin, that of a narrower shape the full-width one."""
    fastest = min(budget_shapes(target, budget), key=model.predict_ms)
    if fastest.hidden == target.hidden:
        control = narrow_twin(target, fastest.layers, factor)
        if control is None:  # too deep to triple: the widest shape at the budget instead
            control = budget_shapes(target, budget)[0]
    else:
        control = replace(target, layers=max(1, round(budget / target.layer_params())))
    return fastest, control


def trained(target: Shape, shapes: list[Shape]) -> list[Candidate]:
    """Named by width and depth; the shallower of a pair is the wide-shallow one."""
    out = []
    for s in sorted(shapes, key=lambda s: s.layers):
        wide = s.hidden == target.hidden and s.heads == target.heads
        role = "wide-shallow" if s is min(shapes, key=lambda x: x.layers) else "deep-narrow"
        out.append(Candidate(f"{'wide' if wide else 'narrow'}-L{s.layers}", role, s))
    return out


def candidates(
    target: Shape,
    wide_layers: tuple[int, ...],
    factor: int,
    user: str | None = None,
    shapes: tuple[Shape, Shape] | None = None,
    feature: bool = False,
    family: tuple[str, str] | None = None,
) -> list[Candidate]:
    """The trained shapes (`shapes` chosen by the cost model, else k full-width layers and their twin per k of
    `wide_layers`), then the untrained baselines (first-k at the shallower depth, self-speculative), the feature-level
    head (`feature`), the family's small model (`family`: its name and spec) and the user's."""
    out = []
    if shapes is not None:
        out += trained(target, list(shapes))
    for k in wide_layers if shapes is None else ():
        if k >= target.layers:
            continue
        out.append(Candidate(f"wide-L{k}", "wide-shallow", replace(target, layers=k)))
        narrow = narrow_twin(target, k, factor)
        if narrow is not None:
            out.append(Candidate(f"narrow-L{narrow.layers}", "deep-narrow", narrow))
    k = min(x.shape.layers for x in out) if out else min(wide_layers or (2,))
    out.append(Candidate(f"first-{k}", "first-k", spec="layers:" + ",".join(map(str, range(min(k, target.layers))))))
    if target.layers >= 4:
        out.append(
            Candidate(
                "self-spec",
                "self-speculative",
                spec="layers:" + ",".join(map(str, self_speculative_layers(target.layers))),
            )
        )
    if feature:
        out.append(Candidate(FEATURE, FEATURE))
    if family and family[1] != user:
        out.append(Candidate(family[0], FAMILY, spec=family[1]))
    if user:
        out.append(Candidate("user", "user", spec=user))
    return out


def family_drafter(target: Shape, small: Shape, same_vocabulary: bool) -> bool:
    """Whether the family's small model (`small`) drafts for `target`: the same vocabulary, and a target at least
    FAMILY_RATIO × its size (non-embedding parameters)."""
    size = target.layers * target.layer_params()
    return same_vocabulary and size >= FAMILY_RATIO * small.layers * small.layer_params()
