"""The bank: a matrix's rows found among a GGUF file's tensors by their values (in whatever order the lean engine keeps
them) and held as the narrowest of the file's blocks that holds every row exactly."""

from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from conftest import raw_rows, small_gguf
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean.bank import Bank
from draftwise.runtimes.lean.int8 import Int8Weight
from draftwise.runtimes.lean.q4 import Q4Weight
from draftwise.runtimes.lean.q56 import Q5Weight, Q6Weight
from draftwise.runtimes.registry import load


def write(path: Path, tensors: dict[str, tuple[str, int, int]]) -> dict[str, torch.Tensor]:
    """A GGUF file of random blocks {name: (type, rows, inputs)}; returns each tensor's values as gguf-py reads them."""
    writer = gguf.GGUFWriter(str(path), "llama")
    values = {}
    for seed, (name, (qtype, n, k)) in enumerate(tensors.items()):
        raw = raw_rows(qtype, n, k, seed)
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[qtype])
        values[name] = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType[qtype]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


def test_a_k_quant_mix_is_held_as_the_file_holds_each_part(tmp_path):
    types = {"k": "Q4_K", "o": "Q4_1", "d": "Q6_K", "g": "Q5_0", "u": "Q5_1", "v": "Q8_0"}
    v = write(tmp_path / "mix.gguf", {f"{name}.weight": (t, 32, 512) for name, t in types.items()})
    bank = Bank(tmp_path / "mix.gguf")
    assert len(bank) == 2  # the 4-bit tensors: q4 refuses a file with none
    rows = [3, 1, 7, 30]
    for name, kind, fmt in [("d", Q6Weight, 3), ("g", Q5Weight, 1), ("u", Q5Weight, 1), ("k", Q4Weight, 2)]:
        w = bank.weight(v[f"{name}.weight"][rows])
        assert type(w) is kind and w.scale_format == fmt, name
        assert torch.equal(w.dequantize(), v[f"{name}.weight"][rows]), name
    fused = torch.cat([v["g.weight"][:2], v["v.weight"][:2]])  # 5- and 8-bit rows: int8 holds both exactly
    w = bank.weight(fused)
    assert type(w) is Int8Weight and torch.equal(w.dequantize(), fused)
    mixed = torch.cat([v["k.weight"][:2], v["o.weight"][:2]])  # two 4-bit formats: fp32 scales
    w = bank.weight(mixed)
    assert type(w) is Q4Weight and w.scale_format == 0 and torch.equal(w.dequantize(), mixed)
    assert bank.weight(torch.cat([v["k.weight"][:2], v["d.weight"][:2]])) is None  # 4 and 6 bits: no one format
    assert bank.weight(torch.randn(2, 512)) is None  # rows of no tensor


def test_a_files_q8_0_matrices_are_found_and_held_as_the_file_holds_them(tmp_path):
    """A small model's matrices in the file's Q8_0 tensors, at int8 as the file holds them: not a requantization."""
    path = small_gguf(tmp_path, "q8_0")
    fp = load(path, ModelOptions(dtype="fp32")).lm
    bank = Bank(Path(path))
    assert len(bank) == 0
    for name in ("wqkv", "wgu", "wd"):
        held = bank.weight(getattr(fp.layers[0], name))
        assert type(held) is Int8Weight and held.scale_format == 1, name
        assert torch.equal(held.dequantize(), getattr(fp.layers[0], name)), name
    assert not torch.equal(Int8Weight(fp.layers[0].wqkv).dequantize(), fp.layers[0].wqkv)  # what it replaces


def test_5_bit_blocks_whose_offset_fp16_cannot_hold_are_held_at_int8(tmp_path):
    """Q5_0's offset is -16·d: past fp16's range for d > 4094, so such a tensor's rows run at int8, still exact."""
    raw = raw_rows("Q5_0", 4, 64, seed=1).reshape(4, 2, 22)
    raw[0, 0, :2] = np.array([5000.0], dtype=np.float16).view(np.uint8)
    writer = gguf.GGUFWriter(str(tmp_path / "big.gguf"), "llama")
    writer.add_tensor("big.weight", raw.reshape(4, -1), raw_dtype=GGMLQuantizationType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values = torch.from_numpy(gguf_dequantize(raw.reshape(4, -1), GGMLQuantizationType.Q5_0))
    w = Bank(tmp_path / "big.gguf").weight(values[[2, 0]])
    assert type(w) is Int8Weight and torch.equal(w.dequantize(), values[[2, 0]])
    assert type(Bank(tmp_path / "big.gguf").weight(values[[2, 1]])) is Q5Weight  # rows without it: 5 bits
