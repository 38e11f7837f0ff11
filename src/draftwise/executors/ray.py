"""Ray executor: each item a Ray task with declared resources; results stream back to the driver as they finish.

The driver alone writes records (it appends each result as `ray.wait` hands it over), so a task that Ray retries
after its worker died writes nothing twice: only the attempt that returns is ever seen. Workers keep the functions
they built (models loaded) for the last few `Work`s, keyed by a digest of the recipe's pickle that the driver
computes once per `map` (a recipe need not be hashable: a resumed run's holds its finished records, dicts), so a
worker that runs many points of one sweep loads the target once. The recipe itself travels once, through the object
store, and a worker fetches it only when it has not built it yet.

A Ray instance the executor started itself (no address, Ray not yet initialised) is shut down by `close()` (or on
leaving a `with` block; the CLI closes every executor it made): a finished, failed or interrupted run leaves no
raylet, GCS or worker behind. SIGTERM (`kill`) is covered too: once `ray.init` has returned and until `close()`,
SIGTERM raises SystemExit in the driver, so the stages' and the CLI's `finally` blocks run and `close()` shuts Ray
down (the driver exits 143, or 1 when the signal lands inside a Ray call, which turns it into SystemExit(1)). A
SIGTERM during `ray.init` itself meets Ray's own C++ failure handler, which aborts the driver.

SIGKILL cannot be caught. What is left then is Ray's own fate sharing (Linux: the processes `ray.init` starts die
with their parent, through PR_SET_PDEATHSIG; elsewhere a reaper process). Observed with Ray 2.60 on Linux, after a
SIGKILL of the driver: GCS, raylet, monitor, log monitor and dashboard end within a second, the workers within about
3 s, but the raylet's DashboardAgent and RuntimeEnvAgent linger about a minute before they exit by themselves. `ray
stop` is the way to end them by hand (it stops every Ray process of the user on that machine).
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from ..errors import DraftwiseError
from .base import Resources, Work

_BUILT: OrderedDict = OrderedDict()  # per worker process: recipe digest -> its built item function (a cache, not state)
_KEEP = 2


def digest(work: Work, dumps) -> str:
    """The cache key of a recipe: sha256 of its pickle (`dumps`: Ray's cloudpickle, what `ray.put` uses)."""
    return hashlib.sha256(dumps(work)).hexdigest()


def _run_item(key: str, boxed: list, item):
    """One item on a worker. `boxed`: [the recipe's object ref], in a list so that Ray does not fetch and unpickle
    the recipe for every task; it is fetched only when this worker has not built `key` yet."""
    fn = _BUILT.get(key)
    if fn is None:
        import ray

        while len(_BUILT) >= _KEEP:
            _BUILT.popitem(last=False)
        fn = _BUILT[key] = ray.get(boxed[0])()
    _BUILT.move_to_end(key)
    return fn(item)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through the run's `finally` blocks, which close the executor


class RayExecutor:
    def __init__(self, address: str | None = None, max_retries: int = 3):
        try:
            import ray
        except ImportError as e:
            raise DraftwiseError('--executor ray needs Ray: pip install "draftwise[ray]"') from e
        self.ray, self.max_retries = ray, max_retries
        self.owns = not ray.is_initialized()  # this executor connected (and, without an address, started Ray)
        self._sigterm = None  # the SIGTERM handler before ours, restored by close()
        if self.owns:
            if threading.current_thread() is threading.main_thread():
                self._sigterm = signal.getsignal(signal.SIGTERM)
            ray.init(address=address, include_dashboard=False, log_to_driver=True)
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
        self.remote = ray.remote(_run_item)

    def map(self, work: Work, items: Iterable, resources: Resources = Resources(), local=None) -> Iterator[tuple]:
        """As `Executor.map`; `local` is not used (each worker builds its own)."""
        ray = self.ray
        items = list(items)
        if not items:
            return
        have = ray.cluster_resources()
        if resources.gpus > have.get("GPU", 0) or resources.cpus > have.get("CPU", 0):
            raise DraftwiseError(
                f"each item needs {resources.cpus:g} CPU(s) and {resources.gpus:g} GPU(s); the Ray cluster "
                f"has {have.get('CPU', 0):g} and {have.get('GPU', 0):g} (set --threads to what a node has)"
            )
        task = self.remote.options(num_cpus=resources.cpus, num_gpus=resources.gpus, max_retries=self.max_retries)
        key, boxed = digest(work, ray.cloudpickle.dumps), [ray.put(work)]
        pending = {task.remote(key, boxed, item): item for item in items}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    item = pending.pop(ref)
                    yield item, ray.get(ref)
        finally:
            for ref in pending:  # the driver stopped early (error, Ctrl-C): do not leave tasks running
                ray.cancel(ref)

    def close(self) -> None:
        """Shut down the Ray instance this executor started (disconnect from one it connected to); once."""
        if self.owns and self.ray.is_initialized():
            self.ray.shutdown()
        self.owns = False
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
