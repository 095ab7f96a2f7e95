"""The trainer's side of the recording proxy (:mod:`orchard.rollout.proxy`): open and close sessions.

.. code-block:: python

    proxy = ProxyClient("http://127.0.0.1:8100", admin_key)
    session = await proxy.open("calc__add", "smolagents", rollout_id="calc__add/3", deadline_s=600,
                               sampling={"temperature": 1.0, "seed": 3})
    ...  # the harness calls session["base_url"] with session["api_key"]
    await proxy.close(session["id"])
    record = await proxy.records(session["id"])  # its calls, from the proxy's machine (a SessionRecord)

No FastAPI and no JAX: harness adapters import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchard.rollout.openai_client import OpenAIClient
from orchard.rollout.proxy_records import SessionRecord


class ProxyClient:
    """Session routes of one ``orchard proxy``, with its admin key (retries as :class:`OpenAIClient`)."""

    def __init__(self, url: str, admin_key: str | None = None, *, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.http = OpenAIClient(self.url, admin_key or "EMPTY", timeout=timeout)

    async def open(self, task: str, harness: str, *, rollout_id: str = "", deadline_s: float | None = None,
                   sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A new session: its ``id``, ``base_url`` (the harness's OpenAI base URL), ``api_key``, ``records``."""
        return await self.http.apost("/sessions", {"task": task, "harness": harness, "rollout_id": rollout_id,
                                                   "deadline_s": deadline_s, "sampling": dict(sampling or {})})

    async def close(self, session_id: str) -> dict[str, Any]:
        """End a session (its later calls get a 409); closing a timed-out one keeps it timed out."""
        return await self.http.apost(f"/sessions/{session_id}/close", None)

    async def info(self, session_id: str) -> dict[str, Any]:
        return await self.http.aget(f"/sessions/{session_id}")

    async def records(self, session_id: str) -> SessionRecord:
        """The session's records as the proxy has them (read on its machine; a torn last line skipped)."""
        return SessionRecord.from_json(await self.http.aget(f"/sessions/{session_id}/records"))

    async def aclose(self) -> None:
        await self.http.aclose()
