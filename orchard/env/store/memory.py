"""In-memory store: the default for one orchestrator on a laptop or in CI."""

from __future__ import annotations

from orchard.env.store.base import SandboxRecord


class MemoryStore:
    shared = False

    def __init__(self) -> None:
        self._records: dict[str, str] = {}

    async def put(self, record: SandboxRecord) -> None:
        self._records[record.info.id] = record.model_dump_json()

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        raw = self._records.get(sandbox_id)
        return SandboxRecord.model_validate_json(raw) if raw else None

    async def delete(self, sandbox_id: str) -> None:
        self._records.pop(sandbox_id, None)

    async def list(self) -> list[SandboxRecord]:
        return [SandboxRecord.model_validate_json(raw) for raw in self._records.values()]

    async def close(self) -> None:
        pass
