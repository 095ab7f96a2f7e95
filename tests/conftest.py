"""Fixtures that start real servers on loopback: orchestrators, agents and redis-server."""

from __future__ import annotations

import functools
import os
import re

# Sharding tests need several devices: 8 fake CPU devices, set before JAX is first imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Offline: litellm's cost map from the copy it ships, not fetched (three retries a process otherwise).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from orchard.env import AsyncSandboxClient, LocalServer, SandboxClient, local_server
from orchard.env.local import free_port

# The Kubernetes version whose OpenAPI schemas every manifest is validated against (strict), in
# tests/infra and by the fake API server of the Kubernetes backend's tests: kubernetes-validate's newest.
K8S_VERSION = "1.37"


# The smoke workdirs the end-to-end recipe tests and the notebooks share within one run of the suite (each
# stage made once, by whichever gets there first; the other waits on the stage's lock and reuses it).
SHARED_SMOKE_WORKDIRS = ("gui_rl_init_small", "swe_ablations_small", "cross_harness_small", "claw_cross_harness_small")
REPOSITORY = Path(__file__).resolve().parents[1]
# Per-item time limits (pyproject's 300 s for the rest): a notebook runs a whole small ablation (the Makefile
# gives nbmake's cells the same limit), a slow test a recipe or several processes end to end.
NOTEBOOK_TIMEOUT_S = 900
SLOW_TIMEOUT_S = 600


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first: the notebooks, then every file with a ``slow`` test, then the rest, each in
    collection order. pytest-xdist hands out files in this order with ``--no-loadscope-reorder``, as ``make test``
    runs it (by default it orders them by their number of tests, which put the one-test notebooks last), so the
    two workers finish together instead of one running a notebook alone at the end (the order is the same in
    every worker: it depends on the items only)."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: 0 if item.path.suffix == ".ipynb" else 1 if item.path in slow else 2)
    for item in items:  # room for a machine twice as slow as the CI one (the longest item took 157 s there)
        if item.get_closest_marker("timeout") is None:
            if item.path.suffix == ".ipynb":
                item.add_marker(pytest.mark.timeout(NOTEBOOK_TIMEOUT_S))
            elif item.get_closest_marker("slow"):
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


@functools.cache
def shared_smoke_workdir(path: str) -> str | None:
    """The shared smoke workdir a test file or notebook (a path from the repository root) runs in, if any."""
    try:
        text = (REPOSITORY / path).read_text(errors="replace")
    except OSError:
        return None
    return next((name for name in SHARED_SMOKE_WORKDIRS if re.search(rf"(?<!\w){name}(?!\w)", text)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> object | None:
    """``--dist loadfile``, except that the files sharing a smoke workdir are one unit of work: they run in one
    worker, one after the other, so the later ones find the shared stages made instead of waiting, a core idle,
    on the locks of a worker still making them."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkdirScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return shared_smoke_workdir(path) or path

    return SharedWorkdirScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Start every run of the suite from empty smoke workdirs (in the controller, before any xdist worker
    starts), so nothing made by an earlier checkout's code is reused."""
    if not hasattr(config, "workerinput"):
        for name in SHARED_SMOKE_WORKDIRS:
            shutil.rmtree(REPOSITORY / "runs" / name, ignore_errors=True)


def require_root() -> None:
    """Namespaces and cgroups need root here. In CI this fails loudly instead of skipping."""
    if os.geteuid() != 0:
        message = "needs root for Linux namespaces and cgroups"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value (for effects that happen asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def process_alive(pid: int) -> bool:
    """Running, or stopped, but not a zombie and not gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture(scope="session")
def orchestrator() -> Iterator[LocalServer]:
    require_root()
    server = local_server(reap_interval=0.2)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def client(orchestrator: LocalServer) -> Iterator[SandboxClient]:
    with orchestrator.client() as sandbox_client:
        yield sandbox_client


@pytest.fixture(scope="module")
async def aclient(orchestrator: LocalServer) -> AsyncIterator[AsyncSandboxClient]:
    """An async client of the session's orchestrator."""
    async with orchestrator.async_client() as client:
        yield client


@pytest.fixture(scope="module")
def sandbox(client: SandboxClient):
    """One sandbox shared by a module's tests (creating one takes about half a second)."""
    with client.create(memory="512Mi", pids=256) as shared:
        yield shared


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> Iterator[str]:
    """A real redis-server on a free loopback port."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: `make test` installs it as root (apt-get install redis-server)")
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def pong() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    try:
        wait_until(pong, what="redis-server")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(10)


@dataclass
class Agent:
    """A real agent process on a Unix socket, serving ``root`` as its sandbox root."""

    process: subprocess.Popen
    http: httpx.Client
    root: str
    token: str

    def peak_rss(self) -> int:
        """The agent's peak resident memory in bytes (VmHWM)."""
        with open(f"/proc/{self.process.pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")


@pytest.fixture
def agent(tmp_path) -> Iterator[Agent]:
    root = tmp_path / "root"
    (root / "workspace").mkdir(parents=True)
    socket_path = str(tmp_path / "agent.sock")
    token = secrets.token_urlsafe(16)
    process = subprocess.Popen(
        [sys.executable, "-m", "orchard.env.agent", "--uds", socket_path, "--root", str(root),
         "--workdir", "/workspace", "--state-dir", str(tmp_path / "state")],
        env={**os.environ, "ORCHARD_AGENT_TOKEN": token}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    http = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://agent",
                        headers={"Authorization": f"Bearer {token}"}, timeout=120)

    def healthy() -> bool:
        try:
            return http.get("/health").status_code == 200
        except httpx.TransportError:
            return process.poll() is not None  # stop waiting if it died

    try:
        wait_until(healthy, what="agent")
        assert process.poll() is None, "agent exited at start"
        yield Agent(process, http, str(root), token)
    finally:
        http.close()
        process.terminate()
        process.wait(10)


def xla_at_o0() -> dict[str, str]:
    """This environment with XLA's LLVM at -O0: for a process that compiles big programs and runs them a few
    times (SmolLM2's 30 layers are unrolled in every program), where -O1 compiles for longer than it saves."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split() if "optimization_level" not in flag]
    return {**os.environ, "XLA_FLAGS": " ".join([*flags, "--xla_backend_optimization_level=0"])}


@dataclass
class ModelProcess:
    url: str  # ends in /v1
    name: str
    model_path: str
    process: subprocess.Popen


def cli_server(args: list[str], port: int, log_path: str, timeout: float = 120.0,
               env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``orchard <args>`` as a process (in ``env``, default this one's), yielded once its ``/health`` on
    ``port`` answers, then stopped."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "orchard.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env)

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"orchard {args[0]} exited with {process.returncode}: "
                                 f"{Path(log_path).read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=timeout, interval=0.1, what=f"orchard {args[0]}")
        yield process
    finally:
        process.terminate()
        process.wait(20)


def start_model_server(model_path: str, log_path: str, extra: Sequence[str] = (),
                       env: dict[str, str] | None = None) -> Iterator[ModelProcess]:
    """A real ``orchard serve`` of ``model_path`` (fp32) on a free loopback port, stopped afterwards
    (``extra``: more of its arguments; ``env``: its environment)."""
    port = free_port()
    for process in cli_server(["serve", "--model", model_path, "--port", str(port), "--dtype", "float32", *extra],
                              port, log_path, env=env):
        yield ModelProcess(f"http://127.0.0.1:{port}/v1", model_path, model_path, process)


@pytest.fixture(scope="session")
def smollm2_server(tmp_path_factory) -> Iterator[ModelProcess]:
    """One ``orchard serve`` of the shipped SmolLM2 for the session: for the test of what the server computes
    against transformers (its greedy tokens)."""
    from orchard.models.shipped import smollm2_gguf

    yield from start_model_server(smollm2_gguf(), str(tmp_path_factory.mktemp("serve") / "smollm2.log"),
                                  env=xla_at_o0())


@pytest.fixture(scope="session")
def random_policy(tmp_path_factory) -> str:
    """A random one-layer policy over SmolLM2's vocabulary, saved with SmolLM2's tokenizer and chat template.

    The harness, proxy and learner tests serve it where what the model says does not matter, only that every
    token recorded is the server's: a third-party harness's prompt runs to thousands of tokens, and SmolLM2's
    prefill of them on CPU was most of those tests' time."""
    from flax import nnx

    from orchard.data.tokenizer import Tokenizer
    from orchard.models import ModelConfig, Transformer, save_pretrained
    from orchard.models.shipped import smollm2_gguf

    path = str(tmp_path_factory.mktemp("random-policy") / "policy")
    config = ModelConfig.tiny(49152, num_layers=1, hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2,
                              head_dim=8, dtype="float32", max_position_embeddings=16384)
    save_pretrained(Transformer(config, rngs=nnx.Rngs(0)), path)
    Tokenizer.from_gguf(smollm2_gguf()).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def policy_server(random_policy, tmp_path_factory) -> Iterator[ModelProcess]:
    """One ``orchard serve`` of :func:`random_policy` for the session (proxy, harness and learner tests)."""
    yield from start_model_server(random_policy, str(tmp_path_factory.mktemp("serve") / "random-policy.log"))


ADMIN = "admin-" + secrets.token_hex(4)


@dataclass
class Proxy:
    """A real ``orchard proxy`` process and its session routes."""

    root: str
    records: str

    def open(self, **fields) -> dict:
        body = {"task": "t", "harness": "h", "rollout_id": secrets.token_hex(3), **fields}
        reply = httpx.post(f"{self.root}/sessions", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
        assert reply.status_code == 200, reply.text
        return reply.json()

    def close(self, session: dict) -> dict:
        return httpx.post(f"{self.root}/sessions/{session['id']}/close",
                          headers={"Authorization": f"Bearer {ADMIN}"}).json()


def start_proxy(upstream: str, tmp_path_factory) -> Iterator[Proxy]:
    """A real ``orchard proxy`` in front of ``upstream`` (with the admin key ``ADMIN``), stopped afterwards."""
    records = str(tmp_path_factory.mktemp("records"))
    port, log_path = free_port(), str(tmp_path_factory.mktemp("proxy") / "proxy.log")
    args = ["proxy", "--upstream", upstream, "--records", records, "--admin-key", ADMIN, "--port", str(port)]
    for _ in cli_server(args, port, log_path, timeout=60):
        yield Proxy(f"http://127.0.0.1:{port}", records)


def mini_swe_agent_model(config: dict, session: dict):
    """mini-swe-agent's text-based litellm model of ``config``, calling a proxy ``session``."""
    from minisweagent.models import get_model

    return get_model(config={**config["model"], "model_name": "openai/whatever", "model_class": "litellm_textbased",
                             "cost_tracking": "ignore_errors",
                             "model_kwargs": {"api_base": session["base_url"], "api_key": session["api_key"],
                                              "drop_params": True}})


@pytest.fixture(scope="session")
def proxy(policy_server, tmp_path_factory) -> Iterator[Proxy]:
    """``orchard proxy`` in front of the session's :func:`policy_server`."""
    yield from start_proxy(policy_server.url, tmp_path_factory)


@dataclass
class ScriptedChat:
    """A scripted OpenAI-compatible chat server on loopback: ``replies`` are answered in order (a
    string is the assistant's content, a dict the whole assistant message, an int an HTTP error
    status); every request body is kept in ``requests``."""

    url: str
    replies: list
    requests: list


@pytest.fixture
async def scripted_chat() -> AsyncIterator[ScriptedChat]:
    from aiohttp import web

    chat = ScriptedChat("", [], [])

    async def complete(request: web.Request) -> web.Response:
        chat.requests.append(await request.json())
        reply = chat.replies.pop(0)
        if isinstance(reply, int):
            return web.json_response({"error": {"message": "scripted failure"}}, status=reply)
        message = reply if isinstance(reply, dict) else {"role": "assistant", "content": reply}
        return web.json_response({"choices": [{"message": message, "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 10, "completion_tokens": 5}})

    app = web.Application(client_max_size=64 << 20)
    app.add_routes([web.post("/v1/chat/completions", complete)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    chat.url = f"http://127.0.0.1:{port}/v1"
    try:
        yield chat
    finally:
        await runner.cleanup()
