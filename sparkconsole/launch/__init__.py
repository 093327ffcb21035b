"""Recipes, preflight lint, per-node plans and the runner that executes them. Knows nothing of Textual."""
