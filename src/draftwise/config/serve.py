"""`draftwise serve`'s config: the decoding it serves (the options `bench` takes for one point, or a design's export
folder) and the HTTP server's own settings."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftwiseError
from .base import internal, like, opt
from .bench import BenchConfig

PLACEHOLDER = "{export}"  # in serve.json: the folder the file lies in (replaced by its absolute path when read)
SERVE_FILE = "serve.json"  # in an export folder: the decoding options of its verdict (paths relative to the folder)
# what an export's serve.json may set: the decoding, never where the server listens or who may call it
FROM_EXPORT = (
    "target",
    "drafter",
    "gamma",
    "gamma_by_temperature",
    "draft_stop",
    "dtype",
    "backend",
    "gguf_quant",
    "schedule",
    "calibration",
)


@dataclass(frozen=True)
class ServeConfig:
    """`draftwise serve`: an OpenAI-compatible HTTP server decoding with one drafter (or none: plain decoding)."""

    export: str | None = opt(
        None,
        "a design's export folder (or one of its engines/ROW folders): serve its verdict — drafter, γ, precision, "
        "schedule — as measured; options given on the command line win",
        metavar="DIR",
    )
    target: str = like(BenchConfig, "target")
    drafter: str | None = opt(
        None, "the drafter spec, as bench takes it (a checkpoint, ngram[:...], suffix[:DIR,...], hybrid:...); none: AR"
    )
    gamma: int = opt(4, "lookahead γ: tokens drafted per round (the most per round for a lookup drafter)")
    gamma_by_temperature: str | None = opt(
        None,
        "γ by request temperature, T:γ pairs (e.g. 0:3,1:0): a request drafts with the γ of the nearest temperature "
        "listed, 0 meaning plain decoding for it (a design's per-temperature verdicts); it replaces --gamma",
    )
    draft_stop: float = like(BenchConfig, "draft_stop")
    schedule: str | None = like(
        BenchConfig,
        "schedule",
        help="decode with the round scheduler (sd.schedule): each round verifies the prefix of the proposal that "
        "this profile folder's verify curve (same engine and precision) and the calibrated confidence price best",
    )
    calibration: str | None = like(BenchConfig, "calibration")
    dtype: str = like(BenchConfig, "dtype")
    device: str = like(BenchConfig, "device")
    backend: str = like(BenchConfig, "backend")
    compile: bool = like(BenchConfig, "compile")
    gguf_quant: str = like(BenchConfig, "gguf_quant")
    llama_exact: bool = like(BenchConfig, "llama_exact")
    threads: int | None = like(BenchConfig, "threads")
    host: str = opt("127.0.0.1", "the address to listen on (anything but 127.0.0.1 exposes the server)")
    port: int = opt(8000, "the port to listen on (0: a free one, printed when the server is ready)")
    api_key: str | None = opt(None, "require `Authorization: Bearer KEY` on /v1/* and /metrics")
    served_model_name: str | None = opt(None, "the model name requests give (default: --target as given)")
    max_batch: int = opt(
        8,
        "requests decoded together (a continuous batch on the lean engine; 1: one at a time, as on the other "
        "engines); γ shrinks as the batch grows, priced from the verify curve measured at start-up",
    )
    max_len: int = opt(
        4096, "the most tokens a request's prompt and answer hold together (at most the model's context)"
    )
    max_queue: int = opt(
        16, "requests waiting beyond the batch being decoded; past it a request gets 503 + Retry-After"
    )
    chunked_prefill: bool = opt(
        True,
        "prefill a joining prompt whole before the next round (the batch's rows wait for it; more throughput and an "
        "earlier first token when long prompts dominate, a longer stall for the rows decoding)",
    )
    max_body_bytes: int = opt(1 << 20, "the largest request body accepted (413 past it)")
    seed: int = like(BenchConfig, "seed")
    given: tuple[str, ...] = internal((), "the options the command line gave (they win over the export's)")

    def __post_init__(self):
        object.__setattr__(self, "given", tuple(self.given))
        if self.max_queue < 0 or self.max_body_bytes < 1 or not 0 <= self.port < 65536:
            raise DraftwiseError("need max_queue >= 0, max_body_bytes >= 1 and 0 <= port < 65536")
        if self.max_batch < 1 or self.max_len < 2:
            raise DraftwiseError(f"need max_batch >= 1 and max_len >= 2, got {self.max_batch} and {self.max_len}")
        self.gammas_at()  # a malformed --gamma-by-temperature is refused here, in one line
        self.bench()  # the decoding options are checked as bench checks them

    def gammas_at(self) -> dict[float, int] | None:
        """`gamma_by_temperature` read: {temperature: γ}, None when not given."""
        if not self.gamma_by_temperature:
            return None
        out = {}
        for pair in self.gamma_by_temperature.split(","):
            t, _, g = pair.partition(":")
            try:
                out[float(t)] = int(g)
            except ValueError:
                raise DraftwiseError(
                    f"--gamma-by-temperature: expected T:γ pairs such as 0:3,1:0, got {self.gamma_by_temperature!r}"
                ) from None
        if any(t < 0 or g < 0 for t, g in out.items()):
            raise DraftwiseError(
                f"--gamma-by-temperature: temperatures and γ must be >= 0: {self.gamma_by_temperature}"
            )
        return out

    @staticmethod
    def default_port() -> int:
        return next(f.default for f in dataclasses.fields(ServeConfig) if f.name == "port")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.target

    def bench(self) -> BenchConfig:
        """The decoding options as a one-point bench config (how models and the scheduler are loaded)."""
        own = {f.name for f in dataclasses.fields(BenchConfig)}
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k in own}
        return BenchConfig(**fields, baselines=() if self.drafter else ("ar",))


def from_export(config: ServeConfig) -> ServeConfig:
    """`config` with its export folder's decoding options (serve.json) where the command line gave none; the export's
    paths (a lookup corpus, a checkpoint, the schedule) resolved against the folder it lies in."""
    if config.export is None:
        return config
    folder = Path(config.export)
    path = folder / SERVE_FILE
    if not path.is_file():
        raise DraftwiseError(f"--export {folder}: no {SERVE_FILE} (give a design's export folder or engines/ROW)")
    saved = json.loads(path.read_text())
    unknown = set(saved) - set(FROM_EXPORT) - {"paths"}
    if unknown:
        raise DraftwiseError(f"{path}: unknown option(s) {', '.join(sorted(unknown))}")
    for key in saved.get("paths", ()):  # options whose value holds a path relative to the folder
        if saved.get(key):
            saved[key] = saved[key].replace(PLACEHOLDER, str(folder.resolve()))
    taken = {k: v for k, v in saved.items() if k in FROM_EXPORT and k not in config.given}
    return dataclasses.replace(config, **taken)
