"""What the recording proxy adds to a call: latency against calling the upstream directly, same run.

The upstream is a fake OpenAI server (:func:`fake_upstream`, its own process) that answers at once
with a fixed 16-token completion, its token ids and logprobs, or streams it as 16 chunks, so the
numbers are the proxy's own cost (routing, the override, the upstream hop, the record, the
stripping) and not a model's. ``orchard proxy`` runs as a real process in front of it, one session
per simulated harness. For each concurrency (harnesses calling at once, each its own session) and
mode (streamed or not), every harness makes ``calls`` sequential calls, first straight to the
upstream, then through the proxy, then straight again, and the latency of each full call is
recorded. The added latency is the difference of the two paths' percentiles. Both paths share this
machine's cores with the upstream and the load generator, as a trainer's would.

The CPU time the proxy process spends per proxied call is reported beside it, with the fake
upstream's (a FastAPI app that only answers: the floor of a Python ASGI server). The proxy is one
event loop, so when ``n`` sessions call back to back a call waits for the others' share:
the added p50 at ``n`` sessions is about ``n / 2`` times its CPU per call.

LiteLLM's proxy was the other peer named. Its server is the ``litellm[proxy]`` extra, which for the
litellm Orchard installs (1.110.2) requires ``litellm-proxy==1.110.2``, a package the registry here
does not have, so it is not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from tqdm import tqdm

from benchmarks.env import latency_stats, percentile
from orchard.env.local import free_port

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 16


def fake_upstream() -> FastAPI:
    """An OpenAI-compatible server that answers every chat call at once with 16 fixed tokens."""
    app = FastAPI()
    ids, logprobs = list(range(100, 100 + TOKENS)), [-0.5] * TOKENS

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        head = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake", "weight_version": 0}
        if body.get("stream"):
            async def chunks():
                first = {**head, "object": "chat.completion.chunk", "prompt_token_ids": [1, 2, 3],
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
                yield f"data: {json.dumps(first)}\n\n"
                for i in range(TOKENS):
                    choice = {"index": 0, "delta": {"content": " x"}, "token_ids": [ids[i]],
                              "logprobs": {"content": [{"token": " x", "logprob": logprobs[i]}]},
                              "finish_reason": "stop" if i == TOKENS - 1 else None}
                    yield f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', 'choices': [choice]})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(chunks(), media_type="text/event-stream")
        return {**head, "prompt_token_ids": [1, 2, 3],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " x" * TOKENS},
                             "finish_reason": "stop", "token_ids": ids,
                             "logprobs": {"content": [{"token": " x", "logprob": v} for v in logprobs]}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": 3 + TOKENS}}

    return app


def _serve_fake(port: int) -> None:
    import uvicorn

    uvicorn.run(fake_upstream(), host="127.0.0.1", port=port, log_level="warning")


def _wait(url: str, process: subprocess.Popen, what: str) -> None:
    for _ in range(300):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer at {url}")


@contextlib.contextmanager
def servers(records: str) -> Iterator[tuple[str, str, int, int]]:
    """The fake upstream and ``orchard proxy`` in front of it, as processes: their root URLs and pids."""
    upstream_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    upstream = subprocess.Popen([sys.executable, "-c", f"from benchmarks.proxy import _serve_fake; _serve_fake({upstream_port})"],
                                cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    proxy = subprocess.Popen([sys.executable, "-m", "orchard.cli", "proxy", "--upstream", f"http://127.0.0.1:{upstream_port}",
                              "--records", records, "--port", str(proxy_port), "--log-level", "warning"],
                             stdin=subprocess.DEVNULL)
    try:
        _wait(f"http://127.0.0.1:{upstream_port}/v1/models", upstream, "the fake upstream")
        _wait(f"http://127.0.0.1:{proxy_port}/health", proxy, "orchard proxy")
        yield f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{proxy_port}", upstream.pid, proxy.pid
    finally:
        for process in (proxy, upstream):
            process.terminate()
            process.wait(20)


def _cpu_s(process) -> float:
    """CPU seconds (user + system) a process has used so far."""
    times = process.cpu_times()
    return times.user + times.system


async def _call(http: httpx.AsyncClient, base: str, stream: bool) -> float:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": TOKENS, "stream": stream}
    start = time.perf_counter()
    if stream:
        async with http.stream("POST", f"{base}/chat/completions", json=body) as response:
            async for _ in response.aiter_lines():
                pass
            response.raise_for_status()
    else:
        (await http.post(f"{base}/chat/completions", json=body)).raise_for_status()
    return time.perf_counter() - start


async def _path(bases: list[str], calls: int, stream: bool, bar: tqdm) -> list[float]:
    async def harness(base: str) -> list[float]:
        async with httpx.AsyncClient(timeout=60) as http:
            await _call(http, base, stream)  # warm the connection
            samples = []
            for _ in range(calls):
                samples.append(await _call(http, base, stream))
                bar.update()
            return samples

    return [s for samples in await asyncio.gather(*(harness(b) for b in bases)) for s in samples]


def run_proxy_bench(concurrency: tuple[int, ...] = (1, 16, 64), calls: int = 50, progress: bool = True,
                    command: str | None = None) -> dict[str, Any]:
    """The summary: per concurrency and mode, p50/p95/p99 of both paths and what the proxy adds."""
    import psutil

    results: dict[str, Any] = {}
    with (tempfile.TemporaryDirectory(prefix="orchard-proxy-bench-") as records,
          servers(records) as (upstream, proxy, upstream_pid, proxy_pid)):
        cpu, upstream_cpu = psutil.Process(proxy_pid), psutil.Process(upstream_pid)
        total = sum(3 * c * calls for c in concurrency) * 2
        with tqdm(total=total, desc="proxy bench", unit="call", disable=not progress, file=sys.stderr) as bar:
            for sessions in concurrency:
                opened = [httpx.post(f"{proxy}/sessions", json={"task": "bench", "harness": f"h{i}"}).json()
                          for i in range(sessions)]
                for stream in (False, True):
                    direct = asyncio.run(_path([f"{upstream}/v1"] * sessions, calls, stream, bar))
                    before = _cpu_s(cpu), _cpu_s(upstream_cpu)
                    proxied = asyncio.run(_path([s["base_url"] for s in opened], calls, stream, bar))
                    per_call = 1000 / (len(proxied) + sessions)  # the warm-up calls count too
                    cpu_ms = (_cpu_s(cpu) - before[0]) * per_call, (_cpu_s(upstream_cpu) - before[1]) * per_call
                    direct += asyncio.run(_path([f"{upstream}/v1"] * sessions, calls, stream, bar))
                    stats = {}
                    for name, samples in (("direct", direct), ("proxy", proxied)):
                        stats[name] = {**latency_stats(samples), "p95_ms": percentile(samples, 95) * 1000,
                                       "n": len(samples)}
                    stats["added_ms"] = {q: stats["proxy"][q] - stats["direct"][q] for q in ("p50_ms", "p95_ms", "p99_ms")}
                    stats["ratio_p50"] = stats["proxy"]["p50_ms"] / stats["direct"]["p50_ms"]
                    stats["proxy_cpu_ms_per_call"], stats["upstream_cpu_ms_per_call"] = cpu_ms
                    results[f"{sessions}_{'stream' if stream else 'plain'}"] = stats
                for session in opened:
                    httpx.post(f"{proxy}/sessions/{session['id']}/close")
    return {"command": command, "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
            "calls_per_session": calls, "completion_tokens": TOKENS, "results": results}


def render_proxy_bench(summary: dict[str, Any]) -> str:
    rows = []
    for key, stats in summary["results"].items():
        sessions, mode = key.split("_")
        rows.append(f"| {sessions} | {mode} | {stats['direct']['p50_ms']:.2f} / {stats['direct']['p95_ms']:.2f} / "
                    f"{stats['direct']['p99_ms']:.2f} | {stats['proxy']['p50_ms']:.2f} / {stats['proxy']['p95_ms']:.2f} / "
                    f"{stats['proxy']['p99_ms']:.2f} | {stats['added_ms']['p50_ms']:+.2f} / "
                    f"{stats['added_ms']['p99_ms']:+.2f} | {stats['proxy_cpu_ms_per_call']:.2f} / "
                    f"{stats['upstream_cpu_ms_per_call']:.2f} |")
    return "\n".join([
        "### The recording proxy: added latency per call",
        "",
        f"Measured {summary['date']} on {summary['machine']}: `{summary['command']}`. A fake upstream answering "
        f"{summary['completion_tokens']} tokens at once (or in as many chunks), `orchard proxy` in front of it, "
        f"{summary['calls_per_session']} sequential calls per session, all sessions at once; direct calls "
        "before and after the proxied ones (`benchmarks/proxy.py`). Milliseconds, p50 / p95 / p99.",
        "",
        "| sessions | mode | direct | through the proxy | added p50 / p99 | CPU per call: proxy / upstream |",
        "|---:|---|---:|---:|---:|---:|",
        *rows,
    ])
