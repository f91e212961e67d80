"""A property-based fuzz of the rollout path (hypothesis): one odd reply must not end a run,
corrupt what it leaves behind, leak into another episode, or be paid more by a stricter rule.

Each example is a chain of two PocketWorld tasks of one scenario, played through the project's own
``ChainRunner``, the real sandbox and the real SmolLM2 tokenizer by the scripted expert whose
replies are mutated: cut anywhere, hostile or odd cells inserted (agent code that prints a lone
surrogate, submits odd answers, rebinds names the sandbox relies on, defines skills no record can
hold...), line-breaking and fence characters spliced in, fences rewritten, replies repeated,
definitions renamed. The expert's skills are saved by the first task and loaded by the second, so
hostile definitions travel through extraction, the library and its load.

What must hold, whatever the replies:

- the chain ends as data: every task stops for a reason of its own (completed, a step, token or
  context limit), never an environment or policy failure;
- tokens are exact: each request continues exactly the recorded sequence, each observation's ids
  are the renderer's for its text, and the trained mask covers exactly the sampled ids;
- the chain reads back from its JSON line (the step journal's) as the same chain, with the same
  rewards;
- rewards are finite, and the three credit rules nest (``flow`` credits a subset of ``api``'s
  skills, ``api`` of ``paper``'s; rewards in that order) with the same outcomes and libraries;
- a clean chain played after the fuzzed ones gives exactly what it gave before them, and the
  fuzzed chain played again gives the same outcomes, libraries, credit and rewards (what
  ``benchmarks/credit_replay.py`` relies on).

The suite runs a few dozen derandomized examples. For a long hunt (random, failures kept in
``.hypothesis/`` and replayed first next time)::

    SAGE_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/test_fuzz_rollout.py
"""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from sage_rl.agent.render import ChatRenderer
from sage_rl.build import build_runner
from sage_rl.config import load_config
from sage_rl.envs.pocketworld.env import PocketWorldSuite
from sage_rl.envs.pocketworld.expert import ScriptedExpert
from sage_rl.envs.pocketworld.sandboxed import SandboxExecutors
from sage_rl.models import load_tokenizer
from sage_rl.policies.base import Completion
from sage_rl.rollout.batch import chain_rewards
from sage_rl.settings import TrainConfig
from sage_rl.skills import Library
from sage_rl.text import dumps, valid_text
from sage_rl.types import Chain, StopReason

FUZZ = fuzz(12)
CREDITS = ("paper", "api", "flow")  # strictest last
POLICY_STOPS = {
    StopReason.COMPLETED,
    StopReason.STEP_LIMIT,
    StopReason.TOKEN_BUDGET,
    StopReason.CONTEXT_LIMIT,
}

#: Cells inserted into replies: each once stopped a run, broke a record, or probes a layer.
SNIPPETS = {
    "surrogate": "print(chr(0xd800))",
    "nul": "print('\\x00' * 5)",
    "exit": "raise SystemExit",
    "sys_exit": "import sys\nsys.exit()",
    "import_os": "import os",
    "rebind_error": "def ApiError():\n    pass",
    "rebind_apis": "apis = None",
    "rebind_print": "def print(*a):\n    pass",
    "del_apis": "del apis",
    "clear_globals": "globals().clear()",
    "builtins": "__builtins__ = {}",
    "recursion": "def f():\n    return f()\nf()",
    "big_print": "print('x' * 300000)",
    "zero_div": "print(1/0)",
    "yield_outside": "yield 1",
    "deep": "(" * 150 + "1" + ")" * 150,
    "exec": "exec('1')",
    "read_file": "open('/etc/passwd')",
    "answer_surrogate": "apis.supervisor.complete_task(answer=chr(0xd800))",
    "answer_nan": "apis.supervisor.complete_task(answer=float('nan'))",
    "answer_big": "apis.supervisor.complete_task(answer=[1] * 100000)",
    "answer_object": "apis.supervisor.complete_task(answer=object())",
    "answer_huge_int": "apis.supervisor.complete_task(answer=10**5000)",
    "answer_none": "apis.supervisor.complete_task()",
    "answer_eq": "class C:\n    def __eq__(s, o):\n        return True\napis.supervisor.complete_task(answer=C())",
    "fake_complete": "def complete_task(**k):\n    return 1",
    "decorated": "@staticmethod\ndef h():\n    return 1",
    "odd_doc": "def k(*a, **kw):\n    '''\"\"\" odd \\u2028 doc'''\n    return apis.supervisor.show_profile()",
    "mutable_default": "def z(x=[]):\n    x.append(1)\n    return len(x)\nz()",
    "odd_doc_args": "print(apis.api_docs.show_api_doc(app_name=chr(0), api_name='x' * 10000))",
    "unicode_name": "def \u00e9t\u00e9():\n    return 1\n\u00e9t\u00e9()",
    "long_name": "def a" + "b" * 300 + "():\n    return 1\na" + "b" * 300 + "()",
    "uses_global": "n = 3\ndef g():\n    return n + len(apis.supervisor.show_profile())\ng()",
    "inf_json": "import json\nprint(json.dumps({'a': float('inf')}))",
    "tabs": "if True:\n\tx = 1\n        y = 2",
    "return_outside": "return 1",
    "self_key": "x = {}\nx[x] = 1",
}
ODD = ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\x00", "\ufeff", "\r", "\r\n", "\t", "```",
       "<code>", "</code>", "```python\n", "\n```\n", "'''", '"', "\\", "\ud800", "\U0001f600", " " * 200]  # fmt: skip
FENCES = ["```py", "```", "<code>", "``` python", "```Python", "```js", ""]
RENAMES = ["async def ", "def _", "def ApiError", "def __init__", "def print", "def apis", "class "]

OP = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("insert"), st.sampled_from(sorted(SNIPPETS)), st.floats(0, 1)),
    st.tuples(st.just("splice"), st.sampled_from(ODD) | st.text(max_size=3), st.floats(0, 1)),
    st.tuples(st.just("fence"), st.sampled_from(FENCES)),
    st.tuples(st.just("repeat"), st.integers(2, 3)),
    st.tuples(st.just("rename"), st.sampled_from(RENAMES)),
    st.tuples(st.just("prose"), st.text(max_size=20)),
)
#: One list of mutations per reply, cycled over the chain's replies; and whether a reply ends on
#: the end-of-turn token (sampling stopped) or is cut by length.
REPLIES = st.lists(st.tuples(st.lists(OP, max_size=4), st.booleans()), min_size=1, max_size=4)


def mutate(text: str, ops) -> str:
    for op, *args in ops:
        at = round(args[-1] * len(text)) if isinstance(args[-1], float) else 0
        if op == "cut":
            text = text[:at]
        elif op == "insert":  # at a line start
            lines = text.split("\n")
            lines.insert(round(args[1] * len(lines)), SNIPPETS[args[0]])
            text = "\n".join(lines)
        elif op == "splice":
            text = text[:at] + args[0] + text[at:]
        elif op == "fence":
            text = text.replace("```python", args[0])
        elif op == "repeat":
            text *= args[0]
        elif op == "rename":
            text = text.replace("def ", args[0], 1)
        elif op == "prose":
            text = f"Here is my code: {args[0]}\n{text}\nDone."
    return text


class FuzzedExpert:
    """The scripted expert's replies, mutated, as a token-exact backend gives them: ids the real
    tokenizer makes of the text, cut to the turn's room, the text decoded from the ids."""

    name = "fuzzed-expert"

    def __init__(self, tok, replies, seed: int = 0) -> None:
        self.tok, self.renderer, self.replies = tok, ChatRenderer(tok), replies
        self.expert, self.n = ScriptedExpert(seed=seed), 0
        self.seen: list[tuple[int, ...]] = []  # the sequence each request continued
        self.sampled: dict[str, int] = {}  # generated ids per task

    def weights_changed(self) -> None:
        pass

    async def generate(self, request) -> Completion:
        ops, stopped = self.replies[self.n % len(self.replies)]
        self.n += 1
        self.seen.append(tuple(request.prompt_ids))
        text = valid_text(mutate((await self.expert.generate(request)).text, ops))  # a decoder's text
        ids = self.tok.encode(text, add_special_tokens=False)
        ids = (ids + [self.renderer.eot_id] if stopped else ids)[: request.params.max_tokens]
        text = self.tok.decode([i for i in ids if i != self.renderer.eot_id])
        self.sampled[request.task_id] = self.sampled.get(request.task_id, 0) + len(ids)
        return Completion(text, tuple(ids), (-0.5,) * len(ids), completion_tokens=len(ids))


class World:
    """One suite on the module's sandbox, one config per credit rule, and a clean chain's record."""

    def __init__(self, sandbox) -> None:
        self.suite = PocketWorldSuite(SandboxExecutors(sandbox))
        self.tok = load_tokenizer()
        self.cfgs = {
            c: load_config(TrainConfig, None, ["agent.max_steps=4", f"skills.credit={c}"]) for c in CREDITS
        }
        self.clean = self.suite.sample_chain(random.Random(0), 2)
        self.clean_record = self.play_clean()

    def play(self, replies, tasks, credit: str = "flow", seed: int = 0) -> tuple[Chain, FuzzedExpert]:
        policy = FuzzedExpert(self.tok, replies, seed)
        runner = build_runner(self.cfgs[credit], policy, self.suite)
        return asyncio.run(runner.run(tasks, Library())), policy

    def play_clean(self):
        chain, _ = self.play([([], True)], self.clean)
        return chain_rewards(chain, self.cfgs["flow"].rollout), [
            (t.outcome, t.stop, t.library_in, t.skills_used, [u.observation for u in t.turns])
            for t in chain.trajectories
        ]


@pytest.fixture(scope="module")
def world(sandbox) -> World:
    return World(sandbox)


@FUZZ
@given(seed=st.integers(0, 2**20), replies=REPLIES)
def test_a_fuzzed_chain_ends_as_data_with_exact_tokens_and_reads_back(world, seed, replies):
    tasks = world.suite.sample_chain(random.Random(seed), 2)
    chain, policy = world.play(replies, tasks, seed=seed)
    seen = iter(policy.seen)
    for traj in chain.trajectories:
        assert traj.stop in POLICY_STOPS, (traj.stop, traj.error)
        prefix = list(traj.prompt_ids)
        for turn in traj.turns:
            assert list(next(seen)) == prefix  # the policy continued exactly the recorded sequence
            assert list(turn.obs_ids) == policy.renderer.observation_ids(turn.observation, turn.gen_ids)
            prefix += [*turn.gen_ids, *turn.obs_ids]
        ids, mask, _ = traj.token_arrays()
        assert ids == prefix
        assert [i for i, m in zip(ids, mask, strict=True) if m] == [i for t in traj.turns for i in t.gen_ids]
        assert sum(mask) == policy.sampled.get(traj.task.task_id, 0)
    line = dumps(chain)
    assert "\n" not in line
    again = Chain.from_dict(json.loads(line))
    assert again == chain
    rewards = chain_rewards(chain, world.cfgs["flow"].rollout)
    assert chain_rewards(again, world.cfgs["flow"].rollout) == rewards
    assert all(math.isfinite(r) for r in rewards)
    assert world.play_clean() == world.clean_record  # nothing of the fuzzed chain reached a later one
    replay = world.play(replies, tasks, seed=seed)[0]  # the same replies again (benchmarks/credit_replay.py)
    assert _record(replay) == _record(chain) and chain_rewards(replay, world.cfgs["flow"].rollout) == rewards


def _record(chain: Chain) -> list[tuple]:
    """What a replay must give again (observations may hold addresses: ``<object at 0x...>``)."""
    return [
        (
            t.outcome,
            t.stop,
            t.library_in,
            t.library_dropped,
            t.skills_saved,
            t.skills_used,
            [u.code for u in t.turns],
        )
        for t in chain.trajectories
    ]


@FUZZ
@given(seed=st.integers(0, 2**20), replies=REPLIES)
def test_a_stricter_credit_rule_never_pays_more_on_fuzzed_chains(world, seed, replies):
    tasks = world.suite.sample_chain(random.Random(seed), 2)
    chains = [world.play(replies, tasks, credit, seed)[0] for credit in CREDITS]
    rewards = [
        chain_rewards(c, world.cfgs[credit].rollout) for c, credit in zip(chains, CREDITS, strict=True)
    ]
    for k in range(len(tasks)):
        paper, api, flow = (c.trajectories[k] for c in chains)
        assert paper.outcome == api.outcome == flow.outcome
        assert paper.library_in == api.library_in == flow.library_in
        assert set(flow.skills_used) <= set(api.skills_used) <= set(paper.skills_used)
        assert rewards[2][k] <= rewards[1][k] <= rewards[0][k]
