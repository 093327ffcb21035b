"""Benchmark client, sweeps, results store, reports. Knows nothing of Textual or of nodes."""
