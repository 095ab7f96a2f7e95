"""SDK behaviour that needs no sandbox: retries, typed errors, async and sync faces."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from orchard.env import AsyncSandboxClient, AuthenticationError, OrchardConnectionError, SandboxClient
from orchard.env.client import AgentUnavailable, BackendUnavailable, ServerError
from orchard.env.local import free_port
from tests.conftest import wait_until


@pytest.fixture(scope="module")
def flaky_server():
    """A real HTTP server on loopback that fails in scripted ways and counts the calls it gets."""
    calls: Counter = Counter()
    app = FastAPI()

    def unavailable(code: str = "backend_error") -> JSONResponse:
        return JSONResponse({"code": code, "status": 503, "title": "x", "detail": "try later"}, status_code=503)

    @app.get("/v1/sandboxes")
    async def list_sandboxes():
        calls["list"] += 1
        return unavailable() if calls["list"] % 3 else {"sandboxes": []}

    @app.get("/v1/sandboxes/{sandbox_id}")
    async def always_down(sandbox_id: str):
        calls["get"] += 1
        return unavailable()

    @app.post("/v1/sandboxes")
    async def create():
        calls["create"] += 1
        return unavailable()

    @app.get("/health")
    async def broken():
        calls["health"] += 1
        return JSONResponse({"unexpected": True}, status_code=500)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="stub server")
    yield f"http://127.0.0.1:{port}", calls
    server.should_exit = True
    thread.join(10)


def test_idempotent_calls_are_retried_on_503(flaky_server):
    url, calls = flaky_server
    before = calls["list"]
    with SandboxClient(url, api_key="k") as client:
        assert client.list() == []
    assert calls["list"] - before == 3  # two 503s, then success


def test_retries_give_up_with_a_typed_error(flaky_server):
    url, calls = flaky_server
    with SandboxClient(url, api_key="k", max_retries=2) as client, pytest.raises(BackendUnavailable) as error:
        client.get("abc")
    assert error.value.status == 503 and calls["get"] == 3


def test_non_idempotent_calls_are_not_retried(flaky_server):
    url, calls = flaky_server
    with SandboxClient(url, api_key="k") as client, pytest.raises(BackendUnavailable):
        client.create()
    assert calls["create"] == 1


def test_unexpected_errors_are_server_errors(flaky_server):
    url, _ = flaky_server
    with SandboxClient(url, api_key="k") as client, pytest.raises(ServerError) as error:
        client.health()
    assert error.value.status == 500


def test_connection_errors_are_typed():
    with SandboxClient(f"http://127.0.0.1:{free_port()}", api_key="k", max_retries=1) as client, \
            pytest.raises(OrchardConnectionError):
        client.list()


def test_missing_api_key_is_an_authentication_error(monkeypatch):
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    with pytest.raises(AuthenticationError):
        AsyncSandboxClient("http://127.0.0.1:1")


def test_error_codes_map_to_classes():
    from orchard.env.client import _raise_for_problem

    with pytest.raises(AgentUnavailable):
        _raise_for_problem(502, b'{"code": "agent_unavailable", "detail": "gone"}')
    with pytest.raises(ServerError):
        _raise_for_problem(500, b"<html>not json</html>")


async def test_async_client_end_to_end(orchestrator):
    async with orchestrator.async_client() as client:
        async with client.create(memory="256Mi") as sb:
            result = await sb.exec(["echo", "async"])
            assert result.stdout == "async\n"
            chunks = [chunk async for chunk in sb.stream("printf 'a\\nb\\n'")]
            assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"a\nb\n"
            assert sb.id in {info.id for info in await client.list()}
        assert sb.id not in {info.id for info in await client.list()}
