"""The coordinator's OpenAI frontend (coordinator.api.http_api, what the Serve deployment's
routes call) on a real uvicorn server on loopback, over an in-process GenerationService:
for tests that need the HTTP API without Ray Serve."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager


@contextmanager
def serve_frontend(service, timeout_s: float = 60.0) -> Iterator[str]:
    """Start the frontend's routes on a free port; yields the base URL."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    from coordinator.api.http_api import OpenAIFrontend, route_error

    frontend = OpenAIFrontend(service, ThreadPoolExecutor(12), timeout_s)

    async def chat(request):
        return await frontend.chat(request)

    async def completions(request):
        return await frontend.completions(request)

    async def models(request):
        return frontend.models(request)

    async def health(request):
        return frontend.health()

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models), Route("/health", health)],
                    exception_handlers={HTTPException: route_error})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
