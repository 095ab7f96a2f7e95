"""Pooled keep-alive connections from the orchestrator to sandbox agents (the hot path).

aiohttp rather than httpx: on this path every microsecond counts, and aiohttp's client costs about
a third of httpx's per request (0.28 ms against 0.85 ms for a small GET, measured on loopback).
"""

from __future__ import annotations

import asyncio

import aiohttp

from orchard.env.auth import bearer

AGENT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
AgentError = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)


def agent_session(agent_url: str, token: str) -> tuple[aiohttp.ClientSession, str]:
    """A keep-alive session to one agent and the base URL to use with it.

    The agent listens on a Unix socket (local backend) or on a TCP address (pods).
    """
    if agent_url.startswith("unix://"):
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=agent_url.removeprefix("unix://"))
        base_url = "http://agent"
    else:
        connector = aiohttp.TCPConnector(limit=0)
        base_url = agent_url.rstrip("/")
    session = aiohttp.ClientSession(connector=connector, headers=bearer(token), timeout=AGENT_TIMEOUT,
                                    auto_decompress=False)
    return session, base_url


class AgentPool:
    def __init__(self) -> None:
        self._sessions: dict[str, tuple[aiohttp.ClientSession, str]] = {}

    def get(self, sandbox_id: str, agent_url: str, token: str) -> tuple[aiohttp.ClientSession, str]:
        entry = self._sessions.get(sandbox_id)
        if entry is None:
            entry = self._sessions[sandbox_id] = agent_session(agent_url, token)
        return entry

    async def drop(self, sandbox_id: str) -> None:
        entry = self._sessions.pop(sandbox_id, None)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        sessions, self._sessions = [s for s, _ in self._sessions.values()], {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
