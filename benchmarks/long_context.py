"""One training step at long context: blockwise attention and a chunked LM head against today's dense path.

Both sides are the same tiny :class:`~orchard.models.Transformer` (the ``tiny`` preset, 2 layers of width
64, 4 query and 2 KV heads, with a ``vocab``-token vocabulary so that the LM head matters; float32, one
device, the same seed), and compute the same thing: the gradient of
:func:`orchard.train.state.token_losses` (the masked next-token loss of the SFT and GRPO steps) for one
packed row of ``tokens`` tokens in ``segments`` equal segments. They differ only by the
:class:`~orchard.models.config.ModelConfig` settings of how a pass is computed:

* ``blockwise`` (the new path): ``attention_block`` tokens per block of flash attention
  (:func:`~orchard.models.transformer.attend_blockwise`: no ``[T, T]`` mask or scores) and the LM head
  projected ``logits_chunk`` positions at a time (:func:`~orchard.train.state.chunked_target_logprobs`:
  no ``[T, vocab]`` logits); ``remat`` as configured (``none`` by default).
* ``dense`` (the peer, today's path, ``attention_block=0, logits_chunk=0``): the ``[B, T, T]`` packed
  mask, attention in up to 8 query blocks each against all keys before its end
  (:func:`~orchard.models.transformer.attend_causal`), and the full ``[T, vocab]`` logits.

For each side and length the step is compiled ahead of time; ``temp_gib`` is XLA's own
``memory_analysis()`` of the compiled step (its temporary buffers: the activations kept for the
backward pass and the scratch of both passes), ``peak_gib`` that plus its arguments and outputs. A
compiled step whose peak would exceed ``memory_budget_gib`` (default: half the memory available when
the run starts) is not run, and the table says so. Otherwise it is called once untimed and then
``repeats`` times, the best kept (``step_s``); with ``isolate`` each measurement runs in a fresh
process and ``rss_gib`` is that process's peak resident memory (JAX and the model included), else the
benchmark process's peak so far.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import multiprocessing
import os
import platform
import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

from orchard.results import markdown_table

GIB = 2**30


@dataclass(frozen=True)
class LongContextBenchConfig:
    tokens: tuple[int, ...] = (8192, 32768)
    vocab: int = 49152
    segments: int = 4
    attention_block: int = 512
    logits_chunk: int = 1024
    remat: str = "none"
    repeats: int = 1
    memory_budget_gib: float = 0.0  # 0: half of MemAvailable at the start
    isolate: bool = True
    seed: int = 0


SIDES = ("blockwise", "dense")


def available_gib() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    return 8.0


def measure(cfg: LongContextBenchConfig, side: str, tokens: int, budget_gib: float) -> dict[str, Any]:
    """Compile one side's training step at ``tokens`` tokens; run it unless it would not fit the budget."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from orchard.models.config import ModelConfig
    from orchard.models.transformer import Transformer
    from orchard.train.state import token_losses

    compute = ({"attention_block": cfg.attention_block, "logits_chunk": cfg.logits_chunk, "remat": cfg.remat}
               if side == "blockwise" else {"attention_block": 0, "logits_chunk": 0, "remat": "none"})
    model_cfg = ModelConfig.tiny(cfg.vocab, dtype="float32", **compute)
    graphdef, params = nnx.split(Transformer(model_cfg, rngs=nnx.Rngs(cfg.seed)), nnx.Param)
    rng = np.random.default_rng(cfg.seed)
    segment_ids = np.repeat(np.arange(1, cfg.segments + 1), -(-tokens // cfg.segments))[:tokens][None]
    starts = np.searchsorted(segment_ids[0], segment_ids[0])  # each token's segment start
    batch = {"tokens": rng.integers(0, cfg.vocab, (1, tokens)), "targets": rng.integers(0, cfg.vocab, (1, tokens)),
             "positions": (np.arange(tokens) - starts)[None], "segment_ids": segment_ids,
             "loss_mask": np.ones((1, tokens), bool)}
    batch = {key: jnp.asarray(value) for key, value in batch.items()}
    step = jax.jit(jax.value_and_grad(lambda p, b: token_losses(graphdef, p, b), has_aux=True))
    started = time.perf_counter()
    compiled = step.lower(params, batch).compile()
    memory = compiled.memory_analysis()
    temp = memory.temp_size_in_bytes / GIB
    peak = (memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes) / GIB
    result: dict[str, Any] = {"side": side, "tokens": tokens, "compile_s": round(time.perf_counter() - started, 2),
                              "temp_gib": round(temp, 3), "peak_gib": round(peak, 3), "ran": peak <= budget_gib,
                              "step_s": None, "tokens_per_s": None, "loss": None, "rss_gib": None}
    if result["ran"]:
        (loss, count), _ = jax.block_until_ready(compiled(params, batch))
        best = float("inf")
        for _ in range(cfg.repeats):
            start = time.perf_counter()
            jax.block_until_ready(compiled(params, batch))
            best = min(best, time.perf_counter() - start)
        result.update(step_s=round(best, 3), tokens_per_s=round(tokens / best, 1), loss=float(loss / count))
    result["rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 3)
    return result


def _measure_isolated(cfg: LongContextBenchConfig, side: str, tokens: int, budget: float) -> dict[str, Any]:
    if not cfg.isolate:
        return measure(cfg, side, tokens, budget)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, cfg, side, tokens, budget).result()


def run_benchmark(cfg: LongContextBenchConfig, command: str | None = None) -> dict[str, Any]:
    import jax

    budget = cfg.memory_budget_gib or round(available_gib() / 2, 2)
    rows = []
    for tokens in cfg.tokens:
        sides = {side: _measure_isolated(cfg, side, tokens, budget) for side in SIDES}
        new, old = sides["blockwise"], sides["dense"]
        both = new["ran"] and old["ran"]
        rows.append({
            "tokens": tokens, **sides,
            "temp_ratio": round(old["temp_gib"] / max(new["temp_gib"], 1e-9), 1),
            "speedup": round(old["step_s"] / new["step_s"], 2) if both else None,
            "loss_diff": abs(new["loss"] - old["loss"]) if both else None,
        })
    return {
        "results": rows,
        "metadata": {"timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "jax": jax.__version__,
                     "backend": jax.default_backend(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "memory_budget_gib": budget, "command": command, "config": asdict(cfg)},
    }


def _cell(side: dict[str, Any], key: str, unit: str = "") -> str:
    if not side["ran"]:
        return f"not run (needs {side['peak_gib']:.1f} GiB)"
    return f"{side[key]:.2f}{unit}"


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary["metadata"]
    cfg = meta["config"]
    lines = [
        "## Long-context training step",
        "",
        f"Produced by `experiments/long_context_bench/run.py` on {meta['timestamp']} ({meta['cpu_count']} CPUs, "
        f"{meta['platform']}, JAX {meta['jax']} on {meta['backend']}): the gradient of the SFT loss "
        f"(`token_losses`) of the `tiny` preset (2 layers, width 64, 4/2 heads) with a {cfg['vocab']}-token "
        f"vocabulary, float32, for one packed row of {cfg['segments']} segments. *blockwise*: flash attention in "
        f"blocks of {cfg['attention_block']} and the LM head {cfg['logits_chunk']} positions at a time (remat "
        f"`{cfg['remat']}`); the peer *dense* is the path before (the `[T, T]` packed mask, query-block "
        "attention, full `[T, vocab]` logits). *temp* and *peak* are XLA's `memory_analysis()` of the compiled "
        "step (temporaries; plus arguments and outputs); *RSS* the peak resident memory of the process that "
        f"ran it. A step whose peak exceeds the budget ({meta['memory_budget_gib']:.1f} GiB, half the memory "
        f"available) is compiled but not run. Times: best of {cfg['repeats']} after one untimed call. "
        "See `benchmarks/long_context.py`.",
        "",
    ]
    columns = ["tokens", "blockwise temp GiB", "dense temp GiB", "temp ratio", "blockwise RSS GiB", "dense RSS GiB",
               "blockwise step s", "dense step s", "speedup", "loss diff"]
    rows = []
    for row in summary["results"]:
        new, old = row["blockwise"], row["dense"]
        speedup = f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-"
        diff = f"{row['loss_diff']:.1e}" if row["loss_diff"] is not None else "-"
        rows.append([row["tokens"], f"{new['temp_gib']:.2f}", f"{old['temp_gib']:.2f}", f"{row['temp_ratio']:.1f}x",
                     _cell(new, "rss_gib"), _cell(old, "rss_gib"), _cell(new, "step_s"), _cell(old, "step_s"),
                     speedup, diff])
    lines += [markdown_table(columns, rows, "right"), "", f"Reproduce: `{meta['command']}`"]
    return "\n".join(lines)
