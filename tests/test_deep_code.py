"""Issue 30, item 1: the run survives any model output. A degenerate reply nested thousands of
levels deep (``x = ------...1``, or ``~~~...1`` without a fence) made ``ast.parse`` raise
``RecursionError`` on Python 3.11, and a tree a few hundred levels deep broke the recursive walks
(``ast.unparse`` in skill extraction): one such reply ended rollouts, ``sage-rl eval`` and
``sage-rl view``. Now it is that turn's own failure (agent/syntax.py)."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import random
import warnings

from fakes import FakeEnv
from test_episode import TASK, DefiningSuite, OneEnvSuite, ScriptPolicy, _runner

from sage_rl.agent.parse import CodeSource, parse_reply
from sage_rl.agent.syntax import MAX_DEPTH, TOO_DEEP, CodeError, parse_code
from sage_rl.policies.base import Completion
from sage_rl.rollout.batch import RolloutConfig, rollout_batch, to_samples
from sage_rl.rollout.episode import AgentConfig
from sage_rl.skills.extract import SavePolicy, extract_skills
from sage_rl.skills.library import Library
from sage_rl.skills.record import SkillError, make_skill
from sage_rl.skills.static import CallSimulator, global_calls, parse_cell
from sage_rl.skills.usage import used_skills_static
from sage_rl.text import dumps
from sage_rl.types import CallRecord, ExecResult, StopReason

DASHES = "x = " + "-" * 3000 + "1"  # ~50 SmolLM2 tokens
TILDES = "~" * 3000 + "1"
DEEP_DEF = "def g():\n    return " + "-" * 500 + "1"  # parses on 3.11; too deep for ast.unparse
FENCED = f"```python\n{DASHES}\n```"


def test_parse_code_never_raises_and_bounds_the_depth():
    for text in (DASHES, TILDES, DEEP_DEF):
        error = parse_code(text)
        assert isinstance(error, CodeError) and error.too_deep and error.message == TOO_DEEP
    for text in ("x = (", "x = 1\x00"):
        error = parse_code(text)
        assert isinstance(error, CodeError) and not error.too_deep
    # Module > Expr > k UnaryOps > (USub, Constant): k + 3 levels
    assert not isinstance(parse_code("-" * (MAX_DEPTH - 3) + "1"), CodeError)
    assert isinstance(parse_code("-" * (MAX_DEPTH - 2) + "1"), CodeError)


def test_the_parsers_warnings_neither_print_nor_refuse_code_python_runs():
    """``1if`` warns "invalid decimal literal" and ``"\\d"`` "invalid escape sequence": noise on the
    trainer's stderr, and a SyntaxError under ``-W error`` for code the interpreter runs."""
    for text in ('x = 1if True else 2', 's = "\\d"'):
        with warnings.catch_warnings(record=True) as shown:
            warnings.simplefilter("always")
            assert isinstance(parse_code(text), ast.Module)
        assert shown == []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert isinstance(parse_code(text), ast.Module)


def test_every_accepted_tree_survives_the_recursive_walks():
    """At the bound, a skill is still made (ast.unparse, NodeTransformer, ast.dump all recurse)."""
    bodies = {"unary": ("-", "1", ""), "lists": ("[", "1", "]"), "calls": ("h(", "1", ")")}
    for open_, leaf, close in bodies.values():
        k = 1
        while not isinstance(parse_code(_nested(open_, leaf, close, k + 1)), CodeError):
            k += 1
        skill = make_skill(_nested(open_, leaf, close, k))  # the deepest accepted: no RecursionError
        assert skill.name == "g"
    try:
        make_skill(DEEP_DEF)
    except SkillError as e:
        assert "nests more than" in str(e)
    else:
        raise AssertionError("a skill too deep to analyse was made")


def _nested(open_: str, leaf: str, close: str, k: int) -> str:
    return "def g():\n    return " + open_ * k + leaf + close * k


def test_a_degenerate_bare_reply_is_no_code_and_a_fenced_one_is_code():
    assert parse_reply(DASHES).source is CodeSource.NONE
    assert parse_reply(TILDES).source is CodeSource.NONE
    assert parse_reply(FENCED).code == DASHES


def test_static_usage_and_the_simulator_skip_the_cell_and_go_on():
    library = Library.of([make_skill("def f():\n    return 1")])
    assert parse_cell(DASHES) is None and parse_cell(TILDES) is None
    assert used_skills_static([DASHES, TILDES, DEEP_DEF, "f()"], library) == {"f"}


def test_long_call_chains_need_no_recursion():
    n = 1500  # above the recursion limit of 1,000
    chain = "\n".join(f"def f{i}():\n    f{i + 1}()" for i in range(n)) + f"\ndef f{n}():\n    pass\nf0()"
    called = CallSimulator({}).run_cell(0, parse_cell(chain))
    assert [b.name for b in called] == [f"f{i}" for i in range(n + 1)]
    siblings = "".join(f"    def a{i}():\n        a{i + 1}()\n" for i in range(n))
    outer = parse_cell(f"def outer():\n{siblings}    def a{n}():\n        g()\n    a0()").body[0]
    assert global_calls(outer) == {"g"}


def _cell(defs: dict[str, str], raising: set[str]) -> tuple[str, ExecResult]:
    code = "\n".join(f"def {n}(d=0):\n    return {body}" for n, body in defs.items())
    code += "\n" + "\n".join(f"{n}()" for n in defs)
    calls = tuple(CallRecord(n, "<cell-0>", 1, int(n in raising)) for n in defs)
    return code, ExecResult("", False, calls=calls, defined=tuple(defs))


def test_extraction_drops_every_user_of_a_helper_it_cannot_save():
    """By hand: c raised (not saved); b uses c and a uses b, so both go; d uses e, which the
    library holds, so d stays; f uses nothing. Then a chain of 400 helpers whose root raised
    saves nothing (a pass per drop re-read every winner: 15 s for 1,000)."""
    defs = {"a": "b()", "b": "c()", "c": "1 / 0", "d": "e()", "f": "d"}
    lib = Library([make_skill("def e():\n    return 1")])
    saved = extract_skills([_cell(defs, {"c"})], origins=["<cell-0>"], library=lib)
    assert [s.name for s in saved] == ["d", "f"]
    n = 400
    chain = {f"h{i}": f"d and h{i - 1}(d - 1)" if i else "1 / 0" for i in reversed(range(n))}
    assert extract_skills([_cell(chain, {"h0"})], origins=["<cell-0>"]) == []
    chain["h0"] = "d"
    assert len(extract_skills([_cell(chain, set())], origins=["<cell-0>"])) == n


def test_extraction_skips_what_it_cannot_analyse_and_keeps_the_rest():
    cells = [
        (DASHES, ExecResult("", True)),
        (DEEP_DEF + "\ng()", ExecResult("", True, calls=(CallRecord("g", "<cell-1>", 1, 0),), defined=("g",))),
        ("def h():\n    return 1\nh()", ExecResult("", True, calls=(CallRecord("h", "<cell-2>", 1, 0),), defined=("h",))),
    ]  # fmt: skip
    for policy in (SavePolicy.DEFINED, SavePolicy.CALLED_OK):
        saved = extract_skills(cells, policy=policy, origins=["<cell-0>", "<cell-1>", "<cell-2>"])
        assert [s.name for s in saved] == ["h"]


def test_the_episode_answers_with_a_parse_error_and_the_turn_counts():
    policy = ScriptPolicy(
        [FENCED, DASHES, TILDES, f"```python\n{DEEP_DEF}\ng()\n```", "```python\ncomplete()\n```"]
    )
    env = FakeEnv()
    runner = _runner(policy, OneEnvSuite(env), agent=AgentConfig(max_steps=6))
    chain = asyncio.run(runner.run((TASK,), Library()))
    (traj,) = chain.trajectories
    assert traj.stop is StopReason.COMPLETED and traj.outcome.success and len(traj.turns) == 5
    deep, bare, tilde, deep_def, last = traj.turns
    assert deep.code == DASHES and deep.observation == TOO_DEEP and not deep.result.ok
    assert bare.code is None and tilde.code is None and not bare.result.ok
    assert deep_def.observation == TOO_DEEP and traj.skills_saved == ()
    assert env.cells == [("<cell-4>", "complete()")]  # nothing too deep reached the environment
    assert policy.requests[1].messages[-1] == {"role": "user", "content": TOO_DEEP}


class OneDeepReplyPolicy:
    """The first turn of chain 0's first task is the degenerate reply; everything else solves
    the task with a skill (as test_episode.SkillPolicy)."""

    renderer = None
    name = "deep-once"

    def __init__(self) -> None:
        self.sent = False

    async def generate(self, request):
        if not self.sent:
            self.sent = True
            return Completion(FENCED, completion_tokens=50)
        if "def f()" in request.messages[1]["content"]:
            return Completion("```python\nf()\ncomplete()\n```", completion_tokens=5)
        return Completion("```python\ndef f():\n    return 1\nf()\ncomplete()\n```", completion_tokens=5)


def test_one_degenerate_reply_fails_one_turn_not_the_batch():
    cfg = RolloutConfig(chain_length=2, group_size=2, groups_per_step=2)
    groups = asyncio.run(rollout_batch(_runner(OneDeepReplyPolicy(), DefiningSuite()), random.Random(0), cfg))
    trajs = [t for g in groups for c in g for t in c.trajectories]
    assert len(trajs) == 8 and all(t.stop is StopReason.COMPLETED for t in trajs)
    assert sum(t.turns[0].observation == TOO_DEEP for t in trajs) == 1
    assert len(to_samples(groups, cfg)) == 8


def test_the_viewer_shows_a_run_with_such_code(tmp_path):
    from sage_rl.view import build_html

    policy = ScriptPolicy([FENCED, "```python\ncomplete()\n```"])
    chain = asyncio.run(_runner(policy, OneEnvSuite(FakeEnv())).run((TASK,), Library()))
    # and a run written before this fix, where a too-deep definition ran and was saved
    (traj,) = chain.trajectories
    ran = dataclasses.replace(traj.turns[0], code=DEEP_DEF, result=ExecResult("", True, defined=("g",)))
    old = dataclasses.replace(traj, turns=(ran, *traj.turns[1:]), skills_saved=("g",))
    old_chain = dataclasses.replace(chain, group_index=1, trajectories=(old,))
    run = tmp_path / "eval"
    run.mkdir()
    (run / "trajectories.same_scenario.jsonl").write_text(
        "".join(dumps(c) + "\n" for c in (chain, old_chain))
    )
    html, _ = build_html(run)
    assert "nests more than" in html and html.count('<details class="traj') == 2
