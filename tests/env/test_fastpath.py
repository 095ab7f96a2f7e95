"""FastRoutes: the hot routes as raw ASGI in front of FastAPI, and the same answers FastAPI gives."""

from __future__ import annotations

import asyncio
import errno
import json
import logging

import pytest
from pydantic import BaseModel, Field

from orchard.env.api import ErrorCode
from orchard.env.fastpath import FastRoutes, Reply, json_reply
from orchard.env.problems import ProblemError


class Body(BaseModel):
    name: str = Field(min_length=1)


async def call(app, method: str, path: str, body: bytes = b"", query: bytes = b"", chunks: int = 1,
               disconnect: bool = False) -> tuple[int | None, dict, bytes]:
    """Drive ``app`` with one HTTP request (its body in ``chunks`` messages); the status, headers and body sent."""
    size = -(-len(body) // chunks) if body else 0
    messages = [{"type": "http.request", "body": body[i * size:(i + 1) * size], "more_body": i < chunks - 1}
                for i in range(chunks)]
    if disconnect:
        messages = [*messages[:1], {"type": "http.disconnect"}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": []}
    await app(scope, receive, send)
    if not sent:
        return None, {}, b""
    return (sent[0]["status"], {k.decode(): v.decode() for k, v in sent[0]["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


class Fallback:
    """The app behind the fast path: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send) -> None:
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"fallback"})


def routes() -> tuple[FastRoutes, Fallback, list]:
    seen = []

    async def echo(parameter: str, query: list[tuple[str, str]], body: bytes, _receive) -> Reply:
        seen.append((parameter, query, body))
        return json_reply(Body.model_validate_json(body).model_dump_json())

    async def refuse(*_) -> Reply:
        raise ProblemError(404, ErrorCode.SANDBOX_NOT_FOUND, "no such sandbox")

    async def os_error(*_) -> Reply:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/gone")

    async def crash(*_) -> Reply:
        raise RuntimeError("boom")

    fallback = Fallback()
    fast = FastRoutes(fallback, {("POST", "/echo"): echo, ("POST", "/refuse"): refuse, ("POST", "/os"): os_error,
                                 ("POST", "/crash"): crash},
                      prefix="/v1/sandboxes/",
                      problem=lambda exc: (404, ErrorCode.PATH_NOT_FOUND, "gone") if isinstance(exc, OSError) else None)
    return fast, fallback, seen


async def test_a_matching_request_is_answered_here_with_its_parameter_query_and_whole_body():
    fast, fallback, seen = routes()
    status, headers, body = await call(fast, "POST", "/v1/sandboxes/sb-1/echo", b'{"name": "abc"}', b"a=1&a=2&b=",
                                       chunks=3)
    assert (status, json.loads(body)) == (200, {"name": "abc"})
    assert headers == {"content-type": "application/json", "content-length": str(len(body))}
    assert seen == [("sb-1", [("a", "1"), ("a", "2"), ("b", "")], b'{"name": "abc"}')] and fallback.paths == []


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/sandboxes/sb-1/echo"),  # another method
    ("POST", "/v1/sandboxes//echo"),  # no parameter
    ("POST", "/v1/sandboxes/echo"),  # no suffix
    ("POST", "/v1/sandboxes/sb-1/echo/more"),  # a longer path
    ("POST", "/v2/sandboxes/sb-1/echo"),  # another prefix
])
async def test_anything_else_goes_to_the_app(method, path):
    fast, fallback, seen = routes()
    assert await call(fast, method, path, b"{}") == (299, {}, b"fallback")
    assert fallback.paths == [path] and seen == []


async def test_errors_become_the_problems_fastapi_would_answer(caplog):
    fast, _, _ = routes()
    prefix = "/v1/sandboxes/sb-1"
    cases = {"/refuse": (404, "sandbox_not_found", "no such sandbox"), "/os": (404, "path_not_found", "gone")}
    for suffix, (status, code, detail) in cases.items():
        got, headers, body = await call(fast, "POST", prefix + suffix, b"{}")
        problem = json.loads(body)
        assert (got, problem["status"], problem["code"], problem["detail"]) == (status, status, code, detail)
        assert headers["content-type"] == "application/problem+json"
    # A body that does not validate names its fields under "body", as FastAPI's own 422 does.
    status, _, body = await call(fast, "POST", prefix + "/echo", b'{"name": ""}')
    assert status == 422 and json.loads(body)["detail"].startswith("body.name: ")
    status, _, body = await call(fast, "POST", prefix + "/echo", b"{not json")
    assert status == 422 and json.loads(body)["code"] == "invalid_request"
    with caplog.at_level(logging.ERROR, logger="orchard.env.fastpath"):
        status, _, body = await call(fast, "POST", prefix + "/crash", b"{}")
    assert status == 500 and json.loads(body)["detail"] == "RuntimeError: boom"
    assert "unhandled error on POST /v1/sandboxes/sb-1/crash" in caplog.text


async def test_a_caller_gone_before_its_body_arrived_gets_nothing_and_runs_nothing():
    fast, _, seen = routes()
    assert await call(fast, "POST", "/v1/sandboxes/sb-1/echo", b'{"name": "abc"}', chunks=2, disconnect=True) == (
        None, {}, b"")
    assert seen == []


async def test_a_body_over_the_cap_is_refused_before_it_is_read_whole():
    fallback = Fallback()
    seen = []

    async def echo(*args) -> Reply:
        seen.append(args)
        return json_reply("{}")

    fast = FastRoutes(fallback, {("POST", "/exec"): echo}, parameter=False, max_body=1000)
    status, _, body = await call(fast, "POST", "/exec", b"x" * 5000, chunks=10)
    problem = json.loads(body)
    assert (status, problem["code"], problem["detail"]) == (413, "invalid_request", "the request body is over 1000 bytes")
    assert seen == [] and fallback.paths == []
    assert (await call(fast, "POST", "/exec", b"x" * 1000, chunks=3))[0] == 200
