"""Where independent work items run. A stage hands an executor the items it has not finished yet and appends each
result to its own records as it arrives, so every executor gives the same resumable run folder.

A stage describes its work as a `Work`: a small picklable recipe (a frozen dataclass holding the stage's config)
that, called once per process, loads what the items need (models) and returns the function that runs one item.
So a Ray worker loads a target once and then runs many points on it, and nothing heavy is ever pickled.

`InProcess` (the default) runs items one after another in this process. `Ray` (optional: `pip install
"draftwise[ray]"`) runs each item as a Ray task with its declared `Resources`; a timing item declares the whole
device it times (all its threads, or one GPU), so two measurements never share a machine's cores or a GPU.

An executor is closed when the run is over (`close()`, or a `with` block): Ray then shuts down the local instance
it started, so a finished, failed or interrupted run leaves no process behind.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..errors import DraftwiseError

T = TypeVar("T")
R = TypeVar("R")

EXECUTORS = ("inprocess", "ray")


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
    def map(self, work: Work[T, R], items: Iterable[T], resources: Resources = Resources(),
            local: Callable[[T], R] | None = None) -> Iterator[tuple[T, R]]:
        """Run `work()`'s function on each item, yielding (item, result) as each finishes (in any order). `local`:
        that function already built in this process by the caller (an in-process executor uses it instead of
        loading the models a second time)."""

    def close(self) -> None:
        """Release what the executor started (a local Ray instance); the run is over."""


class InProcess:
    def map(self, work: Work[T, R], items: Iterable[T], resources: Resources = Resources(),
            local: Callable[[T], R] | None = None) -> Iterator[tuple[T, R]]:
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


def make(name: str = "inprocess", address: str | None = None) -> Executor:
    """The executor a CLI flag names: `inprocess` (default) or `ray` (a local cluster, or `address`)."""
    if name == "inprocess":
        if address:
            raise DraftwiseError("--ray-address needs --executor ray")
        return InProcess()
    if name == "ray":
        from .ray import RayExecutor

        return RayExecutor(address)
    raise DraftwiseError(f"unknown executor {name!r}: choose from {', '.join(EXECUTORS)}")
