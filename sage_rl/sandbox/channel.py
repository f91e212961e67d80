"""The parent's end of one worker's socket, as an asyncio Protocol.

API calls are answered synchronously inside ``data_received``: no task switch, no future per
message, so a call costs one wake-up of the event loop. Only the messages that end a wait
(``hello`` after start, ``done`` after a cell) resolve a future.

Everything read here is untrusted: a frame longer than ``max_bytes`` is refused before it is
buffered, API calls of one cell may carry at most ``CALL_BYTES_PER_CELL`` x ``max_bytes`` in all
(decoding them is work done in the trainer's event loop, shared by every episode), and any
message that is not expected now is a protocol error that ends the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from sage_rl.sandbox.protocol import HEADER, ProtocolError, decode

#: The bytes of API calls one cell may send, in units of ``max_bytes``; past it the worker is ended.
CALL_BYTES_PER_CELL = 16


class WorkerChannel(asyncio.Protocol):
    """Frames in, API answers out. ``answer(msg) -> frame`` is called for each ``call`` in a cell."""

    def __init__(self, answer: Callable[[dict[str, Any]], bytes], max_bytes: int) -> None:
        self.answer, self.max_bytes = answer, max_bytes
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[dict[str, Any]] | None = None
        self.error: BaseException | None = None
        self.in_cell = False
        self.call_bytes = 0  # bytes of frames received in the current cell

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.waiter = asyncio.get_running_loop().create_future()  # for the worker's hello

    def data_received(self, data: bytes) -> None:
        if self.error is not None:
            return
        self.buf += data
        try:
            while (msg := self._next_frame()) is not None:
                self._handle(msg)
        except ProtocolError as e:
            self._fail(e)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(EOFError("the worker closed its channel"))

    # -- used by Session -------------------------------------------------------------------------

    def pending(self) -> asyncio.Future[dict[str, Any]]:
        """The next ``hello`` or ``done``, to await; it fails with EOFError / ProtocolError when the
        worker breaks (raised now if it already has)."""
        if self.error is not None:
            raise self.error
        assert self.waiter is not None
        return self.waiter

    def start_cell(self, frame: bytes) -> None:
        if self.error is not None:
            raise self.error
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.in_cell, self.call_bytes = True, 0
        self.transport.write(frame)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- internals -------------------------------------------------------------------------------

    def _next_frame(self) -> dict[str, Any] | None:
        if len(self.buf) < HEADER.size:
            return None
        (n,) = HEADER.unpack_from(self.buf)
        if n > self.max_bytes:
            raise ProtocolError(f"the worker sent a {n}-byte message (limit {self.max_bytes})")
        if len(self.buf) < HEADER.size + n:
            return None
        self.call_bytes += n
        if self.call_bytes > CALL_BYTES_PER_CELL * self.max_bytes:
            budget = CALL_BYTES_PER_CELL * self.max_bytes
            raise ProtocolError(f"the worker sent more than {budget} bytes of API calls in one cell")
        body = bytes(self.buf[HEADER.size : HEADER.size + n])
        del self.buf[: HEADER.size + n]
        return decode(body)

    def _handle(self, msg: dict[str, Any]) -> None:
        op = msg["op"]
        if op == "call" and self.in_cell:
            assert self.transport is not None
            if self.transport.get_write_buffer_size() > 2 * self.max_bytes:
                raise ProtocolError("the worker sends API calls without reading the replies")
            self.transport.write(self.answer(msg))
            return
        waiting = self.waiter is not None and not self.waiter.done()
        if waiting and (op == "done") == self.in_cell and op in ("hello", "done"):
            self.in_cell = False
            assert self.waiter is not None
            self.waiter.set_result(msg)
            return
        raise ProtocolError(f"unexpected message {op!r} from the worker")

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.error)
        if self.transport is not None:
            self.transport.abort()


class WorkerHandle:
    """A worker process: its pidfd (kill without the risk of pid reuse) and its channel."""

    def __init__(self, pid: int, channel: WorkerChannel) -> None:
        self.pid, self.channel = pid, channel
        self.pidfd: int | None = None
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(pid)

    @classmethod
    async def connect(cls, pid: int, sock: socket.socket, channel: WorkerChannel) -> WorkerHandle:
        await asyncio.get_running_loop().create_unix_connection(lambda: channel, sock=sock)
        return cls(pid, channel)

    def signal(self, signum: int) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signum)

    def kill(self) -> None:
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            os.close(self.pidfd)
            self.pidfd = None
        self.channel.close()
