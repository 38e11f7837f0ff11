import pytest
import torch

from conftest import tiny_config, tiny_model
from draftwise.errors import DraftwiseError
from draftwise.stages.prune.masks import MaskedLM, Masks
from draftwise.stages.prune.slicing import PruneShape, masks_of, select, slice_checkpoint

FAMILY_KW = {
    "llama-tied": dict(kind="llama", tie_word_embeddings=True, attention_bias=True),
    "llama-untied": dict(kind="llama", tie_word_embeddings=False, attention_bias=True),
    "qwen3": dict(kind="qwen3", tie_word_embeddings=False),
    "phi3": dict(kind="phi3", tie_word_embeddings=False),
    "gemma2": dict(kind="gemma2", layer_types=["sliding_attention", "full_attention"] * 2),
    "gemma3": dict(kind="gemma3_text", layer_types=["sliding_attention"] * 3 + ["full_attention"]),
}


@pytest.mark.parametrize("family", FAMILY_KW)
def test_masked_model_equals_the_physically_sliced_one(family):
    config = tiny_config(
        layers=4,
        hidden_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        **FAMILY_KW[family],
    )
    hf = tiny_model(config, seed=41)
    sd = hf.state_dict()
    gen = torch.Generator().manual_seed(0)
    shape = PruneShape(layers=2, hidden=40, heads=4, kv_heads=2, ffn=20)
    kept = select(
        shape,
        config,
        torch.rand(4, generator=gen),
        torch.rand(4, 8, generator=gen),
        torch.rand(4, 48, generator=gen),
        torch.rand(64, generator=gen),
    )
    ids = torch.randint(0, config.vocab_size, (2, 9), generator=gen)
    masked = MaskedLM(config, sd)(ids, masks_of(kept, config))
    new_config, new_sd = slice_checkpoint(config, sd, kept)
    sliced = tiny_model(new_config)
    sliced.load_state_dict(new_sd, strict=not new_config.tie_word_embeddings)
    if new_config.tie_word_embeddings:
        sliced.tie_weights()
    if getattr(config, "layer_types", None):  # the kept layers keep their local/global pattern
        assert new_config.layer_types == [config.layer_types[l] for l in kept.layers]
    with torch.no_grad():
        torch.testing.assert_close(masked, sliced(ids).logits, atol=1e-4, rtol=1e-4)
    assert (
        new_config.num_hidden_layers,
        new_config.hidden_size,
        new_config.num_attention_heads,
        new_config.num_key_value_heads,
        new_config.intermediate_size,
    ) == (2, 40, 4, 2, 20)


@pytest.mark.parametrize("family", FAMILY_KW)
def test_unmasked_forward_equals_transformers(family):
    config = tiny_config(layers=2, **{k: v for k, v in FAMILY_KW[family].items() if k != "layer_types"})
    hf = tiny_model(config, seed=42)
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(
            MaskedLM(config, hf.state_dict())(ids, Masks.ones(config)), hf(ids).logits, atol=1e-4, rtol=1e-4
        )


def test_gqa_selection_keeps_whole_groups():
    config = tiny_config(layers=1, hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8)
    head = torch.tensor([[9.0, 1, 1, 1, 5, 5, 5, 5]])  # group 1 sums higher, head 0 is the single best
    kept = select(PruneShape(1, 64, 2, 1, 48), config, [0], head, torch.ones(1, 48), torch.ones(64))
    assert kept.kv_heads == [[1]] and kept.heads == [[4, 5]]
    kept = select(PruneShape(1, 64, 4, 2, 48), config, [0], head, torch.ones(1, 48), torch.ones(64))
    assert kept.kv_heads == [[0, 1]] and kept.heads == [[0, 1, 4, 5]]


@pytest.mark.parametrize(
    "text,message",
    [
        ("layers=9", "layers=9 is impossible: the target has 4"),
        ("heads=8", "heads=8 is impossible"),
        ("hidden=20", "not a multiple of head_dim 8"),
        ("heads=3,kv_heads=2", "does not divide"),
        ("heads=4,kv_heads=1", "query heads per KV head"),
        ("depth=2", "unknown shape dimension 'depth'"),
        ("layers=two", "needs an integer"),
    ],
)
def test_bad_shapes(text, message):
    with pytest.raises(DraftwiseError, match=message):
        PruneShape.parse(text, tiny_config(layers=4))


def test_prune_importance_end_to_end(tiny_dir, tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    from draftwise.config import PruneConfig
    from draftwise.runtimes.registry import load, load_drafter
    from draftwise.sd.loop import generate
    from draftwise.sd.sampling import SamplingParams
    from draftwise.stages import prune

    config = PruneConfig(
        target=tiny_dir,
        shape="layers=2,hidden=24,heads=2,kv_heads=1,ffn=32",
        calib_tokens=64,
        max_new_tokens=8,
        elimination_tokens=16,
        batch_size=4,
    )
    out = prune.run(config, tmp_path / "p")
    info = json.loads((out / "prune.json").read_text())
    assert len(info["kept"]["layers"]) == 2 and len(info["kept"]["hidden"]) == 24
    hf = AutoModelForCausalLM.from_pretrained(out / "checkpoint")  # a standard checkpoint
    c = hf.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (
        2,
        24,
        2,
        1,
        32,
    )
    assert sum(p.numel() for p in hf.parameters()) == info["params"]["total"]
    target = load(tiny_dir)
    drafter = load_drafter(str(out), target)  # the run folder resolves to its checkpoint
    ids = [1, 5, 9]
    ar = generate(target.lm, ids, SamplingParams(), 12, torch.Generator())
    sd = generate(target.lm, ids, SamplingParams(), 12, torch.Generator(), drafter=drafter.lm, gamma=3)
    assert sd.tokens == ar.tokens
    calib = (out / "calibration.jsonl").read_text()
    from draftwise import data

    train_ids = {p.id for p in data.load_prompts("all", "train")}
    assert all(json.loads(line)["prompt_id"] in train_ids for line in calib.splitlines())
    # deterministic: a second run from scratch selects the same units
    out2 = prune.run(config, tmp_path / "p2")
    assert json.loads((out2 / "prune.json").read_text())["kept"] == info["kept"]


def test_prune_l0_reaches_the_shape(tiny_dir, tmp_path):
    import json

    from draftwise.config import PruneConfig
    from draftwise.stages import prune

    config = PruneConfig(
        target=tiny_dir,
        shape="layers=2,ffn=24",
        method="l0",
        calib_tokens=48,
        max_new_tokens=8,
        l0_steps=40,
        batch_size=4,
    )
    out = prune.run(config, tmp_path / "p")
    info = json.loads((out / "prune.json").read_text())
    assert len(info["kept"]["layers"]) == 2 and all(len(f) == 24 for f in info["kept"]["ffn"])
    steps = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    first, last = steps[0], steps[-1]
    assert last["step"] == 39
    # the Lagrangian pulls the expected sizes toward the requested shape
    assert abs(last["expected_layer"] - 2) < abs(first["expected_layer"] - 2)
    assert abs(last["expected_intermediate"] - 24) < abs(first["expected_intermediate"] - 24)


def test_elimination_resumes_from_its_last_step(tiny_dir, tmp_path):
    import json

    from draftwise.config import PruneConfig
    from draftwise.stages import prune

    config = PruneConfig(
        target=tiny_dir, shape="layers=1", calib_tokens=48, max_new_tokens=8, elimination_tokens=16, batch_size=4
    )
    out = prune.run(config, tmp_path / "p")
    info = json.loads((out / "prune.json").read_text())
    records = (out / "records.jsonl").read_text().splitlines()
    assert len(records) >= 2
    # killed after the first elimination step: rerun continues from it and ends in the same place
    (out / "records.jsonl").write_text(records[0] + "\n")
    (out / "prune.json").unlink()
    prune.run(config, out)
    again = (out / "records.jsonl").read_text().splitlines()
    assert again[0] == records[0] and len(again) == len(records)
    assert json.loads((out / "prune.json").read_text())["kept"] == info["kept"]


@pytest.mark.parametrize("kind", ["mistral", "qwen3", "phi3", "gemma2", "gemma3_text"])
def test_prune_every_family_reloads_in_transformers_and_runs_in_the_engine(kind, tmp_path):
    """Importance pruning of a tiny target of each family, hidden width cut too: the checkpoint is one transformers
    loads, and a lossless drafter in the engine."""
    import json

    from transformers import AutoModelForCausalLM

    from conftest import tiny_tokenizer
    from draftwise.config import PruneConfig
    from draftwise.runtimes.hf.model import save_checkpoint
    from draftwise.runtimes.registry import load, load_drafter
    from draftwise.sd.loop import generate
    from draftwise.sd.sampling import SamplingParams
    from draftwise.stages import prune

    kw = dict(layer_types=["sliding_attention", "full_attention"] * 2) if kind.startswith("gemma") else {}
    if kind == "mistral":
        kw["sliding_window"] = 4
    model = tiny_model(tiny_config(kind, layers=4, **kw), seed=1)
    target_dir = save_checkpoint(tmp_path / "t", model.config, model.state_dict(), tiny_tokenizer())
    config = PruneConfig(
        target=str(target_dir),
        shape="layers=2,hidden=24,heads=2,kv_heads=1,ffn=32",
        calib_tokens=48,
        max_new_tokens=8,
        elimination_tokens=16,
        batch_size=4,
    )
    out = prune.run(config, tmp_path / "p")
    info = json.loads((out / "prune.json").read_text())
    hf = AutoModelForCausalLM.from_pretrained(out / "checkpoint")
    assert hf.config.model_type == kind and hf.config.num_hidden_layers == 2 and hf.config.hidden_size == 24
    if kind.startswith("gemma"):
        assert hf.config.layer_types == [["sliding_attention", "full_attention"][l % 2] for l in info["kept"]["layers"]]
    target = load(str(target_dir))
    drafter = load_drafter(str(out), target)
    assert target.backend == drafter.backend == "lean"
    ar = generate(target.lm, [1, 5, 9], SamplingParams(), 12, torch.Generator())
    sd = generate(target.lm, [1, 5, 9], SamplingParams(), 12, torch.Generator(), drafter=drafter.lm, gamma=3)
    assert sd.tokens == ar.tokens
    with torch.no_grad():  # the engine's drafter computes what transformers' reload does
        ids = torch.tensor([[1, 5, 9, 4, 7, 3, 2, 8, 6]])
        drafter.lm.reset(1, 16)
        torch.testing.assert_close(drafter.lm(ids, 0), hf(ids).logits, atol=2e-4, rtol=2e-4)


def test_elimination_subset_takes_whole_rows_up_to_the_positions_asked():
    from draftwise.stages.prune import _subset

    scored = torch.tensor([[True] * 5 + [False], [True] * 6, [True] * 3 + [False] * 3])  # 5, 6, 3 scored positions
    batch = ((torch.zeros(3, 9, dtype=torch.long), [0, 1, 2], scored, 6), torch.arange(14.0)[:, None])
    assert [b[0][0].shape[0] for b in _subset([batch, batch], 4)] == [1]  # one row holds 5 >= 4
    two = _subset([batch, batch], 9)
    assert len(two) == 1 and two[0][0][0].shape[0] == 2 and two[0][0][1] == [0, 1]
    assert two[0][1].flatten().tolist() == list(range(11))  # log p of those rows' scored positions, in order
    more = _subset([batch, batch], 16)
    assert [b[0][0].shape[0] for b in more] == [3, 1] and sum(len(b[1]) for b in more) == 14 + 5
