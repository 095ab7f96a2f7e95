"""Rollout engines: the in-process JAX sampler (and, later, OpenAI-compatible and vLLM engines)."""
