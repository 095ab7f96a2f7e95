"""A main job over several seeds: each seed's run in its own workdir (``<workdir>/seed_<n>``, every stage its
own: tasks, split, teacher, SFT, RL and evaluations all follow ``config.seed``), then what they say together.

For every held-out set, harness, stage and pass: the headline measure per seed and its spread (mean [min, max]).
For every pass and pair of consecutive stages (and first to last): each seed's paired per-task change and the
**pooled sign test**, over the (seed, task) pairs of all seeds together: ``tasks_up`` and ``tasks_down`` summed
over seeds, then the one-sided sign test of the sums. The pairs are independent across seeds (each seed draws
its own tasks and trains its own policies), so pooling them is the test of "the stage raised the rate" that a
single seed's handful of changed tasks cannot give.

Greedy changes are paired from the evaluation folders' episodes as the sampled ones are
(:func:`~orchard.recipes.stages.sampled_change` reads any two folders), so the changes here cover both passes,
where a main job's ``summary.json`` pairs only its sampled ones.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from ml_collections import ConfigDict
from rich.table import Table

from orchard.eval.metrics import seed_spread, sign_test
from orchard.recipes.ablation_report import spread_text
from orchard.recipes.family import Family
from orchard.recipes.report import MEASURE_LABELS, STAGE_LABELS
from orchard.recipes.runner import RecipeResult, eval_directory, run, stage_pairs
from orchard.recipes.stages import STAGES, sampled_change
from orchard.workdir import write_json


def seed_workdir(workdir: str, seed: int) -> str:
    """Where one seed's run lives."""
    return os.path.join(workdir, f"seed_{seed}")


def with_seed(config: ConfigDict, seed: int) -> ConfigDict:
    """A copy of ``config`` whose runs draw from ``seed``."""
    copy = ConfigDict(config.to_dict())
    copy.seed = seed
    return copy


def run_seeds(family: Family, config: ConfigDict, workdir: str, seeds: Sequence[int], *,
              rerun: bool = False) -> dict[str, Any]:
    """The family's main job at each of ``seeds``, one after the other (a seed already run is reused, as a
    main job reuses its finished stages), then :func:`seeds_summary`, also written to ``seeds.json``."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"a seeds study needs distinct seeds, got {list(seeds)}")
    for seed in seeds:
        run(family, with_seed(config, seed), seed_workdir(workdir, seed), rerun=rerun)  # writes its summary.json
    return summarise_seeds(family, workdir, seeds)


def summarise_seeds(family: Family, workdir: str, seeds: Sequence[int]) -> dict[str, Any]:
    """:func:`seeds_summary` of seeds already run (each ``<workdir>/seed_<n>`` with its ``summary.json``), read
    from their files with nothing run again, whatever code or config made them; also written to ``seeds.json``."""
    missing = [seed for seed in seeds if not os.path.exists(os.path.join(seed_workdir(workdir, seed), "summary.json"))]
    if missing:
        raise FileNotFoundError(f"seeds {missing} have no finished run in {workdir} (seed_<n>/summary.json)")
    results = {seed: RecipeResult.load(seed_workdir(workdir, seed)) for seed in seeds}
    summary = seeds_summary(results, {seed: seed_workdir(workdir, seed) for seed in seeds}, family.measures[0])
    write_json(os.path.join(workdir, "seeds.json"), summary)
    return summary


def seeds_summary(results: dict[int, RecipeResult], workdirs: dict[int, str],
                  measure: str = "resolve_rate") -> dict[str, Any]:
    """``rates``: set -> harness -> stage -> pass -> ``{"seeds": {seed: value}, "spread": ...}`` of ``measure``;
    ``changes``: set -> harness -> pass -> ``"<after>_vs_<before>"`` -> ``{"seeds": {seed: change},
    "pooled": change}``, for the stage pairs every seed evaluated in that pass. Seeds are keys as strings."""
    rates: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    for seed, result in results.items():
        for held_out, harnesses in result.held_out.items():
            for harness, stages in harnesses.items():
                for stage, passes in stages.items():
                    for pass_, metrics in passes.items():
                        if metrics.get(measure) is not None:
                            entry = rates.setdefault(held_out, {}).setdefault(harness, {}).setdefault(
                                stage, {}).setdefault(pass_, {"seeds": {}})
                            entry["seeds"][str(seed)] = metrics[measure]
    for held_out, harnesses in rates.items():
        for harness, stages in harnesses.items():
            for passes in stages.values():
                for entry in passes.values():
                    entry["spread"] = seed_spread(list(entry["seeds"].values()))
            for pass_ in dict.fromkeys(p for passes in stages.values() for p in passes):
                # a pair counts only where every seed evaluated both stages in this pass
                evaluated = [s for s in stages if len(stages[s].get(pass_, {}).get("seeds", {})) == len(results)]
                for before, after in stage_pairs(evaluated):
                    per_seed = {str(seed): sampled_change(eval_directory(workdirs[seed], held_out, harness, before, pass_),
                                                          eval_directory(workdirs[seed], held_out, harness, after, pass_))
                                for seed in results}
                    up = int(sum(c["tasks_up"] for c in per_seed.values()))
                    down = int(sum(c["tasks_down"] for c in per_seed.values()))
                    changes.setdefault(held_out, {}).setdefault(harness, {}).setdefault(pass_, {})[
                        f"{after}_vs_{before}"] = {"seeds": per_seed, "pooled": {
                            "tasks_up": float(up), "tasks_down": float(down), "sign_test_p": sign_test(up, down)}}
    return {"seeds": sorted(results), "measure": measure, "rates": rates, "changes": changes}


def seeds_table(summary: dict[str, Any], title: str = "") -> Table:
    """Each rate's mean [min, max] over seeds beside its per-seed values, then each change per seed and pooled."""
    seeds = [str(s) for s in summary["seeds"]]
    table = Table(title=title or f"held-out {MEASURE_LABELS.get(summary['measure'], summary['measure'])} over seeds "
                  + ", ".join(seeds))
    for column in ("set", "harness", "stage", "pass", "mean [min, max]", *(f"seed {s}" for s in seeds)):
        table.add_column(column, no_wrap=True)
    for held_out, harnesses in summary["rates"].items():
        for harness, stages in harnesses.items():
            for stage in [*(s for s in STAGES if s in stages), *(s for s in stages if s not in STAGES)]:
                for pass_, entry in stages[stage].items():
                    table.add_row(held_out.replace("_", " "), harness, STAGE_LABELS.get(stage, stage), pass_,
                                  spread_text(entry["spread"]), *(f"{entry['seeds'].get(s, math.nan):.3f}" for s in seeds))
            for pass_, pairs in summary["changes"].get(held_out, {}).get(harness, {}).items():
                for name, change in pairs.items():
                    pooled = change["pooled"]
                    table.add_row(held_out.replace("_", " "), harness, name.replace("_", " "), pass_,
                                  f"pooled +{pooled['tasks_up']:.0f} / -{pooled['tasks_down']:.0f}, "
                                  f"p = {pooled['sign_test_p']:.3g}",
                                  *(f"+{change['seeds'][s]['tasks_up']:.0f} / -{change['seeds'][s]['tasks_down']:.0f}"
                                    for s in seeds))
    return table


def seeds_markdown(summary: dict[str, Any], command: str) -> str:
    """The summary as a Markdown table, one row per held-out set and pass: each stage's mean [min, max] over
    the seeds, and the pooled sign test of each consecutive stage pair; ``command`` says what measured it."""
    seeds = ", ".join(str(s) for s in summary["seeds"])
    pairs = ("sft_vs_init", "rl_vs_sft")
    header = ["held-out set", "harness", "pass", *(STAGE_LABELS[s] for s in STAGES),
              *(f"{pair.replace('_', ' ')}: tasks up / down (pooled p)" for pair in pairs)]
    lines = [f"Held-out {MEASURE_LABELS.get(summary['measure'], summary['measure'])}, mean [min, max] over seeds "
             f"{seeds}, and each stage's paired per-task change pooled over the seeds (one-sided sign test).", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for held_out, harnesses in summary["rates"].items():
        for harness, stages in harnesses.items():
            for pass_ in dict.fromkeys(p for by_pass in stages.values() for p in by_pass):
                rates = [spread_text(stages[s][pass_]["spread"]) if pass_ in stages.get(s, {}) else ""
                         for s in STAGES]
                changes = summary["changes"].get(held_out, {}).get(harness, {}).get(pass_, {})
                tests = [f"+{c['tasks_up']:.0f} / -{c['tasks_down']:.0f} (p = {c['sign_test_p']:.2g})"
                         if (c := changes.get(pair, {}).get("pooled")) else "" for pair in pairs]
                lines.append(f"| {held_out.replace('_', ' ')} | {harness} | {pass_} | " + " | ".join(rates + tests)
                             + " |")
    return "\n".join([*lines, "", f"Measured by `{command}` (`seeds.json`, `orchard/recipes/seeds.py`)."])


def plot_seeds(summary: dict[str, Any], path: str) -> str:
    """One panel per pass: each held-out set's (and harness's) mean over seeds per stage, its min-max range as
    error bars; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [(held_out, harness, stages) for held_out, harnesses in summary["rates"].items()
              for harness, stages in harnesses.items()]
    passes = list(dict.fromkeys(p for *_, stages in series for by_pass in stages.values() for p in by_pass))
    figure, axes = plt.subplots(1, max(len(passes), 1), figsize=(5 * max(len(passes), 1), 4), squeeze=False)
    for axis, pass_ in zip(axes[0], passes, strict=False):
        for held_out, harness, stages in series:
            points = [(i, stages[s][pass_]["spread"]) for i, s in enumerate(STAGES) if pass_ in stages.get(s, {})]
            if points:
                x, spreads = zip(*points, strict=True)
                means = [s["mean"] for s in spreads]
                axis.errorbar(x, means, yerr=[[m - s["min"] for m, s in zip(means, spreads, strict=True)],
                                              [s["max"] - m for m, s in zip(means, spreads, strict=True)]],
                              marker="o", capsize=3, label=f"{held_out.replace('_', ' ')}, {harness}")
        axis.set_xticks(range(len(STAGES)), [STAGE_LABELS[s] for s in STAGES])
        axis.set_ylim(0, 1)
        axis.set_title(f"{pass_}: mean [min, max] over seeds {', '.join(map(str, summary['seeds']))}")
        axis.legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
