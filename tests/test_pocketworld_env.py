"""The PocketWorld Environment/Suite: protocol conformance, persistent namespace, observations."""

from __future__ import annotations

import asyncio
import random

from pocket import SyncEnv

from sage_rl.envs.base import Environment, Suite
from sage_rl.envs.pocketworld import tasks
from sage_rl.envs.pocketworld.env import PocketWorldSuite


def _env(task_id: str = "notes_pin_tag_1") -> SyncEnv:
    env = SyncEnv()
    env.reset(tasks.task_by_id(task_id))
    return env


def test_protocols_and_async_episode():
    suite = PocketWorldSuite()
    assert isinstance(suite, Suite)

    async def episode():
        env = await suite.open()
        assert isinstance(env, Environment) and env.reports_calls is True
        task = suite.split("dev")[0]
        await env.reset(task)
        r = await env.execute(tasks.reference_solution(task), "<cell-1>")
        assert r.completed and env.completed
        outcome = await env.evaluate()
        await env.close()
        return outcome

    assert asyncio.run(episode()).success
    chain = suite.sample_chain(random.Random(1), 3, split="dev")
    assert [t.position for t in chain] == [1, 2, 3] and len({t.scenario_id for t in chain}) == 1


def test_namespace_persists_and_holds_only_apis():
    env = _env()
    r = env.execute("print(sorted(k for k in dir() if not k.startswith('__')))\nx = 41", "<cell-1>")
    assert r.observation == "['apis']\n" and r.ok
    assert env.execute("print(x + 1)", "<cell-2>").observation == "42\n"


def test_api_error_traceback_is_trimmed_to_agent_frames():
    env = _env()
    code = "def show(n):\n    return apis.notes.show_note(access_token='bad', note_id=n)\n\nshow(1)\n"
    r = env.execute(code, "<cell-3>")
    assert not r.ok and not r.completed
    assert 'File "<cell-3>", line 4, in <module>' in r.observation
    assert 'File "<cell-3>", line 2, in show' in r.observation
    assert "ApiError: 401: notes: invalid access_token" in r.observation
    assert "sage_rl" not in r.observation  # no frames from the world's own code
    assert r.defined == ("show",)


def test_syntax_error_positional_args_and_reset_isolation():
    env = _env()
    assert "SyntaxError" in env.execute("def f(:\n", "<cell-1>").observation
    r = env.execute("apis.supervisor.show_profile(1)", "<cell-2>")
    assert "keyword arguments only" in r.observation
    env.execute("y = 1", "<cell-3>")
    env.reset(tasks.task_by_id("notes_pin_tag_2"))
    assert "NameError" in env.execute("print(y)", "<cell-1>").observation


def test_agent_cannot_change_state_except_through_apis():
    env = _env()
    r = env.execute("apis.world = 1", "<cell-1>")
    assert "read-only" in r.observation
    before = env.evaluate()
    env.execute("p = apis.supervisor.show_profile(); p['email'] = 'x'", "<cell-2>")
    assert env.evaluate() == before


def test_call_records_count_agent_functions_and_their_errors():
    env = _env()
    env.execute("def lib(n):\n    if n < 0:\n        raise ValueError(n)\n    return n\n", "<skill:lib>")
    code = (
        "def twice(n):\n    return lib(n) + lib(n)\n\n"
        "def safe(n):\n    try:\n        return lib(n)\n    except ValueError:\n        return 0\n\n"
        "twice(1)\nsafe(-1)\n[lib(i) for i in range(3)]\ntwice(-1)\n"
    )
    r = env.execute(code, "<cell-2>")
    assert not r.ok and "ValueError: -1" in r.observation
    got = {(c.name, c.origin): (c.calls, c.errors) for c in r.calls}
    # lib: 2 (twice(1)) + 1 (safe) + 3 (comprehension) + 1 (twice(-1), raises) = 7 calls, 2 raised
    assert got == {
        ("lib", "<skill:lib>"): (7, 2),
        ("twice", "<cell-2>"): (2, 1),
        ("safe", "<cell-2>"): (1, 0),
    }
    assert next(c for c in r.calls if c.name == "lib").from_library


def test_defined_reports_redefinitions_but_not_untouched_functions():
    env = _env()
    assert env.execute("def f():\n    return 1\n\ndef g():\n    return 2\n", "<cell-1>").defined == (
        "f",
        "g",
    )
    assert env.execute("def f():\n    return 3\n", "<cell-2>").defined == ("f",)
    assert env.execute("print(f() + g())", "<cell-3>").defined == ()
