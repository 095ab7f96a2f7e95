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

LiteLLM's proxy is the peer (``litellm=`` the ``litellm`` command of a venv with ``litellm[proxy]``):
the same fake upstream as its one model, a logging callback that appends every call's request and
response to a JSONL file as Orchard's records do, one uvicorn worker as ``orchard proxy`` has, and
its sessions' calls made with the master key. It has its own venv (``make bench`` makes it): its
proxy extra pins another FastAPI and uvicorn than Orchard's, and for the litellm Orchard installs
(1.110.2) the extra requires ``litellm-proxy``, which the registry here does not have; 1.84.0's
extra installs.
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
from orchard.results import markdown_table

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


def _wait(url: str, process: subprocess.Popen, what: str, tries: int = 300) -> None:
    for _ in range(tries):
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer at {url}")


# LiteLLM's logging callback: what it writes per call is what a user of its proxy would record.
LITELLM_RECORDER = """
import json, os
from litellm.integrations.custom_logger import CustomLogger


class Recorder(CustomLogger):
    def __init__(self):
        self.file = open(os.environ["ORCHARD_BENCH_RECORDS"], "a")

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        body = response_obj.model_dump() if hasattr(response_obj, "model_dump") else str(response_obj)
        record = {"model": kwargs.get("model"), "messages": kwargs.get("messages"), "response": body,
                  "latency_s": (end_time - start_time).total_seconds()}
        self.file.write(json.dumps(record, default=str) + "\\n")
        self.file.flush()


recorder = Recorder()
"""


@contextlib.contextmanager
def litellm_proxy(litellm: str, upstream: str, workdir: str) -> Iterator[tuple[str, int]]:
    """LiteLLM's proxy (``litellm`` the command of its venv) in front of ``upstream``, with a logging
    callback that records every call to ``workdir/litellm.jsonl``: its root URL and pid."""
    port = free_port()
    Path(workdir, "orchard_bench_recorder.py").write_text(LITELLM_RECORDER)
    Path(workdir, "config.yaml").write_text(json.dumps({  # YAML is a superset of JSON
        "model_list": [{"model_name": "fake", "litellm_params": {"model": "openai/fake", "api_base": f"{upstream}/v1",
                                                                  "api_key": "EMPTY"}}],
        "litellm_settings": {"callbacks": "orchard_bench_recorder.recorder", "telemetry": False}}))
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "ORCHARD_BENCH_RECORDS": os.path.join(workdir, "litellm.jsonl")}
    with open(os.path.join(workdir, "litellm.log"), "wb") as log_file:
        process = subprocess.Popen([os.path.abspath(litellm), "--config", "config.yaml", "--host", "127.0.0.1",
                                    "--port", str(port), "--num_workers", "1"], cwd=workdir, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        _wait(f"http://127.0.0.1:{port}/health/liveliness", process, "LiteLLM's proxy", tries=1200)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(20)


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
    """CPU seconds (user + system) a process and its children have used so far."""
    total = 0.0
    for each in (process, *process.children(recursive=True)):
        times = each.cpu_times()
        total += times.user + times.system
    return total


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
                    command: str | None = None, litellm: str | None = None) -> dict[str, Any]:
    """The summary: per concurrency and mode, p50/p95/p99 of each path and what each proxy adds.

    ``litellm``: the ``litellm`` command of a venv with ``litellm[proxy]``, to measure its proxy too."""
    import psutil

    results: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        records = stack.enter_context(tempfile.TemporaryDirectory(prefix="orchard-proxy-bench-"))
        upstream, proxy, upstream_pid, proxy_pid = stack.enter_context(servers(records))
        proxies = {"proxy": proxy_pid}
        if litellm:
            litellm_url, proxies["litellm"] = stack.enter_context(litellm_proxy(litellm, upstream, records))
        processes = {name: psutil.Process(pid) for name, pid in {**proxies, "upstream": upstream_pid}.items()}
        total = sum((2 + len(proxies)) * c * calls for c in concurrency) * 2
        with tqdm(total=total, desc="proxy bench", unit="call", disable=not progress, file=sys.stderr) as bar:
            for sessions in concurrency:
                opened = [httpx.post(f"{proxy}/sessions", json={"task": "bench", "harness": f"h{i}"}).json()
                          for i in range(sessions)]
                bases = {"proxy": [s["base_url"] for s in opened]}
                if litellm:
                    bases["litellm"] = [f"{litellm_url}/v1"] * sessions
                for stream in (False, True):
                    samples = {"direct": asyncio.run(_path([f"{upstream}/v1"] * sessions, calls, stream, bar))}
                    stats: dict[str, Any] = {}
                    for name, urls in bases.items():
                        before = {n: _cpu_s(p) for n, p in processes.items()}
                        samples[name] = asyncio.run(_path(urls, calls, stream, bar))
                        per_call = 1000 / (len(samples[name]) + sessions)  # the warm-up calls count too
                        cpu = {n: (_cpu_s(p) - before[n]) * per_call for n, p in processes.items()}
                        stats[f"{name}_cpu_ms_per_call"] = cpu[name]
                        stats.setdefault("upstream_cpu_ms_per_call", cpu["upstream"])
                    samples["direct"] += asyncio.run(_path([f"{upstream}/v1"] * sessions, calls, stream, bar))
                    for name, values in samples.items():
                        stats[name] = {**latency_stats(values), "p95_ms": percentile(values, 95) * 1000, "n": len(values)}
                    for name in bases:  # "added_ms" and "ratio_p50" are the recording proxy's
                        prefix = "" if name == "proxy" else f"{name}_"
                        stats[f"{prefix}added_ms"] = {q: stats[name][q] - stats["direct"][q]
                                                      for q in ("p50_ms", "p95_ms", "p99_ms")}
                        stats[f"{prefix}ratio_p50"] = stats[name]["p50_ms"] / stats["direct"]["p50_ms"]
                    if litellm:
                        stats["proxy_over_litellm_p50"] = stats["proxy"]["p50_ms"] / stats["litellm"]["p50_ms"]
                    results[f"{sessions}_{'stream' if stream else 'plain'}"] = stats
                for session in opened:
                    httpx.post(f"{proxy}/sessions/{session['id']}/close")
        recorded = {"proxy": _lines(Path(records).glob("*.jsonl"), '"type":"call"')}
        if litellm:  # its callback runs after the reply: wait for the last ones
            expected = sum(2 * c * (calls + 1) for c in concurrency)
            for _ in range(50):
                recorded["litellm"] = _lines([Path(records, "litellm.jsonl")])
                if recorded["litellm"] >= expected:
                    break
                time.sleep(0.1)
    return {"command": command, "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
            "calls_per_session": calls, "completion_tokens": TOKENS, "litellm": _litellm_version(litellm),
            "calls_recorded": recorded, "results": results}


def _lines(paths, containing: str = "") -> int:
    """How many lines of these files contain ``containing``."""
    return sum(containing in line for path in paths if path.exists() for line in path.open())


def _litellm_version(litellm: str | None) -> str | None:
    if not litellm:
        return None
    python = os.path.join(os.path.dirname(litellm), "python")
    return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _triple(stats: dict[str, float]) -> str:
    return f"{stats['p50_ms']:.2f} / {stats['p95_ms']:.2f} / {stats['p99_ms']:.2f}"


def render_proxy_bench(summary: dict[str, Any]) -> str:
    peer = summary.get("litellm")
    rows = []
    for key, stats in summary["results"].items():
        sessions, mode = key.split("_")
        cells = [sessions, mode, _triple(stats["direct"]), _triple(stats["proxy"]),
                 f"{stats['added_ms']['p50_ms']:+.2f} / {stats['added_ms']['p99_ms']:+.2f}"]
        cpu = f"{stats['proxy_cpu_ms_per_call']:.2f}"
        if peer:
            cells += [_triple(stats["litellm"]),
                      f"{stats['litellm_added_ms']['p50_ms']:+.2f} / {stats['litellm_added_ms']['p99_ms']:+.2f}",
                      f"{stats['proxy_over_litellm_p50']:.2f}"]
            cpu += f" / {stats['litellm_cpu_ms_per_call']:.2f}"
        rows.append([*cells, f"{cpu} / {stats['upstream_cpu_ms_per_call']:.2f}"])
    header = ["sessions", "mode", "direct", "through the proxy", "proxy adds p50 / p99"]
    cpu_header = "CPU per call: proxy / upstream"
    if peer:
        header += [f"through LiteLLM {peer}", "LiteLLM adds p50 / p99", "p50 proxy / LiteLLM"]
        cpu_header = "CPU per call: proxy / LiteLLM / upstream"
    header.append(cpu_header)
    peer_text = (f" LiteLLM's proxy ({peer}, a logging callback writing each call to JSONL, one worker) in front of "
                 "the same upstream, measured between them." if peer else " LiteLLM's proxy was not run.")
    return "\n".join([
        "### The recording proxy: added latency per call",
        "",
        f"Measured {summary['date']} on {summary['machine']}: `{summary['command']}`. A fake upstream answering "
        f"{summary['completion_tokens']} tokens at once (or in as many chunks), `orchard proxy` in front of it, "
        f"{summary['calls_per_session']} sequential calls per session, all sessions at once; direct calls "
        f"before and after the proxied ones (`benchmarks/proxy.py`).{peer_text} Milliseconds, p50 / p95 / p99.",
        "",
        markdown_table(header, rows, [None if h == "mode" else "right" for h in header]),
    ])
