"""Pooled keep-alive connections from the orchestrator to sandbox agents (the hot path).

aiohttp rather than httpx: on this path every microsecond counts, and aiohttp's client costs about
a third of httpx's per request (0.28 ms against 0.85 ms for a small GET, measured on loopback).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import aiohttp

from orchard.env.auth import bearer

AGENT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
AgentError = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


# sun_path holds 108 bytes; deeper socket paths are reached through a directory fd instead.
MAX_SOCKET_PATH = 100


@dataclass
class AgentConnection:
    session: aiohttp.ClientSession
    base_url: str
    dir_fd: int | None = None

    async def close(self) -> None:
        await self.session.close()
        if self.dir_fd is not None:
            os.close(self.dir_fd)


def connect_agent(agent_url: str, token: str) -> AgentConnection:
    """A keep-alive session to one agent, on a Unix socket (local backend) or TCP (pods)."""
    dir_fd = None
    if agent_url.startswith("unix://"):
        path = agent_url.removeprefix("unix://")
        if len(path) > MAX_SOCKET_PATH:
            dir_fd = os.open(os.path.dirname(path), os.O_PATH | os.O_CLOEXEC)
            path = f"/proc/self/fd/{dir_fd}/{os.path.basename(path)}"
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=path)
        base_url = "http://agent"
    else:
        connector = aiohttp.TCPConnector(limit=0)
        base_url = agent_url.rstrip("/")
    session = aiohttp.ClientSession(connector=connector, headers=bearer(token), timeout=AGENT_TIMEOUT,
                                    auto_decompress=False)
    return AgentConnection(session, base_url, dir_fd)


class AgentPool:
    def __init__(self) -> None:
        self._connections: dict[str, AgentConnection] = {}

    def get(self, sandbox_id: str, agent_url: str, token: str) -> AgentConnection:
        connection = self._connections.get(sandbox_id)
        if connection is None:
            connection = self._connections[sandbox_id] = connect_agent(agent_url, token)
        return connection

    async def drop(self, sandbox_id: str) -> None:
        connection = self._connections.pop(sandbox_id, None)
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
