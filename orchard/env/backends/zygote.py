"""The zygote: one process that has imported the agent, forking every sandbox's agent from itself.

Starting an agent the plain way (``unshare ... python -m orchard.env.agent``) costs each sandbox a
fresh interpreter that imports FastAPI, pydantic and uvicorn: about 0.3 s of CPU and 35 MiB of
memory that is its alone. The zygote imports all of it once, builds the agent's routes once (each
sandbox binds them to itself: :class:`orchard.env.agent.app.AgentRoutes`), freezes the objects out of the
garbage collector's reach (``gc.freeze``, so that collections do not write to the shared pages),
and serves launch requests on a Unix socket. For each request:

1. it forks a child, which joins the sandbox's cgroups, sends its output to ``agent.log``, and
   creates the new namespaces with ``unshare(2)`` (mount, UTS, IPC, PID and, for
   ``network="none"``, network);
2. that child forks the sandbox's PID 1, answers the orchestrator with its host pid, and exits;
3. PID 1 builds the sandbox's root with system calls (:func:`orchard.env.backends.rootfs.build_root`)
   and ``pivot_root``s into it;
4. on the host's root, PID 1 then drops every capability outside the sandbox's set (bounding,
   permitted, effective and inheritable), sets no_new_privs and loads the seccomp filter
   (:mod:`orchard.env.agent.confine`, built once here), cleans its environment, and runs the
   agent it already has in memory; in an image, it confines itself the same way and execs the
   agent bundle's ``setpriv`` and frozen agent, which inherit both.

Pages stay shared copy-on-write between the zygote and every sandbox until written. Every sandbox
of a root backend starts here; the rootless path keeps ``unshare`` and ``sandbox_init.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile

from orchard.env.agent.confine import ConfinementError, build_filter, confine
from orchard.env.backends.rootfs import LIBC, RootPlan, build_root, libc_call

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP = 1, 24
LAUNCH_BACKLOG = 128
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
CAPABILITIES = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4, "kill": 5,
                "setgid": 6, "setuid": 7, "setpcap": 8, "net_bind_service": 10, "net_raw": 13,
                "sys_chroot": 18, "audit_write": 29, "setfcap": 31}


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities(keep: tuple[str, ...]) -> None:
    """Leave only ``keep`` in this process's bounding, permitted, effective and inheritable sets,
    as ``setpriv --bounding-set`` plus the exec that follows it would."""
    mask = sum(1 << CAPABILITIES[name] for name in keep)
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        if not mask >> cap & 1:
            libc_call(LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    data = (_CapData * 2)()
    for word in range(2):
        bits = (mask >> (32 * word)) & 0xFFFFFFFF
        data[word].effective = data[word].permitted = bits
    libc_call(LIBC.capset(ctypes.byref(_CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")


# ------------------------------------------------------------ inside the zygote

_seccomp: object | str | None = None  # the filter every sandbox loads, or why it could not be built
_routes = None  # the agent's routes (orchard.env.agent.app.AgentRoutes), built once by _preload


def _become_sandbox(request: dict) -> None:
    """PID 1 of the new namespaces: build the root, drop privileges, run the agent. Never returns."""
    from orchard.env.agent import server as agent_server
    from orchard.env.agent.app import AGENT_OOM_SCORE_ADJ

    os.setsid()
    # Now, while PID 1 may still have CAP_SYS_RESOURCE: the agent cannot lower its own score once
    # the capabilities are gone, and the value survives the exec. (Where root itself lacks the
    # capability, as on the CI machines, the agent stays at 0; commands still run at +1000.)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as handle:
        handle.write(str(AGENT_OOM_SCORE_ADJ))
    build_root(RootPlan(**request["plan"]))
    if request["confine"] and not isinstance(_seccomp, str):
        confine(_seccomp)
    elif request["confine"]:
        raise ConfinementError(_seccomp)
    if request["exec"]:  # an image: its agent is the bundle's, which starts the same way from here
        os.execve(request["exec"][0], request["exec"], request["agent_env"])
    drop_capabilities(tuple(request["caps"]))
    os.environ.clear()
    os.environ.update(request["agent_env"])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    agent_server.run_agent(agent_server.build_parser().parse_args(request["agent_args"]), _routes)
    os._exit(0)


def _launch(connection: socket.socket, request: dict) -> None:
    """The forked child: cgroups, log, namespaces; fork PID 1 and report its pid. Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for procs in request["join"]:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))
        if not request["join"]:  # no cgroups to write: per-process limits, as prlimit would set
            resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
            resource.setrlimit(resource.RLIMIT_NPROC, (request["pids"], request["pids"]))
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | (CLONE_NEWNET if request["net"] else 0)
        libc_call(LIBC.unshare(flags), "unshare")
        pid = os.fork()
        if pid == 0:
            connection.close()
            os.closerange(3, 65536)
            try:
                _become_sandbox(request)
            except BaseException as error:  # the log is what the orchestrator reports
                print(f"orchard zygote: the sandbox failed to start: {type(error).__name__}: {error}", file=sys.stderr,
                      flush=True)
            os._exit(1)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    except BaseException as error:
        connection.sendall(json.dumps({"error": repr(error)}).encode() + b"\n")
    os._exit(0)


def _preload() -> None:
    """Import everything the agent will import, so the forks share it."""
    import uvicorn.lifespan.on
    import uvicorn.loops.auto
    import uvicorn.protocols.http.auto
    import uvicorn.protocols.websockets.auto

    from orchard.env.agent import app, server  # noqa: F401

    with contextlib.suppress(ImportError):  # uvloop and httptools are optional
        import uvicorn.loops.uvloop
        import uvicorn.protocols.http.httptools_impl
        import uvloop  # noqa: F401

    # Build the agent's routes once, for every fork to bind to its sandbox (8 ms each otherwise), and load a
    # server config over them once: the first build and load fill pydantic's, FastAPI's and uvicorn's caches.
    global _routes
    _routes = app.AgentRoutes()
    with tempfile.TemporaryDirectory() as state_dir:
        warm = _routes.serve(app.AgentConfig(token="warm-up", root="/", workdir="/", state_dir=state_dir, env=(),
                                             user=None))
        uvicorn.Config(warm, uds=os.path.join(state_dir, "agent.sock"), log_level="warning").load()
    _routes.sandbox = None  # each sandbox binds its own


def serve(socket_path: str) -> None:
    global _seccomp
    libc_call(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")  # dies with its orchestrator
    _preload()
    try:
        _seccomp = build_filter()
    except ConfinementError as error:  # each confined launch then fails with this, in its agent.log
        _seccomp = str(error)
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the launch children exit at once: no zombies
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(LAUNCH_BACKLOG)
    print("ready", flush=True)
    while True:
        connection, _ = listener.accept()
        with connection:
            data = b""
            while not data.endswith(b"\n"):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data.endswith(b"\n"):
                continue
            if os.fork() == 0:
                listener.close()
                _launch(connection, json.loads(data))


# ----------------------------------------------------------- in the orchestrator


class Zygote:
    """The orchestrator's handle on its zygote process, started on first use."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self._process: asyncio.subprocess.Process | None = None
        self._starting = asyncio.Lock()
        # The zygote answers one launch at a time: more connections than its backlog would be
        # refused (EAGAIN), so the waiting happens here.
        self._in_flight = asyncio.Semaphore(LAUNCH_BACKLOG // 2)

    async def _ensure(self) -> None:
        async with self._starting:
            if self._process is not None and self._process.returncode is None:
                return
            if os.path.exists(self.socket_path):
                os.unlink(self.socket_path)
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "orchard.env.backends.zygote", "--socket", self.socket_path,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env={"PATH": os.environ.get("PATH", "")})
            line = await asyncio.wait_for(self._process.stdout.readline(), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"the zygote did not start: {line!r}")

    async def launch(self, request: dict) -> int:
        """Start a sandbox as ``request`` says; return the host pid of its PID 1."""
        await self._ensure()
        async with self._in_flight:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
            try:
                writer.write(json.dumps(request).encode() + b"\n")
                await writer.drain()
                answer = json.loads(await asyncio.wait_for(reader.readline(), 30))
            finally:
                writer.close()
        if "error" in answer:
            raise RuntimeError(f"the zygote could not launch the sandbox: {answer['error']}")
        return int(answer["pid"])

    async def close(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="Orchard's sandbox zygote (started by the local backend)")
    parser.add_argument("--socket", required=True)
    serve(parser.parse_args().socket)


if __name__ == "__main__":
    main()
