"""`design` on the engines users deploy on: one verdict per engine, beside what llama-server already has.

The pipeline (candidates, training, lookup tuning, the lean engine's verdict) runs once; each further row then
measures the candidates where a user would run them. Costs — the verify curve above all — belong to (engine,
precision, machine), so a γ, a drafter or a verdict chosen on one engine does not transfer to another:

  rows             the lean engine at int8 (`lean-int8`: int8 weights, activations quantized per token — a lossy
                   choice, its quality measured by the design's `quality` stage); llama.cpp running the target's own
                   GGUF (for `default`, the Q4_1 file it ships as), and one row per `--gguf-quants` precision: the
                   target written at that precision from the weights draftwise loads (a lossy choice the user makes;
                   F32 of a dequantised Q4_1 file computes that file's own function)
  profile@E        E's verify curve, and each model candidate's step (drafters written as GGUF at E's precision)
  tune-lookup@E    the lookup settings replayed over the target's text, priced with E's verify times
  bench-select@E   one interleaved grid on E at T = 0: the tuned lookups, the hybrid, and the model candidates the cost
                   model cannot rule out on E, at their γ for E; draftwise AR on E; on a llama.cpp row also
                   llama-cpp-python's generate and llama-server on the same token ids: plain, --spec-default, each
                   --spec-type with its defaults, and the nearest built-in of each draftwise candidate with its settings
                   (`nearest_builtin`)
  verdict@E        the fastest draftwise method beyond noise (paired bootstrap over prompts, a tie to the cheaper), to
                   deploy when its interval over E's AR lies above 1, else plain decoding; beside it the best
                   llama-server built-in with its interval, and how often greedy SD reproduced AR's tokens on E (a
                   quantized multi-token pass of llama.cpp may round differently from a one-token step; lean-int8's
                   cannot)

A row is of a kind (`Row`): `LeanRow` (the lean engine at a precision), `LlamaCppRow` (llama.cpp at a GGUF type). The
kind says what the row profiles and benches with, its runtime's own methods measured beside draftwise's (llama.cpp:
llama-server's built-ins, llama-cpp-python) and its export (`export_rows.EXPORTS`); stages and records are alike.
Which row to deploy on is `fastest`'s question: every row's choice against the fastest plain decoding of any row.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from .. import metrics
from ..config import BenchConfig, BenchGridConfig, ProfileConfig
from ..models.int8 import NAME as INT8
from ..models.llamacpp_load import LLAMA_CPP, gguf_file, quant_name, written
from ..sd.families import drafter_kind, family_of
from ..stages import profile
from ..stages.bench import SCHEDULED
from ..stages.bench_grid import as_method, label
from . import decide, lookup, measure

GAMMAS = (1, 2, 3, 4, 6, 8)
SCREEN = 0.9  # a model candidate predicted below this share of the best draftwise method on E is not benchmarked
SPEC_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")  # llama-server's draft-free built-ins


LEAN_INT8 = "lean-int8"  # the lean engine at int8, a row of its own
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

    def profile_config(self, c, drafters: tuple[str, ...]) -> ProfileConfig:
        """Its verify curve, and each model candidate's step on it."""
        return ProfileConfig(
            target=self.target,
            drafters=drafters,
            depths=(),
            gammas=GAMMAS,
            batches=(1,),
            warmup=2,
            repeats=7,
            seed=c.seed,
            backend=self.backend,
            dtype=self.dtype,
            gguf_quant=self.drafter_quant,
            **_options(c),
        )

    def bench_config(self, p, **kw) -> BenchConfig:
        """A bench on the row (the selection grid's prompts unless `kw` says otherwise)."""
        c = p.config
        kw = {"suite": c.bench_suites, "limit": c.bench_limit, **kw}
        return BenchConfig(
            target=self.target,
            backend=self.backend,
            dtype=self.dtype,
            gguf_quant=self.drafter_quant,
            max_new_tokens=c.max_new_tokens,
            seed=c.seed,
            llama_server=c.llama_server,
            **_options(c),
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
    """The lean engine at a precision other than the design's own (int8: a lossy choice)."""

    backend: str = "lean"

    @classmethod
    def plan(cls, config) -> list[Row]:
        if LEAN_INT8 in config.rows and config.device == "cpu":  # int8 is a CPU precision
            return [cls(LEAN_INT8, config.target, INT8.upper(), "f32", False, dtype=INT8)]
        return []

    def quality_runtime(self) -> str:
        return f"lean:{self.dtype}"

    def dropped(self, p) -> bool:
        return p.dropped(LEAN_INT8)

    @staticmethod
    def label(v: dict) -> str:
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
        own = gguf_file(config.target)
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
        measure.run_grid(p, f"bench-python@{self.name}", BenchGridConfig(bench=config), drafter=v["spec"])
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
    """The rows of a design beyond the lean engine at its own precision: lean-int8, then llama.cpp's — the target's
    own file, then each `gguf_quants` copy."""
    return [row for kind in KINDS.values() for row in kind.plan(config)]


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


def _options(config) -> dict:
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


def candidates(p, e: Row, target, models: dict[str, str], lookups: bool, predicted) -> dict[str, tuple]:
    """{name: (spec, γ)} the row's selection grid runs: the lookups tuned with its verify times and the hybrid, and
    the model candidates its cost model cannot rule out (≥ SCREEN of the best prediction)."""
    prof = f"profile@{e.name}"
    best = {
        n: max(predicted(p, s, n, profile=prof).items(), key=lambda kv: kv[1], default=(1, 0.0))
        for n, s in models.items()
    }
    cands: dict[str, tuple[str, int]] = {}
    tuned: dict[str, dict] = {}
    if lookups:
        top = max(models, key=lambda n: best[n][1]) if models else None
        tuned = lookup.tune(
            p, target, (top, models[top], best[top][0]) if top else None, profile=prof, stage=f"tune-lookup@{e.name}"
        )
        cands.update({m: (spec, tuned[m]["gamma"]) for m, _, spec in lookup.tuned_candidates(tuned)})
    lead = max([tuned[m]["predicted_tokens_per_s"] for m in cands] + [b for _, b in best.values()], default=0.0)
    cands.update({n: (models[n], best[n][0]) for n in models if best[n][1] >= SCREEN * lead})
    return cands


def run_row(p, e: Row, target, models: dict[str, str], lookups: bool, predicted) -> dict:
    """One row's stages (module docstring); returns its verdict record. `models`: the model candidates benchmarked on
    the lean engine ({name: spec}); `predicted(p, spec, name, profile=...)`: design's prediction."""
    prof = f"profile@{e.name}"
    p.stage(prof, lambda f: profile.run(e.profile_config(p.config, tuple(models.values())), f, p.executor))
    cands = candidates(p, e, target, models, lookups, predicted)
    nearest = {n: b for n, (s, g) in cands.items() if (b := e.nearest(s, g)) is not None}
    # each tuned lookup's scheduled variant, priced by E's verify curve, from the design's calibration
    scheduled = lookup.scheduled_options(cands) if "calibrate-lookup" in p.done else {}
    first = next(iter(cands.values()))[0]
    grid = BenchGridConfig(
        bench=e.bench_config(
            p,
            drafter=first,
            gamma=1,
            baselines=("ar", *e.peers(nearest)),
            **(measure.scheduling(p, prof) if scheduled else {}),
        ),
        drafters=tuple(s for s, _ in cands.values()),
        drafter_gammas=tuple(g for _, g in cands.values()),
        scheduled=tuple(cands[m][0] for m in scheduled.values()),
    )
    measure.run_grid(
        p,
        f"bench-select@{e.name}",
        grid,
        drafters={n: s for n, (s, _) in cands.items()},
        gammas={n: g for n, (_, g) in cands.items()},
        scheduled=scheduled,
    )
    v = p.stage(f"verdict@{e.name}", lambda f: verdict(p, e, cands, nearest, scheduled))
    return e.follow_up(p, v)


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


def verdict(
    p, e: Row, cands: dict[str, tuple[str, int]], nearest: dict[str, str], scheduled: dict[str, str] | None = None
) -> dict:
    """The row's verdict record (module docstring): draftwise's choice on E with its interval, the built-ins beside.
    `scheduled`: {scheduled option: its static candidate} (measured in that candidate's grid point)."""
    stage, scheduled = f"bench-select@{e.name}", scheduled or {}
    cands = {**cands, **{n: cands[m] for n, m in scheduled.items()}}
    nearest = {**nearest, **{n: nearest[m] for n, m in scheduled.items() if m in nearest}}
    recs = measure.records(p, [stage])
    points = {r["drafter"]: r for r in measure.grid_points(p, stage)}
    ours = measure.option_key({n: s for n, (s, _) in cands.items()}, scheduled)

    def theirs(r):
        return None if r["method"] == "ar" else r["method"] if r["method"] not in ("sd", SCHEDULED) else decide.IGNORE

    def method(n):
        return SCHEDULED if n in scheduled else "sd"

    mine, peers = decide.timings(recs, ours), decide.timings(recs, theirs)
    ar, _ = mine.pop(None), peers.pop(None)
    step = {n: round((points[s]["draft_step_ms"] or 0.0) / points[s]["ar_step_ms"], 2) for n, (s, _) in cands.items()}
    decision = decide.choose(decide.compare(mine, ar, p.config.seed), lambda n: (step[n], n in scheduled))
    base = decide.compare(peers, ar, p.config.seed) if peers else {"speedup": {}}
    builtin = {m: s for m, s in base["speedup"].items() if m.startswith("llama-server")}
    server = peers.get("llama-server")  # each built-in over llama-server's own plain decoding, on the same prompts
    over_plain = (
        decide.compare({m: peers[m] for m in builtin if m != "llama-server"}, server, p.config.seed)["speedup"]
        if server and len(builtin) > 1
        else {}
    )
    best_builtin = max((m for m in builtin if m != "llama-server"), key=lambda m: builtin[m][0], default=None)
    chosen = decision["chosen"]
    recommend = decision["speedup"][chosen][1] > 1.0
    sd_recs = [r for r in recs if r["method"] == method(chosen) and r["drafter"] == cands[chosen][0]]
    ar_recs = [r for r in recs if r["method"] == "ar"]
    pick = mine[chosen] if recommend else ar  # what the verdict deploys: the method, or plain decoding
    against = (
        decide.compare({"verdict": pick}, peers[best_builtin], p.config.seed)["speedup"]["verdict"]
        if best_builtin
        else None
    )
    any_point = next(iter(points.values()))
    methods = any_point["methods"]
    return {
        "engine": e.name,
        "quant": e.quant,
        "shipped": e.shipped,
        "target_file": Path(e.target).name,
        "target_path": e.target,
        "drafter_quant": e.drafter_quant,
        "backend": e.backend,
        "dtype": e.dtype,
        "recommend": recommend,
        "drafter": chosen,
        "spec": cands[chosen][0],
        "kind": drafter_kind(cands[chosen][0]),
        "method": method(chosen),
        "gamma": cands[chosen][1],
        "speedup": decision["speedup"][chosen],
        "decision": decision,
        "tokens_per_s": as_method(points[cands[chosen][0]], method(chosen))["tokens_per_s"],
        "ar_tokens_per_s": methods["ar"]["tokens_per_s"],
        "ar_step_ms": any_point["ar_step_ms"],
        "builtins": {
            m: {
                "speedup": s,
                "over_server_plain": over_plain.get(m),
                "tokens_per_s": methods[m]["tokens_per_s"],
                **server_counts(methods[m]),
            }
            for m, s in builtin.items()
        },
        "best_builtin": best_builtin,
        "verdict_over_best_builtin": against,
        "llama_cpp_generate_tokens_per_s": methods.get("llama-cpp", {}).get("tokens_per_s"),
        "identical": metrics.identical_fraction(sd_recs, ar_recs),
        "divergence": metrics.divergence(sd_recs, ar_recs),
        "candidates": {
            n: {
                "spec": s,
                "gamma": g,
                "method": method(n),
                "speedup": decision["speedup"][n],
                "nearest": nearest.get(n),
                "tar": as_method(points[s], method(n))["tar"],
                "alpha": as_method(points[s], method(n))["alpha"],
            }
            for n, (s, g) in cands.items()
        },
        "rule": "deploy when the chosen method's speedup over AR on this engine is above 1 beyond noise (95 % "
        "interval, paired bootstrap over prompts); otherwise plain decoding",
    }


def server_counts(summary: dict) -> dict:
    """A llama-server baseline's own drafted / accepted counts (None where it did not speculate)."""
    return {k: summary.get(k) for k in ("drafted", "accepted", "acceptance")}


def short_args(method: str) -> str:
    """A llama-server baseline's arguments for a table: a drafter GGUF by its file name, not its cache path."""
    parts = shlex.split(method.removeprefix("llama-server").removeprefix(":"))
    return shlex.join(Path(x).name if i and parts[i - 1] == "-md" else x for i, x in enumerate(parts)) or "(plain)"


def sentence(v: dict) -> str:
    """The row's verdict in one sentence (report and export); specs by their short label."""
    pt, lo, hi = v["speedup"]
    builtin = ""
    if v["best_builtin"]:
        b = v["builtins"][v["best_builtin"]]
        vs = v["verdict_over_best_builtin"]
        plain = b.get("over_server_plain")
        builtin = (
            f" The best llama-server built-in here, `{short_args(v['best_builtin'])}`, measured "
            f"{b['speedup'][0]:.2f}× draftwise AR [{b['speedup'][1]:.2f}–{b['speedup'][2]:.2f}]"
            + (f" and {plain[0]:.2f}× llama-server's plain decoding [{plain[1]:.2f}–{plain[2]:.2f}]" if plain else "")
            + (
                ""
                if b.get("drafted")
                else " although it drafted nothing on these prompts (plain decoding in "
                "effect: llama-server processes differ by a few % among themselves)"
            )
            + f"; {'the verdict' if v['recommend'] else 'plain decoding on draftwise'} is {vs[0]:.2f}× it "
            f"[{vs[1]:.2f}–{vs[2]:.2f}]."
        )
    what = runtime_label(v) + (" with the round scheduler" if v.get("method", "sd") != "sd" else "")
    if v["recommend"]:
        return (
            f"On {what}: deploy {v['drafter']} ({label(v['spec'], 60)}, γ = {v['gamma']}), "
            f"{pt:.2f}× its plain decoding [{lo:.2f}–{hi:.2f}].{builtin}"
        )
    return (
        f"On {what}: use plain decoding; the best draftwise method, {v['drafter']} "
        f"({label(v['spec'], 60)}, γ = {v['gamma']}), measured {pt:.2f}× [{lo:.2f}–{hi:.2f}].{builtin}"
    )


def runtime_label(v: dict) -> str:
    """A row's runtime in words: engine, precision, and whether that precision is the user's lossy choice."""
    return kind_of(v).label(v)
