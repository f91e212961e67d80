"""A scripted expert for PocketWorld that writes skill-format trajectories (issue 5).

It plays the paper's expert role (Claude in SAGE.md section 7) on PocketWorld: it may look up
docs, then defines typed, documented functions and calls them in the same cell (Generate), or
only calls them when the library already holds them (Use), then completes the task. Its source
of truth is each template's reference skill (``Template.full_skill_source`` and
``call_code(params)``), so its trajectories solve the task through public APIs only.

What it knows comes from PocketWorld and from what any policy sees: the task is looked up by the
request's ``task_id`` in PocketWorld's own task registry (the hidden ``spec`` never travels in a
request), and the library is the one the prompt lists in its "# Skill library" section, exactly
the skills that loaded into the task's interpreter.

Seeded variation keeps expert data from being one string repeated: the skill names (one choice
per scenario, so a chain's tasks agree), the number and choice of doc lookups, and whether the
answer is computed and submitted in one cell or two. ``fail_rate`` makes it give up on some
tasks (it completes without doing the work): what rejection sampling must filter out.

``inline=True`` is the library-free expert of the paper's GRPO baseline (issue 27): the same doc
lookups and API calls with every skill's body inlined where it is called, and no ``def``.
"""

from __future__ import annotations

import ast
import functools
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sage_rl.envs.pocketworld.inline import inline_solution
from sage_rl.envs.pocketworld.scenarios.base import COMMON_NAMES, stable_seed
from sage_rl.envs.pocketworld.tasks import task_by_id, template_of
from sage_rl.types import Completion, PolicyRequest

#: A task rebuilt from its id, once: the expert reads it every turn, and a build is a world (or
#: several, for a template that rejects worlds) plus its sampling.
_task = functools.lru_cache(maxsize=4096)(task_by_id)
#: Interchangeable leading verbs for seeded renaming of skills.
_VERBS = ("get", "fetch", "find", "list", "collect")
_COMMON_VARIANTS = {
    "login_to": ("login_to", "get_access_token", "app_login"),
    "fetch_all": ("fetch_all", "collect_pages", "all_pages"),
}
_API_REF = re.compile(r"apis\.(\w+)\.(\w+)\(")
_LIBRARY_HEADER = "# Skill library"
_DEF = re.compile(r"^def (\w+)\(", re.MULTILINE)


class ScriptedExpert:
    """``Policy`` for PocketWorld tasks: reads ``request.task_id`` and the prompt's library."""

    renderer = None

    def __init__(
        self, seed: int = 0, fail_rate: float = 0.0, token_counter: Any = None, inline: bool = False
    ) -> None:
        self.seed, self.fail_rate, self.inline = seed, fail_rate, inline
        self.name = f"scripted-expert(seed={seed}{', inline' if inline else ''})"
        self._count = token_counter  # optional callable text -> tokens, for honest token metrics

    def weights_changed(self) -> None:
        """Nothing to do: a script has no weights (``Policy``)."""

    async def generate(self, request: PolicyRequest) -> Completion:
        try:
            task = _task(request.task_id)
        except KeyError as e:
            raise ValueError(f"ScriptedExpert plays PocketWorld tasks only: {e.args[0]}") from None
        cells = self.plan(task, library_names(request.messages))
        turn = sum(m["role"] == "assistant" for m in request.messages)
        code = cells[min(turn, len(cells) - 1)]
        text = f"```python\n{code.rstrip()}\n```"
        return Completion(text=text, completion_tokens=self._count(text) if self._count else 0)

    def plan(self, task, library: tuple[str, ...]) -> list[str]:
        """The cells this expert writes for ``task`` given the library's skill names."""
        rng = random.Random(stable_seed("expert", self.seed, task.task_id))
        template, params = template_of(task), task.spec["params"]
        if rng.random() < self.fail_rate:
            return ["apis.supervisor.complete_task()"]
        if self.inline:  # library-free: the same lookups and API calls, no def (envs/pocketworld/inline.py)
            return self._lookups(template, rng) + _solve_inline(template.full_skill_source, template.call_code(params), rng)
        names = self.names(template, task.scenario_id)
        call = _rename(template.call_code(params), names)
        cells = self._lookups(template, rng) if not set(names.values()) <= set(library) else []
        missing = [n for n in template.all_skill_names if names[n] not in library]
        define = _rename(_source_of(template, missing), names) if missing else ""
        cells += _solve(define, call, rng)
        return cells

    def names(self, template, scenario_id: str) -> dict[str, str]:
        """Seeded, per-scenario names for the template's skills (identity for some scenarios)."""
        rng = random.Random(stable_seed("names", self.seed, scenario_id))
        out = {n: rng.choice(v) for n, v in _COMMON_VARIANTS.items()}
        for name in template.skill_names:
            verb, _, rest = name.partition("_")
            out[name] = f"{rng.choice(_VERBS)}_{rest}" if verb in _VERBS and rest else name
        return out

    @staticmethod
    def _lookups(template, rng: random.Random) -> list[str]:
        apis = sorted(set(_API_REF.findall(template.skill_source)) - {("supervisor", "complete_task")})
        cells = []
        if rng.random() < 0.5:
            app = rng.choice(template.apps)
            cells.append(f"print(apis.api_docs.show_api_descriptions(app_name={app!r}))")
        if apis and rng.random() < 0.6:
            app, api = rng.choice(apis)
            cells.append(f"print(apis.api_docs.show_api_doc(app_name={app!r}, api_name={api!r}))")
        return cells


def library_names(messages: Sequence[Mapping[str, str]]) -> tuple[str, ...]:
    """The skills the prompt's library section lists (the functions defined at its top level)."""
    opening = next((m["content"] for m in messages if m["role"] == "user"), "")
    _, found, rest = opening.partition(_LIBRARY_HEADER)
    section = rest.split("\n# ", 1)[0] if found else ""
    return tuple(_DEF.findall(section))


def _source_of(template, names: list[str]) -> str:
    """The definitions of ``names`` (a subset of the template's skills), in source order."""
    full = template.full_skill_source
    tree = ast.parse(full)
    keep = [
        n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) or n.name in names
    ]
    return "\n\n\n".join(ast.get_source_segment(full, n, padded=False) for n in keep)


def _rename(code: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        if old != new:
            code = re.sub(rf"\b{re.escape(old)}\b", new, code)
    return code


def _solve(define: str, call: str, rng: random.Random) -> list[str]:
    """Define (if needed) and call; sometimes print the answer first and submit it next turn."""
    answer = _answer_expr(call)
    if answer is not None and rng.random() < 0.5:
        compute = f"answer = {answer}\nprint(answer)"
        first = f"{define}\n\n\n{compute}" if define else compute
        return [first, "apis.supervisor.complete_task(answer=answer)"]
    return [f"{define}\n\n\n{call}" if define else call]


def _solve_inline(source: str, call: str, rng: random.Random) -> list[str]:
    """``_solve`` without a library: the skills' bodies inlined where they are called."""
    answer = _answer_expr(call)
    if answer is not None and rng.random() < 0.5:
        compute = inline_solution(source, f"answer = {answer}\nprint(answer)")
        return [compute, "apis.supervisor.complete_task(answer=answer)"]
    return [inline_solution(source, call)]


def _answer_expr(call: str) -> str | None:
    """``X`` when ``call`` is exactly ``apis.supervisor.complete_task(answer=X)``."""
    try:
        tree = ast.parse(call)
    except SyntaxError:
        return None
    if (
        len(tree.body) != 1
        or not isinstance(tree.body[0], ast.Expr)
        or not isinstance(tree.body[0].value, ast.Call)
    ):
        return None
    node = tree.body[0].value
    if ast.unparse(node.func) != "apis.supervisor.complete_task" or node.args:
        return None
    kws = {k.arg: k.value for k in node.keywords}
    return ast.unparse(kws["answer"]) if set(kws) == {"answer"} else None


__all__ = ["ScriptedExpert", "COMMON_NAMES", "library_names"]
