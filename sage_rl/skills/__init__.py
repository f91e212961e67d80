"""Skill records, AST extraction and usage detection, the in-memory library, the SQLite store and
retrieval (issue 4; docs/skills.md)."""

from sage_rl.skills.extract import SavePolicy, extract_skills
from sage_rl.skills.library import AddResult, AddStatus, Library, PreambleCell, approx_tokens
from sage_rl.skills.record import Provenance, Skill, SkillError, Tier, make_skill
from sage_rl.skills.usage import SkillCredit, used_skills, used_skills_from_calls, used_skills_static

__all__ = [
    "AddResult",
    "AddStatus",
    "Library",
    "PreambleCell",
    "Provenance",
    "SavePolicy",
    "Skill",
    "SkillCredit",
    "SkillError",
    "Tier",
    "approx_tokens",
    "extract_skills",
    "make_skill",
    "used_skills",
    "used_skills_from_calls",
    "used_skills_static",
]
