"""Ray executor: each item a Ray task with declared resources; results stream back to the driver as they finish.

The driver alone writes records (it appends each result as `ray.wait` hands it over), so a task that Ray retries
after its worker died writes nothing twice: only the attempt that returns is ever seen. Workers keep the functions
they built (models loaded) for the last few `Work`s, keyed by the recipe itself, so a worker that runs many points
of one sweep loads the target once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from ..errors import DraftwiseError
from . import Resources, Work

_BUILT: OrderedDict = OrderedDict()  # per worker process: Work -> its built item function (a cache, not state)
_KEEP = 2


def _run_item(work: Work, item):
    fn = _BUILT.get(work)
    if fn is None:
        while len(_BUILT) >= _KEEP:
            _BUILT.popitem(last=False)
        fn = _BUILT[work] = work()
    _BUILT.move_to_end(work)
    return fn(item)


class RayExecutor:
    def __init__(self, address: str | None = None, max_retries: int = 3):
        try:
            import ray
        except ImportError as e:
            raise DraftwiseError('--executor ray needs Ray: pip install "draftwise[ray]"') from e
        self.ray, self.max_retries = ray, max_retries
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
        self.remote = ray.remote(_run_item)

    def map(self, work: Work, items: Iterable, resources: Resources = Resources(), local=None) -> Iterator[tuple]:
        """As `Executor.map`; `local` is not used (each worker builds its own)."""
        ray = self.ray
        items = list(items)
        if not items:
            return
        have = ray.cluster_resources()
        if resources.gpus > have.get("GPU", 0) or resources.cpus > have.get("CPU", 0):
            raise DraftwiseError(f"each item needs {resources.cpus:g} CPU(s) and {resources.gpus:g} GPU(s); the Ray cluster "
                                 f"has {have.get('CPU', 0):g} and {have.get('GPU', 0):g} (set --threads to what a node has)")
        task = self.remote.options(num_cpus=resources.cpus, num_gpus=resources.gpus, max_retries=self.max_retries)
        work_ref = ray.put(work)
        pending = {task.remote(work_ref, item): item for item in items}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    item = pending.pop(ref)
                    yield item, ray.get(ref)
        finally:
            for ref in pending:  # the driver stopped early (error, Ctrl-C): do not leave tasks running
                ray.cancel(ref)
