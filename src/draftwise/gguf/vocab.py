"""Tokenizer metadata of a GGUF file draftwise writes (`gguf.write`): copied from another GGUF, or built from a
Hugging Face tokenizer.

Copied (`copy_tokenizer`) is the main path: a drafter exported for a GGUF target carries every `tokenizer.*`
key/value of the target's file byte for byte, so llama-server's draft-compatibility check (vocabulary type, BOS/EOS
ids, the text of every token) passes with `-md`.

Built (`build_tokenizer`) from a Hugging Face tokenizer, with one token per embedding row (ids the tokenizer lacks
become unused `[PAD{i}]` tokens, as llama.cpp's converter pads them):

  * a BPE tokenizer.json -> `tokenizer.ggml.model = "gpt2"`: its tokens (by id), token types (control for special
    added tokens, user-defined for other added tokens, normal else), merges, special ids, chat template.
    `tokenizer.ggml.pre` is "gpt-2" when the pre-tokenizer is GPT-2's byte-level one, else "default". llama.cpp's
    converter instead recognises a pre-tokenizer by hashing how it splits a probe text against a table of known
    models; draftwise has no such table and always hands llama.cpp token ids, so the pre-tokenizer only decides how
    llama-server splits *text* it is sent (a prompt typed into its own endpoints), never what draftwise measures.
  * any other tokenizer (WordLevel, WordPiece, Unigram, a slow tokenizer) -> llama.cpp's "whitespace" model
    (`tokenizer.ggml.pre = "whitespace"`: text is cut at whitespace and each piece looked up through BPE merges),
    with merges that build each multi-character token left to right. For a WordLevel vocabulary over whitespace-split
    words (the tests' tokenizer) llama-server then tokenizes text as transformers does; for others it is a best
    effort that loads, and again only llama-server's text paths see it.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
from gguf import GGUFValueType, TokenType

from ..errors import DraftwiseError
from .read import check_gguf

PREFIX = "tokenizer."
GPT2_PRE = "gpt-2"  # llama.cpp's name of GPT-2's pre-tokenizer


def read_tokenizer(path: Path) -> dict[str, tuple[object, GGUFValueType, GGUFValueType | None]]:
    """Every `tokenizer.*` key of a GGUF file -> (value, type, array item type), strings as raw bytes (copied exactly,
    whatever their encoding)."""
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        check_gguf(Path(path))  # a file cut short says so
        raise DraftwiseError(f"cannot read GGUF file {path}: {str(e).splitlines()[0]}") from e
    out = {}
    for key, field in reader.fields.items():
        if not key.startswith(PREFIX):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[1]
            if len(field.types) > 2:
                raise DraftwiseError(f"{path}: nested array {key} is not a tokenizer field draftwise can copy")
            out[key] = ([_item(field.parts[i], sub) for i in field.data], kind, sub)
        else:
            out[key] = (_item(field.parts[field.data[0]], kind), kind, None)
    if PREFIX + "ggml.tokens" not in out:
        raise DraftwiseError(f"{path} has no tokenizer (no tokenizer.ggml.tokens) to copy")
    return out


def _item(part, kind: GGUFValueType):
    if kind == GGUFValueType.STRING:
        return bytes(part)
    value = part.tolist()[0]
    return bool(value) if kind == GGUFValueType.BOOL else value


def copy_tokenizer(writer: gguf.GGUFWriter, path: Path, vocab_size: int, pad: bool = False) -> None:
    """Write `path`'s tokenizer keys as they are; its token count must be the model's embedding rows, unless `pad`
    (a random-weight model in another model's shape, the tokenizer a stand-in): then unused tokens fill the rest."""
    fields = read_tokenizer(path)
    n = len(fields[PREFIX + "ggml.tokens"][0])
    if pad and n < vocab_size:
        fields = _padded(fields, n, vocab_size)
        n = vocab_size
    if n != vocab_size:
        raise DraftwiseError(
            f"{path.name} has {n} tokens but the model has {vocab_size} embedding rows: "
            "its tokenizer is not this model's"
        )
    for key, (value, kind, sub) in fields.items():
        writer.add_key_value(key, value, kind, sub_type=sub)


def _padded(fields: dict, n: int, vocab_size: int) -> dict:
    """`fields` with tokens n .. vocab_size - 1 added as unused ([PADi], score 0): every per-token array grown."""
    fill = {"ggml.tokens": lambda i: f"[PAD{i}]".encode(), "ggml.token_type": lambda i: int(TokenType.UNUSED)}
    fill["ggml.scores"] = lambda i: 0.0
    out = dict(fields)
    for key, make in fill.items():
        if PREFIX + key in out:
            value, kind, sub = out[PREFIX + key]
            out[PREFIX + key] = (list(value) + [make(i) for i in range(n, vocab_size)], kind, sub)
    return out


def build_tokenizer(writer: gguf.GGUFWriter, tokenizer, vocab_size: int) -> None:
    """Write tokenizer keys built from a Hugging Face tokenizer (see module docstring)."""
    vocab = tokenizer.get_vocab()  # token -> id, added tokens included
    too_big = [i for i in vocab.values() if i >= vocab_size]
    if too_big:
        raise DraftwiseError(
            f"the tokenizer has ids up to {max(too_big)} but the model has {vocab_size} embedding rows"
        )
    by_id = {i: tok for tok, i in vocab.items()}
    added = {i: t.special for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(
                TokenType.NORMAL if i not in added else TokenType.CONTROL if added[i] else TokenType.USER_DEFINED
            )
    spec = _tokenizer_json(tokenizer)
    model = (spec or {}).get("model") or {}
    if model.get("type") == "BPE":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(GPT2_PRE if _gpt2_pre_tokenizer(spec.get("pre_tokenizer")) else "default")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    else:
        writer.add_tokenizer_model("whitespace")
        writer.add_tokenizer_pre("whitespace")
        merges = _word_merges([t for t, k in zip(tokens, types) if k == TokenType.NORMAL])
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    # llama.cpp refuses a BPE vocabulary without merges, and gguf-py cannot write an empty array: one merge of two
    # NUL characters, which no text contains, stands for none
    writer.add_token_merges(merges or ["\0 \0"])
    for name, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("unk", writer.add_unk_token_id),
        ("pad", writer.add_pad_token_id),
    ):
        token_id = getattr(tokenizer, f"{name}_token_id", None)
        if token_id is not None and 0 <= token_id < vocab_size:
            add(token_id)
    bos, eos = _adds_special(tokenizer)
    writer.add_add_bos_token(bos)
    writer.add_add_eos_token(eos)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and template:
        writer.add_chat_template(template)


def _tokenizer_json(tokenizer) -> dict | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return json.loads(backend.to_str()) if backend is not None else None


def _gpt2_pre_tokenizer(pre: dict | None) -> bool:
    """GPT-2's own pre-tokenizer: byte-level with its built-in regex (llama.cpp's "gpt2" pre-type splits alike)."""
    return bool(pre) and pre.get("type") == "ByteLevel" and pre.get("use_regex", True)


def _word_merges(words: list[str]) -> list[str]:
    """BPE merges that assemble each multi-character token from its characters, left to right. Longer tokens rank
    first, so a token's own chain of merges wins over a shorter token's merges of the same characters."""
    merges: dict[str, None] = {}  # ordered set
    for word in sorted(words, key=lambda w: -len(w)):
        if " " in word:  # a merge is "left right": a space inside a piece cannot be written
            continue
        for end in range(1, len(word)):
            merges.setdefault(f"{word[:end]} {word[end]}")
    return list(merges)


def _adds_special(tokenizer) -> tuple[bool, bool]:
    """Whether the tokenizer puts BOS before / EOS after a text of its own accord (what llama.cpp's add_bos/add_eos
    flags say for llama-server's text paths)."""
    try:
        ids = tokenizer("a")["input_ids"]
    except Exception:  # a tokenizer that cannot encode this probe: no special tokens added
        return False, False
    bos, eos = getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)
    return bool(ids) and bos is not None and ids[0] == bos, bool(ids) and eos is not None and ids[-1] == eos


def check_vocab(target: Path, drafter: Path) -> None:
    """A GGUF drafter must hold the target's vocabulary (the same text for every token id), or its drafts mean other
    tokens: the check llama-server makes before it accepts `-md`, done on the files themselves."""

    ours, theirs = (read_tokenizer(p)["tokenizer.ggml.tokens"][0] for p in (target, drafter))
    if ours != theirs:
        differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise DraftwiseError(
            f"drafter {drafter.name} has another vocabulary than the target {target.name} "
            f"({len(theirs)} vs {len(ours)} tokens, first difference at id {differ}): a drafter must "
            "use the target's tokenizer"
        )
