"""`design` on the engines users deploy on: one verdict per engine, beside what llama-server already has.

The pipeline (candidates, training, lookup tuning, the lean engine's verdict) runs once; each further row then
measures the candidates where a user would run them (`row_verdict`: its stages and its verdict):

  rows             the lean engine at int8 (`lean-int8`: int8 weights, activations quantized per token — a lossy
                   choice, its quality measured by the design's `quality` stage) and, where the target is a GGUF file
                   with 4-bit blocks, at q4 (`lean-q4`: the file's own blocks, activations as at int8); llama.cpp
                   running the target's own
                   GGUF (for `default`, the Q4_1 file it ships as), and one row per `--gguf-quants` precision: the
                   target written at that precision from the weights draftwise loads (a lossy choice the user makes;
                   F32 of a dequantised Q4_1 file computes that file's own function)

A row is of a kind (`Row`): `LeanRow` (the lean engine at a precision), `LlamaCppRow` (llama.cpp at a GGUF type). The
kind says what the row profiles and benches with, its runtime's own methods measured beside draftwise's (llama.cpp:
llama-server's built-ins, llama-cpp-python; `nearest_builtin`), what it measures after its verdict (`Row.follow_up`)
and its export (`export_rows.EXPORTS`); stages and records are alike. Which row to deploy on is `fastest`'s question:
every row's choice against the fastest plain decoding of any row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..config import BenchConfig, BenchGridConfig, ProfileConfig
from ..gguf.export import written
from ..gguf.read import quant_name
from ..runtimes.lean import q4
from ..runtimes.llamacpp.load import LLAMA_CPP
from ..sd.families import family_of
from . import decide, lean_rows, measure
from .estimate import GAMMAS
from .target import target_of

PLAIN = ("ar", "llama-server")  # the plain methods of a row: draftwise AR, llama-server without speculation

SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")  # llama-server's draft-free built-ins


DRAFTER_QUANT = {"F32": "f32", "F16": "f16"}  # a drafter's precision beside a target file of this type (else q8_0)


@dataclass(frozen=True)
class Row:
    """One verdict row: a runtime the design measures. A kind of row (`LeanRow`, `LlamaCppRow`) says what it profiles
    and benches with, which built-ins it measures beside draftwise and what it measures after its verdict; its export
    is `export_rows.EXPORTS[kind]`. Stage names and records are the same for every kind."""

    name: str  # e.g. llama.cpp-Q4_1, lean-int8: stage names and the report's rows
    target: str  # what the row loads: a GGUF file (llama.cpp), the design's target (lean)
    quant: str  # its precision as labelled: the file type (F32, F16, Q8_0, Q4_1, ...), INT8
    drafter_quant: str  # llama.cpp: what draftwise writes model drafters at for this row (f32 | f16 | q8_0)
    shipped: (
        bool  # the target's own file (False: a copy written, or weights requantized, at a precision the user chose)
    )
    backend: str = LLAMA_CPP
    dtype: str = "fp32"  # the lean engine's precision on a lean row
    plain: tuple[str, ...] = PLAIN  # the plain decodings its last grid measures beside the verdict

    @classmethod
    def plan(cls, config) -> list[Row]:
        """The rows of this kind a design config asks for."""
        return []

    def quality_runtime(self) -> str:
        """The row's runtime as `stages.quality` names it (its quality is measured against the lean engine at fp32)."""
        raise NotImplementedError

    def dropped(self, p) -> bool:
        """Whether the budget left the row out (`plan.DROPS`)."""
        raise NotImplementedError

    def profile_config(self, c, drafters: tuple[str, ...], context: int = 256) -> ProfileConfig:
        """Its verify curve, and each model candidate's step on it, at `context` cached positions."""
        return ProfileConfig(
            target=self.target,
            drafters=drafters,
            depths=(),
            gammas=GAMMAS,
            batches=(1,),
            warmup=2,
            repeats=7,
            context=context,
            seed=c.seed,
            backend=self.backend,
            dtype=self.dtype,
            gguf_quant=self.drafter_quant,
            **_cpu_options(c),
        )

    def bench_config(self, p, **kw) -> BenchConfig:
        """A bench on the row (the selection grid's prompts unless `kw` says otherwise)."""
        c = p.config
        kw = {"suite": c.bench_suites, "prompts": c.prompts, "limit": c.bench_limit, **kw}
        kw["prompts"] = kw["prompts"] if kw["suite"] == c.bench_suites else None  # a suite named: its prompts
        return BenchConfig(
            target=self.target,
            backend=self.backend,
            dtype=self.dtype,
            gguf_quant=self.drafter_quant,
            max_new_tokens=c.max_new_tokens,
            seed=c.seed,
            llama_server=c.llama_server,
            **_cpu_options(c),
            **kw,
        )

    def nearest(self, spec: str, gamma: int) -> str | None:
        """The baseline name of the runtime's own method nearest to a draftwise drafter (None: the runtime has none)."""
        return None

    def peers(self, nearest: dict[str, str]) -> tuple[str, ...]:
        """The runtime's own methods the selection grid measures beside draftwise's."""
        return ()

    def follow_up(self, p, v: dict) -> dict:
        """What the row measures after its verdict (`v`), added to it."""
        return v

    @staticmethod
    def label(v: dict) -> str:
        """A verdict's runtime in words."""
        raise NotImplementedError


@dataclass(frozen=True)
class LeanRow(Row):
    """The lean engine at a precision other than the design's own: int8 (a lossy choice), q4 (the target file's own
    4-bit blocks, where it has them)."""

    backend: str = "lean"
    plain: tuple[str, ...] = ("ar",)

    @classmethod
    def plan(cls, config) -> list[Row]:
        # q4 runs the file's weights bit for bit (shipped); int8 requantizes them
        return [
            cls(name, config.target, dtype.upper(), "f32", dtype == q4.NAME, dtype=dtype)
            for name, dtype in lean_rows.planned(config).items()
        ]

    def quality_runtime(self) -> str:
        return f"lean:{self.dtype}"

    def dropped(self, p) -> bool:
        return p.dropped(self.name)

    @staticmethod
    def label(v: dict) -> str:
        if v["dtype"] == q4.NAME:
            return (
                "the draftwise lean engine on the target file's own 4-bit blocks (q4: its weights bit for bit, "
                "activations quantized per token, its quality measured against fp32 of the same file)"
            )
        return (
            "the draftwise lean engine at int8 (int8 weights, activations quantized per token: a lossy choice, "
            "its quality measured against fp32)"
        )


@dataclass(frozen=True)
class LlamaCppRow(Row):
    """llama.cpp running a GGUF file of the target (its own, or one written at a precision the user chose), beside
    llama-server's built-ins and llama-cpp-python."""

    backend: str = LLAMA_CPP

    @classmethod
    def plan(cls, config) -> list[Row]:
        """The target's own file, then each `gguf_quants` copy."""
        if LLAMA_CPP not in config.rows:
            return []
        out: list[Row] = []
        own = target_of(config).file
        if own is not None:
            q = quant_name(own)
            out.append(cls(f"{LLAMA_CPP}-{q}", str(own), q, DRAFTER_QUANT.get(q, "q8_0"), True))
        for quant in (() if own is not None else ("f32",)) + tuple(config.gguf_quants):
            path = written(config.target, config.target, quant)
            q = quant_name(path)
            if all(e.quant != q for e in out):
                out.append(cls(f"{LLAMA_CPP}-{q}", str(path), q, quant, False))
        return out

    def quality_runtime(self) -> str:
        return LLAMA_CPP if self.shipped else f"{LLAMA_CPP}:{self.drafter_quant}"

    def dropped(self, p) -> bool:
        return p.dropped(LLAMA_CPP) or (not self.shipped and p.dropped("extra-rows"))

    def nearest(self, spec: str, gamma: int) -> str | None:
        return "llama-server:" + nearest_builtin(spec, gamma, self.target, self.drafter_quant)

    def peers(self, nearest: dict[str, str]) -> tuple[str, ...]:
        return ("llama-cpp", *builtins(nearest))

    def follow_up(self, p, v: dict) -> dict:
        """The export's llama-cpp-python snippet with a lookup drafter, as it runs."""
        if not (v["recommend"] and v["kind"] == "lookup"):
            return v
        config = self.bench_config(
            p,
            drafter=v["spec"],
            gamma=v["gamma"],
            limit=p.config.headline_limit,
            suite="spec_bench",
            baselines=("llama-cpp", "llama-cpp-lookup"),
        )
        measure.run_grid(
            p, f"bench-python@{self.name}", BenchGridConfig(bench=config), runtime=self.name, drafter=v["spec"]
        )
        return {**v, "python": python_figures(p, self)}

    @staticmethod
    def label(v: dict) -> str:
        return (
            f"{LLAMA_CPP} {v['quant']} ("
            + ("the file the target ships as" if v["shipped"] else "a copy written at this precision")
            + ")"
        )


KINDS: dict[str, type[Row]] = {"lean": LeanRow, LLAMA_CPP: LlamaCppRow}  # by backend, in planning order


def kind_of(v: dict) -> type[Row]:
    """A verdict record's row kind (records written before lean rows had no backend: llama.cpp)."""
    return KINDS[v.get("backend", LLAMA_CPP)]


def planned(config) -> list[Row]:
    """The rows of a design beyond the lean engine at its own precision: lean-int8 and lean-q4, then llama.cpp's — the
    target's own file, then each `gguf_quants` copy."""
    return [row for kind in KINDS.values() for row in kind.plan(config)]


def live(p) -> list[Row]:
    """The rows still measured: those planned, less those whose native code died (`pipeline`)."""
    return [e for e in planned(p.base) if e.name not in p.dead]


def forget(p) -> None:
    """Plan without the rows that died: the budget stops counting their stages."""
    if p.dead:
        alive = live(p)
        p.know(
            rows=sum(isinstance(e, LlamaCppRow) for e in alive),
            lean_rows=tuple(e.name for e in alive if isinstance(e, LeanRow)),
        )


def quality_runtime(e: Row) -> str:
    return e.quality_runtime()


def quality_of(p) -> dict[str, str]:
    """Each lossy row's quality against the lean engine at fp32 (the design's `quality` stage), by row name, in
    short."""
    if "quality" not in p.done:
        return {}
    q = json.loads((p.folder("quality") / "quality.json").read_text())
    out = {}
    for e in planned(p.base):
        s = q.get(e.quality_runtime()) or {}
        if s.get("agreement") is not None:
            out[e.name] = f"agreement {s['agreement']:.3f}, ΔNLL {s['nll_delta']:+.3f}"
    return out


def dropped(p, e: Row) -> bool:
    return e.dropped(p)


def target_name(v: dict) -> str:
    """The target file as an export names it: the shipped file by its name, a written copy by what makes it."""
    return v["target_file"] if v["shipped"] else f"target-{v['quant'].lower()}.gguf"


def _cpu_options(config) -> dict:
    """A row's stages run on the CPU whatever `--device` says: the lean rows and llama.cpp are CPU runtimes here."""
    return {"device": "cpu", "threads": config.threads}


def bench_config(p, e: Row, **kw) -> BenchConfig:
    return e.bench_config(p, **kw)


def nearest_builtin(spec: str, gamma: int, target: str, quant: str) -> str:
    """llama-server's built-in closest to a draftwise method, with its settings (the args after `llama-server:`): the
    drafter's family's (`sd.families`: n-gram lookup → ngram-simple, the suffix index → ngram-cache, a model drafter →
    draft-simple with the same drafter as GGUF at `quant`, a hybrid → both, llama-server trying them in turn)."""
    return family_of(spec).llama_server(spec, gamma, lambda model: written(model, target, quant)).command()


def builtins(nearest: dict[str, str]) -> list[str]:
    """The llama-server baselines of a row: plain, --spec-default, each spec type's defaults, each candidate's
    nearest."""
    names = ["llama-server", "llama-server:--spec-default"] + [f"llama-server:--spec-type {t}" for t in SPEC_TYPES]
    return list(dict.fromkeys(names + list(nearest.values())))


def python_figures(p, e: Row) -> dict:
    """llama-cpp-python with draftwise's lookup (its `LookupDraftModel`) over llama-cpp-python's plain generate."""
    recs = measure.records(p, [f"bench-python@{e.name}"])
    by = decide.timings(
        recs,
        lambda r: None
        if r["method"] == "llama-cpp"
        else r["method"]
        if r["method"] == "llama-cpp-lookup"
        else decide.IGNORE,
    )
    plain = by.pop(None)
    point = measure.grid_points(p, f"bench-python@{e.name}")[0]["methods"]
    return {
        "llama-cpp-lookup": {
            "tokens_per_s": point["llama-cpp-lookup"]["tokens_per_s"],
            "speedup": decide.compare(by, plain, p.config.seed)["speedup"]["llama-cpp-lookup"],
        }
    }


def runtime_label(v: dict) -> str:
    """A row's runtime in words: engine, precision, and whether that precision is the user's lossy choice."""
    return kind_of(v).label(v)
