"""Subcommands of the `sparkconsole` CLI, one module each (see cli.py)."""
