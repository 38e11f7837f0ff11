"""Native code that can fault, run where a fault costs only its own work.

llama.cpp runs inside the process that calls it (its Python bindings), so one fault in its kernels — an instruction
the CPU or the OS does not allow, a bug — would take a whole design with it. `run(fn, *args, label=...)` calls
`fn(*args)` in a child process instead and returns what it returns:

  * an exception in the child comes back as a DraftwiseError carrying its message;
  * a death by a signal comes back as `NativeCrash`, one line: what died, by which signal, in what. "In what" comes
    from the child's *crumbs* (`crumb`: the runtime it was running and the native call it was in, written into a
    small shared file the parent reads once the child is gone) and from the innermost frames Python's faulthandler
    wrote when the signal arrived.

The child is a fresh interpreter (`python -c`, ~2-3 s of imports; the call and its outcome travel as pickles in a
temporary folder), never a fork: a child forked from a process whose OpenMP pool has run hangs at its first parallel
region, and multiprocessing's spawn would import the caller's main script again. It inherits stdout and stderr, so
progress bars still show. A KeyboardInterrupt in the parent stops the child; the kernel kills it when the parent
dies (PR_SET_PDEATHSIG).

`crumb` is a no-op outside such a child: the engines call it on every pass at the cost of one small memory write.
Fault injection (tests only): `DRAFTWISE_FAULT=segv:NAME` makes `fault_point(NAME)` (llama.cpp's engine calls it
before each pass) read address 0 — a real SIGSEGV in native code — so a test can show what a crash costs.
"""

from __future__ import annotations

import ctypes
import faulthandler
import mmap
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import DraftwiseError

SLOTS = {"runtime": (0, 160), "call": (160, 512)}  # byte ranges of the crumbs file
_CRUMBS: mmap.mmap | None = None  # set in an isolated child only: where `crumb` writes
_FAULT = os.environ.get("DRAFTWISE_FAULT", "")


class NativeCrash(DraftwiseError):
    """A child process running native code died by a signal. `runtime`: what its crumbs say it was running (None: it
    left none); `signal`: the signal's name; `where`: the native call and Python frame it died in."""

    def __init__(self, label: str, signal_name: str, runtime: str | None, where: str, engine: str = "the engine"):
        self.label, self.signal, self.runtime, self.where, self.engine = label, signal_name, runtime, where, engine
        self.row = runtime  # the design row it costs (`design.pipeline` may name another)
        what = runtime or label
        head = engine if what == engine else f"{what}: {engine}"  # 'llama-server died ...', not twice
        super().__init__(f"{head} died with {signal_name}" + (f" in {where}" if where else ""))


def crumb(runtime: str | None = None, call: str | None = None) -> None:
    """Note what this (isolated) process is running: the runtime (e.g. a design row's name) and the native call in
    flight. A no-op outside an isolated child."""
    if _CRUMBS is None:
        return
    for name, text in (("runtime", runtime), ("call", call)):
        if text is not None:
            a, b = SLOTS[name]
            _CRUMBS[a:b] = text.encode("utf-8", "replace")[: b - a].ljust(b - a, b"\0")


def fault_point(name: str) -> None:
    """Tests only: die by a real SIGSEGV here when DRAFTWISE_FAULT=segv:NAME (see the module docstring)."""
    if _FAULT == f"segv:{name}":
        ctypes.string_at(0)


def _read_crumbs(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()
    except OSError:
        return {}
    out = {}
    for name, (a, b) in SLOTS.items():
        text = raw[a:b].rstrip(b"\0").decode("utf-8", "replace").strip()
        if text:
            out[name] = text
    return out


def _innermost_frame(trace: Path) -> str:
    """The innermost draftwise frame of the crashing thread in faulthandler's dump, as 'file.py:line in function'
    (faulthandler prints the current thread first, innermost frame first: '  File "/x/y.py", line 3 in fn')."""
    try:
        lines = trace.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    frames = []
    for line in lines:
        line = line.strip()
        if not line.startswith('File "'):
            if frames:
                break  # the crashing thread's stack ends at the first line that is not a frame
            continue
        path, _, rest = line[len('File "') :].partition('"')
        number, _, function = rest.removeprefix(", line ").partition(" in ")
        frames.append((path, f"{Path(path).name}:{number.strip()} in {function.strip()}"))
    ours = [f for p, f in frames if "/draftwise/" in p and not p.endswith("/isolate.py")]
    return (ours or [f for _, f in frames] or [""])[0]


def _die_with_parent() -> None:
    """Linux: the kernel kills this child when the parent dies (a SIGKILLed design leaves no child writing on)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _main(tmp: str) -> None:
    """The child: read the call, run it with crumbs and faulthandler on, write what came of it."""
    global _CRUMBS
    _die_with_parent()
    folder = Path(tmp)
    path, payload = pickle.loads((folder / "call").read_bytes())
    sys.path[:0] = [p for p in path if p not in sys.path]  # the parent's: `fn` may live beside its caller
    fn, args = pickle.loads(payload)
    with open(folder / "crumbs", "r+b") as f:
        _CRUMBS = mmap.mmap(f.fileno(), SLOTS["call"][1])
    faulthandler.enable(open(folder / "trace", "w"), all_threads=False)  # noqa: SIM115  (open until the end)
    try:
        outcome = ("ok", fn(*args))
    except NativeCrash as e:  # a process of its own died (a llama-server): the parent raises it again
        outcome = ("crash", e.label, e.signal, e.runtime, e.where, e.engine)
    except BaseException as e:  # noqa: BLE001  (everything goes back to the parent, in words)
        outcome = ("error", type(e).__name__, str(e).splitlines()[0] if str(e) else "", isinstance(e, DraftwiseError))
    (folder / "outcome.tmp").write_bytes(pickle.dumps(outcome))
    (folder / "outcome.tmp").rename(folder / "outcome")


def run(fn, *args, label: str):
    """`fn(*args)` in a child interpreter; its result, its error as a DraftwiseError, or a `NativeCrash` when it died
    by a signal. `fn` must be importable by name (a module-level function) and `args` picklable."""
    with tempfile.TemporaryDirectory(prefix="draftwise-isolate-") as tmp:
        folder = Path(tmp)
        (folder / "call").write_bytes(pickle.dumps((sys.path, pickle.dumps((fn, args)))))
        (folder / "crumbs").write_bytes(b"\0" * SLOTS["call"][1])
        code = "import sys; from draftwise.isolate import _main; _main(sys.argv[1])"
        proc = subprocess.Popen([sys.executable, "-c", code, tmp])
        try:
            code = proc.wait()
        except BaseException:  # Ctrl-C, SIGTERM turned into SystemExit: the child goes too
            stop(proc)
            raise
        return _outcome(folder, code, label)


def _outcome(folder: Path, code: int, label: str):
    """What the child's run came to (see `run`)."""
    if code < 0:
        notes = _read_crumbs(folder / "crumbs")
        frame = _innermost_frame(folder / "trace")
        where = " ".join(x for x in (notes.get("call"), frame and f"({frame})") if x)
        raise NativeCrash(label, signal.Signals(-code).name, notes.get("runtime"), where)
    if not (folder / "outcome").is_file():
        raise DraftwiseError(f"{label}: the child process exited with code {code} without a result")
    message = pickle.loads((folder / "outcome").read_bytes())
    if message[0] == "ok":
        return message[1]
    if message[0] == "crash":
        _, what, sig, runtime, where, engine = message
        raise NativeCrash(what, sig, runtime or _read_crumbs(folder / "crumbs").get("runtime"), where, engine)
    _, kind, text, ours = message
    raise DraftwiseError(text if ours else f"{label}: {kind}: {text}")


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate, wait up to `grace_s`, kill: a child process never outlives the call that made it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
