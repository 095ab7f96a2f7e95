"""The GUI environment benchmark: Orchard's browser sandbox against BrowserGym's MiniWoB environment
and the ``miniwob`` package's own Selenium environment, on the same page (``click-test``), in one run.

Measured for each system (peers by ``benchmarks/gui_peers.py``, in their own processes):

* ``reset_ms`` p50/p99: a new episode ready (page loaded, seeded, instruction read). For Orchard, in
  a sandbox whose browser is up (a fresh context per episode), and ``cold_reset_ms``: a new sandbox,
  Chromium started in it, then the episode (the paper's sandbox per episode);
* ``step_ms`` p50/p99: a click at the button's centre and the observation the agent then gets
  (Orchard: the tool's answer, a screenshot into the image store and the tab summary);
* ``screenshot_ms`` p50/p99: one screenshot alone;
* ``episodes_per_minute`` at concurrency 1, 2 and 4 (reset and one click; Orchard through the
  episode runner with a sandbox pool and the oracle policy);
* ``memory_mb_per_browser``: resident memory of one browser's process tree (Orchard: Chromium in the
  sandbox; in driver mode also the driver and Playwright's node process).

Orchard is measured in both browser modes (:mod:`orchard.harness.chromium`): Playwright on the host
over the port forward (``host``) and a driver inside the sandbox (``driver``).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

import psutil
from tqdm.auto import tqdm

from benchmarks.env import percentile
from orchard.data.trajectory import ToolCall
from orchard.env.local import local_server
from orchard.harness.browser import BrowserHarness
from orchard.harness.chromium import BrowserSettings, SandboxBrowser, browser_of
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.results import markdown_table
from orchard.tasks.gui.miniwob import FAMILY, VIEWPORT, MiniWoBTask, build_instances, open_episode
from orchard.tasks.gui.oracle import GUIOracle

PAGE = "click-test"
BUTTON_CENTRE = """() => { const r = document.getElementById('subbtn').getBoundingClientRect();
  return {x: r.left + r.width / 2, y: r.top + r.height / 2}; }"""


def quantiles(samples: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 50), 2), "p99": round(percentile(samples, 99), 2), "n": len(samples)}


def browser_tree_mb(browser: SandboxBrowser) -> dict[str, float]:
    """RSS and PSS (MB) of one sandbox's browser process tree, found on this host (sandboxed processes
    are host processes) by the switch that names its sandbox (in driver mode, the driver's tree)."""
    def tagged(process: psutil.Process) -> bool:
        return any(browser.tag in part for part in process.info["cmdline"] or [])

    matches = [p for p in psutil.process_iter(["cmdline"]) if tagged(p)]
    roots = [p for p in matches if not any(p.pid in {c.pid for c in q.children(recursive=True)} for q in matches)]
    tree = {p.pid: p for root in roots for p in [root, *root.children(recursive=True)]}
    rss = pss = 0
    for process in tree.values():
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
    return {"rss": round(rss / 2**20, 1), "pss": round(pss / 2**20, 1), "processes": len(tree)}


async def measure_orchard(client, mode: str, n: int, seconds: float, concurrency: tuple[int, ...],
                          progress: bool) -> dict[str, Any]:
    settings = BrowserSettings(viewport=VIEWPORT, mode=mode)
    harness = BrowserHarness()
    result: dict[str, Any] = {"system": f"orchard-{mode}"}
    cold, resets, steps, shots = [], [], [], []
    bar = tqdm(total=3 * n + min(n, 5), desc=f"orchard {mode}", disable=not progress)
    for _ in range(min(n, 5)):  # cold: a sandbox and a browser per episode
        clock = time.perf_counter()
        box = await client.create(**FAMILY.sandbox)
        await open_episode(box, PAGE, 0, settings)
        cold.append((time.perf_counter() - clock) * 1000)
        await browser_of(box).close()
        await box.delete()
        bar.update()
    box = await client.create(**FAMILY.sandbox)
    try:
        browser = await SandboxBrowser.start(box, settings)
        for seed in range(n):
            clock = time.perf_counter()
            await open_episode(box, PAGE, seed, settings)
            resets.append((time.perf_counter() - clock) * 1000)
            bar.update()
        for seed in range(n):
            await open_episode(box, PAGE, seed, settings)
            centre = await browser.call("evaluate", script=BUTTON_CENTRE)
            call = ToolCall(id="c", name="click", arguments=centre)
            clock = time.perf_counter()
            observation = await harness.execute(call, box)
            if not observation.then and observation.submission is None:
                raise RuntimeError("the click produced no observation")
            if observation.submission is not None:  # the page ended: the observation is the last screenshot
                await harness.page_message(box, "")
            steps.append((time.perf_counter() - clock) * 1000)
            bar.update()
        for _ in range(n):
            clock = time.perf_counter()
            await browser.call("screenshot")
            shots.append((time.perf_counter() - clock) * 1000)
            bar.update()
        result["memory_mb_per_browser"] = browser_tree_mb(browser)
        result["browser_start_s"] = round(browser.started_s, 3)
        await browser.close()
    finally:
        await box.delete()
        bar.close()
    result.update(cold_reset_ms=quantiles(cold), reset_ms=quantiles(resets), step_ms=quantiles(steps),
                  screenshot_ms=quantiles(shots))
    result["episodes_per_minute"] = {}
    for workers in concurrency:
        result["episodes_per_minute"][str(workers)] = await episodes_per_minute(client, settings, workers, seconds)
    return result


async def episodes_per_minute(client, settings: BrowserSettings, workers: int, seconds: float) -> float:
    """Oracle episodes of click-test completed in ``seconds`` by ``workers`` concurrent episodes
    (a pool of ``workers`` sandboxes, each with its browser, warmed first)."""
    builder = await client.create(**FAMILY.sandbox)
    try:
        tasks = await build_instances(builder, [PAGE], range(workers * 4), settings)
    finally:
        await builder.delete()
    async with SandboxPool(size=workers) as pool:
        runner = EpisodeRunner(client, BrowserHarness(), concurrency=workers, pool=pool)
        await asyncio.gather(*(runner.run_one(task, 0, policy=GUIOracle(task)) for task in tasks[:workers]))
        done, deadline = 0, time.monotonic() + seconds
        started = time.monotonic()

        async def worker(index: int) -> None:
            nonlocal done
            while time.monotonic() < deadline:
                task: MiniWoBTask = tasks[(index + done) % len(tasks)]
                trajectory = await runner.run_one(task, done, policy=GUIOracle(task))
                if trajectory.outcome.reward != 1.0:
                    raise RuntimeError(f"a benchmark episode failed: {trajectory.metadata.get('error')}")
                done += 1

        await asyncio.gather(*(worker(i) for i in range(workers)))
        return round(done * 60 / (time.monotonic() - started), 1)


def run_peer(command: list[str]) -> dict[str, Any]:
    """A peer's JSON (``benchmarks/gui_peers.py``), or why it could not run."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"system": command[-1], "error": f"{type(exc).__name__}: {exc}"}
    system = command[command.index("--system") + 1]
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"system": system, "error": f"exit {done.returncode}, unreadable output: {done.stdout[-300:]} "
                                           f"{done.stderr[-300:]}"}
    # The peers' script keeps its own shapes: episodes per minute with their counts, memory in rss_mb/pss_mb.
    result["episodes_per_minute"] = {k: v["episodes_per_minute"] if isinstance(v, dict) else v
                                     for k, v in result.get("episodes_per_minute", {}).items()}
    memory = result.get("memory_mb_per_browser") or {}
    if "rss_mb" in memory:
        result["memory_mb_per_browser"] = {"rss": memory["rss_mb"], "pss": memory["pss_mb"],
                                           "processes": memory.get("processes")}
    return result


def run_gui_bench(n: int, seconds: float, concurrency: tuple[int, ...], peers: dict[str, str | None],
                  progress: bool, command: str) -> dict[str, Any]:
    """Orchard in both modes and the peers (``peers``: system name to the Python that runs it, or None to skip)."""
    server = local_server(reap_interval=0.5)

    async def orchard() -> list[dict[str, Any]]:
        async with server.async_client() as client:
            return [await measure_orchard(client, mode, n, seconds, concurrency, progress) for mode in ("host", "driver")]

    try:
        systems = asyncio.run(orchard())
    finally:
        server.stop()
    here = os.path.dirname(os.path.abspath(__file__))
    for system, python in peers.items():
        if python is None:
            systems.append({"system": system, "error": "not run (no interpreter given)"})
            continue
        systems.append(run_peer([python, os.path.join(here, "gui_peers.py"), "--system", system, "--n", str(n),
                                 "--seconds", str(seconds), "--concurrency", ",".join(map(str, concurrency))]))
    return {"benchmark": "gui_bench", "page": PAGE, "command": command, "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version()}, "systems": systems,
        "ratios": ratios(systems)}


def ratios(systems: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Orchard's default (host) over each peer, p50 for latencies and the rate at each concurrency."""
    base = next(s for s in systems if s["system"] == "orchard-host")
    out: dict[str, dict[str, float]] = {}
    for peer in systems:
        if peer is base or "error" in peer:
            continue
        row = {f"{metric}_p50": round(base[metric]["p50"] / peer[metric]["p50"], 2)
               for metric in ("reset_ms", "step_ms", "screenshot_ms") if metric in peer}
        if "step_ms_nonterminal" in peer:  # a step whose observation is full (a terminal one may be empty)
            row["step_ms_vs_full_observation_p50"] = round(base["step_ms"]["p50"] / peer["step_ms_nonterminal"]["p50"], 2)
        for workers, rate in base["episodes_per_minute"].items():
            if workers in peer.get("episodes_per_minute", {}) and peer["episodes_per_minute"][workers]:
                row[f"episodes_per_minute_{workers}"] = round(rate / peer["episodes_per_minute"][workers], 2)
        out[peer["system"]] = row
    return out


def render_gui_bench(summary: dict[str, Any]) -> str:
    lines = ["## GUI environment (`experiments/gui_bench/run.py`)", "",
             f"Page `{summary['page']}`; command: `{summary['command']}`; {summary['machine']['cpus']} CPUs. "
             "Latencies in ms (p50 / p99); episodes per minute at concurrency 1, 2, 4; memory of one browser's "
             "process tree (RSS / PSS, MB).", ""]
    columns = ["system", "reset", "cold reset", "step (click + observation)", "step, full observation", "screenshot",
               "episodes/min", "memory"]
    rows: list[list[str]] = []
    for s in summary["systems"]:
        if "error" in s:
            rows.append([s["system"], f"could not run: {s['error']}", *[""] * (len(columns) - 2)])
            continue

        def q(key: str, s: dict[str, Any] = s) -> str:
            return f"{s[key]['p50']:g} / {s[key]['p99']:g}" if key in s else "-"

        rates = " / ".join(f"{v:g}" for v in s.get("episodes_per_minute", {}).values())
        memory = s.get("memory_mb_per_browser", {})
        full = q("step_ms_nonterminal") if "step_ms_nonterminal" in s else q("step_ms")
        rows.append([s["system"], q("reset_ms"), q("cold_reset_ms"), q("step_ms"), full, q("screenshot_ms"), rates,
                     f"{memory.get('rss', '-')} / {memory.get('pss', '-')}"])
    lines += [markdown_table(columns, rows), "", "Orchard (host mode) over each peer (below 1 is faster for latencies; above 1 is more episodes):", ""]
    for peer, row in summary["ratios"].items():
        lines.append(f"- **{peer}**: " + ", ".join(f"{k} {v:g}" for k, v in row.items()))
    for s in summary["systems"]:
        if "notes" in s or "knobs" in s:
            lines.append(f"- {s['system']}: {json.dumps(s.get('knobs', s.get('notes')))}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit("run experiments/gui_bench/run.py")
