"""The hottest JSON routes served as raw ASGI, in front of a FastAPI app.

A trivial exec crosses two servers (orchestrator, then agent). On each, FastAPI's stack runs before the
handler: its error, telemetry, body-limit, exception and exit-stack middlewares, a linear scan of every
route's pattern, and its request parsing and validation. :class:`FastRoutes` answers the few routes a
rollout calls on every step (``POST /exec`` and its kin) itself: it matches the method and path with
string operations, reads the body, and hands the bytes to a handler that validates them with the
request model (pydantic, as FastAPI would) and returns the response bytes. Everything else, including
those routes' OpenAPI entries, stays with FastAPI.

Errors come back as the same problem documents FastAPI's handlers give (:mod:`orchard.env.problems`):
a :class:`~orchard.env.problems.ProblemError` as itself, a request that does not validate as a 422
``invalid_request`` whose detail names the fields under ``body`` (FastAPI's locations), anything else as a
logged 500 ``internal``. Two departures: the body is parsed as JSON whatever its ``content-type`` says, and
one over ``max_body`` bytes (16 MiB: a valid one is far smaller, its text fields capped at 1 MiB each) is
refused with a 413 ``invalid_request`` as soon as it passes the cap, without being held whole.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

from pydantic import ValidationError

from orchard.env.api import ErrorCode
from orchard.env.problems import ProblemError, problem_document, unexpected_problem, validation_detail

Receive = Callable[[], Awaitable[dict]]
Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True)
class Reply:
    """A whole response: status, body and headers (``content-length`` is added)."""

    status: int
    body: bytes
    headers: Headers


# (path parameter, query items, body, receive) -> the reply. ``receive`` is there for handlers that
# must notice a caller hanging up (the body has been read, so the next message is the disconnect).
Handler = Callable[[str, list[tuple[str, str]], bytes, Receive], Awaitable[Reply]]
# An exception the app knows -> (status, code, detail) of its problem, or None.
ProblemOf = Callable[[Exception], "tuple[int, ErrorCode, str] | None"]
JSON_HEADERS: Headers = [(b"content-type", b"application/json")]
MAX_BODY = 16 << 20


def problem_reply(status: int, code: ErrorCode, detail: str = "") -> Reply:
    return Reply(status, problem_document(status, code, detail).model_dump_json().encode(), [(b"content-type", b"application/problem+json")])


class FastRoutes:
    """Serve ``(method, suffix)`` routes under ``prefix`` here, the rest through ``app``.

    A request matches when its method is ``method`` and its path is ``prefix + parameter + suffix``, where
    the parameter is one non-empty path segment (the sandbox id on the orchestrator; with an empty
    ``prefix`` and no parameter, the path is ``suffix`` itself: pass ``parameter=False``). ``problem`` maps
    the app's own exceptions to problems, as its FastAPI exception handlers do (the agent's ``OSError``).
    """

    def __init__(self, app, routes: dict[tuple[str, str], Handler], prefix: str = "", parameter: bool = True,
                 problem: ProblemOf | None = None, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.max_body = max_body
        self.problem = problem
        self.routes = routes
        self.prefix = prefix
        self.parameter = parameter

    def _match(self, scope: dict) -> tuple[Handler, str] | None:
        path: str = scope["path"]
        if not self.parameter:
            handler = self.routes.get((scope["method"], path))
            return None if handler is None else (handler, "")
        if not path.startswith(self.prefix):
            return None
        rest = path[len(self.prefix):]
        cut = rest.find("/")
        if cut <= 0:
            return None
        handler = self.routes.get((scope["method"], rest[cut:]))
        return None if handler is None else (handler, rest[:cut])

    async def __call__(self, scope, receive, send) -> None:
        hit = self._match(scope) if scope["type"] == "http" else None
        if hit is None:
            await self.app(scope, receive, send)
            return
        handler, parameter = hit
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await self._send(send, problem_reply(413, ErrorCode.INVALID_REQUEST,
                                                     f"the request body is over {self.max_body} bytes"))
                return
            if not message.get("more_body"):
                break
        query = _query_items(scope.get("query_string", b""))
        try:
            reply = await handler(parameter, query, bytes(body), receive)
        except ProblemError as exc:
            reply = problem_reply(exc.status, exc.code, exc.detail)
        except ValidationError as exc:
            reply = problem_reply(422, ErrorCode.INVALID_REQUEST, body_validation_detail(exc))
        except Exception as exc:
            known = self.problem(exc) if self.problem is not None else None
            reply = problem_reply(*(known or unexpected_problem(scope["method"], scope["path"], exc)))
        await self._send(send, reply)

    @staticmethod
    async def _send(send, reply: Reply) -> None:
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [*reply.headers, (b"content-length", str(len(reply.body)).encode())]})
        await send({"type": "http.response.body", "body": reply.body})


def body_validation_detail(exc: ValidationError) -> str:
    """The validation detail with FastAPI's locations (``body.field``), whichever path validated it."""
    return validation_detail([{**error, "loc": ("body", *error.get("loc", ()))} for error in exc.errors()])


def _query_items(query_string: bytes) -> list[tuple[str, str]]:
    return [] if not query_string else parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)


def json_reply(text: str | bytes, status: int = 200) -> Reply:
    return Reply(status, text.encode() if isinstance(text, str) else text, JSON_HEADERS)

