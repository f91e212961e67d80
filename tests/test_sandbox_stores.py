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
