"""The OpenAI API as the server speaks it: request bodies (pydantic), their checks, the response and chunk objects,
and the error object every 4xx/5xx carries (`{"error": {"message", "type", "param", "code"}}`).

Fields OpenAI defines that change nothing here (`user`, `presence_penalty` at 0, ...) are accepted and ignored; those
the server cannot honour (`n` > 1, `echo`, `best_of` > 1, a batch of prompts) are refused in one line rather than
silently dropped. `return_token_ids` (as vLLM has it) adds the generated token ids to each choice. Log-probabilities
(`logprobs`, `top_logprobs`) are the target's raw distribution at each emitted token, before temperature and top-p (as
vLLM reports them by default): what the verify pass computed, equal to AR's.
"""

from __future__ import annotations

import json
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
LOGPROBS_MAX = 20  # top_logprobs: OpenAI's limit


class ApiError(Exception):
    """An HTTP error with an OpenAI error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers: dict[str, str] = {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """What both endpoints take."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    return_token_ids: bool = False

    def logprob_count(self) -> int | None:
        """None: no log-probabilities asked; k: each token's and the k most likely tokens' at its position."""
        return None

    def stops(self) -> tuple[str, ...]:
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if len(stops) > 4:
            raise ApiError(400, "stop: at most 4 sequences", param="stop")
        return stops


class CompletionRequest(Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)
    best_of: int | None = None
    suffix: str | None = None

    def logprob_count(self) -> int | None:
        return self.logprobs


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones, in order
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=LOGPROBS_MAX)
    max_completion_tokens: int | None = None

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


def parse(body: bytes, cls: type[Sampling]) -> Sampling:
    """A request body -> its request object, or a 400 that names the first bad field."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        req = cls.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ApiError(400, f"{where}: {err['msg']}", param=where) from None
    unsupported = {
        "n": req.n != 1,
        "echo": getattr(req, "echo", False),
        "best_of": (getattr(req, "best_of", None) or 1) != 1,
        "suffix": getattr(req, "suffix", None) is not None,
    }
    for name, given in unsupported.items():
        if given:
            raise ApiError(400, f"{name}: not supported by this server (one choice per request)", param=name)
    if isinstance(req.prompt if isinstance(req, CompletionRequest) else "", list) and req.prompt:
        if not all(isinstance(t, int) for t in req.prompt):
            raise ApiError(400, "prompt: one prompt per request (a string or a list of token ids)", param="prompt")
    return req


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice(
    chat: bool,
    text: str,
    finish_reason: str | None,
    token_ids: list[int] | None,
    delta: bool,
    logprobs: dict | None = None,
) -> dict:
    """One choice: of a whole response, or of a streamed chunk (`delta`: the text since the last chunk)."""
    if chat:
        message = {"role": "assistant", "content": text}
        out = {"index": 0, "delta" if delta else "message": message, "logprobs": logprobs}
    else:
        out = {"index": 0, "text": text, "logprobs": logprobs}
    out["finish_reason"] = finish_reason
    if token_ids is not None:
        out["token_ids"] = token_ids
    return out


def envelope(chat: bool, rid: str, model: str, choices: list[dict], chunk: bool, **extra) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": choices, **extra}


def sse(obj) -> bytes:
    """One server-sent event: `data: <json>` (or `data: [DONE]`) and a blank line."""
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def logprobs_object(chat: bool, items: list[dict], decode, offset: int = 0) -> dict:
    """OpenAI's logprobs of a choice from the engine's items (`serve.batch.token_logprobs`: token, logprob, top as
    (id, logprob) pairs); `decode` turns an id into its text; `offset`: the text's length before these tokens."""
    if chat:
        entry = lambda t, lp: {"token": decode(t), "logprob": lp, "bytes": list(decode(t).encode())}  # noqa: E731
        return {
            "content": [
                {**entry(i["token"], i["logprob"]), "top_logprobs": [entry(*x) for x in i["top"]]} for i in items
            ]
        }
    texts = [decode(i["token"]) for i in items]
    starts = [offset + sum(len(t) for t in texts[:k]) for k in range(len(texts))]
    return {
        "tokens": texts,
        "token_logprobs": [i["logprob"] for i in items],
        "top_logprobs": [{decode(t): lp for t, lp in i["top"]} for i in items],
        "text_offset": starts,
    }
