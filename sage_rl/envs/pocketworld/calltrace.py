"""Call records for in-process execution: how often each agent-defined function ran in a cell.

A function is agent-defined when its code object was compiled from an agent origin (``<cell-N>``
or ``<skill:NAME>``). ``sys.settrace`` sees every call; the global tracer ignores everything else
(the world's own code is never line-traced), so the overhead stays on the agent's few frames.
A call counts as an error when the function exits by an exception (an "exception" event followed
by "return" with no "line" in between, i.e. not caught inside the function). ``with_api`` counts
the calls that returned after ``api_ok`` was reported while they ran (as the sandbox's tracker).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from sage_rl.types import SKILL_ORIGIN_PREFIX, CallRecord

AGENT_ORIGINS = ("<cell-", SKILL_ORIGIN_PREFIX)


class CallTracer:
    """Context manager: counts calls and errors of agent-defined functions while active."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._previous: Any = None
        self._open: list[int] = []  # successful API calls inside each running agent call, innermost last

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
        """One API call succeeded: credit the innermost running agent call."""
        if self._open:
            self._open[-1] += 1

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        # <module>, <lambda>, <listcomp>, <genexpr>: not functions the agent named
        if event != "call" or code.co_name.startswith("<") or not code.co_filename.startswith(AGENT_ORIGINS):
            return None
        record = self._counts.setdefault((code.co_name, code.co_filename), [0, 0, 0])
        record[0] += 1
        raised = False
        stack = self._open
        stack.append(0)

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal raised
            if event == "exception":
                raised = True
            elif event == "line":
                raised = False
            elif event == "return":
                made = stack.pop() if stack else 0
                if made and stack:
                    stack[-1] += made
                if raised:
                    record[1] += 1
                elif made:
                    record[2] += 1
            return local

        return local
