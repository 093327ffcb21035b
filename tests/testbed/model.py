"""Test bed plugin: model (being built)."""
