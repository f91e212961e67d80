"""The paper's recipe end to end (expert collection -> SFT -> SAGE, evaluated before and after each
stage): ``pipeline`` runs it, ``report`` writes what each stage changed. docs/recipe.md."""

from sage_rl.recipe.pipeline import Layout, RecipeError, applies, eval_config, evaluate, run

__all__ = ["Layout", "RecipeError", "applies", "eval_config", "evaluate", "run"]
