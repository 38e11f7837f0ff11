"""The commands the Markdown shows, as a shell would hand them over: each `draftwise …` and `scripts/…` command in
README.md and docs/*.md, in ``` blocks (bash, sh or none) and in inline `code`, dry-parsed without doing any work —
`draftwise`'s own parser and the config it builds (nothing dispatched), a Python script's own `parser()`, a shell
script's existence. `test_docs.py` fails on any that does not parse, naming the file, line and command.

Inline code is a fragment of prose (`draftwise quality --runtimes lean:q4-a8`), so there a required option may be
left out; a ``` block is a command to paste, so there it may not. ALL-CAPS words are placeholders (FILE, DIR,
QUESTIONS.jsonl): as a number's value they read as a number, as a command's name they are not checked; shell
variables ($D) read as a path.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
INLINE = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.S)  # a code span, within one paragraph
VARIABLE = re.compile(r"\$(\{[A-Za-z_]\w*\}|[A-Za-z_]\w*|\([^()]*\))")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*(\.\w+)?|\.\.\.|…")  # FILE, DIR, N, QUESTIONS.jsonl; an elided value
ANGLED = re.compile(r"<([\w-]+)>")  # <gen-data>: a placeholder, not a redirect
ANY_OPTIONS = {"ARGS", "OPTIONS", "...", "…"}  # standing alone: "any options here"
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}
REDIRECTS = {">", ">>", "<", ">&", "&>", ">|", "<<"}
WRAPPERS = {"time", "nohup", "env", "exec", "bash", "sh"}  # words before the command that take no value


@dataclass(frozen=True)
class Command:
    path: str  # the Markdown file, relative to the repository
    line: int
    text: str  # as written, continuations joined
    argv: tuple[str, ...]  # from the program on: ("draftwise", ...) or ("scripts/x.py", ...)
    fragment: bool  # inline code: required options may be left out

    def where(self) -> str:
        return f"{self.path}:{self.line}: `{self.text}`"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(text: str, path: str = "<markdown>") -> list[Command]:
    """Every draftwise or scripts/ command in a Markdown text, in order of its lines."""
    lines, prose, found = text.splitlines(), [], []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            prose.append(lines[i])
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence.group(1))), len(lines))
        if fence.group(2) in SHELL_FENCES:
            found += _block(lines[i + 1 : end], i + 2, path)
        prose += [""] * (min(end, len(lines) - 1) - i + 1)  # a block's lines, blank: line numbers stay
        i = end + 1
    found += _inline("\n".join(prose), path)
    return sorted(found, key=lambda c: c.line)


def _block(lines: list[str], first: int, path: str) -> list[Command]:
    """A shell block's commands: `\\`-continued lines joined, comments dropped."""
    logical: list[tuple[int, str]] = []  # (first line, text)
    held: list[str] = []
    start = first
    for n, line in enumerate(lines, first):
        if not held and logical and line[:1].isspace() and _synopsis(logical[-1][1]):
            logical[-1] = (logical[-1][0], f"{logical[-1][1]} {line.strip()}")  # a synopsis goes on, indented
            continue
        start = n if not held else start
        held.append(line.rstrip()[:-1] if line.rstrip().endswith("\\") else line)
        if not line.rstrip().endswith("\\"):
            logical.append((start, " ".join(s.strip() for s in held)))
            held = []
    return [c for start, text in logical for c in _commands(text, start, path, fragment=False)]


def _synopsis(text: str) -> bool:
    """A usage line (`draftwise predict --profile DIR [--bench RUN | --alpha 0.6]`), not a command to paste."""
    return bool(re.search(r"\[-", text))


def _first_alternatives(text: str) -> str:
    """A synopsis as one command it allows: [optional] parts kept, each `a | b` and `a|b` its first."""
    while (inner := re.sub(r"\[([^\[\]]*)\]", lambda m: m.group(1).split(" | ")[0], text)) != text:
        text = inner
    return re.sub(r"([^\s|'\"]+)(\|[^\s|'\"]+)+", r"\1", text)


def _inline(text: str, path: str) -> list[Command]:
    out = []
    for m in INLINE.finditer(text):
        span = " ".join(m.group(2).replace("\\|", "|").split())  # a table cell's \| is a | in its code
        out += _commands(span, text.count("\n", 0, m.start()) + 1, path, fragment=True)
    return out


def _commands(text: str, line: int, path: str, fragment: bool) -> list[Command]:
    """The draftwise and scripts/ commands of one shell line (`&&` chains and pipes split, redirects dropped)."""
    shell = ANGLED.sub(lambda m: m.group(1).upper().replace("-", "_"), VARIABLE.sub("/tmp/VARIABLE", text))
    if _synopsis(shell):
        shell, fragment = _first_alternatives(shell), True
    try:
        words = _words(shell)
    except ValueError:  # unbalanced quotes: prose that only looks like a command
        return []
    out, segment = [], []
    for word in [*words, ";"]:
        if word not in OPERATORS:
            segment.append(word)
            continue
        argv = _program(segment)
        if argv:
            out.append(Command(path, line, text, tuple(argv), fragment))
        segment = []
    return out


def _words(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, "#"
    words, out = list(lex), []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word in REDIRECTS or word.startswith(">") or word.startswith("<"):
            skip = True  # and the file it names
        elif not (word.isdigit() and i + 1 < len(words) and words[i + 1].startswith(">")):  # the 2 of 2>&1
            out.append(word)
    return out


def _program(words: list[str]) -> list[str] | None:
    """The command from its program on, past env assignments, `/usr/bin/time -v`, `bash`, `python [-m]`; None when
    it is neither draftwise nor a script."""
    i, wrapper = 0, False
    while i < len(words):
        word, name = words[i], words[i].rsplit("/", 1)[-1]
        python = re.fullmatch(r"python(3(\.\d+)?)?", name)
        if re.fullmatch(r"[A-Za-z_]\w*=.*", word) or name in WRAPPERS or wrapper and word.startswith("-"):
            i, wrapper = i + 1, wrapper or name in WRAPPERS
        elif name == "timeout":
            i += 2
        elif python and words[i + 1 : i + 2] == ["-m"]:
            module = words[i + 2] if i + 2 < len(words) else ""
            return ["draftwise", *words[i + 3 :]] if module in ("draftwise", "draftwise.cli") else None
        elif python:
            i += 1
        elif name == "draftwise":
            return ["draftwise", *words[i + 1 :]]
        elif m := re.search(r"(?:^|/)(scripts/[\w.-]+\.(?:py|sh))$", word):
            return [m.group(1), *words[i + 1 :]]
        else:
            return None
    return None


class Checker:
    """Dry-parses commands: one draftwise parser for all of them, each script's parser loaded once."""

    def __init__(self) -> None:
        from draftwise.cli import build

        self.parser, self.subcommands = build()
        for parser in [self.parser, *(c.parser for c in self.subcommands.values())]:
            parser.allow_abbrev = False  # a doc's --gam would pass as --gamma, and keep passing once that is renamed
        self.scripts: dict[str, argparse.ArgumentParser | None] = {}

    def problem(self, command: Command) -> str | None:
        """Why the command does not parse; None when it does."""
        program, *argv = command.argv
        if program == "draftwise":
            return self._draftwise(argv, command.fragment)
        return self._script(program, argv, command.fragment)

    def _draftwise(self, argv: list[str], fragment: bool) -> str | None:
        if not argv or PLACEHOLDER.fullmatch(argv[0]) or argv[0] in ("-h", "--help") or argv[0].endswith(":"):
            return None  # `draftwise`, `draftwise COMMAND --help`, `draftwise serve: …` (its output): no command
        if argv[0] not in self.subcommands:
            return f"no command {argv[0]!r} (draftwise has {', '.join(self.subcommands)})"
        sub = self.subcommands[argv[0]]
        args, missing, error = _parse(self.parser, sub.parser, argv, fragment)
        if error or {a.dest for a in missing} & {f.name for f in dataclasses.fields(sub.config)}:
            return error  # a fragment without a required field has no config to build (one without --out has)
        try:
            sub.make(args)  # the config, as `draftwise` would build it: its validation counts
        except Exception as e:  # noqa: BLE001 - any refusal is the finding
            return f"config: {type(e).__name__}: {e}"
        return self._served(argv)

    def _served(self, argv: list[str]) -> str | None:
        """`--baseline 'serve:ARGS'` and `--server 'serve:ARGS'`: ARGS are `draftwise serve`'s options, parsed only
        when the server starts — so checked here as a serve command of their own."""
        for flag, value in zip(argv, argv[1:]):
            head, found, args = value.partition("serve:")
            if flag in ("--baseline", "--server") and found and (not head or head.endswith(",")):
                problem = self._draftwise(["serve", *shlex.split(args)], fragment=True)
                if problem:
                    return f"in {flag} 'serve:{args}': {problem}"
        return None

    def _script(self, program: str, argv: list[str], fragment: bool) -> str | None:
        path = ROOT / program
        if not path.is_file():
            return f"no such script {program}"
        parser = self._script_parser(path)
        if parser is None:
            return None  # a shell script, or one that reads sys.argv itself: that it exists is what is checked
        return _parse(parser, parser, argv, fragment)[2]

    def _script_parser(self, path: Path) -> argparse.ArgumentParser | None:
        if path.suffix != ".py" or "\ndef parser(" not in path.read_text():
            return None
        if path.name not in self.scripts:
            self.scripts[path.name] = parser = load_script(path).parser()
            parser.prog, parser.allow_abbrev = f"scripts/{path.name}", False  # errors name the script, not pytest
        return self.scripts[path.name]


def load_script(path: Path):
    """A script of scripts/ as a module (not run: its `main` waits for `__main__`)."""
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parse(top, parser, argv: list[str], fragment: bool):
    """(namespace, the required arguments a fragment left out, argparse's error or None)."""
    argv = _placeholders(parser, [w for w in argv if w not in ("-h", "--help")])
    relaxed = [a for a in parser._actions if a.required] if fragment else []
    for action in relaxed:
        action.required = False
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = top.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return None, [], lines[-1] if lines else "argparse refused it"
    finally:
        for action in relaxed:
            action.required = True
    missing = [a for a in relaxed if getattr(args, a.dest, None) is None]
    return args, missing, None


def _placeholders(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Placeholders given as an option's value read as a value that option's type takes (N → 1, … → 1); ARGS or
    `...` standing alone are left out."""
    out = []
    for word in argv:
        action = parser._option_string_actions.get(out[-1]) if out else None
        if action is not None and action.nargs != 0 and PLACEHOLDER.fullmatch(word):
            out.append(_sample(action, word))
        elif word not in ANY_OPTIONS:
            out.append(word)
    return out


def _sample(action: argparse.Action, placeholder: str) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    for sample in (placeholder, "1", "0.5"):  # a name stays a name; a number's placeholder becomes one
        try:
            (action.type or str)(sample)
            return sample
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
    return placeholder


def problems() -> list[str]:
    """Every command of the Markdown that does not parse: 'file:line: `command` — why'."""
    checker, out = Checker(), []
    for path in markdown_files():
        for command in commands(path.read_text(), str(path.relative_to(ROOT))):
            reason = checker.problem(command)
            if reason:
                out.append(f"{command.where()} — {reason}")
    return out
