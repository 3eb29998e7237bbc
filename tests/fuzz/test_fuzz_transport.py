"""Hostile transports against the draft and target gRPC ports and the HTTP port: garbage
bytes (random, after a valid HTTP/2 preface, HTTP/1.1 and TLS on a plaintext gRPC port),
slow senders (requests trickled a byte at a time), and clients that never read (an
HTTP/2 flow-control window of zero, an HTTP stream whose socket is never read). While
they sit there, other clients get exactly their recorded answers; afterwards every
service still answers normally and no session is left."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdec import digest
from specdec.v1 import common_pb2, draft_pb2, target_pb2
from tests.fuzz._fuzz_h2 import PREFACE, RawH2, frame, grpc_call_frames
from tests.fuzz._fuzz_stack import GREEDY, PROMPT, RPC_TIMEOUT_S, examples, sid

PROPOSE = "/specdec.v1.DraftService/Propose"
VERIFY = "/specdec.v1.TargetService/Verify"


@pytest.fixture()
def fuzz_transport(stack):
    yield stack
    stack.release_all()
    stack.assert_healthy()


def _address(stack, port: str) -> tuple[str, int]:
    addr = {"draft": stack.draft_addr, "target": stack.target_addr,
            "http": stack.http_url.removeprefix("http://")}[port]
    host, p = addr.rsplit(":", 1)
    return host, int(p)


def blast(address: tuple[str, int], payload: bytes, read_s: float = 2.0) -> float:
    """Send `payload`, half-close, read until the server closes (or `read_s` passes);
    returns how long the server took to close."""
    t0 = time.monotonic()
    with socket.create_connection(address, timeout=read_s) as s:
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except OSError:  # a reset, or the read timed out: the server dropped it either way
            pass
    return time.monotonic() - t0


GARBAGE = st.one_of(
    st.binary(min_size=1, max_size=2048),
    st.binary(max_size=512).map(lambda b: PREFACE + b),  # HTTP/2, then garbage frames
    st.binary(max_size=64).map(lambda b: PREFACE + frame(4, 0, 0) + frame(1, 4, 1, b)),
    st.binary(max_size=256).map(lambda b: b"POST /v1/completions HTTP/1.1\r\n" + b),
    st.sampled_from([
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n{",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\r\n" * 1000,
    ]),
)


@examples(60)
@given(port=st.sampled_from(["draft", "target", "http"]), payload=GARBAGE)
def test_garbage_bytes_on_every_port(fuzz_transport, port, payload):
    took = blast(_address(fuzz_transport, port), payload)
    assert took < 2.5


@pytest.mark.parametrize("port", ["draft", "target", "http"])
def test_a_mebibyte_of_garbage_on_every_port(fuzz_transport, port):
    blast(_address(fuzz_transport, port), bytes(range(256)) * 4096)
    blast(_address(fuzz_transport, port), PREFACE + bytes(range(256)) * 4096)


def test_raw_h2_client_gets_the_recorded_answer(fuzz_transport):
    """The raw client itself (the tests below rely on it) reads a real Propose reply."""
    stack = fuzz_transport
    conn = RawH2(stack.draft_addr)
    try:
        conn.handshake()
        req = draft_pb2.ProposeRequest(session_id=sid("raw"), keep_digest=digest.EMPTY,
                                       new_tokens=PROMPT, num_tokens=4, sampling=GREEDY)
        conn.send(grpc_call_frames(1, conn.authority, PROPOSE, req.SerializeToString()))
        body, _ = conn.response(1)
        assert list(draft_pb2.ProposeResponse.FromString(body).tokens) == \
            stack.ref.propose_greedy
    finally:
        conn.close()


def _trickled_call(stack, service: str, out: dict, key: str, trickle_s: float) -> None:
    address = stack.draft_addr if service == "draft" else stack.target_addr
    conn = RawH2(address)
    s = sid("slow")
    try:
        conn.handshake()
        if service == "draft":
            req = draft_pb2.ProposeRequest(session_id=s, keep_digest=digest.EMPTY,
                                           new_tokens=PROMPT, num_tokens=4, sampling=GREEDY)
            method = PROPOSE
        else:
            req = target_pb2.VerifyRequest(session_id=s, keep_digest=digest.EMPTY,
                                           new_tokens=PROMPT + stack.ref.propose_greedy,
                                           num_draft=4, sampling=GREEDY, round_seed=9)
            method = VERIFY
        conn.send(grpc_call_frames(1, conn.authority, method, req.SerializeToString()),
                  trickle_s=trickle_s)
        out[key] = conn.response(1)[0]
    finally:
        conn.close()
        out.setdefault(f"{key}-session", s)


@pytest.mark.slow
def test_slow_senders_do_not_hold_up_others(fuzz_transport):
    """Four gRPC requests trickled a byte every 8 ms (about 1.5 s each) on each service:
    normal requests meanwhile get their exact answers at once, and each trickled request,
    once whole, gets the same answer as a fast one."""
    stack = fuzz_transport
    out: dict = {}
    threads = [threading.Thread(target=_trickled_call, args=(stack, svc, out, f"{svc}{i}",
                                                             0.008))
               for svc in ("draft", "target") for i in range(4)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    assert list(stack.propose().tokens) == stack.ref.propose_greedy
    verified = stack.verify()
    assert list(verified.recovered_tokens) == list(stack.ref.verify.recovered_tokens)
    assert time.monotonic() - t0 < 1.0  # not queued behind the slow ones
    assert any(t.is_alive() for t in threads)
    for t in threads:
        t.join(30)
    for i in range(4):
        assert list(draft_pb2.ProposeResponse.FromString(out[f"draft{i}"]).tokens) == \
            stack.ref.propose_greedy
        v = target_pb2.VerifyResponse.FromString(out[f"target{i}"])
        assert (list(v.recovered_tokens), v.bonus_token) == \
            (list(stack.ref.verify.recovered_tokens), stack.ref.verify.bonus_token)
    for key, value in out.items():
        if key.endswith("-session"):
            stub = stack.draft if key.startswith("draft") else stack.target
            stub.Release(common_pb2.ReleaseRequest(session_id=value), timeout=RPC_TIMEOUT_S)


@pytest.mark.slow
def test_grpc_client_that_never_reads(fuzz_transport):
    """A client with an HTTP/2 window of zero sends three Proposes and three Verifies on
    one connection each and never reads (their replies cannot be sent): other clients
    are served exactly and at once, and the held sessions are released normally."""
    stack = fuzz_transport
    conns, held = [], []
    try:
        for address, method in ((stack.draft_addr, PROPOSE), (stack.target_addr, VERIFY)):
            conn = RawH2(address, window=0)
            conn.handshake()
            conns.append(conn)
            for i in range(3):
                s = sid("stuck")
                held.append((method, s))
                if method == PROPOSE:
                    req = draft_pb2.ProposeRequest(session_id=s, keep_digest=digest.EMPTY,
                                                   new_tokens=PROMPT, num_tokens=4)
                else:
                    req = target_pb2.VerifyRequest(session_id=s, keep_digest=digest.EMPTY,
                                                   new_tokens=PROMPT)
                conn.send(grpc_call_frames(2 * i + 1, conn.authority, method,
                                           req.SerializeToString()))
        time.sleep(0.5)  # the stuck calls have run; their replies wait for the window
        for _ in range(3):
            t0 = time.monotonic()
            assert list(stack.propose().tokens) == stack.ref.propose_greedy
            assert list(stack.verify().recovered_tokens) == \
                list(stack.ref.verify.recovered_tokens)
            assert time.monotonic() - t0 < 1.0
        resp = stack.generate()
        assert list(resp.token_ids) == stack.ref.generate_ids
    finally:
        for conn in conns:
            conn.close()
    for method, s in held:
        stub = stack.draft if method == PROPOSE else stack.target
        stub.Release(common_pb2.ReleaseRequest(session_id=s), timeout=RPC_TIMEOUT_S)


def _http_request(stack, body: dict) -> bytes:
    data = json.dumps(body).encode()
    host = stack.http_url.removeprefix("http://")
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            "Connection: close\r\n\r\n").encode() + data


def _http_response(sock: socket.socket) -> tuple[int, bytes]:
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.slow
def test_http_client_that_never_reads(fuzz_transport):
    """Two clients start long SSE streams with a 4 KiB receive buffer and never read: a
    third client's completion and a GenerationService call meanwhile give their exact
    answers, and once the readers hang up their sessions are released."""
    stack = fuzz_transport
    body = {"model": stack.service.card.id, "prompt": PROMPT, "max_tokens": 600,
            "temperature": 0, "num_draft_tokens": 4, "stream": True}
    stuck = []
    try:
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(_address(stack, "http"))
            s.sendall(_http_request(stack, body))
            stuck.append(s)
        deadline = time.monotonic() + 10
        while stack.sessions() == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stack.sessions() != (0, 0)  # the stuck streams are generating
        r = stack.http_completion()
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == stack.ref.http_text
        assert list(stack.generate().token_ids) == stack.ref.generate_ids
    finally:
        for s in stuck:
            s.close()
    stack.assert_no_sessions(within_s=30)


@pytest.mark.slow
def test_http_slow_senders(fuzz_transport):
    """Requests trickled two bytes every 5 ms, and connections that never finish their
    headers: normal clients meanwhile get their exact answers, and each trickled request
    gets the recorded answer once it is whole."""
    stack = fuzz_transport
    body = {"model": stack.service.card.id, "prompt": PROMPT, "max_tokens": 12,
            "temperature": 0, "num_draft_tokens": 4}
    request = _http_request(stack, body)
    results: list = []

    def trickle():
        with socket.create_connection(_address(stack, "http"), timeout=30) as s:
            for i in range(0, len(request), 2):
                s.sendall(request[i:i + 2])
                time.sleep(0.005)
            results.append(_http_response(s))

    loris = []
    try:
        for _ in range(8):  # headers begun and never finished
            s = socket.create_connection(_address(stack, "http"), timeout=30)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            loris.append(s)
        threads = [threading.Thread(target=trickle) for _ in range(3)]
        for t in threads:
            t.start()
        r = stack.http_completion()
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == stack.ref.http_text
        assert any(t.is_alive() for t in threads)
        for t in threads:
            t.join(30)
    finally:
        for s in loris:
            s.close()
    assert len(results) == 3
    for status, raw in results:
        assert status == 200, raw[:300]
        assert json.loads(raw)["choices"][0]["text"] == stack.ref.http_text


# -- HTTP/2 requests with hostile gRPC framing and headers --------------------------------

VALID_PROPOSE = draft_pb2.ProposeRequest(session_id="h2-fuzz", keep_digest=digest.EMPTY,
                                         new_tokens=PROMPT, num_tokens=2).SerializeToString()


@examples(40)
@given(port=st.sampled_from(["draft", "target"]),
       path=st.sampled_from([PROPOSE, VERIFY, "/specdec.v1.DraftService/Info",
                             "/specdec.v1.DraftService/Nope", "/", "", "/x" * 50,
                             "/grpc.health.v1.Health/Check"]),
       content_type=st.sampled_from(["application/grpc", "application/grpc+proto",
                                     "application/grpc+json", "text/html", None]),
       timeout=st.sampled_from([None, "1S", "0n", "-1S", "99999999S", "abc", "1H",
                                "100000000n", "1x", ""]),
       encoding=st.sampled_from([None, "gzip", "identity", "snappy", "", "deflate"]),
       te=st.booleans(),
       flag=st.sampled_from([0, 0, 1, 2, 255]),
       length_delta=st.sampled_from([0, 0, -1, 1, 1000, 2**31]),
       payload=st.one_of(st.just(VALID_PROPOSE), st.binary(max_size=64)),
       end_stream=st.booleans())
def test_hostile_grpc_framing_and_headers(fuzz_transport, port, path, content_type,
                                          timeout, encoding, te, flag, length_delta,
                                          payload, end_stream):
    """Wrong paths, content types, grpc-timeout and grpc-encoding values, compressed
    flags, length prefixes that lie, calls that never end their stream: the server
    answers or drops the call within seconds and keeps serving everyone else."""
    import struct

    from tests.fuzz._fuzz_h2 import DATA, END_HEADERS, END_STREAM, HEADERS, header_block

    address = fuzz_transport.draft_addr if port == "draft" else fuzz_transport.target_addr
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
               (":authority", address)]
    for name, value in (("content-type", content_type), ("grpc-timeout", timeout),
                        ("grpc-encoding", encoding), ("te", "trailers" if te else None)):
        if value is not None:
            headers.append((name, value))
    declared = max(0, min(len(payload) + length_delta, 2**32 - 1))
    message = bytes([flag]) + struct.pack(">I", declared) + payload
    conn = RawH2(address, timeout=5)
    try:
        conn.handshake()
        conn.send(frame(HEADERS, END_HEADERS, 1, header_block(headers)) +
                  frame(DATA, END_STREAM if end_stream else 0, 1, message))
        conn.sock.settimeout(0.5)  # a call left incomplete is not answered: stop waiting
        t0 = time.monotonic()
        try:
            conn.response(1)
        except (OSError, ConnectionError):
            pass  # reset, GOAWAY, closed, or (a call left open) the read timed out
        assert time.monotonic() - t0 < 3
    finally:
        conn.close()
        fuzz_transport.release_all()
