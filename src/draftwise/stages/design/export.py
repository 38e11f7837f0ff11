"""Export the chosen drafter: a transformers checkpoint any tool loads, and the settings that reproduce γ*."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...models import layer_subset, parse_layers, read_weights, save_checkpoint
from ...models.source import resolve

SNIPPET = """# Exported drafter: {name} (γ* = {gamma})

`drafter/` is a standard transformers checkpoint (safetensors, config, tokenizer with the target's chat template).

transformers assisted generation, constant γ*:
```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("{target}")
drafter = AutoModelForCausalLM.from_pretrained("{drafter}")
drafter.generation_config.num_assistant_tokens = {gamma}
drafter.generation_config.num_assistant_tokens_schedule = "constant"
tok = AutoTokenizer.from_pretrained("{target}")
ids = tok.apply_chat_template([{{"role": "user", "content": "Hello"}}], add_generation_prompt=True, return_tensors="pt")
out = target.generate(ids, assistant_model=drafter, max_new_tokens=128, do_sample=False)
```

vLLM (`vllm_speculative_config.json`):
```python
from vllm import LLM
llm = LLM(model="{target}", speculative_config={vllm})
```

draftwise:
```
draftwise bench --target {target_spec} --drafter {drafter} --gamma {gamma}
```
"""


def export_reduced(pipeline, reduced: Path) -> Path:
    """The reduced-vocabulary variant beside the full one (draftwise engine only; the id map travels with it)."""
    out = pipeline.dir.path / "export" / "drafter-reduced-vocab"
    shutil.copytree(reduced, out, dirs_exist_ok=True)
    with open(pipeline.dir.path / "export" / "README.md", "a") as f:
        f.write(f"\nReduced-vocabulary head (faster draft steps, draftwise engine only): `{out.resolve()}` "
                f"(`draft_vocab.json` maps draft ids to target ids):\n```\ndraftwise bench --target "
                f"{pipeline.config.target} --drafter {out.resolve()} --gamma {pipeline.done['select-gamma']['gamma']}\n```\n")
    return out


def export(pipeline, target, spec: str, name: str, gamma: int) -> Path:
    """Returns the exported full-vocabulary checkpoint folder."""
    out = pipeline.dir.path / "export"
    ckpt = out / "drafter"
    if not (ckpt / "config.json").exists():
        if spec.startswith("layers:"):  # a layer subset of the target: write its weights as a checkpoint of its own
            config, weights = layer_subset(target.config, read_weights(target.path),
                                           parse_layers(spec, target.config.num_hidden_layers))
            save_checkpoint(ckpt, config, weights, target.tokenizer)
        else:
            src = resolve(spec)
            shutil.copytree(src, ckpt, dirs_exist_ok=True)
    vllm = {"model": str(ckpt.resolve()), "num_speculative_tokens": gamma}
    (out / "vllm_speculative_config.json").write_text(json.dumps(vllm, indent=2) + "\n")
    (out / "README.md").write_text(SNIPPET.format(
        name=name, gamma=gamma, target=target.path, target_spec=pipeline.config.target, drafter=ckpt.resolve(),
        vllm=json.dumps(vllm)))
    return ckpt
