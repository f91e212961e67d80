"""AppWorld's versions of the agent's prompt templates (``prompts/*.j2`` beside this file).

Same files and variables as ``sage_rl/agent/prompts/`` (``use_skills``, ``max_steps``,
``example``, ``library``, ``instruction``, and ``context`` where the agent's builder passes it),
so ``PromptBuilder(template_dir=APPWORLD_PROMPTS)`` renders them unchanged. The system message
follows AppWorld's conventions: API discovery through the ``api_docs`` app, the supervisor's
details and passwords through the ``supervisor`` app, per-app ``login`` tokens, pagination,
contacts in the ``phone`` app, and ``apis.supervisor.complete_task(answer=..., status=...)``.

The task message names the supervisor (name, email, phone) and the world's date, as AppWorld's
protocol does, from the ``context`` variable: a mapping with the keys ``supervisor`` and ``date``
(``tasks.task_context``). ``task_messages`` renders it for a ``Task`` whatever the agent's builder
passes.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from sage_rl.agent.prompts import PromptBuilder, WorkedExample
from sage_rl.integrations.appworld.tasks import task_context
from sage_rl.types import Task

APPWORLD_PROMPTS = Path(__file__).parent / "prompts"


def prompt_builder(
    use_skills: bool = True, max_steps: int = 40, example: WorkedExample | None = None
) -> PromptBuilder:
    """The agent's ``PromptBuilder`` over the AppWorld templates."""
    return PromptBuilder(
        use_skills=use_skills, max_steps=max_steps, example=example, template_dir=APPWORLD_PROMPTS
    )


def task_messages(builder: PromptBuilder, task: Task, library: str = "") -> tuple[dict[str, str], ...]:
    """[system, user] for ``task``: the user message names the task's supervisor and date
    (``task.context`` where ``Task`` has it, else built from ``task.spec``)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(builder.template_dir)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )
    args = {
        "use_skills": builder.use_skills,
        "max_steps": builder.max_steps,
        "example": builder.example,
        "library": library.strip(),
        "instruction": task.instruction.strip(),
        "context": dict(getattr(task, "context", None) or task_context(task.spec)),
    }
    system = env.get_template("system.j2").render(**args).strip()
    user = env.get_template("task.j2").render(**args).strip()
    return ({"role": "system", "content": system}, {"role": "user", "content": user})
