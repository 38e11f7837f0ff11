"""The lean forward: one decoder for Llama and its relatives (Mistral, Qwen2/3, Phi-3, Gemma 1/2/3), loading the
same Hugging Face weights; what each family changes is a few switches read from its config (`family.py`).

Why not the transformers model: at batch 1 on a CPU a decoding step is a few hundred small ops whose overhead,
and BLAS paths that are slow for a few rows, dominate. Here a layer is ~25 ops, q/k/v and gate/up are fused into one
matmul each, and the KV cache is preallocated and indexed by absolute position (the gpt-fast design): rolling back
rejected draft tokens costs nothing, the next forward simply writes over them. Sliding-window layers keep the whole
cache too and mask what lies outside their window, so a rollback stays free for them as well.

Internal layout (invisible outside): the rows of q_proj and k_proj are permuted within each head so that the two
halves HF's `rotate_half` pairs (i, i + head_dim/2) become adjacent, and RoPE is one complex multiplication. Attention
scores are unchanged (q and k get the same permutation, and so do the q/k norm weights; v is untouched).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...targets.family import FAMILIES, Shape, layer_tensors, rope_keys, rope_table, unsupported_reason, windows
from . import kernels
from . import prompt as prompt_path
from .attention import attend, key_mask, rotate
from .int8 import LINEARS, Int8Weight
from .int8 import NAME as INT8
from .kernels import gelu_tanh_mul, linear, rms_norm, silu_mul

__all__ = ["LeanLM", "Layer", "Shape", "rope_table", "unsupported_reason"]


def hold(module: nn.Module, name: str, t: torch.Tensor | Int8Weight | None, precision: str = "fp32") -> None:
    """Give `module` a weight named `name`: a buffer, or an `Int8Weight` submodule (one given, or at the int8
    precision one quantized from `t`)."""
    if isinstance(t, Int8Weight) or (t is not None and precision == INT8):
        setattr(module, name, t if isinstance(t, Int8Weight) else Int8Weight(t))
    else:
        module.register_buffer(name, None if t is None else t.contiguous(), persistent=False)


class Layer(nn.Module):
    """One decoder block with fused projections; holds weights and its own attention settings (window, RoPE table
    key), not the cache (that lives in the model), so a layer keeps them when it serves in another model (`subset`).
    `tensors`: its weights in the lean layout (`family.layer_tensors`, or a pack's: `packed.py`); `precision` int8:
    its matrices in int8 (`int8.py`)."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor | Int8Weight | None],
        shape: Shape,
        family,
        window: int | None = None,
        rope_key: str | None = None,
        precision: str = "fp32",
    ):
        super().__init__()
        self.tensor_names = tuple(tensors)
        for name, t in tensors.items():
            hold(self, name, t, precision if name in LINEARS else "fp32")
        self.shape, self.window, self.rope_key = shape, window, rope_key
        self.act_mul = gelu_tanh_mul if family.activation == "gelu_tanh" else silu_mul
        self._fused: tuple | None = None  # (kernels.LayerStruct or None,) once made

    def __setattr__(self, name, value):
        if name in self.__dict__.get("tensor_names", ()):  # a weight replaced (a bank's): the C form points at the old
            self.__dict__["_fused"] = None
        super().__setattr__(name, value)

    def _apply(self, fn, *args, **kwargs):  # .to(), .float(): the buffers move, and the C form points into them
        self.__dict__["_fused"] = None
        return super()._apply(fn, *args, **kwargs)

    def fused(self):
        """This layer as one C call (`kernels.layer_struct`), or None; made at its first pass, again after a weight was
        replaced or moved (`__setattr__`, `_apply`) or its activation bits changed (`with_activations`)."""
        if self._fused is None:
            self._fused = (kernels.layer_struct(self, self.act_mul is gelu_tanh_mul),)
        return self._fused[0]

    def with_activations(self, bits: int) -> None:
        """Its integer matrices multiplied with `bits`-bit activations (`activations.with_activations`); the fused C
        call, which holds a copy of them, is remade at its next pass."""
        for name in LINEARS:
            if isinstance(getattr(self, name), Int8Weight):
                getattr(self, name).abits = bits
        self._fused = None

    def rows_fused(self, T: int) -> bool:
        """Whether a pass of T rows takes the fused C layer: up to MAX_ROWS, and any number where every matrix is int8
        or q4 (their products are the C kernel's at any size): a prompt's keys then have the same bits however it is
        cut into chunks (`serve.batch`), as its attention is computed query by query either way."""
        return T <= kernels.MAX_ROWS or all(isinstance(getattr(self, name), Int8Weight) for name in LINEARS)

    def forward(
        self, x, rot, k_cache, v_cache, pos, mask, start: list[int] | None, positions=None, prompt=False, bf16=False
    ):
        # x [B, T, D]; rot [S, hd/2] complex; k_cache, v_cache [B, KV, S, hd]; mask [B or 1, 1, T, pos+T] bool or None
        # (this layer's: a sliding window already applied); positions [B, T]: each row's own RoPE positions when cache
        # slots and positions differ (batched SD); pos a list: row b at its own position pos[b], slot = position (a
        # continuous batch), mask then a list of each row's; prompt: a prompt pass, on the route's prompt table, and
        # bf16: one whose matrices may take torch's bf16 product (`prompt.py`)
        s = self.shape
        T = x.shape[1]
        fast = positions is None and not bf16 and self.rows_fused(T) and kernels.fast_path(x)
        fused = self.fused() if fast else None
        if fused is not None:  # the same kernels, one call
            stack = kernels.Stack([fused], [rot])
            return kernels.layers(stack, x, k_cache[None], v_cache[None], pos, start, prompt=prompt)
        lin = prompt_path.linear if bf16 else (lambda x, w, b: linear(x, w, b, prompt))
        qkv = lin(rms_norm(x, self.ln_attn, s.rms_eps), self.wqkv, self.bqkv)  # [B, T, (H+2KV)*hd]
        if positions is not None:
            att = self.attention(qkv, rot[positions][:, :, None, :], k_cache, v_cache, pos, mask)
        elif kernels.fast_path(qkv) and T <= kernels.MAX_ROWS and s.head_dim % 8 == 0:
            att = kernels.attention(
                qkv,
                rot,
                k_cache,
                v_cache,
                pos,
                s.num_heads,
                s.head_dim,
                start,
                scale=s.attn_scale,
                q_norm=self.q_norm,
                k_norm=self.k_norm,
                norm_eps=s.rms_eps,
                window=self.window,
                softcap=s.attn_softcap,
            )
        elif isinstance(pos, list):  # each row alone, as at batch 1
            rows = zip(pos, mask, qkv.split(1), k_cache.split(1), v_cache.split(1))
            att = torch.cat([self.attention(q, rot[p : p + T, None, :], k, v, p, m) for p, m, q, k, v in rows])
        else:
            att = self.attention(qkv, rot[pos : pos + T, None, :], k_cache, v_cache, pos, mask)
        out = lin(att, self.wo, self.bo)  # att [B, T, H*hd]
        if self.ln_attn_out is not None:
            out = rms_norm(out, self.ln_attn_out, s.rms_eps)
        x = x + out
        gu = lin(rms_norm(x, self.ln_mlp, s.rms_eps), self.wgu, self.bgu)  # [B, T, 2F]
        out = lin(self.act_mul(gu), self.wd, self.bd)
        if self.ln_mlp_out is not None:
            out = rms_norm(out, self.ln_mlp_out, s.rms_eps)
        return x + out

    def attention(self, qkv, rot, k_cache, v_cache, pos: int, mask):
        """Torch attention: q/k norms, RoPE on q and k, cache write, attention.
        rot [T or B×T, 1, hd/2] -> [B, T, H*hd]."""
        B, T, _ = qkv.shape
        s = self.shape
        H, KV, hd = s.num_heads, s.num_kv_heads, s.head_dim
        qkv = qkv.view(B, T, H + 2 * KV, hd)
        q, k = qkv[:, :, :H], qkv[:, :, H : H + KV]
        if self.q_norm is not None:  # before RoPE, per head
            q, k = F.rms_norm(q, (hd,), self.q_norm, s.rms_eps), F.rms_norm(k, (hd,), self.k_norm, s.rms_eps)
        q, k = rotate(q, rot), rotate(k, rot)  # [B, T, H or KV, hd]
        end = pos + T
        k_cache[:, :, pos:end] = k.transpose(1, 2)
        v_cache[:, :, pos:end] = qkv[:, :, H + KV :].transpose(1, 2)
        att = attend(q.transpose(1, 2), k_cache[:, :, :end], v_cache[:, :, :end], mask, s)  # [B, H, T, hd]
        return att.transpose(1, 2).reshape(B, T, H * hd)


class LeanLM(nn.Module):
    """A causal LM with a preallocated KV cache: `reset(batch, max_len)`, then `forward(ids, pos)` calls.

    `forward(ids [B, T], pos)` writes the keys/values of positions pos..pos+T-1, attends to positions < pos+T and
    returns logits of the last `n_logits` positions (all T when None). Calling it with a smaller `pos` than before
    discards everything from `pos` on: that is the whole rollback.
    """

    preallocated_cache = True  # its cache costs the same whatever it holds (`runtimes.registry.fill_cache`)
    prompt_lossy = True  # whether prompt passes may take a lossy path (`prompt.py`; off where measured to miss the bar)

    def __init__(
        self,
        config,
        state_dict: dict[str, torch.Tensor],
        layers: list[Layer] | None = None,
        compile: bool = False,
        precision: str = "fp32",
    ):
        super().__init__()
        reason = unsupported_reason(config)
        if reason:
            raise ValueError(f"lean path cannot run this model: {reason}")
        self.config = config
        self.shape = Shape.of(config)
        self.family = FAMILIES[config.model_type]
        sd = state_dict
        self.register_buffer("embed", sd["model.embed_tokens.weight"], persistent=False)
        self.norm_weight = norm = sd["model.norm.weight"]  # as checkpoints store it (`norm` has the offset folded in)
        self.register_buffer("norm", self.family.norm_scale(norm), persistent=False)
        head = sd.get("lm_head.weight")  # a tied head as the embedding, unless given already packed (`subset`, a pack)
        if head is None or (config.tie_word_embeddings and not isinstance(head, Int8Weight)):
            head = sd["model.embed_tokens.weight"]
        self.precision = precision  # fp32 (or the weights' float dtype) | int8: matrices and head in int8
        hold(self, "head", head, precision)
        if layers is None:
            tensors = lambda i: layer_tensors(sd, f"model.layers.{i}.", self.family, self.shape)  # noqa: E731
            layers = [
                Layer(tensors(i), self.shape, self.family, window, key, precision)
                for i, (window, key) in enumerate(zip(windows(config), rope_keys(config)))
            ]
        self.layers = nn.ModuleList(layers)
        self.vocab_size = self.head.shape[0]  # an Int8Weight has a shape too
        self.embed_scale = self.family.embedding_scale(self.shape.hidden_size, self.dtype)
        if compile:  # fuses each layer's elementwise ops (a win where op launches dominate, e.g. a GPU at batch 1)
            for layer in self.layers:
                layer.compile(dynamic=True)
        self._rot = {key: rope_table(config, self.shape, 0, key) for key in {layer.rope_key for layer in self.layers}}
        self.k_cache = self.v_cache = None
        self._stack: kernels.Stack | None = None  # every layer as one C call (`stack`)
        self.last_hidden: torch.Tensor | None = None  # the last forward's hidden states (see `features`)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def rotations(self, n: int) -> dict[str | None, torch.Tensor]:
        """The RoPE tables [≥ n, hd/2] (complex) of each layer type, grown when needed."""
        for key, rot in self._rot.items():
            if n > rot.shape[0]:
                self._rot[key] = rope_table(self.config, self.shape, max(n, 2 * rot.shape[0]), key).to(self.device)
        return self._rot

    def reset(self, batch_size: int, max_len: int) -> None:
        """Make room for `max_len` positions of `batch_size` sequences (reuses the buffers when they fit)."""
        s = self.shape
        self.rotations(max_len)
        want = (len(self.layers), batch_size, s.num_kv_heads, max_len, s.head_dim)
        have = None if self.k_cache is None else self.k_cache.shape
        if have is None or have[1] != batch_size or have[3] < max_len:
            self.k_cache = torch.zeros(want, dtype=self.dtype, device=self.device)  # [L, B, KV, S, hd]
            self.v_cache = torch.zeros(want, dtype=self.dtype, device=self.device)

    def repeat_rows(self, n: int) -> None:
        """Each row's cache copied `n` times in its place (row b → rows b·n … b·n + n − 1): a prompt prefilled once
        and continued n ways (`sd.batched.prefill`)."""
        self.k_cache = self.k_cache.repeat_interleave(n, dim=1)
        self.v_cache = self.v_cache.repeat_interleave(n, dim=1)

    @property
    def max_len(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[3]

    def kv_bytes(self) -> int:
        return 0 if self.k_cache is None else 2 * self.k_cache.numel() * self.k_cache.element_size()

    def weight_bytes(self) -> int:
        """Bytes of weights one decoding step reads: every matrix, norm and the head; the embedding table only as the
        head (a step gathers one row of it), each storage once."""
        seen, total = set(), 0
        for name, t in self.named_buffers(remove_duplicate=False):  # a tied head is the embedding's tensor itself
            if name != "embed" and t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        pos: int | list[int],
        n_logits: int | None = None,
        start: list[int] | None = None,
        positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
        cache: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """`start[b]`: the first real position of row b, for batches of left-padded prompts (keys before it are
        ignored; RoPE is relative, so a row's absolute offset does not matter).

        Batched SD (`sd.rows`) decouples cache slots from positions: `pos` is then the first slot written, for every
        row alike; `positions` [B, T] the RoPE position of each token in its own row; `key_positions` [B, S] the
        position of the token each slot of the row holds, -1 where it holds none (keys are cached already rotated,
        so slots a row leaves unused cost nothing but masked attention).

        A continuous batch (`serve.batch`) gives each row its own position, `pos` a list, and the caches it keeps
        (`cache`: k and v [L, B, KV, S, hd]); each row is then computed as it would be alone at batch 1."""
        B, T = ids.shape
        if isinstance(pos, list) and B == 1:  # a row alone: the one-sequence path, as `sd.loop.generate` runs it
            pos = pos[0]
        k_cache, v_cache = cache if cache is not None else (self.k_cache, self.v_cache)
        end = (max(pos) if isinstance(pos, list) else pos) + T
        if k_cache is None or k_cache.shape[1] != B or end > k_cache.shape[3]:
            raise ValueError(
                f"KV cache holds {0 if k_cache is None else k_cache.shape[3]} positions for batch "
                f"{k_cache.shape[1] if k_cache is not None else 0}; need {end} for batch {B}: call reset() first"
            )
        x = self.embed_tokens(ids)  # [B, T, D]
        prompt = n_logits == 0 and positions is None and self.prompt_lossy  # a prompt pass (`prompt.py`)
        bf16 = prompt and prompt_path.takes_bf16(self, B * T)
        stack = self.stack(T) if positions is None and not bf16 and kernels.fast_path(x) else None
        if stack is not None:  # every layer in one C call: no Python between them
            x = kernels.layers(stack, x, k_cache, v_cache, pos, start, prompt=prompt)
        else:
            x = self._layers(x, k_cache, v_cache, pos, start, positions, key_positions, prompt, bf16)
        self.last_hidden = x  # [B, T, D] before the final norm: what a feature-level drafter reads (`features`)
        if n_logits == 0:  # prefill that only fills the cache
            return x.new_empty(B, 0, self.vocab_size)
        if n_logits is not None:
            x = x[:, -n_logits:]
        return self.logits(x)

    def _layers(self, x, k_cache, v_cache, pos, start, positions, key_positions, prompt=False, bf16=False):
        """The layers one by one (`Layer.forward`): where some layer or the pass takes a path other than `stack`'s."""
        T = x.shape[1]
        masks = {w: self._masks(T, pos, start, positions, key_positions, w) for w in {la.window for la in self.layers}}
        if positions is not None:  # else `reset` (or the caller's cache, `serve.batch`) made the tables
            self.rotations(int(positions.max()) + 1)
        for i, layer in enumerate(self.layers):
            rot = self._rot[layer.rope_key]
            x = layer(x, rot, k_cache[i], v_cache[i], pos, masks[layer.window], start, positions, prompt, bf16)
        return x

    def stack(self, rows: int) -> kernels.Stack | None:
        """Every layer as one C call (`kernels.layers`) for a pass of `rows` rows, or None where a layer takes another
        path (`Layer.fused`, `Layer.rows_fused`); made once, again when a layer's fused form or a RoPE table was
        remade."""
        structs = [layer.fused() for layer in self.layers]
        if not all(structs) or not all(layer.rows_fused(rows) for layer in self.layers):
            return None
        rots = [self._rot[layer.rope_key] for layer in self.layers]
        if self._stack is None or self._stack.keys != kernels.Stack.key(structs, rots):
            self._stack = kernels.Stack(structs, rots)
        return self._stack

    @torch.inference_mode()
    def forward_segments(self, segments: list[tuple[list[int], int, int, int]], cache) -> list[torch.Tensor]:
        """Rows of several sequences in one pass, each as `forward` of that row alone computes it: segment (ids,
        cache row, position, n_logits) writes its keys and values in that row of `cache` (k and v [L, rows, KV, S,
        hd]) from `position` on and returns the logits of its last n_logits tokens [n_logits, V]. On the fused C
        layer the weights are read once for all the segments (a continuous batch's decoding rows and a joining
        prompt's chunk, `serve.batch`); elsewhere each segment is its own `forward`, and so is a prompt's chunk that
        takes a lossy path (`prompt.py`: its own prompt pass, as when it is prefilled alone)."""
        k, v = cache
        apart = [i for i, (ids, _, _, n) in enumerate(segments) if n == 0 and prompt_path.lossy(self, len(ids))]
        if apart:
            for ids, r, pos, _ in (segments[i] for i in apart):
                self.forward(torch.tensor([ids]), pos, 0, cache=(k[:, r : r + 1], v[:, r : r + 1]))
            others = [s for i, s in enumerate(segments) if i not in apart]
            rest = iter(self.forward_segments(others, cache) if others else ())
            return [
                self.embed.new_empty(0, self.vocab_size) if i in apart else next(rest) for i in range(len(segments))
            ]
        rows = sum(len(ids) for ids, *_ in segments)
        self.rotations(max(pos + len(ids) for ids, _, pos, _ in segments))
        stack = self.stack(rows) if kernels.fast_path(self.embed) else None
        if stack is None:
            alone = [(torch.tensor([ids]), pos, n, (k[:, r : r + 1], v[:, r : r + 1])) for ids, r, pos, n in segments]
            return [self.forward(ids, pos, n, cache=c)[0] for ids, pos, n, c in alone]
        x = self.embed_tokens(torch.tensor([[t for ids, *_ in segments for t in ids]]))[0]  # [R, D]
        x = kernels.layers(stack, x, k, v, segments=[(len(ids), r, pos) for ids, r, pos, _ in segments])
        ends = torch.tensor([len(ids) for ids, *_ in segments]).cumsum(0).tolist()
        picked = [x[end - n : end] for end, (*_, n) in zip(ends, segments)]  # each segment's last n rows
        self.last_hidden = torch.cat(picked)[None]
        return list(self.logits(self.last_hidden)[0].split([n for *_, n in segments]))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The residual stream's input: ids [B, T] -> [B, T, D] (× √d in the families that scale it)."""
        x = F.embedding(ids, self.embed)
        return x if self.embed_scale is None else x * self.embed_scale

    def _masks(self, T: int, pos: int | list[int], start, positions, key_positions, window: int | None):
        """`attention.key_mask`, or each row's when rows are at their own positions (`pos` a list)."""
        if isinstance(pos, list):
            return [key_mask(T, p, None, None, None, window, self.device) for p in pos]
        return key_mask(T, pos, start, positions, key_positions, window, self.device)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The target's feature at each position: the final-normed hidden state the LM head reads, [..., D] (from
        `last_hidden` or any hidden states); feature-level drafters and the teacher cache read these."""
        return rms_norm(x, self.norm, self.shape.rms_eps)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and LM head (and the family's soft-capping): hidden states [B, T, D] -> logits [B, T, V]."""
        logits = linear(self.features(x), self.head)
        return logits if self.shape.final_softcap is None else kernels.softcap(logits, self.shape.final_softcap)

    def subset(self, layer_ids: list[int], config) -> LeanLM:
        """A model made of some of these layers (renumbered 0..k-1), sharing all weights with this one."""
        sd = {
            "model.embed_tokens.weight": self.embed,
            "model.norm.weight": self.norm_weight,
            "lm_head.weight": self.head,
        }
        return LeanLM(config, sd, layers=[self.layers[i] for i in layer_ids], precision=self.precision)
