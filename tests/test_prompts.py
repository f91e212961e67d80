from sage_rl.agent.prompts import PromptBuilder, WorkedExample
from sage_rl.types import Task

TASK = Task("x_1", "x", 1, "Do X.", "dev")


def test_skill_agent_prompt_has_every_section():
    ex = WorkedExample("Say hi.", ("def hi() -> None:\n    print('hi')\nhi()",))
    system, user = PromptBuilder(example=ex, max_steps=7).messages(TASK, "def f(a: int) -> int: ...")
    assert system["role"] == "system" and user["role"] == "user"
    assert "apis.api_docs.show_api_doc" in system["content"]
    assert "complete_task" in system["content"] and "at most 7 steps" in system["content"]
    assert "# Skills" in system["content"]
    assert user["content"].index("# Example") < user["content"].index("# Skill library")
    assert user["content"].index("# Skill library") < user["content"].index("# Your task")
    assert "def f(a: int) -> int: ..." in user["content"]
    assert user["content"].rstrip().endswith("Do X.")


def test_empty_library_is_said():
    _, user = PromptBuilder().messages(TASK)
    assert "The library is empty." in user["content"]


def test_plain_codeact_variant_shares_everything_but_skills():
    skill_sys, skill_user = PromptBuilder().messages(TASK, "def f(): ...")
    plain_sys, plain_user = PromptBuilder(use_skills=False).messages(TASK, "def f(): ...")
    assert "# Skills" not in plain_sys["content"] and "Skill library" not in plain_user["content"]
    assert skill_sys["content"].startswith(plain_sys["content"])
    assert plain_user["content"] == "# Your task\nDo X."
