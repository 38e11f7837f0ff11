"""The design's traffic (`draftwise.traffic`): which requests its benchmarks measure, and what the plan needs to know
of them."""

from __future__ import annotations

from .. import traffic
from ..config import BenchConfig, DesignConfig
from ..stages.bench import select_prompts


def prompts(config: DesignConfig, limit: int) -> list:
    """The first `limit` prompts of the traffic: the user's file, else the selection suites (as bench selects them)."""
    return select_prompts(
        BenchConfig(target=config.target, suite=config.bench_suites, prompts=config.prompts, limit=limit)
    )


def requests(config: DesignConfig, limit: int) -> set[tuple[float, str]]:
    """The traffic's (temperature, prompt id) requests among the first `limit` prompts (`traffic.requests_of`)."""
    return traffic.requests_of(prompts(config, limit), config.temperatures, own=bool(config.prompts))


def temperatures(config: DesignConfig, limit: int) -> tuple[float, ...]:
    """Every temperature of the traffic, in order: each one is measured."""
    return traffic.temperatures_of(prompts(config, limit), config.temperatures, own=bool(config.prompts))


def outline(config: DesignConfig) -> dict:
    """What the plan needs to know of the traffic: its temperatures and mean answer length (`costs.Outline`)."""
    if not config.prompts:
        return {"temperatures": len(config.temperatures), "answer": float(config.max_new_tokens)}
    ps = prompts(config, config.bench_limit)
    answers = [p.extra.get("max_tokens", config.max_new_tokens) for p in ps]
    temps = traffic.temperatures_of(ps, config.temperatures, own=True)
    return {"temperatures": len(temps), "answer": sum(answers) / len(answers)}


def context(config: DesignConfig, target) -> int:
    """The KV positions a decode step of the traffic sees on average — a selection prompt's tokens plus half its answer
    — where the profiles time the target's passes: attention grows with the context, and on an int8 or q4 engine,
    whose matrices are cheap, a profile at a shorter context predicts every method too fast."""
    ps = prompts(config, config.bench_limit)
    spans = [len(target.encode(p.text)) + p.extra.get("max_tokens", config.max_new_tokens) / 2 for p in ps]
    most = getattr(target.config, "max_position_embeddings", None) or 1 << 20
    return max(1, min(round(sum(spans) / len(spans)), most - 16))  # room for the passes timed after it
