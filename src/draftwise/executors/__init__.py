"""Where independent work items run. A stage hands an executor the items it has not finished yet and appends each
result to its records as it arrives, so any executor gives the same resumable run folder.

`InProcess` (the default) runs items one after another in this process: timing points must not share the machine
with each other, so parallelism here would corrupt the measurements it exists to take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[T, R]]:
        """Run `fn` on each item, yielding (item, result) as each finishes (in any order)."""


class InProcess:
    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[tuple[T, R]]:
        for item in items:
            yield item, fn(item)
