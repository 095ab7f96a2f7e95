"""Sandbox lifecycle: create, readiness, heartbeat, delete, TTL reaping and restart recovery.

The store is the source of truth. A record is written *before* the backend creates anything, so a
crash in between leaves a record the reaper can clean up rather than an invisible leak; anything
the backend still holds without a record is an orphan and is reaped too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid

import aiohttp

from orchard.env.api import ErrorCode, SandboxInfo, SandboxSpec, SnapshotInfo
from orchard.env.backends.base import Backend, SandboxHandle
from orchard.env.problems import ProblemError
from orchard.env.server.agents import AgentConnection, AgentError, AgentPool
from orchard.env.server.metrics import Metrics
from orchard.env.store import SandboxRecord, Store

log = logging.getLogger(__name__)

READY_TIMEOUT = 60.0


def not_found(sandbox_id: str) -> ProblemError:
    return ProblemError(404, ErrorCode.SANDBOX_NOT_FOUND, f"no sandbox {sandbox_id!r}")


class SandboxManager:
    def __init__(self, backend: Backend, store: Store, metrics: Metrics, reap_interval: float = 5.0) -> None:
        self.backend = backend
        self.store = store
        self.metrics = metrics
        self.reap_interval = reap_interval
        # From create to ready: a pod may first wait for a node and an image pull.
        self.ready_timeout = getattr(backend, "ready_timeout", READY_TIMEOUT)
        self.agents = AgentPool()
        self._records: dict[str, SandboxRecord] = {}  # hot-path cache; the store stays authoritative
        self._reaper: asyncio.Task | None = None
        self._stopping = False
        # Sandboxes starting at once. Past the point where the CPUs are busy, more only slow every
        # start down (a thousand at once all miss READY_TIMEOUT); the rest wait their turn here. A
        # backend whose sandboxes start elsewhere (Kubernetes: on other nodes) sets its own limit.
        self._starting = asyncio.Semaphore(getattr(backend, "max_starting", max(8, 4 * (os.cpu_count() or 1))))

    # ------------------------------------------------------------------ lookup

    async def record(self, sandbox_id: str, *, fresh: bool = False) -> SandboxRecord:
        cached = None if fresh else self._records.get(sandbox_id)
        if cached is not None:
            return cached
        record = await self.store.get(sandbox_id)
        if record is None:
            self._forget(sandbox_id)
            raise not_found(sandbox_id)
        self.remember(record)
        return record

    def remember(self, record: SandboxRecord) -> None:
        """Put a changed record of a ready sandbox in the hot-path cache."""
        if record.info.status == "ready":
            self._records[record.info.id] = record

    def _forget(self, sandbox_id: str) -> None:
        self._records.pop(sandbox_id, None)

    async def client(self, sandbox_id: str) -> AgentConnection:
        """The keep-alive connection to a ready sandbox's agent."""
        record = await self.record(sandbox_id)
        if record.info.status != "ready":
            raise ProblemError(409, ErrorCode.SANDBOX_NOT_READY, f"sandbox {sandbox_id!r} is {record.info.status}")
        return self.agents.get(sandbox_id, record.agent_url, record.agent_token)

    async def agent_lost(self, sandbox_id: str, error: Exception) -> ProblemError:
        """Explain a failed hot-path call: the sandbox was deleted elsewhere, or its agent died."""
        self._forget(sandbox_id)
        await self.agents.drop(sandbox_id)
        if await self.store.get(sandbox_id) is None:
            return not_found(sandbox_id)
        return ProblemError(502, ErrorCode.AGENT_UNAVAILABLE, f"sandbox {sandbox_id!r} agent unreachable: {error}")

    # --------------------------------------------------------------- lifecycle

    async def create(self, spec: SandboxSpec, wait: bool = True) -> SandboxInfo:
        sandbox_id = uuid.uuid4().hex
        now = time.time()
        info = SandboxInfo(id=sandbox_id, status="creating", spec=spec, created_at=now, expires_at=now + spec.ttl,
                           backend=self.backend.name)
        await self.store.put(SandboxRecord(info=info, agent_url="", agent_token=""))
        async with self._starting:
            return await self._start(info, wait)

    async def _start(self, info: SandboxInfo, wait: bool) -> SandboxInfo:
        sandbox_id = info.id
        try:
            handle = await self.backend.create(sandbox_id, info.spec)
        except BaseException as exc:
            await self.store.delete(sandbox_id)
            with contextlib.suppress(Exception):
                await self.backend.delete(sandbox_id)
            if isinstance(exc, ProblemError):
                raise
            if isinstance(exc, Exception):
                raise ProblemError(503, ErrorCode.BACKEND_ERROR, f"could not create sandbox: {exc}") from exc
            raise
        record = SandboxRecord(info=info, agent_url=handle.agent_url, agent_token=handle.agent_token, data=handle.data)
        await self.store.put(record)
        self.metrics.created.inc()
        if not wait:
            return info
        try:
            return await self.wait_ready(sandbox_id)
        except asyncio.CancelledError:  # e.g. a warm pool removed while it refilled: leave nothing
            with contextlib.suppress(Exception):
                await asyncio.shield(self.delete(sandbox_id, reason="cancelled"))
            raise

    async def wait_ready(self, sandbox_id: str, timeout: float | None = None) -> SandboxInfo:
        record = await self.record(sandbox_id, fresh=True)
        if record.info.status == "ready":
            return record.info
        if not (record.agent_url or record.data):
            raise ProblemError(409, ErrorCode.SANDBOX_NOT_READY, f"sandbox {sandbox_id!r} is still being created")
        handle = SandboxHandle(sandbox_id, record.agent_url, record.agent_token, record.data)
        timeout = timeout or self.ready_timeout
        native = getattr(self.backend, "wait_ready", None)
        if native is not None:  # the backend knows when its agent is up (Kubernetes: the Ready condition)
            try:
                record.agent_url = await native(handle, timeout)
            except ProblemError as error:
                if await self.store.get(sandbox_id) is None:  # a client deleted it meanwhile
                    raise not_found(sandbox_id) from None
                await self.delete(sandbox_id, reason="failed")
                if error.status < 500:  # the client's to fix: an image that cannot be pulled...
                    raise
                raise ProblemError(503, ErrorCode.BACKEND_ERROR,
                                   f"sandbox {sandbox_id!r} failed to start: {error.detail}") from None
            return await self._mark_ready(record)
        agent = self.agents.get(sandbox_id, record.agent_url, record.agent_token)
        deadline = time.monotonic() + timeout
        delay = 0.005
        deleted = ProblemError(404, ErrorCode.SANDBOX_NOT_FOUND,
                               f"sandbox {sandbox_id!r} was deleted while it started (a TTL of "
                               f"{record.info.spec.ttl:g} s may be shorter than its start-up)")
        # A Unix socket that does not exist yet cannot answer: a stat is far cheaper than a failed
        # request, which matters with a thousand sandboxes starting at once.
        socket_path = record.agent_url.removeprefix("unix://") if record.agent_url.startswith("unix://") else None
        while True:
            if agent.session.closed:  # deleted while starting: by a client, or its TTL ran out first
                raise deleted
            try:
                if socket_path is not None and not os.path.exists(socket_path):
                    raise aiohttp.ClientConnectionError("the agent's socket is not there yet")
                async with agent.session.get(f"{agent.base_url}/health",
                                             timeout=aiohttp.ClientTimeout(total=2.0)) as response:
                    if response.status == 200:
                        break
            except AgentError:
                pass
            except RuntimeError as exc:  # "Session is closed": the deletion happened during this request
                raise deleted from exc
            failure = await self.backend.failure(handle)
            if failure is not None or time.monotonic() > deadline:
                detail = failure or f"agent not ready after {timeout:.0f}s"
                await self.delete(sandbox_id, reason="failed")
                raise ProblemError(503, ErrorCode.BACKEND_ERROR, f"sandbox {sandbox_id!r} failed to start: {detail}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)  # a failed connect costs microseconds; waiting costs latency
        return await self._mark_ready(record)

    async def _mark_ready(self, record: SandboxRecord) -> SandboxInfo:
        sandbox_id = record.info.id
        record.info.status = "ready"
        await self.store.put(record)
        self._records[sandbox_id] = record
        self.metrics.create_seconds.observe(time.time() - record.info.created_at)
        return record.info

    async def heartbeat(self, sandbox_id: str) -> SandboxInfo:
        record = await self.record(sandbox_id, fresh=True)
        record.info.expires_at = time.time() + record.info.spec.ttl
        await self.store.put(record)
        if sandbox_id in self._records:
            self._records[sandbox_id] = record
        return record.info

    async def delete(self, sandbox_id: str, reason: str = "client") -> None:
        record = await self.store.get(sandbox_id)
        if record is None and reason == "client":
            raise not_found(sandbox_id)
        self._forget(sandbox_id)
        await self.agents.drop(sandbox_id)
        await self.backend.delete(sandbox_id)
        await self.store.delete(sandbox_id)
        self.metrics.deleted.labels(reason).inc()
        log.info("deleted sandbox %s (%s)", sandbox_id, reason)

    # -------------------------------------------------------- snapshot, fork

    async def snapshot(self, sandbox_id: str) -> SnapshotInfo:
        record = await self.record(sandbox_id, fresh=True)
        if record.info.status != "ready":
            raise ProblemError(409, ErrorCode.SANDBOX_NOT_READY, f"sandbox {sandbox_id!r} is {record.info.status}")
        started = time.perf_counter()
        info = await self.backend.snapshot(sandbox_id)
        self.metrics.snapshot_seconds.observe(time.perf_counter() - started)
        return info

    async def fork(self, sandbox_id: str, n: int, ttl: float | None = None) -> list[SandboxInfo]:
        """``n`` new sandboxes, each with its own copy of ``sandbox_id``'s files as they are now:
        one snapshot, ``n`` creates from it in parallel, and the snapshot removed. All or nothing:
        if one create fails, the others are deleted."""
        source = (await self.record(sandbox_id, fresh=True)).info.spec
        snapshot = await self.snapshot(sandbox_id)
        spec = source.model_copy(update={"from_snapshot": snapshot.id, "image": None, "ttl": ttl or source.ttl})
        try:
            results = await asyncio.gather(*(self.create(spec) for _ in range(n)), return_exceptions=True)
        finally:
            await self.backend.delete_snapshot(snapshot.id)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for made in results:
                if isinstance(made, SandboxInfo):
                    await self.delete(made.id, reason="failed")
            raise failed[0]
        return list(results)

    async def list(self) -> list[SandboxInfo]:
        infos = [r.info for r in await self.store.list()]
        self.metrics.sandboxes.set(len(infos))
        return infos

    # ------------------------------------------------------ reaping, recovery

    async def reap_once(self) -> list[str]:
        """Delete expired sandboxes and orphans (backend resources with no record)."""
        now = time.time()
        records = await self.store.list()
        reaped = []
        for record in records:
            if record.info.expires_at < now:
                await self.delete(record.info.id, reason="expired")
                reaped.append(record.info.id)
        known = {r.info.id for r in records}
        for sandbox_id in await self.backend.list() - known:
            if await self.store.get(sandbox_id) is None:  # not created a moment ago elsewhere
                await self.delete(sandbox_id, reason="orphan")
                reaped.append(sandbox_id)
        return reaped

    async def recover(self) -> None:
        """After a restart: re-adopt live sandboxes in the store, reap the dead and the orphans."""
        for record in await self.store.list():
            if record.info.backend != self.backend.name:
                continue
            if record.info.status == "creating" and time.time() - record.info.created_at < self.ready_timeout:
                continue  # another replica may be creating it right now
            handle = SandboxHandle(record.info.id, record.agent_url, record.agent_token, record.data)
            if record.agent_url and await self.backend.alive(handle):
                log.info("re-adopted sandbox %s", record.info.id)
            else:
                await self.delete(record.info.id, reason="dead")
        await self.reap_once()

    def start_reaper(self) -> None:
        async def loop() -> None:
            while True:
                await asyncio.sleep(self.reap_interval)
                if self._stopping:
                    break
                try:
                    await self.reap_once()
                except Exception:
                    log.exception("reaper pass failed")

        self._reaper = asyncio.create_task(loop())

    async def shutdown(self) -> None:
        # Not only cancel(): redis-py's asyncio client can swallow a cancellation that lands mid-command
        # (redis/redis-py#2028), and the reaper, never told to stop, held a shared-store orchestrator's
        # SIGTERM until it was killed 30 s later. The pass in flight finishes; no other starts.
        self._stopping = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        if not self.store.shared:  # nobody else can reach these sandboxes: take them down with us
            for record in await self.store.list():
                await self.delete(record.info.id, reason="shutdown")
        await self.agents.close()
        await self.backend.close()
        await self.store.close()
