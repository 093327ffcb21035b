"""Test bed plugin: routers (being built)."""
