"""`design`'s lookup candidates: every registered lookup family (`sd.families`: n-gram, suffix, ...), tuned on the
target's own text before any benchmark.

  agree-lookup    the target's greedy continuations of the traffic's prompts (`--prompts`), else of `eval` prompts of
                  every bench suite (long prompts included),
                  with the default n-gram drafter's rounds replayed (an `agree` run; its texts serve every replay below)
  corpus-gain     the suffix drafter replayed with ¼, ½ and all of gen-data's continuations as its corpus: when the last
                  doubling still raised its predicted tokens/s by `corpus_gain` or more, gen-data is extended once
                  (`gen-data-more`: as many new train prompts again), since the corpus is what a suffix drafter
                  learns from
  suffix-index    the corpus (gen-data, and gen-data-more if it ran) saved with its tokenizer: `suffix:<that folder>`
  tune-lookup     each lookup family's settings grid (`LookupFamily.grid`: n-gram min/max, suffix factor/min_prob, ...)
                  × γ replayed exactly over those texts — greedy SD emits exactly the target's greedy text, so every
                  proposal and acceptance of a real run is reproduced — priced with the profile's verify times
                  (`cost.predict_rounds`). Each family's best settings, and the hybrid of the best model drafter with
                  the best lookup, are benchmarked beside the model drafters.
  calibrate-lookup  the round scheduler's starting calibration (`sd.calibrate`): the tuned lookup drafters
                  replayed over the same texts at every design temperature — in-sample for these prompts, as the
                  settings are; each scheduled run then updates it from its own rounds. The scheduled variant of each
                  tuned lookup is a candidate of its own (`measure.select`)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import continuations, cost, metrics
from ..config import AgreeConfig, GenDataConfig
from ..rundir import write_atomic
from ..runtimes.base import Model
from ..sd import calibrate, families
from ..sd.families import hybrid
from ..sd.families.suffix import CORPUS_FILE, gen_data_corpus, save_corpus
from ..sd.lookup import SuffixDrafter
from ..sd.suffix import SuffixTrie
from ..stages import agree, gen_data
from ..targets.fingerprint import write_fingerprint
from . import decide
from .measure import SCHEDULED

GAMMAS = (2, 3, 4, 6, 8)  # each lookup setting's γ axis
CURVE_GAMMA = 4


def verify_seconds(p, batch: int = 1, profile: str = "profile"):
    """t_verify(g) in seconds from a profile stage (g = 0: one AR step), interpolated between profiled γ."""
    entry = json.loads((p.folder(profile) / "profile.json").read_text())["batches"][str(batch)]
    curve = cost.verify_curve(entry)
    return lambda g: curve(g) / 1e3


def texts(p) -> list[dict]:
    """The replay texts: prompt ids, the target's greedy continuation and the suite, per eval prompt."""
    path = p.folder("agree-lookup") / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def replay(docs: list[dict], lookup, gamma: int, matches=None, model_gamma: int | None = None) -> list[dict]:
    """Every text's replayed rounds, each tagged with its suite."""
    out = []
    for i, d in enumerate(docs):
        rounds = agree.replay_rounds(
            d["prompt"], d["continuation"], gamma, lookup, matches[i] if matches else None, model_gamma
        )
        out += [{**r, "suite": d["suite"], "prompt_id": d["prompt_id"]} for r in rounds]
    return out


def per_prompt(rounds: list[dict], t_verify, t_model_step=None) -> dict[str, tuple[float, float]]:
    """{prompt id: (tokens, predicted seconds)} of replayed rounds: what `decide.compare` pairs prompt by prompt."""
    by_prompt: dict[str, list] = {}
    for r in rounds:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    out = {}
    for pid, rs in by_prompt.items():
        tokens = sum(r["emitted"] for r in rs)
        out[pid] = (tokens, tokens / cost.predict_rounds(rs, t_verify, t_model_step))
    return out


def choose_setting(rows: list[dict], docs: list[dict], t_verify) -> tuple[dict, dict]:
    """The best settings of one method: paired over prompts (bootstrap intervals of predicted speedup, as measured
    decisions are), a tie within noise going to the cheaper settings — smaller γ (a shorter verify pass), then fewer
    speculated tokens (higher min_prob; a shorter n-gram match length to look up; a smaller suffix factor: by the
    settings' names, 0 where a family has no such setting). Each row carries its `settings`. Returns (row, decision
    record)."""
    ar = {d["prompt_id"]: (len(d["continuation"]), len(d["continuation"]) * t_verify(0)) for d in docs}
    options = {r["spec"] + f"@{r['gamma']}": r for r in rows}

    def cheapness(key):
        r, settings = options[key], options[key]["settings"]
        return (r["gamma"], -settings.get("min_prob", 0), settings.get("max", 0), settings.get("factor", 0))

    record = decide.choose(decide.compare({k: r["per_prompt"] for k, r in options.items()}, ar), cheapness)
    return options[record["chosen"]], record


def row(spec: str, method: str, gamma: int, rounds: list[dict], t_verify, t_model_step=None) -> dict:
    by_suite: dict[str, list] = {}
    for r in rounds:
        by_suite.setdefault(r["suite"], []).append(r)
    tps = cost.predict_rounds(rounds, t_verify, t_model_step)
    return {
        "spec": spec,
        "method": method,
        "gamma": gamma,
        "per_prompt": per_prompt(rounds, t_verify, t_model_step),
        "tar": metrics.tar(rounds),
        "alpha": metrics.alpha(rounds),
        "proposed_fraction": metrics.proposals(rounds)["proposed_fraction"],
        "predicted_tokens_per_s": tps,
        "predicted_speedup": tps * t_verify(0),
        "tar_by_suite": {s: metrics.tar(rs) for s, rs in sorted(by_suite.items())},
        "predicted_speedup_by_suite": {
            s: cost.predict_rounds(rs, t_verify, t_model_step) * t_verify(0) for s, rs in sorted(by_suite.items())
        },
    }


def lookup_text(p, opts: dict) -> None:
    c = p.config
    p.stage(
        "agree-lookup",
        lambda f: agree.run(
            AgreeConfig(
                target=c.target,
                drafter="ngram",
                suites=c.bench_suites,
                prompts=c.prompts,  # the traffic's own texts, where the user gave it: its predictions are of it
                limit=c.tune_prompts,
                max_new_tokens=c.max_new_tokens,
                max_prompt_tokens=2048,
                gammas=GAMMAS,
                batch_size=4,
                **opts,
            ),
            f,
        ),
    )


def gen_data_config(p, opts: dict, prompts: int, skip: int = 0) -> GenDataConfig:
    c = p.config
    return GenDataConfig(
        target=c.target, max_new_tokens=96, temperatures=(0.0, 1.0), limit=prompts, skip=skip, seed=c.seed, **opts
    )


def corpus_gain(p, opts: dict, prompts: int) -> None:
    """The suffix drafter's predicted tokens/s with ¼, ½ and all of gen-data as its corpus; gen-data-more if it pays."""
    c, t_verify = p.config, verify_seconds(p)

    def decide(folder) -> dict:
        seqs, docs = gen_data_corpus(p.folder("gen-data")), texts(p)
        curve = {}
        for share in (4, 2, 1):  # strided subsets: every temperature and prompt length in each
            trie = SuffixTrie()
            for seq in seqs[::share]:
                trie.add(seq)
            rounds = replay(docs, SuffixDrafter(trie), CURVE_GAMMA)
            curve[trie.tokens] = cost.predict_rounds(rounds, t_verify)
        tokens = sorted(curve)
        gain = curve[tokens[-1]] / curve[tokens[-2]] - 1
        seconds = sum(
            json.loads(line)["seconds"] for line in (p.folder("gen-data") / "records.jsonl").read_text().splitlines()
        )
        return {
            "corpus_tokens": tokens,
            "predicted_tokens_per_s": [curve[t] for t in tokens],
            "gain_last_doubling": gain,
            "threshold": c.corpus_gain,
            "more": gain >= c.corpus_gain,
            "gen_data_seconds": seconds,
        }

    if p.stage("corpus-gain", decide)["more"] and not p.dropped("gen-data-more"):
        skip = json.loads((p.folder("gen-data") / "config.json").read_text())["limit"]  # the prompts gen-data took
        p.stage("gen-data-more", lambda f: gen_data.run(gen_data_config(p, opts, prompts, skip=skip), f))


def suffix_index(p, target) -> None:
    def build(folder: Path) -> dict:
        seqs = [s for name in ("gen-data", "gen-data-more") if name in p.done for s in gen_data_corpus(p.folder(name))]
        folder.mkdir(parents=True, exist_ok=True)
        save_corpus(folder / CORPUS_FILE, seqs)
        write_fingerprint(folder, target.tokenizer)
        start = time.perf_counter()
        trie = SuffixTrie()
        for seq in seqs:
            trie.add(seq)
        return {"sequences": len(seqs), "tokens": trie.tokens, "build_seconds": time.perf_counter() - start}

    p.stage("suffix-index", build)


def settings_rows(docs: list[dict], t_verify, data: Path | None, target: Model | None) -> list[dict]:
    """Every lookup family's tuning grid at every γ, replayed over the texts and priced; `data`: the suffix index."""
    rows = []
    for family in families.lookup_families():
        for setting in family.grid(data, target):
            for g in GAMMAS:
                rounds = replay(docs, setting.drafter, g)
                rows.append({**row(setting.spec, family.name, g, rounds, t_verify), "settings": setting.settings})
    return rows


def first_step_matches(drafter, seqs: list[continuations.Sequence]) -> list[list[bool]]:
    """Per sequence, whether the drafter's first draft step after each true prefix is the next token: a model's
    teacher-forced top-1, a feature head's from the target's own feature (its later steps read its own estimate, so
    the replay prices them as if they matched as often: an estimate, the benchmark measures the real rounds)."""
    if drafter.model is not None:
        return continuations.top1_matches(drafter.model.lm, seqs)
    return [agree.feature_score(drafter.loop_drafter, s, (1,))[0] for s in seqs]


def hybrid_row(p, target, model: tuple[str, str, int], lookup: dict, docs: list[dict], t_verify, profile: str) -> dict:
    """The best model drafter (by its own prediction, at its γ) where the best lookup (its row) has nothing."""
    name, spec, g_model = model
    drafter = families.load(spec, target)
    seqs = [continuations.Sequence(d["prompt_id"], d["prompt"] + d["continuation"], len(d["prompt"])) for d in docs]
    matches = first_step_matches(drafter, seqs)
    step, _ = cost.drafter_step_ms(json.loads((p.folder(profile) / "profile.json").read_text())["batches"]["1"], spec)
    rounds = replay(docs, families.lookup(lookup["spec"], target), lookup["gamma"], matches, g_model)
    return row(
        hybrid.compose(spec, lookup["spec"], g_model), hybrid.FAMILY.name, lookup["gamma"], rounds, t_verify, step / 1e3
    )


def tune(p, target, model: tuple[str, str, int] | None, profile: str = "profile", stage: str = "tune-lookup") -> dict:
    """The settings grids replayed and priced with the verify times of `profile` (a profile stage: each engine has its
    own); returns the decision: each lookup family's best (spec, γ), and the hybrid's."""
    t_verify = verify_seconds(p, profile=profile)

    def decide(folder: Path) -> dict:
        docs = texts(p)
        rows = settings_rows(docs, t_verify, p.folder("suffix-index"), target)
        best, decisions = {}, {}
        for m in dict.fromkeys(r["method"] for r in rows):
            best[m], decisions[m] = choose_setting([r for r in rows if r["method"] == m], docs, t_verify)
        if model is not None:
            lookup = max(best.values(), key=lambda r: r["predicted_tokens_per_s"])
            rows.append(hybrid_row(p, target, model, lookup, docs, t_verify, profile))
            best[rows[-1]["method"]] = rows[-1]
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(
            folder / "tune.json",
            json.dumps(
                {
                    "definitions": "predicted tokens/s: `cost.predict_rounds` over the "
                    "replayed greedy rounds with the profile's verify times (batch 1)",
                    "rows": rows,
                    "decisions": decisions,
                },
                indent=1,
            )
            + "\n",
        )
        return {
            m: {
                "spec": r["spec"],
                "gamma": r["gamma"],
                "predicted_tokens_per_s": r["predicted_tokens_per_s"],
                **({"why": decisions[m]["why"], "tie": decisions[m]["tie"]} if m in decisions else {}),
            }
            for m, r in best.items()
        }

    return p.stage(stage, decide)


def tuned_candidates(tuned: dict) -> list[tuple[str, str, str]]:
    """(name, role, spec) of each method `tune` chose (its done record): each lookup family's, then the hybrid; the
    role is the family's kind (lookup | hybrid)."""
    names = [m for m in (*families.lookup_names(), hybrid.FAMILY.name) if m in tuned]
    return [(m, families.drafter_kind(tuned[m]["spec"]), tuned[m]["spec"]) for m in names]


def scheduled_options(names) -> dict[str, str]:
    """{scheduled option: its static candidate} for the tuned lookups among `names` (`measure.select`)."""
    return {m + SCHEDULED: m for m in families.lookup_names() if m in names}


def calibrate_lookups(p, target, tuned: dict, stage: str = "calibrate-lookup") -> None:
    """calibration.json of the tuned lookup drafters at T = 0 and every design temperature."""

    def build(folder: Path) -> dict:
        lookups = {
            tuned[m]["spec"]: (families.lookup(tuned[m]["spec"], target), tuned[m]["gamma"])
            for m in families.lookup_names()
            if m in tuned
        }
        temps = sorted({0.0, *p.base.temperatures})  # all of them, whatever the budget leaves to measure
        content = calibrate.calibrate(target.lm, texts(p), lookups, temps)
        calibrate.write(folder, content)
        return {"positions": {t: v["positions"] for t, v in content["temperatures"].items()}}

    p.stage(stage, build)
