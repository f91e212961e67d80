"""The call records' ``with_api`` and the parent's ``api_ok``, which the default skill credit reads
(issue 30, items 4 and 5): in the sandbox and in the in-process executor."""

from __future__ import annotations

from test_sandbox_support import FakeWorld

from sage_rl.types import CallRecord, skill_origin


def test_with_api_counts_returned_calls_that_made_a_successful_api_call(sandbox):
    """Worked out by hand: ``fetch`` is called 4 times: returns after an API call (1), raises after
    one (2), returns after a failed API call only (3), returns through ``inner`` (4); ``pure`` never
    calls an API; ``inner`` makes the successful call of call 4 and of ``run(inner)``; ``run`` is
    called 3 times: with a lambda of the task's (its API call is the task's, not the skill's), with
    a function of the task's (the same), with the library's ``inner`` (counts)."""
    world = FakeWorld()
    skill = (
        "def inner():\n    return apis.bank.balance()\n"
        "def fetch(mode):\n"
        "    if mode == 'ok':\n        return apis.bank.balance()\n"
        "    if mode == 'raise':\n        apis.bank.balance()\n        raise ValueError(mode)\n"
        "    if mode == 'failed':\n        try:\n            apis.bank.nope()\n        except ApiError:\n            return 0\n"
        "    return inner()\n"
        "def pure():\n    return 2\n"
        "def run(f):\n    return f()\n"
    )
    cell = (
        "fetch('ok')\ntry:\n    fetch('raise')\nexcept ValueError:\n    pass\n"
        "fetch('failed')\nfetch('nested')\npure()\n"
        "def mine():\n    return apis.bank.balance()\n"
        "run(lambda: apis.bank.balance())\nrun(mine)\nrun(inner)\nprint('done')"
    )

    async def go():
        # every call the world sees moves the fingerprint: each successful call is a change, numbered
        session = await sandbox.acquire(world.dispatch, lambda: len(world.log))
        try:
            await session.execute(skill, skill_origin("fetch"))
            return await session.execute(cell, "<cell-0>")
        finally:
            await session.close()

    import asyncio

    r = asyncio.run(go())
    assert r.observation == "done\n", r.observation
    recs = {rec.name: rec for rec in r.calls}
    # Every successful call changes the world here (changes 1-6 in order; the failed `nope` is none),
    # an effect of each library skill open while a skill's code made it (sandbox/flow.py): fetch's
    # ok, raise and nested calls (1, 2, 3); inner's two (3, and 6 through run); run's one (6).
    assert recs["fetch"] == CallRecord(
        "fetch", skill_origin("fetch"), calls=4, errors=1, with_api=2, effects=3, changes=(1, 2, 3)
    )
    assert recs["inner"] == CallRecord(
        "inner", skill_origin("fetch"), calls=2, errors=0, with_api=2, effects=2, changes=(3, 6)
    )
    assert recs["pure"] == CallRecord("pure", skill_origin("fetch"), calls=1, errors=0, with_api=0)
    assert recs["run"] == CallRecord(
        "run", skill_origin("fetch"), calls=3, errors=0, with_api=1, effects=1, changes=(6,)
    )
    assert recs["mine"] == CallRecord("mine", "<cell-0>", calls=1, errors=0, with_api=1)
    assert r.api_ok == 6  # ok, raise (its API call succeeded), nested, lambda, mine, inner; not nope


def test_in_process_executor_reports_the_same(tmp_path):
    """``pocketworld.sandbox=false`` (debugging): the same records, the same ``api_ok``."""
    import asyncio

    from sage_rl.envs.pocketworld.executor import InProcessExecutor

    world = FakeWorld()
    ex = InProcessExecutor(world.dispatch)

    async def go():
        await ex.execute(
            "def f():\n    return apis.bank.balance()\ndef g(h=None):\n    return h() if h else 2",
            skill_origin("f"),
        )
        refused = await ex.execute("f()\ng()\nimport gc", "<cell-0>")
        return refused, await ex.execute("f()\ng()\ng(lambda: apis.bank.balance())\ng(f)", "<cell-1>")

    refused, r = asyncio.run(go())
    assert refused.observation.startswith("RuleError: line 3: import of 'gc'")
    recs = {rec.name: rec for rec in r.calls}
    assert (recs["f"].calls, recs["f"].with_api, recs["g"].calls, recs["g"].with_api) == (2, 2, 3, 1)
    assert r.api_ok == 3


SUBMIT = "def submit():\n    return apis.supervisor.complete_task()\ndef both():\n    apis.bank.balance()\n    return submit()\n"


def test_submitting_the_task_does_no_work_for_with_api(sandbox):
    """``supervisor.complete_task`` (and ``api_docs``: tests/test_reward_credit.py) succeeds and
    counts in ``api_ok``, but makes no call ``with_api`` (``tracking.does_work``): every task
    submits, so a skill that only submits did nothing a task would not do without it. Both
    executors."""
    import asyncio

    from sage_rl.envs.pocketworld.executor import InProcessExecutor

    async def sandboxed():
        session = await sandbox.acquire(FakeWorld().dispatch)
        try:
            await session.execute(SUBMIT, skill_origin("submit"))
            return await session.execute("submit()\nboth()", "<cell-0>")
        finally:
            await session.close()

    async def in_process():
        ex = InProcessExecutor(FakeWorld().dispatch)
        await ex.execute(SUBMIT, skill_origin("submit"))
        return await ex.execute("submit()\nboth()", "<cell-0>")

    for r in (asyncio.run(sandboxed()), asyncio.run(in_process())):
        recs = {rec.name: (rec.calls, rec.errors, rec.with_api) for rec in r.calls}
        assert recs == {"submit": (2, 0, 0), "both": (1, 0, 1)}, r.observation
        assert r.api_ok == 3
