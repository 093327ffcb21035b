"""Serving endpoints (vLLM, routers): health, models, Prometheus metrics. Knows nothing of Textual."""
