"""Pooled keep-alive connections from the orchestrator to sandbox agents (the hot path)."""

from __future__ import annotations

import asyncio

import httpx

from orchard.env.auth import bearer

AGENT_TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=60.0)


def agent_client(agent_url: str, token: str) -> httpx.AsyncClient:
    """One keep-alive client per agent: a Unix socket (local backend) or a TCP address (pods)."""
    if agent_url.startswith("unix://"):
        transport = httpx.AsyncHTTPTransport(uds=agent_url.removeprefix("unix://"), retries=0)
        base_url = "http://agent"
    else:
        transport = httpx.AsyncHTTPTransport(retries=0)
        base_url = agent_url
    return httpx.AsyncClient(transport=transport, base_url=base_url, headers=bearer(token),
                             timeout=AGENT_TIMEOUT)


class AgentPool:
    def __init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}

    def get(self, sandbox_id: str, agent_url: str, token: str) -> httpx.AsyncClient:
        client = self._clients.get(sandbox_id)
        if client is None:
            client = self._clients[sandbox_id] = agent_client(agent_url, token)
        return client

    async def drop(self, sandbox_id: str) -> None:
        client = self._clients.pop(sandbox_id, None)
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)
