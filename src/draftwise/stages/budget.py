"""What the training stages (`distill`, `train-feature`) share: a budget of minutes or trained tokens with its
progress bar, and a run folder's records appended once per (event, step).

Why once: a run killed past its last checkpoint resumes from that checkpoint with the same data order, so it redoes
steps whose records already exist; their records must not be appended twice (the learning curve reads them)."""

from __future__ import annotations

import sys

from tqdm import tqdm

from ..rundir import RunDir


class Budget:
    """`minutes` of training time, or `tokens` trained when given (deterministic); `meta` the counters so far
    (step, tokens, seconds: a resumed run starts its bar where it stopped)."""

    def __init__(self, minutes: float | None, tokens: int | None, meta: dict, desc: str, unit: str):
        self.tokens, self.seconds = tokens, 60 * minutes if minutes and not tokens else None
        self.bar = tqdm(
            total=tokens or int(self.seconds),
            initial=meta["tokens"] if tokens else int(meta["seconds"]),
            desc=desc,
            unit=unit if tokens else "s",
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def left(self, meta: dict) -> bool:
        """Whether training goes on after these counters."""
        if self.tokens:
            return meta["tokens"] < self.tokens
        return meta["seconds"] < self.seconds

    def advance(self, meta: dict, new_tokens: int, postfix: str) -> None:
        self.bar.update(new_tokens if self.tokens else int(meta["seconds"]) - self.bar.n)
        self.bar.set_postfix_str(postfix)

    def close(self) -> None:
        self.bar.close()


class Log:
    """A run folder's records, appended once per (event, step) (module docstring)."""

    def __init__(self, run_dir: RunDir):
        self.run_dir = run_dir
        self.recorded = {(r["event"], r["step"]) for r in run_dir.records()}

    def __call__(self, record: dict) -> None:
        if (record["event"], record["step"]) not in self.recorded:
            self.recorded.add((record["event"], record["step"]))
            self.run_dir.append(record)

    def has(self, event: str, step: int) -> bool:
        return (event, step) in self.recorded

    def empty(self) -> bool:
        return not self.recorded
