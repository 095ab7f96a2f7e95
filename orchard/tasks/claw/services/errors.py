"""The errors a service reports to its caller as ``{"error": "..."}`` with an HTTP status."""


class ServiceError(Exception):
    """A request the service refuses; ``status`` is the HTTP status, ``message`` the ``error`` text."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotFound(ServiceError):
    """No record of that kind with that id: 404 ``{"error": "no message 'x'"}``."""

    def __init__(self, noun: str, record_id: str) -> None:
        super().__init__(404, f"no {noun} {record_id!r}")


class BadRequest(ServiceError):
    """A request that is well formed but invalid, named by its field: 400 ``{"error": "end: ..."}``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(400, f"{field}: {problem}")
