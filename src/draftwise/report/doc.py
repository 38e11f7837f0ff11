"""A report as a list of blocks rendered twice (Markdown and a self-contained HTML page), so both say the same thing."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

INLINE_CODE = re.compile(r"`([^`]+)`")


def inline(text: str) -> str:
    """Markdown text as HTML: escaped, with `code` spans as <code>."""
    return INLINE_CODE.sub(r"<code>\1</code>", html.escape(text))


class Doc:
    def __init__(self):
        self.blocks: list[tuple] = []

    def h(self, text: str, level: int = 2):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list]):
        self.blocks.append(("table", headers, [[str(c) for c in r] for r in rows]))

    def img(self, path: Path, caption: str):
        self.blocks.append(("img", path, caption))

    def code(self, text: str):
        self.blocks.append(("code", text))

    def markdown(self, base: Path) -> str:
        out = []
        for b in self.blocks:
            if b[0] == "h":
                out.append("#" * b[1] + " " + b[2])
            elif b[0] == "p":
                out.append(b[1])
            elif b[0] == "table":
                out.append(
                    "\n".join(
                        ["| " + " | ".join(b[1]) + " |", "|" + " --- |" * len(b[1])]
                        + ["| " + " | ".join(r) + " |" for r in b[2]]
                    )
                )
            elif b[0] == "img":
                out.append(f"![{b[2]}]({b[1].relative_to(base)})\n\n*{b[2]}*")
            else:
                out.append("```\n" + b[1] + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;max-width:1000px;margin:2em auto;padding:0 1em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}img{max-width:100%}pre{background:#f5f5f5;"
            "padding:8px;overflow-x:auto}</style></head><body>"
        ]
        for b in self.blocks:
            if b[0] == "h":
                out.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                out.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "table":
                head = "".join(f"<th>{inline(c)}</th>" for c in b[1])
                body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
                out.append(f"<table><tr>{head}</tr>{body}</table>")
            elif b[0] == "img":
                data = base64.b64encode(b[1].read_bytes()).decode()
                out.append(
                    f"<figure><img src='data:image/png;base64,{data}'><figcaption>{html.escape(b[2])}"
                    "</figcaption></figure>"
                )
            else:
                out.append(f"<pre>{html.escape(b[1])}</pre>")
        return "\n".join(out + ["</body></html>"])
