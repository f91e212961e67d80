"""Prompt assembly from Jinja2 templates in files (``sage_rl/agent/prompts/*.j2``).

The system message explains the world and, for the skill-library agent, the skill operations
(SAGE.md section 1). The first user message holds a worked example (from a *train* scenario
only), the skill library section, the task's context (``Task.context``: what the agent is meant
to know besides the instruction, e.g. who its supervisor is) and the task. The plain CodeAct
variant (the GRPO baseline, SAGE.md section 6) renders the same templates with
``use_skills=False``.

Template variables: ``use_skills``, ``max_steps``, ``example``, ``library``, ``context`` (a
mapping, empty for PocketWorld), ``instruction``. A suite may bring its own template folder
(``Suite.prompt_dir``) with the same files and variables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jinja2

from sage_rl.types import Task

DEFAULT_TEMPLATES = Path(__file__).parent / "prompts"


@dataclass(frozen=True)
class WorkedExample:
    """A solved task shown in the prompt. Must come from a train scenario (never an eval split)."""

    instruction: str
    steps: tuple[str, ...]


@dataclass(frozen=True)
class PromptBuilder:
    use_skills: bool = True
    max_steps: int = 40
    example: WorkedExample | None = None
    template_dir: Path = DEFAULT_TEMPLATES

    def _env(self) -> jinja2.Environment:
        return jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.template_dir)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=False,
            trim_blocks=True,
        )

    def messages(self, task: Task, library: str = "") -> tuple[dict[str, str], ...]:
        """The opening [system, user] messages for ``task``. ``library`` is the rendered library
        (the skills that loaded into the task's interpreter)."""
        env = self._env()
        args = {
            "use_skills": self.use_skills,
            "max_steps": self.max_steps,
            "example": self.example,
            "library": library.strip(),
            "context": dict(task.context),
            "instruction": task.instruction.strip(),
        }
        system = env.get_template("system.j2").render(**args).strip()
        user = env.get_template("task.j2").render(**args).strip()
        return ({"role": "system", "content": system}, {"role": "user", "content": user})
