"""Moved to sparkconsole/recipes/ (the recipe sources package); kept so that code written against the old path
still imports. New code imports `sparkconsole.recipes`."""

from ..recipes.model import *  # noqa: F403
from ..recipes.model import ROUTER_CHOICES, TOPOLOGIES, Recipe, fill, placeholders_in  # noqa: F401
from ..recipes.sources import (  # noqa: F401
    bundled_dir,
    bundled_recipes,
    find_recipe,
    load_recipe,
    parse_recipe,
    recipe_path,
    recipe_paths,
    user_dirs,
)
from ..recipes.v1 import CLI_PLACEHOLDERS, COMMUNITY_KEYS, SUPPORTED_VERSIONS  # noqa: F401
