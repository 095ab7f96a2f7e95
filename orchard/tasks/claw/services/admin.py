"""The grader's routes: audit log, full state and reset. Admin token only; never audited or faulted.

The token comes in :data:`ADMIN_HEADER`, not ``Authorization``: requests reach the services through
Orchard Env's port forward, which keeps ``Authorization`` for its own API key and stops it there."""

import hmac
from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Request

from .config import load_config
from .episode import Episode
from .errors import ServiceError

ADMIN_HEADER = "X-Claw-Admin-Token"


def require_admin(request: Request, x_claw_admin_token: str = Header("")) -> None:
    """Refuse (401) a request without the admin token in :data:`ADMIN_HEADER`."""
    if not hmac.compare_digest(x_claw_admin_token.encode(), request.app.state.admin_token.encode()):
        raise ServiceError(401, "admin token required")


router = APIRouter(prefix="/_admin", dependencies=[Depends(require_admin)])


@router.get("/audit")
async def audit_log(request: Request) -> dict:
    return {"calls": request.app.state.episode.audit.calls}


@router.get("/state")
async def state(request: Request) -> dict:
    return request.app.state.episode.world.snapshot()


@router.post("/reset")
async def reset(request: Request, config: dict[str, Any] | None = Body(None)) -> dict:
    """Start a new episode from ``config`` (the defaults without a body): state, audit and faults."""
    try:
        request.app.state.episode = Episode.start(load_config(config or {}))
    except ValueError as error:
        raise ServiceError(400, str(error)) from None
    return {"status": "reset"}
