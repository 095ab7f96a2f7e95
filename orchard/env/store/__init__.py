"""Sandbox state: in memory (one orchestrator) or in Redis (replicas share sandboxes)."""

from orchard.env.store.base import SandboxRecord, Store
from orchard.env.store.memory import MemoryStore


def open_store(url: str | None) -> Store:
    """``None`` or ``memory://`` for the in-memory store; ``redis://host:port/db`` for Redis."""
    if not url or url.startswith("memory:"):
        return MemoryStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from orchard.env.store.redis import RedisStore  # needs the redis extra

        return RedisStore(url)
    raise ValueError(f"unknown store URL {url!r}; use memory:// or redis://host:port/db")


__all__ = ["MemoryStore", "SandboxRecord", "Store", "open_store"]
