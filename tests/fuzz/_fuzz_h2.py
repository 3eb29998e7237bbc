"""A minimal HTTP/2 client on a raw socket, for gRPC transport tests: it can do what a
real client library never does (trickle bytes, shrink its flow-control window to zero,
never read), which is the point. HPACK: only literal header fields without indexing or
Huffman coding are sent; received header blocks are not decoded (the gRPC messages in
DATA frames are, which is what the tests compare)."""

from __future__ import annotations

import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream & 0x7FFFFFFF) + payload


def _hpack_string(value: bytes) -> bytes:
    assert len(value) < 127
    return bytes([len(value)]) + value


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """Literal header fields without indexing, new names, no Huffman coding."""
    return b"".join(b"\x00" + _hpack_string(k.encode()) + _hpack_string(v.encode())
                    for k, v in headers)


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


def grpc_call_frames(stream: int, authority: str, method: str, payload: bytes) -> bytes:
    """HEADERS and DATA (END_STREAM) of one unary gRPC call."""
    headers = header_block([(":method", "POST"), (":scheme", "http"), (":path", method),
                            (":authority", authority), ("content-type", "application/grpc"),
                            ("te", "trailers")])
    return frame(HEADERS, END_HEADERS, stream, headers) + \
        frame(DATA, END_STREAM, stream, grpc_message(payload))


class RawH2:
    """One HTTP/2 connection to `address` ("host:port")."""

    def __init__(self, address: str, window: int | None = None, timeout: float = 10.0):
        host, port = address.rsplit(":", 1)
        self.authority = address
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buffer = b""
        settings = b"" if window is None else \
            struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, window)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, settings))

    def handshake(self) -> None:
        """Read the server's SETTINGS and acknowledge them."""
        while True:
            kind, flags, _, _ = self.read_frame()
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
                return

    def send(self, data: bytes, trickle_s: float = 0.0, step: int = 1) -> None:
        """All of `data`, or `step` bytes at a time `trickle_s` apart (a slow sender)."""
        if not trickle_s:
            self.sock.sendall(data)
            return
        for i in range(0, len(data), step):
            self.sock.sendall(data[i:i + step])
            time.sleep(trickle_s)

    def read_frame(self) -> tuple[int, int, int, bytes]:
        while len(self.buffer) < 9 or \
                len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buffer += chunk
        length = int.from_bytes(self.buffer[:3], "big")
        kind, flags = self.buffer[3], self.buffer[4]
        stream = struct.unpack(">I", self.buffer[5:9])[0] & 0x7FFFFFFF
        payload, self.buffer = self.buffer[9:9 + length], self.buffer[9 + length:]
        return kind, flags, stream, payload

    def response(self, stream: int) -> tuple[bytes, bool]:
        """(the gRPC message of `stream`'s reply, whether the stream ended), answering
        SETTINGS and PING on the way. A reply with no message (an error status) gives b""."""
        data = b""
        while True:
            kind, flags, sid, payload = self.read_frame()
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise ConnectionError(f"GOAWAY from the server: {payload[8:]!r}")
            elif sid == stream and kind == RST_STREAM:
                raise ConnectionError(f"RST_STREAM {payload!r}")
            elif sid == stream and kind == DATA:
                data += payload
            if sid == stream and kind in (DATA, HEADERS) and flags & END_STREAM:
                return (data[5:5 + struct.unpack(">I", data[1:5])[0]] if data else b""), True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
