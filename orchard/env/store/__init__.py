"""Sandbox state: in memory (one orchestrator) or in Redis (replicas share sandboxes)."""

from orchard.env.store.base import SandboxRecord, Store, open_store

__all__ = ["SandboxRecord", "Store", "open_store"]
