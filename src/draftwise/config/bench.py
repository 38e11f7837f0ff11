"""`draftwise bench`'s configs: one bench, and a grid of them (with the baselines they may run)."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import (
    all_if_zero,
    check_gguf_quant,
    check_positive,
    from_dict,
    internal,
    opt,
    opt_backend,
    opt_compile,
    opt_device,
    opt_dtype,
    opt_gguf_quant,
    opt_seed,
    opt_target,
    opt_threads,
)

BASELINES = (
    "ar",
    "hf-generate",
    "hf-assisted",
    "hf-prompt-lookup",
    "llama-cpp",
    "llama-cpp-prompt-lookup",
    "llama-cpp-lookup",
)
LLAMA_SERVER = "llama-server"  # a baseline of its own, or llama-server:ARGS (the server's own options, shell-quoted)
SERVE = (
    "serve"  # draftwise's own server: serve (the bench's decoding options) or serve:ARGS (`draftwise serve` options)
)
# baselines whose ARGS run to the end of a --baseline value (their options may hold commas)
WHOLE = (LLAMA_SERVER, SERVE)
SERVE_RESERVED = ("--host", "--port")  # where the server listens is the bench's to choose (127.0.0.1, a free port)
# the decoding options a bare `serve` baseline passes on from the bench (`serve_args`)
SERVE_OPTIONS = (
    "drafter",
    "gamma",
    "draft_stop",
    "schedule",
    "calibration",
    "dtype",
    "device",
    "backend",
    "compile",
    "gguf_quant",
    "llama_exact",
    "threads",
)
# baselines that run one sequence at a time and do not use the point's drafter or γ (once per temperature in a grid)
PLAIN_BATCH1 = ("hf-generate", "llama-cpp")


def _args(baseline: str, head: str) -> list[str] | None:
    """The shlex-split ARGS of a `head[:ARGS]` baseline, None for other baselines."""
    if baseline != head and not baseline.startswith(head + ":"):
        return None
    try:
        return shlex.split(baseline.partition(":")[2])
    except ValueError as e:
        raise DraftwiseError(f"baseline {baseline!r}: cannot split its {head} arguments ({e})") from None


def llama_server_args(baseline: str) -> list[str] | None:
    """The extra llama-server arguments of a `llama-server[:ARGS]` baseline (shlex-split), None for other baselines."""
    return _args(baseline, LLAMA_SERVER)


def serve_args(baseline: str, config: BenchConfig | None = None) -> list[str] | None:
    """The `draftwise serve` arguments of a `serve[:ARGS]` baseline, None for other baselines: ARGS shlex-split, or for
    a bare `serve` the options that decode as `config` does (its target, and each of `SERVE_OPTIONS` it sets away from
    its default; [] without a config). Where the server listens is refused in one line: the bench chooses it."""
    args = _args(baseline, SERVE)
    if args is None:
        return None
    for a in args:
        if a.split("=", 1)[0] in SERVE_RESERVED:
            raise DraftwiseError(
                f"baseline {baseline!r}: {a.split('=', 1)[0]} is the bench's to set (127.0.0.1, a free port); "
                "leave it out"
            )
    if baseline == SERVE and config is not None:
        args = ["--target", config.target]
        for f in dataclasses.fields(BenchConfig):
            value = getattr(config, f.name)
            drafts = f.name not in ("gamma", "draft_stop") or config.drafter  # a drafter's (γ then always)
            if (
                f.name in SERVE_OPTIONS
                and value not in (None, False)
                and drafts
                and (value != f.default or f.name == "gamma")
            ):
                flag = "--" + f.name.replace("_", "-")
                args += [flag] if value is True else [flag, str(value)]
    return args


def split_baselines(text: str) -> tuple[str, ...]:
    """A --baseline value: a comma list, except that from an item starting with llama-server: or serve: on, the rest is
    that one baseline (its arguments may hold commas: --spec-type ngram-simple,ngram-mod; --drafter
    suffix:DIR,factor=2); '' is none."""
    out: list[str] = []
    rest = text
    while rest:
        if rest.startswith(tuple(head + ":" for head in WHOLE)):
            out.append(rest)
            break
        item, _, rest = rest.partition(",")
        if item.strip():
            out.append(item.strip())
    return tuple(out)


@dataclass(frozen=True)
class BenchConfig:
    """`draftwise bench`: SD with a drafter against baselines, on the same prompts in one process."""

    target: str = opt_target()
    drafter: str | None = opt(
        None,
        "a checkpoint directory, a .gguf file, layers:i,j,..., random:..., ngram[:...], "
        "suffix[:DIR,...] or hybrid:MODEL+LOOKUP (see specs; repeat for a grid; SPEC@γ "
        "gives that drafter its own γ)",
    )
    gamma: int = opt(
        4,
        "lookahead γ: tokens drafted per round, the most per round with --draft-stop or a lookup "
        "drafter (a comma list: a grid)",
    )
    draft_stop: float = opt(
        0.0,
        "adaptive lookahead: stop a round's drafting once the drafter's probability of its "
        "token is below this (0 = always γ)",
    )
    temperature: float = opt(0.0, "0 = greedy (a comma list: a grid); unset: --prompts lines at their own (docs)")
    own_temperatures: bool = internal(False, "bench: only the --prompts lines at this temperature (`by_request`)")
    top_p: float = opt(1.0, "nucleus sampling: keep the most likely tokens holding this much probability")
    suite: str = opt("spec_bench", "packaged suite(s): a name, a comma list or 'all'")
    split: str = opt("eval", "the suites' split", choices=("train", "eval", "all"))
    prompts: str | None = opt(
        None, "your own prompts instead of the suites: JSONL (prompt or turns, max_tokens, temperature) or text lines"
    )
    limit: int | None = opt(10, "number of prompts, spread round-robin over categories (0 = all)", parse=all_if_zero)
    max_new_tokens: int = opt(128, "tokens generated per prompt")
    baselines: tuple[str, ...] = opt(
        ("ar",),
        "comma list of ar, hf-generate, hf-assisted, hf-prompt-lookup, "
        "llama-cpp, llama-cpp-prompt-lookup, llama-cpp-lookup, llama-server or "
        "llama-server:ARGS (ARGS: the server's options, taken whole, commas "
        "included), serve (draftwise serve with this bench's decoding options) or serve:ARGS "
        "(draftwise serve's options, taken whole): measured through their HTTP API; repeatable; '' for none",
        flag="--baseline",
        repeat=True,
        parse=split_baselines,
    )
    batch_size: int = opt(
        1,
        "prompts decoded together (batched SD and AR; transformers' and llama.cpp's baselines "
        "need 1; a comma list: a grid)",
    )
    synthetic_alpha: float | None = opt(
        None,
        "accept each drafted token with this probability instead of testing it: "
        "measures system cost for random-weight shapes (not lossless)",
    )
    seed: int = opt_seed()
    warmup: int = opt(1, "untimed runs of each method before measuring")
    dtype: str = opt_dtype()
    device: str = opt_device()
    backend: str = opt_backend()
    compile: bool = opt_compile()
    gguf_quant: str = opt_gguf_quant()
    llama_exact: bool = opt(
        False,
        "llama.cpp: an f32 KV cache and no flash attention instead of llama.cpp's defaults "
        "(f16 KV; flash attention, whose CPU kernel rounds q to f16): multi-token passes "
        "then round as steps do",
    )
    threads: int | None = opt_threads()
    llama_server: str | None = opt(
        None,
        "the llama-server binary of llama-server baselines (default: on PATH, else beside this Python)",
        metavar="PATH",
    )
    schedule: str | None = opt(
        None,
        "also run SD with the round scheduler (sd.schedule): each round verifies the "
        "prefix of the proposal that the verify curve of this profile run folder (same "
        "engine and precision) and the proposer's confidence, calibrated online from the "
        "run's own rounds, price best; γ is its longest run",
        metavar="PROFILE",
    )
    calibration: str | None = opt(
        None,
        "start the scheduler's calibration from a calibration folder (a design's "
        "stages/calibrate-lookup or its export/schedule: the table at this "
        "temperature) or from the scheduled rounds of a bench run folder (same "
        "drafter and temperature) instead of from nothing; it then learns from this "
        "run's own rounds",
        metavar="RUN",
    )

    def __post_init__(self):
        check_gguf_quant(self.gguf_quant)
        if self.schedule is not None and (not self.drafter or self.batch_size > 1 or self.synthetic_alpha is not None):
            raise DraftwiseError("schedule needs a drafter, batch size 1 and real acceptance (no synthetic_alpha)")
        if self.calibration is not None and self.schedule is None:
            raise DraftwiseError("calibration seeds the round scheduler: give --schedule too")
        object.__setattr__(self, "baselines", tuple(self.baselines))
        unknown = [
            b for b in self.baselines if b not in BASELINES and llama_server_args(b) is None and serve_args(b) is None
        ]
        if unknown:
            raise DraftwiseError(
                f"unknown baseline {unknown[0]!r}: choose from {', '.join(BASELINES)}, "
                f"{LLAMA_SERVER}, {LLAMA_SERVER}:ARGS, {SERVE} or {SERVE}:ARGS"
            )
        twice = [b for i, b in enumerate(self.baselines) if b in self.baselines[:i]]
        if twice:
            raise DraftwiseError(f"baseline {twice[0]!r} is given twice")
        if self.gamma < 1:
            raise DraftwiseError(f"gamma (lookahead) must be >= 1, got {self.gamma}")
        if not 0 <= self.draft_stop < 1:
            raise DraftwiseError(f"draft_stop must be in [0, 1), got {self.draft_stop}")
        if self.batch_size < 1:
            raise DraftwiseError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.batch_size > 1 and (set(self.baselines) - {"ar"} or self.draft_stop):
            raise DraftwiseError(
                "batch_size > 1 runs SD and AR only (transformers', llama.cpp's and the servers' baselines "
                "decode one sequence at a time; adaptive lookahead is batch-1)"
            )
        if self.synthetic_alpha is not None:
            if not 0 <= self.synthetic_alpha <= 1:
                raise DraftwiseError(f"synthetic_alpha must be in [0, 1], got {self.synthetic_alpha}")
            if self.drafter is None or "hf-assisted" in self.baselines:
                raise DraftwiseError(
                    "synthetic acceptance needs a drafter and applies to the draftwise engine only (not to hf-assisted)"
                )
        if self.drafter is None and "hf-assisted" in self.baselines:
            raise DraftwiseError("baseline hf-assisted needs a drafter (--drafter)")
        # what the drafter's kind decides (hf-assisted, llama-cpp-lookup, batch size) is `specs.check`'s: the kinds are
        # the registry of drafter families', above this module
        if self.drafter is None and not self.baselines:
            raise DraftwiseError("nothing to run: give --drafter or at least one --baseline")
        if self.limit is not None and self.limit < 1:
            raise DraftwiseError(f"limit must be >= 1, got {self.limit}")
        if self.max_new_tokens < 1:
            raise DraftwiseError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.own_temperatures and not self.prompts:
            raise DraftwiseError("own_temperatures decodes the lines of a --prompts file at their own temperatures")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise DraftwiseError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")
        if self.threads is not None and self.threads < 1:
            raise DraftwiseError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class BenchGridConfig:
    """`draftwise bench` over a grid: drafters × γ × temperatures × batch sizes, each other setting from `bench`.
    An empty axis keeps `bench`'s value. Baselines run once per (temperature, batch size); hf-assisted (model drafters),
    hf-prompt-lookup, llama-cpp-prompt-lookup and a bare `serve` per point, as they use the point's drafter and γ; the
    transformers, llama.cpp and server baselines (llama-server[:ARGS], serve:ARGS) at batch size 1 only (they decode
    one sequence at a time)."""

    bench: BenchConfig = internal(BenchConfig(drafter="layers:0"), "bench: its own flags")
    drafters: tuple[str, ...] = internal((), "bench: --drafter given more than once")
    gammas: tuple[int, ...] = internal((), "bench: --gamma as a comma list")
    temperatures: tuple[float, ...] = internal((), "bench: --temperature as a comma list")
    batch_sizes: tuple[int, ...] = internal((), "bench: --batch-size as a comma list")
    drafter_gammas: tuple[int, ...] = internal(
        (), "bench: --drafter SPEC@γ, each drafter's own γ (aligned with `drafters`) instead of the γ axis"
    )
    scheduled: tuple[str, ...] = internal(
        (),
        "design: with bench.schedule, the drafters whose points also run the "
        "round scheduler (the others run static SD only); empty = every "
        "drafter's",
    )
    rows: tuple[BenchConfig, ...] = internal(
        (),
        "design: whole benches on other runtimes (target file, backend, "
        "precision), each with its drafter (or none) and baselines, "
        "interleaved prompt by prompt with the grid's points on the same "
        "prompts",
    )
    row_names: tuple[str, ...] = internal((), "design: one per row, its runtime's name in the records (e.g. lean-int8)")

    def __post_init__(self):
        if isinstance(self.bench, dict):  # read back from config.json
            object.__setattr__(self, "bench", from_dict(BenchConfig, self.bench))
        object.__setattr__(
            self, "rows", tuple(from_dict(BenchConfig, r) if isinstance(r, dict) else r for r in self.rows)
        )
        for name in ("drafters", "gammas", "temperatures", "batch_sizes", "drafter_gammas", "scheduled", "row_names"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.row_names) != len(self.rows) or len(set(self.row_names)) != len(self.row_names):
            raise DraftwiseError("a bench grid's rows need one distinct name each (row_names)")
        same = ("suite", "split", "prompts", "limit", "max_new_tokens", "seed")
        for name, row in zip(self.row_names, self.rows):
            if any(getattr(row, k) != getattr(self.bench, k) for k in same):
                raise DraftwiseError(f"row {name} must run the grid's prompts ({', '.join(same)} as its bench)")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        check_positive("gammas", self.gammas)
        check_positive("batch_sizes", self.batch_sizes)
        check_positive("drafter_gammas", self.drafter_gammas)
        if not (self.drafters or self.bench.drafter or self.rows or self.bench.baselines):
            raise DraftwiseError("a bench grid needs at least one drafter or baseline")
        if self.drafter_gammas and (len(self.drafter_gammas) != len(self.drafters) or self.gammas):
            raise DraftwiseError("drafter_gammas gives one γ per drafter, instead of a γ axis")
        if self.scheduled and (
            not self.bench.schedule or set(self.scheduled) - set(self.drafters or (self.bench.drafter,))
        ):
            raise DraftwiseError("scheduled names drafters of the grid, and needs bench.schedule (a profile folder)")
        self.points()  # every point must be a valid BenchConfig

    @staticmethod
    def _plain(baseline: str, drafters: bool) -> bool:
        """Whether a batch-1 baseline runs in the grid's baseline points (once per temperature): transformers' and
        llama.cpp's plain decoding, llama-server[:ARGS], serve:ARGS, and a bare `serve` when there is no drafter (with
        drafters it serves each SD point's drafter and γ, in that point)."""
        named = llama_server_args(baseline) is not None or baseline.startswith(SERVE + ":")
        return baseline in PLAIN_BATCH1 or named or baseline == SERVE and not drafters

    def runtimes(self) -> list[str | None]:
        """The runtime name of each point of `points()`: None for the grid's own, then the rows' names (once per
        temperature of the grid's axis)."""
        names = list(self.row_names) * len(self._row_temperatures())
        return [None] * (len(self.points()) - len(names)) + names

    def _row_temperatures(self) -> tuple[float | None, ...]:
        """The temperatures each row runs at: the grid's axis when it has one (a row at every temperature), else the
        row's own (None)."""
        return self.temperatures or (None,)

    def _rows(self) -> list[BenchConfig]:
        return [
            r if t is None else dataclasses.replace(r, temperature=t)
            for t in self._row_temperatures()
            for r in self.rows
        ]

    def points(self) -> list[BenchConfig]:
        """SD points (one per drafter, γ, temperature, batch size), then one baseline point per (temperature, batch),
        then the rows (each at every temperature of the axis)."""
        b = self.bench
        drafters, gammas = self.drafters or ((b.drafter,) if b.drafter else ()), self.gammas or (b.gamma,)
        temps, sizes = self.temperatures or (b.temperature,), self.batch_sizes or (b.batch_size,)

        def per_point(drafter: str, n: int) -> tuple[str, ...]:  # those that suit the drafter's kind: `specs.points`
            own = ("hf-assisted", "hf-prompt-lookup", "llama-cpp-prompt-lookup", "llama-cpp-lookup", SERVE)
            return tuple(x for x in b.baselines if x in own and n == 1)

        pairs = (
            list(zip(drafters, self.drafter_gammas))
            if self.drafter_gammas
            else [(d, g) for d in drafters for g in gammas]
        )

        def schedule(drafter: str) -> dict:
            on = not self.scheduled or drafter in self.scheduled
            return {"schedule": b.schedule if on else None, "calibration": b.calibration if on else None}

        sd = [
            dataclasses.replace(
                b, drafter=d, gamma=g, temperature=t, batch_size=n, baselines=per_point(d, n), **schedule(d)
            )
            for t in temps
            for n in sizes
            for d, g in pairs
        ]
        base = []
        for t in temps:
            for n in sizes:  # transformers' and llama.cpp's baselines are batch-1: at B > 1 only AR runs beside SD
                names = tuple(x for x in b.baselines if x == "ar" or n == 1 and self._plain(x, bool(drafters)))
                if names:
                    base.append(
                        dataclasses.replace(
                            b,
                            drafter=None,
                            gamma=1,
                            synthetic_alpha=None,
                            schedule=None,
                            calibration=None,
                            temperature=t,
                            batch_size=n,
                            baselines=names,
                        )
                    )
        return sd + base + self._rows()
