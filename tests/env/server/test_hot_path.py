"""Exec, streaming, files and processes through the SDK and a real orchestrator."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading

import httpx
import pytest

from orchard.env import (
    AuthenticationError,
    CommandFailed,
    InvalidRequest,
    PathNotFound,
    SandboxClient,
    SandboxNotFound,
)
from orchard.env.client import NotADirectory
from tests.conftest import wait_until


def test_exec_result_fields(sandbox):
    result = sandbox.exec("echo out; echo err >&2; exit 3", timeout=10)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.timed_out and not result.truncated and result.duration > 0
    with pytest.raises(CommandFailed):
        result.check()


def test_exec_stdin_env_cwd(sandbox):
    sandbox.exec("mkdir -p /workspace/sub").check()
    result = sandbox.exec('cat; echo "$X"; pwd', stdin="in\n", env={"X": "y"}, cwd="/workspace/sub")
    assert result.check().stdout == "in\ny\n/workspace/sub\n"


def test_exec_binary_output_and_stdin(sandbox):
    payload = bytes(range(256))
    assert sandbox.exec(["cat"], stdin=payload).stdout_bytes == payload


def test_exec_timeout_and_truncation(sandbox):
    slow = sandbox.exec("echo partial; sleep 100", timeout=0.5)
    assert slow.timed_out and slow.stdout == "partial\n"
    big = sandbox.exec("seq 1 1000000", max_output_bytes=1000)
    assert big.truncated and big.stdout_total == len("".join(f"{i}\n" for i in range(1, 1000001)))
    assert big.stdout.startswith("1\n2\n") and big.stdout.endswith("999999\n1000000\n")


def test_stream_yields_chunks_then_exit(sandbox):
    chunks = list(sandbox.stream("echo one; echo two >&2; exit 5"))
    assert chunks[-1].stream == "exit" and chunks[-1].exit_code == 5
    output = {c.stream: c.text for c in chunks[:-1]}
    assert output == {"stdout": "one\n", "stderr": "two\n"}


def test_execs_on_one_sandbox_are_serialised(orchestrator, sandbox):
    async def both():
        async with orchestrator.async_client() as client:
            sb = await client.get(sandbox.id)
            command = "mkdir /tmp/lock || exit 9; sleep 0.3; rmdir /tmp/lock"
            return await asyncio.gather(*(sb.exec(command) for _ in range(3)))

    assert [r.exit_code for r in asyncio.run(both())] == [0, 0, 0]


def test_files_through_the_sdk(sandbox, tmp_path):
    payload = os.urandom(300_000)
    sandbox.write_file("/workspace/data/blob.bin", payload, mode=0o640)
    assert sandbox.read_file("/workspace/data/blob.bin") == payload
    assert sandbox.stat("/workspace/data/blob.bin").mode == 0o640
    assert [f.name for f in sandbox.list_dir("/workspace/data")] == ["blob.bin"]
    local = tmp_path / "copy.bin"
    assert sandbox.download_file("/workspace/data/blob.bin", local) == len(payload)
    assert local.read_bytes() == payload
    sandbox.upload_file(local, "/workspace/data/again.bin")
    assert sandbox.exec("cmp /workspace/data/blob.bin /workspace/data/again.bin").ok
    sandbox.remove("/workspace/data/again.bin")
    assert not sandbox.exists("/workspace/data/again.bin")
    with pytest.raises(PathNotFound):
        sandbox.read_file("/workspace/data/missing")
    with pytest.raises(NotADirectory):
        sandbox.list_dir("/workspace/data/blob.bin")


def test_directory_round_trip(sandbox, tmp_path):
    source = tmp_path / "repo"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (source / "README").write_text("hi")
    sandbox.upload_dir(source, "/workspace/repo")
    assert sandbox.exec("python3 -c 'import pkg.mod as m; print(m.VALUE)'", cwd="/workspace/repo").stdout == "1\n"
    sandbox.exec("echo 2 > /workspace/repo/NEW").check()
    sandbox.download_dir("/workspace/repo", tmp_path / "back")
    assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    assert (tmp_path / "back" / "NEW").read_text() == "2\n"


def test_patch_through_the_sdk(sandbox):
    sandbox.write_file("/workspace/p/f.py", "x = 1\ny = 2\n")
    applied = sandbox.apply_patch("--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 10\n y = 2\n",
                                  cwd="/workspace/p")
    assert applied.applied and sandbox.read_file("/workspace/p/f.py") == b"x = 10\ny = 2\n"
    rejected = sandbox.apply_patch("--- a/f.py\n+++ b/f.py\n@@ -1,2 +1,2 @@\n-nope\n+no\n zip\n", cwd="/workspace/p")
    assert not rejected.applied and rejected.rejected[0].file == "f.py"


def test_background_process_through_the_sdk(sandbox):
    process = sandbox.start_process("python3 -m http.server 8765 --bind 127.0.0.1", name="web")
    fetch = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/').status)\""
    result = None
    for _ in range(200):  # the server needs a moment to bind
        result = sandbox.exec(fetch)
        if result.ok:
            break
    assert result is not None and result.stdout.strip() == "200"
    assert sandbox.process(process.id).running
    sandbox.kill_process(process.id)
    logs, offset = sandbox.process_logs(process.id)
    assert b"GET / HTTP" in logs and offset == len(logs)


def test_typed_errors(client, sandbox, orchestrator):
    with pytest.raises(SandboxNotFound):
        client.get("0" * 32)
    with pytest.raises(InvalidRequest):
        sandbox.exec("true", timeout=-1)
    with pytest.raises(InvalidRequest):
        client.create(memory="lots")
    with pytest.raises(AuthenticationError):
        SandboxClient(orchestrator.base_url, api_key="wrong").list()


def test_auth_is_required_on_every_v1_route(orchestrator, sandbox):
    for method, path in [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"), ("GET", f"/v1/sandboxes/{sandbox.id}"),
                         ("POST", f"/v1/sandboxes/{sandbox.id}/exec"), ("GET", f"/v1/sandboxes/{sandbox.id}/files")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": orchestrator.api_key}):
            response = httpx.request(method, orchestrator.base_url + path, headers=headers)
            assert response.status_code == 401 and response.json()["code"] == "unauthorized"
    assert httpx.get(orchestrator.base_url + "/health").status_code == 200


def test_openapi_and_metrics(orchestrator, sandbox):
    spec = httpx.get(orchestrator.base_url + "/openapi.json").json()
    paths = spec["paths"]
    assert "/v1/sandboxes/{sandbox_id}/exec" in paths and "/v1/sandboxes" in paths
    assert "ExecRequest" in str(paths["/v1/sandboxes/{sandbox_id}/exec"]) or "command" in str(paths)
    sandbox.exec("true")
    metrics = httpx.get(orchestrator.base_url + "/metrics").text
    assert 'orchard_hot_requests_total{route="exec",status="200"}' in metrics
    assert "orchard_sandboxes " in metrics


def test_sync_client_from_many_threads(client, sandbox):
    results, errors = [], []

    def work():
        try:
            results.append(sandbox.exec("echo hi").stdout)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and results == ["hi\n"] * 8


def test_a_caller_that_gives_up_kills_its_command(orchestrator, sandbox):
    async def give_up() -> None:
        async with orchestrator.async_client() as client:
            sb = await client.get(sandbox.id)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sb.exec("sleep 1000 & echo $! > /tmp/abandoned; wait", timeout=600), 1.0)

    asyncio.run(give_up())
    pid = sandbox.exec("cat /tmp/abandoned").check().stdout.strip()  # the exec lock was released
    wait_until(lambda: not sandbox.exec(f"kill -0 {pid}").ok, what="the abandoned command to be killed")


async def test_whole_hot_routes_answer_alike_through_the_fast_path_and_through_fastapi():
    """``exec``, ``patch`` and the other hot routes with whole bodies are served by the orchestrator's
    :class:`~orchard.env.fastpath.FastRoutes`; the FastAPI routes behind it (the schema's, and what an app
    run without the fast path serves) forward the same way and give the same answers."""
    from orchard.env.backends.local import LocalBackend
    from orchard.env.fastpath import FastRoutes
    from orchard.env.server.app import create_app
    from orchard.env.store.memory import MemoryStore

    state = tempfile.mkdtemp(prefix="orchard-fast-")  # short: the agent's socket path must fit in sun_path
    app = create_app(LocalBackend(state), MemoryStore(), "key", reap_interval=60)
    assert isinstance(app.app, FastRoutes)
    fastapi_app = app.app.app
    headers = {"Authorization": "Bearer key"}
    async with fastapi_app.router.lifespan_context(fastapi_app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://orchard", headers=headers) as client:
        created = await client.post("/v1/sandboxes", json={"isolation": "none", "ttl": 120})
        assert created.status_code == 201, created.text
        sandbox_id = created.json()["id"]
        base = f"/v1/sandboxes/{sandbox_id}"
        calls = [("POST", "/exec", {"command": "printf out; printf err >&2; exit 3"}),
                 ("POST", "/exec", {"command": ""}), ("POST", "/exec", {"command": "true", "cwd": "/nope"}),
                 ("GET", "/files/stat?path=/nope", None), ("POST", "/patch", {"diff": "not a diff"})]
        answers = {}
        try:
            for name, served in (("fast", app), ("fastapi", fastapi_app)):
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://orchard",
                                             headers=headers) as caller:
                    answers[name] = [(r.status_code, r.json()) for r in [
                        await caller.request(method, base + path, json=body) for method, path, body in calls]]
            gone = await client.post("/v1/sandboxes/no-such-sandbox/exec", json={"command": "true"})
        finally:
            await client.delete(base)
    shutil.rmtree(state, ignore_errors=True)
    for answer in answers.values():
        for _, body in answer:
            body.pop("duration", None)
    assert answers["fast"] == answers["fastapi"]
    assert [status for status, _ in answers["fast"]] == [200, 422, 400, 404, 200], answers["fast"]
    assert answers["fast"][4][1]["applied"] is False
    assert answers["fast"][0][1]["exit_code"] == 3 and answers["fast"][1][1]["detail"].startswith("body.command: ")
    assert (gone.status_code, gone.json()["code"]) == (404, "sandbox_not_found")
