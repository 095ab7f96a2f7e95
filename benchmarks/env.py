"""Latency benchmark of Orchard Env against SWE-ReX and a bare host subprocess.

Everything is measured in one run, on one machine, with the trivial command ``true`` so that the
numbers are the overhead of each path rather than the work of the command:

* **exec latency** (p50, p99, milliseconds), ``iterations`` timed calls after ``warmup`` untimed ones. Orchard
  and SWE-ReX run side by side, both servers up, in ``rounds`` rounds of alternating order
  (:func:`alternate`), so that a machine that speeds up or slows down during the run weighs on both alike:

  - ``orchard``: ``await sandbox.exec("true")`` through the async SDK. The path is
    SDK -> orchestrator (a real ``orchard env serve`` subprocess on loopback, from
    :func:`orchard.env.local_server`) -> in-sandbox agent -> a process in Linux namespaces.
  - ``swerex``: ``await RemoteRuntime.execute(Command(command="true", shell=True))`` against a
    ``swerex-remote`` server on loopback. SWE-ReX runs the command directly on the host with no
    isolation, and its client opens a new HTTP connection per request; both are how it ships.
  - ``subprocess``: ``subprocess.run("true", shell=True)`` on the host, the floor for any of the above.

* **concurrent exec** (orchard only): ``concurrency`` sandboxes are created up front, each runs one
  untimed warm-up ``true``, then all of them run ``per_sandbox`` sequential ``true`` calls at the same
  time (``asyncio.gather``). Reports per-call p50/p99 and commands per second of wall-clock time.

* **create latency** (orchard only): the time from calling ``client.create()`` until the first
  ``exec("true")`` in the new sandbox returns, over ``creates`` sandboxes created one after another
  (each deleted, untimed, before the next).

Sandboxes and servers are always cleaned up, including on errors and Ctrl-C. Timings use
:func:`time.perf_counter`; percentiles interpolate linearly between closest ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import platform
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from orchard.env.client import AsyncSandbox, AsyncSandboxClient
from orchard.env.local import LocalServer, free_port, local_server
from orchard.results import markdown_table

if TYPE_CHECKING:
    from swerex.runtime.remote import RemoteRuntime

BACKENDS = ("orchard", "swerex", "subprocess")
COMMAND = "true"


@dataclass(frozen=True)
class BenchConfig:
    """How many calls each part of the benchmark makes."""

    iterations: int = 500
    warmup: int = 50
    concurrency: int = 64
    per_sandbox: int = 20
    creates: int = 20
    rounds: int = 4
    progress: bool = True
    swerex_ready_timeout: float = 30.0


# ----------------------------------------------------------------- statistics


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``samples``, interpolating linearly between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def latency_stats(samples: list[float]) -> dict[str, float]:
    """p50 and p99 in milliseconds of latencies given in seconds."""
    return {"p50_ms": _ms(percentile(samples, 50)), "p99_ms": _ms(percentile(samples, 99))}


# ----------------------------------------------------------------- timing loops


def _bar(cfg: BenchConfig, total: int, desc: str) -> tqdm:
    return tqdm(total=total, desc=desc, unit="cmd", disable=not cfg.progress, leave=False, file=sys.stderr)


def time_sync(call: Callable[[], object], cfg: BenchConfig, desc: str) -> list[float]:
    """Run ``call`` ``warmup`` times untimed, then ``iterations`` times; return each call's seconds."""
    samples: list[float] = []
    with _bar(cfg, cfg.warmup + cfg.iterations, desc) as bar:
        for i in range(cfg.warmup + cfg.iterations):
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
            if i >= cfg.warmup:
                samples.append(elapsed)
            bar.update()
    return samples


async def time_async(call: Callable[[], Awaitable[object]], cfg: BenchConfig, desc: str) -> list[float]:
    """The async twin of :func:`time_sync`."""
    samples: list[float] = []
    with _bar(cfg, cfg.warmup + cfg.iterations, desc) as bar:
        for i in range(cfg.warmup + cfg.iterations):
            start = time.perf_counter()
            await call()
            elapsed = time.perf_counter() - start
            if i >= cfg.warmup:
                samples.append(elapsed)
            bar.update()
    return samples


async def alternate(calls: dict[str, Callable[[], Awaitable[object]]], cfg: BenchConfig, rounds: int,
                    desc: str) -> dict[str, list[float]]:
    """Time each of ``calls`` over ``rounds`` rounds whose order alternates (A B, B A, ...), each a round
    ``iterations // rounds`` timed calls after ``warmup // rounds`` untimed ones; each call's seconds."""
    per_round = BenchConfig(iterations=max(1, cfg.iterations // rounds), warmup=max(1, cfg.warmup // rounds),
                            progress=cfg.progress)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for number in range(rounds):
        for name in (list(calls) if number % 2 == 0 else list(reversed(calls))):
            samples[name] += await time_async(calls[name], per_round, f"{desc} {name}")
    return samples


# ----------------------------------------------------------------- subprocess


def _run_true() -> None:
    subprocess.run(COMMAND, shell=True, check=True)


def bench_subprocess(cfg: BenchConfig) -> list[float]:
    """Exec latencies of ``subprocess.run("true", shell=True)`` on the host."""
    return time_sync(_run_true, cfg, "subprocess exec")


# ----------------------------------------------------------------- swe-rex


def _swerex_binary() -> str:
    """``swerex-remote`` next to this interpreter (the venv's), else on ``$PATH``."""
    beside = Path(sys.executable).parent / "swerex-remote"
    if beside.exists():
        return str(beside)
    found = shutil.which("swerex-remote")
    if found is None:
        raise RuntimeError("swerex-remote not found: install swe-rex (`pip install swe-rex`)")
    return found


async def _wait_swerex_alive(runtime: RemoteRuntime, process: subprocess.Popen, log_path: str,
                             timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await runtime.is_alive(timeout=1.0):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            with open(log_path, errors="replace") as log:
                raise RuntimeError(f"swerex-remote did not start:\n{log.read()[-3000:]}")
        await asyncio.sleep(0.05)


def _stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.asynccontextmanager
async def swerex_runtime(cfg: BenchConfig) -> AsyncIterator[RemoteRuntime]:
    """A ``swerex-remote`` server on a free loopback port and a client for it; the server is stopped on exit."""
    from swerex.runtime.remote import RemoteRuntime

    token = secrets.token_urlsafe(24)
    port = free_port()
    log_dir = tempfile.mkdtemp(prefix="orchard-bench-swerex-")
    log_path = os.path.join(log_dir, "swerex-remote.log")
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [_swerex_binary(), "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
    try:
        runtime = RemoteRuntime(host="http://127.0.0.1", port=port, auth_token=token)
        await _wait_swerex_alive(runtime, process, log_path, cfg.swerex_ready_timeout)
        yield runtime
    finally:
        _stop_process(process)
        shutil.rmtree(log_dir, ignore_errors=True)


def swerex_exec(runtime: RemoteRuntime) -> Callable[[], Awaitable[None]]:
    """One ``RemoteRuntime.execute`` of the benchmark's command, checked."""
    from swerex.runtime.abstract import Command

    command = Command(command=COMMAND, shell=True)

    async def call() -> None:
        response = await runtime.execute(command)
        if response.exit_code != 0:
            raise RuntimeError(f"swerex: {COMMAND!r} exited {response.exit_code}: {response.stderr}")

    return call


# ----------------------------------------------------------------- orchard


async def exec_true(sandbox: AsyncSandbox) -> None:
    (await sandbox.exec(COMMAND)).check()


async def bench_orchard_exec(client: AsyncSandboxClient, cfg: BenchConfig) -> list[float]:
    """Exec latencies of ``AsyncSandbox.exec`` in one sandbox."""
    sandbox = await client.create()
    try:
        return await time_async(lambda: exec_true(sandbox), cfg, "orchard exec")
    finally:
        await sandbox.delete()


async def _delete_all(sandboxes: list[AsyncSandbox]) -> None:
    """Delete every sandbox, even if some deletions fail; re-raise the first failure afterwards."""
    results = await asyncio.gather(*(sb.delete() for sb in sandboxes), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]


@contextlib.asynccontextmanager
async def orchard_sandboxes(client: AsyncSandboxClient, count: int, cfg: BenchConfig) -> AsyncIterator[
        list[AsyncSandbox]]:
    """Create ``count`` sandboxes concurrently; delete all that were created on exit, whatever happens."""
    created: list[AsyncSandbox] = []

    async def make(bar: tqdm) -> None:
        sandbox = await client.create()
        created.append(sandbox)
        bar.update()

    try:
        with tqdm(total=count, desc="orchard create", unit="sandbox", disable=not cfg.progress,
                  leave=False, file=sys.stderr) as bar:
            results = await asyncio.gather(*(make(bar) for _ in range(count)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        yield created
    finally:
        await _delete_all(created)


async def bench_orchard_concurrent(client: AsyncSandboxClient, cfg: BenchConfig) -> dict[str, float | int]:
    """All ``concurrency`` sandboxes running ``true`` back to back at the same time."""
    async with orchard_sandboxes(client, cfg.concurrency, cfg) as sandboxes:
        await asyncio.gather(*(exec_true(sb) for sb in sandboxes))  # warm-up, untimed
        samples: list[float] = []
        with _bar(cfg, cfg.concurrency * cfg.per_sandbox, "orchard concurrent") as bar:

            async def worker(sandbox: AsyncSandbox) -> None:
                for _ in range(cfg.per_sandbox):
                    start = time.perf_counter()
                    await exec_true(sandbox)
                    samples.append(time.perf_counter() - start)
                    bar.update()

            start = time.perf_counter()
            await asyncio.gather(*(worker(sb) for sb in sandboxes))
            wall = time.perf_counter() - start
    return {**latency_stats(samples), "commands_per_s": round(len(samples) / wall, 1),
            "sandboxes": cfg.concurrency, "commands_per_sandbox": cfg.per_sandbox}


async def bench_orchard_create(client: AsyncSandboxClient, cfg: BenchConfig) -> list[float]:
    """Seconds from ``client.create()`` to the first ``exec("true")`` returning, one sandbox at a time."""
    samples: list[float] = []
    for _ in tqdm(range(cfg.creates), desc="orchard create+exec", unit="sandbox", disable=not cfg.progress,
                  leave=False, file=sys.stderr):
        start = time.perf_counter()
        sandbox = await client.create()
        try:
            await exec_true(sandbox)
            samples.append(time.perf_counter() - start)
        finally:
            await sandbox.delete()
    return samples


async def bench_exec_side_by_side(server: LocalServer, cfg: BenchConfig) -> dict[str, list[float]]:
    """Exec latencies of orchard (one sandbox) and SWE-ReX (a local ``swerex-remote``), alternating rounds."""
    async with swerex_runtime(cfg) as runtime, server.async_client() as client:
        sandbox = await client.create()
        try:
            return await alternate({"orchard": lambda: exec_true(sandbox), "swerex": swerex_exec(runtime)}, cfg,
                                   cfg.rounds, "exec")
        finally:
            await sandbox.delete()


async def bench_orchard(server: LocalServer, cfg: BenchConfig) -> dict[str, Any]:
    """Exec beside SWE-ReX, then the orchard-only measurements, against one running orchestrator."""
    exec_samples = await bench_exec_side_by_side(server, cfg)
    async with server.async_client() as client:
        concurrent = await bench_orchard_concurrent(client, cfg)
        create_samples = await bench_orchard_create(client, cfg)
    return {"exec": exec_samples, "concurrent": concurrent, "create": create_samples}


@contextlib.contextmanager
def running_orchestrator() -> Iterator[LocalServer]:
    """``local_server()`` that is stopped (SIGTERM: it deletes leftover sandboxes) on exit."""
    server = local_server()
    try:
        yield server
    finally:
        server.stop()


# ----------------------------------------------------------------- summary


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def run_metadata(cfg: BenchConfig, command: str | None) -> dict[str, Any]:
    """Where and how the numbers were taken; deliberately without the hostname."""
    return {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "orchard_version": _version("orchard"),
        "swerex_version": _version("swe-rex"),
        "command": command,
        "config": {k: v for k, v in asdict(cfg).items() if k != "progress"},
    }


def summarize(exec_samples: dict[str, list[float]], concurrent: dict[str, float | int],
              create_samples: list[float], meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON summary: exec p50/p99 per backend, the orchard/swerex p50 ratio, concurrency and creation."""
    stats = {name: latency_stats(exec_samples[name]) for name in BACKENDS}
    p50 = {name: stats[name]["p50_ms"] for name in BACKENDS}
    create = latency_stats(create_samples)
    return {
        "exec_p50_ms": p50,
        "exec_p99_ms": {name: stats[name]["p99_ms"] for name in BACKENDS},
        "exec_p50_ratio_orchard_over_swerex": round(p50["orchard"] / p50["swerex"], 3),
        f"concurrent_{concurrent['sandboxes']}": concurrent,
        "create_p50_ms": create["p50_ms"],
        "create_p99_ms": create["p99_ms"],
        "metadata": meta,
    }


def run_benchmark(cfg: BenchConfig, command: str | None = None) -> dict[str, Any]:
    """Run every measurement (needs root: orchard sandboxes use Linux namespaces) and return the summary.

    ``command`` is how the run was invoked, recorded in the metadata so it can be reproduced.
    """
    exec_samples = {"subprocess": bench_subprocess(cfg)}
    with running_orchestrator() as server:
        orchard = asyncio.run(bench_orchard(server, cfg))
    exec_samples.update(orchard["exec"])
    return summarize(exec_samples, orchard["concurrent"], orchard["create"], run_metadata(cfg, command))


# ----------------------------------------------------------------- markdown


def _concurrent(summary: dict[str, Any]) -> dict[str, Any]:
    return next(v for k, v in summary.items() if k.startswith("concurrent_"))


def render_markdown(summary: dict[str, Any]) -> str:
    """The summary as a Markdown page: one table (orchard / swerex / subprocess columns) and how it was made."""
    meta = summary["metadata"]
    cfg = meta["config"]
    conc = _concurrent(summary)
    rows: list[tuple[str, float | None, float | None, float | None]] = [
        ("`true` exec p50 (ms)", *(summary["exec_p50_ms"][b] for b in BACKENDS)),
        ("`true` exec p99 (ms)", *(summary["exec_p99_ms"][b] for b in BACKENDS)),
        (f"exec p50 with {conc['sandboxes']} sandboxes busy (ms)", conc["p50_ms"], None, None),
        (f"exec p99 with {conc['sandboxes']} sandboxes busy (ms)", conc["p99_ms"], None, None),
        (f"commands/s with {conc['sandboxes']} sandboxes busy", conc["commands_per_s"], None, None),
        ("create → first exec p50 (ms)", summary["create_p50_ms"], None, None),
        ("create → first exec p99 (ms)", summary["create_p99_ms"], None, None),
    ]
    lines = [
        "## Orchard Env",
        "",
        f"Produced by `experiments/env_bench/run.py` on {meta['timestamp']} "
        f"({meta['cpu_count']} CPUs, Python {meta['python']}, {meta['platform']}, "
        f"1-minute load average {meta['load_avg_1m_at_end']} at the end of the run), "
        f"with swe-rex {meta['swerex_version']}. All three columns were measured in the same run on the same "
        "machine; see the docstring of `benchmarks/env.py` for what each number measures.",
        "",
        markdown_table(["", *BACKENDS], rows, [None, "right", "right", "right"]),
        "",
        f"orchard / swerex exec p50: **{summary['exec_p50_ratio_orchard_over_swerex']:.2f}x**.",
        "",
        f"Exec latency: {cfg['iterations']} timed calls after {cfg['warmup']} warm-up calls per column; orchard and "
        f"swerex side by side in {cfg['rounds']} rounds of alternating order. "
        f"Concurrency: {conc['sandboxes']} sandboxes x {conc['commands_per_sandbox']} calls each. "
        f"Creation: {cfg['creates']} sandboxes, one at a time. "
        "Orchard runs each command in its own Linux-namespace sandbox behind an orchestrator; "
        "swerex and subprocess run it directly on the host.",
        "",
        "Reproduce (as root, since orchard sandboxes use namespaces):",
        "",
        "```sh",
        meta["command"] or "python experiments/env_bench/run.py --markdown docs/benchmarks.md",
        "```",
        "",
    ]
    return "\n".join(lines)
