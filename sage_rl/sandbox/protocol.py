"""Framing between the parent and a worker: a 4-byte big-endian length, then one JSON object.

JSON, never pickle: the parent reads what agent code could have written, and unpickling
attacker-controlled bytes would run code in the trainer. Every frame the parent reads is checked
against ``max_bytes`` before it is buffered, and against the expected shape after it is parsed.

Messages (``op`` names the kind):
    parent -> worker   {"op": "exec", "code", "origin", "timeout", "cpu"}
                       {"op": "ret", "ok": true, "value", "changed"} | {"op": "ret", "ok": false, "error"}
                       (``changed``: 0, n for the episode's n-th change of the world, or null)
    worker -> parent   {"op": "hello", "isolation": {...}}
                       {"op": "call", "app", "api", "kwargs"}
                       {"op": "done", "ok", "observation", "timed_out", "calls", "defined"}
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The other side sent something that is not a well-formed message."""


# One encoder, built once: json.dumps with non-default arguments builds a new encoder per call.
_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def encode(msg: dict[str, Any]) -> bytes:
    """One frame. ``ensure_ascii`` keeps lone surrogates from agent strings encodable."""
    body = _ENCODER.encode(msg).encode("ascii")
    return HEADER.pack(len(body)) + body


def decode(body: bytes) -> dict[str, Any]:
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"frame is not valid JSON ({e})") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
        raise ProtocolError("frame is not a JSON object with a string 'op'")
    return msg


class BlockingChannel:
    """Frames over a blocking stream socket (the worker side)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._chunk = bytearray(1 << 16)
        self._view = memoryview(self._chunk)

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(encode(msg))

    def recv(self) -> dict[str, Any]:
        """The next frame; EOFError when the parent closed the socket."""
        buf = self._buf
        while True:
            if len(buf) >= HEADER.size:
                end = HEADER.size + HEADER.unpack_from(buf)[0]
                if len(buf) >= end:
                    body = bytes(buf[HEADER.size : end])
                    del buf[:end]
                    return decode(body)
            got = self.sock.recv_into(self._chunk)
            if not got:
                raise EOFError("parent closed the channel")
            buf += self._view[:got]
