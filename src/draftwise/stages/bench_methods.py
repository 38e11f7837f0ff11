"""The methods `draftwise bench` times, by name: each a function `(prompt ids, seed) -> record` built from a config,
a target and a drafter. Separate from `bench`, which runs them (interleaved, warmed up, resumed) and sums them up.

  sd                the draftwise engine with the drafter (a model, a lookup or a hybrid; see `specs`), lookahead γ
  sd-scheduled      the same with the round scheduler (`sd.schedule`), when the config names a `schedule`
  ar                the draftwise engine without a drafter (plain autoregressive decoding)
  hf-generate       transformers `generate()`, autoregressive
  hf-assisted       transformers assisted generation with the same (model) drafter and a constant γ
  hf-prompt-lookup  transformers prompt lookup, `generate(prompt_lookup_num_tokens=γ)` (n-gram size: the drafter's
                    `max` when it is an n-gram drafter, else transformers' default)
  llama-cpp, llama-cpp-prompt-lookup, llama-server[:ARGS]
                    llama.cpp's own decoding on the target's GGUF (see `peers`)
  serve[:ARGS]      draftwise's own server (`draftwise serve`) through its HTTP API, client wall time (see `peers`)
With a batch size B > 1, sd and ar decode B prompts at once (`sd.batched_sd`): one record per batch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .. import specs
from ..config import BenchConfig
from ..errors import DraftwiseError
from ..rundir import read_records
from ..runtimes.base import Model, ModelOptions
from ..runtimes.hf import model as hf
from ..runtimes.llamacpp import lm as llamacpp
from ..runtimes.registry import stamp
from ..sd import calibrate
from ..sd.batched_sd import generate_batch_sd
from ..sd.loop import generate
from ..sd.sampling import SamplingParams
from ..sd.schedule import Scheduler, VerifyCurve
from ..timing import sync
from . import peers


def engine_method(
    target: Model, drafter: specs.Drafter | None, config: BenchConfig, scheduler: Scheduler | None = None
):
    params = SamplingParams(config.temperature, config.top_p)

    def run(ids: list[int], seed: int, max_new_tokens: int = config.max_new_tokens) -> dict:
        gen = generate(
            target.lm,
            ids,
            params,
            max_new_tokens,
            torch.Generator(device=target.lm.device).manual_seed(seed),
            drafter=drafter.loop_drafter if drafter else None,
            gamma=config.gamma,
            eos=target.eos_ids,
            stop_below=config.draft_stop if drafter else 0.0,
            synthetic_alpha=config.synthetic_alpha if drafter else None,
            scheduler=scheduler,
        )
        return {
            "tokens": gen.tokens,
            "new_tokens": len(gen.tokens),
            "seconds": gen.seconds,
            "prefill_s": gen.prefill_s,
            "rounds": [r.record() for r in gen.rounds],
        }

    run.scheduler = scheduler  # the Runner commits each finished request's observations to it
    return run


def batched_method(target: Model, drafter: specs.Drafter | None, config: BenchConfig):
    """B prompts at once through `sd.batched_sd` (AR without a drafter): one record per batch, wall time of the
    batch."""
    params = SamplingParams(config.temperature, config.top_p)

    def run(batch: list[list[int]], seed: int, max_new_tokens: int = config.max_new_tokens) -> dict:
        gens, seconds = generate_batch_sd(
            target.lm,
            batch,
            params,
            max_new_tokens,
            torch.Generator(device=target.lm.device).manual_seed(seed),
            drafter=drafter.loop_drafter if drafter else None,
            gamma=config.gamma,
            eos=target.eos_ids,
            synthetic_alpha=config.synthetic_alpha if drafter else None,
        )
        return {
            "tokens": [g.tokens for g in gens],
            "new_tokens": sum(len(g.tokens) for g in gens),
            "seconds": seconds,
            "prefill_s": gens[0].prefill_s,
            "rounds": [r.__dict__ for g in gens for r in g.rounds],
        }

    return run


def hf_method(target: Model, assistant: Model | None, config: BenchConfig, prompt_lookup: int | None = None):
    """transformers generate(): plain, assisted by a model drafter with a constant γ (no dynamic schedule, no early
    stop), or with its prompt lookup (γ tokens, n-grams up to `prompt_lookup`)."""
    from transformers import GenerationConfig

    model = target.hf_model()
    eos = sorted(target.eos_ids)
    sampling = {"do_sample": False}
    if config.temperature > 0:  # top_k=0: no top-k cut, so the distribution is the one the engine samples from
        sampling = {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p, "top_k": 0}
    extra, lookup = {}, {}
    if assistant is not None:
        assistant = assistant.hf_model()
        gc = assistant.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = (
            config.gamma,
            "constant",
            0.0,
        )
        extra = {"assistant_model": assistant}
    if prompt_lookup is not None:
        lookup = {"prompt_lookup_num_tokens": config.gamma, "max_matching_ngram_size": prompt_lookup}

    def run(ids: list[int], seed: int, max_new_tokens: int = config.max_new_tokens) -> dict:
        gen_config = GenerationConfig(
            max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[0], **sampling, **lookup
        )
        inputs = torch.tensor([ids], device=model.device)
        torch.manual_seed(seed)  # transformers samples from the global generator; it takes no Generator argument
        sync(model.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=gen_config, **extra)
        sync(model.device)
        seconds = time.perf_counter() - start
        tokens = out[0, len(ids) :].tolist()
        return {"tokens": tokens, "new_tokens": len(tokens), "seconds": seconds}

    return run


HF_PROMPT_LOOKUP_NGRAM = 2  # transformers' default max_matching_ngram_size


SCHEDULED = "sd-scheduled"  # SD with the round scheduler (`sd.schedule`), beside static SD when `schedule` is set


def method_names(config: BenchConfig) -> list[str]:
    return (
        (["sd"] if config.drafter else [])
        + ([SCHEDULED] if config.drafter and config.schedule else [])
        + list(config.baselines)
    )


def methods(
    config: BenchConfig, target: Model, drafter: specs.Drafter | None, context: int = 0, log_dir: Path | None = None
) -> dict:
    """Each method of `config` by name. `context`: the longest prompt (llama.cpp's baselines size their KV cache by
    it); `log_dir`: where llama-server writes its log (a temporary file when None)."""
    engine = engine_method if config.batch_size == 1 else batched_method
    out = {"sd": engine(target, drafter, config)} if drafter else {}
    if drafter and config.schedule:
        if getattr(drafter.lookup, "learn", False):
            raise DraftwiseError("a learning suffix corpus (learn=1) cannot be shared by static and scheduled SD")
        out[SCHEDULED] = engine_method(target, drafter, config, round_scheduler(config, target))
    ngram = getattr(drafter.lookup, "max_n", None) if drafter and drafter.kind == "lookup" else None
    builders = {
        "ar": lambda: engine(target, None, config),
        "hf-generate": lambda: hf_method(target, None, config),
        "hf-assisted": lambda: hf_method(target, drafter.model, config),
        "hf-prompt-lookup": lambda: hf_method(target, None, config, ngram or HF_PROMPT_LOOKUP_NGRAM),
    }
    n_ctx = peers.context_size(context, config)
    lookup = drafter.lookup if drafter and drafter.kind == "lookup" else None
    out.update(
        {
            name: builders[name]()
            if name in builders
            else peers.build(name, config, target, ngram, n_ctx, log_dir, lookup)
            for name in config.baselines
        }
    )
    return out


PLAIN = ("ar", "llama-server", "llama-cpp", "hf-generate")  # plain decoding: one full weight read per new token


def plain_bytes(name: str, target: Model) -> int | None:
    """Bytes of weights one step of a plain-decoding method reads (None: not a plain method): the target on the
    draftwise engine, its GGUF file in llama.cpp's, its transformers twin in generate()."""
    if name == "ar":
        return target.weight_bytes()
    if name in ("llama-server", "llama-cpp"):
        return llamacpp.step_bytes(peers.target_gguf(target))
    if name == "hf-generate":
        return hf.step_bytes(target.hf_model())
    return None


def round_scheduler(config: BenchConfig, target: Model) -> Scheduler:
    """The round scheduler of `config.schedule` (a profile folder's verify curve), its calibration started from
    `config.calibration` (a design's calibration table, or an earlier run's scheduled rounds) when given."""
    scheduler = Scheduler(VerifyCurve.from_profile(config.schedule, config.gamma, stamp(target, model_options(config))))
    if config.calibration and calibrate.is_calibration(config.calibration):  # measured before the run (design)
        scheduler.calibration = calibrate.load(config.calibration, config.temperature)
    elif config.calibration:  # an earlier run's scheduled rounds
        scheduler.commit(calibration_rounds(config))
    return scheduler


def calibration_rounds(config: BenchConfig) -> list[dict]:
    """The scheduled rounds of `config.calibration` (a bench or bench-grid run folder) with this drafter and
    temperature, in the order they ran: what the scheduler's calibration starts from."""
    folder = Path(config.calibration)
    if not (folder / "records.jsonl").is_file():
        raise DraftwiseError(f"calibration {folder}: not a bench run folder (no records.jsonl)")
    own = json.loads((folder / "config.json").read_text())
    own = own.get("bench", own)  # a grid's records carry their point; a single bench's point is its config
    rounds = []
    for r in read_records(folder / "records.jsonl"):  # a run killed mid-write is read up to its last whole record
        if (
            r.get("method") == SCHEDULED
            and r.get("drafter", own.get("drafter")) == config.drafter
            and r.get("temperature", own.get("temperature")) == config.temperature
        ):
            rounds += r["rounds"]
    if not rounds:
        raise DraftwiseError(f"calibration {folder}: no scheduled rounds of {config.drafter} at T={config.temperature}")
    return rounds


def model_options(config: BenchConfig) -> ModelOptions:
    return ModelOptions(
        config.dtype,
        config.device,
        config.backend,
        config.compile,
        gguf_quant=config.gguf_quant,
        llama_exact=config.llama_exact,
    )
