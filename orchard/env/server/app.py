"""Build the orchestrator app from a backend, a store and an API key."""

from __future__ import annotations

import logging
import os
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from orchard import __version__
from orchard.env import api
from orchard.env.auth import BearerAuth
from orchard.env.backends.base import Backend
from orchard.env.problems import install_problem_handlers
from orchard.env.server.lifecycle import SandboxManager
from orchard.env.server.metrics import Metrics
from orchard.env.server.pools import WarmPools
from orchard.env.server.routes import (
    fast_hot_routes,
    install_hot_routes,
    install_port_routes,
    lifecycle_router,
    pool_router,
    snapshot_router,
    whole_forwarders,
)
from orchard.env.store import Store

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect"})


def create_app(backend: Backend, store: Store, api_key: str, reap_interval: float = 5.0) -> BearerAuth:
    started = time.time()
    metrics = Metrics()
    manager = SandboxManager(backend, store, metrics, reap_interval=reap_interval)
    pools = WarmPools(manager)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        await manager.recover()
        manager.start_reaper()
        log.info("orchestrator ready (backend=%s, store=%s)", backend.name, type(store).__name__)
        try:
            yield
        finally:
            await pools.shutdown()
            await manager.shutdown()

    app = FastAPI(title="Orchard Env", version=__version__, lifespan=lifespan,
                  description="Sandbox service: lifecycle under /v1/sandboxes, exec and files forwarded to "
                              "each sandbox's agent. Authenticate with `Authorization: Bearer <api key>`.")
    app.state.manager = manager
    install_problem_handlers(app)

    @app.get("/health", response_model=api.Health, tags=["service"])
    @app.get("/healthz", response_model=api.Health, tags=["service"], include_in_schema=False)
    async def health() -> api.Health:
        return api.Health(version=__version__, pid=os.getpid(), uptime=time.time() - started)

    @app.get("/metrics", tags=["service"], response_class=Response)
    async def prometheus() -> Response:
        await manager.list()  # refresh the gauge
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(lifecycle_router(manager, pools))
    app.include_router(pool_router(pools))
    app.include_router(snapshot_router(manager))
    whole = whole_forwarders(manager)
    install_hot_routes(app, manager, whole)
    install_port_routes(app, manager)
    return BearerAuth(fast_hot_routes(app, whole), api_key, exempt=OPEN_PATHS)
