"""Redis store: orchestrator replicas share sandboxes through it.

Each record is one JSON string under ``<prefix>:sandbox:<id>``; the set ``<prefix>:sandboxes``
indexes them. A sandbox created through one replica can be used and deleted through another.
"""

from __future__ import annotations

import redis.asyncio as redis

from orchard.env.store.base import SandboxRecord


class RedisStore:
    shared = True

    def __init__(self, url: str, prefix: str = "orchard") -> None:
        self._redis = redis.Redis.from_url(url)
        self._index = f"{prefix}:sandboxes"
        self._prefix = f"{prefix}:sandbox:"

    async def put(self, record: SandboxRecord) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._prefix + record.info.id, record.model_dump_json())
            pipe.sadd(self._index, record.info.id)
            await pipe.execute()

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        raw = await self._redis.get(self._prefix + sandbox_id)
        return SandboxRecord.model_validate_json(raw) if raw else None

    async def delete(self, sandbox_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._prefix + sandbox_id)
            pipe.srem(self._index, sandbox_id)
            await pipe.execute()

    async def list(self) -> list[SandboxRecord]:
        ids = sorted(i.decode() for i in await self._redis.smembers(self._index))
        if not ids:
            return []
        raws = await self._redis.mget([self._prefix + i for i in ids])
        return [SandboxRecord.model_validate_json(raw) for raw in raws if raw]

    async def close(self) -> None:
        await self._redis.aclose()
