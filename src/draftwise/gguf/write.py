"""GGUF export: a model draftwise loads, written as a GGUF file that llama.cpp (the one vendored in llama-cpp-python
0.3.36) runs with the logits of the lean forward.

`write_gguf(config, state_dict, tokenizer, out, quant)` maps Hugging Face tensors to llama.cpp's names and layout;
`gguf.export.export(spec, out, quant, target)` does it for anything `draftwise.runtimes` loads, with the target's
tokenizer.

What llama.cpp needs beyond renaming, per family (read from its converter and `src/models/*.cpp`):

  * llama, mistral -> llama.cpp's `llama` arch, whose RoPE rotates adjacent pairs (i, i+1) where HF rotates halves
    (i, i + d/2): the rows of q_proj and k_proj (and their biases) are reordered within each head, the converter's
    `permute`. qwen2, qwen3, phi3 and the Gemmas run NEOX RoPE (halves), so they are written as they are.
  * Gemma RMSNorms scale by (1 + w): every norm weight is written with the 1 added (as llama.cpp's converters do).
    llama.cpp scales embeddings by √d itself, and always ties the LM head for gemma and gemma2.
  * llama.cpp's gemma2 / gemma3 scale attention by 1/√head_dim (1/√(d/heads) at 46 / 62 layers) and never read
    `query_pre_attn_scalar`: where they differ the ratio is folded into the q projection (gemma2) or the q norm
    (gemma3, whose q norm would undo a scaled projection). Soft-caps, the sliding window and the per-layer pattern of
    local layers (an explicit array, so `layers:` subsets keep their own pattern) are written; gemma3's local layers
    get their own RoPE base, and its global layers the linear RoPE factor.
  * qwen2's q/k/v biases and qwen3's q/k norms are ordinary tensors; phi3's fused qkv_proj and gate_up_proj are what
    llama.cpp's phi3 wants (`attn_qkv`, and `ffn_up` holding gate then up).
  * RoPE: default and linear everywhere; llama3 (a `rope_freqs` tensor) and yarn on the llama arch only (yarn as
    llama.cpp computes it: attention scaled by 0.1·ln(factor) + 1, no mscale).
  * llama.cpp has no sliding window for llama, qwen2, qwen3, and disables phi3's: such a model is written (it is what
    llama.cpp's converter does too) with a warning, as its logits differ once a sequence outgrows the window.

Matrices are stored at `quant` (f32 | f16 | q8_0; a matrix whose rows q8_0 cannot block falls back to f16, as in the
converter); norms, biases and RoPE factors stay f32. The file is written beside `out` and moved into place.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    TENSOR_NAMES,
    GGMLQuantizationType,
    GGUFReader,
    GGUFWriter,
    LlamaFileType,
    RopeScalingType,
)
from gguf.quants import quantize

from ..errors import DraftwiseError
from ..targets.family import FAMILIES, Shape, pair_halves, rope_keys, rope_parameters, unsupported_reason, windows
from . import vocab as gguf_vocab

QUANTS = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),  # gguf-py's quantizers (the lean q4 precision's
    "q4_1": (GGMLQuantizationType.Q4_1, LlamaFileType.MOSTLY_Q4_1),  # test files); Q4_K: llama-quantize
}
FLOATS = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
ARCHS = {
    "llama": MODEL_ARCH.LLAMA,
    "mistral": MODEL_ARCH.LLAMA,
    "qwen2": MODEL_ARCH.QWEN2,
    "qwen3": MODEL_ARCH.QWEN3,
    "phi3": MODEL_ARCH.PHI3,
    "gemma": MODEL_ARCH.GEMMA,
    "gemma2": MODEL_ARCH.GEMMA2,
    "gemma3_text": MODEL_ARCH.GEMMA3,
}
PAIRED_ROPE = (MODEL_ARCH.LLAMA,)  # llama.cpp's "normal" RoPE: adjacent pairs
TIED_ONLY = (MODEL_ARCH.GEMMA, MODEL_ARCH.GEMMA2)  # llama.cpp reads no output.weight for these
SQUARE_ATTENTION = (MODEL_ARCH.QWEN2, MODEL_ARCH.PHI3)  # attn_output is allocated [d, d]: heads × head_dim must be d
ALL_BIASES = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
BIASES = {MODEL_ARCH.LLAMA: ALL_BIASES}  # the biases each arch loads; the others: q/k/v only
QKV_BIASES = ("attn_q", "attn_k", "attn_v", "attn_qkv")
NEVER = 2**30  # a sliding window no context reaches (llama.cpp compares positions as int32)
NO_CAP = 1e9  # gemma2 always soft-caps: a cap this large is the identity to float precision


def _name(tensor: MODEL_TENSOR, bid: int | None = None) -> str:
    return TENSOR_NAMES[tensor].format(bid=bid) + ".weight"


def unsupported(config) -> str | None:
    """Why llama.cpp cannot run `config` with the lean forward's logits (None: it can)."""
    kind = config.model_type
    if kind not in ARCHS:
        return f"model_type {kind!r} is not one of the families GGUF export covers ({', '.join(ARCHS)})"
    reason = unsupported_reason(config)
    if reason:
        return f"{kind}: {reason} (the lean forward does not describe it)"
    arch, shape = ARCHS[kind], Shape.of(config)
    if arch in SQUARE_ATTENTION and shape.num_heads * shape.head_dim != shape.hidden_size:
        return f"llama.cpp's {MODEL_ARCH_NAMES[arch]} needs heads × head_dim = hidden_size"
    keys = set(rope_keys(config))
    for key in keys:
        rope = rope_parameters(config, key)
        kind_of = rope.get("rope_type", "default")
        allowed = ("default", "linear", "llama3", "yarn") if arch in PAIRED_ROPE else ("default", "linear")
        if key == "sliding_attention" and kind_of != "default":
            return f"{kind_of} RoPE on local layers (llama.cpp scales only the global layers' RoPE)"
        if kind_of not in allowed:
            return f"{kind_of} RoPE on llama.cpp's {MODEL_ARCH_NAMES[arch]} arch"
        if kind_of == "yarn" and _yarn_differs(rope):
            return "yarn RoPE with its own attention factor, mscale or truncate (llama.cpp computes 0.1·ln(factor) + 1)"
    return None


def _yarn_differs(rope: dict) -> bool:
    """Whether HF's yarn settings leave llama.cpp's: it always scales attention by 0.1·ln(factor) + 1 (unless a
    DeepSeek log multiplier is set) and truncates the correction range."""
    own = rope.get("attention_factor")
    default = 0.1 * math.log(rope["factor"]) + 1.0 if rope["factor"] > 1 else 1.0
    return (
        (own is not None and abs(own - default) > 1e-6)
        or rope.get("mscale")
        or rope.get("mscale_all_dim")
        or rope.get("truncate") is False
    )


def _fold(config, arch) -> float:
    """The factor that turns llama.cpp's attention scale into this config's (1.0 almost always: see docstring)."""
    shape = Shape.of(config)
    cpp = shape.head_dim**-0.5
    if (arch, shape.num_layers) in ((MODEL_ARCH.GEMMA2, 46), (MODEL_ARCH.GEMMA3, 62)):  # llama.cpp's "27B" rule
        cpp = (shape.hidden_size / shape.num_heads) ** -0.5
    return shape.attn_scale / cpp


def tensors(config, state_dict: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """(GGUF name, fp32 tensor in llama.cpp's layout) for every tensor llama.cpp's arch reads, in file order."""
    arch, family, shape = ARCHS[config.model_type], FAMILIES[config.model_type], Shape.of(config)
    H, KV, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim
    sd = {k: v for k, v in state_dict.items() if not k.endswith("rotary_emb.inv_freq")}  # old checkpoints' buffers
    used: set[str] = set()

    def take(key: str) -> torch.Tensor | None:
        t = sd.get(key)
        if t is not None:
            used.add(key)
            return t.float()
        return None

    def norm(key: str) -> torch.Tensor | None:
        t = take(key)
        return None if t is None else family.norm_scale(t)

    out: list[tuple[str, torch.Tensor]] = []

    def put(tensor: MODEL_TENSOR, bid: int | None, weight, bias=None) -> None:
        if weight is None:
            raise DraftwiseError(
                f"the checkpoint lacks the tensor llama.cpp's {TENSOR_NAMES[tensor].format(bid=bid)} comes from"
            )
        out.append((_name(tensor, bid), weight))
        if bias is not None:
            if TENSOR_NAMES[tensor].split(".")[-1] not in BIASES.get(arch, QKV_BIASES):
                raise DraftwiseError(
                    f"llama.cpp's {MODEL_ARCH_NAMES[arch]} arch has no {TENSOR_NAMES[tensor].split('.')[-1]} "
                    "bias, which this checkpoint has"
                )
            out.append((TENSOR_NAMES[tensor].format(bid=bid) + ".bias", bias))

    def rope_rows(t: torch.Tensor | None, heads: int) -> torch.Tensor | None:  # HF halves -> adjacent pairs
        return t if t is None or arch not in PAIRED_ROPE else pair_halves(t, heads, hd)

    embed = take("model.embed_tokens.weight")
    put(MODEL_TENSOR.TOKEN_EMBD, None, embed)
    put(MODEL_TENSOR.OUTPUT_NORM, None, norm("model.norm.weight"))
    head = take("lm_head.weight")
    if head is not None and not config.tie_word_embeddings and not torch.equal(head, embed):
        if arch in TIED_ONLY:
            raise DraftwiseError(
                f"llama.cpp's {MODEL_ARCH_NAMES[arch]} arch ties the LM head to the embeddings; "
                "this checkpoint's head is its own"
            )
        put(MODEL_TENSOR.OUTPUT, None, head)
    freqs = _llama3_factors(config, shape)
    if freqs is not None:
        put(MODEL_TENSOR.ROPE_FREQS, None, freqs)
    fold = _fold(config, arch)
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        put(MODEL_TENSOR.ATTN_NORM, i, norm(p + "input_layernorm.weight"))
        q_norm, k_norm = norm(p + "self_attn.q_norm.weight"), norm(p + "self_attn.k_norm.weight")
        if family.fused_weights:  # phi3: llama.cpp's attn_qkv and ffn_up (gate rows, then up rows) as HF fuses them
            put(MODEL_TENSOR.ATTN_QKV, i, take(p + "self_attn.qkv_proj.weight"), take(p + "self_attn.qkv_proj.bias"))
        else:
            q, qb = take(p + "self_attn.q_proj.weight"), take(p + "self_attn.q_proj.bias")
            if fold != 1.0 and q_norm is not None:
                q_norm = q_norm * fold  # q = norm(x)·w: scaling w scales q (the projection's scale is normalised away)
            elif fold != 1.0:
                q, qb = q * fold, None if qb is None else qb * fold
            put(MODEL_TENSOR.ATTN_Q, i, rope_rows(q, H), rope_rows(qb, H))
            put(
                MODEL_TENSOR.ATTN_K,
                i,
                rope_rows(take(p + "self_attn.k_proj.weight"), KV),
                rope_rows(take(p + "self_attn.k_proj.bias"), KV),
            )
            put(MODEL_TENSOR.ATTN_V, i, take(p + "self_attn.v_proj.weight"), take(p + "self_attn.v_proj.bias"))
        if q_norm is not None:  # [hd]: per head, in the head's own row order (NEOX arches only: no reordering)
            put(MODEL_TENSOR.ATTN_Q_NORM, i, q_norm)
            put(MODEL_TENSOR.ATTN_K_NORM, i, k_norm)
        put(MODEL_TENSOR.ATTN_OUT, i, take(p + "self_attn.o_proj.weight"), take(p + "self_attn.o_proj.bias"))
        if family.sandwich_norms:
            put(MODEL_TENSOR.ATTN_POST_NORM, i, norm(p + "post_attention_layernorm.weight"))
            put(MODEL_TENSOR.FFN_NORM, i, norm(p + "pre_feedforward_layernorm.weight"))
        else:
            put(MODEL_TENSOR.FFN_NORM, i, norm(p + "post_attention_layernorm.weight"))
        if family.fused_weights:
            put(MODEL_TENSOR.FFN_UP, i, take(p + "mlp.gate_up_proj.weight"), take(p + "mlp.gate_up_proj.bias"))
        else:
            put(MODEL_TENSOR.FFN_GATE, i, take(p + "mlp.gate_proj.weight"), take(p + "mlp.gate_proj.bias"))
            put(MODEL_TENSOR.FFN_UP, i, take(p + "mlp.up_proj.weight"), take(p + "mlp.up_proj.bias"))
        put(MODEL_TENSOR.FFN_DOWN, i, take(p + "mlp.down_proj.weight"), take(p + "mlp.down_proj.bias"))
        if family.sandwich_norms:
            put(MODEL_TENSOR.FFN_POST_NORM, i, norm(p + "post_feedforward_layernorm.weight"))
    left = sorted(set(sd) - used)
    if left:
        raise DraftwiseError(
            f"{len(left)} tensors have no place in llama.cpp's {MODEL_ARCH_NAMES[arch]} arch (e.g. {left[0]})"
        )
    return out


def _llama3_factors(config, shape: Shape) -> torch.Tensor | None:
    """llama3 RoPE as llama.cpp takes it: per frequency, the factor its angle is divided by ([head_dim/2])."""
    rope = rope_parameters(config)
    if rope.get("rope_type") != "llama3":
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base = 1.0 / (rope["rope_theta"] ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim))
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")  # transformers' own llama3 frequencies
    return (base.double() / scaled.double()).float()


def _metadata(w: GGUFWriter, config, arch, quant: str, vocab_size: int) -> None:
    shape = Shape.of(config)
    # no general.name: llama.cpp patches token attributes by model name (a name holding "phi3" makes it look up
    # "<|endoftext|>", and fail to load a vocabulary without it)
    w.add_file_type(QUANTS[quant][1])
    w.add_vocab_size(vocab_size)
    w.add_context_length(getattr(config, "max_position_embeddings", None) or 4096)
    w.add_embedding_length(shape.hidden_size)
    w.add_block_count(shape.num_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    full = rope_parameters(config, "full_attention")  # Gemma 3's global layers' RoPE; the only one elsewhere
    w.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":
        w.add_rope_scaling_type(RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(full["factor"])
    elif full.get("rope_type") == "yarn":
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(full["factor"])
        w.add_rope_scaling_orig_ctx_len(full.get("original_max_position_embeddings") or config.max_position_embeddings)
        for key, add in (
            ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
            ("beta_slow", w.add_rope_scaling_yarn_beta_slow),
        ):
            if full.get(key) is not None:
                add(full[key])
    layer_windows = windows(config)
    local = [wnd is not None for wnd in layer_windows]
    window = next((wnd for wnd in layer_windows if wnd is not None), None)
    if arch == MODEL_ARCH.GEMMA2:
        w.add_attn_logit_softcapping(shape.attn_softcap or NO_CAP)
        w.add_final_logit_softcapping(shape.final_softcap or NO_CAP)
        if window is None:  # llama.cpp aborts on a gemma2 without local layers: all local, with a window never reached
            window, local = NEVER, [True] * len(local)
        w.add_sliding_window(window)
        w.add_sliding_window_pattern(local)
    elif arch == MODEL_ARCH.GEMMA3:
        if shape.final_softcap:
            w.add_final_logit_softcapping(shape.final_softcap)
        if window is not None:  # else llama.cpp runs every layer global
            w.add_sliding_window(window)
            w.add_sliding_window_pattern(local)
            w.add_rope_freq_base_swa(rope_parameters(config, "sliding_attention")["rope_theta"])
    elif window is not None and window < (getattr(config, "max_position_embeddings", None) or 0):
        print(
            f"draftwise: warning: llama.cpp's {MODEL_ARCH_NAMES[arch]} arch has no sliding window: past {window} "
            "positions its logits differ from this model's",
            file=sys.stderr,
        )


def _stored(t: torch.Tensor, name: str, qtype: GGMLQuantizationType) -> tuple[GGMLQuantizationType, tuple[int, ...]]:
    """The type a tensor is stored as (2-D matrices at `qtype`, the rest f32) and its shape in that type's bytes."""
    if t.ndim != 2 or not name.endswith(".weight") or qtype == GGMLQuantizationType.F32:
        return GGMLQuantizationType.F32, tuple(t.shape)
    if qtype not in FLOATS:
        block, size = GGML_QUANT_SIZES[qtype]
        if t.shape[1] % block == 0:
            return qtype, (t.shape[0], t.shape[1] // block * size)
        qtype = GGMLQuantizationType.F16  # rows the type cannot block, as llama.cpp's converter falls back
    return qtype, tuple(t.shape)


def _encode(t: torch.Tensor, qtype: GGMLQuantizationType) -> np.ndarray:
    data = t.detach().cpu().contiguous().numpy().astype(np.float32, copy=False)
    if qtype == GGMLQuantizationType.F32:
        return data
    if qtype == GGMLQuantizationType.F16:
        return data.astype(np.float16)
    return quantize(data, qtype)


RANDOM_KEY = "draftwise.random_weights"  # a file of random weights in a real model's shape (`scripts/shape_gguf.py`)


def has_random_weights(path: Path) -> bool:
    """Whether draftwise wrote the GGUF file `path` with random weights (`write_gguf(random_weights=True)`)."""
    return _marked(str(Path(path).resolve()), Path(path).stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _marked(path: str, stamp: int) -> bool:
    return RANDOM_KEY in GGUFReader(path).fields


def write_gguf(
    config,
    state_dict: dict[str, torch.Tensor],
    tokenizer,
    out: str | os.PathLike,
    quant: str = "f32",
    tokenizer_gguf: str | os.PathLike | None = None,
    random_weights: bool = False,
) -> Path:
    """Write `config` + `state_dict` (Hugging Face names; a tied head may be absent) as a GGUF file llama.cpp runs.
    The tokenizer keys are `tokenizer_gguf`'s, copied verbatim, when given, else built from `tokenizer`;
    `random_weights` marks a file of random weights (`RANDOM_KEY`): its costs are real, its acceptance is not (a
    `tokenizer_gguf` with fewer tokens than the shape's vocabulary is then padded with unused ones)."""
    if quant not in QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    reason = unsupported(config)
    if reason:
        raise DraftwiseError(f"cannot export to GGUF: {reason}")
    arch = ARCHS[config.model_type]
    planned = tensors(config, state_dict)
    vocab_size = planned[0][1].shape[0]  # token_embd rows: llama.cpp's vocabulary must have exactly as many tokens
    if config.vocab_size != vocab_size:
        raise DraftwiseError(f"config vocab_size {config.vocab_size} but the embedding has {vocab_size} rows")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    writer = GGUFWriter(tmp, MODEL_ARCH_NAMES[arch])
    try:
        _metadata(writer, config, arch, quant, vocab_size)
        if random_weights:
            writer.add_bool(RANDOM_KEY, True)
        if tokenizer_gguf is not None:
            gguf_vocab.copy_tokenizer(writer, Path(tokenizer_gguf), vocab_size, pad=random_weights)
        else:
            gguf_vocab.build_tokenizer(writer, tokenizer, vocab_size)
        stored = []
        for name, t in planned:
            qtype, shape = _stored(t, name, QUANTS[quant][0])
            dtype = np.dtype(FLOATS.get(qtype, np.uint8))  # a block type's shape is in bytes
            writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize, raw_dtype=qtype)
            stored.append(qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for (_name, t), qtype in zip(planned, stored):  # one tensor encoded at a time: a copy of one, not of all
            writer.write_tensor_data(_encode(t, qtype))
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out
