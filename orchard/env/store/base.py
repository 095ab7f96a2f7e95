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
