"""The rules agent code lives under (sandbox/rules.py; docs/sandbox.md, "What agent code may do");
the call records' ``with_api`` are tests/test_sandbox_with_api.py, agent code's own module copies
tests/test_sandbox_copies.py."""

from __future__ import annotations

import importlib
import pkgutil
import types

import pytest
from test_sandbox_support import FakeWorld, run

from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.expert import ScriptedExpert
from sage_rl.envs.pocketworld.scenarios import TEMPLATES
from sage_rl.envs.pocketworld.scenarios.base import COMMON_SOURCE
from sage_rl.sandbox.rules import ALLOWED_MODULES, DENIED_ATTRS, attr_allowed, refusal

REFUSED = {
    "import gc": "import of 'gc' is not allowed",
    "import os.path": "import of 'os.path' is not allowed",
    "from inspect import currentframe": "import from 'inspect' is not allowed",
    "from datetime import sys": "importing 'sys' from 'datetime' is not allowed",
    "from math import *": "'from math import *' is not allowed",
    "from . import x": "import from '.' is not allowed",
    "f = lambda: 0\nprint(f.__closure__)": "the attribute '__closure__' is not allowed",
    "print(apis._bridge)": "the attribute '_bridge' is not allowed",
    "import abc\nn = abc.get_cache_token()": "the attribute 'get_cache_token' is not allowed",
    "import decimal\ntype(decimal.Context().flags).register(bytes)": "the attribute 'register' is not allowed",
    "x = ValueError.mro()": "the attribute 'mro' is not allowed",
    "from collections import UserString": "importing 'UserString' from 'collections' is not allowed",
    "def f():\n    raise": "a bare 'raise' outside an 'except' block is not allowed",
    "try:\n    pass\nexcept Exception:\n    def g():\n        raise": "a bare 'raise' outside an 'except' block",
    "try:\n    pass\nfinally:\n    raise": "a bare 'raise' outside an 'except' block",
    "def g():\n    yield 1\nprint(g().gi_frame)": "the attribute 'gi_frame' is not allowed",
    "try:\n    1 / 0\nexcept Exception as e:\n    t = e.__traceback__": "the attribute '__traceback__' is not allowed",
    "x = t.tb_next": "the attribute 'tb_next' is not allowed",
    "import datetime\ndatetime.sys.modules": "the attribute 'sys' is not allowed",
    "import typing\ntyping.get_type_hints(f)": "the attribute 'get_type_hints' is not allowed",
    "from functools import singledispatch": "importing 'singledispatch' from 'functools' is not allowed",
    "f.get_field('0.x', [1], {})": "the attribute 'get_field' is not allowed",
    "object.__subclasses__()": "the attribute '__subclasses__' is not allowed",
    "print(__builtins__)": "the name '__builtins__' is not allowed",
    "__import__('gc')": "the name '__import__' is not allowed",
    "open(5, 'wb')": "'open' is not allowed",
    "eval('1')": "'eval' is not allowed",
    "g = vars": "'vars' is not allowed",
    "match x:\n    case object(__class__=c):\n        pass": "the attribute '__class__' is not allowed",
    # the gadgets of the audit (ESCAPES below), under each spelling of the name
    "from string import Formatter": "importing 'Formatter' from 'string' is not allowed",
    "import functools as f\nf.wraps(g)": "the attribute 'wraps' is not allowed",
    "from functools import update_wrapper": "importing 'update_wrapper' from 'functools'",
    "import copy": "import of 'copy' is not allowed",
    "from dataclasses import dataclass": "import from 'dataclasses' is not allowed",
    "match e:\n    case AttributeError(obj=o):\n        pass": "the attribute 'obj' is not allowed",
    "match p:\n    case Point(0, y):\n        pass": "positional patterns in a class pattern are not allowed",
    "match v:\n    case int(n):\n        pass": "or case int() as n for a built-in type",
    "A.__init__ = f": "assigning or deleting the attribute '__init__' is not allowed",
    "del A.__init__": "assigning or deleting the attribute '__init__' is not allowed",
    # names bound as strings of the tree, not Name nodes (the worker restores builtins per cell too)
    "try:\n    1 / 0\nexcept Exception as __builtins__:\n    pass": "binding the name '__builtins__'",
    "import json as __builtins__": "binding the name '__builtins__' is not allowed",
    "from json import loads as __x": "binding the name '__x' is not allowed",
    "def __builtins__():\n    pass": "binding the name '__builtins__' is not allowed",
    "class __builtins__:\n    pass": "binding the name '__builtins__' is not allowed",
    "match d:\n    case {**__builtins__}:\n        pass": "binding the name '__builtins__' is not allowed",
    "match d:\n    case [*__x] | {'k': __y}:\n        pass": "binding the name '__x' is not allowed",
    "def f():\n    global __builtins__": "binding the name '__builtins__' is not allowed",
}


@pytest.mark.parametrize("code", list(REFUSED))
def test_refused_cells_name_the_breach(code):
    why = refusal(code)
    assert why is not None and why.startswith("RuleError: line ") and REFUSED[code] in why
    assert "nothing in it ran" in why and why.endswith("\n")


def test_the_first_breach_in_reading_order_is_reported():
    why = refusal("x = 1\nprint(x)\nimport gc\nf.__code__")
    assert why is not None and why.startswith("RuleError: line 3: import of 'gc'")


ALLOWED = [
    "import json, re, math\nfrom collections import Counter\nfrom datetime import date, timedelta",
    "import collections.abc\nfrom typing import List, Optional\nfrom functools import reduce",
    "class A:\n    def __init__(self):\n        super().__init__()\n        self.x = 1\nprint(A.__name__, A.__doc__)",
    "if __name__ == '__main__':\n    print(getattr(apis, 'music'))",
    "for _ in range(3):\n    pass",
    "print('{0.__class__}'.format(1))",  # text to the parent (the worker checks it: formats.py)
    "try:\n    x = 1\nexcept KeyError:\n    raise\nexcept ValueError as e:\n    try:\n        pass\n    except OSError:\n"
    "        raise\n    raise",  # a bare raise re-raises the block's own exception
    "match p:\n    case Point(x=0, y=y):\n        print(y)\n    case [a, b] | {'k': a}:\n        pass",
    "def deco(f):\n    def g():\n        return f()\n    g.__name__, g.__doc__ = f.__name__, f.__doc__\n    return g",
    "def broken(:\n    pass",  # a syntax error: passed on, the worker reports it
    "class A:\n    def __eq__(self, o):\n        return True\n    def __hash__(self):\n        return 1",
    "match v:\n    case int() as n:\n        print(n)",
    "import json as js\ntry:\n    js.loads('{')\nexcept ValueError as e:\n    print(e)",
]


@pytest.mark.parametrize("code", ALLOWED)
def test_ordinary_agent_code_is_allowed(code):
    assert refusal(code) is None


@pytest.mark.parametrize("depth", [3000, 100_000])
def test_nesting_the_parser_cannot_take_is_refused(depth):
    """RecursionError / MemoryError in the parent's parser: refused (fail closed), never passed on
    unchecked to a worker whose recursion limit differs."""
    why = refusal("x = " + "-" * depth + "1")
    assert why is not None and why.startswith("RuleError: the code is nested too deeply to be checked")


def test_every_reference_solution_keeps_the_rules():
    """The expert's code (the SFT data) and every template's skills must run unchanged."""
    assert refusal(COMMON_SOURCE) is None
    for template in TEMPLATES:
        assert refusal(template.full_skill_source) is None, template.name
    expert = ScriptedExpert(seed=1)
    for task in tasks.split_tasks("train")[:60]:
        for cell in expert.plan(task, ()):
            assert refusal(cell) is None, (task.task_id, cell)


def _modules_reachable() -> dict[str, str]:
    """path -> module name, for every module reachable from an allowed module by public attributes
    whose names the rules allow. The public submodules of allowed packages are imported first: the
    worker's template may have imported them (``json.tool`` brings ``argparse``)."""
    for name in sorted(ALLOWED_MODULES):
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(getattr(package, "__path__", []), name + "."):
            if not info.name.rsplit(".", 1)[1].startswith("_"):
                importlib.import_module(info.name)
    out: dict[str, str] = {}
    todo = [(name, importlib.import_module(name)) for name in sorted(ALLOWED_MODULES)]
    seen = set()
    while todo:
        path, mod = todo.pop()
        if mod.__name__ in seen:
            continue
        seen.add(mod.__name__)
        for attr, value in vars(mod).items():
            if isinstance(value, types.ModuleType) and attr_allowed(attr):
                out[f"{path}.{attr}"] = value.__name__
                todo.append((f"{path}.{attr}", value))
    return out


def test_allowed_modules_reach_only_allowed_modules():
    """``datetime.sys`` is a way to ``sys.modules['gc']``: every module an allowed module exposes
    under an allowed name must itself be allowed (or its name be denied), on this Python."""
    leaks = {
        path: name
        for path, name in _modules_reachable().items()
        if name not in ALLOWED_MODULES and not name.startswith(tuple(f"{m}." for m in ALLOWED_MODULES))
    }
    assert leaks == {}, (
        f"add these attribute names to DENIED_ATTRS or the modules to ALLOWED_MODULES: {leaks}"
    )
    assert {"f_back", "tb_frame", "gi_frame", "cr_frame", "co_consts", "cell_contents"} <= DENIED_ATTRS


def test_the_gadgets_are_reachable_under_no_other_name():
    """The gadgets are denied by name; no allowed module (nor a public class of one) exposes one
    under another public name, on this Python."""
    import collections
    import copy
    import dataclasses
    import enum
    import functools
    import string

    gadgets = [string.Formatter, functools.update_wrapper, functools.wraps, functools.cached_property]
    gadgets += [enum.global_enum, collections.UserDict, copy, copy.copy, copy.deepcopy, dataclasses]
    gadgets += [dataclasses.dataclass, dataclasses.make_dataclass, dataclasses.asdict, dataclasses.astuple]
    ids, tops = {id(g) for g in gadgets}, {m.partition(".")[0] for m in ALLOWED_MODULES}
    todo, seen, found = [(name, importlib.import_module(name)) for name in sorted(ALLOWED_MODULES)], set(), []
    while todo:
        path, ns = todo.pop()
        if id(ns) in seen:
            continue
        seen.add(id(ns))
        for attr, value in vars(ns).items():
            if not attr_allowed(attr):
                continue
            if id(value) in ids or isinstance(value, string.Formatter):
                found.append(f"{path}.{attr}")
            mine = isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] in tops
            if mine or (isinstance(value, type) and path.count(".") < 3):
                todo.append((f"{path}.{attr}", value))
    assert found == [] and len(seen) > 100


# -- in the worker ------------------------------------------------------------------------------------


def test_computed_names_are_refused_at_run_time(sandbox):
    world = FakeWorld()
    cells = [
        "try:\n    getattr(apis, '_' + 'bridge')\nexcept RuleError as e:\n    print(e)",
        "class S(str):\n    pass\ntry:\n    getattr(apis, S('music'))\nexcept TypeError as e:\n    print(e)",
        "try:\n    hasattr(len, '__' + 'self__')\nexcept RuleError as e:\n    print(hasattr(apis, 'bank'))",
        "try:\n    setattr(apis, '_x', 1)\nexcept RuleError as e:\n    print('refused')",
        "print(getattr(apis, 'ba' + 'nk').balance())",
    ]
    obs = [r.observation for r in run(sandbox, cells, world)]
    assert obs[0].startswith("the attribute '_bridge' is not allowed")
    assert obs[1] == "attribute name must be a str, not S\n"
    assert obs[2] == "True\n" and obs[3] == "refused\n" and obs[4] == "100\n"


#: Cells that reached the worker's Bridge (``apis._bridge``, whose ``chan`` writes frames to the
#: parent) or its CallTracker (``.on_ok.__self__``) before the rules denied the name each one uses,
#: found by the gadget audit of the allowed modules (docs/sandbox.md). Each prints REACHED and the
#: type when it gets there. name -> (cell, what refuses it: the parent's line, or the worker's
#: guarded setattr).
REACHED = "\nprint('REACHED', type(x).__name__)"
GRAB_INIT = "got = []\ndef grab(self, bridge, app):\n    got.append(bridge)\n"
ESCAPES = {
    # string.Formatter resolves '{0._bridge}' with the real getattr and hands the object to the
    # subclass's format_field
    "Formatter": (
        "import string\nclass Grab(string.Formatter):\n    def format_field(self, value, spec):\n"
        "        self.got = value\n        return ''\ng = Grab()\n"
        "g.format('{0._bridge.on_ok.__self__}', apis)\nx = g.got" + REACHED,
        "the attribute 'Formatter' is not allowed",
    ),
    # update_wrapper / wraps: setattr(wrapper, name, getattr(wrapped, name)) for the names given;
    # the wrapper's __setattr__ is the agent's
    "update_wrapper": (
        "import functools\ngot = {}\nclass Catch:\n    def __setattr__(self, name, value):\n"
        "        got[name] = value\nfunctools.update_wrapper(Catch(), apis, assigned=('_bridge',), updated=())\n"
        "x = got['_bridge']" + REACHED,
        "the attribute 'update_wrapper' is not allowed",
    ),
    "wraps": (
        "import functools\ngot = {}\nclass Catch:\n    def __setattr__(self, name, value):\n"
        "        got[name] = value\nfunctools.wraps(apis, assigned=('_bridge',), updated=())(Catch())\n"
        "x = got['_bridge']" + REACHED,
        "the attribute 'wraps' is not allowed",
    ),
    # deepcopy's memo ends up holding the originals of what it copied (its keep-alive list); a memo
    # whose get() skips the objects that cannot be copied (a socket, a lock) lets the copy finish
    "deepcopy": (
        "import copy\nclass Memo(dict):\n    def get(self, key, default=None):\n        self.last = key\n"
        "        return 0 if key in skip else dict.get(self, key, default)\nskip, kept = set(), []\n"
        "for attempt in range(60):\n    memo = Memo()\n    try:\n        copy.deepcopy(apis, memo)\n"
        "        kept = dict.get(memo, id(memo), [])\n        break\n    except Exception:\n"
        "        skip.add(memo.last)\nx = [v for v in kept if type(v).__name__ == 'CallTracker'][0]"
        + REACHED,
        "import of 'copy' is not allowed",
    ),
    # copy.copy rebuilds an object as its __reduce_ex__ says, with setattr(y, name, value) on y, the
    # callable's result: here the class of apis.bank, whose __init__ apis.<new app> calls
    "copy": (
        "import copy\n" + GRAB_INIT + "class Evil:\n    def __reduce_ex__(self, protocol):\n"
        "        return (type, (apis.bank,), (None, {'__init__': grab}))\ncopy.copy(Evil())\n"
        "apis.newapp\nx = got[0]" + REACHED,
        "import of 'copy' is not allowed",
    ),
    # the same through collections.UserDict.copy, which runs copy.copy(self)
    "UserDict": (
        "import collections\n" + GRAB_INIT + "def reduce(self, protocol):\n"
        "    return (type, (apis.bank,), (None, {'__init__': grab}))\n"
        "D = type('D', (collections.UserDict,), {'__copy__': None, '__reduce_ex__': reduce})\n"
        "try:\n    D().copy()\nexcept AttributeError:\n    pass\napis.newapp\nx = got[0]" + REACHED,
        "the attribute 'UserDict' is not allowed",
    ),
    # dataclass() writes field names into the source it execs, with the real builtins
    "dataclass": (
        "import dataclasses\n"
        "src = \"x if (_ for _ in ()).throw(LookupError(__import__('gc'))) else x\"\n"
        "C = type('C', (), {'__annotations__': {src: int}})\n"
        "dataclasses.dataclass(C, init=False, eq=False)\ntry:\n    repr(C())\nexcept LookupError as e:\n"
        "    gc = e.args[0]\nx = [o for o in gc.get_objects() if type(o).__name__ == 'CallTracker'][0]"
        + REACHED,
        "import of 'dataclasses' is not allowed",
    ),
    # a positional class pattern looks up the names of the class's __match_args__ in C
    "match_args": (
        "class Meta(type):\n    def __instancecheck__(cls, obj):\n        return True\n"
        "Any = Meta('Any', (), {'__match_args__': ('_bridge',)})\nmatch apis:\n    case Any(b):\n"
        "        x = b" + REACHED,
        "positional patterns in a class pattern are not allowed",
    ),
    # str.format resolves '_' names in C (only text comes back), but a lookup that then fails raises
    # an AttributeError whose .obj is the object it ran on
    "AttributeError.obj": (
        "try:\n    '{0._bridge.on_ok.__self__.nope}'.format(apis)\nexcept AttributeError as e:\n"
        "    x = e.obj" + REACHED,
        "the attribute 'obj' is not allowed",
    ),
    # cached_property reads instance.__dict__[attrname], attrname a plain attribute
    "cached_property": (
        "import functools\ncp = functools.cached_property(lambda self: None)\ncp.attrname = '_bridge'\n"
        "type(apis).leak = cp\nx = apis.leak" + REACHED,
        "the attribute 'cached_property' is not allowed",
    ),
    # global_enum updates the globals of the module its class names: here the rules' own
    "global_enum": (
        "import enum\nFake = type('Fake', (), {'__module__': 'sage_rl.sandbox.rules', "
        "'__members__': {'attr_allowed': lambda name: True}})\nenum.global_enum(Fake)\n"
        "x = getattr(apis, '_bridge')" + REACHED,
        "the attribute 'global_enum' is not allowed",
    ),
    # __init__ may be read (super().__init__()) but not assigned: apis.<app> runs _App(bridge, app)
    "__init__ =": (
        GRAB_INIT + "type(apis.bank).__init__ = grab\napis.newapp\nx = got[0]" + REACHED,
        "assigning or deleting the attribute '__init__' is not allowed",
    ),
    "setattr __init__": (
        GRAB_INIT + "setattr(type(apis.bank), '__init__', grab)\napis.newapp\nx = got[0]" + REACHED,
        "RuleError: assigning or deleting the attribute '__init__' is not allowed",
    ),
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_the_gadgets_of_the_audit_do_not_reach_the_records(sandbox, name):
    """Each cell, run through the real sandbox, is refused (by the parent, or at run time by the
    guarded setattr) and reaches neither the bridge nor the tracker. Reverting the denial each one
    names makes its test fail with REACHED Bridge / CallTracker (checked when they were added)."""
    cell, refused_by = ESCAPES[name]
    world = FakeWorld()
    [r] = run(sandbox, [cell], world)
    assert "REACHED" not in r.observation and not r.ok, r.observation
    assert refused_by in r.observation, r.observation
    if r.observation.startswith("RuleError: line "):
        assert world.log == [] and r.calls == ()  # refused in the parent: nothing of it ran


def test_the_parent_refuses_before_the_worker_runs_anything(sandbox):
    world = FakeWorld()
    r = run(sandbox, ["x = 1", "apis.bank.deposit(amount=50)\nimport gc", "print(x)"], world)
    assert r[1].observation.startswith("RuleError: line 2: import of 'gc'") and not r[1].ok
    assert world.log == [] and r[1].calls == () and r[1].api_ok == 0
    assert r[2].observation == "1\n"  # the namespace is untouched: the worker never saw the cell


def test_a_library_skill_that_breaks_the_rules_does_not_load(sandbox):
    r = run(sandbox, ["import gc\ndef leak():\n    return gc"], FakeWorld())
    assert r[0].observation.startswith("RuleError: ") and not r[0].ok
