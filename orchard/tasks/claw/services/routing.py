"""What every policy-facing route shares: audit, fault injection, error shapes and access to the world.

``AuditedRoute`` is the route class of the service routers. It wraps each route's handler once, so no
route has to remember to audit itself: it draws the call's fault, serves it (or not), turns errors into
``{"error": "..."}`` responses and appends the call to the episode's audit log.
"""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from .config import ServicesConfig
from .episode import Episode
from .errors import ServiceError
from .world import World

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]


class RequestBody(BaseModel):
    """A JSON request body; unknown fields are errors, so a misspelt argument is not silently dropped."""

    model_config = ConfigDict(extra="forbid")


def current_world(request: Request) -> World:
    """The world of the episode this request belongs to (set by ``AuditedRoute``)."""
    return request.state.episode.world


WorldDep = Annotated[World, Depends(current_world)]


def validation_message(error: RequestValidationError) -> str:
    """``<field>: <problem>`` for each problem, the field named without its location (body, query)."""
    problems = []
    for item in error.errors():
        if item["type"] == "json_invalid":
            problems.append("body: invalid JSON")
            continue
        location = [str(part) for part in item["loc"]]
        problems.append(f"{'.'.join(location[1:]) or location[0]}: {item['msg']}")
    return "; ".join(problems)


def error_response(error: ServiceError | RequestValidationError) -> JSONResponse:
    """The response for a refused request; FastAPI's 422 for invalid input becomes a 400."""
    if isinstance(error, RequestValidationError):
        return JSONResponse({"error": validation_message(error)}, status_code=400)
    return JSONResponse({"error": error.message}, status_code=error.status)


def fault_response(fault: str, config: ServicesConfig) -> JSONResponse:
    """The response of an injected ``rate_limit`` (429) or ``server_error`` (500)."""
    if fault == "rate_limit":
        headers = {"Retry-After": str(config.retry_after_seconds)}
        return JSONResponse({"error": "rate limited"}, status_code=429, headers=headers)
    return JSONResponse({"error": "internal error"}, status_code=500)


async def describe_request(request: Request) -> dict[str, Any]:
    """The request as the audit log shows it; a body that is not JSON is kept as text."""
    raw = await request.body()
    body: Any = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
    return {"path_params": dict(request.path_params), "query": dict(request.query_params), "body": body}


def audit(episode: Episode, request: Request, endpoint: str | None, call: dict[str, Any],
          response: Response, fault: str | None) -> None:
    """Append a finished call, with its JSON response, to the episode's audit log."""
    episode.audit.record(
        method=request.method,
        path=request.url.path,
        endpoint=endpoint,
        request=call,
        status=response.status_code,
        response=json.loads(response.body),
        fault=fault,
    )


async def serve(handle: Handler, request: Request) -> Response:
    """Run a route's handler, turning every error into a JSON response (never an exception)."""
    try:
        return await handle(request)
    except (ServiceError, RequestValidationError) as error:
        return error_response(error)
    except Exception:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return JSONResponse({"error": "internal error"}, status_code=500)


class AuditedRoute(APIRoute):
    """A route whose calls are audited and subject to the episode's seeded faults."""

    inject_faults = True

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        template = self.path_format
        inject_faults = self.inject_faults

        async def audited(request: Request) -> Response:
            # A reset during a slow call must not mix two episodes: the call keeps the one it started in.
            episode: Episode = request.app.state.episode
            request.state.episode = episode
            endpoint = f"{request.method} {template}"
            call = await describe_request(request)
            fault = episode.faults.next_fault(endpoint) if inject_faults else None
            if fault == "slow":
                await asyncio.sleep(episode.config.slow_seconds)
            if fault in ("rate_limit", "server_error"):
                response: Response = fault_response(fault, episode.config)
            else:
                response = await serve(handle, request)
            audit(episode, request, endpoint, call, response, fault)
            return response

        return audited


class UnfaultedRoute(AuditedRoute):
    """An audited route that faults never touch (``POST /answer``: the episode's result)."""

    inject_faults = False
