"""Test bed plugin: vllm (being built)."""
