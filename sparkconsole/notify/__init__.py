"""Alerts to the outside, for unattended runs: a webhook (JSON POST), an ntfy-style topic URL, the terminal
bell. See notifier.py."""
