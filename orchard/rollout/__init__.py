"""Rollout engines: the wire types and protocol (no JAX), the in-process JAX engine, an engine over any
OpenAI-compatible server (vLLM, ``orchard serve``), the one OpenAI client, and ``orchard serve`` itself."""
