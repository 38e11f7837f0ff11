"""The round scheduler's calibration measured before any benchmark: a lookup drafter replayed over the target's own
text, each proposed position observed as the scheduler would observe it online (see `sd.schedule`).

At T = 0 greedy SD emits exactly the target's greedy text, so the replay reproduces every proposal of a real run and
position j's acceptance is 1[x_j = the text's token]. Under sampling (T > 0) the acceptance of x_j is min(1, p_T(x_j)),
p_T the target's distribution at T after the text so far (one teacher-forced pass per text); the replay follows the
greedy text, so a position is observed only where the proposal agreed with that text up to it (its context is then
the text's). A sampled run's own text differs from the greedy one, so this is the calibration's starting point, and
the online update of a run corrects it on that run's own rounds.

calibration.json: {"temperatures": {"<T>": {"positions", "counts": {feature bin: [positions, Σ acceptance]}}},
"drafters": {spec: γ}, "texts"};
`load` returns one temperature's bins as a `Calibration`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import DraftwiseError
from ..rundir import write_atomic
from .roles import Draft, Drafter
from .sampling import SamplingParams, probs
from .schedule import Calibration, feature

FILE = "calibration.json"
DEFINITIONS = (
    "counts[feature bin] = [proposed positions observed, sum of their acceptance probabilities]: at T = 0 "
    "1[x = the target's greedy token], at T > 0 min(1, p_T(x)) after the target's greedy text; a lookup "
    "replayed over that text, a position observed while the proposal agreed with the text before it"
)


def observe_text(
    calibration: Calibration,
    lookup: Drafter,
    prompt: list[int],
    continuation: list[int],
    gamma: int,
    p_text: torch.Tensor | None = None,
) -> int:
    """Replay `lookup` at lookahead γ over `continuation` (rounds advance as greedy SD's would) and observe each
    proposed position the text reaches; `p_text` [n, V]: the target's probabilities after each prefix of the text at
    the temperature calibrated (None: greedy). Returns the positions observed."""
    session = lookup.start([prompt])
    seq, t, n, seen = list(prompt), 0, len(continuation), 0
    while t < n:
        g = min(gamma, n - t - 1)
        draft = session.propose({0: seq}, g)[0] if g > 0 else Draft()
        accepted = 0
        for j, x in enumerate(draft.tokens):
            agree = x == continuation[t + j]
            a = float(agree) if p_text is None else min(1.0, float(p_text[t + j, x]))
            calibration.observe(feature(j + 1, draft.features[j]), a)
            seen += 1
            if not agree:
                break
            accepted += 1
        seq += continuation[t : t + accepted + 1]
        t += accepted + 1
        session.keep(0, len(seq) - 1)
    return seen


@torch.no_grad()
def text_logits(lm, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """The target's logits after each prefix of the text ([n, V]: row j predicts continuation[j])."""
    ids = torch.tensor([prompt + continuation])  # [1, T]
    lm.reset(1, ids.shape[1])
    return lm.forward(ids, 0, len(continuation) + 1)[0, :-1].float()  # [n, V]


def calibrate(
    lm, texts: Sequence[dict], lookups: dict[str, tuple[Drafter, int]], temperatures: Sequence[float]
) -> dict:
    """calibration.json's content: every lookup in `lookups` ({spec: (drafter, γ)}) replayed at its γ over every text
    ({prompt, continuation} token ids), the observations pooled per temperature (the features name the proposer's
    signal, so one table serves every lookup)."""
    tables = {t: Calibration() for t in temperatures}
    positions = {t: 0 for t in temperatures}
    for text in tqdm(texts, desc="calibrate", unit="text", file=sys.stderr, dynamic_ncols=True):
        logits = text_logits(lm, text["prompt"], text["continuation"]) if any(t > 0 for t in temperatures) else None
        for t in temperatures:
            p_text = probs(logits, SamplingParams(t)) if t > 0 else None  # [n, V]
            for lookup, gamma in lookups.values():
                positions[t] += observe_text(tables[t], lookup, text["prompt"], text["continuation"], gamma, p_text)
    return {
        "definitions": DEFINITIONS,
        "drafters": {spec: gamma for spec, (_, gamma) in lookups.items()},
        "texts": len(texts),
        "temperatures": {f"{t:g}": {"positions": positions[t], "counts": tables[t].counts} for t in temperatures},
    }


def write(folder: str | Path, content: dict) -> Path:
    Path(folder).mkdir(parents=True, exist_ok=True)
    return write_atomic(Path(folder) / FILE, json.dumps(content) + "\n")


def load(folder: str | Path, temperature: float) -> Calibration:
    """One temperature's table of a calibration folder."""
    path = Path(folder) / FILE
    if not path.is_file():
        raise DraftwiseError(f"{folder}: no {FILE} (not a calibration folder)")
    temps = json.loads(path.read_text())["temperatures"]
    table = temps.get(f"{temperature:g}")
    if table is None:
        raise DraftwiseError(f"{path}: no calibration at T={temperature:g} (it has T = {', '.join(temps)})")
    return Calibration({k: list(v) for k, v in table["counts"].items()})


def is_calibration(folder: str | Path) -> bool:
    return (Path(folder) / FILE).is_file()
