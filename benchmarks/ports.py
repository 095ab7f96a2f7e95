"""What a port forward costs: a request to a server inside a sandbox, against an exec in it.

One ``network="none"`` sandbox runs :data:`ECHO_SERVER` (aiohttp) on its loopback. In the same run,
``exec true`` through the SDK (the latency an agent's every command pays), a ``GET /`` through the
port forward (``sandbox.port_url``: the orchestrator, the agent, the server; one keep-alive aiohttp
session, as a browser driver or tool client would hold) and a WebSocket round trip through it (one
message echoed on a connection kept open, as DevTools traffic is) are timed, alternating in rounds.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp

from benchmarks.env import BenchConfig, alternate, exec_true, latency_stats, run_metadata
from orchard.env.client import AsyncSandbox
from orchard.env.local import free_port, local_server
from orchard.results import markdown_table

# The server a port-forward test or benchmark runs in a sandbox: ``python server.py PORT``.
ECHO_SERVER = '''
import sys
from aiohttp import web


async def echo(request):
    body = await request.read()
    reply = web.json_response({"method": request.method, "path": request.path, "query": request.query_string,
                               "headers": dict(request.headers), "body": body.decode()})
    reply.headers.add("Set-Cookie", "a=1")
    reply.headers.add("Set-Cookie", "b=2")
    return reply


async def stream(request):
    reply = web.StreamResponse()
    await reply.prepare(request)
    for i in range(3):
        await reply.write(f"chunk {i}\\n".encode())
    return reply


async def health(request):
    return web.Response(text="ok")


async def ws_echo(request):
    ws = web.WebSocketResponse(protocols=("echo",))
    await ws.prepare(request)
    async for message in ws:
        if message.type == web.WSMsgType.TEXT and message.data == "bye":
            await ws.close(code=4001)
        elif message.type == web.WSMsgType.TEXT:
            await ws.send_str(f"echo: {message.data} ({request.query_string})")
        elif message.type == web.WSMsgType.BINARY:
            await ws.send_bytes(message.data[::-1])
    return ws


app = web.Application()
app.router.add_route("*", "/echo/{tail:.*}", echo)
app.router.add_get("/stream", stream)
app.router.add_get("/", health)
app.router.add_get("/ws", ws_echo)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


async def start_echo_server(sandbox: AsyncSandbox, timeout: float = 60.0) -> int:
    """:data:`ECHO_SERVER` started in ``sandbox`` (with this Python); its port, once it answers."""
    port = free_port()
    await sandbox.write_file("/workspace/echo_server.py", ECHO_SERVER)
    await sandbox.start_process([sys.executable, "/workspace/echo_server.py", str(port)], name="echo-server")
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession(headers=sandbox.port_headers) as http:
        while True:
            try:
                async with http.get(sandbox.port_url(port)) as response:
                    if response.status == 200:
                        return port
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the echo server in {sandbox.id} did not answer on port {port}")
            await asyncio.sleep(0.2)


async def _measure(server, cfg: BenchConfig) -> dict[str, list[float]]:
    async with server.async_client() as client:
        sandbox = await client.create(network="none", memory="512Mi")
        try:
            port = await start_echo_server(sandbox)
            async with aiohttp.ClientSession(headers=sandbox.port_headers) as http, \
                    http.ws_connect(sandbox.port_url(port, "/ws", websocket=True)) as ws:

                async def get() -> None:
                    async with http.get(sandbox.port_url(port)) as response:
                        await response.read()
                        assert response.status == 200

                async def round_trip() -> None:
                    await ws.send_str("x")
                    await ws.receive_str()

                calls = {"exec": lambda: exec_true(sandbox), "http": get, "websocket": round_trip}
                return await alternate(calls, cfg, cfg.rounds, "ports")
        finally:
            await sandbox.delete()


def run_ports(cfg: BenchConfig, command: str | None = None) -> dict[str, Any]:
    """The summary: p50/p99 of exec, an HTTP GET and a WebSocket round trip; each over exec's p50."""
    with local_server() as server:
        samples = asyncio.run(_measure(server, cfg))
    stats = {name: {**latency_stats(values), "n": len(values)} for name, values in samples.items()}
    ratio = {name: stats[name]["p50_ms"] / stats["exec"]["p50_ms"] for name in ("http", "websocket")}
    return {"metadata": {**run_metadata(cfg, command), "rounds": cfg.rounds}, "latency": stats,
            "ratio_p50_over_exec": ratio}


def render_ports(summary: dict[str, Any]) -> str:
    stats, ratio, meta = summary["latency"], summary["ratio_p50_over_exec"], summary["metadata"]
    labels = {"exec": "exec `true` (the SDK)", "http": "HTTP `GET /` through the port forward",
              "websocket": "WebSocket round trip through the port forward"}
    rows = [(label, f"{stats[name]['p50_ms']:.2f} / {stats[name]['p99_ms']:.2f}",
             "1.00" if name == "exec" else f"{ratio[name]:.2f}") for name, label in labels.items()]
    return "\n".join([
        "### Port forwards: a server inside a sandbox, against exec",
        "",
        f"Measured {meta['timestamp'][:10]} on {meta['cpu_count']} cores: `{meta['command']}`. One "
        "`network=\"none\"` sandbox running an aiohttp server on its loopback; exec, a keep-alive GET and "
        f"a WebSocket echo on an open connection, alternating over {meta['rounds']} rounds "
        "(`benchmarks/ports.py`). Milliseconds, p50 / p99.",
        "",
        markdown_table(["", "p50 / p99", "p50 over exec's"], rows, [None, "right", "right"]),
    ])
