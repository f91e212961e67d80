"""The paper's recipe end to end (expert collection -> SFT -> SAGE, evaluated before and after each
stage): ``pipeline`` runs it through the commands' run functions (``sage_rl/runs/``), ``report``
writes what each stage changed. ``sage-rl recipe`` runs it. docs/recipe.md."""

from sage_rl.recipe.pipeline import Layout, RecipeError, eval_config, evaluate, run

__all__ = ["Layout", "RecipeError", "eval_config", "evaluate", "run"]
