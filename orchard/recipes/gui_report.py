"""What the GUI recipe shows a person: a config check, the summary table and the plot."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict
from rich.table import Table

from orchard.data.chat import VL_FORMATS
from orchard.recipes.gui import HELD_OUT, GUIConfig, GUIResult, gui_config
from orchard.recipes.report import ENGINES, TEMPLATE_MARGIN, checked
from orchard.tasks.gui.miniwob import CATALOGUE


def check_config(config: ConfigDict) -> list[str]:
    """Every inconsistency of a GUI recipe config that would only surface deep into a run."""
    return checked(config, gui_config, check_settings)


def check_settings(config: GUIConfig) -> list[str]:
    problems = []
    tasks, rl = config.tasks, config.rl
    if unknown := [page for page in tasks.pages if page not in CATALOGUE]:
        problems.append(f"tasks.pages: {unknown} are not in the MiniWoB catalogue")
    if not tasks.pages or tasks.sft_seeds < 1 or tasks.rl_seeds < 1:
        problems.append("tasks: need pages, and at least one SFT seed and one RL seed")
    if config.chat_format not in VL_FORMATS:
        problems.append(f"chat.format: {config.chat_format!r} has no image tokens; one of {', '.join(VL_FORMATS)}")
    if not config.model.path and "vision" not in config.model.init:
        problems.append("model: a path to a vision-language model, or an init with text and vision blocks")
    if rl.rows_per != "turn" and rl.context_images >= 0:
        problems.append("rl.rows_per must be 'turn' when prompts show only the latest screenshots (context_images)")
    if rl.seq_len < rl.rollout.max_context + TEMPLATE_MARGIN:
        problems.append(f"rl.seq_len ({rl.seq_len}) must hold a turn's context ({rl.rollout.max_context}) and the "
                        f"template's closing tokens ({TEMPLATE_MARGIN})")
    if config.sft.images_per_row < 1 or rl.images_per_row < 1:
        problems.append("sft.images_per_row and rl.images_per_row must be at least 1")
    if rl.curriculum.stages and rl.curriculum.stages[-1].max_steps > rl.rollout.max_turns:
        problems.append(f"rl.curriculum: its last stage allows {rl.curriculum.stages[-1].max_steps} steps, more than "
                        f"rl.rollout.max_turns ({rl.rollout.max_turns})")
    if rl.engine.kind not in ENGINES:
        problems.append(f"rl.engine.kind: {rl.engine.kind!r} is not one of {', '.join(ENGINES)}")
    elif missing := [name for name in ENGINES[rl.engine.kind] if not getattr(rl.engine, name)]:
        problems.append(f"rl.engine: a {rl.engine.kind} engine needs {', '.join(missing)}")
    return problems


def summary_table(result: GUIResult) -> Table:
    """Held-out success per stage and pass, for both held-out sets, and the RL change."""
    table = Table(title=f"Orchard-GUI: held-out success ({'element list + ' if result.variant.get('elements') else ''}"
                        f"screenshot)")
    for column in ("set", "stage", "greedy", "sampled avg@k", "pass@k", "by actions (greedy)"):
        table.add_column(column)
    for held_out in HELD_OUT:
        for stage, passes in result.held_out.get(held_out, {}).items():
            greedy, sampled = passes.get("greedy", {}), passes.get("sampled", {})
            actions = ", ".join(f"{k.split()[0]}: {v:.2f}" for k, v in result.by_actions[held_out][stage].items())
            table.add_row(held_out.replace("_", " "), stage, f"{greedy.get('resolve_rate', 0):.3f}",
                          f"{sampled['avg_at_k']:.3f}" if "avg_at_k" in sampled else "-",
                          f"{sampled['pass_at_k']:.3f}" if "pass_at_k" in sampled else "-", actions)
    for held_out, change in result.rl_change.items():
        table.add_row(held_out.replace("_", " "), "rl change (tasks)",
                      f"+{change['tasks_up']:.0f} / -{change['tasks_down']:.0f}", f"sign test p = {change['sign_test_p']:.3f}",
                      "", "")
    return table


def plot_curves(result: GUIResult, path: str) -> str:
    """RL's training reward and episode cap per step, and held-out success per stage; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    steps = sorted(result.rl_metrics)
    left.plot(steps, [result.rl_metrics[s]["reward"] for s in steps], marker="o", label="training reward")
    if steps and "max_steps" in result.rl_metrics[steps[0]]:
        cap = left.twinx()
        cap.step(steps, [result.rl_metrics[s]["max_steps"] for s in steps], where="post", color="grey", alpha=0.6)
        cap.set_ylabel("episode step cap (curriculum)")
    left.set_xlabel("RL step")
    left.set_ylabel("mean reward")
    left.legend(loc="lower right")
    for held_out in HELD_OUT:
        stages = result.held_out.get(held_out, {})
        right.plot(list(stages), [p["greedy"]["resolve_rate"] for p in stages.values()], marker="o",
                   label=held_out.replace("_", " "))
    right.set_ylabel("held-out success (greedy)")
    right.set_ylim(0, 1)
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def headline(result: GUIResult) -> dict[str, Any]:
    return {"held_out": {s: {stage: p["greedy"]["resolve_rate"] for stage, p in stages.items()}
                         for s, stages in result.held_out.items()}, "rl_change": result.rl_change,
            "seconds": result.seconds}


def held_out_curve(result: GUIResult, held_out: str, start: str) -> list[tuple[int, float]]:
    """Greedy held-out success against RL step: the evaluation of the policy RL started from (step 0),
    RL's own evaluations along the way (``rl.eval_every``), and the final policy's (the last step)."""
    stages = result.held_out.get(held_out, {})
    steps = sorted(result.rl_metrics)
    if start not in stages or "rl" not in stages or not steps:
        return []
    key = f"held_out_success/{held_out}"
    middle = [(step, result.rl_metrics[step][key]) for step in steps[:-1] if key in result.rl_metrics[step]]
    return [(0, stages[start]["greedy"]["resolve_rate"]), *middle,
            (steps[-1], stages["rl"]["greedy"]["resolve_rate"])]


def plot_rl_init(results: dict[str, GUIResult], path: str) -> str:
    """The RL-init ablation (Figure 7): each arm's training reward per RL step, and its held-out success
    (greedy, by set) against RL step (:func:`held_out_curve`); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, result in results.items():
        steps = sorted(result.rl_metrics)
        left.plot(steps, [result.rl_metrics[s]["reward"] for s in steps], marker="o", label=name.replace("_", " "))
        start = "sft" if "sft" in next(iter(result.held_out.values()), {}) else "init"
        for held_out, style in zip(HELD_OUT, ("-", "--"), strict=True):
            curve = held_out_curve(result, held_out, start)
            if curve:
                right.plot(*zip(*curve, strict=True), style, marker="o",
                           label=f"{name.replace('_', ' ')}, {held_out.replace('_', ' ')}")
    left.set_xlabel("RL step")
    left.set_ylabel("training reward")
    left.legend()
    right.set_xlabel("RL step")
    right.set_ylabel("held-out success (greedy)")
    right.set_ylim(0, 1)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
