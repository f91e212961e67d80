"""Call records for in-process execution: how often each agent-defined function ran in a cell.

A function is agent-defined when its code object was compiled from an agent origin (``<cell-N>``
or ``<skill:NAME>``). ``sys.settrace`` sees every call; the global tracer ignores everything else
(the world's own code is never line-traced), so the overhead stays on the agent's few frames.
A call counts as an error when the function exits by an exception (an "exception" event followed
by "return" with no "line" in between, i.e. not caught inside the function). ``with_api`` counts
the calls that returned after a successful API call made by their own code, their helpers of the
same origin or library skills they called (the sandbox's rule: sage_rl/sandbox/tracking.py).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from sage_rl.sandbox.tracking import agent_origin
from sage_rl.types import SKILL_ORIGIN_PREFIX, CallRecord

AGENT_ORIGINS = ("<cell-", SKILL_ORIGIN_PREFIX)


class CallTracer:
    """Context manager: counts calls and errors of agent-defined functions while active."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._previous: Any = None
        # [successful API calls, origin] per running agent call, innermost last
        self._open: list[list[Any]] = []

    def __enter__(self) -> CallTracer:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)

    def records(self) -> tuple[CallRecord, ...]:
        return tuple(
            CallRecord(name, origin, c, e, a) for (name, origin), (c, e, a) in sorted(self._counts.items())
        )

    def api_ok(self) -> None:
        """One API call succeeded: credit the innermost running agent call if the agent code that
        made the API call has its origin."""
        if self._open and self._open[-1][1] == agent_origin(sys._getframe(1)):
            self._open[-1][0] += 1

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        # <module>, <lambda>, <listcomp>, <genexpr>: not functions the agent named
        if event != "call" or code.co_name.startswith("<") or not code.co_filename.startswith(AGENT_ORIGINS):
            return None
        record = self._counts.setdefault((code.co_name, code.co_filename), [0, 0, 0])
        record[0] += 1
        raised = False
        stack = self._open
        stack.append([0, code.co_filename])

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal raised
            if event == "exception":
                raised = True
            elif event == "line":
                raised = False
            elif event == "return":
                made, origin = stack.pop() if stack else (0, "")
                if made and stack and (origin == stack[-1][1] or origin.startswith(SKILL_ORIGIN_PREFIX)):
                    stack[-1][0] += made
                if raised:
                    record[1] += 1
                elif made:
                    record[2] += 1
            return local

        return local
