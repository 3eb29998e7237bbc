"""The OpenAI-compatible HTTP API: request bodies in, JSON or SSE out.

The routes live on the Serve deployment (coordinator.deploy.app, FastAPI through
`serve.ingress`); each is one line calling this class. A request is translated by
coordinator.api.openai_api into the same `GenerateRequest` the gRPC API takes and run by the
same `GenerationService.stream`, so validation, limits, stop strings and outputs are
those of gRPC. The first round runs before the response starts: an invalid request, the
concurrency cap or an unavailable target is answered with its status (400, 429, 503),
never as a 200 stream that then fails. Later failures arrive in the stream as an
`{"error": ...}` event, which the `openai` package raises. A client that disconnects
mid-stream cancels the response's generator, whose `finally` closes the generation and
releases its draft and target sessions, as gRPC cancellation does.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack, nullcontext
from pathlib import Path

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse

from coordinator.api.auth import APIKeys
from coordinator.api.bridge import close_after, next_in_thread
from coordinator.api.openai_api import chat_request, completion_request, expand
from coordinator.api.openai_errors import APIError, bad, from_exception
from coordinator.api.openai_responses import (
    CHAT,
    COMPLETION,
    DONE,
    Choice,
    Responses,
    merged,
    sse,
)
from coordinator.api.service import GenerationService, add_chunk
from specdec.v1 import generate_pb2

log = logging.getLogger("coordinator.http")
DEMO_PAGE = Path(__file__).with_name("demo.html")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# The largest request body read (the model services' gRPC message limit): a prompt of
# the largest context is far smaller, and a bigger body is refused (413) before it is
# held in memory whole.
MAX_BODY_BYTES = 8 * 1024 * 1024


async def _read_body(request: Request) -> bytes:
    """The request body, or 413 in OpenAI's shape once it passes MAX_BODY_BYTES (by its
    Content-Length, or while it arrives, for a chunked one)."""
    too_big = APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes; "
                            "send a shorter prompt", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise too_big
        parts.append(part)
    return b"".join(parts)


ROUTE_ERRORS = {404: "not_found", 405: "method_not_allowed"}


async def route_error(request, exc) -> JSONResponse:
    """Starlette's own answers (an unknown path, a wrong method) in OpenAI's error shape,
    as an exception handler of the app."""
    status = getattr(exc, "status_code", 500)
    message = {404: f"no route {request.url.path}; the API is at /v1/chat/completions, "
                    "/v1/completions, /v1/responses and /v1/models",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(
        status, str(getattr(exc, "detail", "")) or "request failed")
    err = APIError(status, message, "invalid_request_error", None, ROUTE_ERRORS.get(status))
    return JSONResponse(err.body(), status_code=status, headers=getattr(exc, "headers", None))


def error_response(exc: BaseException) -> JSONResponse:
    """OpenAI's error body with its status; a failure that is not a known error (a bug)
    is logged with its traceback and answered 500 without details."""
    err = from_exception(exc)
    if err.status == 500:
        log.error("HTTP request failed", exc_info=exc)
    return JSONResponse(err.body(), status_code=err.status)


class OpenAIFrontend:
    def __init__(self, service: GenerationService, executor, request_timeout_s: float,
                 auth: APIKeys | None = None):
        self.service, self.executor = service, executor
        self.request_timeout_s = request_timeout_s
        self.auth = auth  # None: no API keys (coordinator.api.auth)

    def _admit(self, request: Request):
        """The caller's API-key slot (UNAUTHENTICATED / 401 without a valid key)."""
        if self.auth is None:
            return nullcontext()
        return self.auth.admit(request.headers.get("authorization"), "header")

    # -- GET ------------------------------------------------------------------------------

    def models(self, request: Request | None = None) -> Response:
        if self.auth is not None:
            try:
                self.auth.identify(request.headers.get("authorization") if request else None,
                                   "header")
            except Exception as exc:  # noqa: BLE001 - Unauthenticated
                return error_response(exc)
        card = self.service.card
        return JSONResponse({"object": "list", "data": [{
            "id": card.id, "object": "model", "created": 0, "owned_by": "specdec",
            "specdec": {"target": card.target, "draft": card.draft,
                        "max_context": card.max_context, "default_num_draft_tokens":
                        card.default_k},
        }]})

    def health(self) -> JSONResponse:
        """200 while a target replica can take generations, else 503 (drafts optional)."""
        now = time.monotonic()
        loop = self.service.loop
        targets = [r for r in loop.target.replicas() if r.down_until <= now]
        drafts = [r for r in loop.draft.replicas() if r.down_until <= now] \
            if loop.draft is not None else []
        body = {"status": "ok" if targets else "unavailable",
                "target_replicas": len(targets), "draft_replicas": len(drafts)}
        return JSONResponse(body, status_code=200 if targets else 503)

    @staticmethod
    def demo() -> HTMLResponse:
        return HTMLResponse(DEMO_PAGE.read_text(encoding="utf-8"))

    # -- POST -----------------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, COMPLETION)

    async def _generate(self, request: Request, kind: str) -> Response:
        return await self.holding(
            request, lambda held, tenant: self._respond(request, kind, held, tenant))

    async def holding(self, request: Request, respond) -> Response:
        """`await respond(held, tenant)` holding the caller's API-key slot in `held`
        until the response is over (a stream closes it when it ends); any failure is
        answered in OpenAI's shape."""
        held = ExitStack()  # the API key's slot: released when the response is over
        try:
            tenant = held.enter_context(self._admit(request)) or ""  # the key's name
            response = await respond(held, tenant)
        except BaseException as exc:
            held.close()
            if isinstance(exc, Exception):
                return error_response(exc)
            raise
        if not isinstance(response, StreamingResponse):
            held.close()  # a stream closes it when it ends
        return response

    async def _respond(self, request: Request, kind: str, held: ExitStack,
                       tenant: str = "") -> Response:
        try:
            body = json.loads(await _read_body(request) or b"null")
        except APIError as exc:
            return error_response(exc)
        except (ValueError, UnicodeDecodeError) as exc:
            return error_response(bad(f"the request body is not valid JSON ({exc})"))
        except RecursionError:  # json.loads on arrays or objects nested ~1000 deep
            return error_response(bad("the request body is not valid JSON for this API: "
                                      "it nests arrays or objects too deeply"))
        card = self.service.card
        try:
            req, opts = (chat_request if kind == CHAT else completion_request)(body, card.id)
            subs = expand(req, opts)
        except Exception as exc:  # noqa: BLE001 - APIError, or a bug answered as a 500
            return error_response(exc)
        timeout = min(opts.timeout_s or math.inf, self.request_timeout_s)
        deadline = time.monotonic() + timeout
        for sub in subs:
            if not sub.max_new_tokens and not sub.prompt_logprobs:
                # no limit given: up to the cap (and the context)
                sub.max_new_tokens = self.service.limits.max_new_tokens_cap
        streams = [Stream(self.service.stream(sub, deadline=deadline, tenant=tenant))
                   for sub in subs]
        # Each prompt's first choice first: its prefill leaves the prompt's KV blocks in
        # both services' prefix caches (docs/design.md, section 23), which its other
        # choices then share instead of prefilling it again beside it in one pass.
        firsts: list = [None] * len(streams)
        for wave in ([i for i in range(len(streams)) if i % opts.n == 0],
                     [i for i in range(len(streams)) if i % opts.n]):
            got = await asyncio.gather(*(streams[i].next(self.executor) for i in wave),
                                       return_exceptions=True)
            for i, first in zip(wave, got, strict=True):
                firsts[i] = first
            if any(isinstance(f, BaseException) for f in got):
                break
        failed = next((f for f in firsts if isinstance(f, BaseException)), None)
        if failed is not None:
            await asyncio.gather(*(s.close(self.executor) for s in streams))
            if not isinstance(failed, Exception):
                raise failed
            return error_response(failed)
        tokenizer = self.service.tokenizer
        responses = Responses(kind, card.id, opts.logprobs,
                              (lambda t: tokenizer.decode([t])) if tokenizer else None)
        choices = [Choice(i, self._echo(sub) if opts.echo else None, tools=opts.tools)
                   for i, sub in enumerate(subs)]
        if opts.stream:
            events = self._events(streams, firsts, choices, opts.n, responses,
                                  opts.include_usage, held)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers=SSE_HEADERS)
        try:
            done = await asyncio.gather(*(s.rest(first, self.executor)
                                          for s, first in zip(streams, firsts, strict=True)))
        except Exception as exc:  # noqa: BLE001
            return error_response(exc)
        finally:
            await asyncio.gather(*(s.close(self.executor) for s in streams))
        stats = merged([r.stats for r in done], opts.n)
        return JSONResponse(responses.unary(done[0], list(zip(choices, done, strict=True)),
                                            stats))

    def _echo(self, sub: generate_pb2.GenerateRequest) -> str:
        """A completions prompt as text (`echo`): as sent, or its ids decoded."""
        if sub.prompt or self.service.tokenizer is None:
            return sub.prompt
        return self.service.tokenizer.decode(list(sub.prompt_token_ids))

    async def _events(self, streams: list[Stream], firsts: list, choices: list[Choice],
                      n: int, responses: Responses, include_usage: bool,
                      held: ExitStack) -> AsyncIterator[str]:
        """Every choice's chunks as they come (each with its index), then the usage of
        all of them, then [DONE]."""
        arrived: asyncio.Queue = asyncio.Queue()

        async def pump(i: int) -> None:
            chunk = firsts[i]
            try:
                while chunk is not None:
                    await arrived.put((i, chunk))
                    chunk = await streams[i].next(self.executor)
            except Exception as exc:  # noqa: BLE001 - reported in the stream
                await arrived.put((i, exc))
                return
            await arrived.put((i, None))

        pumps = [asyncio.create_task(pump(i)) for i in range(len(streams))]
        try:
            first = [True] * len(streams)
            stats: list = [None] * len(streams)
            live = len(streams)
            while live:
                i, chunk = await arrived.get()
                if isinstance(chunk, Exception):
                    raise chunk
                if chunk is None:
                    live -= 1
                    continue
                yield sse(responses.chunk(chunk, first[i], choices[i]))
                first[i] = False
                if chunk.finish_reason:
                    stats[i] = chunk.stats
            if include_usage:
                yield sse(responses.usage_chunk(merged(stats, n)))
            yield DONE
        except Exception as exc:  # noqa: BLE001 - reported in the stream, as OpenAI does
            err = from_exception(exc)
            if err.status == 500:
                log.error("HTTP stream failed", exc_info=exc)
            yield sse(err.body())
            yield DONE
        finally:
            # Also on a client disconnect (the generator is cancelled or closed). The key's
            # slot first: it needs no await, which a generator closed by the garbage
            # collector could not do.
            held.close()
            for task in pumps:
                task.cancel()
            await asyncio.gather(*(s.close(self.executor) for s in streams))


class Stream:
    """One generation's chunks, stepped in the executor's threads (coordinator.api.bridge)."""

    def __init__(self, chunks):
        self.chunks, self.pending = chunks, []

    async def next(self, executor):
        return await next_in_thread(self.chunks, self.pending, executor)

    async def rest(self, first, executor) -> generate_pb2.GenerateResponse:
        """The whole response, from its first chunk on."""
        resp = generate_pb2.GenerateResponse()
        chunk = first
        while chunk is not None:
            add_chunk(resp, chunk)
            chunk = await self.next(executor)
        return resp

    async def close(self, executor) -> None:
        await close_after(self.chunks, self.pending, executor)
