"""The interpreter state a task and its library skills share, and whether the task has moved it.

A skill that reads what the task stashed somewhere both can reach returns the task's value as its
own: ``decimal.setcontext(Context(prec=ANS))`` in the task, ``return getcontext().prec`` in a skill,
paid the skill bonus (2.0, 2.0) for the task's answer. The task and the library already run with
Python module copies of their own (``copies.py``: random's generator, calendar's first
weekday, re's cache are each namespace's), so what is left shared is:

- **decimal's context** (the C module ``_decimal``): the thread's context, read by ``getcontext()``
  or by the digits of any division, and its flags (nine signals: nine bits a task can set); the
  templates ``DefaultContext``, ``BasicContext``, ``ExtendedContext``;
- **csv's registry** (``_csv``): the dialects registered (names and parameters) and the field size
  limit;
- **attributes an allowed module's Python code stores on an object both namespaces hold**
  (``string.Template.__init__(ApiError, ANS)`` sets ``ApiError.template``; so do
  ``difflib.SequenceMatcher.set_seq1(x, ANS)`` and ``calendar.Calendar.setfirstweekday(x, ANS)``;
  agent code's own stores are refused by ``stores.py``). Which objects: ``shared_objects()`` finds
  them by rule, importing the allowed modules twice as agent code does (``copies.private_import``)
  and walking both copies' public attributes, and each value's type, in step: what is the same
  object in both and can hold state (a module such as ``time``, a class that is not immutable such
  as ``json.JSONDecodeError`` or decimal's signals, a function, an object with a ``__dict__``, a
  container); the walk runs once, in the template process, before it forks workers. And what the
  worker ``watch``es: its classes agent code reaches through ``type()`` (``ApiError``,
  ``RuleError``, the classes of ``apis``).

``SharedState`` takes their fingerprint when an episode's tracker is made, before any agent code
runs; ``moved()`` tells whether it differs now. A library skill's call that starts while it differs
provides nothing by its return (``flow.FlowTracker.inputs``: as a call given a callback): less
credit, never more. Agent code runs in the thread that made the tracker (both executors), whose
decimal context is the one compared. Honest
code that moves this state (a task that divides ``Decimal``s, a skill that registers a dialect)
costs the later skill calls of its episode their credit; no policy cell of laptop33's evaluations
imports ``decimal`` or ``csv``.

The in-process executor shares every module with the project (its limit, docs/sandbox.md): there
this covers the same C state, not the Python modules' globals.

This module is imported by the template process: it imports nothing of the project but ``copies``
and ``rules``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from sage_rl.sandbox.copies import private_import
from sage_rl.sandbox.rules import ALLOWED_MODULES, attr_allowed

#: How deep ``shared_objects`` walks attributes from each allowed module: depths 2, 3 and 4 find the
#: same 31 objects (the 27 the review of session 42 listed, and 4 functions), in 0.09, 0.34 and 2.6 s.
WALK_DEPTH = 3
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: a type whose attributes cannot be set
_SHARED: tuple[Any, ...] | None = None


def _decimal() -> Any:
    try:
        import _decimal as decimal
    except ImportError:  # an interpreter built without it: the pure-Python one is shared instead
        import _pydecimal as decimal
    return decimal


def _state(obj: Any) -> tuple[Any, ...]:
    """What ``obj`` holds, by identity (so no ``__eq__`` of what agent code put there runs): a
    container's items, else its own attributes' names and values."""
    if type(obj) is dict:
        return tuple(obj), tuple(map(id, obj.values()))
    if type(obj) in (list, set):
        return tuple(map(id, obj))
    if type(obj) is bytearray:
        return (bytes(obj),)
    own = vars(obj)
    return tuple(own), tuple(map(id, own.values()))


def _holds_state(obj: Any) -> bool:
    if type(obj) in (dict, list, set, bytearray) or isinstance(obj, types.ModuleType | types.FunctionType):
        return True
    if isinstance(obj, type):
        return not obj.__flags__ & _IMMUTABLE_TYPE
    try:
        return type(object.__getattribute__(obj, "__dict__")) is dict
    except AttributeError:
        return False


def _walk(a: Any, b: Any, depth: int, seen: dict[int, tuple[Any, int]], found: dict[int, Any]) -> None:
    """``a`` and ``b`` (the same path in the two copies) and what they reach in ``depth`` steps;
    ``seen``: each object walked, with the most steps it had left (reached again with more, it is
    walked again: ``decimal`` is first met as ``fractions.decimal``, one step in)."""
    if id(a) in seen and seen[id(a)][1] >= depth:
        return
    seen[id(a)] = (a, depth)  # kept alive, so that no id is reused while walking
    if a is b and _holds_state(a):
        found[id(a)] = a
    if depth == 0:
        return
    for name in dir(a):
        if not attr_allowed(name):
            continue
        try:
            x, y = getattr(a, name), getattr(b, name)
        except Exception:  # noqa: BLE001 - a property of a stdlib object that needs what it lacks
            continue
        _walk(x, y, depth - 1, seen, found)
        _walk(type(x), type(y), depth - 1, seen, found)


def shared_objects() -> tuple[Any, ...]:
    """The objects that two agent namespaces' copies of the allowed modules both hold and that can
    hold state (module docstring); found once per process."""
    global _SHARED
    if _SHARED is None:
        copies = []
        for _ in range(2):
            agent_import = private_import()
            copies.append(
                [agent_import(m, fromlist=("x",) if "." in m else ()) for m in sorted(ALLOWED_MODULES)]
            )
        seen: dict[int, tuple[Any, int]] = {}
        found: dict[int, Any] = {}
        for a, b in zip(*copies, strict=True):
            _walk(a, b, WALK_DEPTH, seen, found)
        flags = type(_decimal().Context().flags)  # decimal's SignalDict: not in a context's dir()
        _SHARED = (*found.values(), flags)
    return _SHARED


class SharedState:
    """The shared state's fingerprint at the start, and whether it has moved since (module docstring)."""

    def __init__(self) -> None:
        import _csv

        self._csv, self._decimal = _csv, _decimal()
        self._watched: list[Any] = list(shared_objects())
        self._start = self._fingerprint()

    def watch(self, *objs: Any) -> None:
        """Also watch the attributes of ``objs``, objects both namespaces hold, as they are now."""
        self._watched += objs
        self._start = self._fingerprint()

    def _fingerprint(self) -> tuple[Any, ...]:
        d, c = self._decimal, self._csv
        dialects = []
        for name in sorted(c.list_dialects()):
            x = c.get_dialect(name)
            dialects.append(
                (name, x.delimiter, x.quotechar, x.escapechar, x.doublequote, x.skipinitialspace)
                + (x.lineterminator, x.quoting, x.strict)
            )
        # the thread's context (agent code runs in the thread that made the tracker) and the templates:
        # a context's repr is all of it (prec, rounding, Emin, Emax, capitals, clamp, flags, traps)
        contexts = (d.getcontext(), d.DefaultContext, d.BasicContext, d.ExtendedContext)
        return (
            tuple(map(repr, contexts)),
            tuple((id(x), type(x)) for x in contexts),  # a subclass's context repr()s as a plain one
            tuple(dialects),
            c.field_size_limit(),
            tuple(map(_state, self._watched)),
        )

    def clear_caches(self) -> None:
        """Empty the caches of the worker's own Python modules that C code imports by name while agent
        code runs, so both namespaces reach them: ``_strptime``'s regexes (``time.strptime``) and
        ``re._compile_repl`` (``_sre`` expands a replacement template through the worker's ``re``). A
        task's key there (a ``str`` subclass whose ``__eq__`` is ``bool`` and ``__hash__`` a
        ``functools.partial``: C callables, so no task code runs) answered a skill's later lookup
        with the task's value (the fourth review of session 42). Called when a library skill's
        outermost call starts: the skill then finds only what it put there itself."""
        strptime = sys.modules.get("_strptime")
        if strptime is not None:
            strptime._regex_cache.clear()
        re = sys.modules.get("re")
        if re is not None:
            re._compile_repl.cache_clear()

    def moved(self) -> bool:
        """Whether the task (or a skill) has moved the shared state since the start."""
        return self._fingerprint() != self._start
