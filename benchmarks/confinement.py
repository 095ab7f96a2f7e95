"""What the seccomp filter and no_new_privs cost a local sandbox: create-to-first-exec and exec, side by side.

Two orchestrators run at once on this machine, the same code: one confines its sandboxes (the
default), one is started with ``--no-seccomp``. In each of ``rounds`` rounds, each orchestrator
creates ``creates`` sandboxes one after another and times ``client.create()`` until the first
``exec("true")`` returns (:func:`benchmarks.env.bench_orchard_create`), then ``iterations`` exec
calls in one sandbox; the order of the two alternates between rounds so that neither always runs
on a warmer machine. The ratio is confined over unconfined.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from benchmarks.env import BenchConfig, bench_orchard_create, bench_orchard_exec, latency_stats, run_metadata
from orchard.env.local import local_server
from orchard.results import markdown_table

VARIANTS = {"confined": (), "unconfined": ("--no-seccomp",)}


async def _round(servers: dict[str, Any], order: list[str], cfg: BenchConfig,
                 samples: dict[str, dict[str, list[float]]]) -> None:
    for name in order:
        async with servers[name].async_client() as client:
            samples[name]["create"] += await bench_orchard_create(client, cfg)
            samples[name]["exec"] += await bench_orchard_exec(client, cfg)


def run_confinement(cfg: BenchConfig, rounds: int = 4, command: str | None = None) -> dict[str, Any]:
    """The summary: per variant, create-to-first-exec and exec latency; the confined/unconfined ratios."""
    samples = {name: {"create": [], "exec": []} for name in VARIANTS}
    per_round = replace(cfg, creates=max(1, cfg.creates // rounds), iterations=max(1, cfg.iterations // rounds))
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(local_server(extra_args=args)) for name, args in VARIANTS.items()}
        for number in range(rounds):
            order = list(VARIANTS) if number % 2 == 0 else list(reversed(VARIANTS))
            asyncio.run(_round(servers, order, per_round, samples))
    stats = {name: {kind: {**latency_stats(values), "n": len(values)} for kind, values in kinds.items()}
             for name, kinds in samples.items()}
    ratio = {kind: stats["confined"][kind]["p50_ms"] / stats["unconfined"][kind]["p50_ms"] for kind in ("create", "exec")}
    return {"metadata": {**run_metadata(cfg, command), "rounds": rounds}, "latency": stats, "ratio_p50": ratio}


def render_confinement(summary: dict[str, Any]) -> str:
    stats, ratio = summary["latency"], summary["ratio_p50"]
    rows = [(label, f"{stats['confined'][kind]['p50_ms']:.1f} / {stats['confined'][kind]['p99_ms']:.1f}",
             f"{stats['unconfined'][kind]['p50_ms']:.1f} / {stats['unconfined'][kind]['p99_ms']:.1f}",
             f"{ratio[kind]:.2f}")
            for kind, label in (("create", "create to first exec"), ("exec", "exec `true`"))]
    meta = summary["metadata"]
    return "\n".join([
        "### Confinement: no_new_privs and the seccomp filter",
        "",
        f"Measured {meta['timestamp'][:10]} on {meta['cpu_count']} cores: `{meta['command']}`. Two "
        "orchestrators of the same code side by side, one started with `--no-seccomp`, alternating over "
        f"{meta['rounds']} rounds (`benchmarks/confinement.py`). Milliseconds, p50 / p99.",
        "",
        markdown_table(["", "confined (default)", "`--no-seccomp`", "ratio (p50)"], rows,
                       [None, "right", "right", "right"]),
    ])
