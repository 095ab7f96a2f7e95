"""The grader's routes: audit log, full state and reset. Admin token only; never audited or faulted.

The token comes in :data:`ADMIN_HEADER`, not ``Authorization``: requests reach the services through
Orchard Env's port forward, which keeps ``Authorization`` for its own API key and stops it there.
What the grader reads (state and audit log) is signed: :data:`SIGNATURE_HEADER` carries the body's
HMAC-SHA256 under the admin token, so a server the policy puts on the services' port in their place
cannot answer for them (:func:`signature`)."""

import hashlib
import hmac
import json
from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Request, Response
from fastapi.encoders import jsonable_encoder

from .config import load_config
from .episode import Episode
from .errors import ServiceError

ADMIN_HEADER = "X-Claw-Admin-Token"
SIGNATURE_HEADER = "X-Claw-Signature"


def signature(token: str, body: bytes) -> str:
    """The body's HMAC-SHA256 under the admin token, in hex."""
    return hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def _signed(request: Request, payload: Any) -> Response:
    body = json.dumps(jsonable_encoder(payload)).encode()
    return Response(body, media_type="application/json",
                    headers={SIGNATURE_HEADER: signature(request.app.state.admin_token, body)})


def require_admin(request: Request, x_claw_admin_token: str = Header("")) -> None:
    """Refuse (401) a request without the admin token in :data:`ADMIN_HEADER`."""
    if not hmac.compare_digest(x_claw_admin_token.encode(), request.app.state.admin_token.encode()):
        raise ServiceError(401, "admin token required")


router = APIRouter(prefix="/_admin", dependencies=[Depends(require_admin)])


@router.get("/audit")
async def audit_log(request: Request) -> Response:
    return _signed(request, {"calls": request.app.state.episode.audit.calls})


@router.get("/state")
async def state(request: Request) -> Response:
    return _signed(request, request.app.state.episode.world.snapshot())


@router.post("/reset")
async def reset(request: Request, config: dict[str, Any] | None = Body(None)) -> dict:
    """Start a new episode from ``config`` (the defaults without a body): state, audit and faults."""
    try:
        request.app.state.episode = Episode.start(load_config(config or {}))
    except ValueError as error:
        raise ServiceError(400, str(error)) from None
    return {"status": "reset"}
