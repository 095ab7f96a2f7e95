"""Bearer-token authentication as a pure ASGI middleware (cheaper than a per-route dependency).

The orchestrator checks the client's API key; the agent checks its per-sandbox token; on HTTP
requests and WebSocket handshakes alike. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import json

from orchard.env.api import ErrorCode, Problem

_UNAUTHORIZED = json.dumps(
    Problem(title="unauthorized", status=401, code=ErrorCode.UNAUTHORIZED,
            detail="missing or wrong bearer token").model_dump(mode="json")
).encode()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class BearerAuth:
    def __init__(self, app, token: str, exempt: frozenset[str] = frozenset()) -> None:
        if not token:
            raise ValueError("an empty token would let anyone in")
        self.app = app
        self.expected = f"Bearer {token}".encode()
        self.exempt = exempt

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        presented = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                presented = value
                break
        if hmac.compare_digest(presented, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # refuse the handshake (the server answers it with a 403)
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or wrong bearer token"})
            return
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(_UNAUTHORIZED)).encode()),
            (b"www-authenticate", b"Bearer"),
        ]})
        await send({"type": "http.response.body", "body": _UNAUTHORIZED})
