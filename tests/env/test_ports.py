"""Port forwards: HTTP from the SDK, through the orchestrator and the agent, to a server listening on
a sandbox's own loopback (a real aiohttp server in a ``network="none"`` sandbox)."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest

from benchmarks.ports import start_echo_server
from orchard.env.local import free_port
from tests.conftest import require_root


@pytest.fixture(scope="module")
def served(client):
    """A sandbox with no network, an HTTP and WebSocket server on its loopback, and that server's port."""
    require_root()
    with client.create(memory="512Mi", pids=256, network="none") as sb:
        yield sb, sb.run_async(start_echo_server)


def test_requests_reach_the_server_and_come_back_whole(served):
    sb, port = served
    reply = httpx.post(sb.port_url(port, "/echo/a/b"), params={"q": "1", "r": "two"}, content=b"payload",
                       headers={**sb.port_headers, "X-Custom": "kept"}, timeout=30)
    assert reply.status_code == 200
    seen = reply.json()
    received = {name.lower(): value for name, value in seen["headers"].items()}  # names are case-insensitive
    assert (seen["method"], seen["path"], seen["query"], seen["body"]) == ("POST", "/echo/a/b", "q=1&r=two", "payload")
    assert received["x-custom"] == "kept"
    assert "authorization" not in received  # neither the API key nor the agent's token gets through
    assert reply.headers.get_list("set-cookie") == ["a=1", "b=2"]  # repeated headers are kept
    for method in ("PUT", "PATCH", "DELETE"):
        assert httpx.request(method, sb.port_url(port, "/echo/x"), headers=sb.port_headers,
                             timeout=30).json()["method"] == method
    with httpx.stream("GET", sb.port_url(port, "/stream"), headers=sb.port_headers, timeout=30) as streamed:
        assert list(streamed.iter_lines()) == ["chunk 0", "chunk 1", "chunk 2"]


def test_bad_requests_get_clear_errors_and_nothing_else_reaches_the_port(served, client):
    sb, port = served
    assert httpx.get(sb.port_url(port)).status_code == 401  # no API key
    closed = httpx.get(sb.port_url(free_port()), headers=sb.port_headers, timeout=30)
    assert closed.status_code == 502 and closed.json()["code"] == "port_unreachable"
    bad_port = httpx.get(sb.port_url(port).replace(f"/ports/{port}/", "/ports/70000/"), headers=sb.port_headers)
    assert bad_port.status_code == 422
    unknown = httpx.get(sb.port_url(port).replace(sb.id, "nosuchsandbox"), headers=sb.port_headers)
    assert unknown.status_code == 404 and unknown.json()["code"] == "sandbox_not_found"
    with pytest.raises(ValueError):
        sb.port_url(0)
    with pytest.raises(httpx.ConnectError):  # the sandbox's loopback is its own
        httpx.get(f"http://127.0.0.1:{port}/", timeout=5)


def test_port_request_gives_the_server_s_answer_and_raises_only_for_the_forward(served):
    from orchard.env.client import OrchardError

    sb, port = served
    reply = sb.port_request(port, "POST", "/echo/x", json={"a": 1}, params={"flag": True})
    assert reply.status == 200 and reply.json()["query"] == "flag=true" and reply.json()["body"] == '{"a": 1}'
    missing = sb.port_request(port, "GET", "/no/such/route")  # the server's own 404 is an answer
    assert missing.status == 404 and "Not Found" in missing.text
    with pytest.raises(OrchardError) as raised:  # nothing listens: the forward's problem, typed
        sb.port_request(free_port(), "GET", "/")
    assert raised.value.status == 502 and raised.value.code == "port_unreachable"


async def _talk(url: str, headers: dict[str, str]) -> tuple:
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers, protocols=("echo",)) as ws:
        await ws.send_str("hi")
        text = await ws.receive_str()
        await ws.send_bytes(b"abc")
        data = await ws.receive_bytes()
        await ws.send_str("bye")  # the server closes with its own code
        closing = await ws.receive()
        return ws.protocol, text, data, closing.type, ws.close_code


def test_a_websocket_reaches_the_server_and_its_close_code_comes_back(served):
    sb, port = served
    url = sb.port_url(port, "/ws?room=7", websocket=True)
    assert url.startswith("ws://")
    assert asyncio.run(_talk(url, sb.port_headers)) == ("echo", "echo: hi (room=7)", b"cba",
                                                       aiohttp.WSMsgType.CLOSE, 4001)
    for refused, headers in ((url, {}), (sb.port_url(free_port(), "/ws", websocket=True), sb.port_headers),
                             (url.replace(sb.id, "nosuchsandbox"), sb.port_headers)):
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:  # no key, nothing listening, no sandbox
            asyncio.run(_talk(refused, headers))
        assert caught.value.status == 403
