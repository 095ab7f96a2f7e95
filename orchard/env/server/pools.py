"""Warm pools: sandboxes created ahead of time, so that a create is a claim that takes milliseconds.

A pool is keyed by everything in a :class:`~orchard.env.api.SandboxSpec` that shapes the sandbox
(image, snapshot, resources, network, workdir, env), that is, all but ``ttl`` and ``labels``. A
create whose spec has the key of a pool with a ready sandbox gets that sandbox, given the
create's ``ttl`` and ``labels``; the pool then refills in the background, a few creates at a time,
backing off while creates fail (the error is reported in :class:`~orchard.env.api.PoolInfo`).

Idle members are ordinary sandboxes in the store, labelled :data:`POOL_LABEL`, and hidden from
``GET /v1/sandboxes``. The pool keeps them alive by extending their TTL; if this orchestrator
dies, they expire (:data:`IDLE_TTL`) and the reaper of whoever remains takes them. Pools belong to
one orchestrator replica and are configured again after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

from orchard.env.api import PoolInfo, SandboxInfo, SandboxSpec
from orchard.env.backends.base import SandboxHandle
from orchard.env.problems import ProblemError
from orchard.env.server.lifecycle import SandboxManager

log = logging.getLogger(__name__)

POOL_LABEL = "orchard.dev/pool"
IDLE_TTL = 600.0
REFILL_CONCURRENCY = 4


def pool_key(spec: SandboxSpec) -> str:
    shape = spec.model_dump(mode="json", exclude={"ttl", "labels"})
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class _Pool:
    key: str
    spec: SandboxSpec
    size: int
    ready: list[str] = field(default_factory=list)
    creating: int = 0
    claims: int = 0
    misses: int = 0
    failures: int = 0
    last_error: str = ""
    stopping: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None

    def info(self) -> PoolInfo:
        return PoolInfo(key=self.key, spec=self.spec, size=self.size, ready=len(self.ready), creating=self.creating,
                        claims=self.claims, misses=self.misses, last_error=self.last_error)


class WarmPools:
    def __init__(self, manager: SandboxManager) -> None:
        self.manager = manager
        self._pools: dict[str, _Pool] = {}

    # ------------------------------------------------------------------ API

    async def configure(self, spec: SandboxSpec, size: int) -> PoolInfo:
        """Create, resize or (size 0) remove the pool of ``spec``."""
        key = pool_key(spec)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(key, spec.model_copy(update={"labels": {}}), size)
            pool.task = asyncio.create_task(self._keep(pool))
        pool.size = size
        while len(pool.ready) > size:  # shrink now: idle members cost memory
            await self.manager.delete(pool.ready.pop(), reason="pool")
        pool.wake.set()
        if size == 0:
            await self._stop(pool)
        return pool.info()

    def list(self) -> list[PoolInfo]:
        return [pool.info() for pool in self._pools.values()]

    def idle(self) -> set[str]:
        return {sandbox_id for pool in self._pools.values() for sandbox_id in pool.ready}

    async def create(self, spec: SandboxSpec, wait: bool = True) -> SandboxInfo:
        """A ready sandbox from the matching pool if it has one, else a new one."""
        pool = self._pools.get(pool_key(spec))
        if pool is not None:
            while pool.ready:
                sandbox_id = pool.ready.pop(0)
                pool.wake.set()
                claimed = await self._claim(sandbox_id, spec)
                if claimed is not None:
                    pool.claims += 1
                    return claimed
            pool.misses += 1
        return await self.manager.create(spec, wait=wait)

    async def shutdown(self) -> None:
        for pool in list(self._pools.values()):
            await self._stop(pool)

    # ------------------------------------------------------------- internals

    async def _claim(self, sandbox_id: str, spec: SandboxSpec) -> SandboxInfo | None:
        """Hand an idle member over: the create's spec (ttl, labels) and a fresh expiry."""
        try:
            record = await self.manager.record(sandbox_id, fresh=True)
        except ProblemError:
            return None  # reaped meanwhile
        handle = SandboxHandle(sandbox_id, record.agent_url, record.agent_token, record.data)
        if not await self.manager.backend.alive(handle):
            await self.manager.delete(sandbox_id, reason="dead")
            return None
        record.info.spec = spec
        record.info.expires_at = time.time() + spec.ttl
        await self.manager.store.put(record)
        self.manager.remember(record)
        return record.info

    async def _stop(self, pool: _Pool) -> None:
        self._pools.pop(pool.key, None)
        pool.stopping = True  # not only cancel(): Python 3.11's wait_for can swallow a cancellation
        pool.wake.set()
        if pool.task is not None:
            pool.task.cancel()
            await asyncio.gather(pool.task, return_exceptions=True)
        for sandbox_id in pool.ready:
            with contextlib.suppress(ProblemError):
                await self.manager.delete(sandbox_id, reason="pool")
        pool.ready.clear()

    async def _add_member(self, pool: _Pool) -> None:
        member = pool.spec.model_copy(update={"ttl": IDLE_TTL, "labels": {POOL_LABEL: pool.key}})
        try:
            info = await self.manager.create(member)
        except Exception as error:  # reported in PoolInfo, retried with backoff
            pool.failures += 1
            pool.last_error = str(error)[:500]
            log.warning("pool %s: create failed (%d in a row): %s", pool.key, pool.failures, error)
            return
        finally:
            pool.creating -= 1
        pool.failures, pool.last_error = 0, ""
        if self._pools.get(pool.key) is pool and len(pool.ready) < pool.size:
            pool.ready.append(info.id)
        else:  # the pool shrank or went away meanwhile
            await self.manager.delete(info.id, reason="pool")

    async def _keep(self, pool: _Pool) -> None:
        """Refill the pool, a few creates at a time, and keep idle members from expiring. While
        creates fail, wait longer each time (up to 30 s) and then try one."""
        creates: set[asyncio.Task] = set()
        last_beat = time.monotonic()
        try:
            while not pool.stopping:
                if pool.failures:
                    await asyncio.sleep(min(2.0 ** pool.failures, 30.0))
                while pool.creating < REFILL_CONCURRENCY and len(pool.ready) + pool.creating < pool.size:
                    pool.creating += 1
                    task = asyncio.create_task(self._add_member(pool))
                    creates.add(task)
                    task.add_done_callback(creates.discard)
                    task.add_done_callback(lambda _: pool.wake.set())
                    if pool.failures:
                        break  # one probe at a time while failing
                if time.monotonic() - last_beat > IDLE_TTL / 3:
                    for sandbox_id in list(pool.ready):
                        with contextlib.suppress(ProblemError):
                            await self.manager.heartbeat(sandbox_id)
                    last_beat = time.monotonic()
                pool.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pool.wake.wait(), IDLE_TTL / 3)
        finally:
            for task in creates:
                task.cancel()
            await asyncio.gather(*creates, return_exceptions=True)
