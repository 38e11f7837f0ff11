"""docs/cli.md's option tables, written from the `draftwise` parser: one per command, and one of the options that
several commands take alike (same flags, default and help). Each table stands between `<!-- options: NAME -->` and
`<!-- /options -->`; the prose around them is written by hand and left as it is.

    .venv/bin/python scripts/cli_reference.py          # rewrite the tables
    .venv/bin/python scripts/cli_reference.py --check  # exit 1, naming the command whose table differs
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from draftwise.cli import build

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
SHOWN = "docs/cli.md"  # as messages name it
SHARED = "shared"  # the table of the options several commands take alike
SHARED_BY = 3  # an option taken alike by this many commands is listed once, in the shared table
BLOCK = re.compile(r"(<!-- options: ([\w-]+) -->\n)(.*?)(<!-- /options -->)", re.S)
SHOWN_DEFAULT = re.compile(r" \(default: (.*)\)$")  # what options.py appends to a field's help
HEADER = "| option | default | what it does |\n|---|---|---|\n"


def row(action: argparse.Action) -> str:
    """One argument as a table row: its flags (and choices), its default, its help as `--help` shows it."""
    text = (action.help or "").replace("%%", "%")
    shown = SHOWN_DEFAULT.search(text)
    if shown:
        text, default = text[: shown.start()], shown.group(1)
    elif action.default not in (None, argparse.SUPPRESS, True, False):
        default = str(action.default)  # an argument of the command's own (--executor), not a config field
    else:
        default = ""
    name = ", ".join(action.option_strings) or action.dest.upper()
    name += " {" + ",".join(map(str, action.choices)) + "}" if action.choices else ""
    cells = [f"`{name}`", "required" if action.required else f"`{default}`" if default else "", text]
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _is_help(action: argparse.Action) -> bool:
    return isinstance(action, argparse._HelpAction)  # -h, which every command has


def command_rows() -> dict[str, list[tuple[str, str]]]:
    """Each command's (first flag, row), in its parser's order."""
    _, commands = build()
    return {
        name: [((a.option_strings or [a.dest])[0], row(a)) for a in c.parser._actions if not _is_help(a)]
        for name, c in commands.items()
    }


def tables() -> dict[str, str]:
    """Every table's text by name: the shared one first, then each command's own rows and a row naming the shared
    options it takes."""
    by_command = command_rows()
    counts = Counter(r for rows in by_command.values() for _, r in rows)
    shared = [r for r in dict.fromkeys(r for rows in by_command.values() for _, r in rows) if counts[r] >= SHARED_BY]
    out = {SHARED: HEADER + "".join(r + "\n" for r in shared)}
    for name, rows in by_command.items():
        own = [r for _, r in rows if r not in shared]
        taken = [flag for flag, r in rows if r in shared]
        if taken:
            own.append(f"| {', '.join(f'`{t}`' for t in taken)} | | [shared options](#shared-options) |")
        out[name] = HEADER + "".join(r + "\n" for r in own)
    return out


def differs(text: str, wanted: dict[str, str]) -> str | None:
    """One line naming the first table of `text` that is not the parser's, or None when all of them are."""
    found = {m.group(2): m.group(3) for m in BLOCK.finditer(text)}
    for name, table in wanted.items():
        what = "`draftwise " + name + "`" if name != SHARED else "the shared options"
        if name not in found:
            return f"{SHOWN}: no options table for {what} (add <!-- options: {name} --> <!-- /options -->)"
        if found[name] != table:
            return f"{SHOWN}: the options table of {what} differs from the parser (run scripts/cli_reference.py)"
    extra = sorted(set(found) - set(wanted))
    return f"{SHOWN}: an options table for `draftwise {extra[0]}`, a command the parser lacks" if extra else None


def render(text: str, wanted: dict[str, str]) -> str:
    """`text` with each marked table replaced by the parser's (a table of no command is left for --check to name)."""
    return BLOCK.sub(lambda m: m.group(1) + wanted.get(m.group(2), m.group(3)) + m.group(4), text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs from the parser")
    p.add_argument("--doc", type=Path, default=DOC, help="the page (default: docs/cli.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    text, wanted = args.doc.read_text(), tables()
    if not args.check:
        text = render(text, wanted)
        args.doc.write_text(text)
    problem = differs(text, wanted)  # after a rewrite: a command whose markers are not written yet
    if problem:
        print(problem, file=sys.stderr)
    elif args.check:
        print(f"{SHOWN}: every options table is the parser's")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
