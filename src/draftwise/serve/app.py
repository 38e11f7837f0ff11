"""The HTTP side: a FastAPI app with OpenAI's `/v1/completions`, `/v1/chat/completions` (streamed as server-sent
events when asked) and `/v1/models`, plus `/health` and `/metrics`.

Bodies are read and checked here rather than by FastAPI's own validation, so that every bad request — malformed JSON,
a missing or out-of-range field, a body past the size limit, a prompt past the context — gets OpenAI's error object
and one log line, not FastAPI's 422 shape. Nothing in a request names a file. A client that leaves cancels its
generation: a streamed one when the event stream is torn down, a plain one found by polling between events.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from ..sd.sampling import SamplingParams
from .engine import Busy, Delta, Done, Engine, Failed, Job
from .metrics import CONTENT_TYPE, ServerMetrics, stats
from .protocol import (
    DEFAULT_COMPLETION_TOKENS,
    ApiError,
    ChatRequest,
    CompletionRequest,
    choice,
    envelope,
    logprobs_object,
    new_id,
    parse,
    sse,
    usage,
)
from .text import TextStream

log = logging.getLogger("draftwise.serve")
POLL_S = 0.25  # how often a plain (not streamed) request checks that its client is still there


class Served:
    """What the routes need: the engine, the served name, the tokenizer and the limits."""

    def __init__(
        self, engine: Engine, metrics: ServerMetrics, name: str, api_key: str | None, max_body: int, context: int = 0
    ):
        self.engine, self.metrics, self.name, self.api_key, self.max_body = engine, metrics, name, api_key, max_body
        target = engine.target
        self.tokenizer, self.vocab = target.tokenizer, target.vocab_size
        self.context = context or int(getattr(target.config, "max_position_embeddings", 0) or 2048)

    def decode(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")

    async def body(self, request: Request) -> bytes:
        """The request body, refused with 413 past the size limit (before reading it when its length is declared)."""
        too_big = ApiError(413, f"the request body is over {self.max_body} bytes", code="body_too_large")
        if int(request.headers.get("content-length") or 0) > self.max_body:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def prompt_ids(self, req) -> list[int]:
        """The token ids of a request's prompt: a chat through the target's own chat template, a completion's text
        as the tokenizer encodes it, or its token ids as given."""
        if isinstance(req, ChatRequest):
            if not getattr(self.tokenizer, "chat_template", None):
                raise ApiError(400, "this model has no chat template: use /v1/completions", param="messages")
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        elif isinstance(req.prompt, str):
            ids = list(self.tokenizer(req.prompt)["input_ids"])
        else:
            ids = list(req.prompt)
            if any(not 0 <= t < self.vocab for t in ids):
                raise ApiError(400, f"prompt: token ids must be in [0, {self.vocab})", param="prompt")
        if not ids:
            raise ApiError(400, "the prompt is empty: nothing to condition on", param="prompt")
        return ids

    def max_tokens(self, req, prompt_tokens: int) -> int:
        """The request's max_tokens, checked against the context (vLLM's rule: prompt + max_tokens must fit)."""
        room = self.context - prompt_tokens
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {prompt_tokens} tokens, past this model's context of {self.context}",
                param="prompt",
            )
        asked = getattr(req, "max_completion_tokens", None)
        asked = req.max_tokens if asked is None else asked  # (not `or`: a max_completion_tokens of 0 is refused)
        if asked is None:
            return room if isinstance(req, ChatRequest) else min(DEFAULT_COMPLETION_TOKENS, room)
        if asked < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {asked}", param="max_tokens")
        if asked > room:
            raise ApiError(
                400,
                f"this model's context is {self.context} tokens: the prompt ({prompt_tokens}) and max_tokens "
                f"({asked}) do not fit",
                param="max_tokens",
            )
        return asked

    async def submit(self, request: Request, chat: bool):
        """Parse, check and queue a request; the response is streamed or whole."""
        self.authorize(request)
        req = parse(await self.body(request), ChatRequest if chat else CompletionRequest)
        if req.model != self.name:
            raise ApiError(
                404,
                f"model {req.model!r} does not exist: this server serves {self.name!r}",
                param="model",
                code="model_not_found",
            )
        ids, logprobs = self.prompt_ids(req), req.logprob_count()
        if logprobs is not None and self.engine.batch is None:
            raise ApiError(400, "logprobs: served by the lean engine's batch only (--max-batch > 1)", param="logprobs")
        rid = request.headers.get("x-request-id") or new_id("chatcmpl" if chat else "cmpl")
        job = Job(
            ids,
            SamplingParams(req.temperature, req.top_p),
            self.max_tokens(req, len(ids)),
            req.seed if req.seed is not None else secrets.randbits(32),
            TextStream(self.tokenizer, req.stops()),
            asyncio.get_running_loop(),
            logprobs=logprobs,
            request_id=rid,
        )
        try:
            self.engine.submit(job)
        except Busy as e:
            err = ApiError(503, str(e), type="server_error", code="server_busy")
            err.headers["Retry-After"] = str(e.retry_after)
            raise err from None
        headers = {"x-request-id": rid}
        if req.stream:
            return StreamingResponse(self.events(job, req, chat, rid), media_type="text/event-stream", headers=headers)
        return JSONResponse(await self.whole(job, req, chat, rid, request), headers=headers)

    async def whole(self, job: Job, req, chat: bool, rid: str, request: Request) -> dict:
        text, logprobs, loop = [], [], asyncio.get_running_loop()
        checked = loop.time()
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), POLL_S)
            except TimeoutError:
                event = None
            if event is None or loop.time() - checked >= POLL_S:  # every POLL_S, tokens arriving or not
                checked = loop.time()
                if await request.is_disconnected():
                    job.cancel()
                    log.info("client left: generation cancelled")
                    raise ApiError(499, "client closed the request")
            if event is None:
                continue
            if isinstance(event, Failed):
                raise ApiError(500, event.message, type="server_error")
            if isinstance(event, Delta):
                text.append(event.text)
                logprobs += event.logprobs or []
                continue
            gen = event.generation
            self.done(req, event, "whole", rid)
            ids = gen.tokens if req.return_token_ids else None
            lp = logprobs_object(chat, logprobs, self.decode) if job.logprobs is not None else None
            return envelope(
                chat,
                rid,
                self.name,
                [choice(chat, "".join(text), event.finish_reason, ids, delta=False, logprobs=lp)],
                chunk=False,
                usage=usage(gen.prompt_tokens, len(gen.tokens)),
                draftwise=stats(gen),
            )

    async def events(self, job: Job, req, chat: bool, rid: str):
        """The server-sent events of a streamed request; leaving early (the client went away) cancels the job."""
        ids = lambda tokens: tokens if req.return_token_ids else None  # noqa: E731
        offset = 0  # text given out so far: a completion's logprobs give each token's offset in it
        try:
            while True:
                event = await job.events.get()
                if isinstance(event, Failed):
                    yield sse(ApiError(500, event.message, type="server_error").body())
                    break
                if isinstance(event, Delta):
                    lp = logprobs_object(chat, event.logprobs, self.decode, offset) if event.logprobs else None
                    offset += len(event.text)
                    if event.text or req.return_token_ids or lp:
                        part = choice(chat, event.text, None, ids(event.tokens), True, logprobs=lp)
                        yield sse(envelope(chat, rid, self.name, [part], True))
                    continue
                gen = event.generation
                yield sse(envelope(chat, rid, self.name, [choice(chat, "", event.finish_reason, ids([]), True)], True))
                if req.stream_options and req.stream_options.include_usage:
                    extra = {"usage": usage(gen.prompt_tokens, len(gen.tokens)), "draftwise": stats(gen)}
                    yield sse(envelope(chat, rid, self.name, [], True, **extra))
                self.done(req, event, "stream", rid)
                break
            yield sse(b"[DONE]")
        finally:
            job.cancel()  # a no-op once finished; a client that left ends its generation after the current round

    def done(self, req, event: Done, how: str, rid: str) -> None:
        gen = event.generation
        self.metrics.requests.labels("200").inc()
        log.info(
            "200 %s %s %d+%d tokens %.2f s (%.1f tokens/s) %s",
            rid,
            how,
            gen.prompt_tokens,
            len(gen.tokens),
            gen.seconds,
            len(gen.tokens) / gen.seconds if gen.seconds else 0.0,
            event.finish_reason,
        )


def create_app(served: Served) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app):
        log.info("ready")
        yield
        log.info("stopped taking requests")

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        served.metrics.requests.labels(str(e.status)).inc()
        log.info("%d %s %s: %s", e.status, request.method, request.url.path, e.message)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        return await api_error(request, ApiError(e.status_code, f"{request.method} {request.url.path}: {e.detail}"))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request):
        served.authorize(request)
        return {
            "object": "list",
            "data": [{"id": served.name, "object": "model", "created": 0, "owned_by": "draftwise"}],
        }

    @app.get("/metrics")
    async def metrics(request: Request):
        served.authorize(request)
        return Response(served.metrics.text(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await served.submit(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await served.submit(request, chat=True)

    return app
