"""Call records for functions defined by agent code (runs inside the worker).

Each ``def`` in a cell gets one extra, innermost decorator: the tracker's ``wrap``. The wrapper
counts calls, calls that raised, and calls that returned after at least one successful API call
made while they ran (``with_api``), per (qualified name, origin) and per cell. This costs one extra
Python frame per call of an agent function and nothing for other calls; a ``sys.setprofile`` hook
would cost a callback on every call and cannot tell a raising call from one that returned None.

The decorator has no name: the cell is compiled with a random marker string as the decorator, and
the marker is then replaced by ``wrap`` in the constants of the compiled code. So there is nothing
called ``__sage_track__`` in the cell's globals or builtins, and ``wrap`` counts only functions whose
code objects this tracker compiled itself (``compile(..., '<skill:NAME>', ...)`` by agent code
earns nothing). Lambdas are not tracked: they are never skills.

Semantics, stated once:
- a generator or async function counts when its body starts running, and raised when its body
  raises (not when it is merely created);
- ``with_api``: each running call of a plain function has an entry on its thread's stack of open
  calls; the bridge reports each successful API call that works in the world (``does_work``: not
  the API documentation, not ``supervisor.complete_task``, which every task calls anyway) to the
  innermost open call (``api_done``) when
  the agent code that made it (the nearest frame compiled from a cell or a skill) has that call's
  origin: the function's own code, a lambda or comprehension in it, or a function of the same
  origin. A call passes its count on to its caller when it ends if it has the caller's origin or is
  a library skill's, so an API call made by a skill's own helpers or by the skills it calls counts
  for it; an API call made by the task's own code passed in as a callback (``call_it(lambda:
  apis...)``, ``call_it(task_function)``) counts for no skill. A call that raised never counts.
  Generator and async functions are not on the stack (their bodies run interleaved with other
  code): they never count ``with_api``;
- **the library must name the API it is paid for**: an API call made by a library skill's code
  counts (``with_api``, and for ``flow``) only when the code of a library skill running between
  the call and the nearest cell frame out from it (its nested code included; a generator's body
  too) names the API: ``apis.x.send``, ``getattr(app, 'send')``, the name among the code's names
  or string constants (``_made_by``; a cell's callback or a method of the task's class that a skill
  ran ends the walk, so a skill that names the API further out does not make this call). A skill
  handed the call (``def call(f, **kw): return f(**kw)`` given ``apis.x.send``; a name it was
  given, ``getattr(apis.x, name)``; an API the task stored where the skill looks) makes it on the
  task's behalf: the call is the task's, and what it returned is not the open skills' to provide
  (``flow.FlowTracker.api_call``'s ``handed``). The expert's ``fetch_all(api, **params)`` is paid
  as a helper of a skill that names its API and, called by the task with an API, for what it adds
  (the length of the pages joined), not for the rows the task asked for;
- ``effects`` (library skills only): ``flow.FlowTracker`` follows what each plain library skill
  call was given and returned, and each successful API call with the parent's word on whether it
  changed the world; a row is written for a skill with effects this cell even if it was not called
  in it (``calls`` 0);
- the records are computed inside the worker. Only agent code that breaks the rules of
  ``rules.py`` (refused in the parent before a cell runs: introspection, private attributes, raw
  file descriptors) could reach the tracker or the channel; see docs/sandbox.md, "What agent code
  may do".

This module is imported by the template process: it imports nothing of the project but ``flow``.
"""

from __future__ import annotations

import ast
import functools
import gc
import inspect
import secrets
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from sage_rl.sandbox.flow import OPAQUE, FlowTracker
from sage_rl.sandbox.stores import StoreGuard, replace_constants

#: Filename prefix of a library skill's code (equal to ``sage_rl.types.SKILL_ORIGIN_PREFIX``; not
#: imported from there so that the worker loads nothing of the project beyond the sandbox).
SKILL_ORIGIN_PREFIX = "<skill:"

#: Filename prefixes of code compiled from agent cells and library skills (see sage_rl/types.py).
AGENT_PREFIXES = ("<cell-", SKILL_ORIGIN_PREFIX)

#: API calls that do no work in the world, so never make a skill's call count ``with_api``: reading
#: the API documentation, and submitting the task, which every task does with or without a skill.
#: A skill wrapping either (``def submit(a): return apis.supervisor.complete_task(answer=a)``) was
#: credited on every later successful task (the reward audit of session 26).
IDLE_APPS = frozenset({"api_docs"})
IDLE_APIS = frozenset({("supervisor", "complete_task")})


def does_work(app: str, api: str) -> bool:
    """Whether a successful call of ``apis.<app>.<api>`` counts towards ``with_api``."""
    return app not in IDLE_APPS and (app, api) not in IDLE_APIS


class _Instrument(ast.NodeTransformer):
    """Append ``marker`` (a string constant, replaced by ``wrap`` after compiling) as the innermost
    decorator of every def, and make each lambda ``lambda_marker.__call__(lambda ...)`` (replaced by
    ``watch_lambda``)."""

    def __init__(self, marker: str, lambda_marker: str) -> None:
        self.marker, self.lambda_marker = marker, lambda_marker

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        self.generic_visit(node)
        fn = ast.Attribute(value=ast.Constant(self.lambda_marker), attr="__call__", ctx=ast.Load())
        return ast.copy_location(ast.Call(func=fn, args=[node], keywords=[]), node)

    def _decorate(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        node.decorator_list.append(ast.Constant(self.marker))
        return node

    visit_FunctionDef = _decorate
    visit_AsyncFunctionDef = _decorate


class _OpenCalls(threading.local):
    """Per thread: one ``[count, origin, key, inputs]`` entry per running call of a tracked plain
    function, innermost last; ``count`` is the successful API calls made inside that call so far,
    ``inputs`` what ``flow.inputs`` gave for a library skill's call (None for others); ``skills``:
    the inputs of the library skills' calls among them, so that ``task_code_ran`` costs nothing
    per call of the task's own functions however deep they recurse."""

    def __init__(self) -> None:
        self.stack: list[list[Any]] = []
        self.skills: list[set[Any]] = []


class CallTracker:
    """Counts calls of wrapped agent functions. ``counts`` maps (qualname, origin) ->
    [calls, errors, with_api]; ``flow`` follows library skills' values (``sandbox/flow.py``)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], list[int]] = {}
        self.open = _OpenCalls()
        self.flow = FlowTracker()  # across cells: a value returned in one cell may be used in the next
        # Unguessable, so no string literal of agent code can collide with it.
        self._marker = f"\x00sage-track-{secrets.token_hex(8)}\x00"
        self._lambda_marker = f"\x00sage-lambda-{secrets.token_hex(8)}\x00"
        self._codes: dict[int, types.CodeType] = {}  # id -> code object compiled here (kept alive)
        self.stores = StoreGuard(lambda code: self._codes.get(id(code)) is code)  # attribute stores

    def start_cell(self) -> None:
        self.counts = {}
        self.open = _OpenCalls()  # a call cut short by a timeout leaves nothing for the next cell
        self.flow.start_cell()

    def api_done(self, app: str, api: str, kwargs: dict[str, Any], value: Any, changed: int | None) -> None:
        """One API call succeeded (``changed``: 0 if it changed nothing, n if it was the episode's
        n-th change of the world, None where the environment cannot tell): credit the innermost
        running call of this thread when the call does work and the agent code that made it has that
        call's origin (module docstring), and
        follow the values (``flow.FlowTracker.api_call``). The library skills open count as the
        call's makers only when a skill's code made it (not the task's code, passed in as a callback)."""
        record_api_call(self.open.stack, self.flow, sys._getframe(1), app, api, kwargs, value, changed)

    def compile(self, code: str, origin: str) -> types.CodeType:
        """Compile agent code as ``origin`` with call tracking. Raises SyntaxError/ValueError as
        ``compile`` does."""
        tree = ast.parse(code, filename=origin, mode="exec")
        tree = _Instrument(self._marker, self._lambda_marker).visit(tree)
        tree = self.stores.transform(ast.fix_missing_locations(tree))
        markers = {self._marker: self.wrap, self._lambda_marker: self.watch_lambda, **self.stores.markers}
        return replace_constants(compile(tree, origin, "exec", dont_inherit=True), markers, self._codes)

    def records(self) -> list[list[Any]]:
        """``[name, origin, calls, errors, with_api, events]`` rows, sorted, for the functions
        called this cell and the library skills whose work reached the world this cell (``events``:
        the sorted list of ``flow``'s events, empty for the others)."""
        effects = self.flow.effects
        rows = {key: [*key, *n, sorted(effects.get(key, ()))] for key, n in self.counts.items()}
        for key, e in effects.items():
            rows.setdefault(key, [*key, 0, 0, 0, sorted(e)])
        return sorted(rows.values())

    def wrap(self, fn: Any) -> Any:
        """Return ``fn`` wrapped so that its calls are counted; anything not compiled by this
        tracker passes through unchanged."""
        code = getattr(fn, "__code__", None)
        if code is None or self._codes.get(id(code)) is not code:
            return fn
        key = (code.co_qualname, code.co_filename)
        if inspect.iscoroutinefunction(fn):
            wrapper = _wrap_async(self, key, fn)
        elif inspect.isgeneratorfunction(fn):
            wrapper = _wrap_generator(self, key, fn)
        else:
            wrapper = _wrap_plain(self, key, fn)
        return functools.update_wrapper(wrapper, fn)

    def watch_lambda(self, fn: Any) -> Any:
        """A lambda of a cell, wrapped so that its calls inside a library skill's call are seen
        (``task_code_ran``); a skill's own lambdas, and anything not compiled here, unchanged."""
        code = getattr(fn, "__code__", None)
        if code is None or self._codes.get(id(code)) is not code or _is_skill(code.co_filename):
            return fn

        def task_lambda(*args: Any, **kwargs: Any) -> Any:
            if self.open.skills:
                task_code_ran(self.open.skills)
            return fn(*args, **kwargs)

        return functools.update_wrapper(task_lambda, fn)


def task_code_ran(skills: list[set[Any]]) -> None:
    """The task's own code runs while library skills' calls are open (``skills``: their inputs): a finalizer, an
    ``__eq__`` that C code called, a callback. What those calls return is then no skill's to
    provide (``flow.OPAQUE``, as for a call given a callback): the task's code could have put its
    own value where the skill reads (the review of session 42: a ``__del__`` run by the collector
    inside the skill set decimal's context to the answer)."""
    for inputs in skills:
        inputs.add(OPAQUE)


def _counter(tracker: CallTracker, key: tuple[str, str]) -> list[int]:
    counts = tracker.counts
    n = counts.get(key)
    if n is None:
        n = counts[key] = [0, 0, 0]
    n[0] += 1
    return n


def _is_skill(origin: str | None) -> bool:
    return origin is not None and origin.startswith(SKILL_ORIGIN_PREFIX)


def record_api_call(
    stack: list[list[Any]],
    flow: FlowTracker,
    frame: types.FrameType | None,
    app: str,
    api: str,
    kwargs: dict[str, Any],
    value: Any,
    changed: int | None,
) -> None:
    """A successful API call made from ``frame`` outwards while ``stack``'s calls ran
    (``CallTracker.api_done``; the in-process tracer keeps the same stack)."""
    maker, named = _made_by(frame, api)
    works = does_work(app, api)
    open_skills = [e for e in stack if _is_skill(e[1])]
    if works and stack and stack[-1][1] == maker and (named or not _is_skill(maker)):
        stack[-1][0] += 1
    skills = [e[2] for e in open_skills] if named else []
    handed = () if named else [e[3] for e in open_skills if e[3] is not None]
    flow.api_call(skills, app, api, kwargs, value, changed, works, handed)


def _made_by(frame: types.FrameType | None, api: str) -> tuple[str | None, bool]:
    """(the origin of the nearest agent frame from ``frame`` outwards, whether library code names
    ``api`` on the way out from it: the skill frames met before the first frame of a cell, whatever
    runs between them). A cell's code (a task's callback, a method a skill's comparison ran) ends
    the walk: a skill that names the API outside it did not make this call."""
    maker, named = None, False
    while frame is not None:
        origin = frame.f_code.co_filename
        if origin.startswith(AGENT_PREFIXES):
            maker = maker or origin
            if not _is_skill(origin):
                break
            named = named or api in _code_names(frame.f_code)
        frame = frame.f_back
    return maker, named and _is_skill(maker)


@functools.lru_cache(maxsize=4096)
def _code_names(code: types.CodeType) -> frozenset[str]:
    """The names ``code`` and the code nested in it use (attributes, globals) and their string
    constants, in tuples and frozensets too (``kind in ('buy', 'sell')`` is compiled so): what its
    text names. Names in dead code count (a stated limit)."""
    out = set(code.co_names)
    todo = list(code.co_consts)
    while todo:
        c = todo.pop()
        if type(c) is str:
            out.add(c)
        elif type(c) is tuple or type(c) is frozenset:
            todo.extend(c)
        elif type(c) is types.CodeType:
            out |= _code_names(c)
    return frozenset(out)


def by_task(frame: types.FrameType | None) -> bool:
    """Whether the call made from ``frame`` is the task's: the nearest agent frame out from it is a
    cell's (or there is none), not a library skill's. A callback the task hands a skill is the
    task's code: ``call(lambda: box(v))`` gives ``box`` the task's ``v``, as ``box(v)`` does."""
    while frame is not None and not frame.f_code.co_filename.startswith(AGENT_PREFIXES):
        frame = frame.f_back
    return frame is None or not _is_skill(frame.f_code.co_filename)


def innermost_skill(stack: list[list[Any]]) -> tuple[str, str] | None:
    """The key of the innermost library skill call open on ``stack``, if any."""
    return next((e[2] for e in reversed(stack) if _is_skill(e[1])), None)


def close_call(stack: list[list[Any]]) -> int:
    """End the innermost open call: its count of successful API calls, also added to its caller's
    when it has the caller's origin or is a library skill's (module docstring)."""
    if not stack:
        return 0
    made, origin = stack.pop()[:2]
    if made and stack and (origin == stack[-1][1] or _is_skill(origin)):
        stack[-1][0] += made
    return made


def _wrap_plain(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    origin = key[1]
    skill = _is_skill(origin)

    def tracked(*args: Any, **kwargs: Any) -> Any:
        # _counter inlined: this wrapper is on the path of every call of an agent function
        counts = tracker.counts
        n = counts.get(key)
        if n is None:
            n = counts[key] = [0, 0, 0]
        n[0] += 1
        open_calls = tracker.open
        stack, skills = open_calls.stack, open_calls.skills
        inputs = None
        collect = False
        if skill:  # its default values too: state kept in one (``acc={}``) the task may have filled
            given = (*args, *(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values())
            inputs = tracker.flow.inputs(key, given, kwargs, by_task(sys._getframe(1)))
            if not skills:  # the outermost: no key the task left in a worker's cache, and no
                tracker.flow.shared.clear_caches()  # collection (a finalizer of the task's) inside it
                collect = gc.isenabled()
                gc.disable()
            skills.append(inputs)
        elif skills:
            task_code_ran(skills)
        stack.append([0, origin, key, inputs])
        try:
            value = fn(*args, **kwargs)
        except BaseException:
            n[1] += 1
            close_call(stack)
            raise
        finally:
            if skill:
                skills.pop()
                if collect:
                    gc.enable()
        if close_call(stack):
            n[2] += 1
        if inputs is not None:
            tracker.flow.returned(key, inputs, value, innermost_skill(stack))
        return value

    return tracked


def _wrap_generator(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def tracked(*args: Any, **kwargs: Any) -> Any:
        n = _counter(tracker, key)
        if tracker.open.skills and not _is_skill(key[1]):
            task_code_ran(tracker.open.skills)
        try:
            return (yield from fn(*args, **kwargs))
        except BaseException:
            n[1] += 1
            raise

    return tracked


def _wrap_async(tracker: CallTracker, key: tuple[str, str], fn: Callable[..., Any]) -> Callable[..., Any]:
    async def tracked(*args: Any, **kwargs: Any) -> Any:
        n = _counter(tracker, key)
        if tracker.open.skills and not _is_skill(key[1]):
            task_code_ran(tracker.open.skills)
        try:
            return await fn(*args, **kwargs)
        except BaseException:
            n[1] += 1
            raise

    return tracked


def defined_functions(namespace: dict[str, Any], origin: str) -> list[str]:
    """Names bound in ``namespace`` to functions compiled from ``origin`` under their own name."""
    out = []
    for name, value in list(namespace.items()):
        # Only real functions: getattr on arbitrary agent objects could run their __getattr__.
        if not isinstance(value, types.FunctionType):
            continue
        fn = value.__dict__.get("__wrapped__", value)
        code = getattr(fn, "__code__", None)
        if code is not None and code.co_filename == origin and getattr(fn, "__name__", None) == name:
            out.append(name)
    return sorted(out)
