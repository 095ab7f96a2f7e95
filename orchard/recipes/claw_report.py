"""What the Claw recipe shows a person: a config check, the summary table and the plot."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict
from rich.table import Table

from orchard.recipes.claw import HARNESSES, PASS_K, STAGES, ClawConfig, ClawResult, claw_config
from orchard.recipes.report import checked, rl_problems
from orchard.tasks.claw.oracle import VARIANTS

TOOL_FORMATS = ("qwen3",)  # chat formats that write tool schemas and calls (the ReAct harness needs them)


def check_config(config: ConfigDict) -> list[str]:
    """Every inconsistency of a Claw recipe config that would only surface deep into a run."""
    return checked(config, claw_config, check_settings)


def check_settings(config: ClawConfig) -> list[str]:
    problems = []
    tasks, teacher = config.tasks, config.teacher
    if not tasks.path and tasks.count_per_family < 2:
        problems.append("tasks.count_per_family must be at least 2 (a training and a held-out task of each family)")
    for name in ("held_out_share", "rl_fraction"):
        if not 0.0 <= getattr(tasks, name) < 1.0:
            problems.append(f"tasks.{name} must be in [0, 1), got {getattr(tasks, name)}")
    if not 0.0 <= tasks.fault_rate <= 1.0:
        problems.append(f"tasks.fault_rate must be in [0, 1], got {tasks.fault_rate}")
    if unknown := [h for h in (*teacher.harnesses, config.harness.rl, *config.harness.eval) if h not in HARNESSES]:
        problems.append(f"harnesses {unknown} are not Claw harnesses: {', '.join(HARNESSES)}")
    if unknown := [v for v in teacher.variants if v not in VARIANTS]:
        problems.append(f"teacher.variants {unknown} are not among {', '.join(VARIANTS)}")
    if (config.sft.num_steps or not config.tokenizer.path) and not (teacher.samples and teacher.harnesses):
        problems.append("teacher: SFT and a trained tokenizer need teacher episodes (teacher.samples and harnesses)")
    if not config.sft.num_steps and not config.model.path:
        problems.append("model: without SFT, RL starts from model.path, which is empty")
    if not config.tokenizer.path and config.tokenizer.train_vocab < 260:
        problems.append("tokenizer: set tokenizer.path, or tokenizer.train_vocab >= 260 (256 bytes + specials)")
    if config.chat_format not in TOOL_FORMATS:
        problems.append(f"chat.format must write tool calls: one of {', '.join(TOOL_FORMATS)}, got "
                        f"{config.chat_format!r}")
    if config.eval.samples < PASS_K:
        problems.append(f"eval.samples must be at least {PASS_K}: pass^{PASS_K} and pass@{PASS_K} need as many "
                        "episodes a task")
    return problems + rl_problems(config)


def summary_table(result: ClawResult) -> Table:
    """Held-out pass^3, pass@3, mean score and safety violations per harness and stage, and the changes."""
    table = Table(title=f"Orchard-Claw: held-out tasks ({result.tasks['held_out']}), "
                        f"{PASS_K}+ sampled episodes each; RL in {result.rl_harness}")
    for column in ("harness", "stage", f"pass^{PASS_K}", f"pass@{PASS_K}", "mean score", "safety violations",
                   "turns"):
        table.add_column(column)
    for harness, stages in result.held_out.items():
        for stage in STAGES:
            if stage in stages:
                m = stages[stage]
                table.add_row(harness, stage, f"{m['pass_hat_k']:.3f}", f"{m['pass_at_k']:.3f}",
                              f"{m['mean_score']:.3f}", str(int(m["safety_violations"])), f"{m['turns']:.1f}")
        for name, change in result.changes.get(harness, {}).items():
            table.add_row(harness, name.replace("_", " "), f"tasks +{change['tasks_up']:.0f} / -{change['tasks_down']:.0f}",
                          f"sign test p = {change['sign_test_p']:.3f}", "", "", "")
    table.caption = (f"tasks: {result.tasks}; teacher kept {result.teacher.get('kept')} episodes "
                     f"{result.teacher.get('by_harness')}; seconds: "
                     + ", ".join(f"{k} {v:.0f}" for k, v in result.seconds.items()))
    return table


def plot_curves(result: ClawResult, path: str) -> str:
    """RL's training reward per step, and pass^3 / pass@3 per stage in each harness; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    steps = sorted(result.rl_metrics)
    left.plot(steps, [result.rl_metrics[s]["reward"] for s in steps], marker="o", label="training reward")
    left.plot(steps, [result.rl_metrics[s]["informative_groups"] for s in steps], linestyle="--",
              label="informative groups")
    left.set_xticks(steps)
    left.set_xlabel(f"RL step ({result.rl_harness})")
    left.set_ylim(-1.05, 1.05)
    left.legend(fontsize=8)
    bars = [(h, metric) for h in result.held_out for metric in ("pass_hat_k", "pass_at_k")]
    width = 0.8 / max(len(bars), 1)
    stages = [s for s in STAGES if any(s in by_stage for by_stage in result.held_out.values())]
    for offset, (harness, metric) in enumerate(bars):
        values = [result.held_out[harness].get(stage, {}).get(metric, 0.0) for stage in stages]
        label = f"{harness}: {'pass^' if metric == 'pass_hat_k' else 'pass@'}{PASS_K}"
        drawn = right.bar([i + offset * width for i in range(len(stages))], values, width=width, label=label,
                          hatch="//" if metric == "pass_hat_k" else None)
        right.bar_label(drawn, labels=[f"{v:.2f}" for v in values], fontsize=7)
    centres = [i + width * (len(bars) - 1) / 2 for i in range(len(stages))]
    for harness in result.held_out:
        right.plot(centres, [result.held_out[harness].get(stage, {}).get("mean_score", 0.0) for stage in stages],
                   marker="D", linestyle=":", label=f"{harness}: mean task score")
    right.set_xticks(centres, stages)
    right.set_ylim(0, 1)
    right.set_ylabel("held-out tasks")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def headline(result: ClawResult) -> dict[str, Any]:
    return {"held_out": {h: {s: {k: m[k] for k in ("pass_hat_k", "pass_at_k", "mean_score", "safety_violations")}
                             for s, m in stages.items()} for h, stages in result.held_out.items()},
            "changes": result.changes, "seconds": result.seconds}
