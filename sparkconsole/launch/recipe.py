"""Moved to sparkconsole/recipes/ (the recipe sources package); kept so that code written against the old path
still imports. New code imports `sparkconsole.recipes`."""

from ..recipes import *  # noqa: F403
from ..recipes import __all__ as __all__  # noqa: F401
from ..recipes.v1 import CLI_PLACEHOLDERS, COMMUNITY_KEYS, SUPPORTED_VERSIONS  # noqa: F401
