"""The review of session 42: more places a task stashed its answer for a library skill to read back.

Each chain (as in tests/test_reward_shared.py: task 1 saves a skill that makes an API call and reads
the place; task 2 stashes its answer, 20, there and submits what the skill returned) paid the skill
bonus, (2.0, 2.0), before its fix, and pays (1.0, 1.0) now:

- attributes that standard-library code stores on an object both namespaces hold and that nobody
  watched: a C module's exception class, decimal's signals and flags mapping, the classes of
  ``apis`` and ``RuleError`` reached through ``type()`` (``shared.shared_objects`` finds the first
  kind by a walk of the allowed modules; the worker watches the second);
- the names a task looked up on ``apis``, cached where ``dir(apis)`` showed them (``apis.py``);
- the exception the task was handling when it called the skill, read through ``str.format``'s
  field lookups (``formats.py``) or a bare ``raise`` (refused: rules.py);
- a shared ABC's virtual subclasses (``register`` refused) and the worker's own base classes
  (``mro`` refused).
"""

from __future__ import annotations

import gc

import pytest
from test_reward_credit import chain

from sage_rl.sandbox.formats import check_fields
from sage_rl.sandbox.rules import RuleError
from sage_rl.sandbox.shared import shared_objects


def _template(reader: str, where: str, imports: str) -> tuple[str, str]:
    """A reader of ``where.template`` and the stash ``string.Template.__init__(where, answer)``."""
    body = (f"import {imports}\n    " if imports else "") + f"return getattr({where}, 'template', 0)"
    stash = f"import string{', ' + imports if imports else ''}\nstring.Template.__init__({where}, {{answer}})"
    return body, stash


CASES = {
    "json_error": _template("json_error", "json.JSONDecodeError", "json"),
    "signal": _template("signal", "decimal.Inexact", "decimal"),
    "flags_type": _template("flags_type", "type(decimal.Context().flags)", "decimal"),
    "app_type": _template("app_type", "type(apis.supervisor)", ""),
    "wrapper": (
        "import re\n    return getattr(re.error, 'width', 0)",
        "import re, textwrap\ntextwrap.TextWrapper.__init__(re.error, width={answer})",
    ),
    "rule_error": (
        "try:\n        getattr(apis, '_x')\n    except Exception as e:\n        return getattr(type(e), 'template', 0)",
        "import string\ntry:\n    getattr(apis, '_x')\nexcept Exception as e:\n    string.Template.__init__(type(e), {answer})",
    ),
    "apis_dir": (
        "for n in dir(apis):\n        if n[:1] == 'a' and n[1:].isdigit():\n            return int(n[1:])\n    return 0",
        "apis.a{answer}",
    ),
    "handled": (
        "try:\n        raise KeyError(0)\n    except KeyError as e:\n        try:\n"
        "            return int('{0.__context__.args[0]}'.format(e))\n        except Exception:\n            return 0",
        "try:\n    raise ValueError({answer})\nexcept ValueError:\n    r = handled()",
    ),
    # the second review (helper-24) of the fixes above: each of these paid (2.0, 2.0) after them
    "context_subclass": (
        "import decimal\n    return getattr(decimal.getcontext(), 'v', 0)",
        "import decimal\nclass C(decimal.Context):\n    pass\nc = C()\nc.v = {answer}\ndecimal.setcontext(c)",
    ),
    "zone_key": (  # the C ZoneInfo's one cache held the task's key object
        "import zoneinfo\n    return getattr(zoneinfo.ZoneInfo('Pacific/Chatham').key, 'v', 0)",
        "import zoneinfo\nclass K(str):\n    pass\nk = K('Pacific/Chatham')\nk.v = {answer}\nz = zoneinfo.ZoneInfo(k)",
    ),
    "zone_eq": (  # ... and ran the task's __eq__ inside the skill's call
        "import zoneinfo, decimal\n    zoneinfo.ZoneInfo('UTC')\n    return decimal.getcontext().prec",
        "import zoneinfo, decimal\narmed = []\nK = type('K', (str,), {'__eq__': lambda s, o: bool(armed) and "
        "decimal.setcontext(decimal.Context(prec={answer})), '__hash__': lambda s: 1})\n"
        "zoneinfo.ZoneInfo(K('Pacific/Chatham'))\narmed.append(1)",
    ),
    "finalizer": (  # the collector ran the task's __del__ inside the skill's call
        "xs = [[i] for i in range(3000)]\n    import decimal\n    return decimal.getcontext().prec",
        "import decimal\nfired = []\nclass P:\n    def __del__(self):\n        fired.append(1)\n"
        "class S:\n    def __del__(self):\n        decimal.setcontext(decimal.Context(prec={answer}))\n"
        "while not fired:\n    p = P()\n    p.me = p\n    del p\ns = S()\ns.me = s\ndel s",
    ),
    "finalizer_undone": (  # lambdas as finalizers, the context put back before the skill returned
        "xs = [[i] for i in range(1000)]\n    import decimal\n    p = decimal.getcontext().prec\n"
        "    ys = [[i] for i in range(3000)]\n    return p",
        "import decimal\norig = decimal.getcontext()\nfired = []\nclass H:\n    pass\ndef mk(fin):\n"
        "    h = H()\n    h.me = h\n    h.f = type('F', (), {'__del__': fin})()\nP = lambda self: fired.append(1)\n"
        "R = lambda self: decimal.setcontext(orig)\n"
        "S = lambda self: (decimal.setcontext(decimal.Context(prec={answer})), mk(R))\nwhile not fired:\n"
        "    mk(P)\nmk(S)",
    ),
    "format_subclass": (  # S.format(fmt, e) with class S(str): the real str.format
        "class S(str):\n        pass\n    try:\n        raise KeyError(0)\n    except KeyError as e:\n        try:\n"
        "            return int(S.format('{0.__context__.args[0]}', e))\n        except Exception:\n            return 0",
        "try:\n    raise ValueError({answer})\nexcept ValueError:\n    r = format_subclass()",
    ),
    # the third review: the interpreter's one table of interned strings (the task's literal 'z1020')
    "interned": (
        "class A:\n        pass\n    for i in range(1000, 1100):\n        s = 'z' + str(i)\n        a = A()\n"
        "        setattr(a, s, 1)\n        if [n for n in dir(a) if n == s][0] is not s:\n            return i - 1000\n"
        "    return 0",
        "x = 'z10{answer}'",
    ),
    # the fourth review: keys in the worker's own caches that C code reaches, matched by C callables
    "strptime_cache": (
        "import time\n    for i in range(60):\n        try:\n            time.strptime(str(i), 'qz')\n"
        "            return i\n        except ValueError:\n            pass\n    return 0",
        "import time, functools\nfor j in range(105):\n    time.strptime(str(j), str(j))\n"
        "K = type('K', (str,), {'__eq__': bool, '__hash__': functools.partial(int, hash('qz'))})\n"
        "time.strptime('{answer}', K('{answer}'))",
    ),
    "repl_cache": (
        "import re\n    try:\n        return int(re.sub('a', 'q\\\\n', 'a'))\n    except ValueError:\n        return 0",
        "import re, functools\nK = type('K', (str,), {'__eq__': bool, '__hash__': functools.partial(int, hash('q\\\\n'))})\n"
        "x = re.sub('a', K('{answer}\\\\n'), 'a')",
    ),
    "registered": (
        "import decimal\n    s = type(decimal.Context().flags)\n    ts = [bytes, bytearray, complex, frozenset, memoryview]\n"
        "    return sum(1 << i for i, t in enumerate(ts) if issubclass(t, s))",
        "import decimal\ns = type(decimal.Context().flags)\nts = [bytes, bytearray, complex, frozenset, memoryview]\n"
        "for i, t in enumerate(ts):\n    if {answer} >> i & 1:\n        s.register(t)",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_skill_that_reads_back_what_the_task_left_in_a_shared_place_is_not_paid(name):
    body, stash = CASES[name]
    first = (
        f"def {name}():\n    apis.supervisor.show_profile()\n    {body}\n"
        f"print({name}())\napis.supervisor.complete_task(answer={{answer}})"
    )
    got = "r" if "r = " in stash else f"{name}()"
    # the task submits its own answer when the skill no longer reads it back (so that it succeeds)
    submit = f"v = {got}\napis.supervisor.complete_task(answer=v if v == {{answer}} else {{answer}})"
    c, r = chain(f"{stash}\n{submit}", "flow", first=first)
    assert c.trajectories[0].skills_saved == (name,)
    assert c.trajectories[1].skills_used == () and r == (1.0, 1.0)


def test_the_walk_finds_what_both_module_copies_hold():
    import json
    import re
    import time

    names = {getattr(o, "__qualname__", "") for o in shared_objects()}
    assert {"JSONDecodeError", "error", "Inexact", "struct_time", "SignalDict"} <= names
    found = {id(o) for o in shared_objects()}
    assert {id(json.JSONDecodeError), id(re.error), id(time)} <= found
    assert id(json) not in found and id(re) not in found  # each namespace's own copies


@pytest.mark.parametrize(
    ("fmt", "refused"),
    [
        ("{0.__globals__}", "__globals__"),
        ("{0:{1.__class__}}", "__class__"),  # a field nested in a format spec
        ("{x._bridge}", "_bridge"),
        ("{0.real} {0[__dict__]} {a.b} {0!r:>{1}}", None),  # items are looked up as x[key]
        ("{0.", None),  # str.format's own error, not ours
    ],
)
def test_a_format_strings_fields_keep_the_attribute_rule(fmt, refused):
    if refused is None:
        check_fields(fmt)
    else:
        with pytest.raises(RuleError, match=refused):
            check_fields(fmt)


def _compiled(tracker, code: str, origin: str, namespace: dict) -> dict:
    exec(tracker.compile(code, origin), namespace)  # noqa: S102 - the test's own code, compiled as agent code
    return namespace


@pytest.mark.parametrize("hook", ["def hook():\n    return 1", "hook = lambda: 1"], ids=["def", "lambda"])
def test_the_tasks_code_run_inside_a_skills_call_leaves_it_providing_nothing(hook):
    """By hand: a skill that runs a function of a cell (as C code runs a task's ``__eq__``, or the
    collector its ``__del__``) provides nothing; one that runs none does."""
    from sage_rl.sandbox.tracking import CallTracker

    tracker = CallTracker()
    cell = _compiled(tracker, hook, "<cell-0>", {})
    skills = _compiled(tracker, "def plain():\n    return 'fresh one'\ndef runs():\n    hook()\n    return 'fresh two'",
                       "<skill:s>", {"hook": cell["hook"]})  # fmt: skip
    skills["plain"](), skills["runs"]()
    provided = {a[1] for a in tracker.flow.providers}
    assert "fresh one" in provided and "fresh two" not in provided


def test_no_collection_runs_inside_a_skills_call():
    from sage_rl.sandbox.tracking import CallTracker

    tracker = CallTracker()
    skills = _compiled(tracker, "import gc\ndef inside():\n    return gc.isenabled()", "<skill:s>", {})
    assert gc.isenabled() and skills["inside"]() is False and gc.isenabled()


def test_a_strings_identity_tells_agent_code_nothing():
    """``is`` and ``id()`` see equal strings as one object, whatever the interpreter interned."""
    from sage_rl.sandbox.tracking import CallTracker

    tracker = CallTracker()
    cell = (
        "a, b = 'q' + str(7), 'q7'\nsame = (a is b, a is not b, id(a) == id(b), a is None, [1] is [1])\n"
        "c = 'w' + str(7)\nafter = a is c"
    )
    ns = _compiled(tracker, cell, "<cell-0>", {"__builtins__": _agent_builtins(tracker)})
    assert ns["same"] == (True, False, True, False, False) and ns["after"] is False


def _agent_builtins(tracker):
    from sage_rl.sandbox.copies import private_import
    from sage_rl.sandbox.rules import agent_builtins

    return agent_builtins(tracker.stores, private_import())
