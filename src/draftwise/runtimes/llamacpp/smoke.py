"""The smoke test a llama.cpp build passes on this machine before anything measures with it (`build`): the tools and
the Python bindings, each in a child process, so a build that dies by a signal costs that child, not set-up. A
prefill of 40 tokens, a 4-token pass (a verify) and decoding: a build whose batched passes die (AMX on some KVM
guests) fails here, not in the first benchmark."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...errors import DraftwiseError

SMOKE_TIMEOUT_S = 300.0


def run_checked(cmd: list[str], what: str, timeout: float = SMOKE_TIMEOUT_S, env: dict | None = None) -> str:
    """Run a smoke step in a child process; its stdout, or a DraftwiseError saying how it ended: a signal by name
    (the child dies, this process does not), a timeout, or a non-zero exit with its last line."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise DraftwiseError(f"{what} did not finish in {timeout:.0f} s") from None
    except OSError as e:
        raise DraftwiseError(f"{what} cannot run: {e.strerror or e}") from None
    if done.returncode < 0:
        raise DraftwiseError(f"{what} died with {signal.Signals(-done.returncode).name}")
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise DraftwiseError(f"{what} failed (exit {done.returncode}): {last[:200]}")
    return done.stdout


def smoke_tools(bin_dir: Path, gguf: Path, threads: int) -> dict:
    """llama-bench over the file: a prefill of 40 tokens, a 4-token pass, 4 decoded tokens; tokens/s of each."""
    out = run_checked(
        [str(bin_dir / "llama-bench"), "-m", str(gguf), "-p", "40,4", "-n", "4", "-r", "1", "-t", str(threads)]
        + ["-o", "json"],
        "llama-bench (prefill 40, a 4-token pass, decode 4)",
    )
    rows = json.loads(out)
    return {("pp" if r["n_prompt"] else "tg") + str(r["n_prompt"] or r["n_gen"]): round(r["avg_ts"], 1) for r in rows}


def smoke_bindings(gguf: Path, threads: int) -> dict:
    """The Python bindings through draftwise's llama.cpp engine, in a child interpreter (`bindings_check`)."""
    code = f"from draftwise.runtimes.llamacpp.smoke import bindings_check; bindings_check({str(gguf)!r}, {threads})"
    out = run_checked([sys.executable, "-c", code], "the llama.cpp bindings (prefill 40, a 4-token pass, decode 4)")
    return json.loads(out.strip().splitlines()[-1])


def bindings_check(gguf: str, threads: int) -> None:
    """The bindings' smoke test (run in a child by `smoke_bindings`): prefill, verify pass and decode, with finite
    logits, and the verify pass's first row agreeing with the one-token step at that position."""
    import torch

    from .lm import LlamaCppLM, LlamaCppModel

    model = LlamaCppModel(gguf, threads)
    lm = LlamaCppLM(model)
    lm.reset(1, 64)
    ids = torch.arange(10, 50).view(1, 40)
    start = time.perf_counter()
    last = lm.forward(ids, 0, n_logits=1)[0, -1]
    prefill = time.perf_counter() - start
    nxt = int(last.argmax())
    step = lm.forward(torch.tensor([[nxt]]), 40)[0, -1]
    verify = lm.forward(torch.tensor([[nxt, 5, 6, 7]]), 40)  # rolls back to 40: the same position, 4 tokens
    t = time.perf_counter()
    for i in range(4):
        lm.forward(torch.tensor([[int(step.argmax())]]), 41 + i)
    decode = (time.perf_counter() - t) / 4
    finite = bool(torch.isfinite(verify).all() and torch.isfinite(step).all())
    # a multi-token pass of a quantized file may round differently from a step: its top token among the step's top 5
    if not finite or int(verify[0, 0].argmax()) not in step.topk(5).indices.tolist():
        raise SystemExit("the bindings gave non-finite logits, or a verify pass that disagrees with a step")
    print(json.dumps({"prefill40_ms": round(1e3 * prefill, 2), "decode_ms": round(1e3 * decode, 2)}))
