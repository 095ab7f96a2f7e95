"""Both stores honour the same contract; Redis is a real redis-server."""

from __future__ import annotations

import time

import pytest

from orchard.env.api import SandboxInfo, SandboxSpec
from orchard.env.store import SandboxRecord, open_store


def record(sandbox_id: str) -> SandboxRecord:
    now = time.time()
    info = SandboxInfo(id=sandbox_id, status="ready", spec=SandboxSpec(), created_at=now, expires_at=now + 60,
                       backend="local")
    return SandboxRecord(info=info, agent_url="unix:///x.sock", agent_token="secret", data={"pid": 1})


@pytest.fixture(params=["memory", "redis"])
async def store(request):
    url = request.getfixturevalue("redis_url") if request.param == "redis" else "memory://"
    opened = open_store(url)
    yield opened
    for existing in await opened.list():
        await opened.delete(existing.info.id)
    await opened.close()


async def test_put_get_list_delete(store):
    assert await store.get("a") is None
    await store.put(record("a"))
    await store.put(record("b"))
    assert (await store.get("a")).agent_token == "secret"
    assert sorted(r.info.id for r in await store.list()) == ["a", "b"]
    updated = record("a")
    updated.info.expires_at += 100
    await store.put(updated)
    assert (await store.get("a")).info.expires_at == updated.info.expires_at
    await store.delete("a")
    await store.delete("a")  # idempotent
    assert [r.info.id for r in await store.list()] == ["b"]


async def test_redis_is_shared_between_clients(redis_url):
    first, second = open_store(redis_url), open_store(redis_url)
    try:
        await first.put(record("shared"))
        assert (await second.get("shared")).data == {"pid": 1}
        assert second.shared and not open_store(None).shared
    finally:
        await first.delete("shared")
        await first.close()
        await second.close()


def test_unknown_store_url_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown store URL"):
        open_store("postgres://nope")
