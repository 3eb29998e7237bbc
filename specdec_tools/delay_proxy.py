"""A TCP proxy that delays every byte it forwards: added network latency without netem.

`python -m specdec_tools.delay_proxy --listen HOST:PORT --backend HOST:PORT --rtt-ms R
[--jitter-ms J]` accepts connections on --listen, opens one to --backend for each, and
forwards bytes both ways. Every chunk read from one side is written to the other R/2 ms
after it arrived (plus, with --jitter-ms, up to J/2 ms more at random), so a request and
its answer pay R ms between them: the round trip of two hosts R ms apart. The proxy is
byte-level, so HTTP/2 (gRPC) and TLS pass through untouched (the TLS handshake is between
the client and the backend; the certificate must name the address the client dials).

Order: a chunk is never written before the one read before it on the same connection and
direction (its release time is at least the previous chunk's), so jitter stretches gaps
but never reorders bytes, as TCP would not either. A half-close (EOF) travels the same
way, after the data before it. What is not delayed: the TCP handshake itself (the proxy
accepts at once and connects to the backend when the client connects), so the first
request on a new connection pays R, not 1.5 R as over a real link.

specdec_tools.netns.network starts one per model service when the kernel has no netem qdisc.
In-process
use (tests): `with ProxyThread(listen, backend, rtt_ms) as proxy: proxy.address`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import sys
import threading
from dataclasses import dataclass, field

log = logging.getLogger("specdec_tools.delay_proxy")

CHUNK = 64 * 1024
MAX_QUEUED = 4096  # chunks in flight per direction (64 MiB); past it reading waits


def split_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[v6]:PORT') -> (host, port), ValueError with the reason."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass
class Delay:
    """One-way delay of each chunk: `one_way_s` plus uniform(0, `jitter_s`)."""

    one_way_s: float = 0.0
    jitter_s: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    @classmethod
    def from_rtt_ms(cls, rtt_ms: float, jitter_ms: float = 0.0, seed: int | None = None):
        if rtt_ms < 0 or jitter_ms < 0:
            raise ValueError(f"RTT and jitter must be >= 0 ms, got {rtt_ms} and {jitter_ms}")
        return cls(rtt_ms / 2000, jitter_ms / 2000, random.Random(seed))

    def sample(self) -> float:
        return self.one_way_s + (self.rng.uniform(0, self.jitter_s) if self.jitter_s else 0.0)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: Delay,
                what: str, abort) -> None:
    """Copy reader -> writer, each chunk released `delay` after it was read, in order.
    On a connection error either way, `abort()` drops both connections."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(MAX_QUEUED)

    async def release() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:  # EOF: half-close the other side, after all data before it
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    def released(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.debug("%s: %s", what, task.exception())
            abort()

    sender = asyncio.create_task(release())
    sender.add_done_callback(released)
    last = 0.0
    try:
        while True:
            data = await reader.read(CHUNK)
            last = max(loop.time() + delay.sample(), last)  # never before the previous one
            await queue.put((last, data or None))
            if not data:
                break
        await asyncio.wait([sender])
    except (ConnectionError, OSError) as exc:
        log.debug("%s: %s", what, exc)
        abort()
    finally:
        if not sender.done():
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)


class DelayProxy:
    """Forward connections on `listen` to `backend`, delayed by `delay` each way."""

    def __init__(self, listen: str, backend: str, delay: Delay):
        self.listen_host, self.listen_port = split_address(listen)
        self.backend_host, self.backend_port = split_address(backend)
        self.backend = backend
        self.delay = delay
        self.server: asyncio.base_events.Server | None = None
        self.connections = 0
        self._handlers: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> DelayProxy:
        self.server = await asyncio.start_server(self._serve, self.listen_host,
                                                 self.listen_port)
        return self

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter):
        self.connections += 1
        task = asyncio.current_task()
        self._handlers.add(task)
        try:
            await self._forward(c_reader, c_writer)
        finally:
            self._handlers.discard(task)

    async def _forward(self, c_reader: asyncio.StreamReader,
                       c_writer: asyncio.StreamWriter) -> None:
        peer = c_writer.get_extra_info("peername")
        try:
            b_reader, b_writer = await asyncio.open_connection(self.backend_host,
                                                               self.backend_port)
        except OSError as exc:
            log.warning("connection from %s: cannot reach the backend %s (%s); closing it",
                        peer, self.backend, exc)
            c_writer.close()
            return
        def abort() -> None:
            for w in (b_writer, c_writer):
                w.transport.abort()

        try:
            await asyncio.gather(
                _pump(c_reader, b_writer, self.delay, f"{peer} -> backend", abort),
                _pump(b_reader, c_writer, self.delay, f"backend -> {peer}", abort))
        finally:
            for w in (b_writer, c_writer):
                w.close()
            for w in (b_writer, c_writer):
                try:
                    await w.wait_closed()
                except (ConnectionError, OSError):
                    pass

    async def close(self) -> None:
        """Stop listening and drop the connections still open."""
        if self.server is not None:
            self.server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()


class ProxyThread:
    """A DelayProxy on its own event loop in a daemon thread (context manager)."""

    def __init__(self, listen: str, backend: str, rtt_ms: float, jitter_ms: float = 0.0,
                 seed: int | None = None):
        self.proxy = DelayProxy(listen, backend, Delay.from_rtt_ms(rtt_ms, jitter_ms, seed))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="delay-proxy")

    @property
    def address(self) -> str:
        return self.proxy.address

    def __enter__(self) -> ProxyThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def _main(args: argparse.Namespace) -> int:
    delay = Delay.from_rtt_ms(args.rtt_ms, args.jitter_ms, args.seed)
    proxy = DelayProxy(args.listen, args.backend, delay)
    try:
        await proxy.start()
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.listen, exc)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The line specdec.launcher waits for.
    log.info("delay proxy service ready: backend=%s rtt=%gms jitter=%gms address=%s",
             args.backend, args.rtt_ms, args.jitter_ms, proxy.address)
    await stop.wait()
    log.info("delay proxy stopping after %d connection(s)", proxy.connections)
    await proxy.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specdec_tools.delay_proxy",
        description="Forward TCP connections from --listen to --backend, delaying every "
                    "chunk by half the RTT in each direction (byte order kept).")
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="where to accept connections (port 0 = any free one)")
    p.add_argument("--backend", required=True, metavar="HOST:PORT",
                   help="where to forward them")
    p.add_argument("--rtt-ms", type=float, default=0.0,
                   help="round-trip time to add, half each way (default: %(default)s)")
    p.add_argument("--jitter-ms", type=float, default=0.0,
                   help="plus up to this much random extra round-trip time, never "
                        "reordering bytes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="seed of the jitter")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        split_address(args.listen), split_address(args.backend)
        Delay.from_rtt_ms(args.rtt_ms, args.jitter_ms)
    except ValueError as exc:
        p.error(str(exc))
    return asyncio.run(_main(args))


if __name__ == "__main__":
    sys.exit(main())
