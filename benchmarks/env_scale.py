"""Orchard Env at scale on one machine: the stress run, the soak run, fork and warm-pool latency.

* :func:`stress` creates ``n`` sandboxes at once, measures what they cost in memory while all are
  alive (the unique set size, USS, of every process in each sandbox's cgroup, and the host's
  ``MemAvailable`` drop), runs ``commands`` execs in each, all at once, and deletes them. A sandbox
  succeeds when it was created and every one of its commands printed what it should.
* :func:`fork_and_claim` times ``sb.fork(1)`` and ``sb.fork(8)`` on a sandbox holding a small
  repository, and claims from a warm pool against plain creates.
* :func:`soak` churns create, exec and delete for some minutes and counts, before and after, the
  host's processes, the mounts and files under the server's state directory, the sandbox cgroups
  and the orchestrator's memory. Anything left over is a leak. As root, every other sandbox has a
  disk quota, whose tmpfs is a mount on the host.

All of them drive a real orchestrator (:func:`orchard.env.local_server`) through the async SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tqdm import tqdm

from benchmarks.env import latency_stats
from orchard.env.backends.local import LocalBackend
from orchard.env.client import AsyncSandbox
from orchard.env.local import LocalServer
from orchard.results import markdown_table


def _mem_available() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def sandbox_uss(state_dir: str, sandbox_ids: list[str]) -> list[int]:
    """Unique memory (bytes) of each sandbox: the USS of every process in its cgroup, summed."""
    import psutil

    cgroups = LocalBackend(state_dir).cgroups
    sizes = []
    for sandbox_id in sandbox_ids:
        total = 0
        for pid in cgroups.pids(sandbox_id):
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_full_info().uss
        sizes.append(total)
    return sizes


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await call()
    return time.perf_counter() - started, result


def _bar(total: int, desc: str, progress: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="sandbox", disable=not progress, leave=False, file=sys.stderr)


async def stress(server: LocalServer, n: int, commands: int = 4, progress: bool = True) -> dict[str, Any]:
    """``n`` concurrent sandboxes, ``commands`` execs each; see the module docstring."""
    available_before = _mem_available()
    creates: list[float] = []
    execs: list[float] = []
    errors: list[str] = []
    sandboxes: list[AsyncSandbox] = []
    started = time.perf_counter()
    async with server.async_client(max_retries=0) as client:
        try:
            with _bar(n, "create", progress) as bar:
                async def create() -> None:
                    try:
                        seconds, sandbox = await _timed(lambda: client.create(ttl=600, heartbeat=False))
                    except Exception as error:
                        errors.append(f"create: {error}")
                    else:
                        creates.append(seconds)
                        sandboxes.append(sandbox)
                    bar.update()

                await asyncio.gather(*(create() for _ in range(n)))
            alive_seconds = time.perf_counter() - started
            uss = sandbox_uss(server.state_dir, [s.id for s in sandboxes])
            available_alive = _mem_available()

            ok = 0
            exec_started = time.perf_counter()
            with _bar(len(sandboxes), "exec", progress) as bar:
                async def work(sandbox: AsyncSandbox) -> None:
                    nonlocal ok
                    good = True
                    for index in range(commands):
                        try:
                            seconds, result = await _timed(lambda i=index: sandbox.exec(f"echo {sandbox.id}-{i}"))
                        except Exception as error:
                            errors.append(f"exec: {error}")
                            good = False
                            continue
                        execs.append(seconds)
                        good &= result.stdout == f"{sandbox.id}-{index}\n"
                    ok += good
                    bar.update()

                await asyncio.gather(*(work(s) for s in sandboxes))
            exec_seconds = time.perf_counter() - exec_started
        finally:
            delete_started = time.perf_counter()
            with _bar(len(sandboxes), "delete", progress) as bar:
                async def delete(sandbox: AsyncSandbox) -> None:
                    with contextlib.suppress(Exception):
                        await sandbox.delete()
                    bar.update()

                await asyncio.gather(*(delete(s) for s in sandboxes))
    return {
        "sandboxes": n,
        "commands_per_sandbox": commands,
        "success_rate": ok / n,
        "end_to_end_s": time.perf_counter() - started,
        "all_alive_after_s": alive_seconds,
        "exec_phase_s": exec_seconds,
        "delete_phase_s": time.perf_counter() - delete_started,
        "create_ms": latency_stats(creates) if creates else None,
        "exec_ms": latency_stats(execs) if execs else None,
        "uss_per_sandbox_mib": sum(uss) / max(len(uss), 1) / 2**20,
        "host_memory_per_sandbox_mib": (available_before - available_alive) / max(len(sandboxes), 1) / 2**20,
        "errors": errors[:10],
        "error_count": len(errors),
    }


async def fork_and_claim(server: LocalServer, rounds: int = 10, pool_size: int = 4) -> dict[str, Any]:
    """Latency of fork(1), fork(8), a warm-pool claim and a cold create (milliseconds)."""
    fork_one, fork_eight, claims, cold = [], [], [], []
    async with server.async_client() as client:
        async with client.create() as source:
            (await source.exec("mkdir -p repo && cd repo && for i in $(seq 200); do echo $i > f$i.py; done")).check()
            for _ in range(rounds):
                seconds, forks = await _timed(lambda: source.fork(1))
                fork_one.append(seconds)
                await asyncio.gather(*(f.delete() for f in forks))
            seconds, forks = await _timed(lambda: source.fork(8))
            fork_eight.append(seconds)
            await asyncio.gather(*(f.delete() for f in forks))

        spec = {"memory": "448Mi"}
        await client.set_pool(pool_size, **spec)
        try:
            for _ in range(rounds):
                while not [p for p in await client.pools() if p.ready == pool_size]:
                    await asyncio.sleep(0.05)  # claim from a full pool, as a steady state would
                seconds, sandbox = await _timed(lambda: client.create(**spec))
                claims.append(seconds)
                await sandbox.delete()
                seconds, sandbox = await _timed(lambda: client.create(memory="464Mi"))
                cold.append(seconds)
                await sandbox.delete()
        finally:
            await client.set_pool(0, **spec)
    return {"fork_1_ms": latency_stats(fork_one), "fork_8_ms": latency_stats(fork_eight),
            "pool_claim_ms": latency_stats(claims), "cold_create_ms": latency_stats(cold)}


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def leak_census(server: LocalServer) -> dict[str, int]:
    """What the host holds that sandboxes could leak."""
    import psutil

    # Only this server's mounts: other servers on the host (a parallel test worker) mount and unmount too.
    state_dir = os.path.realpath(server.state_dir)
    with open("/proc/self/mountinfo") as handle:
        mounts = sum(1 for line in handle if _under(line.split()[4], state_dir))
    files = sum(len(names) + len(dirs) for _, dirs, names in os.walk(server.state_dir))
    cgroups = LocalBackend(server.state_dir).cgroups
    orchestrator = psutil.Process(server.process.pid)
    # The orchestrator's descendants and whatever is in a sandbox cgroup: the processes it can leak
    # (sandboxes run in their own sessions, so a leaked one may no longer descend from it).
    processes = {p.pid for p in orchestrator.children(recursive=True)}
    processes |= {pid for sandbox_id in cgroups.list() for pid in cgroups.pids(sandbox_id)}
    return {"processes": len(processes), "mounts": mounts, "state_files": files,
            "sandbox_cgroups": len(cgroups.list()), "orchestrator_rss_kib": orchestrator.memory_info().rss // 1024}


async def soak(server: LocalServer, minutes: float, concurrency: int = 4, progress: bool = True) -> dict[str, Any]:
    """Create/exec/delete churn for ``minutes``; the census before and after, and the differences."""
    async with server.async_client() as client:
        async with client.create() as warm:  # the orchestrator's caches and pools are warm before counting
            await warm.exec("true")
        before = leak_census(server)
        deadline = time.monotonic() + minutes * 60
        cycles, failures = 0, 0
        quota = os.geteuid() == 0

        async def churn(bar: tqdm) -> None:
            nonlocal cycles, failures
            while time.monotonic() < deadline:
                # Every other sandbox has a disk quota when the backend can enforce one: its tmpfs is a host mount.
                spec = {"disk": "16Mi"} if quota and cycles % 2 else {}
                try:
                    async with client.create(**spec) as sandbox:
                        (await sandbox.exec("echo churn > f && cat f && ls /")).check()
                        await sandbox.write_file("data.bin", os.urandom(4096))
                        await sandbox.exec("sleep 0.05 &")
                except Exception:
                    failures += 1
                cycles += 1
                bar.update()

        with tqdm(desc="soak", unit="cycle", disable=not progress, leave=False, file=sys.stderr) as bar:
            await asyncio.gather(*(churn(bar) for _ in range(concurrency)))
    await asyncio.sleep(1.0)  # let the last deletions finish their cleanup
    after = leak_census(server)
    return {"minutes": minutes, "cycles": cycles, "failures": failures, "before": before, "after": after,
            "leaked": {key: after[key] - before[key] for key in before}}


def render_stress(summary: dict[str, Any]) -> str:
    stress_result, latency = summary["stress"], summary["fork_and_claim"]
    rows = [
        ("sandboxes at once", f"{stress_result['sandboxes']:,}"),
        ("success rate", f"{stress_result['success_rate']:.1%}"),
        ("end to end", f"{stress_result['end_to_end_s']:.1f} s"),
        ("all alive after", f"{stress_result['all_alive_after_s']:.1f} s"),
        ("then every exec, then every delete", f"{stress_result['exec_phase_s']:.1f} s, "
                                               f"{stress_result['delete_phase_s']:.1f} s"),
        ("create p50 / p99", "{p50_ms:,.0f} / {p99_ms:,.0f} ms".format(**stress_result["create_ms"])),
        ("exec p50 / p99", "{p50_ms:,.1f} / {p99_ms:,.1f} ms".format(**stress_result["exec_ms"])),
        ("unique memory (USS) per sandbox", f"{stress_result['uss_per_sandbox_mib']:.1f} MiB"),
        ("host memory per sandbox", f"{stress_result['host_memory_per_sandbox_mib']:.1f} MiB"),
        ("errors", f"{stress_result['error_count']:,}" + (f" (first: `{stress_result['errors'][0][:120]}`)"
                                                          if stress_result["errors"] else "")),
    ] + [(name.replace("_ms", "").replace("_", " ") + " p50 / p99", "{p50_ms:,.1f} / {p99_ms:,.1f} ms".format(**v))
         for name, v in latency.items()]
    return (f"## Orchard Env at scale: stress, fork and warm pools\n\n`{summary['command']}` on "
            f"{summary['machine']}.\n\n{markdown_table(['measure', 'value'], rows)}\n")


def render_soak(summary: dict[str, Any]) -> str:
    soak_result = summary["soak"]
    table = markdown_table(["resource", "before", "after", "change"],
                           [(key, f"{soak_result['before'][key]:,}", f"{soak_result['after'][key]:,}", f"{value:+,}")
                            for key, value in soak_result["leaked"].items()])
    return (f"## Orchard Env soak\n\n`{summary['command']}` on {summary['machine']}: {soak_result['cycles']:,} "
            f"create/exec/delete cycles in {soak_result['minutes']:g} min, {soak_result['failures']} failed.\n\n"
            f"{table}\n")
