"""Problem-detail errors and JSON responses shared by the agent and the orchestrator.

Both servers raise :class:`ProblemError` and install :func:`install_problem_handlers`, so every
error, including request-validation errors and unexpected exceptions, is answered with a JSON
problem body that carries a stable ``code``, never with a bare 500 and a stack trace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchard.env.api import ErrorCode, Problem

log = logging.getLogger(__name__)
T = TypeVar("T")

_STATUS_CODES = {
    401: ErrorCode.UNAUTHORIZED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    400: ErrorCode.INVALID_REQUEST,
    422: ErrorCode.INVALID_REQUEST,
}


class ProblemError(Exception):
    """An error that becomes a problem-detail response."""

    def __init__(self, status: int, code: ErrorCode, detail: str = "") -> None:
        super().__init__(detail or code.value)
        self.status = status
        self.code = code
        self.detail = detail


def problem_document(status: int, code: ErrorCode, detail: str = "") -> Problem:
    return Problem(title=code.value.replace("_", " "), status=status, code=code, detail=detail)


def problem_response(status: int, code: ErrorCode, detail: str = "", headers: dict | None = None) -> JSONResponse:
    body = problem_document(status, code, detail)
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers,
                        media_type="application/problem+json")


def json_response(model: BaseModel, status: int = 200) -> Response:
    """Serialise a model with pydantic's own encoder (faster than FastAPI's generic path)."""
    return Response(model.model_dump_json(), status_code=status, media_type="application/json")


def unexpected_problem(method: str, path: str, exc: Exception) -> tuple[int, ErrorCode, str]:
    """Log an error no handler expected; the 500 problem (status, code, detail) that answers it."""
    log.exception("unhandled error on %s %s", method, path)
    return 500, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"[:500]


def validation_detail(errors: list[dict]) -> str:
    """One line per validation error: ``location: message``."""
    return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors)[:2000]


async def cancel_on_disconnect(receive: Callable[[], Awaitable[dict]], work: Awaitable[T]) -> T:
    """Await ``work``, but cancel it if the client hangs up first.

    ASGI servers do not cancel a handler whose client went away, so a command would run on to its
    own timeout (holding the sandbox's exec lock) after the caller gave up. Only for requests
    whose body has been read: the next ``receive`` (the ASGI one, or ``Request.receive``) then waits
    for the disconnect. The work runs in the handler's own task, which a hang-up cancels (one watcher
    task per request, not two tasks and a wait: this is on every exec's path).
    """
    handler = asyncio.current_task()
    assert handler is not None, "cancel_on_disconnect runs in a request's task"

    async def hang_up() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        handler.cancel()  # nobody is there to answer: stop the work (and the handler) where it is

    watcher = asyncio.ensure_future(hang_up())
    try:
        return await work
    finally:
        watcher.cancel()


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(422, ErrorCode.INVALID_REQUEST, validation_detail(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        return problem_response(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(*unexpected_problem(request.method, request.url.path, exc))
