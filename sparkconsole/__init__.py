"""sparkconsole: a terminal operations console for small vLLM clusters of DGX Spark (GB10) nodes."""

__version__ = "0.1.0"
