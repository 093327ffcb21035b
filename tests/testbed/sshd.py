"""Test bed plugin: sshd (being built)."""
