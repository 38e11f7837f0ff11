"""llama.cpp built for the CPU it is set up on, and proven there before anything measures with it.

`scripts/setup.sh` runs `python -m draftwise.runtimes.llamacpp.build`. It compiles the llama.cpp that
llama-cpp-python==PINNED vendors (its source distribution from PyPI) into `.venv/llama.cpp/`: the shared libraries
the Python bindings load and the tools (llama-server, llama-bench, llama-quantize), one build for both.

Why not `-march=native`: it compiles every instruction set the CPU lists, AMX included, and on an Intel Xeon of the
Sapphire Rapids class (a KVM guest) ggml's AMX kernels died by SIGILL / SIGSEGV on every batched pass over a Q4 file
(a prefill, a verify pass, llama-server's warm-up) while one-token decoding ran — so a smoke test that only decodes
would pass a build that cannot prefill. Why not the release builds' runtime dispatch (GGML_CPU_ALL_VARIANTS): it
compiles ~14 variants of the CPU backend (slow on 2 cores), and it would pick the AMX one on that machine too.

So the build is a ladder of *flavours*, best first, each a set of ggml's instruction-set options (only the CPU
backend depends on them: moving down a rung recompiles ~20 s of it, not the whole tree):

  amx        every feature the CPU and the OS allow (`machine.cpuinfo`), AMX included — only where the CPU has AMX and
             the kernel grants its tile data on request (`machine.amx`); ggml asks for the permission itself
  native     the same without AMX
  avx2       SSE4.2, AVX, F16C, FMA, AVX2, BMI2 (where the CPU has AVX2)
  baseline   no optional instruction set (any x86-64); ARM: GGML_NATIVE on, then off

Each rung is built, then smoke-tested in child processes (`smoke`), through the tools and through the bindings: a
prefill of 40 tokens, a 4-token pass (a verify) and decoding. The first rung that passes is kept; one that dies by a
signal or fails is recorded with why (`draftwise-build.json` beside the libraries: what `machine.facts` reports), and
when none passes setup stops with one line naming the cause. A second setup finds the record, checks that it was made
for this CPU and this version, smoke-tests the build again (seconds) and keeps it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import machine
from ...errors import DraftwiseError
from .smoke import smoke_bindings, smoke_tools

PINNED = "0.3.36"  # llama-cpp-python; its vendored llama.cpp is what is built
TOOLS = ("llama-server", "llama-bench", "llama-quantize")
# ggml's x86 instruction-set options and the /proc/cpuinfo flags each one needs
X86 = {
    "SSE42": ("sse4_2",),
    "AVX": ("avx",),
    "F16C": ("f16c",),
    "FMA": ("fma",),
    "AVX2": ("avx2",),
    "BMI2": ("bmi2",),
    "AVX_VNNI": ("avx_vnni",),
    "AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "AVX512_VBMI": ("avx512vbmi",),
    "AVX512_VNNI": ("avx512_vnni",),
    "AVX512_BF16": ("avx512_bf16",),
    "AMX_TILE": ("amx_tile",),
    "AMX_INT8": ("amx_int8",),
    "AMX_BF16": ("amx_bf16",),
}
AMX = ("AMX_TILE", "AMX_INT8", "AMX_BF16")
AVX2_LEVEL = ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2")


@dataclass(frozen=True)
class Flavour:
    """One rung of the ladder: its name and ggml's cmake options (every instruction-set option set explicitly, so a
    reconfigured build dir keeps nothing of the rung before)."""

    name: str
    options: tuple[tuple[str, str], ...]

    def cmake_args(self) -> list[str]:
        return [f"-D{k}={v}" for k, v in self.options]

    def enabled(self) -> list[str]:
        """The instruction sets it compiles for (what a report shows)."""
        return [k.removeprefix("GGML_") for k, v in self.options if v == "ON" and k != "GGML_NATIVE"] or (
            ["native"] if ("GGML_NATIVE", "ON") in self.options else []
        )


def _x86(name: str, on: set[str]) -> Flavour:
    return Flavour(name, (("GGML_NATIVE", "OFF"), *((f"GGML_{k}", "ON" if k in on else "OFF") for k in X86)))


def ladder(flags: set[str], arch: str, amx_state: str) -> list[Flavour]:
    """The flavours to try on a CPU with these /proc/cpuinfo `flags`, best first (module docstring)."""
    if arch not in ("x86_64", "AMD64", "i686"):
        return [Flavour("native", (("GGML_NATIVE", "ON"),)), Flavour("baseline", (("GGML_NATIVE", "OFF"),))]
    have = {k for k, needs in X86.items() if all(f in flags for f in needs)}
    out = []
    if amx_state == "on request" and {"AMX_TILE", "AMX_INT8", "AVX512_VNNI"} <= have:
        out.append(_x86("amx", have))
    out.append(_x86("native", have - set(AMX)))
    if "AVX2" in have:
        out.append(_x86("avx2", set(AVX2_LEVEL) & have))
    out.append(_x86("baseline", set()))
    return list({f.options: f for f in reversed(out)}.values())[::-1]  # a rung equal to a better one goes


class NotTheRung(DraftwiseError):
    """A failure that no rung lower would mend (a full disk, the bindings' install): setup stops at once."""


@dataclass
class Attempt:
    flavour: str
    passed: bool
    reason: str  # "passed", or why not: "llama-bench died with SIGILL", "build failed: ..."
    figures: dict = field(default_factory=dict)  # the smoke test's tokens/s, where it passed


def choose(
    flavours: list[Flavour], build: Callable[[Flavour], None], smoke: Callable[[Flavour], dict]
) -> tuple[Flavour, list[Attempt]]:
    """The first flavour that builds and passes its smoke test, and every attempt up to it. `build` raises
    DraftwiseError when the build fails; `smoke` raises `SmokeFailed` with the reason, or returns its figures.
    None passing: one DraftwiseError naming each rung's cause. A `NotTheRung` failure stops at once."""
    attempts = []
    for f in flavours:
        try:
            build(f)
            figures = smoke(f)
        except NotTheRung:
            raise
        except DraftwiseError as e:
            attempts.append(Attempt(f.name, False, str(e)))
            print(f"setup: llama.cpp {f.name} build: {e}; trying the next", file=sys.stderr, flush=True)
            continue
        attempts.append(Attempt(f.name, True, "passed", figures))
        return f, attempts
    causes = "; ".join(f"{a.flavour}: {a.reason}" for a in attempts)
    raise DraftwiseError(f"no llama.cpp build passed its smoke test on this machine ({causes})")


@dataclass(frozen=True)
class Build:
    """One build directory of one llama-cpp-python source distribution."""

    root: Path  # the repository root (.venv lives there)
    threads: int

    @property
    def venv(self) -> Path:
        return self.root / ".venv"

    @property
    def dir(self) -> Path:
        return self.venv / "llama.cpp"

    @property
    def source(self) -> Path:
        return self.venv / "src" / f"llama_cpp_python-{PINNED}"

    def fetch(self) -> None:
        """The source distribution, downloaded once and unpacked."""
        tarball = self.source.with_name(self.source.name + ".tar.gz")
        if not tarball.is_file():
            tarball.parent.mkdir(parents=True, exist_ok=True)
            _step(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
                + [f"llama-cpp-python=={PINNED}", "-d", str(tarball.parent)],
                "downloading llama-cpp-python",
                self.dir.with_name("llama.cpp.download.log"),
            )
        if not (self.source / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            shutil.rmtree(self.source, ignore_errors=True)
            with tarfile.open(tarball) as tar:
                tar.extractall(tarball.parent, filter="data")

    def compile(self, flavour: Flavour) -> None:
        """Configure (first time: the whole tree) and build the tools and libraries for `flavour`."""
        print(
            f"setup: building llama.cpp ({flavour.name}: {' '.join(flavour.enabled())}) into {self.dir} ...",
            file=sys.stderr,
            flush=True,
        )
        _step(
            [
                "cmake",
                "-S",
                str(self.source / "vendor" / "llama.cpp"),
                "-B",
                str(self.dir),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_SHARED_LIBS=ON",
                "-DCMAKE_INSTALL_RPATH=$ORIGIN",
                "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_TOOLS=ON",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_APP=OFF",
                *flavour.cmake_args(),
            ],
            "configuring llama.cpp",
            self.dir.with_name("llama.cpp.configure.log"),
        )
        _step(
            ["cmake", "--build", str(self.dir), "-j", str(self.threads), "--target", *TOOLS],
            "building llama.cpp",
            self.dir.with_name("llama.cpp.build.log"),
        )

    def install(self) -> None:
        """The bindings (once, with their Python dependencies — the smoke test imports them; they load whichever
        libraries sit in their lib/), then this build's libraries copied there and the tools linked into .venv/bin.
        The bindings build from the unpacked source in place, their temporary files in .venv/tmp, not /tmp: a
        second 200 MB copy of the source in /tmp is likely what ran a CI machine out of disk."""
        if _bindings_dir() is None:
            self.fetch()
            tmp = self.venv / "tmp"
            tmp.mkdir(exist_ok=True)
            env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF", "TMPDIR": str(tmp)}
            try:
                _step(
                    [sys.executable, "-m", "pip", "install", "-q", "--no-cache-dir", str(self.source)],
                    "installing the llama.cpp bindings",
                    self.dir.with_name("llama.cpp.bindings.log"),
                    env,
                )
            except DraftwiseError as e:
                raise NotTheRung(str(e)) from None
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        lib = _bindings_dir() / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        for so in sorted((self.dir / "bin").glob("lib*.so*")):
            target = lib / so.name
            target.unlink(missing_ok=True)
            if so.is_symlink():
                target.symlink_to(os.readlink(so))
            else:
                shutil.copy2(so, target)
        for tool in TOOLS:
            link = self.venv / "bin" / tool
            link.unlink(missing_ok=True)
            link.symlink_to(Path("..") / "llama.cpp" / "bin" / tool)

    def smoke(self, gguf: Path) -> dict:
        return {
            "tools": smoke_tools(self.dir / "bin", gguf, self.threads),
            "bindings": smoke_bindings(gguf, self.threads),
        }


def _bindings_dir() -> Path | None:
    """The installed bindings' package folder (None: not installed; a folder left holding only our lib/ is not)."""
    import importlib.util

    importlib.invalidate_caches()
    spec = importlib.util.find_spec("llama_cpp")
    found = Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
    return found if found and (found / "__init__.py").is_file() else None


def _step(cmd: list[str], what: str, log: Path, env: dict | None = None) -> None:
    """A build step with its output in `log`; a failure is a DraftwiseError with the log's last lines' gist, and a
    full disk a `NotTheRung` that says how much is free where."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        text = log.read_text()
        print("\n".join(text.strip().splitlines()[-20:]), file=sys.stderr)
        if "No space left on device" in text:
            where = _free(log.parent)
            raise NotTheRung(f"{what} ran out of disk space ({where}; log: {log}); free some and run setup again")
        raise DraftwiseError(f"{what} failed (exit {done.returncode}; log: {log})")


def _free(*where: Path) -> str:
    """How much is free on each folder's disk, and in the temporary folder, in one phrase."""
    import tempfile

    places = {str(p): p for p in (*where, Path(os.environ.get("TMPDIR") or tempfile.gettempdir()))}
    return ", ".join(f"{shutil.disk_usage(p).free / 2**20:.0f} MB free in {name}" for name, p in places.items())


def fingerprint() -> dict:
    """What a build is valid for: the pinned version, the CPU and the instruction sets it and the OS allow."""
    model, flags = machine.cpuinfo()
    return {
        "version": PINNED,
        "cpu": model,
        "arch": platform.machine(),
        "flags": sorted(flags),
        "amx": machine.amx(flags),
    }


def record_path() -> Path | None:
    found = _bindings_dir()
    return found / "lib" / machine.BUILD_RECORD if found else None


def main(root: Path, threads: int) -> dict:
    """Build (or keep) llama.cpp for this machine; returns the record written beside the libraries."""
    from ...targets.source import default_gguf

    b, here = Build(root, threads), fingerprint()
    gguf = default_gguf()
    # the record beside the bindings' libraries, else its copy in the build folder: a venv whose packages were lost
    # (a set-up killed early, then repaired) keeps a build that is still there
    found = [f for f in (record_path(), b.dir / machine.BUILD_RECORD) if f and f.is_file()]
    old = json.loads(found[0].read_text()) if found else None
    if old and old.get("fingerprint") == here and (b.dir / "bin" / "llama-bench").is_file():
        try:  # the same version for the same CPU: prove it again (seconds), keep it
            b.install()
            old["smoke"] = b.smoke(gguf)
            _write_record(b, old)
            print(f"setup: llama.cpp {old['flavour']} build kept; smoke test passed: {_figures(old['smoke'])}")
            return old
        except DraftwiseError as e:
            print(f"setup: the existing llama.cpp build failed its smoke test ({e}); building again", file=sys.stderr)
    b.fetch()
    _, flags = machine.cpuinfo()

    def build(f: Flavour) -> None:
        b.compile(f)
        b.install()

    chosen, attempts = choose(ladder(flags, platform.machine(), machine.amx(flags)), build, lambda f: b.smoke(gguf))
    record = {
        "flavour": chosen.name,
        "flags": chosen.enabled(),
        "cmake": chosen.cmake_args(),
        "reason": "; ".join(f"{a.flavour}: {a.reason}" for a in attempts),
        "attempts": [asdict(a) for a in attempts],
        "smoke": attempts[-1].figures,
        "fingerprint": here,
    }
    _write_record(b, record)
    print(
        f"setup: llama.cpp {chosen.name} build ({' '.join(chosen.enabled())}); smoke test passed: "
        f"{_figures(record['smoke'])}" + (f" (before it: {record['reason']})" if len(attempts) > 1 else "")
    )
    return record


def _write_record(b: Build, record: dict) -> None:
    """The record beside the bindings' libraries (what `machine.facts` reads) and in the build folder."""
    for path in (record_path(), b.dir / machine.BUILD_RECORD):
        path.write_text(json.dumps(record, indent=1) + "\n")


def _figures(smoke: dict) -> str:
    tools, py = smoke["tools"], smoke["bindings"]
    return (
        ", ".join(f"{k} {v} tokens/s" for k, v in tools.items())
        + f"; bindings: prefill of 40 in {py['prefill40_ms']} ms, a decode step {py['decode_ms']} ms"
    )


if __name__ == "__main__":
    try:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd(), os.cpu_count() or 1)
    except DraftwiseError as e:
        print(f"setup: error: {e}", file=sys.stderr)
        sys.exit(1)
