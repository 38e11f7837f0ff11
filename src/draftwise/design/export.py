"""Export what the verdict says: the chosen drafter and what reproduces it elsewhere — a transformers checkpoint for a
model drafter, the vLLM `speculative_config` and the transformers call for a lookup drafter (both parts of a hybrid) —
when it measured faster than plain decoding; otherwise a README saying that SD is not recommended on this machine, with
the artefacts kept under `not-recommended-<name>/`. Every path in the snippets is relative to the folder they are in
(the target is a placeholder): the export folder can be moved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .. import specs
from ..runtimes.hf.model import save_checkpoint
from ..sd import calibrate, families
from ..sd.families import drafter_kind
from ..targets.layers import checkpoint_of
from ..targets.source import resolve
from . import deploy
from .fastest import gammas_by_temperature, lean_name, versus
from .verdict import sentence

MODEL = """# Exported drafter: {name} (γ* = {gamma})

`drafter/` is a standard transformers checkpoint (safetensors, config, tokenizer with the target's chat template).
Paths below are relative to this folder; `<target>` is your target model's folder.

transformers assisted generation, constant γ*:
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("<target>")
drafter = AutoModelForCausalLM.from_pretrained("drafter")
drafter.generation_config.num_assistant_tokens = {gamma}
drafter.generation_config.num_assistant_tokens_schedule = "constant"
tok = AutoTokenizer.from_pretrained("<target>")
ids = tok.apply_chat_template([{{"role": "user", "content": "Hello"}}], add_generation_prompt=True, return_tensors="pt")
out = target.generate(ids, assistant_model=drafter, max_new_tokens=128, do_sample=False)
```

vLLM (`vllm_speculative_config.json`):
```python
from vllm import LLM
llm = LLM(model="<target>", speculative_config={vllm})
```

draftwise:
```
draftwise bench --target {target_spec} --drafter drafter --gamma {gamma}
```
"""

LOOKUP = """# Exported drafter: {name} (`{family}`, γ = {gamma}: at most {gamma} tokens proposed per round)

No weights: a lookup drafter proposes the tokens that followed the sequence's own ending {where}.
Paths below are relative to this folder.

vLLM (`vllm_speculative_config.json`):
```python
from vllm import LLM
llm = LLM(model="<target>", speculative_config={vllm})
```
{vllm_note}
transformers (its prompt lookup: n-grams of the request only):
```python
out = target.generate(ids, {transformers}, max_new_tokens=128)
```

draftwise (run from this folder):
```
draftwise bench --target <target> --drafter '{spec}' --gamma {gamma}
```
"""


def export_reduced(pipeline, reduced: Path) -> Path:
    """The reduced-vocabulary variant beside the full one (draftwise engine only; the id map travels with it)."""
    ckpt = pipeline.path / "export" / "drafter"
    home = ckpt.parent if ckpt.exists() else next((pipeline.path / "export").glob("not-recommended-*"))
    out = home / "drafter-reduced-vocab"
    shutil.copytree(reduced, out, dirs_exist_ok=True)
    with open(home / "README.md", "a") as f:
        f.write(
            f"\nReduced-vocabulary head (faster draft steps, draftwise engine only): `drafter-reduced-vocab/` "
            f"(`draft_vocab.json` maps draft ids to target ids):\n```\ndraftwise bench --target "
            f"{target_spec(pipeline)} --drafter drafter-reduced-vocab "
            f"--gamma {pipeline.done['select-gamma']['chosen']}\n```\n"
        )
    return out


def target_spec(pipeline) -> str:
    """The target as the export names it: `default` stays, a path becomes a placeholder."""
    return "default" if pipeline.config.target == "default" else "<target>"


def vllm_lookup(spec: str, gamma: int) -> dict:
    """vLLM's `speculative_config` for a lookup spec: its family's (n-gram: prompt_lookup_min/max; suffix: its tree
    settings; a family with no vLLM method of its own: vLLM's n-gram)."""
    return families.lookup_family(spec).vllm(spec, gamma)


def relocated(spec: str, prefix: str = "") -> str:
    """A lookup spec naming the data an export copies for it (a suffix corpus: `<prefix>suffix-corpus`) instead of
    this machine's folder; other specs as they are."""
    return families.family_of(spec).relocate(spec, prefix) if drafter_kind(spec) == "lookup" else spec


def local_lookup(spec: str, out: Path) -> str:
    """A lookup spec as the export folder `out` names it: its data (a suffix corpus) copied into `out`, the spec
    pointing there (relative, so the folder can move)."""
    family = families.lookup_family(spec)
    family.copy_data(spec, out)
    return family.relocate(spec)


def export_lookup(out: Path, spec: str, name: str, gamma: int) -> str:
    """README and vLLM config of a lookup spec, from its family; returns the spec as the export names it."""
    family, local = families.lookup_family(spec), local_lookup(spec, out)
    vllm = family.vllm(local, gamma)
    (out / "vllm_speculative_config.json").write_text(json.dumps(vllm, indent=2) + "\n")
    (out / "README.md").write_text(
        LOOKUP.format(
            name=name,
            family=family.name,
            gamma=gamma,
            where=family.where,
            vllm=json.dumps(vllm),
            vllm_note=family.vllm_note(spec),
            transformers=family.transformers(local, gamma),
            spec=local,
        )
    )
    return local


SCHEDULE = """
Round scheduler (draftwise engine): `schedule/` holds this machine's verify curve (`profile.json`) and the
acceptance calibration measured on the target's own text (`calibration.json`, per temperature); each round then
verifies the prefix of the proposal they price best{chosen}:
```
draftwise bench --target <target> --drafter '{spec}' --gamma {gamma} --schedule schedule --calibration schedule
```
The verify curve belongs to this machine and engine: on another, profile it there (`draftwise profile`) and pass that
folder to `--schedule`.
"""


def copy_schedule(profile: Path, calibration: Path, dest: Path) -> None:
    """The scheduler's inputs in `dest`: a profile folder's batch-1 verify curve and machine stamp (not its drafter
    entries, which name the run's folders), and a calibration folder's table with its drafters by their short label."""
    from ..stages.bench_grid import label

    dest.mkdir(parents=True, exist_ok=True)
    saved = json.loads((profile / "profile.json").read_text())
    entry = saved["batches"]["1"]
    curve = {k: entry[k] for k in ("ar_step_ms", "verify_ms", "verify_over_ar_step")}
    (dest / "profile.json").write_text(
        json.dumps({"machine": saved["machine"], "batches": {"1": curve}}, indent=1) + "\n"
    )
    table = json.loads((calibration / calibrate.FILE).read_text())
    table["drafters"] = {label(s, 200): g for s, g in table["drafters"].items()}
    (dest / calibrate.FILE).write_text(json.dumps(table) + "\n")


def export_schedule(pipeline, out: Path, spec: str, gamma: int, chosen: bool) -> None:
    """The scheduler's inputs beside a lookup drafter (`copy_schedule`: the design's profile and calibration)."""
    copy_schedule(pipeline.folder("profile"), pipeline.folder("calibrate-lookup"), out / "schedule")
    with open(out / "README.md", "a") as f:
        f.write(
            SCHEDULE.format(
                spec=spec,
                gamma=gamma,
                chosen=" (the verdict's method)"
                if chosen
                else " (measured beside static SD; the verdict chose static SD)",
            )
        )


HYBRID = """
This is a hybrid: draftwise proposes with the lookup in `lookup/` (γ = {gamma}) where it has a match and with this
drafter (γ = {model_gamma}) elsewhere. Neither vLLM nor transformers combines the two in one request; each part's
settings are exported for them.
"""

FEATURE = """# Exported drafter: {name} (a feature-level head, γ* = {gamma})

`drafter/` is a draftwise feature head (safetensors and config.json): a small head on the target's own features,
trained on the teacher data (docs/feature.md). It reads the target's embedding and LM head rows from the target at
load time, so it runs with this target only, on the draftwise engine (lean fp32 or int8):

    draftwise serve --target {target_spec} --drafter feature:drafter --gamma {gamma}

vLLM, SGLang and llama.cpp cannot load it as it is: their EAGLE-3 loaders expect a head with self-attention over three
intermediate layers' features; docs/feature.md says exactly what maps and what does not.
"""


def export_feature(out: Path, spec: str, name: str, gamma: int) -> None:
    """A feature head's checkpoint and a README that says where it runs (the draftwise engine only)."""
    deploy.local_drafter(spec, out)
    (out / "README.md").write_text(FEATURE.format(name=name, gamma=gamma, target_spec="<target>"))


def export_model(out: Path, target, spec: str) -> Path:
    ckpt = out / "drafter"
    if not (ckpt / "config.json").exists():
        if spec.startswith("layers:"):  # a layer subset of the target: write its weights as a checkpoint of its own
            config, weights = checkpoint_of(spec, target.config, target.path)
            save_checkpoint(ckpt, config, weights, target.tokenizer)
        else:
            shutil.copytree(resolve(spec), ckpt, dirs_exist_ok=True)
    return ckpt


def export(pipeline, target, verdict: dict, final: dict | None = None) -> Path | None:
    """Returns the exported full-vocabulary checkpoint folder (None for a lookup drafter: it has no weights).
    `final`: the design's answer (`fastest`), beside which the lean engine's own verdict is stated."""
    top = pipeline.path / "export"
    against = versus(final, lean_name(pipeline.config), verdict.get("method", "sd") if verdict["recommend"] else "ar")
    name, spec, gamma = verdict["drafter"], verdict["spec"], verdict["gamma"]
    out = top if verdict["recommend"] else top / f"not-recommended-{name}"
    out.mkdir(parents=True, exist_ok=True)
    ckpt = export_parts(pipeline, target, out, spec, name, gamma, verdict.get("method", "sd") != "sd")
    saved = serve_json(pipeline, top, verdict, final)
    if verdict["recommend"]:
        readme = out / "README.md"
        readme.write_text(
            f"## The draftwise lean engine at {pipeline.config.dtype}\n\n**Its verdict:** "
            f"{sentence(verdict)}{against}\n\n" + readme.read_text()
        )
    else:
        (top / "README.md").write_text(
            f"## The draftwise lean engine at {pipeline.config.dtype}: SD is not recommended\n\n{sentence(verdict)}"
            f"{against}\n\nPlain decoding is at least as fast on this engine. What the design built for its best "
            f"candidate is kept, for reference only, in `{out.name}/`.\n"
        )
    with open(top / "README.md", "a") as f:  # the engine's verdict served (`deploy`), from this folder
        c, model = pipeline.config, target_spec(pipeline)
        args, same = deploy.command(".", model, c.threads, c.device), deploy.explicit(saved, ".", c.threads, c.device)
        f.write("\nDeploy this engine's verdict (from this folder): " + deploy.block(args, same, model))
    return ckpt


def serve_json(pipeline, top: Path, verdict: dict, final: dict | None = None) -> dict:
    """serve.json in export/ (`deploy`): the engine at the design's precision with its verdict's drafter, γ (by
    request temperature where the answer differs by temperature: `fastest.gammas_by_temperature`) and schedule (the
    files `export_parts` wrote), or plain decoding when its verdict is plain decoding."""
    spec = deploy.local_drafter(verdict["spec"], top) if verdict["recommend"] else None
    scheduled = verdict.get("method", "sd") != "sd" and (top / "schedule").is_dir()
    gamma, c = verdict["gamma"], pipeline.config
    by = gammas_by_temperature(final, lean_name(c), gamma)
    saved = deploy.options(target_spec(pipeline), c.dtype, spec, gamma, scheduled, None, by)
    return deploy.write(top, saved)


def export_parts(pipeline, target, out: Path, spec: str, name: str, gamma: int, scheduled: bool = False) -> Path | None:
    """`scheduled`: the verdict's method is the round scheduler (a lookup's `schedule/` says so)."""
    kind = drafter_kind(spec)
    if kind == "lookup":
        local = export_lookup(out, spec, name, gamma)
        if "calibrate-lookup" in pipeline.done:
            export_schedule(pipeline, out, local, gamma, scheduled)
        return None
    model_spec, lookup_spec, model_gamma = specs.split_hybrid(spec) if kind == "hybrid" else (spec, None, None)
    if lookup_spec:
        (out / "lookup").mkdir(exist_ok=True)
        export_lookup(out / "lookup", lookup_spec, f"{name} (its lookup part)", gamma)
    hybrid = HYBRID.format(gamma=gamma, model_gamma=model_gamma) if lookup_spec else ""
    if drafter_kind(model_spec) == "feature":  # a head only the draftwise engine runs: no vLLM config
        export_feature(out, model_spec, name, model_gamma or gamma)
        with open(out / "README.md", "a") as f:
            f.write(hybrid)
        return None
    ckpt = export_model(out, target, model_spec)
    vllm = {"model": "drafter", "num_speculative_tokens": model_gamma or gamma}
    (out / "vllm_speculative_config.json").write_text(json.dumps(vllm, indent=2) + "\n")
    readme = MODEL.format(
        name=name, gamma=model_gamma or gamma, target_spec=target_spec(pipeline), vllm=json.dumps(vllm)
    )
    (out / "README.md").write_text(readme + hybrid)
    return ckpt
