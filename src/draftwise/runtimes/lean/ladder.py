"""Which path the integer kernel (`cpu_int8.c`) takes on this machine for each size of pass: every path proven, then
timed, before it is trusted.

The CPU's feature bits say what it has, not what runs, nor what is fast: a hypervisor may hide state the
instructions need, an OS may refuse it (AMX tiles must be asked for), a compiler may emit what this CPU lacks — and a
path that runs and gives the right bits may still be the slower one (on an Intel Xeon the AMX path, written without an
AMX machine, passed its smoke test and made every verify pass ~3× slower than AVX-512). So each path the CPU reports
— AMX (where the OS grants the tiles), AVX-512 VNNI in two tilings, AVX2 — runs in a child process of its own
(`smoke.py`): a small product on every weight format at both activation precisions, compared bit for bit with the
torch reference. A path
whose child dies (SIGILL, SIGSEGV, a refused request) or disagrees is out; never a crash, the parent only reads the
child's exit status. The same child then times its path (`rates.py`) on matrices of a 1.5B model's shapes, every
weight format, at the pass sizes of each band of rows (`BANDS`): a decoding step, a verify pass, a prompt's chunk.
Each (band, activation bits, weight format) takes the path measured fastest there (`choose`); the exact paths give
the same bits, so the choice changes speed only. torch computes the same function where no path passes, slower.

Prompt passes (rows whose logits nobody reads: a prefill) may also take a lossy path (`LOSSY`, `prompt.py`): Q8K,
llama.cpp's numerics on K-quant weights in C, or torch's bf16 product (oneDNN: AMX-BF16 or AVX512-BF16 where the CPU
has them). Not the one-token step's bits: a lossy choice of its own, each timed by a child like the exact paths and
taken for a weight format where it was faster than the exact route over the chunk and prefill bands by a margin
(`LOSSY_GAIN`), then for a prompt pass of any size, so a prompt's cache does not depend on how it was cut into chunks;
its quality is measured by `draftwise quality` (the next tokens after such a prefill).

The verdict is kept per kernel build and CPU (`cache_dir("kernels")`), so the children run once a machine, not once
a process (about 20 seconds, said on one line); the machine's description reads its summary (`machine.matrix_route`).
llama.cpp's build ladder (`runtimes/llamacpp`) proves its rungs the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import machine
from ...errors import DraftwiseError

# the kernel's paths by code (`cpu_int8.c`), in the order they are tried: avx512-seq is the AVX-512 path tiled one
# group of 16 rows at a time (one weight stream a thread; `cpu_int8_avx512.c`), where avx512 runs
NAMES = {3: "amx", 2: "avx512", 4: "avx512-seq", 1: "avx2", 0: "torch"}
Q8K = "q8k"  # prompt passes at llama.cpp's Q8_K activations on K-quant weights (`cpu_int8_q8k.c`): lossy; AVX-512
# VNNI where the CPU has it, else AVX2 (`cpu_int8_q8k_avx2.c`)
CODES = {name: isa for isa, name in NAMES.items()} | {Q8K: 5}
RUNS_ON = {3: 3, 2: 2, 4: 2, 1: 1}  # the best path the CPU must report (`draftwise_int8_isa`) for each to run
ONE_ROW = {3: 2}  # paths that hand a one-row pass to another (AMX: AVX-512's), so never chosen for a step
BF16 = "bf16"  # prompt passes through torch's bf16 product: lossy, in the chunk and prefill bands only
LOSSY = (Q8K, BF16)  # the paths that serve prompt passes only (`prompt.py`), in the order they are tried
BANDS = ("step", "short verify", "verify", "chunk", "prefill")  # `draftwise_int8_band`: 1 row, 2-3, 4-15, 16-63, 64+
SPANS = ("1 row", "2-3 rows", "4-15 rows", "16-63 rows", "64+ rows")
ROWS = ((1,), (2, 3), (4, 8), (16, 32), (64, 256))  # the pass sizes timed in each band
PROMPT_BANDS = (3, 4)  # the bands whose timings decide whether prompt passes take a LOSSY path
# a lossy path must be this much faster than the exact path to be taken: it costs quality, and bf16 2 bytes a weight
# of memory and a pass outside the one C call too (on an AMD EPYC Zen 5 a 1.5B model's 277-token prefill took 1.04 s
# through it against 0.97 on AVX-512, where the products alone timed ~8 % faster)
LOSSY_GAIN = {Q8K: 0.9, BF16: 0.85}
FORMATS = ("q8", "q4", "q4h", "q4k", "q5h", "q6k")  # the kernel's weight formats, in its order (`cpu_int8.c`)
ABITS = (16, 8)  # activation bits, in the route's order
VERSION = 7  # the verdict's form; a record of another (version 1 was proven, not timed) or other ROWS is made again
CHILD_TIMEOUT_S = 300


def key(fmt: str, abits: int) -> str:
    """A (weight format, activation bits) as the timings name it: 'q4k-a8'."""
    return f"{fmt}-a{abits}"


def run_child(path: str) -> dict | None:
    """Path `path` proven and timed in a child process (`smoke.py`): its timings ({"seconds": {key: {rows: s}},
    "products": {rows: n}}), or None where the child died, disagreed with the reference or ran out of time."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "draftwise.runtimes.lean.smoke", path],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def candidates(best: int) -> list[str]:
    """The paths tried on a CPU whose best reported path is `best`, best first, then the prompt passes' lossy ones
    (Q8K, torch's bf16 product)."""
    exact = [name for code, name in NAMES.items() if code and RUNS_ON[code] <= best]
    return exact + ([Q8K, BF16] if best else [])


def _score(timings: dict, pool: list[str], name: str, rows: tuple[int, ...]) -> dict[str, float]:
    """Each path's time over a band's pass sizes, relative to the fastest at each size (1.0: fastest at every
    size), averaged."""
    secs = {p: [timings[p]["seconds"][name][str(r)] for r in rows] for p in pool}
    fastest = [min(secs[p][i] for p in pool) for i in range(len(rows))]
    return {p: sum(s / f for s, f in zip(secs[p], fastest)) / len(rows) for p in pool}


@dataclass(frozen=True)
class Route:
    """The ladder's verdict: the exact path of each (band, activation bits, format) as `cpu_int8.c` takes it
    (`table`, codes [band][abits 8?][format]); the same for prompt passes (`prompt`: the exact path or Q8K's code in
    every band of a format that takes it), where prompt passes take torch's bf16 product instead (`bf16`: (band,
    abits, format) triples), and for reports each band's figures (`bands`: the path of each format, every proven
    path's rate, and `gap`: at the worst pass size and format, how much slower the chosen exact path was than the
    fastest there) and the lossy prompt paths by format (`prompts`)."""

    table: bytes
    prompt: bytes = b""
    bf16: frozenset = frozenset()
    bands: tuple = ()
    prompts: tuple = ()  # (format-abits key, lossy path) where prompt passes take one

    def __post_init__(self):
        if not self.prompt:  # prompt passes as every pass
            object.__setattr__(self, "prompt", self.table)

    @classmethod
    def one(cls, isa: int) -> Route:
        """One exact path in every entry (tests; a forced path)."""
        return cls(bytes([isa]) * (len(BANDS) * len(ABITS) * len(FORMATS)))

    def index(self, band: int, abits: int, fmt: int) -> int:
        return (band * len(ABITS) + (abits == 8)) * len(FORMATS) + fmt

    def path(self, band: int, abits: int, fmt: int) -> int:
        return self.table[self.index(band, abits, fmt)]

    def lossy(self, band: int, abits: int, fmt: int) -> str | None:
        """The lossy path a prompt pass of this band, activation bits and format takes, or None (the exact one)."""
        if (band, abits, fmt) in self.bf16:
            return BF16
        return Q8K if self.prompt[self.index(band, abits, fmt)] == CODES[Q8K] else None

    def short(self) -> str:
        """Its paths in an engine's name, in the order they are tried: 'avx512', 'amx/avx512-seq', '+q8k' or
        '+bf16' where prompts take them."""
        extra = [p for p in LOSSY if (p == BF16 and self.bf16) or (p == Q8K and CODES[Q8K] in self.prompt)]
        return "/".join(NAMES[c] for c in NAMES if c in self.table) + "".join(f"+{p}" for p in extra)

    def label(self) -> str:
        """The paths it takes, by band where they differ: 'avx512', 'avx512; prefill amx', '+ q8k prompts'."""
        n = len(ABITS) * len(FORMATS)
        by_band = [sorted({NAMES[c] for c in self.table[b * n : (b + 1) * n]}) for b in range(len(BANDS))]
        text = "/".join(by_band[0])
        for b in range(1, len(BANDS)):
            if by_band[b] != by_band[b - 1]:
                text += f"; {BANDS[b]} {'/'.join(by_band[b])}"
        extra = self.short().split("+")[1:]
        return text + (f" + {'/'.join(extra)} prompts" if extra else "")


def choose(timings: dict[str, dict | None]) -> Route:
    """The route from each tried path's timings (None: it died or disagreed): in each band, for each activation bits
    and weight format, the exact path with the least time over the band's pass sizes (ties: the better path, tried
    first); and for each activation bits and format, the LOSSY path prompt passes of every size take (`_lossy`)."""
    proven = {p: t for p, t in timings.items() if t}
    table, bands, chosen = bytearray(), [], {}
    for band, rows in enumerate(ROWS):
        exact = [p for p in proven if p not in LOSSY and not (band == 0 and CODES[p] in ONE_ROW)]
        picked, gap = {}, 0.0
        for abits in ABITS:
            for fmt in FORMATS:
                name = key(fmt, abits)
                scores = _score(proven, exact, name, rows) if exact else {}
                best = min(exact, key=scores.get) if exact else NAMES[0]
                table.append(CODES[best])
                picked[name] = chosen[name, band] = best
                gap = max([gap] + [_gap(proven, exact, best, name, r) for r in rows] if exact else [gap])
        rates = _rates(proven, rows)
        bands.append({"band": BANDS[band], "rows": SPANS[band], "paths": picked, "rates": rates, "gap": round(gap, 3)})
    prompt, bf16, prompts = bytearray(table), set(), {}
    for a, abits in enumerate(ABITS):
        for f, fmt in enumerate(FORMATS):
            path = _lossy(proven, chosen, key(fmt, abits))
            if path:
                prompts[key(fmt, abits)] = path
            for band in range(len(BANDS)) if path else ():
                if path == BF16:
                    bf16.add((band, abits, f))
                else:
                    prompt[(band * len(ABITS) + a) * len(FORMATS) + f] = CODES[path]
    return Route(bytes(table), bytes(prompt), frozenset(bf16), tuple(bands), tuple(sorted(prompts.items())))


def _lossy(proven: dict, chosen: dict, name: str) -> str | None:
    """The LOSSY path prompt passes of this format and activation bits take, at every size (a row's result is its
    own on them, so a prompt's cache is the same whole or in chunks): the fastest timed over the prompt bands' pass
    sizes together — their summed time, as a prompt's passes add up, against each band's exact path — where faster
    by its `LOSSY_GAIN`; None where none was."""
    sizes = [(band, str(r)) for band in PROMPT_BANDS for r in ROWS[band]]
    if any(chosen[name, band] not in proven for band in PROMPT_BANDS):  # no exact path: torch's reference
        return None
    exact = sum(proven[chosen[name, band]]["seconds"][name][r] for band, r in sizes)
    ratio = {
        p: sum(proven[p]["seconds"][name][r] for _, r in sizes) / exact
        for p in LOSSY
        if p in proven and name in proven[p]["seconds"]
    }
    fast = min(ratio, key=ratio.get, default=None)
    return fast if fast is not None and ratio[fast] < LOSSY_GAIN[fast] else None


def forced(spec: str, best: int, env: str) -> Route:
    """One exact path in every band, and with ',bf16' or ',q8k' that lossy path for every prompt pass (q8k: on
    K-quant weights), on a CPU whose best path is `best`: 'avx2',
    'avx512,q8k' (`env`: the variable that named it, for the one line a path this CPU does not run gets)."""
    name, _, extra = spec.partition(",")
    runs = candidates(best)
    if name not in runs or name in LOSSY or (extra and extra not in runs) or extra not in ("", *LOSSY):
        paths = ", ".join(p for p in runs if p not in LOSSY)
        lossy = " or ".join(p for p in runs if p in LOSSY)
        raise DraftwiseError(f"{env}={spec!r}: this CPU runs {paths} (optionally followed by ',{lossy}')")
    one = Route.one(CODES[name])
    every = [(b, a, f) for b in range(len(BANDS)) for a in ABITS for f in range(len(FORMATS))]
    if extra == BF16:
        return Route(one.table, bf16=frozenset(every))
    if extra == Q8K:
        prompt = bytearray(one.table)
        for b, a, f in every:
            if FORMATS[f] in ("q4k", "q6k"):
                prompt[one.index(b, a, f)] = CODES[Q8K]
        return Route(one.table, bytes(prompt))
    return one


def _gap(proven: dict, exact: list[str], chosen: str, name: str, rows: int) -> float:
    """How much slower the chosen exact path was than the fastest at one pass size (0: it was the fastest)."""
    secs = [proven[p]["seconds"][name][str(rows)] for p in exact]
    return proven[chosen]["seconds"][name][str(rows)] / min(secs) - 1


def _rates(proven: dict, rows: tuple[int, ...]) -> dict[str, float]:
    """Each path's rate over a band's passes, every format and both activation bits: G products a second."""
    out = {}
    for p, t in proven.items():
        names = [n for n in t["seconds"] if all(str(r) in t["seconds"][n] for r in rows)]
        seconds = sum(t["seconds"][n][str(r)] for n in names for r in rows)
        products = len(names) * sum(t["products"][str(r)] for r in rows)
        if seconds:
            out[p] = round(products / seconds / 1e9, 1)
    return out


def proven(best: int, build: str, folder: Path, run: Callable[[str], dict | None] = run_child, say=print) -> Route:
    """`choose`'s route for kernel build `build` on this CPU, from the timings this machine kept (`folder`) or, the
    first time, from a child per path (`run`); the summary is also left where the machine's description reads it
    (`machine.matrix_route`)."""
    cpu = machine.cpu_key()
    record = folder / f"ladder-{build}-{cpu}.json"
    try:
        kept = json.loads(record.read_text())
        if (kept.get("best"), kept.get("version"), kept.get("rows")) != (best, VERSION, list(map(list, ROWS))):
            kept = None
    except (OSError, ValueError):
        kept = None
    if kept is None:
        tried = candidates(best)
        say(
            f"draftwise: proving and timing the int8/q4 kernel's paths on this CPU ({', '.join(tried)}), once",
            file=sys.stderr,
            flush=True,
        )
        kept = {"best": best, "version": VERSION, "rows": ROWS, "timings": {p: run(p) for p in tried}}
        _write(record, kept)
    route = choose(kept["timings"])
    tried = {p: t is not None for p, t in kept["timings"].items()}
    now = {
        "cpu": cpu,
        "path": route.label(),
        "tried": tried,
        "bands": list(route.bands),
        "prompts": dict(route.prompts),
    }
    published = folder / machine.MATRIX_PATH_RECORD
    try:
        same = json.loads(published.read_text()) == now
    except (OSError, ValueError):
        same = False
    if not same:
        _write(published, now)
    return route


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)  # atomic: two processes proving at once write the same verdict
