"""The one OpenAI-compatible client: what it retries (429, 5xx, connection errors), how long it waits
(Retry-After, full jitter), and the clear errors it raises, against a real server on loopback."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from orchard.env.local import free_port
from orchard.rollout.openai_client import OpenAIClient, OpenAIError, RetryPolicy, parse_retry_after

FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.01)


class Scripted:
    """A loopback HTTP server answering each POST with the next (status, headers, body) of a script."""

    def __init__(self, script: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.script, self.paths = list(script), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.paths.append((self.path, self.headers.get("Authorization")))
                status, headers, body = server.script.pop(0)
                self.send_response(status)
                for name, value in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_port}/v1"

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


OK = (200, {"Content-Type": "application/json"}, json.dumps({"ok": True}).encode())


@pytest.fixture
def scripted():
    servers = []

    def make(*script):
        servers.append(Scripted(list(script)))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def test_429_and_5xx_are_retried_and_retry_after_is_obeyed(scripted):
    server = scripted((429, {"Retry-After": "0"}, b"slow down"), (503, {}, b"busy"), OK)
    client = OpenAIClient(server.url, "key", retry=FAST)
    assert client.post("/v1/chat/completions", {"x": 1}) == {"ok": True}
    assert server.paths == [("/v1/chat/completions", "Bearer key")] * 3
    client.close()


def test_what_is_not_worth_retrying_fails_at_once_with_the_status(scripted):
    server = scripted((400, {}, b'{"error": "bad request"}'), (200, {}, b"OK"), (200, {}, b""))
    client = OpenAIClient(server.url, retry=FAST)
    with pytest.raises(OpenAIError, match="answered 400: bad request") as bad:
        client.post("/v1/completions", {})
    assert bad.value.status == 400 and len(server.paths) == 1
    assert client.post("/collective_rpc", {}) is None  # a success with plain text, as some control routes answer
    assert client.post("/reset_prefix_cache", None) is None  # vLLM's empty 200
    client.close()


def test_the_retries_run_out_with_a_clear_error(scripted):
    server = scripted(*[(502, {}, b"bad gateway")] * 4)
    with pytest.raises(OpenAIError, match="answered 502 after 4 attempts") as error:
        OpenAIClient(server.url, retry=FAST).post("/v1/completions", {})
    assert error.value.status == 502 and len(server.paths) == 4
    refused = OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", retry=FAST)  # nothing listens there
    with pytest.raises(OpenAIError, match="failed after 4 attempts"):
        refused.post("/v1/completions", {})


def test_the_async_face_retries_the_same_way(scripted):
    server = scripted((429, {"Retry-After": "0"}, b""), (500, {}, b""), OK)

    async def run():
        client = OpenAIClient(server.url, retry=FAST)
        try:
            return await client.apost("/v1/chat/completions", {})
        finally:
            await client.aclose()

    assert asyncio.run(run()) == {"ok": True} and len(server.paths) == 3


def test_waits_are_full_jitter_or_what_the_server_asks():
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0, max_retry_after=30.0, rng=random.Random(0))
    for attempt in range(6):
        waits = [policy.delay(attempt) for _ in range(200)]
        cap = min(4.0, 0.5 * 2**attempt)
        assert all(0.0 <= w <= cap for w in waits) and max(waits) > 0.8 * cap and min(waits) < 0.2 * cap
    assert policy.delay(0, "2.5") == 2.5 and policy.delay(0, "3600") == 30.0  # capped
    assert policy.delay(0, "soon") <= 0.5  # unreadable: backoff as usual
    when = email.utils.format_datetime(email.utils.localtime().replace(microsecond=0), usegmt=False)
    assert parse_retry_after(when) == pytest.approx(0.0, abs=2.0)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    with pytest.raises(ValueError, match="invalid retry policy"):
        RetryPolicy(max_retries=-1)


def test_the_async_face_streams_long_events_and_survives_a_new_event_loop(scripted):
    ids = list(range(60_000))  # one event of ~400 KB: a streamed chunk carrying a long prompt's ids
    events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in ({"ids": ids}, {"n": 2})) + b"data: [DONE]\n\n"
    stream_reply = (200, {"Content-Type": "text/event-stream"}, events)
    server = scripted((503, {}, b"busy"), stream_reply, OK, stream_reply)
    client = OpenAIClient(server.url, retry=FAST)

    async def stream(client):
        return [event async for event in client.astream("/v1/chat/completions", {"stream": True})]

    assert asyncio.run(stream(client)) == [{"ids": ids}, {"n": 2}]
    assert asyncio.run(client.apost("/v1/completions", {})) == {"ok": True}  # another loop: a pool of its own
    asyncio.run(client.aclose())

    async def through_httpx():  # an injected client streams the same
        async with httpx.AsyncClient() as http:
            return await stream(OpenAIClient(server.url, retry=FAST, http_client=http))

    assert asyncio.run(through_httpx()) == [{"ids": ids}, {"n": 2}]

    async def refused():
        client = OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", retry=FAST)  # nothing listens there
        try:
            await client.apost("/v1/completions", {})
        finally:
            await client.aclose()

    with pytest.raises(OpenAIError, match="failed after 4 attempts"):
        asyncio.run(refused())
