"""A recording-proxy session's records as read back: the one reader, for the proxy and its clients.

The proxy (:mod:`orchard.rollout.proxy`) writes one append-only JSONL file per session: a
``session`` line, one ``call`` line per call, and a ``closed`` or ``timed_out`` line.
:func:`read_session` reads such a file (on the proxy's machine); :meth:`SessionRecord.to_json` and
:meth:`SessionRecord.from_json` carry it over the proxy's ``GET /sessions/{id}/records`` to a
trainer on another machine (:meth:`orchard.rollout.proxy_client.ProxyClient.records`).

No FastAPI and no JAX: harness adapters import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from orchard.data.jsonl import ReadReport, read_jsonl

Status = Literal["open", "closed", "timed_out"]


@dataclass
class SessionRecord:
    """A session's records as read back: its opening line, its calls, how it ended."""

    session: dict[str, Any]
    calls: list[dict[str, Any]]
    status: Status
    report: ReadReport

    def to_json(self) -> dict[str, Any]:
        return {"session": self.session, "calls": self.calls, "status": self.status,
                "torn_line": self.report.torn_line, "notes": self.report.notes}

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SessionRecord:
        return cls(body["session"], body["calls"], body["status"],
                   ReadReport(body.get("torn_line"), list(body.get("notes") or [])))

    @property
    def trainable(self) -> bool:
        """Whether its rollout may be trained on: it ended in time and every call has its ids."""
        return self.status != "timed_out" and all(c["usable_for_rl"] for c in self.calls)


def read_session(path: str) -> SessionRecord:
    """A session's JSONL records (a torn last line, from a proxy killed mid-write, is skipped)."""
    report = ReadReport()
    session: dict[str, Any] = {}
    calls: list[dict[str, Any]] = []
    status: Status = "open"
    for _, record in read_jsonl(path, report):
        kind = record.get("type")
        if kind == "session":
            session = record
        elif kind == "call":
            calls.append(record)
        elif kind in ("closed", "timed_out"):
            status = kind
    if any(c["status"] == "deadline" for c in calls):
        status = "timed_out"
    return SessionRecord(session, calls, status, report)
