"""Write a random-weight GGUF file of a real target's shape, with the default target's tokenizer and metadata, by
draftwise's own GGUF writer: a target for cost measurements at the sizes people deploy (random weights serve for cost,
never for acceptance). Generated on demand, never committed.

    .venv/bin/python scripts/shape_gguf.py 360M q4_1 runs/shapes/smollm2-360m-shape-q4_1.gguf
"""

import argparse

import torch

from draftwise.gguf.write import QUANTS, write_gguf
from draftwise.runtimes.registry import load
from draftwise.targets.random import llama_config, random_state_dict
from draftwise.targets.source import default_gguf

# SmolLM2's published shapes (config.json of HuggingFaceTB/SmolLM2-360M and -1.7B), all with the 49,152-token
# vocabulary, in the default target's family (Llama); Qwen3's (Qwen/Qwen3-0.6B and -1.7B: q/k norms, head_dim 128,
# 151,936 embedding rows, RoPE base 10^6), the default target's tokenizer padded with unused tokens to those rows
SHAPES = {
    "360M": dict(layers=32, hidden=960, heads=15, kv_heads=5, head_dim=64, ffn=2560, vocab=49152, tied=True),
    "1.7B": dict(layers=24, hidden=2048, heads=32, kv_heads=32, head_dim=64, ffn=8192, vocab=49152, tied=True),
    "qwen3-0.6B": dict(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, ffn=3072, vocab=151936, tied=True),
    "qwen3-1.7B": dict(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936, tied=True),
}


def template(shape: str):
    """The config whose family and settings a shape takes: Qwen3's for its shapes, else the default target's."""
    if shape.startswith("qwen3"):
        from transformers import Qwen3Config

        return Qwen3Config(rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960)
    return load("default").config


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("quant", choices=sorted(QUANTS))
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> None:
    args = parser().parse_args()
    config = llama_config(SHAPES[args.shape], template(args.shape))
    state = random_state_dict(config, torch.float32, "cpu", args.seed)
    print(
        "wrote",
        write_gguf(config, state, None, args.out, quant=args.quant, tokenizer_gguf=default_gguf(), random_weights=True),
    )


if __name__ == "__main__":
    main()
