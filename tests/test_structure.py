"""The house rules the code keeps, checked on its source: no import cycles, no upward imports (deferred or not), no
file over 400 lines, no function over 60 lines in the design wing."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "draftwise"

# Top to bottom: a module may import from its own layer or from any layer below it, never from one above.
LAYERS = [
    ("cli", "__main__"),
    ("design",),
    ("serve",),
    ("stages", "executors"),
    ("report", "specs", "continuations"),
    ("sd",),
    ("runtimes",),  # the runtimes: what runs a model (lean, transformers, llama.cpp) and their registry
    # what a spec names and GGUF files (one layer: a spec may name a file, a file is written from a spec), the peer
    # servers' processes, the models of cost and the data
    ("targets", "gguf", "peers", "data", "cost", "learning", "traffic", "shapes", "shards", "metrics", "timing"),
    ("config", "rundir", "paths", "machine", "isolate", "memory"),
    ("errors", "units", "__init__"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The draftwise modules `name` imports anywhere in its file (deferred imports inside functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


def layer(name: str) -> int:
    top = name.split(".")[1] if "." in name else "__init__"
    return next(i for i, group in enumerate(LAYERS) if top in group)


def test_every_package_has_a_layer():
    assert all(layer(n) >= 0 for n in modules())


def test_no_upward_imports():
    upward = sorted(f"{a} -> {b}" for a, deps in graph().items() for b in deps if layer(b) < layer(a))
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    g, state, cycles = graph(), {}, []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = "open"
        for m in sorted(g[n]):
            if state.get(m) == "open":
                cycles.append(" -> ".join(stack[stack.index(m) :] + [n, m]) if m in stack else f"{n} -> {m}")
            elif m not in state:
                visit(m, stack + [n])
        state[n] = "done"

    for n in sorted(g):
        if n not in state:
            visit(n, [])
    assert not cycles, "\n".join(cycles)


def test_no_source_file_over_400_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


@pytest.mark.parametrize("path", sorted((SRC / "design").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_design_functions_fit_on_a_screen(path):
    tree = ast.parse(path.read_text())
    long = {
        f.name: f.end_lineno - f.lineno + 1
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.end_lineno - f.lineno + 1 > 60
    }
    assert not long, long


def test_ruff_lint_and_format_are_clean():
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]')")
    root = SRC.parents[1]
    for args in (["check", "--quiet"], ["format", "--check", "--quiet"]):
        done = subprocess.run([ruff, *args, "src", "tests", "scripts"], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
