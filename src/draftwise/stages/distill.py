"""`draftwise distill`: train a drafter toward the target's distribution on target-generated data.

Each step: a micro-batch of gen-data sequences (shuffled per epoch from the seed), the drafter's logits at the
continuation positions only (the head is the costliest matmul; prompt positions carry no target distribution), and
a divergence to the target's stored top-k (`losses`). With `on_policy_every` = n, every n-th step instead lets the
drafter continue train prompts and has the target score its text (DistillSpec: learn where the drafter goes).
Every `eval_every` steps, held-out top-1 agreement on `eval` prompts and the greedy TAR it implies go to
records.jsonl. `state/` holds weights, optimizer and generator state every `checkpoint_every` steps; a rerun resumes
from it with the same step and data order. The result is a standard checkpoint in `checkpoint/`.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .. import continuations, learning
from ..config import DistillConfig
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.hf.model import HFCausalLM
from ..runtimes.registry import load, load_drafter
from ..sd.batched import generate_batch
from ..sd.sampling import SamplingParams
from ..shards import load_rows
from ..timing import native_bf16
from . import losses, resume
from .agree import greedy_tar
from .budget import Budget, Log
from .draft_vocab import ensure_reduced, hot_ids

PAD_SLACK = 1.2  # a length group's padded positions stay within this × its real ones (`length_groups`)


def order(n_rows: int, step: int, batch_size: int, seed: int) -> list[int]:
    """Row indices of a step's micro-batch: a fresh permutation per epoch, fixed by the seed (resumable)."""
    first = step * batch_size
    out = []
    while len(out) < batch_size:
        epoch, offset = divmod(first + len(out), n_rows)
        perm = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist()
        out += perm[offset : offset + batch_size - len(out)]
    return out


@dataclass(frozen=True)
class DraftHead:
    """The head a distillation trains with when the drafter deploys a reduced one: the target ids it keeps (its
    rows of the full head) and each target id's row in it (-1: outside). Its logits are a tenth of the full head's
    work at Qwen's 152k vocabulary, and the loss sees what SD will: a token outside it is never proposed."""

    ids: torch.Tensor  # [N] target ids, ascending
    to_draft: torch.Tensor  # [target vocab] row in the reduced head, -1 where absent

    @classmethod
    def of(cls, ids: list[int], vocab_size: int) -> DraftHead:
        to_draft = torch.full((vocab_size,), -1, dtype=torch.long)
        to_draft[torch.tensor(ids)] = torch.arange(len(ids))
        return cls(torch.tensor(ids), to_draft)

    def logits(self, head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        bias = None if head.bias is None else head.bias[self.ids]
        return torch.nn.functional.linear(hidden, head.weight[self.ids], bias)


class DeployedHead(torch.nn.Module):
    """The model's head as the drafter deploys it, for evaluation: logits over the draft vocabulary's rows, every
    other target id at -inf, so the held-out agreement (the learning curve's y) is the reduced drafter's."""

    def __init__(self, full: torch.nn.Module, head: DraftHead):
        super().__init__()
        self.full, self.head = full, head

    @property
    def weight(self) -> torch.Tensor:  # what an engine reads the vocabulary's size from
        return self.full.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = hidden.new_full((*hidden.shape[:-1], self.full.weight.shape[0]), float("-inf"))
        out[..., self.head.ids] = self.head.logits(self.full, hidden).to(out.dtype)
        return out


def vocab_data(config: DistillConfig) -> str:
    """The gen-data folder whose continuations count the draft vocabulary: --vocab-data, else the first --data."""
    return config.vocab_data or config.data.split(",")[0]


def draft_head(config: DistillConfig, model, tokenizer) -> DraftHead | None:
    if not config.draft_vocab:
        return None
    vocab = model.get_output_embeddings().weight.shape[0]
    return DraftHead.of(hot_ids(vocab_data(config), config.draft_vocab, vocab, tokenizer.all_special_ids), vocab)


def batch_loss(model, rows: list[dict], loss_name: str, head: DraftHead | None = None) -> tuple[torch.Tensor, int]:
    """Mean divergence over the continuation positions of right-padded rows; the head runs on those only."""
    T = max(len(r["tokens"]) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    attn = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["tokens"])] = r["tokens"]
        attn[i, : len(r["tokens"])] = 1
    hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, D]
    # continuation token j of row i is predicted at position prompt_len - 1 + j
    where = [(i, r["prompt_len"] - 1 + j) for i, r in enumerate(rows) for j in range(len(r["topk_ids"]))]
    rows_i, cols = torch.tensor([w[0] for w in where]), torch.tensor([w[1] for w in where])
    out, picked = model.get_output_embeddings(), hidden[rows_i, cols]
    logits = out(picked) if head is None else head.logits(out, picked)  # [N, V] or [N, draft vocab]
    topk_ids = torch.cat([r["topk_ids"] for r in rows])
    topk_probs = torch.cat([r["topk_probs"] for r in rows])
    to_draft = None if head is None else head.to_draft
    return losses.loss(loss_name, topk_ids, topk_probs, logits, to_draft), len(where)


@torch.no_grad()
def on_policy_rows(model, target, prompts: list[list[int]], config: DistillConfig, gen: torch.Generator) -> list[dict]:
    """The drafter continues prompts (sampling, T=1); the target's top-k at those positions is the teacher."""
    model.eval()
    conts = generate_batch(
        HFCausalLM(model), prompts, SamplingParams(1.0), config.on_policy_tokens, gen, target.eos_ids
    )
    model.train()
    seqs = [continuations.Sequence("", p + c.tokens, len(p)) for p, c in zip(prompts, conts)]
    ((ids, start, scored, n),) = continuations.batches(seqs, len(seqs))
    target.lm.reset(ids.shape[0], ids.shape[1])
    probs = torch.softmax(target.lm.forward(ids, 0, n, start).float(), -1)  # [B, n, V]
    rows = []
    for b, s in enumerate(seqs):
        top = probs[b][scored[b]].topk(32, dim=-1)
        rows.append(
            {
                "tokens": torch.tensor(s.tokens),
                "prompt_len": s.prompt_len,
                "topk_ids": top.indices,
                "topk_probs": top.values,
            }
        )
    return rows


@torch.no_grad()
def evaluate(model, eval_seqs: list[continuations.Sequence], gammas=(4,), head: DraftHead | None = None) -> dict:
    """Held-out top-1 agreement (teacher-forced on the target's greedy eval continuations) and implied greedy TAR,
    with the head the drafter deploys (`head`: its draft vocabulary; None: the full head)."""
    model.eval()
    full = model.get_output_embeddings()
    if head is not None:
        model.set_output_embeddings(DeployedHead(full, head))
    try:
        matches = continuations.top1_matches(HFCausalLM(model), eval_seqs)
    finally:
        model.set_output_embeddings(full)
    model.train()
    out = {"agreement": sum(map(sum, matches)) / sum(len(m) for m in matches)}
    return out | {f"tar_gamma{g}": greedy_tar(matches, g) for g in gammas}


def _save_state(path: Path, model, opt, gen: torch.Generator, meta: dict) -> None:
    path.mkdir(exist_ok=True)
    tensors = {f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}
    for i, state in opt.state_dict()["state"].items():
        tensors.update(
            {
                f"opt.{i}.{k}": (v if torch.is_tensor(v) else torch.tensor(v)).reshape(-1) if k == "step" else v
                for k, v in state.items()
            }
        )
    tensors["generator"] = gen.get_state()
    tied = (
        {k for k in tensors if k.startswith("model.") and k.endswith("lm_head.weight")}
        if model.config.tie_word_embeddings
        else set()
    )
    # the step counters travel inside the weights' file: one rename replaces both, so a kill never pairs new
    # weights with an old step count
    save_file(
        {k: v for k, v in tensors.items() if k not in tied}, path / "state.tmp", metadata={"meta": json.dumps(meta)}
    )
    (path / "state.tmp").replace(path / "state.safetensors")


def _load_state(path: Path, model, opt, gen: torch.Generator) -> dict:
    tensors = load_file(path / "state.safetensors")
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    if model.config.tie_word_embeddings:
        model.tie_weights()
    state = opt.state_dict()
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, i, name = key.split(".", 2)
            state["state"].setdefault(int(i), {})[name] = value.reshape(()) if name == "step" else value
    opt.load_state_dict(state)
    gen.set_state(tensors["generator"])
    with safe_open(path / "state.safetensors", "pt") as f:
        return json.loads(f.metadata()["meta"])


def use_autocast(setting: str, device: str) -> bool:
    """Whether distillation's matmuls run in bf16 (autocast): where the hardware computes bf16 natively."""
    return setting == "on" or (setting == "auto" and native_bf16(device))


def length_groups(rows: list[dict], slack: float = PAD_SLACK) -> list[list[dict]]:
    """A micro-batch's rows in groups of similar length, shortest first, each padded only to its own longest: a group
    grows while its padded positions stay within `slack` × its real ones. Why: distillation's matmuls run at the
    machine's peak, so a padded position costs what a real one does, and one pass over rows of 57 to 256 tokens
    (gen-data's continuations beside the teacher's 256-token pieces) computed 2,048 positions for 1,250 real ones."""
    groups: list[list[dict]] = []
    for row in sorted(rows, key=lambda r: len(r["tokens"])):
        g = groups[-1] if groups else None
        if g and (len(g) + 1) * len(row["tokens"]) <= slack * (sum(len(r["tokens"]) for r in g) + len(row["tokens"])):
            g.append(row)
        else:
            groups.append([row])
    return groups


def _step(
    model, opt, micro_batches: list[list[dict]], loss_name: str, bf16: bool = False, head: DraftHead | None = None
) -> tuple[float, int]:
    """One optimizer step over accumulated micro-batches (a seam tests use to simulate a kill). A micro-batch's loss
    is the mean over its scored positions; its length groups' means are weighted by their positions to give it."""
    opt.zero_grad()
    total, tokens = 0.0, 0
    for rows in micro_batches:
        groups = length_groups(rows)
        scored = [sum(len(r["topk_ids"]) for r in g) for g in groups]
        for g, share in zip(groups, scored):
            with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
                value, n = batch_loss(model, g, loss_name, head)
            weight = share / sum(scored) / len(micro_batches)
            (value * weight).backward()
            total, tokens = total + value.item() * weight, tokens + n
    opt.step()
    return total, tokens


def stopped(config: DistillConfig, run_dir: RunDir, meta: dict, record, base: dict | None = None) -> bool:
    """The stop rule (`learning.pilot`), once the pilot share of the budget is trained: whether the learning curve
    predicts an agreement below `stop_below` at the budget's end (a `stopped` record says what it predicted). In a
    resumed run (`base`: the source's totals) the share and the budget are this run's own part, the curve the whole."""
    if not config.stop_below:
        return False
    base = base or {"tokens": 0, "seconds": 0.0}
    tokens, seconds = meta["tokens"] - base["tokens"], meta["seconds"] - base["seconds"]
    done = tokens / config.tokens if config.tokens else seconds / (60 * config.minutes)
    if done < config.pilot:
        return False
    at_end = base["tokens"] + (config.tokens or tokens / done)  # at the rate measured so far
    verdict = learning.pilot(run_dir.records(), config.stop_below, at_end)
    if verdict is None or not verdict["stop"]:
        return False
    record({"event": "stopped", "step": meta["step"], "tokens": meta["tokens"], **verdict})
    print(
        f"stopped after the pilot: predicted agreement {verdict['predicted']:.3f} at the budget's end, "
        f"{config.stop_below:.3f} needed to break even",
        file=sys.stderr,
    )
    return True


def run(config: DistillConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)  # transformers' module init draws from the global generator
    run_dir = RunDir(out, config)
    if (run_dir.path / "checkpoint" / "config.json").exists():
        print(f"already distilled: {run_dir.path / 'checkpoint'}")
        ensure_reduced(run_dir.path, config.draft_vocab, vocab_data(config))
        return run_dir.path
    proj = resume.seed(run_dir, Path(config.resume_from), config) if config.resume_from else None
    options = ModelOptions(config.dtype, config.device)
    target = load(config.target, ModelOptions(config.target_dtype or config.dtype, config.device))
    drafter = load_drafter(config.drafter, target, options)
    model = drafter.hf_model().float().train()
    for p in model.get_input_embeddings().parameters():
        p.requires_grad = config.train_embeddings
    for p in model.get_output_embeddings().parameters():
        p.requires_grad = config.train_embeddings
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0, fused=True)  # one kernel: ~5 % a step on Zen 4
    rows = [row for folder in config.data.split(",") for row in load_rows(Path(folder), config.max_len)]
    eval_seqs = continuations.held_out(
        run_dir.path / "eval.jsonl", target, config.eval_suites, config.eval_prompts, config.eval_tokens
    )
    if not config.on_policy_every:  # its held-out text made, only on-policy steps run the target: its weights go
        target.put_down()  # (a q4 1.5B: 2.4 GB beside the student and its optimizer; its tokenizer stays)
    gen = torch.Generator().manual_seed(config.seed)
    meta = {"step": 0, "tokens": 0, "seconds": 0.0}
    if (run_dir.path / "state" / "state.safetensors").exists():
        meta = _load_state(run_dir.path / "state", model, opt, gen)
        print(
            f"resuming at step {meta['step']} ({meta['tokens']} tokens, {meta['seconds']:.0f} s trained)",
            file=sys.stderr,
        )
    head = draft_head(config, model, target.tokenizer)
    record = Log(run_dir)  # once per (event, step): a resume redoes steps past its checkpoint (same data order)
    if record.empty():
        record({"event": "eval", "step": 0, "tokens": 0, **evaluate(model, eval_seqs, head=head)})
    budget = Budget(*resume.budget(config, proj), meta, "distill", "tok")
    prompts = [r["tokens"][: r["prompt_len"]].tolist() for r in rows]
    bf16 = use_autocast(config.autocast, config.device)
    halted = any(r.get("event") == "stopped" for r in run_dir.records())  # a resumed run the rule stopped
    while budget.left(meta) and not halted:
        start = time.perf_counter()
        step = meta["step"]
        on_policy = bool(config.on_policy_every) and (step + 1) % config.on_policy_every == 0
        if on_policy:
            picks = order(len(rows), step, config.batch_size, config.seed + 1)
            micro = [on_policy_rows(model, target, [prompts[i] for i in picks], config, gen)]
        else:
            micro = [
                [rows[i] for i in order(len(rows), step * config.grad_accum + a, config.batch_size, config.seed)]
                for a in range(config.grad_accum)
            ]
        value, tokens = _step(model, opt, micro, config.loss, bf16, head)
        seconds = time.perf_counter() - start
        meta = {"step": step + 1, "tokens": meta["tokens"] + tokens, "seconds": meta["seconds"] + seconds}
        record(
            {
                "event": "train",
                "step": meta["step"],
                "loss": value,
                "tokens": meta["tokens"],
                "seconds": seconds,
                "on_policy": on_policy,
            }
        )
        budget.advance(meta, tokens, f"loss {value:.4f}, {tokens / seconds:.0f} tok/s")
        if meta["step"] % config.eval_every == 0 and not record.has("eval", meta["step"]):  # not re-evaluated
            record(
                {
                    "event": "eval",
                    "step": meta["step"],
                    "tokens": meta["tokens"],
                    **evaluate(model, eval_seqs, head=head),
                }
            )
            if stopped(config, run_dir, meta, record, proj and proj["base"]):
                break
        if meta["step"] % config.checkpoint_every == 0:
            _save_state(run_dir.path / "state", model, opt, gen, meta)
    budget.close()
    final = evaluate(model, eval_seqs, head=head)
    record({"event": "eval", "step": meta["step"], "tokens": meta["tokens"], **final})
    if proj is not None:
        checked = resume.check(proj, meta, final["agreement"])
        record(checked)
        print(resume.sentence(checked))
    _save_state(run_dir.path / "state", model, opt, gen, meta)
    model.save_pretrained(run_dir.path / "checkpoint", safe_serialization=True)
    target.tokenizer.save_pretrained(run_dir.path / "checkpoint")
    ensure_reduced(run_dir.path, config.draft_vocab, vocab_data(config))
    from ..report.plots import plot_learning_curve

    plot_learning_curve(run_dir.records(), run_dir.path)
    print(
        f"held-out agreement {final['agreement']:.3f}, predicted greedy TAR(γ=4) {final['tar_gamma4']:.2f} after "
        f"{meta['step']} steps, {meta['tokens']} tokens, {meta['seconds'] / 60:.1f} min\n"
        f"checkpoint: {run_dir.path / 'checkpoint'}"
    )
    return run_dir.path
