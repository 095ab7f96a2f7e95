"""One hop of a port forward: an HTTP request relayed to another server, its answer streamed back,
or a WebSocket joined to one that server accepts.

The orchestrator relays ``/v1/sandboxes/{id}/ports/{port}/...`` to the sandbox's agent, and the
agent relays ``/ports/{port}/...`` to that port on the sandbox's own loopback; both hops are this
function. The request body is read whole (port forwards carry API calls and pages, not uploads);
the answer streams through as it arrives, its status and headers kept (repeated ones too). Hop-by-
hop headers and ``Authorization`` stop at each hop: the caller's API key never reaches the agent,
nor the agent's token the server in the sandbox. aiohttp's errors are the caller's to map, but
for WebSockets, where a refused connection is a handshake refused (a 403) with a close reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

STOPPED_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                             "trailer", "trailers", "transfer-encoding", "upgrade", "host", "authorization",
                             "content-length"})


async def relay(session: aiohttp.ClientSession, url: str, request: Request) -> StreamingResponse:
    """``request`` (its method, query, headers and body) sent to ``url``; the answer as it streams in."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in STOPPED_HEADERS}
    body = await request.body()
    response = await session.request(request.method, url, params=list(request.query_params.multi_items()),
                                     data=body or None, headers=headers, allow_redirects=False)

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.content.iter_any():
                yield chunk
        finally:
            response.release()

    answer = StreamingResponse(chunks(), status_code=response.status)
    answer.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                          for k, v in response.headers.items() if k.lower() not in STOPPED_HEADERS]
    return answer


async def relay_websocket(websocket: WebSocket, session: aiohttp.ClientSession, url: str) -> None:
    """Connect to ``url`` (``http://``), then accept ``websocket`` and pass messages both ways, text
    as text and bytes as bytes, until either side closes; its close code passes on to the other."""
    headers = {k: v for k, v in websocket.headers.items()
               if k.lower() not in STOPPED_HEADERS and not k.lower().startswith("sec-websocket")}
    protocols = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        upstream = await session.ws_connect(url, headers=headers, protocols=protocols, max_msg_size=0,
                                            params=list(websocket.query_params.multi_items()))
    except (TimeoutError, aiohttp.ClientError) as exc:
        await websocket.close(code=1011, reason=f"the connection was refused: {exc}"[:120])
        return
    await websocket.accept(subprotocol=upstream.protocol)

    async def down() -> int:
        async for message in upstream:
            if message.type is aiohttp.WSMsgType.TEXT:
                await websocket.send_text(message.data)
            elif message.type is aiohttp.WSMsgType.BINARY:
                await websocket.send_bytes(message.data)
        return upstream.close_code or 1000

    async def up() -> int:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return message.get("code", 1000)
            if message.get("text") is not None:
                await upstream.send_str(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send_bytes(message["bytes"])

    tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finished = done.pop()
        code = finished.result() if not finished.exception() else 1011
        if finished is tasks[0]:  # the server closed: tell the client
            with contextlib.suppress(RuntimeError, WebSocketDisconnect):
                await websocket.close(code=code)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
