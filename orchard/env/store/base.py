"""The store contract and the record it keeps for each sandbox."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel

from orchard.env.api import SandboxInfo


class SandboxRecord(BaseModel):
    """What the orchestrator knows about a sandbox. ``agent_token`` never leaves the server."""

    info: SandboxInfo
    agent_url: str
    agent_token: str
    data: dict = {}


class Store(Protocol):
    shared: bool  # True when other orchestrator replicas see the same sandboxes

    async def put(self, record: SandboxRecord) -> None: ...

    async def get(self, sandbox_id: str) -> SandboxRecord | None: ...

    async def delete(self, sandbox_id: str) -> None: ...

    async def list(self) -> list[SandboxRecord]: ...

    async def close(self) -> None: ...


def open_store(url: str | None) -> Store:
    """``None`` or ``memory://`` for the in-memory store; ``redis://host:port/db`` for Redis."""
    if not url or url.startswith("memory:"):
        from orchard.env.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith(("redis://", "rediss://", "unix://")):
        from orchard.env.store.redis import RedisStore

        return RedisStore(url)
    raise ValueError(f"unknown store URL {url!r}; use memory:// or redis://host:port/db")
