"""The embedded default: simulated GB10 nodes, vLLM-compatible servers and routers. Knows nothing of Textual."""
