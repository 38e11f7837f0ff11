"""The docs against the code: docs/cli.md's option tables are the parser's (scripts/cli_reference.py writes them),
and every command README.md and docs/*.md show parses (doc_commands.py) — a renamed option, a removed command or a
missing script fails here, naming the file, line and command."""

from __future__ import annotations

import pytest

from doc_commands import ROOT, Checker, commands, load_script, problems

REFERENCE = load_script(ROOT / "scripts" / "cli_reference.py")


@pytest.fixture(scope="module")
def checker() -> Checker:
    return Checker()


def test_the_cli_reference_is_the_parsers():
    assert REFERENCE.differs(REFERENCE.DOC.read_text(), REFERENCE.tables()) is None, (
        "run .venv/bin/python scripts/cli_reference.py"
    )


def test_the_cli_reference_fits_its_page():
    assert len(REFERENCE.DOC.read_text().splitlines()) <= 400  # a longer page: prose to stages.md or engines.md


def test_a_table_that_differs_is_named(tmp_path, capsys):
    wanted, text = REFERENCE.tables(), REFERENCE.DOC.read_text()
    renamed = text.replace("| `--gamma` |", "| `--lookahead` |", 1)
    assert "`draftwise bench`" in REFERENCE.differs(renamed, wanted)
    missing = REFERENCE.BLOCK.sub(lambda m: "" if m.group(2) == "sweep" else m.group(0), text)
    assert "no options table for `draftwise sweep`" in REFERENCE.differs(missing, wanted)
    page = tmp_path / "cli.md"
    page.write_text(renamed)
    assert REFERENCE.main(["--check", "--doc", str(page)]) == 1
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "`draftwise bench`" in line
    assert REFERENCE.main(["--doc", str(page)]) == 0 and page.read_text() == REFERENCE.render(text, wanted)


def test_every_command_in_the_docs_parses():
    found = problems()
    assert not found, "\n".join(found)


SAMPLE = """\
# A page

```bash
bash scripts/setup.sh && DRAFTWISE_X=8 /usr/bin/time -v .venv/bin/draftwise bench --target default \\
    --drafter ngram --gamma 3 --out $D/b   # a comment
draftwise sweep --layers 1,2 --threads N --out runs/s 2>&1 | tee log.txt
.venv/bin/python scripts/traffic_file.py QUESTIONS.jsonl runs/chat.jsonl --max-tokens 400
draftwise predict --profile DIR [--bench RUN | --alpha 0.6] [--batch B]
echo draftwise bench --not-a-command
```

Inline: `draftwise quality --runtimes lean:q4-a8` and a wrapped one, `draftwise bench
--gamma 0`. A table:

| flag | what |
|---|---|
| `draftwise bench --dtype fp32\\|int8 --out x` | ok |

```json
{"draftwise bench --bad": 1}
```

```bash
draftwise bench --gammas 3 --out x
draftwise frobnicate --out x
draftwise load-test --server 'serve:--target default --gama 2' --out x
.venv/bin/python scripts/step_costs.py default --dtypes q4 --activtions 8
bash scripts/no_such_script.sh
draftwise profile --drafter ngram
```
"""


def test_the_extractor_reads_shell_as_a_shell_would():
    found = [(c.line, c.argv[:3], c.fragment) for c in commands(SAMPLE)]
    assert found[:7] == [
        (4, ("scripts/setup.sh",), False),
        (4, ("draftwise", "bench", "--target"), False),  # past the env assignment and time -v, \\ joined
        (6, ("draftwise", "sweep", "--layers"), False),  # the pipe and its redirect left out
        (7, ("scripts/traffic_file.py", "QUESTIONS.jsonl", "runs/chat.jsonl"), False),
        (8, ("draftwise", "predict", "--profile"), True),  # a synopsis: its first alternatives, a fragment
        (12, ("draftwise", "quality", "--runtimes"), True),
        (12, ("draftwise", "bench", "--gamma"), True),
    ]
    first = commands(SAMPLE)[1]
    assert first.argv[-4:] == ("--gamma", "3", "--out", "/tmp/VARIABLE/b")  # $D: a path; the comment dropped
    assert commands(SAMPLE)[4].argv == ("draftwise", "predict", "--profile", "DIR", "--bench", "RUN", "--batch", "B")
    assert commands(SAMPLE)[7].argv == ("draftwise", "bench", "--dtype", "fp32")  # a cell's \\| is a | (a pipe)
    assert not any("--bad" in c.argv or "--not-a-command" in c.argv for c in commands(SAMPLE))


def test_the_checker_fails_what_the_cli_would_refuse(checker):
    """What parses passes (placeholders N, B, DIR, $D; a fragment without its --out); a wrong option, a removed
    command, a config the CLI refuses, a wrong option inside serve:ARGS, a missing script fail, by line."""
    refused = {c.line: checker.problem(c) for c in commands(SAMPLE) if checker.problem(c)}
    assert set(refused) == {12, 24, 25, 26, 27, 28, 29}, refused
    assert "config: DraftwiseError: gamma (lookahead) must be >= 1" in refused[12]  # inline, across two lines
    assert "unrecognized arguments: --gammas 3" in refused[24]
    assert "no command 'frobnicate'" in refused[25]
    assert refused[26].startswith("in --server 'serve:--target default --gama 2'") and "--gama 2" in refused[26]
    assert "unrecognized arguments: --activtions 8" in refused[27]
    assert "no such script scripts/no_such_script.sh" in refused[28]
    assert "required: --out" in refused[29]  # a ``` block is a command to paste: it may not leave --out out


def test_a_problem_names_file_line_and_command(monkeypatch, tmp_path):
    import doc_commands

    page = tmp_path / "page.md"
    page.write_text("Run `draftwise bench --gamma 3 --no-such-flag 1`.\n")
    monkeypatch.setattr(doc_commands, "ROOT", tmp_path)
    monkeypatch.setattr(doc_commands, "markdown_files", lambda: [page])
    (found,) = problems()
    assert found.startswith("page.md:1: `draftwise bench --gamma 3 --no-such-flag 1` — ")
    assert "unrecognized arguments: --no-such-flag 1" in found
