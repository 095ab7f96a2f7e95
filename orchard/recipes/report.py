"""What a recipe shows a person, for any task family: the summary table, the plot, and the cross-harness
matrix; all rendered from :class:`~orchard.recipes.runner.RecipeResult` (a main job's ``summary.json``)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from rich.table import Table

from orchard.recipes.runner import RecipeResult
from orchard.recipes.stages import STAGES

MEASURE_LABELS = {"greedy": "resolve rate (greedy)", "sampled": "resolve rate (sampled)", "pass_hat_k": "pass^3",
                  "pass_at_k": "pass@3", "mean_score": "mean task score", "resolve_rate": "success",
                  "safety_violations": "safety violations"}
STAGE_LABELS = {"init": "at init", "sft": "after SFT", "rl": "after RL"}


def bar_summary(rl_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
    """Rollouts per group, fallback counts and informative-group fraction over the whole RL run."""
    steps = list(rl_metrics.values())
    if not steps or "rollouts_per_group" not in steps[0]:
        return {}
    return {"rollouts_per_group": statistics.fmean(m["rollouts_per_group"] for m in steps),
            "fallback_relaxed": sum(m["fallback_relaxed"] for m in steps),
            "fallback_top_ranked": sum(m["fallback_top_ranked"] for m in steps),
            "informative_groups": statistics.fmean(m["informative_groups"] for m in steps)}


def _cell(metrics: dict[str, Any], measure: str) -> str:
    value = metrics.get(measure)
    if value is None:
        return "-"
    return str(int(value)) if measure == "safety_violations" else f"{value:.3f}"


def summary_table(result: RecipeResult, measures: tuple[str, ...] = ("resolve_rate",), title: str = "") -> Table:
    """Every evaluation (set, harness, stage, pass) with ``measures`` (the family's, headline first), pass@k
    and pass^k where sampled, the paired changes with their sign tests, the BAR statistics, the task counts,
    the teacher and the seconds per stage."""
    table = Table(title=title or f"{result.family}: held-out evaluations")
    for column in ("set", "harness", "stage", "pass", *(MEASURE_LABELS.get(m, m) for m in measures), "episodes",
                   "pass@k / pass^k"):
        table.add_column(column, no_wrap=True)
    for held_out, harnesses in result.held_out.items():
        for harness, stages in harnesses.items():
            for stage in [*(s for s in STAGES if s in stages), *(s for s in stages if s not in STAGES)]:
                for pass_, metrics in stages[stage].items():
                    k = int(metrics.get("k", 1))
                    apart = (f"; {round(metrics['unseen_test_resolve_rate'] * metrics['unseen_test_episodes'])}/"
                             f"{int(metrics['unseen_test_episodes'])} unseen test"
                             if metrics.get("unseen_test_episodes") else "")
                    table.add_row(held_out.replace("_", " "), harness, STAGE_LABELS.get(stage, stage), pass_,
                                  *(_cell(metrics, m) for m in measures),
                                  f"{int(metrics['episodes'])} ({int(metrics['tasks_solved'])} tasks solved{apart})",
                                  f"{metrics['pass_at_k']:.3f} / {metrics['pass_hat_k']:.3f} (k={k})" if k > 1 else "")
            for name, change in result.changes.get(held_out, {}).get(harness, {}).items():
                table.add_row(held_out.replace("_", " "), harness, name.replace("_", " "), "sampled",
                              f"tasks +{change['tasks_up']:.0f} / -{change['tasks_down']:.0f}",
                              *([""] * (len(measures) - 1)), f"sign test p = {change['sign_test_p']:.3f}", "")
    notes = [f"BAR {name.replace('_', ' ')}: {value:.2f}" for name, value in bar_summary(result.rl_metrics).items()]
    notes.append("tasks: " + ", ".join(f"{k} {v}" for k, v in result.tasks.items()))
    teacher = result.teacher
    if teacher:
        notes.append(f"teacher kept {teacher.get('kept')} episodes" +
                     (f" ({teacher['resolved']} resolved)" if "resolved" in teacher else ""))
    notes.append("seconds in this run: " + ", ".join(f"{k} {v:.0f}" for k, v in result.seconds.items()))
    table.caption = "; ".join(notes)
    return table


def plot_curves(result: RecipeResult, path: str, measure: str = "resolve_rate") -> str:
    """RL's training reward, success and informative-group share per step (and the curriculum's step cap
    where it has one), beside ``measure`` of every held-out evaluation per stage; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(result.rl_metrics)
    figure, (curves, held) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [2, 3]})
    for name, style in (("reward", "s-"), ("resolve_rate", "o-"), ("informative_groups", "--")):
        if steps and name in result.rl_metrics[steps[0]]:
            curves.plot(steps, [result.rl_metrics[s][name] for s in steps], style, label=name.replace("_", " "))
    if steps and "max_turns" in result.rl_metrics[steps[0]]:
        cap = curves.twinx()
        cap.step(steps, [result.rl_metrics[s]["max_turns"] for s in steps], where="post", color="grey", alpha=0.6)
        cap.set_ylabel("episode step cap (curriculum)")
    curves.set_xlabel("RL step")
    curves.set_ylim(-1.05, 1.05)
    curves.axhline(0.0, color="grey", linewidth=0.5)
    curves.legend(loc="lower right", fontsize=8)
    curves.set_title("RL")
    stages = [s for s in STAGES if any(s in st for h in result.held_out.values() for st in h.values())]
    series = [(held_out, harness, pass_) for held_out, harnesses in result.held_out.items()
              for harness, by_stage in harnesses.items()
              for pass_ in dict.fromkeys(p for passes in by_stage.values() for p in passes)]
    width = 0.8 / max(len(series), 1)
    for offset, (held_out, harness, pass_) in enumerate(series):
        rates = [result.metric(held_out, harness, s, pass_, measure) for s in stages]
        values = [math.nan if r is None else r for r in rates]
        bars = held.bar([i + width * offset for i in range(len(stages))], values, width=width,
                        label=f"{held_out.replace('_', ' ')}, {harness}, {pass_}")
        held.bar_label(bars, labels=["" if math.isnan(v) else f"{v:.2f}" for v in values], fontsize=7)
    held.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(stages))], stages)
    held.legend(loc="upper left", fontsize=7)
    held.set_ylim(0, 1)
    held.set_title(f"held-out {MEASURE_LABELS.get(measure, measure)}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def headline(result: RecipeResult, measure: str = "resolve_rate") -> dict[str, Any]:
    """The numbers a main job prints last: ``measure`` per set, harness, stage and pass, and the changes."""
    return {"held_out": {held_out: {harness: {stage: {p: m.get(measure) for p, m in passes.items()}
                                              for stage, passes in stages.items()}
                                    for harness, stages in harnesses.items()}
                         for held_out, harnesses in result.held_out.items()},
            "changes": result.changes, "seconds": result.seconds}


def matrix_passes(summary: dict[str, Any]) -> list[str]:
    """The passes (greedy, sampled) some cell of a cross-harness matrix has."""
    cells = [cell for arm in summary["matrix"].values() for cell in arm.values()]
    return [p for p in ("greedy", "sampled") if any(p in cell for cell in cells)]


def plot_matrix(summary: dict[str, Any], path: str, pass_: str = "greedy") -> str:
    """The cross-harness matrix (:mod:`orchard.recipes.cross_harness`, :mod:`orchard.recipes.claw_cross_harness`)
    of one pass or measure (``pass_``: greedy or sampled resolve rate, pass_hat_k, pass_at_k) as a
    heat map, arms by rows and evaluation harnesses by columns; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matrix = summary["matrix"]
    arms = list(matrix)
    harnesses = list(dict.fromkeys(h for arm in arms for h in matrix[arm] if pass_ in matrix[arm][h]))
    values = [[matrix[arm].get(h, {}).get(pass_, math.nan) for h in harnesses] for arm in arms]
    fig, ax = plt.subplots(figsize=(1.6 * len(harnesses) + 2, 0.8 * len(arms) + 1.6))
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis")
    for i, row in enumerate(values):
        for j, value in enumerate(row):
            ax.text(j, i, "n/a" if math.isnan(value) else f"{value:.2f}", ha="center", va="center",
                    color="white" if not math.isnan(value) and value < 0.6 else "black")
    ax.set_xticks(range(len(harnesses)), [f"eval: {h}" for h in harnesses])
    ax.set_yticks(range(len(arms)), [f"SFT: {a}" for a in arms])
    ax.set_title(f"held-out {MEASURE_LABELS.get(pass_, pass_)}")
    fig.colorbar(image, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def headline_pass(result: RecipeResult) -> str:
    """The pass a main job's headline reads: greedy where every stage has one, else sampled."""
    passes = {p for h in result.held_out.values() for st in h.values() for ps in st.values() for p in ps}
    return "greedy" if "greedy" in passes else "sampled"


def results_markdown(results: dict[str, RecipeResult], measures: dict[str, str]) -> str:
    """The main jobs' headline table in Markdown, from their ``summary.json``: per job, held-out set and
    harness, its headline measure (``measures``: job -> metric) at init, after SFT and after RL, and RL's
    paired per-task change of the sampled rate with its sign test."""
    from orchard.results import markdown_table

    rows = []
    for job, result in results.items():
        measure, pass_ = measures[job], headline_pass(result)
        for held_out, harnesses in result.held_out.items():
            for harness in harnesses:
                change = next((c for name, c in result.changes.get(held_out, {}).get(harness, {}).items()
                               if name.startswith("rl_vs_") and name != "rl_vs_init"), None) or \
                    result.changes.get(held_out, {}).get(harness, {}).get("rl_vs_init")
                rows.append([job, f"{held_out} ({result.tasks.get(held_out, 0)} tasks)", harness,
                             f"{MEASURE_LABELS.get(measure, measure)}, {pass_}",
                             *(result.metric(held_out, harness, s, pass_, measure) for s in STAGES),
                             f"+{change['tasks_up']:.0f} / -{change['tasks_down']:.0f} (p = {change['sign_test_p']:.2f})"
                             if change else None])
    return markdown_table(["main job", "held-out set", "harness", "measure", "init", "after SFT", "after RL",
                           "RL change in the sampled rate: tasks up / down (sign test)"], rows, digits=3)
