"""The tile-embedding recipes by name (:mod:`pathtwt.models.embedding` pools them): the one
list the CLI's choices, the backbone specs and the features files read. Free of torch, so
the commands' parsers and the workflow can read it."""

from __future__ import annotations

from pathtwt.errors import PathtwtError

RECIPES = ("cls+mean", "cls")  # concat(CLS, mean patch) (the paper's), or the CLS token alone
DEFAULT_RECIPE = RECIPES[0]


def check_recipe(recipe: str) -> str:
    if recipe not in RECIPES:
        raise PathtwtError(f"embedding recipe {recipe!r} is unknown; use one of {', '.join(RECIPES)}")
    return recipe


def embedding_dim(width: int, recipe: str = DEFAULT_RECIPE) -> int:
    """Width of the tile embedding of a ``width``-wide ViT under ``recipe``."""
    return (2 if check_recipe(recipe) == DEFAULT_RECIPE else 1) * int(width)
