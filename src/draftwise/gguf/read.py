"""Reading GGUF files without loading their weights: a file cut short is refused by walking its header
(`check_gguf`), its quantization is named as llama.cpp names it (`quant_name`), and the note draftwise writes beside a
file it wrote says what the file was written from (`note`)."""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path

from ..errors import DraftwiseError


def check_gguf(path: Path) -> None:
    """Refuse, with one line, a GGUF file cut short (a partial download): its header is walked (no weights are read)
    and every tensor's extent (data start + offset + its bytes) is compared with the file's size. A file this walk
    cannot follow (not GGUF, an unknown value or tensor type) is left to the reader that loads it, which names its
    own error."""
    import gguf as gg

    size = path.stat().st_size
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    at, order = 0, "<"

    def skip(n: int) -> int:
        nonlocal at
        if at + n > size:
            raise EOFError
        at += n
        return at - n

    def read(fmt: str):
        return struct.unpack_from(order + fmt, buf, skip(struct.calcsize(order + fmt)))[0]

    def value(kind: int):
        if kind == gg.GGUFValueType.STRING:
            return bytes(buf[skip(read("Q")) : at])
        if kind == gg.GGUFValueType.ARRAY:
            item, n = read("I"), read("Q")
            if item in _SCALARS:  # skipped whole: a vocabulary's token types are tens of thousands of items
                return skip(n * struct.calcsize(_SCALARS[item]))
            return [value(item) for _ in range(n)]
        return read(_SCALARS[kind])  # KeyError: a type this walk does not know

    try:
        if not b"GGUF".startswith(buf[:4]):
            return
        skip(4)
        order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # a big-endian file reads 0 here
        skip(4)
        n_tensors, n_fields = read("Q"), read("Q")
        alignment = gg.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_fields):
            key, kind = value(gg.GGUFValueType.STRING), read("I")
            got = value(kind)
            if key == b"general.alignment" and kind == gg.GGUFValueType.UINT32 and got:
                alignment = got
        ends = []
        for _ in range(n_tensors):
            name, shape = value(gg.GGUFValueType.STRING), [read("Q") for _ in range(read("I"))]
            block, type_size = gg.GGML_QUANT_SIZES[gg.GGMLQuantizationType(read("I"))]
            ends.append((read("Q") + math.prod(shape) // block * type_size, name.decode(errors="replace")))
    except EOFError:
        raise DraftwiseError(
            f"{path} is truncated: its header runs past the file's {size} bytes (a partial download?)"
        ) from None
    except (KeyError, ValueError):  # an unknown value or tensor type: not this check's to judge
        return
    finally:
        if size:
            buf.close()
    end, name = max(ends, default=(0, ""))
    if at + (-at) % alignment + end > size:  # tensor data starts at the header's end, aligned
        raise DraftwiseError(
            f"{path} is truncated: tensor {name} needs bytes up to {at + (-at) % alignment + end} "
            f"but the file has {size} (a partial download?)"
        )


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUFValueType


def quant_name(gguf: Path) -> str:
    """The GGUF's file type as llama.cpp names it (F32, F16, Q8_0, Q4_1, ...)."""
    import gguf as gg

    reader = gg.GGUFReader(str(gguf))
    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown"
    name = gg.LlamaFileType(int(field.contents())).name
    return name.removeprefix("MOSTLY_").replace("ALL_", "")


def source(gguf: Path) -> Path:
    """The note beside a GGUF file draftwise wrote, naming what it was written from."""
    return gguf.with_suffix(".source.json")


def note(gguf: Path) -> dict:
    """What a GGUF file draftwise wrote was written from (`source`); {} for any other file."""
    return json.loads(source(gguf).read_text()) if source(gguf).is_file() else {}
