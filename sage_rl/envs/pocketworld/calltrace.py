"""Call records for in-process execution: how often each agent-defined function ran in a cell.

A function is agent-defined when its code object was compiled from an agent origin (``<cell-N>``
or ``<skill:NAME>``). ``sys.settrace`` sees every call; the global tracer ignores everything else
(the world's own code is never line-traced), so the overhead stays on the agent's few frames.
A call counts as an error when the function exits by an exception (an "exception" event followed
by "return" with no "line" in between, i.e. not caught inside the function). ``with_api`` counts
the calls that returned after a successful API call made by their own code, their helpers of the
same origin or library skills they called, and ``effects`` follows library skills' values into the
world (the sandbox's rules: sage_rl/sandbox/tracking.py, sage_rl/sandbox/flow.py).
"""

from __future__ import annotations

import inspect
import sys
from types import FrameType
from typing import Any

from sage_rl.sandbox.flow import FlowTracker
from sage_rl.sandbox.tracking import by_task, close_call, innermost_skill, record_api_call, task_code_ran
from sage_rl.types import SKILL_ORIGIN_PREFIX, CallRecord

AGENT_ORIGINS = ("<cell-", SKILL_ORIGIN_PREFIX)
_SUSPENDS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class CallTracer:
    """Context manager: counts calls and errors of agent-defined functions while active."""

    def __init__(self, flow: FlowTracker | None = None) -> None:
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._previous: Any = None
        # [successful API calls, origin, (name, origin), inputs] per running agent call (tracking.py)
        self._open: list[list[Any]] = []
        self._skills: list[set[Any]] = []  # the inputs of the library skills' calls open (tracking.py)
        self.flow = flow if flow is not None else FlowTracker()

    def __enter__(self) -> CallTracer:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous)

    def records(self) -> tuple[CallRecord, ...]:
        effects = self.flow.effects
        keys = sorted(set(self._counts) | set(effects))
        return tuple(
            CallRecord.of_row([*key, *self._counts.get(key, (0, 0, 0)), effects.get(key, ())]) for key in keys
        )

    def api_done(self, app: str, api: str, kwargs: dict, value: Any, changed: int | None) -> None:
        """One API call succeeded: credit the innermost running agent call if the call does work and
        the agent code that made it has its origin; follow the values (``CallTracker.api_done``)."""
        record_api_call(self._open, self.flow, sys._getframe(1), app, api, kwargs, value, changed)

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if event == "call" and self._skills and code.co_filename.startswith("<cell-"):
            task_code_ran(self._skills)  # the task's code inside a skill's call (tracking.py)
        # <module>, <lambda>, <listcomp>, <genexpr>: not functions the agent named
        if event != "call" or code.co_name.startswith("<") or not code.co_filename.startswith(AGENT_ORIGINS):
            return None
        key = (code.co_name, code.co_filename)
        record = self._counts.setdefault(key, [0, 0, 0])
        record[0] += 1
        raised = False
        stack = self._open
        flow = self.flow
        # a library skill's arguments, before its body rebinds them; not a generator's (its
        # "return" events are its yields)
        skill = key[1].startswith(SKILL_ORIGIN_PREFIX) and not code.co_flags & _SUSPENDS
        inputs = flow.inputs(key, *_arguments(frame), by_task(frame.f_back)) if skill else None
        stack.append([0, code.co_filename, key, inputs])
        if inputs is not None:
            self._skills.append(inputs)

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            nonlocal raised
            if event == "exception":
                raised = True
            elif event == "line":
                raised = False
            elif event == "return":  # also when an exception leaves the frame
                if inputs is not None:
                    self._skills.pop()
                made = close_call(stack)
                if raised:
                    record[1] += 1
                else:
                    if made:
                        record[2] += 1
                    if inputs is not None:
                        flow.returned(key, inputs, arg, innermost_skill(stack))
            return local

        return local


def _arguments(frame: FrameType) -> tuple[list[Any], dict[str, Any]]:
    """The arguments of the call ``frame`` starts, as the sandbox's wrapper sees them: the named
    parameters and ``*args`` positionally, ``**kwargs`` by keyword (not the closure's variables,
    which ``f_locals`` also holds)."""
    code, local = frame.f_code, frame.f_locals
    n = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames
    args = [local[v] for v in names[:n] if v in local]
    if code.co_flags & inspect.CO_VARARGS:
        args.extend(local.get(names[n], ()))
        n += 1
    kwargs = local.get(names[n], {}) if code.co_flags & inspect.CO_VARKEYWORDS else {}
    return args, kwargs
