"""Test bed plugin: docker (being built)."""
