"""Static usage detection (``sage_rl/skills/static.py``): bodies that never run count for nothing.

Where the environment reports no call records (AppWorld), a library skill counts as used only
when a body that runs calls it. Each expectation below was worked out by reading the cell."""

from __future__ import annotations

import pytest

from sage_rl.skills.library import Library
from sage_rl.skills.record import make_skill
from sage_rl.skills.usage import used_skills_static

VENMO_LOGIN = '''def venmo_login() -> str:
    """Log in to Venmo; return the access token."""
    return apis.venmo.login(username="me", password="pw")["access_token"]'''


def _library() -> Library:
    lib = Library()
    lib.add(make_skill(VENMO_LOGIN))
    return lib


@pytest.mark.parametrize(
    "cells, used",
    [
        # the case: a lambda that is never called
        (["g = lambda: venmo_login()"], set()),
        # a lambda body never runs, even when the lambda is called (the rule: lambda bodies
        # are not followed; a call by name is what counts)
        (["g = lambda: venmo_login()", "g()"], set()),
        (["lambda: venmo_login()"], set()),
        (["handlers = {'login': lambda: venmo_login()}"], set()),
        (["def f(cb=lambda: venmo_login()):\n    return 1\nf()"], set()),
        # a lambda's default value is evaluated when the lambda is made
        (["g = lambda token=venmo_login(): token"], {"venmo_login"}),
        # nested functions that are never called
        (["def outer():\n    def inner():\n        venmo_login()\n    return 1\nouter()"], set()),
        (["def outer():\n    def inner():\n        venmo_login()\n    return inner\nh = outer()"], set()),
        (
            [
                "def outer():\n    def a():\n        venmo_login()\n    def b():\n        a()\n    return 1\nouter()"
            ],
            set(),
        ),
        # ... and the same ones called: the call runs the body
        (["def outer():\n    def inner():\n        venmo_login()\n    inner()\nouter()"], {"venmo_login"}),
        (
            [
                "def outer():\n    def a():\n        venmo_login()\n    def b():\n        a()\n    b()\nouter()"
            ],
            {"venmo_login"},
        ),
        # a sibling's name rebound by something else than a def is not the sibling
        (
            [
                "def outer():\n    def a():\n        venmo_login()\n    def b():\n        a = print\n        a()\n    b()\nouter()"
            ],
            set(),
        ),
        # defined at module level and never called; then called in a later cell
        (["def login_twice():\n    venmo_login()\n    venmo_login()"], set()),
        (["def login_twice():\n    venmo_login()", "login_twice()"], {"venmo_login"}),
        # a plain call is a use
        (["token = venmo_login()"], {"venmo_login"}),
    ],
)
def test_bodies_that_never_run_are_not_uses(cells: list[str], used: set[str]) -> None:
    assert used_skills_static(cells, _library()) == used
