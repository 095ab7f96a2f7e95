"""Training tokens per second of a from-scratch SWE policy at each size, on this machine: what the
default policy's size is chosen from (the SFT and RL budgets of ``make run`` are counted in tokens).

Each shape is Orchard's SFT train step (:mod:`benchmarks.sft`, its Orchard side) over the trained BPE's
vocabulary and the recipe's row length; the peer of each row is the ``tiny`` default's rate, as a ratio.
"""

from __future__ import annotations

import platform
from dataclasses import replace
from typing import Any

import jax
from flax import nnx

from benchmarks.sft import SftBenchConfig, build_model, run_orchard
from orchard.results import markdown_table

# (name, hidden, intermediate, layers, heads, kv heads, head dim): the tiny default first
SHAPES = (("tiny", 64, 192, 2, 4, 2, 16), ("w128-l4", 128, 384, 4, 4, 2, 32), ("w192-l4", 192, 512, 4, 6, 2, 32),
          ("w256-l4", 256, 768, 4, 8, 4, 32), ("w256-l6", 256, 768, 6, 8, 4, 32), ("w384-l6", 384, 1024, 6, 6, 2, 64))


def parameters(cfg: SftBenchConfig) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(build_model(cfg), nnx.Param)))


def run_sweep(base: SftBenchConfig, shapes: tuple = SHAPES, command: str | None = None) -> dict[str, Any]:
    rows = []
    for name, hidden, intermediate, layers, heads, kv_heads, head_dim in shapes:
        cfg = replace(base, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers, num_heads=heads,
                      num_kv_heads=kv_heads, head_dim=head_dim)
        measured = run_orchard(cfg)
        rows.append({"shape": name, "parameters": parameters(cfg), "tokens_per_s": measured["tokens_per_s"],
                     "rounds_tokens_per_s": measured["rounds_tokens_per_s"]})
    for row in rows:
        row["vs_tiny"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {"benchmark": "policy_size", "command": command, "machine": platform.machine(),
            "vocab_size": base.vocab_size, "seq_len": base.seq_len, "batch_size": base.batch_size, "rows": rows}


def render_markdown(summary: dict[str, Any]) -> str:
    rows = [[r["shape"], f"{r['parameters'] / 1e6:.2f}M", f"{r['tokens_per_s']:,.0f}", f"{r['vs_tiny']:.2f}x"]
            for r in summary["rows"]]
    return (f"SFT train-step tokens/s of a from-scratch policy by size (vocabulary {summary['vocab_size']}, rows of "
            f"{summary['seq_len']} tokens, batch {summary['batch_size']}, {summary['machine']}; "
            f"`{summary['command']}`):\n\n" + markdown_table(["shape", "parameters", "tokens/s", "vs tiny"], rows))
