"""The orchestrator's HTTP routes: lifecycle under ``/v1/sandboxes`` and the forwarded hot path.

Hot routes are generated from :data:`orchard.env.api.HOT_ROUTES`. JSON bodies are validated here
(so a malformed request never reaches a sandbox) and then forwarded as the same bytes; raw bodies
and streamed responses are piped through without being held in memory.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from fastapi import APIRouter, FastAPI, Query, Request, Response, WebSocket
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from orchard.env import api
from orchard.env.fastpath import FastRoutes, Handler, Receive, Reply, body_validation_detail
from orchard.env.problems import ProblemError, cancel_on_disconnect, json_response
from orchard.env.relay import relay, relay_websocket
from orchard.env.server.agents import AgentError
from orchard.env.server.lifecycle import SandboxManager
from orchard.env.server.pools import WarmPools

_PASS_HEADERS = ("content-type", "content-length", api.NEXT_OFFSET_HEADER)


def lifecycle_router(manager: SandboxManager, pools: WarmPools) -> APIRouter:
    router = APIRouter(prefix=f"{api.API_PREFIX}/sandboxes", tags=["sandboxes"])

    @router.post("", status_code=201, response_model=api.SandboxInfo)
    async def create_sandbox(spec: api.SandboxSpec, wait: bool = True) -> Response:
        return json_response(await pools.create(spec, wait=wait), 201)

    @router.get("", response_model=api.SandboxList)
    async def list_sandboxes() -> Response:
        idle = pools.idle()
        return json_response(api.SandboxList(sandboxes=[i for i in await manager.list() if i.id not in idle]))

    @router.get("/{sandbox_id}", response_model=api.SandboxInfo)
    async def get_sandbox(sandbox_id: str) -> Response:
        return json_response((await manager.record(sandbox_id, fresh=True)).info)

    @router.delete("/{sandbox_id}", status_code=204)
    async def delete_sandbox(sandbox_id: str) -> Response:
        await manager.delete(sandbox_id)
        return Response(status_code=204)

    @router.post("/{sandbox_id}/wait", response_model=api.SandboxInfo)
    async def wait_sandbox(sandbox_id: str, timeout: float = Query(60.0, gt=0, le=600)) -> Response:
        return json_response(await manager.wait_ready(sandbox_id, timeout))

    @router.post("/{sandbox_id}/heartbeat", response_model=api.SandboxInfo)
    async def heartbeat(sandbox_id: str) -> Response:
        return json_response(await manager.heartbeat(sandbox_id))

    @router.post("/{sandbox_id}/snapshot", status_code=201, response_model=api.SnapshotInfo)
    async def snapshot(sandbox_id: str) -> Response:
        return json_response(await manager.snapshot(sandbox_id), 201)

    @router.post("/{sandbox_id}/fork", status_code=201, response_model=api.SandboxList)
    async def fork(sandbox_id: str, request: api.ForkRequest) -> Response:
        return json_response(api.SandboxList(sandboxes=await manager.fork(sandbox_id, request.n, request.ttl)), 201)

    return router


def pool_router(pools: WarmPools) -> APIRouter:
    router = APIRouter(prefix=f"{api.API_PREFIX}/pools", tags=["pools"])

    @router.put("", response_model=api.PoolInfo)
    async def configure_pool(request: api.PoolRequest) -> Response:
        return json_response(await pools.configure(request.spec, request.size))

    @router.get("", response_model=api.PoolList)
    async def list_pools() -> Response:
        return json_response(api.PoolList(pools=pools.list()))

    return router


def snapshot_router(manager: SandboxManager) -> APIRouter:
    router = APIRouter(prefix=f"{api.API_PREFIX}/snapshots", tags=["snapshots"])

    @router.get("", response_model=api.SnapshotList)
    async def list_snapshots() -> Response:
        return json_response(api.SnapshotList(snapshots=await manager.backend.list_snapshots()))

    @router.delete("/{snapshot_id}", status_code=204)
    async def delete_snapshot(snapshot_id: str) -> Response:
        await manager.backend.delete_snapshot(snapshot_id)
        return Response(status_code=204)

    return router


def _openapi(route: api.HotRoute) -> dict:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in ("process_id",) if f"{{{name}}}" in route.path
    ]
    parameters += [
        {"name": name, "in": "query", "required": required, "schema": {"type": kind}}
        for name, kind, required in route.query
    ]
    extra: dict = {"parameters": parameters}
    if isinstance(route.body, type):
        extra["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": route.body.model_json_schema()}}}
    elif route.body == "raw":
        extra["requestBody"] = {"required": True, "content": {"application/octet-stream": {
            "schema": {"type": "string", "format": "binary"}}}}
    return extra


def _responses(route: api.HotRoute) -> dict:
    media = {"raw": "application/octet-stream", "ndjson": "application/x-ndjson"}.get(route.response)
    return {200: {"content": {media: {"schema": {"type": "string", "format": "binary"}}}}} if media else {}


def _fast(route: api.HotRoute) -> bool:
    """Whether :class:`~orchard.env.fastpath.FastRoutes` serves ``route``: a whole (unstreamed) body each way and
    no path parameter but the sandbox's id."""
    return route.body != "raw" and route.response not in ("raw", "ndjson") and "{" not in route.path


def _check_body(model: type[BaseModel], body: bytes) -> None:
    """Refuse a body that does not validate (422) here, so a malformed request never reaches a sandbox."""
    try:
        model.model_validate_json(body)
    except ValidationError as exc:
        raise ProblemError(422, api.ErrorCode.INVALID_REQUEST, body_validation_detail(exc)) from None


def _whole_forwarder(route: api.HotRoute, manager: SandboxManager) -> Handler:
    """Forward a request whose body and answer are small enough to hold (JSON or none) to the sandbox's agent."""
    seconds = manager.metrics.hot_seconds.labels(route.name)  # looked up once: this is on every exec's path
    answered: dict[int, Any] = {}

    async def forward(sandbox_id: str, query: list[tuple[str, str]], body: bytes, receive: Receive) -> Reply:
        started = time.perf_counter()
        try:
            headers = {}
            if isinstance(route.body, type):
                _check_body(route.body, body)
                headers["content-type"] = "application/json"
            agent = await manager.client(sandbox_id)
            try:
                call = agent.session.request(route.method, agent.base_url + route.path, params=query,
                                             data=body if isinstance(route.body, type) else None, headers=headers)
                # A caller that hangs up cancels the agent call, which kills the command there.
                response, content = await cancel_on_disconnect(receive, _read(call)) if isinstance(
                    route.body, type) else await _read(call)
            except AgentError as exc:
                raise await manager.agent_lost(sandbox_id, exc) from None
            counter = answered.get(response.status)
            if counter is None:
                counter = answered[response.status] = manager.metrics.hot_requests.labels(route.name, str(response.status))
            counter.inc()
            return Reply(response.status, content, [(k.encode(), v.encode()) for k in _PASS_HEADERS
                                                    if k != "content-length" and (v := response.headers.get(k)) is not None])
        finally:
            seconds.observe(time.perf_counter() - started)

    return forward


def whole_forwarders(manager: SandboxManager) -> dict[str, Handler]:
    """By route name, the forwarders of the hot routes with whole bodies, shared by the fast path and FastAPI."""
    return {route.name: _whole_forwarder(route, manager) for route in api.HOT_ROUTES if _fast(route)}


def _forwarder(route: api.HotRoute, manager: SandboxManager, whole: Handler | None):
    """The FastAPI endpoint of ``route``: streamed bodies are piped through; a whole one goes through
    ``whole``, the fast path's forwarder (reached here only when the app runs without it)."""
    streamed = route.response in ("raw", "ndjson")
    prefix_len = len(f"{api.API_PREFIX}/sandboxes/")

    async def forward(request: Request, sandbox_id: str) -> Response:
        if whole is not None:
            reply = await whole(sandbox_id, list(request.query_params.multi_items()), await request.body(),
                                request.receive)
            return Response(reply.body, status_code=reply.status, headers={k.decode(): v.decode() for k, v in reply.headers})
        started = time.perf_counter()
        agent_path = request.url.path[prefix_len + len(sandbox_id):]
        headers = {}
        if isinstance(route.body, type):
            content = await request.body()
            _check_body(route.body, content)
            headers["content-type"] = "application/json"
        elif route.body == "raw":
            content = request.stream()
        else:
            content = None
        agent = await manager.client(sandbox_id)
        exits = contextlib.AsyncExitStack()
        try:
            try:
                call = agent.session.request(route.method, agent.base_url + agent_path,
                                             params=list(request.query_params.multi_items()), data=content,
                                             headers=headers)
                if streamed:
                    response = await exits.enter_async_context(call)
                    if response.status >= 400:
                        body = await response.read()
                else:
                    response, body = await _read(call)
            except AgentError as exc:
                raise await manager.agent_lost(sandbox_id, exc) from None
            out_headers = {k: v for k in _PASS_HEADERS if (v := response.headers.get(k)) is not None}
            manager.metrics.hot_requests.labels(route.name, str(response.status)).inc()
            if streamed and response.status < 400:
                owned, exits = exits, contextlib.AsyncExitStack()  # the body now owns the agent stream

                async def relay() -> AsyncIterator[bytes]:
                    try:
                        async for chunk in response.content.iter_any():
                            yield chunk
                    finally:  # also when the client hangs up: drop the agent stream, which stops the command
                        await owned.aclose()

                return StreamingResponse(relay(), status_code=response.status, headers=out_headers)
            return Response(body, status_code=response.status, headers=out_headers)
        finally:
            await exits.aclose()
            manager.metrics.hot_seconds.labels(route.name).observe(time.perf_counter() - started)

    forward.__name__ = route.name
    return forward


async def _read(call) -> tuple[aiohttp.ClientResponse, bytes]:
    async with call as response:
        return response, await response.read()


def fast_hot_routes(app, whole: dict[str, Handler]) -> FastRoutes:
    """``app`` behind the fast path for the hot routes with whole bodies (``exec``, ``patch``, …)."""
    routes = {(route.method, route.path): whole[route.name] for route in api.HOT_ROUTES if route.name in whole}
    return FastRoutes(app, routes, prefix=f"{api.API_PREFIX}/sandboxes/")


def install_hot_routes(app: FastAPI, manager: SandboxManager, whole: dict[str, Handler]) -> None:
    for route in api.HOT_ROUTES:
        app.add_api_route(
            f"{api.API_PREFIX}/sandboxes/{{sandbox_id}}{route.path}",
            _forwarder(route, manager, whole.get(route.name)),
            methods=[route.method],
            summary=route.summary,
            tags=["sandbox hot path"],
            response_model=None if route.response in (None, "raw", "ndjson") else route.response,
            responses=_responses(route),
            openapi_extra=_openapi(route),
            operation_id=route.name,
        )


def install_port_routes(app: FastAPI, manager: SandboxManager) -> None:
    """``/v1/sandboxes/{id}/ports/{port}/{path}``: HTTP requests and WebSockets to a server on the
    sandbox's own loopback, through its agent (see :mod:`orchard.env.relay`). Nothing answering there is a 502
    ``port_unreachable``; the API key is needed as on every route and stops here. Not in the OpenAPI
    schema: what a port answers is the sandbox's server's own API."""

    async def port_forward(request: Request, sandbox_id: str, port: int = PathParam(ge=1, le=65535),
                           path: str = "") -> Response:
        agent = await manager.client(sandbox_id)
        try:
            return await relay(agent.session, f"{agent.base_url}/ports/{port}/{path}", request)
        except AgentError as exc:
            raise await manager.agent_lost(sandbox_id, exc) from None

    async def port_websocket(websocket: WebSocket, sandbox_id: str, port: int, path: str = "") -> None:
        try:
            agent = await manager.client(sandbox_id)
        except ProblemError as exc:
            await websocket.close(code=1008, reason=(exc.detail or exc.code.value)[:120])
            return
        await relay_websocket(websocket, agent.session, f"{agent.base_url}/ports/{port}/{path}")

    for route in ("/ports/{port}", "/ports/{port}/{path:path}"):
        app.add_api_route(f"{api.API_PREFIX}/sandboxes/{{sandbox_id}}{route}", port_forward,
                          methods=list(api.PORT_METHODS), include_in_schema=False)
        app.add_api_websocket_route(f"{api.API_PREFIX}/sandboxes/{{sandbox_id}}{route}", port_websocket)
