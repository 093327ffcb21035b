"""The real test bed as pytest plugins: OpenSSH nodes on loopback, a Docker engine, vLLM (CPU), routers.

Each module is registered in the root conftest.py; fixtures are session-scoped and stop what they start by PID.
"""
