"""Recipe sources: the recipe model, the readers (recipe_version "1" as spark-vllm-docker's runner reads it,
"2" as sparkrun reads it), includes and overrides, registries and trust. Below launch/: launch/, the console and
`bench matrix` read recipes from here (docs/ARCHITECTURE.md)."""

from .model import (
    ROUTER_CHOICES,
    TOPOLOGIES,
    ClusterSettings,
    ContainerSettings,
    DisaggSettings,
    Override,
    PreExec,
    Readiness,
    Recipe,
    RouterImpl,
    RouterSettings,
    SecretRef,
    fill,
    placeholders_in,
)
from .sources import (
    bundled_dir,
    bundled_recipes,
    find_recipe,
    load_recipe,
    parse_recipe,
    recipe_path,
    recipe_paths,
    user_dirs,
)

__all__ = [
    "ROUTER_CHOICES", "TOPOLOGIES", "ClusterSettings", "ContainerSettings", "DisaggSettings", "Override", "PreExec",
    "Readiness", "Recipe", "RouterImpl", "RouterSettings", "SecretRef", "bundled_dir", "bundled_recipes", "fill",
    "find_recipe", "load_recipe", "parse_recipe", "placeholders_in", "recipe_path", "recipe_paths", "user_dirs",
]
