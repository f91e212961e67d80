"""The worker side: runs agent cells in one namespace and bridges ``apis`` calls to the parent.

Runs in a process forked from the template (template.py) after the isolation layers are applied.
Nothing here is trusted by the parent: agent code can rewrite any of it. It exists to make the
common case fast and the messages clear; the boundary is the process and the OS layers.
"""

from __future__ import annotations

import io
import linecache
import math
import os
import resource
import signal
import sys
import threading
import traceback
from time import monotonic  # bound now: agent code shares the time module (copies.PRIVATE_TOPS)
from typing import Any, NoReturn

from sage_rl.sandbox.apis import PROXY_CLASSES, Apis
from sage_rl.sandbox.copies import private_import
from sage_rl.sandbox.protocol import BlockingChannel, encode
from sage_rl.sandbox.rules import RuleError, agent_builtins
from sage_rl.sandbox.stores import share_library_cell
from sage_rl.sandbox.tracking import AGENT_PREFIXES, SKILL_ORIGIN_PREFIX, CallTracker, defined_functions

#: Frames of agent code shown at most in a traceback (the last ones; repeats are collapsed too).
MAX_FRAMES = 30


class ApiError(Exception):
    """An app API call failed. ``str(e)`` is the API's own message."""


class CellTimeout(BaseException):
    """The cell ran out of time. A BaseException so that ``except Exception`` does not swallow it."""


# Shown to the agent as plain "ApiError: ..." rather than with this module's dotted path.
ApiError.__module__ = CellTimeout.__module__ = "builtins"


class CappedOutput(io.TextIOBase):
    """stdout and stderr of a cell: keeps the first ``limit`` characters and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size, self.dropped = limit, 0, 0
        self.parts: list[str] = []

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return "utf-8"

    def write(self, s: str) -> int:
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        room = self.limit - self.size
        if room >= len(s):
            self.parts.append(s)
            self.size += len(s)
        else:
            if room > 0:
                self.parts.append(s[:room])
                self.size = self.limit
            self.dropped += len(s) - max(room, 0)
        return len(s)

    def text(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += (
                f"\n[output truncated: {self.dropped} more characters not shown; "
                f"the limit is {self.limit} characters per cell]\n"
            )
        return out


class _CellState:
    """Flags the signal handler reads; it runs in the main thread between bytecodes. Also the
    cell's wall clock, which stops while the worker waits for an API call's answer: that time is
    the environment's (a parent busy with a model step), not the code's, up to ``wait_credit_s``
    (as much again as the limit) per cell; waiting past it counts."""

    def __init__(self) -> None:
        self.in_cell = False
        self.in_bridge = False
        self.pending: str | None = None
        self.fired: str | None = None
        self.timeout_s = 0.0
        self.cpu_s = 0
        self.wait_credit_s = 0.0

    def timeout_message(self) -> str:
        return f"timed out after {self.timeout_s:g} s (wall-clock time limit per cell)"

    def pause_clock(self) -> tuple[float, float] | None:
        """(time left, when paused), or None where the clock is not running (outside a cell, or
        already fired: the timeout is then pending)."""
        if not self.in_cell:
            return None
        left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
        return (left, monotonic()) if left > 0 else None

    def resume_clock(self, paused: tuple[float, float] | None, continued_at: Any = None) -> None:
        """Restart the clock after a wait for the parent. ``continued_at`` (the reply's): when the
        parent was last continued after a stop; a wait on a stopped parent is no one's time."""
        if paused is None:
            return
        left, since = paused
        now = monotonic()
        waited = now - since
        if type(continued_at) is float and since < continued_at <= now:
            waited = now - continued_at
        credit = min(waited, self.wait_credit_s)
        self.wait_credit_s -= credit
        left -= waited - credit
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left)
        elif self.pending is None:  # the uncredited wait used up the cell's time
            self.fired = self.pending = self.timeout_message()


class Bridge:
    """Sends ``apis`` calls to the parent, one at a time across threads (``lock``)."""

    def __init__(self, chan: BlockingChannel, state: _CellState, max_bytes: int) -> None:
        self.chan, self.state, self.max_bytes = chan, state, max_bytes
        self.lock = threading.Lock()
        self.main_ident = threading.main_thread().ident
        self.on_ok: Any = None  # called after each successful API call (the tracker's api_done)

    def call(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        where = f"apis.{_short(app)}.{_short(api)}"
        try:
            frame = encode({"op": "call", "app": app, "api": api, "kwargs": kwargs})
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{where}: arguments must be JSON values (str, int, float, bool, None, list, dict): {e}"
            ) from None
        if len(frame) > self.max_bytes:
            raise ValueError(f"{where}: arguments are too large ({len(frame)} bytes; limit {self.max_bytes})")
        main = threading.get_ident() == self.main_ident
        # A timeout signal arriving mid-exchange is deferred until the reply is read, so a frame
        # is never half-read (see _on_limit_signal). The wall clock stops while the parent answers.
        paused, reply = None, {}
        if main:
            self.state.in_bridge = True
            paused = self.state.pause_clock()
        try:
            with self.lock:
                self.chan.sock.sendall(frame)
                reply = self.chan.recv()
        finally:
            if main:
                self.state.resume_clock(paused, reply.get("continued_at"))
                self.state.in_bridge = False
        if main and self.state.pending is not None:
            message, self.state.pending = self.state.pending, None
            raise CellTimeout(message)
        if reply.get("op") != "ret":
            raise RuntimeError(f"{where}: unexpected reply from the environment")
        if reply.get("ok"):
            value, changed = reply.get("value"), reply.get("changed")
            if self.on_ok is not None:
                self.on_ok(
                    app, api, kwargs, value, changed if type(changed) is int and changed >= 0 else None
                )
            return value
        raise ApiError(str(reply.get("error")))


def _short(name: str) -> str:
    """A name as echoed in messages: names longer than 64 characters are cut (the parent refuses them)."""
    return name if len(name) <= 64 else f"{name[:32]}...({len(name)} characters)"


def format_exception(exc: BaseException) -> str:
    """A traceback trimmed to agent frames (``<cell-N>``, ``<skill:NAME>``) plus the exception line."""
    if isinstance(exc, SystemExit):
        return "SystemExit: exit() was ignored; the sandbox keeps the interpreter running.\n"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(AGENT_PREFIXES)]
    parts: list[str] = []
    if frames:
        parts.append("Traceback (most recent call last):\n")
        if len(frames) > MAX_FRAMES:
            parts.append(f"  ... {len(frames) - MAX_FRAMES} earlier frames not shown ...\n")
        parts += traceback.StackSummary.from_list(frames[-MAX_FRAMES:]).format()
    parts += traceback.format_exception_only(type(exc), exc)
    return "".join(parts)


def cut(text: str, limit: int, what: str) -> str:
    """``text`` within about ``limit`` characters: its start and its end (an error's exception line),
    with the cut marked. Printed output is capped as it is written; an error is text too (a line of
    agent code 90k characters long, ``ValueError('x' * 10**8)``), and past the message limit it
    cost the agent its interpreter and told it the wrong cause."""
    if len(text) <= limit:
        return text
    tail = limit // 4
    return (
        f"{text[: limit - tail]}\n[... {len(text) - limit} characters {what} not shown ...]\n{text[-tail:]}"
    )


class Runtime:
    """One episode's interpreter: the namespace, the bridge, the call tracker and the cell limits."""

    def __init__(self, chan: BlockingChannel, max_bytes: int, output_chars: int) -> None:
        self.chan, self.output_chars = chan, output_chars
        self.state = _CellState()
        self.bridge, self.max_bytes = Bridge(chan, self.state, max_bytes), max_bytes
        self.tracker = CallTracker()
        self.bridge.on_ok = self.tracker.api_done
        # builtins that keep the rules of rules.py for names computed at run time (issue 30)
        # put back before each cell, whatever the last one bound; attribute stores: stores.py
        self.builtins = agent_builtins(self.tracker.stores, private_import())
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": self.builtins}
        self.namespace["apis"] = Apis(self.bridge)
        self.namespace["ApiError"] = ApiError
        # both namespaces reach them, by name or by ``type()`` (shared.py)
        self.tracker.flow.shared.watch(ApiError, CellTimeout, RuleError, *PROXY_CLASSES)
        # library cells run apart, with module copies of their own (stores.share_library_cell)
        self.library_builtins = agent_builtins(self.tracker.stores, private_import())
        self.library = {**self.namespace, "__builtins__": self.library_builtins}
        signal.signal(signal.SIGALRM, self._on_limit_signal)
        signal.signal(signal.SIGXCPU, self._on_limit_signal)
        # Each call of an agent function runs two frames (the call-record wrapper and the function),
        # so double Python's default to give agent code its usual recursion depth of about 1000.
        sys.setrecursionlimit(2000)

    def _on_limit_signal(self, signum: int, frame: Any) -> None:
        if not self.state.in_cell:
            return
        if signum == signal.SIGXCPU:
            message = f"used more than {self.state.cpu_s} CPU seconds (CPU time limit per cell)"
        else:
            message = self.state.timeout_message()
        self.state.fired = message
        if self.state.in_bridge:
            self.state.pending = message
            return
        raise CellTimeout(message)

    def run_cell(self, code: str, origin: str, timeout_s: float, cpu_s: int) -> dict[str, Any]:
        out = CappedOutput(self.output_chars)
        self.tracker.start_cell()
        linecache.cache[origin] = (len(code), None, code.splitlines(True), origin)
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = out
        self.namespace["__builtins__"] = self.builtins
        self.library["__builtins__"] = self.library_builtins
        ns = self.library if origin.startswith(SKILL_ORIGIN_PREFIX) else self.namespace
        before = dict(ns)
        try:
            ok, timed_out, error = self._exec(code, origin, timeout_s, cpu_s, ns)
        finally:
            self._disarm()
            sys.stdout, sys.stderr = saved
        if ns is self.library:
            share_library_cell(code, origin, before, self.library, self.namespace)
        msg = {
            "op": "done",
            "ok": ok,
            "timed_out": timed_out,
            "observation": out.text() + cut(error, self.output_chars, "of the error"),
            "calls": self.tracker.records(),
            "defined": defined_functions(ns, origin),
        }
        while len(encode(msg)) > self.max_bytes and len(msg["observation"]) > 1000:
            # escaped as JSON, a character takes up to 12 bytes: shrink until the frame fits
            msg["observation"] = cut(
                msg["observation"], len(msg["observation"]) // 2, "to fit the message limit"
            )
        return msg

    def _exec(
        self, code: str, origin: str, timeout_s: float, cpu_s: int, ns: dict[str, Any]
    ) -> tuple[bool, bool, str]:
        """(ok, timed_out, error text). The agent's error is formatted while the limits are still
        armed, so an exception whose ``__str__`` hangs is timed out like any other code."""
        try:
            try:
                compiled = self.tracker.compile(code, origin)
                self._arm(timeout_s, cpu_s)
                try:
                    exec(compiled, ns)
                except CellTimeout:
                    raise
                except BaseException as e:  # the agent's error, whatever it is, becomes its observation
                    text = format_exception(e)
                    if self.state.fired is not None:  # the limit hit while formatting (a slow __str__)
                        return False, True, f"{text}CellTimeout: {self.state.fired}\n"
                    return False, False, text
                return True, False, ""
            finally:
                self._disarm()
        except CellTimeout as e:
            return False, True, format_exception(e)
        except BaseException as e:  # compile errors, or an error raised while formatting
            return False, False, format_exception(e)

    def _arm(self, timeout_s: float, cpu_s: int) -> None:
        self.state.timeout_s, self.state.cpu_s, self.state.wait_credit_s = timeout_s, cpu_s, timeout_s
        self.state.pending = self.state.fired = None
        used = resource.getrusage(resource.RUSAGE_SELF)
        # RLIMIT_CPU counts whole seconds of the worker's life: round what was used *up*, so the cell
        # gets at least cpu_s of its own (truncating left it cpu_s minus the fraction already used,
        # a few ms at worst, and the timeout message then overstated what the cell had used).
        soft = math.ceil(used.ru_utime + used.ru_stime) + cpu_s
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        self.state.in_cell = True
        signal.setitimer(signal.ITIMER_REAL, timeout_s)

    def _disarm(self) -> None:
        self.state.in_cell = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def serve(chan: BlockingChannel, max_bytes: int, output_chars: int, hello: dict[str, Any]) -> NoReturn:
    """The worker's loop. Never returns: exits when the parent closes the channel."""
    code = 0
    try:
        rt = Runtime(chan, max_bytes, output_chars)
        lock = rt.bridge.lock
        # The main thread holds the bridge lock except while a cell runs, so an agent thread's API
        # call between cells waits for the next cell instead of reading the parent's next command.
        lock.acquire()
        chan.send(hello)
        while True:
            msg = chan.recv()
            if msg.get("op") != "exec":
                break
            lock.release()
            try:
                result = rt.run_cell(
                    str(msg["code"]), str(msg["origin"]), float(msg["timeout"]), int(msg["cpu"])
                )
            finally:
                lock.acquire()
            chan.send(result)
    except EOFError:
        pass
    except BaseException:
        code = 70
    os._exit(code)
