"""What the SWE ablations show a person (:mod:`orchard.recipes.swe_ablations`): markdown tables with each
measure's mean and min-max over seeds, and the plots the notebooks display."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict

from orchard.config import ConfigError, from_config
from orchard.recipes.swe import SWE
from orchard.recipes.swe_ablations import (
    STUDIES,
    AsyncStudyConfig,
    CreditConfig,
    RLStudyConfig,
    ScaleConfig,
    unresolved_arm,
)

JUDGE_DTYPES = ("float32", "bfloat16", "float16")  # what the served judge may compute in
PASS_LABELS = {"greedy": "greedy", "sampled": "sampled (avg@k)", "pass_at_k": "pass@k"}


def check_config(config: ConfigDict) -> list[str]:
    """The main job's config check, then the studies' blocks: their fields, the arms' names, the judge's
    dtype, and an RL study without a rollout budget."""
    problems = SWE.check_config(config)
    unknown = sorted(set(config.get("studies", ())) - set(STUDIES))
    if unknown:
        problems.append(f"studies: unknown {unknown}, of {sorted(STUDIES)}")
    for block, typed in (("credit", CreditConfig), ("scale", ScaleConfig), ("rl_study", RLStudyConfig),
                         ("async_study", AsyncStudyConfig)):
        try:
            settings = from_config(typed, config[block].to_dict(), block)
        except (ConfigError, KeyError) as exc:
            problems.append(f"{exc}" if isinstance(exc, ConfigError) else f"missing config block {exc}")
            continue
        if block == "credit":
            for arm in settings.arms:
                try:
                    unresolved_arm(arm)
                except ValueError as exc:
                    problems.append(f"credit.arms: {exc}")
            if settings.judge_dtype not in JUDGE_DTYPES:
                problems.append(f"credit.judge_dtype: {settings.judge_dtype!r} is not one of {', '.join(JUDGE_DTYPES)}")
    if "rl" in config.get("studies", ()) and not config.rl.get("rollout_budget"):
        problems.append("rl.rollout_budget: the RL study compares samplers at an equal budget of rollouts; set it")
    return problems


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def spread_text(spread: dict[str, float], digits: int = 3) -> str:
    """``mean [min, max]`` (one value alone when there was one seed)."""
    if spread["n"] == 1:
        return f"{spread['mean']:.{digits}f}"
    return f"{spread['mean']:.{digits}f} [{spread['min']:.{digits}f}, {spread['max']:.{digits}f}]"


def credit_table(summary: dict[str, Any]) -> str:
    """The credit-assignment arms: held-out rates, training data and eval loss (mean [min, max] over seeds), and
    each arm's paired sign test against resolved-only SFT."""
    measures = [m for m in ("greedy", "sampled", "pass_at_k") if any(m in a["spread"] for a in summary["arms"].values())]
    header = ["arm", *(PASS_LABELS[m] for m in measures), "resolved trajectories", "trained tokens", "eval loss",
              *(f"vs drop, {m}: up / down, p" for m in measures if m != "pass_at_k")]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for arm, entry in summary["arms"].items():
        spread = entry["spread"]
        row = [arm, *(spread_text(spread[m]) for m in measures), spread_text(spread["resolved"], 0),
               spread_text(spread["trained_tokens"], 0),
               spread_text(spread["eval_loss"]) if "eval_loss" in spread else "-"]
        for m in measures:
            if m == "pass_at_k":
                continue
            change = summary["paired_vs_drop"].get(arm, {}).get(m)
            row.append(f"{change['tasks_up']:.0f} / {change['tasks_down']:.0f}, {change['sign_test_p']:.2f}"
                       if change else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def scale_table(summary: dict[str, Any], measure: str = "greedy") -> str:
    """The scale-against-selection grid of one measure: selectors by rows, data fractions by columns."""
    fractions = [f"{f:g}" for f in summary["fractions"]]
    lines = ["| selector | " + " | ".join(f"{f} of the data" for f in fractions) + " |",
             "|---|" + "---|" * len(fractions)]
    for selector, cells in summary["grid"].items():
        lines.append(f"| {selector} | " + " | ".join(spread_text(cells[f]["spread"][measure]) for f in fractions) + " |")
    return "\n".join(lines)


def rl_table(summary: dict[str, Any]) -> str:
    """The samplers at an equal rollout budget (each run stops at the first step that reaches it, so it can
    overshoot by up to one step's rollouts): their rollout economy and held-out rates after RL."""
    names = ["rollouts", "informative_chosen", "informative_per_100_rollouts", "rollouts_per_update",
             "positive_fraction", "updates", "greedy", "sampled"]
    header = ["sampler", "rollouts generated", "informative share of chosen groups",
              "informative groups per 100 rollouts", "rollouts per update", "positive share", "updates",
              "greedy after RL", "sampled after RL", "sampled vs SFT: up / down, p"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for sampler, entry in summary["samplers"].items():
        change = entry["change_from_sft"]["sampled"]
        lines.append("| " + " | ".join([sampler, *(spread_text(entry["spread"][n], 2) for n in names),
                                        f"{change['tasks_up']:.0f} / {change['tasks_down']:.0f}, "
                                        f"{change['sign_test_p']:.2f}"]) + " |")
    return "\n".join(lines)


def init_table(summary: dict[str, Any]) -> str:
    """BAR from each SFT initialisation: the rates before and after RL, and the paired change."""
    lines = ["| SFT steps | greedy: SFT -> RL | sampled: SFT -> RL | sampled change: up / down, p |", "|---|---|---|---|"]
    for steps, entry in summary["init_change"].items():
        change = entry["paired"]["sampled"]
        lines.append(f"| {steps} | {entry['sft']['greedy']:.3f} -> {spread_text(entry['rl']['greedy'])} | "
                     f"{entry['sft']['sampled']:.3f} -> {spread_text(entry['rl']['sampled'])} | "
                     f"{change['tasks_up']:.0f} / {change['tasks_down']:.0f}, {change['sign_test_p']:.2f} |")
    return "\n".join(lines)


def _error_bars(spreads: list[dict[str, float]]) -> list[list[float]]:
    return [[s["mean"] - s["min"] for s in spreads], [s["max"] - s["mean"] for s in spreads]]


def plot_arms(summary: dict[str, Any], path: str) -> str:
    """The credit-assignment arms' held-out rates per pass: bars at the mean over seeds, whiskers min to max,
    each seed a dot."""
    plt = _pyplot()
    arms = list(summary["arms"])
    measures = [m for m in ("greedy", "sampled") if m in summary["arms"][arms[0]]["spread"]]
    fig, ax = plt.subplots(figsize=(1.4 * len(arms) + 2, 3.8))
    width = 0.8 / len(measures)
    for k, measure in enumerate(measures):
        spreads = [summary["arms"][a]["spread"][measure] for a in arms]
        xs = [i + k * width for i in range(len(arms))]
        ax.bar(xs, [s["mean"] for s in spreads], width, yerr=_error_bars(spreads), capsize=3, label=PASS_LABELS[measure])
        for x, arm in zip(xs, arms, strict=True):
            seeds = summary["arms"][arm]["seeds"].values()
            ax.scatter([x] * len(seeds), [s[measure] for s in seeds], color="black", s=8, zorder=3)
    ax.set_xticks([i + width * (len(measures) - 1) / 2 for i in range(len(arms))],
                  [a.replace("_matched_tokens", "\n(matched tokens)") for a in arms], fontsize=8)
    ax.set_ylabel("held-out resolve rate")
    ax.set_ylim(0, 1)
    ax.set_title(f"credit-assignment SFT arms ({len(summary['seeds'])} seeds: mean, min-max, each seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_scale(summary: dict[str, Any], path: str, measure: str = "greedy") -> str:
    """Held-out rate against the fraction of teacher data, a line per selector (min-max band over seeds)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    fractions = summary["fractions"]
    for selector, cells in summary["grid"].items():
        spreads = [cells[f"{f:g}"]["spread"][measure] for f in fractions]
        ax.plot(fractions, [s["mean"] for s in spreads], marker="o", label=selector)
        ax.fill_between(fractions, [s["min"] for s in spreads], [s["max"] for s in spreads], alpha=0.15)
    ax.set_xlabel(f"fraction of the {summary['teacher_trajectories']} teacher trajectories")
    ax.set_ylabel(f"held-out resolve rate ({PASS_LABELS[measure]})")
    ax.set_xticks(fractions)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_rl(summary: dict[str, Any], path: str) -> str:
    """Left: greedy held-out success against rollouts spent, per sampler and seed, from the SFT policy's.
    Right: each sampler's rollout economy (mean over seeds, min-max whiskers)."""
    plt = _pyplot()
    fig, (curves, economy) = plt.subplots(1, 2, figsize=(12, 4))
    for k, (sampler, entry) in enumerate(summary["samplers"].items()):
        for i, run in enumerate(entry["seeds"].values()):
            xs, ys = zip(*run["greedy_curve"], strict=True)
            curves.plot(xs, ys, marker="o", color=f"C{k}", alpha=0.8, label=sampler if i == 0 else None)
    curves.set_xlabel("rollouts generated")
    curves.set_ylabel("held-out resolve rate (greedy)")
    curves.set_ylim(0, 1)
    curves.set_title(f"equal budget: {summary['budget']} rollouts a run")
    curves.legend(fontsize=8)
    names = [("informative_chosen", "informative share"), ("informative_per_100_rollouts", "informative per rollout"),
             ("positive_fraction", "positive share"), ("rollouts_per_update", "rollouts per update / 100")]
    width = 0.8 / max(len(summary["samplers"]), 1)
    for k, (sampler, entry) in enumerate(summary["samplers"].items()):
        scale = [1.0, 0.01, 1.0, 0.01]
        spreads = [{key: v * s for key, v in entry["spread"][n].items()} for (n, _), s in zip(names, scale, strict=True)]
        economy.bar([i + k * width for i in range(len(names))], [s["mean"] for s in spreads], width,
                    yerr=_error_bars(spreads), capsize=3, label=sampler, color=f"C{k}")
    economy.set_xticks([i + width * (len(summary["samplers"]) - 1) / 2 for i in range(len(names))],
                       [label for _, label in names], fontsize=8)
    economy.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def async_table(summary: dict[str, Any]) -> str:
    """Each staleness bound: wall time per update and rollouts a minute (mean [min, max] over seeds), the
    speed-up over the synchronous loop, what the updates trained on, and the held-out rates after RL with
    the paired per-task change against the synchronous runs."""
    passes = summary.get("passes", ["greedy", "sampled"])
    header = ["max_staleness", "wall s / update", "speed-up", "rollouts / min", "learner wait s", "update s",
              "mean staleness", "partial rollouts", "stale dropped", *(f"{p} after RL" for p in passes),
              f"{passes[-1]} vs synchronous: up / down, p"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for bound, entry in summary["bounds"].items():
        spread = entry["spread"]
        change = entry.get("change_from_synchronous", {}).get(passes[-1])
        versus = "" if bound == "0" or change is None else (
            f"{change['tasks_up']:.0f} / {change['tasks_down']:.0f}, {change['sign_test_p']:.2f}")
        lines.append("| " + " | ".join([
            bound, spread_text(spread["wall_per_update_s"], 1), f"{entry.get('speedup', 1.0):.2f}x",
            spread_text(spread["rollouts_per_minute"], 1), spread_text(spread["wait_s"], 1),
            spread_text(spread["learn_s"], 1), spread_text(spread["staleness_mean"], 2),
            spread_text(spread["partial_rollouts"], 0), spread_text(spread["stale_dropped"], 0),
            *(spread_text(spread[p]) for p in passes), versus]) + " |")
    return "\n".join(lines)


def async_markdown(summary: dict[str, Any], command: str) -> str:
    """The async study's section of docs/benchmarks.md."""
    rates = ", ".join(f"{p} {rate:.3f}" for p, rate in summary["sft"].items())
    where = f" on {summary['cpus']} CPU cores ({', '.join(summary['devices'])})" if "cpus" in summary else ""
    return (f"Asynchronous RL (`rl.max_staleness`) against the synchronous loop on the SWE main job{where}: BAR from "
            f"its SFT policy for {summary['num_steps']} updates, seeds {', '.join(map(str, summary['seeds']))} "
            f"(mean [min, max] over seeds); the SFT policy's held-out rates: {rates}. Wall time per update is the "
            f"loop's whole step: the learner's wait for the step's rollouts plus its update.\n\n"
            f"{async_table(summary)}\n\n`{command}`")


def plot_async(summary: dict[str, Any], path: str) -> str:
    """Left: training reward against rollouts spent, per bound and seed. Right: wall seconds per update per
    bound (mean over seeds, min-max whiskers)."""
    plt = _pyplot()
    fig, (curves, walls) = plt.subplots(1, 2, figsize=(11, 4))
    bounds = list(summary["bounds"])
    for k, bound in enumerate(bounds):
        for i, run in enumerate(summary["bounds"][bound]["seeds"].values()):
            xs, ys = zip(*run["reward_curve"], strict=True)
            curves.plot(xs, ys, color=f"C{k}", alpha=0.7, label=f"max_staleness {bound}" if i == 0 else None)
    curves.set_xlabel("rollouts generated")
    curves.set_ylabel("training reward (chosen groups)")
    curves.legend(fontsize=8)
    spreads = [summary["bounds"][b]["spread"]["wall_per_update_s"] for b in bounds]
    walls.bar(bounds, [s["mean"] for s in spreads], yerr=_error_bars(spreads), capsize=3,
              color=[f"C{k}" for k in range(len(bounds))])
    walls.set_xlabel("max_staleness")
    walls.set_ylabel("wall seconds per update")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
