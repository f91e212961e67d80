"""Time this process spent stopped is not agent code's time.

A process stopped and continued (``kill -STOP`` / ``-CONT``, or Ctrl-Z and ``fg`` in a terminal)
finds every clock moved on: asyncio's deadlines expired while nothing ran. A cell in flight then
looked like code that ran past its limit: its worker was killed and its namespace lost
(``Timed out after 3 s``, measured on a 10 s stop, 2026-12-05), and in a long run that someone
paused, some tasks were failed by the pause, not by the model.

:func:`watch` records when this process was last continued (a ``SIGCONT`` handler, from the main
thread, where Python runs signal handlers; it runs before the event loop looks at its timers).
:func:`wait_running` (which starts the watch) awaits a future within a time limit that starts
again when the process was continued meanwhile; the parent's replies to the worker carry
:func:`last_continued`, so that the worker's own clock does not count its wait on a stopped
parent either (``worker.py``).
Clocks are ``time.monotonic``: the same clock in the parent and in its workers (one machine, no
time namespace).
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

_last_continued = 0.0
_watching = False


def watch() -> None:
    """Record this process's continues from now on (once; a no-op outside the main thread, where
    signal handlers cannot be set). A handler set before is still called."""
    global _watching
    if _watching or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCONT)

    def on_continue(signum: int, frame: Any) -> None:
        global _last_continued
        _last_continued = time.monotonic()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGCONT, on_continue)
    _watching = True


def last_continued() -> float:
    """``time.monotonic()`` when this process was last continued after a stop (0.0: never seen)."""
    return _last_continued


def continued_since(t: float) -> bool:
    return _last_continued > t


async def wait_running(
    future: asyncio.Future[Any],
    seconds: float,
    on_round: Callable[[asyncio.Timeout], None] | None = None,
) -> Any:
    """``await future`` within ``seconds``; when the limit passes and this process was continued
    after a stop since the wait (re)started, the wait starts again with the whole limit.

    ``on_round(deadline)`` is called as each round starts, with its ``asyncio.Timeout`` (which the
    caller may move). A future that was done by the time the deadline was handled (an event loop
    blocked meanwhile reads both in one pass) gives its result. On giving up, the future is cancelled
    and ``TimeoutError`` raised."""
    watch()
    while True:
        started = time.monotonic()
        try:
            async with asyncio.timeout(seconds) as deadline:
                if on_round is not None:
                    on_round(deadline)
                return await asyncio.shield(future)
        except TimeoutError:
            if future.done() and not future.cancelled() and future.exception() is None:
                return future.result()
            if continued_since(started):
                continue
            future.cancel()
            raise
        except BaseException:
            future.cancel()  # cancelled from outside: no one waits for it any more
            raise
