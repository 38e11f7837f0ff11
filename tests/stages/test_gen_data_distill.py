import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from draftwise import data, shards
from draftwise.config import DistillConfig, GenDataConfig
from draftwise.errors import DraftwiseError
from draftwise.stages import distill, gen_data


@pytest.fixture(scope="module")
def data_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    return gen_data.run(
        GenDataConfig(
            target=tiny_dir,
            suites="spec_bench,alpaca",
            limit=12,
            max_new_tokens=10,
            temperatures=(0.0, 1.0),
            topk=8,
            shard_size=10,
            batch_size=4,
        ),
        out,
    )


def test_gen_data_shards_are_train_only_and_resumable(data_dir, tiny_dir):
    records = [json.loads(line) for line in (data_dir / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3 and sum(r["sequences"] for r in records) == 24
    eval_ids = {p.id for p in data.load_prompts("all", "eval")}
    assert not any(pid in eval_ids for r in records for pid, _ in r["prompts"])
    rows = shards.read_shard(data_dir / records[0]["file"])
    assert rows[0]["topk_ids"].shape[1] == 8 and torch.all(
        rows[0]["topk_probs"][:, :-1] >= rows[0]["topk_probs"][:, 1:]
    )
    # a killed run: the last shard's record is lost; the rerun redoes that shard alone, identically
    shard = load_file(data_dir / records[-1]["file"])
    lines = (data_dir / "records.jsonl").read_text().splitlines()
    (data_dir / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    gen_data.run(
        GenDataConfig(
            target=tiny_dir,
            suites="spec_bench,alpaca",
            limit=12,
            max_new_tokens=10,
            temperatures=(0.0, 1.0),
            topk=8,
            shard_size=10,
            batch_size=4,
        ),
        data_dir,
    )
    assert (data_dir / "records.jsonl").read_text().splitlines()[:-1] == lines[:-1]
    again = load_file(data_dir / records[-1]["file"])
    assert all(torch.equal(shard[k], again[k]) for k in shard)


def test_each_greedy_sequence_is_the_one_its_prompt_gets_alone(data_dir, tiny_dir):
    """gen-data continues each prompt at both temperatures from one prefill, in batches of similar lengths: every
    greedy row is still the target's own greedy continuation of its prompt alone, its top-1 the token it chose."""
    from draftwise.runtimes.base import ModelOptions
    from draftwise.runtimes.registry import load
    from draftwise.sd.loop import generate
    from draftwise.sd.sampling import SamplingParams

    target = load(tiny_dir, ModelOptions())
    records = [json.loads(line) for line in (data_dir / "records.jsonl").read_text().splitlines()]
    temps = [t for r in records for _, t in r["prompts"]]
    assert temps.count(0.0) == temps.count(1.0) == 12
    greedy = 0
    for r in records:
        for row, (_, t) in zip(shards.read_shard(data_dir / r["file"]), r["prompts"]):
            n = int(row["prompt_len"])
            if t == 0.0:
                prompt, new = row["tokens"][:n].tolist(), row["tokens"][n:].tolist()
                alone = generate(target.lm, prompt, SamplingParams(), 10, torch.Generator(), eos=target.eos_ids)
                assert new == alone.tokens and row["topk_ids"][:, 0].tolist() == new
                greedy += 1
    assert greedy == 12


def test_user_prompts_in_the_eval_split_are_dropped(tiny_dir, tmp_path):
    evals = data.load_prompts("spec_bench", "eval", limit=2)
    trains = data.load_prompts("spec_bench", "train", limit=2)
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in evals + trains))
    out = gen_data.run(
        GenDataConfig(
            target=tiny_dir,
            suites="humaneval",
            prompts=str(f),
            max_new_tokens=4,
            temperatures=(0.0,),
            topk=4,
            shard_size=100,
        ),
        tmp_path / "g",
    )
    texts = {p.text for p in evals}
    rec = json.loads((out / "records.jsonl").read_text().splitlines()[0])
    user = [pid for pid, _ in rec["prompts"] if pid.startswith("user/")]
    assert len(user) == 2 and not texts & {p.text for p in data.read_prompt_file(f) if p.id in user}


def distill_config(tiny_dir, data_dir, **kw):
    base = dict(
        target=tiny_dir,
        drafter="layers:0,1",
        data=str(data_dir),
        loss="tvd",
        tokens=300,
        batch_size=4,
        lr=1e-2,
        eval_every=3,
        checkpoint_every=2,
        eval_prompts=4,
        eval_tokens=8,
        eval_suites="spec_bench",
    )
    base.update(kw)
    return DistillConfig(**base)


def weights(run):
    return load_file(run / "checkpoint" / "model.safetensors")


def test_distill_improves_agreement_and_writes_a_checkpoint(tiny_dir, data_dir, tmp_path):
    out = distill.run(distill_config(tiny_dir, data_dir, tokens=600, loss="fkl"), tmp_path / "d")
    evals = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"eval"' in line]
    assert evals[-1]["agreement"] > evals[0]["agreement"]
    assert (out / "learning_curve.png").stat().st_size > 0
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "checkpoint").config.num_hidden_layers == 2


def test_resumed_run_equals_uninterrupted(tiny_dir, data_dir, tmp_path, monkeypatch):
    config = distill_config(tiny_dir, data_dir, on_policy_every=3)
    whole = distill.run(config, tmp_path / "whole")
    calls = {"n": 0}
    real_step = distill._step

    def killed_after_five(*args):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(distill, "_step", killed_after_five)
    with pytest.raises(KeyboardInterrupt):
        distill.run(config, tmp_path / "resumed")
    monkeypatch.setattr(distill, "_step", real_step)
    distill.run(config, tmp_path / "resumed")  # resumes from the step-4 checkpoint
    a, b = weights(whole), weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_stop_rule_ends_training_a_drafter_that_cannot_reach_its_break_even(tiny_dir, data_dir, tmp_path):
    """After the pilot (a tenth of 600 tokens, and three evaluations), a drafter asked for an agreement of 1.0 is
    stopped with the curve's prediction recorded, and still leaves a checkpoint; one asked for nothing trains on."""
    stopped = distill.run(distill_config(tiny_dir, data_dir, tokens=600, stop_below=1.0, pilot=0.1), tmp_path / "s")
    records = [json.loads(line) for line in (stopped / "records.jsonl").read_text().splitlines()]
    stop = [r for r in records if r["event"] == "stopped"]
    assert len(stop) == 1 and stop[0]["predicted"] < stop[0]["needed"] == 1.0 and stop[0]["tokens"] < 600
    assert stop[0]["tokens_at_end"] == 600 and (stopped / "checkpoint" / "config.json").exists()
    whole = distill.run(distill_config(tiny_dir, data_dir, tokens=600, stop_below=0.0), tmp_path / "w")
    trained = [json.loads(line) for line in (whole / "records.jsonl").read_text().splitlines()]
    assert not any(r["event"] == "stopped" for r in trained) and trained[-1]["tokens"] >= 600


def test_the_target_can_be_held_at_its_deployment_precision_while_the_drafter_trains_at_fp32(
    tiny_dir, data_dir, tmp_path, monkeypatch
):
    """`target_dtype`: the target (held-out continuations, on-policy scoring) loads at int8, the drafter at fp32; the
    drafter still learns (a q4-studied 1.5B's cut is distilled this way, without a 7 GB fp32 copy of its target)."""
    loaded = []
    real_load = distill.load

    def recording(spec, options):
        loaded.append(options.dtype)
        return real_load(spec, options)

    monkeypatch.setattr(distill, "load", recording)
    config = distill_config(tiny_dir, data_dir, tokens=600, loss="fkl", target_dtype="int8", on_policy_every=3)
    out = distill.run(config, tmp_path / "d")
    assert loaded == ["int8"]
    evals = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if '"eval"' in line]
    assert evals[-1]["agreement"] > evals[0]["agreement"]
    with pytest.raises(DraftwiseError, match="unknown target precision"):
        distill_config(tiny_dir, data_dir, target_dtype="int4")


def test_bad_distill_inputs(tiny_dir, tmp_path):
    with pytest.raises(DraftwiseError, match="unknown loss"):
        DistillConfig(drafter="layers:0", data="x", loss="mse")
    with pytest.raises(DraftwiseError, match="no teacher shards"):
        distill.run(DistillConfig(target=tiny_dir, drafter="layers:0", data=str(tmp_path), tokens=10), tmp_path / "d")


def test_draft_vocab_writes_a_reduced_copy_beside_the_checkpoint(tiny_dir, data_dir, tmp_path):
    from draftwise.targets import vocab_map as vocab

    out = distill.run(distill_config(tiny_dir, data_dir, tokens=40, draft_vocab=16), tmp_path / "d")
    ids, size = vocab.read_map(out / "reduced")
    assert size == 64 and len(ids) % 8 == 0 and len(ids) >= 16
    distill.run(distill_config(tiny_dir, data_dir, tokens=40, draft_vocab=16), out)  # a rerun keeps it as it is
    assert vocab.read_map(out / "reduced") == (ids, size)


def test_the_training_head_is_the_reduced_head_it_deploys(tiny_dir, data_dir, tmp_path):
    """With --draft-vocab, distillation's logits come from the head rows `reduced/` keeps (the same ids, counted on
    --vocab-data), so the trained drafter's loss is the one it drafts with."""
    from draftwise.targets import vocab_map as vocab

    seen = []
    real = distill.DraftHead.logits

    def spy(self, head, hidden):
        seen.append(self.ids.tolist())
        out = real(self, head, hidden)
        assert out.shape[-1] == len(self.ids)
        return out

    config = distill_config(tiny_dir, data_dir, tokens=40, draft_vocab=16)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(distill.DraftHead, "logits", spy)
        out = distill.run(replace(config, vocab_data=str(data_dir)), tmp_path / "d")
    ids, _ = vocab.read_map(out / "reduced")
    assert seen and all(s == ids for s in seen)


def test_a_teacher_folder_trains_with_the_head_counted_on_gen_data(tiny_dir, data_dir, tmp_path):
    from draftwise.config import TeacherConfig
    from draftwise.stages import teacher
    from draftwise.targets import vocab_map as vocab

    t = teacher.run(
        TeacherConfig(target=tiny_dir, suites="alpaca", tokens=200, topk=8, precision="fp32", cache=False),
        tmp_path / "t",
    )
    config = distill_config(tiny_dir, str(t), tokens=40, draft_vocab=16)
    with pytest.raises(DraftwiseError, match="not a gen-data run folder"):  # the teacher's text is not what it emits
        distill.run(config, tmp_path / "refused")
    out = distill.run(replace(config, vocab_data=str(data_dir)), tmp_path / "d")
    assert (out / "reduced" / "config.json").exists()
    both = distill.run(replace(config, data=f"{data_dir},{t}"), tmp_path / "both")  # the head counted on the first
    assert vocab.read_map(both / "reduced") == vocab.read_map(out / "reduced")


def test_the_held_out_agreement_is_the_deployed_heads():
    """Evaluated with its draft vocabulary, the drafter's argmax is the best of the head's rows, never a token the
    reduced drafter cannot propose — even where the full head's argmax lies outside them."""
    full = torch.nn.Linear(4, 10, bias=False)
    with torch.no_grad():
        full.weight.copy_(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))
    hidden = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    outside = full(hidden).argmax(-1)
    keep = [i for i in range(10) if i not in set(outside[:4].tolist())]  # rows 0-3's full argmax left out
    head = distill.DraftHead.of(keep, 10)
    got = distill.DeployedHead(full, head)(hidden).argmax(-1)
    assert set(got.tolist()) <= set(keep)
    assert got.tolist() == [keep[i] for i in (hidden @ full.weight[keep].T).argmax(-1).tolist()]


def test_a_run_resumed_from_a_finished_one_continues_its_learning_curve(tiny_dir, data_dir, tmp_path):
    """`--resume-from` trains a finished run further: the weights, optimizer, data order and curve go on as if one
    run had trained the whole budget, and the source curve's projection is recorded and checked at the end."""
    from draftwise import learning

    first = distill.run(distill_config(tiny_dir, data_dir, tokens=150), tmp_path / "first")
    base = [json.loads(line) for line in (first / "records.jsonl").read_text().splitlines()]
    reached = max(r["tokens"] for r in base if r["event"] == "train")
    more = distill.run(distill_config(tiny_dir, data_dir, tokens=150, resume_from=str(first)), tmp_path / "more")
    whole = distill.run(distill_config(tiny_dir, data_dir, tokens=reached + 150), tmp_path / "whole")
    a, b = weights(whole), weights(more)
    assert all(torch.equal(a[k], b[k]) for k in a)
    records = [json.loads(line) for line in (more / "records.jsonl").read_text().splitlines()]
    proj = next(r for r in records if r["event"] == "projection")
    curve = learning.fit([r for r in base if r["event"] in ("train", "eval")])
    assert proj["tokens_at_end"] == reached + 150 and proj["predicted"] == pytest.approx(curve.predict(reached + 150))
    check = records[-1]
    final = [r for r in records if r["event"] == "eval"][-1]
    assert check["event"] == "projection-check" and check["measured"] == final["agreement"]
    assert check["predicted"] == pytest.approx(curve.predict(check["tokens"]))
    with pytest.raises(DraftwiseError, match="no distillation state"):
        distill.run(distill_config(tiny_dir, data_dir, resume_from=str(tmp_path)), tmp_path / "none")


def test_a_resumed_run_keeps_the_stop_rule_over_what_it_adds(tiny_dir, data_dir, tmp_path):
    """`--stop-below` on a resumed run: its pilot share is of the tokens it adds, the curve is fitted on the whole
    (the source's evaluations carried on), and the budget's end it predicts at is the source's tokens plus its own."""
    first = distill.run(distill_config(tiny_dir, data_dir, tokens=150), tmp_path / "first")
    base = [json.loads(line) for line in (first / "records.jsonl").read_text().splitlines()]
    reached = max(r["tokens"] for r in base if r["event"] == "train")
    config = distill_config(tiny_dir, data_dir, tokens=600, stop_below=1.0, pilot=0.1, resume_from=str(first))
    more = distill.run(config, tmp_path / "more")
    records = [json.loads(line) for line in (more / "records.jsonl").read_text().splitlines()]
    stop = [r for r in records if r["event"] == "stopped"]
    assert len(stop) == 1 and reached + 60 <= stop[0]["tokens"] < reached + 600
    assert stop[0]["tokens_at_end"] == reached + 600 and stop[0]["predicted"] < stop[0]["needed"] == 1.0


def _rows(lengths: list[int], vocab: int = 64, k: int = 4, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        prompt_len = max(1, n // 3)
        probs = torch.rand(n - prompt_len, k, generator=gen).sort(-1, descending=True).values
        out.append(
            {
                "tokens": torch.randint(0, vocab, (n,), generator=gen),
                "prompt_len": prompt_len,
                "topk_ids": torch.randint(0, vocab, (n - prompt_len, k), generator=gen),
                "topk_probs": probs / probs.sum(-1, keepdim=True) * 0.9,
            }
        )
    return out


def test_length_groups_pad_each_group_only_to_its_own_longest():
    rows = _rows([57, 256, 79, 209, 94, 256, 102, 197])
    groups = distill.length_groups(rows)
    assert [[len(r["tokens"]) for r in g] for g in groups] == [[57, 79], [94, 102], [197, 209, 256, 256]]
    assert sorted(id(r) for g in groups for r in g) == sorted(id(r) for r in rows)  # each row once
    for g in groups:
        real = sum(len(r["tokens"]) for r in g)
        assert len(g) * max(len(r["tokens"]) for r in g) <= distill.PAD_SLACK * real
    assert len(distill.length_groups(_rows([40] * 5))) == 1  # rows of one length: one pass, no padding


def test_a_step_over_length_groups_takes_the_padded_batchs_gradient():
    """Groups weighted by their scored positions give the loss (the mean over every scored position) and gradient
    of one right-padded pass over the whole micro-batch."""
    from conftest import tiny_config, tiny_model

    rows = _rows([12, 40, 15, 33, 9], k=4, seed=1)

    def grads(step):
        model = tiny_model(tiny_config(vocab=64), seed=3).train()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        value, n = step(model, opt)
        return value, n, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    def padded(model, opt):
        opt.zero_grad()
        value, n = distill.batch_loss(model, rows, "fkl")
        value.backward()
        return value.item(), n

    a_value, a_n, a = grads(padded)
    b_value, b_n, b = grads(lambda model, opt: distill._step(model, opt, [rows], "fkl"))
    assert len(distill.length_groups(rows)) > 1 and a_n == b_n
    assert b_value == pytest.approx(a_value, rel=1e-5)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)


@pytest.mark.parametrize("on_policy_every", [0, 3])
def test_the_target_is_put_down_while_the_student_trains_unless_it_scores_on_policy(
    tiny_dir, data_dir, tmp_path, monkeypatch, on_policy_every
):
    """Once the held-out continuations are made, only on-policy steps run the target: without them the target's
    weights are let go before the first step (its tokenizer kept), with them it stays loaded."""
    loaded, real_load, real_step = [], distill.load, distill._step

    def load(spec, options):
        loaded.append(real_load(spec, options))
        return loaded[-1]

    def step(*args):
        assert (loaded[0].lm is None) == (not on_policy_every) and loaded[0].tokenizer is not None
        return real_step(*args)

    monkeypatch.setattr(distill, "load", load)
    monkeypatch.setattr(distill, "_step", step)
    out = distill.run(distill_config(tiny_dir, data_dir, tokens=200, on_policy_every=on_policy_every), tmp_path / "d")
    assert (out / "checkpoint" / "config.json").exists()
