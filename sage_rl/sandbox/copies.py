"""Agent code's own copies of the allowed modules (the ``__import__`` of ``rules.agent_builtins``).

The worker's own code uses the allowed modules too (its ``done`` frame is written by
``json.JSONEncoder``, the tracker calls ``itertools.islice``), and agent code may assign their public
attributes: ``json.JSONEncoder.iterencode = forge`` rewrote the call records on their way to the
parent. So each agent namespace (a task's, the library's: ``stores.share_library_cell``) imports
the allowed modules afresh, as copies of its own: a module's Python globals (random's generator,
calendar's first weekday, re's cache) are then each namespace's. C modules' state is one for all
(``shared.py`` watches what of it a task could stash a value in).

This module is imported by the template process: it imports nothing of the project but ``rules``.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from typing import Any

from sage_rl.sandbox.rules import ALLOWED_MODULES, module_allowed

#: Top-level names of the modules agent code gets its own copies of (``private_import``): the allowed
#: ones, and ``_collections_abc``, whose classes ``collections.abc`` exposes.
#: ``time`` is shared: C code (``_datetime``, ``_strptime``) builds the worker's ``time.struct_time``,
#: and the worker binds the one function it uses (``monotonic``) when it loads.
PRIVATE_TOPS = frozenset({m.partition(".")[0] for m in ALLOWED_MODULES} - {"time"} | {"_collections_abc"})


#: C modules agent code's copies do without (the module falls back to its Python code, whose state
#: is then each copy's): ``_zoneinfo``'s ``ZoneInfo`` keeps one cache for every copy, holding the
#: key object a task passed (a ``str`` subclass with an attribute, or an ``__eq__`` that the cache
#: ran inside a skill's call: the review of session 42).
PYTHON_ONLY = ("_zoneinfo",)


def _private(name: str) -> bool:
    return name.partition(".")[0] in PRIVATE_TOPS


def private_import() -> Callable[..., Any]:
    """``__import__`` for agent code: the allowed modules, imported afresh for agent code alone.

    The worker's own code uses the same modules (its ``done`` frame is written by
    ``json.JSONEncoder``, the tracker calls ``itertools.islice``), and
    agent code may assign any public attribute: ``json.JSONEncoder.iterencode = forge`` rewrote the
    call records on their way to the parent. So agent code gets its own module objects, classes
    and functions: while it imports, ``sys.modules`` holds its copies in place of the worker's (the
    first import of a module runs the module's code again; later ones are a dict lookup), and what
    it changes there the worker never runs. C types are shared: they cannot be changed. Other names
    are imported as before: C code imports by name (``datetime.strptime`` imports ``_strptime``)
    while agent code runs, and ``refusal`` refuses agent code that names a module not allowed."""
    real_import = builtins.__import__
    modules = sys.modules
    own: dict[str, types.ModuleType] = {}  # this worker's agent copies, by name
    done: dict[tuple[str, tuple[str, ...]], types.ModuleType] = {}

    def agent_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> types.ModuleType:
        key = (name, tuple(fromlist or ()))
        if key in done:
            return done[key]
        if level or type(name) is not str or not module_allowed(name):
            return real_import(name, globals, locals, fromlist, level)
        saved = {n: m for n, m in modules.items() if _private(n)}
        hidden = {n: modules.get(n) for n in PYTHON_ONLY}
        try:
            for n in saved:
                del modules[n]
            modules.update(own)
            modules.update(dict.fromkeys(PYTHON_ONLY))  # None: the import falls back to Python code
            module = real_import(name, None, None, key[1], 0)
            if name.partition(".")[0] == "collections":  # as in any interpreter: collections.abc loaded
                real_import("collections.abc", None, None, (), 0)
        finally:
            # A timeout may interrupt any line here: the two calls below are one step each, so the
            # worker's modules are back whatever follows, and none of them becomes agent code's.
            now = dict(modules)
            modules.update(saved)
            for n, m in hidden.items():
                if m is None:
                    modules.pop(n, None)
                else:
                    modules[n] = m
            for n, m in now.items():
                if _private(n) and m is not saved.get(n):
                    own[n] = m
                    if n not in saved:
                        modules.pop(n, None)
        _share_what_c_code_fetches(own, modules)
        done[key] = module
        return module

    return agent_import


#: Classes that C code of a shared extension module fetches by module name when it runs
#: (``PyImport_Import`` reads the worker's ``sys.modules``): ``_json`` raises
#: ``json.decoder.JSONDecodeError``. (worker's module, name) -> the agent copies that get it.
_FETCHED_BY_C = {
    ("json.decoder", "JSONDecodeError"): ("json", "json.decoder"),
    # _sre runs the worker's re._subx / re._expand for a replacement template (PyImport_Import)
    ("re", "error"): ("re", "re._constants", "re._parser", "re._compiler"),
}


def _share_what_c_code_fetches(own: dict[str, types.ModuleType], worker: dict[str, Any]) -> None:
    """The agent's copies hold the worker's objects that C code fetches (``_FETCHED_BY_C``), so that
    ``except json.JSONDecodeError`` catches what ``_json`` raises; and ``Decimal`` is a
    ``numbers.Number`` (``_decimal`` registered it once, with the worker's ``numbers``)."""
    for (module, name), copies in _FETCHED_BY_C.items():
        value = getattr(worker.get(module), name, None)
        for copy in copies:
            if value is not None and copy in own:
                setattr(own[copy], name, value)
    # _decimal compares with what is a numbers.Rational of the worker's numbers, and registered its
    # flags mapping with the worker's collections.abc
    rational = getattr(worker.get("numbers"), "Rational", None)
    if rational is not None and "fractions" in own:
        rational.register(own["fractions"].Fraction)
    context = getattr(worker.get("_decimal"), "Context", None)
    if context is not None and "collections.abc" in own:
        own["collections.abc"].MutableMapping.register(type(context().flags))
    decimal = getattr(worker.get("_decimal"), "Decimal", None)
    if decimal is not None and "numbers" in own:
        own["numbers"].Number.register(decimal)
