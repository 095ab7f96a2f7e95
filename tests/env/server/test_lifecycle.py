"""Lifecycle: readiness, TTL and heartbeats, deletion, shutdown, leaks and restarts with Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from orchard.env import InvalidRequest, SandboxNotFound, local_server
from orchard.env.api import SandboxSpec
from orchard.env.backends.etc import reap_etc_layers
from orchard.env.backends.local import LocalBackend
from orchard.env.server.lifecycle import SandboxManager
from orchard.env.server.metrics import Metrics
from orchard.env.store import MemoryStore
from tests.conftest import process_alive, require_root, wait_until


def sandbox_pids(state_dir: str, sandbox_id: str) -> set[int]:
    """Host pids of a sandbox, read from its cgroups."""
    return LocalBackend(state_dir).cgroups.pids(sandbox_id)


def test_create_without_waiting_then_wait(client):
    sb = client.create(wait=False)
    try:
        assert sb.info.status in ("creating", "ready")
        assert sb.wait_ready(timeout=30).status == "ready"
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.delete()


def test_ttl_expiry_reaps(client, orchestrator):
    sb = client.create(ttl=1, heartbeat=False)
    sandbox_dir = os.path.join(orchestrator.state_dir, "sandboxes", sb.id)
    assert os.path.isdir(sandbox_dir)

    def gone() -> bool:
        try:
            client.get(sb.id)
        except SandboxNotFound:
            return True
        return False

    wait_until(gone, timeout=15, what="TTL reaping")
    assert not os.path.exists(sandbox_dir)
    assert sandbox_pids(orchestrator.state_dir, sb.id) == set()


def test_a_ttl_shorter_than_start_up_is_a_clear_error_not_a_500(client):
    """Found by the fuzz test: the reaper deleted a sandbox whose TTL ran out while it was starting,
    and the create answered 500 ("Session is closed")."""
    for _ in range(3):
        try:
            sb = client.create(ttl=0.001, heartbeat=False)
        except SandboxNotFound as exc:
            assert "deleted while it started" in str(exc)
        else:  # it became ready before the reaper ran: then the reaper takes it
            wait_until(lambda sb=sb: sb.id not in {info.id for info in client.list()}, what="reaping")


def test_a_cpu_quota_too_small_to_start_is_refused(client):
    """Found by the fuzz test: ``cpu=5e-324`` was accepted, and the agent never started in time."""
    with pytest.raises(InvalidRequest, match="cpu"):
        client.create(cpu=0.01)


def test_heartbeats_extend_the_ttl(client):
    with client.create(ttl=2.0) as sb:  # the SDK beats every ttl/3
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            assert sb.exec("true").ok  # would raise SandboxNotFound once reaped
            time.sleep(0.2)
        before = sb.refresh().expires_at
        assert sb.heartbeat().expires_at > before


def test_delete_kills_everything(client, orchestrator):
    sb = client.create()
    sb.start_process("sleep 1000 & sleep 1000")
    sb.exec("nohup sleep 1000 >/dev/null 2>&1 & setsid sleep 1000 >/dev/null 2>&1 &").check()
    pids = sandbox_pids(orchestrator.state_dir, sb.id)
    assert len(pids) >= 5  # launcher, agent, and the sleepers
    sb.delete()
    wait_until(lambda: not any(process_alive(pid) for pid in pids), what="sandbox processes to die")
    assert not os.path.exists(os.path.join(orchestrator.state_dir, "sandboxes", sb.id))
    with pytest.raises(SandboxNotFound):
        client.get(sb.id)
    with pytest.raises(SandboxNotFound):
        sb.exec("true")


def test_context_manager_deletes_on_exception(client):
    with pytest.raises(RuntimeError), client.create() as sb:
        raise RuntimeError("boom")
    with pytest.raises(SandboxNotFound):
        client.get(sb.id)


def test_context_manager_deletes_on_keyboard_interrupt(client):
    with pytest.raises(KeyboardInterrupt), client.create() as sb:
        raise KeyboardInterrupt
    with pytest.raises(SandboxNotFound):
        client.get(sb.id)


def test_stopping_the_orchestrator_deletes_its_sandboxes():
    require_root()
    server = local_server(reap_interval=0.2, state_dir=None)
    state_dir = server.state_dir
    server._owns_state = False  # keep the state dir to inspect it after stop
    try:
        with server.client() as client:
            ids = [client.create(heartbeat=False).id for _ in range(2)]
        pids = set().union(*(sandbox_pids(state_dir, i) for i in ids))
        assert server.stop() in (0, -15)  # uvicorn re-raises SIGTERM after a graceful shutdown
        assert not any(process_alive(pid) for pid in pids)
        assert os.listdir(os.path.join(state_dir, "sandboxes")) == []
    finally:
        server.stop()
        shutil.rmtree(state_dir, ignore_errors=True)


LAUNCHER = """
import json, sys, time
from orchard.env import local_server
server = local_server(reap_interval=0.2)
with server.client() as client:
    sandbox = client.create(heartbeat=False, ttl=3600)
print(json.dumps({"state_dir": server.state_dir, "pid": server.process.pid, "sandbox": sandbox.id}), flush=True)
time.sleep(3600)
"""


def test_an_orchestrator_whose_launcher_is_killed_shuts_down_and_deletes_its_sandboxes():
    require_root()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    state_dir = None
    try:
        started = json.loads(launcher.stdout.readline())
        state_dir = started["state_dir"]
        pids = sandbox_pids(state_dir, started["sandbox"])
        assert pids and process_alive(started["pid"])
        launcher.kill()  # SIGKILL: the launcher stops nothing
        launcher.wait()
        wait_until(lambda: not process_alive(started["pid"]), timeout=30, what="the orphaned orchestrator's exit")
        assert not any(process_alive(pid) for pid in pids)
        assert os.listdir(os.path.join(state_dir, "sandboxes")) == []
    finally:
        launcher.kill()
        launcher.wait()
        if state_dir:
            reap_etc_layers(state_dir)
            shutil.rmtree(state_dir, ignore_errors=True)


def test_leaked_sandboxes_are_reaped(orchestrator):
    # A sandbox with backend resources but no record (an orchestrator that crashed mid-create).
    async def leak_and_watch() -> None:
        backend = LocalBackend(orchestrator.state_dir)
        try:
            orchestrator.process.send_signal(signal.SIGSTOP)  # its reaper must not see the sandbox half made
            try:
                handle = await backend.create("leaked0000000000", SandboxSpec())
                await asyncio.to_thread(wait_until, lambda: os.path.exists(handle.agent_url.removeprefix("unix://")),
                                        what="the agent to listen")
            finally:
                orchestrator.process.send_signal(signal.SIGCONT)
            await asyncio.to_thread(wait_until, lambda: not os.path.exists(handle.data["dir"]), timeout=15,
                                    what="orphan reaping")
            await asyncio.to_thread(wait_until, lambda: not process_alive(handle.data["pid"]),
                                    what="orphan processes to die")
        finally:
            await backend.close()  # this process's /etc layer, which no orchestrator may take away

    asyncio.run(leak_and_watch())


def test_crashed_orchestrator_leaves_sandboxes_that_a_restart_reaps():
    require_root()
    first = local_server(reap_interval=0.2)
    state_dir = first.state_dir
    with first.client() as client:
        sb = client.create(heartbeat=False)
    pids = sandbox_pids(state_dir, sb.id)
    first.kill()  # SIGKILL: no chance to clean up
    assert any(process_alive(pid) for pid in pids)
    second = local_server(reap_interval=0.2, state_dir=state_dir)
    second._owns_state = True
    try:
        wait_until(lambda: not any(process_alive(pid) for pid in pids), what="restart to reap the leftovers")
        assert os.listdir(os.path.join(state_dir, "sandboxes")) == []
    finally:
        second.stop()


def test_replicas_share_sandboxes_through_redis_and_survive_a_crash(redis_url, tmp_path):
    require_root()
    state_dir = str(tmp_path / "state")
    replica_a = local_server(store=redis_url, state_dir=state_dir, reap_interval=0.2)
    replica_b = local_server(store=redis_url, state_dir=state_dir, api_key=replica_a.api_key, reap_interval=0.2)
    try:
        with replica_a.client() as client_a, replica_b.client() as client_b:
            created = client_a.create(heartbeat=False)
            created.write_file("/workspace/state.txt", b"from A")
            via_b = client_b.get(created.id)
            assert via_b.read_file("/workspace/state.txt") == b"from A"
            assert via_b.exec("echo via B").stdout == "via B\n"

            replica_a.kill()  # crash A: its sandbox must stay usable through B
            assert via_b.exec("cat /workspace/state.txt").stdout == "from A"

            replica_a = local_server(store=redis_url, state_dir=state_dir, api_key=replica_b.api_key,
                                     reap_interval=0.2)  # A restarts and re-adopts
            with replica_a.client() as client_again:
                assert client_again.get(created.id).exec("echo via A again").stdout == "via A again\n"
                client_b.delete(created.id)
                with pytest.raises(SandboxNotFound):
                    client_again.get(created.id).exec("true")
    finally:
        replica_a.stop()
        replica_b.stop()


def test_shutdown_stops_a_reaper_whose_store_swallowed_the_cancellation():
    """redis-py's asyncio client can swallow a task's cancellation that lands mid-command
    (redis/redis-py#2028): the reaper then ran on, and a shared-store orchestrator's SIGTERM waited for
    it until the process was killed (30 s in the replica test above, one run in two)."""
    in_pass = asyncio.Event()

    class SwallowingStore(MemoryStore):
        shared = True

        async def list(self):
            in_pass.set()
            with contextlib.suppress(asyncio.CancelledError):  # as redis-py's client does mid-command
                await asyncio.sleep(0.05)
            return await super().list()

    class NoSandboxes:
        name = "none"

        async def list(self) -> set[str]:
            return set()

        async def close(self) -> None:
            pass

    async def stops() -> bool:
        manager = SandboxManager(NoSandboxes(), SwallowingStore(), Metrics(), reap_interval=0.001)
        manager.start_reaper()
        await in_pass.wait()  # the cancellation lands inside the store's call
        done, _ = await asyncio.wait({asyncio.ensure_future(manager.shutdown())}, timeout=10)
        return bool(done)

    loop = asyncio.new_event_loop()  # closed without waiting on a reaper that would never end
    try:
        assert loop.run_until_complete(stops()), "the orchestrator's shutdown waited on a reaper that ran on"
    finally:
        loop.close()


def test_execs_are_serialised_across_replicas(redis_url, tmp_path):
    require_root()
    import asyncio

    state_dir = str(tmp_path / "state")
    replica_a = local_server(store=redis_url, state_dir=state_dir)
    replica_b = local_server(store=redis_url, state_dir=state_dir, api_key=replica_a.api_key)
    with replica_a.client() as client:
        sandbox_id = client.create(heartbeat=False).id
    try:

        async def race() -> list[int | None]:
            async with replica_a.async_client() as a, replica_b.async_client() as b:
                command = "mkdir /tmp/lock || exit 9; sleep 0.3; rmdir /tmp/lock"
                sandboxes = [await a.get(sandbox_id), await b.get(sandbox_id)]
                results = await asyncio.gather(*(sb.exec(command) for sb in sandboxes * 2))
                return [r.exit_code for r in results]

        assert asyncio.run(race()) == [0, 0, 0, 0]
        with replica_b.client() as client:  # each replica stacks its own /etc layer: one's close spares the other's
            client.create(heartbeat=False).delete()
            replica_a.stop()
            with client.create(heartbeat=False) as after:
                assert after.exec("cat /etc/hostname").stdout == "sandbox\n"
    finally:
        with replica_b.client() as client:
            client.delete(sandbox_id)  # with a shared store, stopping a replica keeps its sandboxes
        replica_a.stop()
        replica_b.stop()


def test_agent_token_never_leaks(redis_url, tmp_path):
    require_root()
    import httpx
    import redis

    server = local_server(store=redis_url, state_dir=str(tmp_path / "state"))
    try:
        with server.client() as client, client.create() as sb:
            record = redis.Redis.from_url(redis_url).get(f"orchard:sandbox:{sb.id}")
            token = __import__("json").loads(record)["agent_token"]
            assert len(token) > 20
            headers = {"Authorization": f"Bearer {server.api_key}"}
            bodies = [httpx.get(server.base_url + path, headers=headers).text for path in
                      ("/v1/sandboxes", f"/v1/sandboxes/{sb.id}", "/openapi.json", "/metrics")]
            bodies.append(httpx.post(f"{server.base_url}/v1/sandboxes/{sb.id}/heartbeat", headers=headers).text)
            bodies.append(sb.exec("env; cat /proc/1/environ /proc/1/cmdline; ls -la /run/orchard").stdout)
            assert not any(token in body for body in bodies)
    finally:
        server.stop()


def test_a_sandbox_that_cannot_start_is_a_clear_error_and_leaves_nothing(client, orchestrator):
    from orchard.env.client import BackendUnavailable

    before = set(os.listdir(os.path.join(orchestrator.state_dir, "sandboxes")))
    with pytest.raises(BackendUnavailable) as error:
        client.create(workdir="/proc/cannot-exist")  # the init script cannot create it
    assert "failed to start" in error.value.detail and "/proc/cannot-exist" in error.value.detail
    # Nothing new is left (sandboxes of earlier tests may expire meanwhile: a subset, not equality).
    assert set(os.listdir(os.path.join(orchestrator.state_dir, "sandboxes"))) <= before
    assert all(info.spec.workdir != "/proc/cannot-exist" for info in client.list())
