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

from ..errors import DraftwiseError
from .base import Executor, InProcess, Resources, Work, exclusive  # noqa: F401  (the executors' API)
from .ray import RayExecutor

EXECUTORS = ("inprocess", "ray")


def make(name: str = "inprocess", address: str | None = None) -> Executor:
    """The executor a CLI flag names: `inprocess` (default) or `ray` (a local cluster, or `address`)."""
    if name == "inprocess":
        if address:
            raise DraftwiseError("--ray-address needs --executor ray")
        return InProcess()
    if name == "ray":
        return RayExecutor(address)
    raise DraftwiseError(f"unknown executor {name!r}: choose from {', '.join(EXECUTORS)}")
