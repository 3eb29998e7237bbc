"""specdec_tools.delay_proxy over real loopback sockets: an echo round trip through it pays the
RTT asked for, bytes keep their order under jitter, EOF travels through, and the
`python -m specdec_tools.delay_proxy` process announces itself the way specdec.launcher
waits for."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from specdec import launcher
from specdec_tools.delay_proxy import ProxyThread, split_address


@pytest.fixture()
def echo():
    """An echo server on 127.0.0.1 (one thread per connection); its address."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    t.join(2)
    server.close()


def connect(address: str) -> socket.socket:
    s = socket.create_connection(split_address(address), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = s.recv(n - len(out))
        if not data:
            break
        out += data
    return bytes(out)


def round_trip(s: socket.socket, payload: bytes) -> float:
    t0 = time.perf_counter()
    s.sendall(payload)
    assert recv_exactly(s, len(payload)) == payload
    return time.perf_counter() - t0


def test_an_echo_round_trip_pays_the_rtt(echo):
    with ProxyThread("127.0.0.1:0", echo, rtt_ms=40) as proxy, connect(proxy.address) as s:
        times = [round_trip(s, b"ping %d" % i) for i in range(5)]
    assert min(times) >= 0.040, times
    assert max(times) < 0.040 + 0.25, times  # a loaded box adds some, not a lot


def test_without_delay_it_just_forwards(echo):
    with ProxyThread("127.0.0.1:0", echo, rtt_ms=0) as proxy, connect(proxy.address) as s:
        assert round_trip(s, b"x" * 100_000) < 1.0


def test_jitter_never_reorders_bytes(echo):
    """Many small writes with jitter far above the gap between them: the echo comes back
    byte for byte in order, and each chunk still paid at least the base RTT."""
    rng = os.urandom(300_000)
    with ProxyThread("127.0.0.1:0", echo, rtt_ms=10, jitter_ms=30, seed=1) as proxy, \
            connect(proxy.address) as s:
        got = bytearray()

        def read() -> None:
            while len(got) < len(rng):
                data = s.recv(65536)
                if not data:
                    return
                got.extend(data)

        reader = threading.Thread(target=read)
        t0 = time.perf_counter()
        reader.start()
        for i in range(0, len(rng), 1000):
            s.sendall(rng[i:i + 1000])
        reader.join(10)
        assert bytes(got) == rng
        assert time.perf_counter() - t0 >= 0.010


def test_a_half_close_reaches_the_backend_and_the_answer_still_comes_back(echo):
    with ProxyThread("127.0.0.1:0", echo, rtt_ms=20) as proxy, connect(proxy.address) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        assert recv_exactly(s, 10) == b"last words"
        assert s.recv(10) == b""  # the echo server closed once it saw our EOF


def test_an_unreachable_backend_closes_the_client_connection():
    with socket.socket() as probe:  # a port with nobody on it
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    with ProxyThread("127.0.0.1:0", dead, rtt_ms=0) as proxy, connect(proxy.address) as s:
        assert s.recv(10) == b""


def test_the_proxy_process_announces_its_address_and_forwards(echo):
    proc = launcher.start("specdec_tools.delay_proxy",
                          ["--listen", "127.0.0.1:0", "--backend", echo, "--rtt-ms", "30"],
                          timeout=20, name="delay proxy")
    try:
        with connect(proc.address) as s:
            assert round_trip(s, b"hello") >= 0.030
    finally:
        assert proc.stop() == 0, proc.output
    assert "delay proxy stopping after 1 connection(s)" in proc.output


def test_bad_arguments_are_refused_with_a_reason():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specdec_tools.delay_proxy", "--listen", "nowhere",
                          "--backend", "127.0.0.1:1"], capture_output=True, text=True,
                         cwd=launcher.ROOT, timeout=20)
    assert run.returncode == 2
    assert "'nowhere' is not HOST:PORT" in run.stderr
