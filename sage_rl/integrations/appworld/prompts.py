"""AppWorld's versions of the agent's prompt templates (``prompts/*.j2`` beside this file).

Same files and variables as ``sage_rl/agent/prompts/`` (``use_skills``, ``max_steps``,
``example``, ``library``, ``instruction``, and ``context`` where the agent's builder passes it),
so ``PromptBuilder(template_dir=APPWORLD_PROMPTS)`` renders them unchanged. The system message
follows AppWorld's conventions: API discovery through the ``api_docs`` app, the supervisor's
details and passwords through the ``supervisor`` app, per-app ``login`` tokens, pagination,
contacts in the ``phone`` app, and ``apis.supervisor.complete_task(answer=..., status=...)``.

The task message names the supervisor (name, email, phone) and the world's date, as AppWorld's
protocol does, from the ``context`` variable: a mapping with the keys ``supervisor`` and ``date``
(``tasks.task_context``, filled into ``Task.context`` where the tasks are loaded).
"""

from __future__ import annotations

from pathlib import Path

from sage_rl.agent.prompts import PromptBuilder, WorkedExample

APPWORLD_PROMPTS = Path(__file__).parent / "prompts"


def prompt_builder(
    use_skills: bool = True, max_steps: int = 40, example: WorkedExample | None = None
) -> PromptBuilder:
    """The agent's ``PromptBuilder`` over the AppWorld templates."""
    return PromptBuilder(
        use_skills=use_skills, max_steps=max_steps, example=example, template_dir=APPWORLD_PROMPTS
    )
