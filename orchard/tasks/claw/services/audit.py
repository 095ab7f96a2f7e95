"""The audit log: one entry per call of the policy, which graders read through ``GET /_admin/audit``."""

from typing import Any


class AuditLog:
    """Entries in call order, numbered from 1 (``seq``)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def record(
        self,
        *,
        method: str,
        path: str,
        endpoint: str | None,
        request: dict[str, Any],
        status: int,
        response: Any,
        fault: str | None,
    ) -> None:
        """Append one call; ``endpoint`` is its route template (None when no route matched)."""
        self.calls.append({
            "seq": len(self.calls) + 1,
            "service": path.strip("/").split("/")[0],
            "method": method,
            "path": path,
            "endpoint": endpoint,
            "request": request,
            "status": status,
            "response": response,
            "fault": fault,
        })
