"""Serve an ASGI app (``orchard serve``'s, the recording proxy's) on loopback from this process, for a while.

Recipes that drive a harness over HTTP (:mod:`orchard.recipes.cross_harness`) serve their policy and
the proxy in front of it in a thread of their own process, for the length of a ``with`` block:

.. code-block:: python

    with serve_app(create_app(ModelServer(model_dir))) as url:
        ...  # url: http://127.0.0.1:<port>

The server stops when the block ends (in-flight requests get uvicorn's graceful shutdown).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from orchard.env.local import free_port


@contextlib.contextmanager
def serve_app(app, host: str = "127.0.0.1", startup_timeout: float = 60.0) -> Iterator[str]:
    """``app`` served by uvicorn on a free port of ``host`` while the block runs; yields its root URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=120))
    thread = threading.Thread(target=server.run, name=f"serve-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server on {host}:{port} did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
