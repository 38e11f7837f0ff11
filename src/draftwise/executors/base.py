"""The executor interface (`Work`, `Resources`, `Executor`) and the in-process executor; see the package docstring."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Work(Protocol[T, R]):
    def __call__(self) -> Callable[[T], R]:
        """Build (once per process) the function that runs one item."""


@dataclass(frozen=True)
class Resources:
    """What one item occupies while it runs (Ray's num_cpus / num_gpus)."""

    cpus: float = 1.0
    gpus: float = 0.0


def exclusive(device: str, threads: int | None) -> Resources:
    """A timing item: the GPU it runs on, or the CPU threads it uses (all cores when threads is unset)."""
    if str(device).startswith("cuda"):
        return Resources(cpus=1.0, gpus=1.0)
    return Resources(cpus=float(threads or os.cpu_count() or 1))


class Executor(Protocol):
    def map(
        self,
        work: Work[T, R],
        items: Iterable[T],
        resources: Resources = Resources(),
        local: Callable[[T], R] | None = None,
    ) -> Iterator[tuple[T, R]]:
        """Run `work()`'s function on each item, yielding (item, result) as each finishes (in any order). `local`:
        that function already built in this process by the caller (an in-process executor uses it instead of
        loading the models a second time)."""

    def close(self) -> None:
        """Release what the executor started (a local Ray instance); the run is over."""


class InProcess:
    def map(
        self,
        work: Work[T, R],
        items: Iterable[T],
        resources: Resources = Resources(),
        local: Callable[[T], R] | None = None,
    ) -> Iterator[tuple[T, R]]:
        items = list(items)
        if not items:
            return
        fn = local or work()
        for item in items:
            yield item, fn(item)

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
