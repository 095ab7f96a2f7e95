"""The in-sandbox agent: a small FastAPI app, the same program on every backend.

Every endpoint in :data:`orchard.env.api.HOT_ROUTES` is implemented here; the orchestrator only
forwards to them. ``/health`` is open (for readiness probes); everything else needs the
per-sandbox bearer token.

Exec, streaming exec and patches on one sandbox run one at a time. The lock lives here, in the
one process every orchestrator replica reaches, so it holds across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
from fastapi import FastAPI, Query, Request, Response, WebSocket
from fastapi import Path as PathParam
from fastapi.responses import StreamingResponse

from orchard import __version__
from orchard.env import api
from orchard.env.agent import files
from orchard.env.agent.children import REAPER, run_commands_as
from orchard.env.agent.execution import CappedBuffer, run
from orchard.env.agent.patch import apply_patch
from orchard.env.agent.paths import SandboxRoot
from orchard.env.agent.processes import ProcessTable
from orchard.env.auth import BearerAuth
from orchard.env.fastpath import FastRoutes, Receive, Reply, json_reply
from orchard.env.problems import (
    ProblemError,
    cancel_on_disconnect,
    install_problem_handlers,
    json_response,
    problem_response,
)
from orchard.env.relay import relay, relay_websocket

AGENT_OOM_SCORE_ADJ = -900
T = TypeVar("T")


@dataclass(frozen=True)
class AgentConfig:
    token: str
    root: str = "/"
    workdir: str = "/workspace"
    state_dir: str = "/tmp/.orchard-agent"
    env: tuple[tuple[str, str], ...] = ()  # base environment of commands
    user: str | None = None  # "UID:GID" that commands run as; None: the agent's own


def _protect_agent() -> None:
    """Make the agent the last thing the OOM killer picks (commands run at +1000)."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(str(AGENT_OOM_SCORE_ADJ))


_ERRNO_PROBLEMS = {
    errno.ENOENT: (404, api.ErrorCode.PATH_NOT_FOUND),
    errno.EISDIR: (400, api.ErrorCode.IS_A_DIRECTORY),
    errno.ENOTDIR: (400, api.ErrorCode.NOT_A_DIRECTORY),
    errno.EEXIST: (400, api.ErrorCode.NOT_A_DIRECTORY),
    errno.ENOTEMPTY: (400, api.ErrorCode.INVALID_REQUEST),
    errno.ENAMETOOLONG: (400, api.ErrorCode.INVALID_REQUEST),
    errno.ELOOP: (400, api.ErrorCode.INVALID_REQUEST),
    errno.EACCES: (403, api.ErrorCode.PERMISSION_DENIED),
    errno.EPERM: (403, api.ErrorCode.PERMISSION_DENIED),
    errno.EROFS: (403, api.ErrorCode.PERMISSION_DENIED),
    errno.EBUSY: (403, api.ErrorCode.PERMISSION_DENIED),
    errno.ETXTBSY: (403, api.ErrorCode.PERMISSION_DENIED),
    errno.ENOSPC: (507, api.ErrorCode.NO_SPACE),
    errno.EDQUOT: (507, api.ErrorCode.NO_SPACE),
}


def _os_problem(exc: Exception) -> tuple[int, api.ErrorCode, str] | None:
    """What the OS refused, as a problem (status, code, detail); None for anything but an ``OSError``."""
    if not isinstance(exc, OSError):
        return None
    status, code = _ERRNO_PROBLEMS.get(exc.errno, (400, api.ErrorCode.INVALID_REQUEST))
    what = os.path.basename(exc.filename) if isinstance(exc.filename, str) else ""
    return status, code, f"{exc.strerror or exc}{': ' + what if what else ''}"


def _os_error(_: Request, exc: OSError) -> Response:
    """File-system errors from any route become problems that say what the OS refused."""
    return problem_response(*_os_problem(exc))


@dataclass
class _Sandbox:
    """The one sandbox an agent serves: what its routes read."""

    root: SandboxRoot
    processes: ProcessTable
    base_env: dict[str, str]
    started: float = field(default_factory=time.time)
    exec_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loopback: list[aiohttp.ClientSession] = field(default_factory=list)  # made on the first port forward


class AgentRoutes:
    """The agent's routes, built once and then bound to the sandbox they serve (:meth:`serve`).

    Building FastAPI's routes costs about 8 ms of CPU even with its caches warm: the zygote builds them
    before it forks, and every sandbox it starts only binds them (:mod:`orchard.env.backends.zygote`).
    """

    def __init__(self) -> None:
        self.sandbox: _Sandbox | None = None
        self.app, self.fast = _build(self)

    def box(self) -> _Sandbox:
        if self.sandbox is None:
            raise RuntimeError("the agent's routes serve no sandbox yet: call AgentRoutes.serve first")
        return self.sandbox

    def serve(self, config: AgentConfig) -> BearerAuth:
        """Bind the routes to ``config``'s sandbox; the app to run, behind its token."""
        run_commands_as(config.user)
        self.sandbox = _Sandbox(SandboxRoot(config.root, config.workdir),
                                ProcessTable(os.path.join(config.state_dir, "processes")), dict(config.env))
        return BearerAuth(self.fast, config.token, exempt=frozenset({"/health"}))


def create_app(config: AgentConfig, routes: AgentRoutes | None = None) -> BearerAuth:
    """The agent for one sandbox, on ``routes`` built beforehand (the zygote's), else on new ones."""
    return (routes or AgentRoutes()).serve(config)


def _build(routes: AgentRoutes) -> tuple[FastAPI, FastRoutes]:
    """The agent's FastAPI app and the fast path in front of it; every route reads its sandbox from ``routes``."""
    box = routes.box

    async def serialised(work: Callable[[], Awaitable[T]]) -> T:
        async with box().exec_lock:
            return await work()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        _protect_agent()
        REAPER.install(asyncio.get_running_loop())
        sandbox = box()
        try:
            yield
        finally:
            sandbox.processes.kill_all()
            REAPER.uninstall()
            for session in sandbox.loopback:
                await session.close()

    app = FastAPI(title="Orchard Env agent", version=__version__, lifespan=lifespan)
    install_problem_handlers(app)
    app.add_exception_handler(OSError, _os_error)

    def command_env(extra: dict[str, str]) -> dict[str, str]:
        base_env = box().base_env
        return {**base_env, **extra} if extra else base_env

    @app.get("/health", response_model=api.Health)
    async def health() -> Response:
        return json_response(api.Health(version=__version__, pid=os.getpid(), uptime=time.time() - box().started))

    async def exec_whole(request: api.ExecRequest, receive: Receive) -> str:
        """Run a command to completion; the response's JSON. A caller that hangs up kills the command."""
        cwd = box().root.workdir_path(request.cwd)
        out, err = CappedBuffer(request.max_output_bytes), CappedBuffer(request.max_output_bytes)
        outcome = await cancel_on_disconnect(receive, serialised(lambda: run(
            request.command, cwd=cwd, env=command_env(request.env), stdin=request.stdin_bytes(),
            timeout=request.timeout, stdout_sink=out.write, stderr_sink=err.write)))
        stdout, stdout_encoding = api.encode_output(out.getvalue())
        stderr, stderr_encoding = api.encode_output(err.getvalue())
        return api.ExecResponse(
            exit_code=outcome.exit_code, stdout=stdout, stderr=stderr, stdout_encoding=stdout_encoding,
            stderr_encoding=stderr_encoding, stdout_total=out.total, stderr_total=err.total,
            timed_out=outcome.timed_out, truncated=out.truncated or err.truncated, duration=outcome.duration,
        ).model_dump_json()

    @app.post("/exec", response_model=api.ExecResponse)
    async def exec_command(request: api.ExecRequest, http: Request) -> Response:
        """Served by the fast path below; here for the schema and for an app run without it."""
        return Response(await exec_whole(request, http.receive), media_type="application/json")

    async def exec_fast(_: str, __: list[tuple[str, str]], body: bytes, receive: Receive) -> Reply:
        return json_reply(await exec_whole(api.ExecRequest.model_validate_json(body), receive))

    @app.post("/exec/stream", response_class=StreamingResponse)
    async def exec_stream(request: api.ExecRequest) -> StreamingResponse:
        cwd = box().root.workdir_path(request.cwd)
        env, stdin = command_env(request.env), request.stdin_bytes()

        async def events() -> AsyncIterator[bytes]:
            chunks: asyncio.Queue[api.StreamEvent] = asyncio.Queue(maxsize=16)

            def sink(kind: str):
                async def put(data: bytes) -> None:
                    text, encoding = api.encode_output(data)
                    await chunks.put(api.StreamEvent(type=kind, data=text, encoding=encoding))
                return put

            task = asyncio.ensure_future(serialised(lambda: run(
                request.command, cwd=cwd, env=env, stdin=stdin, timeout=request.timeout,
                stdout_sink=sink("stdout"), stderr_sink=sink("stderr"))))
            try:
                while True:
                    getter = asyncio.ensure_future(chunks.get())
                    await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
                    if getter.done():
                        yield getter.result().model_dump_json().encode() + b"\n"
                        continue
                    getter.cancel()
                    break
                while not chunks.empty():
                    yield chunks.get_nowait().model_dump_json().encode() + b"\n"
                outcome = task.result()
                yield api.StreamEvent(type="exit", exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                                      duration=outcome.duration).model_dump_json().encode() + b"\n"
            finally:
                task.cancel()  # a client that hangs up kills the command
                await asyncio.gather(task, return_exceptions=True)

        return StreamingResponse(events(), media_type="application/x-ndjson")

    # ----------------------------------------------------------------- processes

    @app.post("/processes", response_model=api.ProcessInfo)
    async def process_start(request: api.ProcessStartRequest) -> Response:
        cwd = box().root.workdir_path(request.cwd)
        return json_response(box().processes.start(request.command, cwd=cwd, env=command_env(request.env), name=request.name))

    @app.get("/processes", response_model=list[api.ProcessInfo])
    async def process_list() -> list[api.ProcessInfo]:
        return box().processes.list()

    @app.get("/processes/{process_id}", response_model=api.ProcessInfo)
    async def process_get(process_id: str) -> Response:
        return json_response(box().processes.get(process_id).info())

    @app.get("/processes/{process_id}/logs")
    async def process_logs(process_id: str, offset: int = Query(0, ge=0),
                           limit: int = Query(1 << 20, gt=0, le=16 << 20)) -> Response:
        data, next_offset = box().processes.read_log(process_id, offset, limit)
        return Response(data, media_type="application/octet-stream",
                        headers={api.NEXT_OFFSET_HEADER: str(next_offset)})

    @app.delete("/processes/{process_id}", response_model=api.ProcessInfo)
    async def process_kill(process_id: str, signal_number: int = Query(int(signal.SIGKILL), alias="signal")) -> Response:
        return json_response(box().processes.kill(process_id, signal_number))

    # --------------------------------------------------------------------- files

    @app.put("/files", response_model=api.FileInfo)
    async def file_write(request: Request, path: str, mode: int | None = Query(None, ge=0, le=0o7777)) -> Response:
        return json_response(await files.write_file(box().root, path, request.stream(), mode))

    @app.get("/files", response_class=StreamingResponse)
    async def file_read(path: str) -> StreamingResponse:
        fd, size = files.open_for_read(box().root, path)
        return StreamingResponse(files.iter_fd(fd), media_type="application/octet-stream",
                                 headers={"content-length": str(size)})

    @app.delete("/files", status_code=204)
    async def file_delete(path: str) -> Response:
        files.delete_path(box().root, path)
        return Response(status_code=204)

    @app.get("/files/list", response_model=list[api.FileInfo])
    async def file_list(path: str) -> list[api.FileInfo]:
        return files.list_dir(box().root, path)

    @app.get("/files/stat", response_model=api.FileInfo)
    async def file_stat(path: str) -> Response:
        return json_response(files.stat_path(box().root, path))

    @app.put("/archive", response_model=api.FileInfo)
    async def archive_write(request: Request, path: str) -> Response:
        return json_response(await files.extract_tar(box().root, path, request.stream()))

    @app.get("/archive", response_class=StreamingResponse)
    async def archive_read(path: str) -> StreamingResponse:
        return StreamingResponse(files.tar_directory(box().root, path), media_type="application/x-tar")

    @app.post("/patch", response_model=api.PatchResponse)
    async def patch(request: api.PatchRequest) -> Response:
        cwd = box().root.workdir_path(request.cwd)
        return json_response(await serialised(lambda: apply_patch(request.diff, cwd, request.fuzz)))

    # --------------------------------------------------------------------- ports

    def loopback_session() -> aiohttp.ClientSession:
        loopback = box().loopback
        if not loopback:
            loopback.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
                                                  auto_decompress=False))
        return loopback[0]

    async def port_forward(request: Request, port: int = PathParam(ge=1, le=65535), path: str = "") -> Response:
        """A request to ``port`` on the sandbox's own loopback (its answer streamed back)."""
        try:
            return await relay(loopback_session(), f"http://127.0.0.1:{port}/{path}", request)
        except aiohttp.ClientConnectionError as exc:
            raise ProblemError(502, api.ErrorCode.PORT_UNREACHABLE,
                               f"nothing answers on port {port} in the sandbox ({exc})") from None

    app.add_api_route("/ports/{port}", port_forward, methods=list(api.PORT_METHODS), include_in_schema=False)
    app.add_api_route("/ports/{port}/{path:path}", port_forward, methods=list(api.PORT_METHODS),
                      include_in_schema=False)

    async def port_websocket(websocket: WebSocket, port: int, path: str = "") -> None:
        """A WebSocket to ``port`` on the sandbox's own loopback."""
        if not 1 <= port <= 65535:
            await websocket.close(code=1008, reason=f"port must be in 1..65535, got {port}")
            return
        await relay_websocket(websocket, loopback_session(), f"http://127.0.0.1:{port}/{path}")

    app.add_api_websocket_route("/ports/{port}", port_websocket)
    app.add_api_websocket_route("/ports/{port}/{path:path}", port_websocket)

    fast = FastRoutes(app, {("POST", "/exec"): exec_fast}, parameter=False, problem=_os_problem)
    return app, fast
