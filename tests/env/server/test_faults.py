"""Faults: an agent killed mid-exec, and an orchestrator killed during 200 concurrent execs."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest

from orchard.env import OrchardError, SandboxNotFound, local_server
from orchard.env.backends.local import LocalBackend
from orchard.env.client import AgentUnavailable
from tests.conftest import require_root, wait_until


def processes(state_dir: str, sandbox_id: str) -> dict[int, bytes]:
    """Host pid -> command line of every process of a sandbox, found through its cgroup."""
    found = {}
    for pid in LocalBackend(state_dir).cgroups.pids(sandbox_id):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                found[pid] = handle.read()
        except FileNotFoundError:
            continue
    return found


def agent_pid(state_dir: str, sandbox_id: str) -> int:
    """The host pid of a sandbox's agent: the process that is PID 1 in the sandbox's namespace."""
    for pid in processes(state_dir, sandbox_id):
        with open(f"/proc/{pid}/status") as handle:
            nspid = next(line for line in handle if line.startswith("NSpid:")).split()
        if nspid[-1] == "1":
            return pid
    raise AssertionError(f"no PID 1 in sandbox {sandbox_id}")


def test_an_agent_killed_mid_exec_is_a_clear_error_not_a_hang(client, orchestrator):
    sandbox = client.create()
    try:
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["result"] = sandbox.exec("sleep 60", timeout=120)
            except OrchardError as error:
                outcome["error"] = error

        caller = threading.Thread(target=run)
        caller.start()
        wait_until(lambda: any(b"sleep" in c for c in processes(orchestrator.state_dir, sandbox.id).values()),
                   timeout=10, what="the command to start")
        os.kill(agent_pid(orchestrator.state_dir, sandbox.id), signal.SIGKILL)
        caller.join(timeout=30)  # a hang would be the 60 s sleep or the 120 s timeout
        assert not caller.is_alive()
        assert isinstance(outcome.get("error"), AgentUnavailable), outcome
        with pytest.raises(AgentUnavailable):  # and the next call says so too
            sandbox.exec("true")
    finally:
        sandbox.delete()
    assert not LocalBackend(orchestrator.state_dir).cgroups.pids(sandbox.id)


def test_an_orchestrator_killed_during_200_execs_recovers_with_redis(redis_url, tmp_path):
    require_root()
    state_dir = str(tmp_path / "state")
    server = local_server(store=redis_url, state_dir=state_dir, reap_interval=0.2)
    key = server.api_key
    try:
        with server.client() as client:
            ids = [client.create(heartbeat=False, ttl=600).id for _ in range(10)]
        victims = ids[:2]

        async def storm() -> list[BaseException | object]:
            async with server.async_client(max_retries=0) as async_client:
                sandboxes = [await async_client.get(sandbox_id) for sandbox_id in ids]
                calls = [sandboxes[i % len(ids)].exec(f"sleep 1; echo {i}") for i in range(200)]
                return await asyncio.gather(*calls, return_exceptions=True)

        results: list = []
        storm_thread = threading.Thread(target=lambda: results.extend(asyncio.run(storm())))
        storm_thread.start()
        wait_until(lambda: sum(b"sleep" in c for i in ids for c in processes(state_dir, i).values()) >= 5,
                   timeout=30, what="execs in flight")
        server.kill()  # mid-storm: in-flight execs lose their connection
        storm_thread.join(timeout=60)
        assert not storm_thread.is_alive() and len(results) == 200
        failed = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(r, OrchardError) for r in failed), failed[:3]  # typed errors, no hang

        for sandbox_id in victims:  # two sandboxes break while nobody watches
            os.kill(agent_pid(state_dir, sandbox_id), signal.SIGKILL)
        server = local_server(store=redis_url, state_dir=state_dir, api_key=key, reap_interval=0.2)
        with server.client() as client:
            for sandbox_id in ids[2:]:  # the survivors are re-adopted and usable
                assert client.get(sandbox_id).exec("echo alive").stdout == "alive\n"
            for sandbox_id in victims:  # the broken ones are reported gone, and cleaned up
                with pytest.raises(SandboxNotFound):
                    client.get(sandbox_id)
            with open(server.log_path) as log:
                text = log.read()
            assert all(f"deleted sandbox {v} (dead)" in text for v in victims)
            for sandbox_id in ids[2:]:
                client.delete(sandbox_id)
        leftovers = LocalBackend(state_dir)
        assert not leftovers.cgroups.list() & set(ids)
        assert not any(leftovers.cgroups.pids(sandbox_id) for sandbox_id in ids)
        assert not set(os.listdir(os.path.join(state_dir, "sandboxes"))) & set(ids)
    finally:
        server.stop()
