"""`draftwise train-feature`: train a feature-level drafter (`runtimes.lean.feature_head`) on a `draftwise teacher`
folder.

Training pairs come straight from the teacher's shards, position by position (the head reads one feature and one
token, so a batch is `batch_size` positions drawn from every sequence, not whole sequences). Scored position j of a
row sits at p = prompt_len − 1 + j, holds the target's feature f_p (`hidden[j]`) and its top-k over x_{p+1}. A
training start j unrolls `unroll` draft steps along the true text: step u reads a feature (f_p itself at u = 0, the
head's own estimate after — EAGLE's robustness to its own features) and x_{p+u+1}, and is scored against the
target's top-k at j+u+1 (over x_{p+u+2}) and its feature f_{p+u+1}:

    loss = mean over steps of  divergence(top-k on the draft vocabulary, head)  +  feature_weight · smoothL1(\\hat f, f)

The divergence is `stages.losses`' on k+1 bins with the teacher's ids mapped through d2t: mass on ids outside the
draft vocabulary joins the "rest" bin, which no draft token can cover. Forward KL by default: a head trained from
scratch needs a gradient on every bin (it is EAGLE's cross-entropy against soft targets). The feature term is
weighted 0.1: EAGLE-1 weighted it 1.0 against 0.1 cross-entropy because regression was its only multi-step signal;
here the unrolled steps' token losses train the estimate for exactly what it is used for, so the regression only
keeps the estimate near the target's features (EAGLE-3 drops it altogether).

Held-out evaluation (records `eval`): the target's greedy continuations of `eval` prompts (eval.jsonl) and its
features over them, teacher-forced once (eval_features.safetensors). agreement: the head's first draft step (the
target's feature at P−2 and the true token at P−1) picks the target's greedy token at P, over continuation positions.
tar_gamma4: greedy SD rounds of γ = 4 replayed over each continuation (`agree.replay_rounds`), each round's drafts
unrolled from the target's feature at its start along the head's own features — what a greedy SD run drafts there.
Resumable: state/ holds the weights and optimizer state with the step counters; the data order is a function of
(seed, step), so a resumed run redoes the same steps. The head lands in checkpoint/ (`feature:RUN` loads it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .. import continuations
from ..config import TrainFeatureConfig
from ..errors import DraftwiseError
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.lean import feature_head as fh
from ..runtimes.registry import load
from ..sd.families.feature import FeatureDrafter, target_features
from ..shards import load_rows
from ..targets.fingerprint import fingerprint
from . import losses
from .agree import feature_score
from .budget import Budget, Log

GAMMA = 4  # the lookahead of the recorded TAR


class Positions:
    """The teacher's scored positions flattened: features f [M, D] (bf16, as stored), the token each position's
    distribution is over (x_{p+1}) [M], the top-k in draft-vocabulary indices [M, k] (probability 0 off the draft
    vocabulary), and the starts that have `unroll` more positions in their row."""

    def __init__(self, rows: list[dict], d2t: torch.Tensor, vocab_size: int, unroll: int):
        t2d = torch.full((vocab_size,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(len(d2t))
        self.features = torch.cat([r["hidden"].to(torch.bfloat16) for r in rows])
        self.next_token = torch.cat([r["tokens"][r["prompt_len"] :] for r in rows])
        ids = t2d[torch.cat([r["topk_ids"] for r in rows])]
        self.topk_probs = torch.cat([r["topk_probs"] for r in rows]).masked_fill(ids < 0, 0.0)
        self.topk_ids = ids.clamp_min(0)
        starts, offset = [], 0
        for r in rows:
            c = len(r["topk_ids"])
            starts.append(torch.arange(offset, offset + max(0, c - unroll)))
            offset += c
        self.starts = torch.cat(starts)
        if not len(self.starts):
            raise DraftwiseError(f"no teacher row has more than {unroll} scored positions: lower --unroll")
        self._perm: tuple[int, torch.Tensor] | None = None

    def batch(self, step: int, batch_size: int, seed: int) -> torch.Tensor:
        """Start indices of a step: a fresh permutation of the starts per epoch, fixed by the seed (resumable)."""
        n, first, out = len(self.starts), step * batch_size, []
        while sum(map(len, out)) < batch_size:
            epoch, offset = divmod(first + sum(map(len, out)), n)
            if self._perm is None or self._perm[0] != epoch:
                gen = torch.Generator().manual_seed(seed * 7919 + epoch)
                self._perm = (epoch, torch.randperm(n, generator=gen))
            out.append(self._perm[1][offset : offset + batch_size - sum(map(len, out))])
        return self.starts[torch.cat(out)]


def draft_loss(name: str, topk_ids, topk_probs, logits: torch.Tensor) -> torch.Tensor:
    """Mean divergence on k+1 bins (`losses.binned`, with the teacher's ids already in draft-vocabulary indices and
    probability 0 where an id has none: q is zeroed there too, so that mass stays in both rest bins)."""
    live = topk_probs > 0
    q_k = F.softmax(logits.float(), -1).gather(-1, topk_ids) * live
    return losses.divergence(name, losses.with_rest(topk_probs), losses.with_rest(q_k)).mean()


def step_loss(head, data: Positions, starts: torch.Tensor, config: TrainFeatureConfig) -> torch.Tensor:
    """The unrolled loss of a batch of starts (module docstring); the data stays on the CPU, a batch moves."""
    dev = head.d2t.device
    feature, total = data.features[starts].to(dev).float(), 0.0
    for u in range(config.unroll):
        logits, feature = head(feature, data.next_token[starts + u].to(dev))
        at = starts + u + 1
        total = total + draft_loss(config.loss, data.topk_ids[at].to(dev), data.topk_probs[at].to(dev), logits)
        total = total + config.feature_weight * F.smooth_l1_loss(feature, data.features[at].to(dev).float())
    return total / config.unroll


def _step(head, opt, data: Positions, starts: torch.Tensor, config: TrainFeatureConfig) -> float:
    """One optimizer step (a seam tests use to simulate a kill)."""
    opt.zero_grad()
    loss = step_loss(head, data, starts, config)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    opt.step()
    return loss.item()


def evaluate(drafter: FeatureDrafter, seqs: list[continuations.Sequence], features: list[torch.Tensor]) -> dict:
    """Held-out agreement and greedy TAR at γ = 4 (module docstring)."""
    drafter.head.eval()
    scored = [feature_score(drafter, s, (GAMMA,), f) for s, f in zip(seqs, features)]
    drafter.head.train()
    matches = [m for ms, _ in scored for m in ms]
    rounds = [r for _, rs in scored for r in rs[GAMMA]]
    return {
        "agreement": sum(matches) / max(1, len(matches)),
        f"tar_gamma{GAMMA}": sum(r["emitted"] for r in rounds) / max(1, len(rounds)),
    }


def eval_set(run_dir: RunDir, target, config: TrainFeatureConfig):
    """The eval continuations and the target's features over them, computed once and cached in the run folder."""
    feat_path = run_dir.path / "eval_features.safetensors"
    seqs = continuations.held_out(
        run_dir.path / "eval.jsonl", target, config.eval_suites, config.eval_prompts, config.eval_tokens
    )
    if not feat_path.exists():
        feats = {str(i): target_features(target.lm, s.tokens).cpu().contiguous() for i, s in enumerate(seqs)}
        save_file(feats, feat_path.with_suffix(".tmp"))
        feat_path.with_suffix(".tmp").replace(feat_path)
    feats = load_file(feat_path)
    return seqs, [feats[str(i)].to(target.lm.device) for i in range(len(seqs))]


def _save_state(path: Path, head, opt, meta: dict) -> None:
    path.mkdir(exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in head.state_dict().items()}
    for i, state in opt.state_dict()["state"].items():
        tensors.update({f"opt.{i}.{k}": v.reshape(-1) if k == "step" else v for k, v in state.items()})
    # the step counters travel inside the weights' file: one rename replaces both
    save_file({k: v.cpu() for k, v in tensors.items()}, path / "state.tmp", metadata={"meta": json.dumps(meta)})
    (path / "state.tmp").replace(path / "state.safetensors")


def _load_state(path: Path, head, opt) -> dict:
    tensors = load_file(path / "state.safetensors", device=str(head.d2t.device))
    head.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state = opt.state_dict()
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            state["state"].setdefault(int(i), {})[name] = value.reshape(()).cpu() if name == "step" else value
    opt.load_state_dict(state)
    with safe_open(path / "state.safetensors", "pt") as f:
        return json.loads(f.metadata()["meta"])


def build(config: TrainFeatureConfig, target, rows: list[dict]) -> fh.FeatureHead:
    """A fresh head for `target`: its draft vocabulary from the teacher rows, its final norm from the target's."""
    lm = target.lm
    d2t = fh.draft_vocab(rows, config.draft_vocab)
    shape = fh.FeatureHeadConfig(
        hidden=lm.shape.hidden_size,
        ffn=config.ffn or target.config.intermediate_size,
        blocks=config.blocks,
        draft_vocab=len(d2t),
        vocab_size=lm.vocab_size,
        rms_eps=lm.shape.rms_eps,
    )
    head = fh.FeatureHead(shape, d2t, config.seed).attach(lm)
    head.init_norm_from(lm)
    return head.train()


def teacher_rows(config: TrainFeatureConfig, target) -> list[dict]:
    rows = load_rows(Path(config.data), 10**9)
    if "hidden" not in rows[0]:
        raise DraftwiseError(
            f"{config.data} holds no target features: run `draftwise teacher` (features on) for a feature drafter"
        )
    if rows[0]["hidden"].shape[-1] != target.lm.shape.hidden_size:
        raise DraftwiseError(f"{config.data}: its features are not {target.name}'s (another hidden size)")
    return rows


def run(config: TrainFeatureConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    if fh.is_checkpoint(run_dir.path / "checkpoint"):
        print(f"already trained: {run_dir.path / 'checkpoint'}")
        return run_dir.path
    target = load(config.target, ModelOptions(config.dtype, config.device))
    fh.require_lean(target)
    rows = teacher_rows(config, target)
    head = build(config, target, rows)
    data = Positions(rows, head.d2t.cpu(), target.lm.vocab_size, config.unroll)
    del rows
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0)
    seqs, feats = eval_set(run_dir, target, config)
    meta = {"step": 0, "tokens": 0, "seconds": 0.0}
    if (run_dir.path / "state" / "state.safetensors").exists():
        meta = _load_state(run_dir.path / "state", head, opt)
        print(f"resuming at step {meta['step']} ({meta['tokens']} positions trained)", file=sys.stderr)
    record = Log(run_dir)
    evals = (FeatureDrafter(head, target.lm), seqs, feats)
    if record.empty():
        record({"event": "eval", "step": 0, "tokens": 0, **evaluate(*evals)})
    meta = train(head, opt, data, config, meta, record, run_dir.path, evals)
    final = evaluate(*evals)
    record({"event": "eval", "step": meta["step"], "tokens": meta["tokens"], **final})
    _save_state(run_dir.path / "state", head, opt, meta)
    head.save(run_dir.path / "checkpoint", fingerprint(target.tokenizer))
    from ..report.plots import plot_learning_curve

    plot_learning_curve(run_dir.records(), run_dir.path)
    print(
        f"held-out agreement {final['agreement']:.3f}, greedy TAR(γ={GAMMA}) {final[f'tar_gamma{GAMMA}']:.2f} after "
        f"{meta['step']} steps, {meta['tokens']} positions, {meta['seconds'] / 60:.1f} min "
        f"({head.parameter_count() / 1e6:.2f}M trained parameters, draft vocabulary {len(head.d2t)})\n"
        f"checkpoint: {run_dir.path / 'checkpoint'}  (use it as --drafter feature:{run_dir.path})"
    )
    return run_dir.path


def train(head, opt, data: Positions, config: TrainFeatureConfig, meta: dict, record: Log, folder: Path, evals):
    """Steps until the budget is spent (an eval every `eval_every`, a checkpoint every `checkpoint_every` steps);
    returns the final counters."""
    budget = Budget(config.minutes, config.tokens, meta, "train-feature", "pos")
    while budget.left(meta):
        start = time.perf_counter()
        starts = data.batch(meta["step"], config.batch_size, config.seed)
        value = _step(head, opt, data, starts, config)
        seconds = time.perf_counter() - start
        meta = {"step": meta["step"] + 1, "tokens": meta["tokens"] + len(starts), "seconds": meta["seconds"] + seconds}
        record({"event": "train", "step": meta["step"], "loss": value, "tokens": meta["tokens"], "seconds": seconds})
        budget.advance(meta, len(starts), f"loss {value:.4f}, {len(starts) / seconds:.0f} pos/s")
        if meta["step"] % config.eval_every == 0 and not record.has("eval", meta["step"]):  # not re-evaluated
            record({"event": "eval", "step": meta["step"], "tokens": meta["tokens"], **evaluate(*evals)})
        if meta["step"] % config.checkpoint_every == 0:
            _save_state(folder / "state", head, opt, meta)
    budget.close()
    return meta
