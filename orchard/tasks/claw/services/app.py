"""The services as one FastAPI application: the service routers, admin, health and error handling."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from . import admin
from .config import load_config
from .episode import Episode
from .errors import ServiceError
from .routes import ROUTERS
from .routing import audit, describe_request, error_response


async def refused(request: Request, error: Exception) -> JSONResponse:
    """A ``ServiceError`` or invalid input outside the service routes (admin): ``{"error": ...}``."""
    assert isinstance(error, ServiceError | RequestValidationError)
    return error_response(error)


async def unmatched(request: Request, error: Exception) -> JSONResponse:
    """The framework's own refusals, mostly no route (404) or method (405); audited unless on an admin path."""
    assert isinstance(error, HTTPException)
    messages = {
        404: f"no route {request.method} {request.url.path}",
        405: f"method {request.method} not allowed on {request.url.path}",
    }
    message = messages.get(error.status_code, str(error.detail))
    response = JSONResponse({"error": message}, status_code=error.status_code, headers=error.headers)
    if not request.url.path.startswith(("/_admin", "/health")):
        audit(request.app.state.episode, request, None, await describe_request(request), response, None)
    return response


def create_app(config: dict[str, Any], admin_token: str) -> FastAPI:
    """The services, starting from ``config`` (a services config; ValueError if invalid).

    ``admin_token`` guards ``/_admin/*`` (header ``X-Claw-Admin-Token``); it must not be empty.
    """
    if not admin_token:
        raise ValueError("the admin token must not be empty")
    app = FastAPI(title="Orchard-Claw services", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.episode = Episode.start(load_config(config))
    app.state.admin_token = admin_token

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    app.include_router(admin.router)
    for router in ROUTERS:
        app.include_router(router)
    app.add_exception_handler(ServiceError, refused)
    app.add_exception_handler(RequestValidationError, refused)
    app.add_exception_handler(HTTPException, unmatched)
    return app
