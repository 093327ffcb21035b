"""Test bed plugin: benchy (being built)."""
