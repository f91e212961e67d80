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
  (``string.Template.__init__(ApiError, ANS)`` sets ``ApiError.template``; agent code's own stores
  are refused by ``stores.py``): ``time`` (one module for both: ``copies.PRIVATE_TOPS``) and what
  the worker ``watch``es (``ApiError``).

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

This module is imported by the template process: it imports nothing of the project.
"""

from __future__ import annotations

import sys
from typing import Any


def _decimal() -> Any:
    try:
        import _decimal as decimal
    except ImportError:  # an interpreter built without it: the pure-Python one is shared instead
        import _pydecimal as decimal
    return decimal


def _attributes(obj: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``obj``'s own attributes: their names and identities (compared by identity, so no ``__eq__`` of
    what agent code put there runs)."""
    own = vars(obj)
    return tuple(own), tuple(map(id, own.values()))


class SharedState:
    """The shared state's fingerprint at the start, and whether it has moved since (module docstring)."""

    def __init__(self) -> None:
        import _csv

        self._csv, self._decimal = _csv, _decimal()
        self._watched: list[Any] = [sys.modules["time"]]
        self._start = self._fingerprint()

    def watch(self, obj: Any) -> None:
        """Also watch the attributes of ``obj``, an object both namespaces hold, as they are now."""
        self._watched.append(obj)
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
            tuple(dialects),
            c.field_size_limit(),
            tuple(_attributes(obj) for obj in self._watched),
        )

    def moved(self) -> bool:
        """Whether the task (or a skill) has moved the shared state since the start."""
        return self._fingerprint() != self._start
