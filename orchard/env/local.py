"""``local_server()``: a real orchestrator on loopback, for notebooks, examples and tests; and
``orchestrator(url)``: the configured one, or a local one when no URL is configured."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from orchard.env.client import API_KEY_ENV, AsyncSandboxClient, SandboxClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Endpoint:
    """Where an orchestrator answers, and its API key."""

    base_url: str
    api_key: str

    def client(self, **kwargs) -> SandboxClient:
        return SandboxClient(self.base_url, self.api_key, **kwargs)

    def async_client(self, **kwargs) -> AsyncSandboxClient:
        return AsyncSandboxClient(self.base_url, self.api_key, **kwargs)


@dataclass
class LocalServer(Endpoint):
    """A running ``orchard env serve`` process. Stop it with :meth:`stop` or a ``with`` block."""

    state_dir: str
    process: subprocess.Popen
    log_path: str
    _owns_state: bool = field(default=False, repr=False)

    def stop(self, timeout: float = 30.0) -> int:
        """Stop gracefully (SIGTERM: the orchestrator deletes its sandboxes unless they are shared)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        from orchard.env.backends.etc import reap_etc_layers  # Linux only, as the local backend is

        reap_etc_layers(self.state_dir)  # a crashed process's mount, never removed by its close
        if self._owns_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return self.process.returncode

    def kill(self) -> None:
        """Crash it (SIGKILL): sandboxes are left behind, as after a real crash."""
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def local_server(
    *,
    store: str | None = None,
    state_dir: str | None = None,
    api_key: str | None = None,
    port: int | None = None,
    reap_interval: float = 5.0,
    ready_timeout: float = 30.0,
    images_dir: str | None = None,
    agent_bundle: str | None = None,
    extra_args: Sequence[str] = (),
) -> LocalServer:
    """Start an orchestrator on a free loopback port and wait until it answers: the local backend,
    unless ``extra_args`` choose another (``["--backend", "kubernetes", ...]``). It shuts itself down,
    deleting its sandboxes, once this process has exited, stopped or not (``--exit-with``)."""
    owns_state = state_dir is None
    state_dir = state_dir or tempfile.mkdtemp(prefix="orchard-env-")
    os.makedirs(state_dir, exist_ok=True)
    api_key = api_key or secrets.token_urlsafe(24)
    port = port or free_port()
    log_path = os.path.join(state_dir, f"orchestrator-{port}.log")
    argv = [sys.executable, "-m", "orchard.cli", "env", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--state-dir", state_dir, "--reap-interval", str(reap_interval), "--exit-with", str(os.getpid())]
    if store:
        argv += ["--store", store]
    if images_dir:
        argv += ["--images", images_dir]
    if agent_bundle:
        argv += ["--agent-bundle", agent_bundle]
    argv += list(extra_args)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "ORCHARD_API_KEY": api_key})
    server = LocalServer(f"http://127.0.0.1:{port}", api_key, state_dir, process, log_path, owns_state)
    deadline = time.monotonic() + ready_timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.base_url}/health", timeout=1.0) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            server.process.kill()
            with open(log_path, errors="replace") as log:
                output = log.read()[-3000:]
            server.stop()
            raise RuntimeError(f"orchestrator did not start:\n{output}")
        time.sleep(0.05)


@contextlib.contextmanager
def orchestrator(url: str = "", api_key: str = "", **local_options) -> Iterator[Endpoint]:
    """The orchestrator at ``url`` (its key: ``api_key``, else ``$ORCHARD_API_KEY``), or, when ``url``
    is empty, a :func:`local_server` started for the block (``local_options`` are its arguments)
    and stopped after it: the one way recipes, experiments and notebooks find their sandboxes."""
    if url:
        yield Endpoint(url, api_key or os.environ.get(API_KEY_ENV, ""))
        return
    with local_server(**local_options) as server:
        yield server
