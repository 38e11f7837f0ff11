"""The design report's part on the deploy command measured through `draftwise serve`'s HTTP API (`design.served`)."""

from __future__ import annotations

from ...report.doc import Doc
from ...report.fmt import num as _f
from .. import served
from ..pipeline import DesignFolder
from .models import read_json


def section(doc: Doc, p: DesignFolder) -> None:
    """What was measured through `draftwise serve` (or why nothing was), with both methods' figures; nothing for a
    design folder written before this measurement existed."""
    record = p.done.get(served.DECISION)
    if record is None:
        return
    doc.h("Through `draftwise serve`: the deploy command over HTTP", 3)
    if not record["applies"]:
        doc.p(f"Not measured: {served.NOT_APPLICABLE} (its server is llama-server, measured in the grid above).")
        return
    if not record["measured"]:
        doc.p(served.sentence(record))
        return
    rows = [
        [
            f"`{record['command']}`",
            _f(record["tokens_per_s"], ".1f"),
            _f(record["first_token_ms"], ".0f"),
            _f(record.get("decode_tokens_per_s"), ".1f"),
            _f(record["server_tokens_per_s"], ".1f"),
            f"{record['accepted']} / {record['drafted']}",
        ]
    ]
    server = record.get("llama_server")
    if server:
        own = server.get("own_tokens_per_s") or _own(p)
        rows.append([f"llama-server, plain decoding ({server['file']})", _f(server["tokens_per_s"], ".1f")])
        rows[-1] += [_f(server.get("first_token_ms"), ".0f"), _f(server.get("decode_tokens_per_s"), ".1f")]
        rows[-1] += [_f(own, ".1f"), "-"]
    doc.table(
        [
            "command",
            "tokens/s (client wall time)",
            "first token ms (median)",
            "decode tokens/s",
            "its own timings: tokens/s",
            "accepted",
        ],
        rows,
    )
    doc.p(
        served.sentence(record) + " One client asks one request at a time, both methods interleaved prompt by prompt "
        "after a warm-up run each: `draftwise serve` streamed (`/v1/completions`, server-sent events, the prompt as "
        "token ids), llama-server answering `/completion` whole; the tokens/s count the client's wall time from the "
        "request to its last byte. First token: the client's, streamed; llama-server's is its own prompt time plus "
        "the client's overhead (it answers whole). Decode: the tokens after the first over the time after it. "
        "Server start and model loading are not timed. The records are in "
        + ", ".join(f"`stages/{s}/`" for s in record.get("stages", [served.STAGE]))
        + "."
    )


def _own(p: DesignFolder) -> float | None:
    """llama-server's tokens/s by its own timings, from a folder written before the record held it."""
    return read_json(p.folder(served.STAGE) / "summary.json")["methods"].get(served.SERVER, {}).get("tokens_per_s")
