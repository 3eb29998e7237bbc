"""The Responses API's routes: create (unary or streamed), retrieve and delete.

A request is planned by coordinator.api.responses_api into a chat body, checked by the
chat API's own translation, and run by the same GenerationService.stream as every other
request; the first round runs before the response starts, so a bad request, the
concurrency cap or no target is answered with its status, never a 200 that then fails.
A stored response (`store`, the default) keeps its conversation, input and output as
chat turns, in the shared store (coordinator.api.response_store), so the next request
names it by `previous_response_id` on any replica, and its prefix is already in the
services' prefix caches.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator
from contextlib import ExitStack

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from coordinator.api import responses_api
from coordinator.api.http_api import (
    SSE_HEADERS,
    OpenAIFrontend,
    Stream,
    _read_body,
    error_response,
)
from coordinator.api.openai_api import chat_request
from coordinator.api.openai_errors import APIError, bad, from_exception
from coordinator.api.response_store import ResponseStore
from coordinator.api.responses_out import ResponseBuilder


def not_found(response_id: str) -> APIError:
    return APIError(404, f"no stored response {response_id!r}: it was never stored "
                         "(store: false), has expired or was evicted, or was deleted",
                    "invalid_request_error", "previous_response_id", "not_found")


def _sse(event: dict) -> str:
    return (f"event: {event['type']}\n"
            f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n")


class ResponsesFrontend:
    def __init__(self, front: OpenAIFrontend, store: ResponseStore):
        self.front, self.store = front, store

    def retrieve(self, response_id: str) -> Response:
        record = self.store.get(response_id)
        if record is None:
            return error_response(_param(not_found(response_id), None))
        return JSONResponse(record["response"])

    def delete(self, response_id: str) -> Response:
        if not self.store.delete(response_id):
            return error_response(_param(not_found(response_id), None))
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def create(self, request: Request) -> Response:
        return await self.front.holding(
            request, lambda held, tenant: self._create(request, held, tenant))

    def _plan(self, body):
        previous = None
        if isinstance(body, dict) and body.get("previous_response_id") is not None:
            rid = body["previous_response_id"]
            if not isinstance(rid, str):
                raise bad("`previous_response_id` must be a string", "previous_response_id")
            record = self.store.get(rid)
            if record is None:
                raise not_found(rid)
            previous = record["conversation"]
        plan = responses_api.plan(body, previous)
        try:
            req, opts = chat_request(plan.chat, self.front.service.card.id)
        except APIError as exc:
            raise responses_api.renamed(exc) from None
        return plan, req, opts

    async def _create(self, request: Request, held: ExitStack, tenant: str) -> Response:
        front, service = self.front, self.front.service
        try:
            body = json.loads(await _read_body(request) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"the request body is not valid JSON: {exc}", None) from None
        plan, req, opts = self._plan(body)
        if not req.max_new_tokens:
            req.max_new_tokens = service.limits.max_new_tokens_cap
        deadline = time.monotonic() + min(opts.timeout_s or math.inf, front.request_timeout_s)
        stream = Stream(service.stream(req, deadline=deadline, tenant=tenant))
        try:
            first = await stream.next(front.executor)
        except Exception:
            await stream.close(front.executor)
            raise
        builder = ResponseBuilder(service.card.id, plan.echo, opts.tools)
        if opts.stream:
            return StreamingResponse(self._events(stream, first, builder, plan, held),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        try:
            resp = await stream.rest(first, front.executor)
        finally:
            await stream.close(front.executor)
        _, final = builder.finish(resp.text, resp.finish_reason, resp.stats)
        return JSONResponse(self._keep(builder, plan, final))

    def _keep(self, builder: ResponseBuilder, plan, final: dict) -> dict:
        if plan.store:
            record = {"response": final,
                      "conversation": plan.history + builder.assistant_turns()}
            if not self.store.put(builder.id, record):
                final["store"] = False
        return final

    async def _events(self, stream: Stream, first, builder: ResponseBuilder, plan,
                      held: ExitStack) -> AsyncIterator[str]:
        executor = self.front.executor
        try:
            for event in builder.start():
                yield _sse(event)
            chunk = first
            while chunk is not None:
                if chunk.finish_reason:
                    events, final = builder.finish(chunk.text, chunk.finish_reason,
                                                   chunk.stats)
                    self._keep(builder, plan, final)
                else:
                    events = builder.feed(chunk.text)
                for event in events:
                    yield _sse(event)
                chunk = await stream.next(executor)
        except Exception as exc:  # noqa: BLE001 - reported in the stream, as OpenAI does
            err = from_exception(exc)
            yield _sse({"type": "error", "code": err.code, "message": err.message,
                        "param": err.param, "sequence_number": builder.seq})
        finally:
            held.close()
            await stream.close(executor)


def _param(exc: APIError, param: str | None) -> APIError:
    exc.param = param
    return exc
