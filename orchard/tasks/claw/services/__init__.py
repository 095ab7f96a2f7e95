"""The tool services of Orchard-Claw tasks: mail, calendar, contacts, todo, notifications and documents.

Small FastAPI services in the style of Claw-Eval, with an audit log of every call, a reset for pooled
sandboxes and seeded fault injection. The package is self-contained (relative imports, and only the
standard library, fastapi, pydantic and uvicorn): it is uploaded into a sandbox as the top-level package
``claw_services`` and run there with ``python -m claw_services``. The command-line tools of a shell-only
harness are ``python -m claw_services.cli`` (standard library only).

``create_app`` is imported lazily so that the CLI never pays for importing FastAPI.
"""

import os
from typing import Any

# The directory the host uploads into a sandbox, and the package name it takes there.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SANDBOX_NAME = "claw_services"

__all__ = ["PACKAGE_DIR", "SANDBOX_NAME", "create_app"]


def __getattr__(name: str) -> Any:
    """Import ``create_app`` (and with it FastAPI) on first use only."""
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
