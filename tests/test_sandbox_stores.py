"""Attribute stores in agent code: only on the classes agent code defines and their objects
(sage_rl/sandbox/stores.py), in the sandbox and in-process alike."""

from __future__ import annotations

import pytest
from test_skill_flow import in_both_executors

from sage_rl.types import skill_origin

LIBRARY = "def run():\n    return 1\n"

#: cells that set attributes on what agent code made: they run, and print what they set
ALLOWED = {
    "class A:\n    pass\na = A()\na.x = 1\nA.y = 2\na.x += 1\nprint(a.x, a.y)": "2 2\n",
    "class A:\n    def __init__(self):\n        self.n = 0\na = A()\nsetattr(a, 'n', 5)\ndel a.n\nprint(hasattr(a, 'n'))": (
        "False\n"
    ),
    "class A:\n    pass\na = A()\nfor a.i in range(3):\n    pass\nprint(a.i)": "2\n",
    # a subclass of an allowed module's class is agent code's
    "import json\nclass E(json.JSONEncoder):\n    pass\ne = E()\ne.indent = 2\nprint(e.encode([1]))": "[\n  1\n]\n",
}

#: cells that set attributes on what the task shares with the library's skills: refused
REFUSED = [
    "run.v = 1",  # a library skill
    "import json\njson.v = 1",  # a module
    "import json\njson.JSONEncoder.v = 1",  # an allowed module's class
    "import json\nsetattr(json, 'loads', None)",
    "import json\ndel json.loads",
    "apis.v = 1",
    "def f(m):\n    m.v = 1\nimport json\nf(json)",  # through a parameter: checked at run time
    "import json\nj = json.JSONEncoder()\nj.indent = 2",  # an object of a class agent code did not define
]


@pytest.mark.parametrize("cell", list(ALLOWED))
def test_attributes_of_what_agent_code_defines_can_be_set(sandbox, cell):
    for name, result in in_both_executors(sandbox, LIBRARY, skill_origin("run"), cell).items():
        assert result.ok and result.observation == ALLOWED[cell], (name, result.observation)


@pytest.mark.parametrize("cell", REFUSED)
def test_attributes_of_what_the_skills_share_are_read_only(sandbox, cell):
    for name, result in in_both_executors(sandbox, LIBRARY, skill_origin("run"), cell).items():
        assert not result.ok and "is read-only" in result.observation, (name, result.observation)


#: a library that reads a builtin, a helper of its own and an import; cell -> what it prints
APART = (
    "import json\n"
    "def zero():\n    return abs(0)\n"
    "def base():\n    return 1\n"
    "def via_base():\n    return base()\n"
    "def parse():\n    return json.loads('1')\n"
    "def via_global():\n    return F\n"
    "def me():\n    return getattr(me, 'maps', None)\n"
)
REBOUND = {
    # the task rebinds what the library reads: the library keeps its own (it paid (2.0, 2.0) before)
    "abs = lambda x: 4711\nprint(zero(), abs(1))": "0 4711\n",
    "def base():\n    return 4711\nprint(via_base(), base())": "1 4711\n",
    "class J:\n    def loads(self, s):\n        return 4711\njson = J()\nprint(parse(), json.loads('x'))": "1 4711\n",
    # the task gets the library's functions and imports (its own copy of the module)
    "print(json.dumps([base()]), zero())": "[1] 0\n",
    # library code storing onto what it is handed as ``self`` (no store of agent code to check): the
    # task's handle on a skill is not the library's function, and apis takes no attributes
    "import collections\ncollections.ChainMap.__init__(me, 7)\nprint(me(), me.maps)": "None [7]\n",
    "import string\nfor target in (apis, apis.shop):\n    try:\n        string.Template.__init__(target, 'x')\n"
    "    except AttributeError as e:\n        print(type(e).__name__)": "AttributeError\nAttributeError\n",
}


@pytest.mark.parametrize("cell", list(REBOUND))
def test_library_code_runs_in_a_namespace_of_its_own(sandbox, cell):
    for name, result in in_both_executors(sandbox, APART, skill_origin("zero"), cell).items():
        assert result.ok and result.observation == REBOUND[cell], (name, result.observation)


def test_a_library_skill_does_not_see_the_tasks_variables(sandbox):
    for name, result in in_both_executors(
        sandbox, APART, skill_origin("zero"), "F = 1\nvia_global()"
    ).items():
        assert not result.ok and "NameError: name 'F' is not defined" in result.observation, name


def test_a_metaclass_cannot_pass_another_class_off_as_the_agents(sandbox):
    """``metaclass=lambda *a: type(json)`` returned ``ModuleType`` from a class statement, and the
    store guard took it for a class agent code defined: ``json.v = ...`` then passed."""
    cell = "import json\nclass X(metaclass=lambda n, b, ns: type(json)):\n    pass\njson.v = 1"
    for name, result in in_both_executors(sandbox, LIBRARY, skill_origin("run"), cell).items():
        assert not result.ok and "a module object is read-only" in result.observation, (
            name,
            result.observation,
        )
