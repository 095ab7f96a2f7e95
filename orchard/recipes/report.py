"""What the SWE recipe shows a person: a config check, the summary table and the resolve-rate plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any, TypeVar

from ml_collections import ConfigDict
from rich.table import Table

from orchard.config import ConfigError
from orchard.data.chat import CHAT_FORMATS
from orchard.recipes.swe import RecipeResult, SWEConfig, swe_config

T = TypeVar("T")
ENGINES = {"jax": (), "vllm": ("url", "served_model", "weights_dir"), "openai": ("url", "served_model", "weights_dir")}
TEMPLATE_MARGIN = 8  # tokens the chat format adds after the last sampled token of a rollout
# the held-out sets as the table names them -> their RecipeResult field: by instance (a new bug in a helper whose
# sibling bug may have been trained on), by helper (helpers never seen broken in training)
SPLITS = {"held-out": "held_out", "held-out helpers": "held_out_helpers"}
MEASURE_LABELS = {"greedy": "resolve rate (greedy)", "sampled": "resolve rate (sampled)", "pass_hat_k": "pass^3",
                  "pass_at_k": "pass@3", "mean_score": "mean task score"}


def check_config(config: ConfigDict) -> list[str]:
    """Every inconsistency of a recipe config that would only surface hours into a run: a field
    that does not fit its stage's config (:func:`~orchard.config.from_config`), then the settings
    that do not fit each other."""
    return checked(config, swe_config, check_settings)


def checked(config: ConfigDict, typed: Callable[[ConfigDict], T], settings: Callable[[T], list[str]]) -> list[str]:
    """A recipe's config check: its typed stage configs (``typed``), then ``settings`` over them."""
    try:
        stages = typed(config)
    except (ConfigError, KeyError) as exc:
        return [f"{exc}" if isinstance(exc, ConfigError) else f"missing config block {exc}"]
    return settings(stages)


def check_settings(config: SWEConfig) -> list[str]:
    problems = []
    tasks, teacher, rl = config.tasks, config.teacher, config.rl
    if not tasks.path and not tasks.sources:
        problems.append("tasks: set tasks.path (instances.jsonl) or tasks.sources")
    if rl.pass_filter.samples and not 0.0 <= rl.pass_filter.low < rl.pass_filter.high <= 1.0:
        problems.append("rl.pass_filter: need 0 <= low < high <= 1")
    for name in ("held_out_helper_fraction", "held_out_fraction", "rl_fraction"):
        if not 0.0 <= getattr(tasks, name) < 1.0:
            problems.append(f"tasks.{name} must be in [0, 1), got {getattr(tasks, name)}")
    if not config.tokenizer.path and config.tokenizer.train_vocab < 260:
        problems.append("tokenizer: set tokenizer.path, or tokenizer.train_vocab >= 260 (256 bytes + specials)")
    if not config.tokenizer.path and not teacher.samples:
        problems.append("tokenizer: a trained tokenizer needs teacher text (teacher.samples > 0)")
    if config.sft.num_steps and not teacher.samples:
        problems.append("sft: SFT needs teacher trajectories (teacher.samples > 0), or set sft.num_steps = 0")
    if not config.sft.num_steps and not config.model.path:
        problems.append("model: without SFT, RL starts from model.path, which is empty")
    if config.chat_format not in CHAT_FORMATS:
        problems.append(f"chat.format must be one of {tuple(CHAT_FORMATS)}, got {config.chat_format!r}")
    if config.eval.samples < 1:
        problems.append("eval.samples (sampled held-out episodes per task) must be at least 1")
    return problems + rl_problems(config)


def rl_problems(config: Any) -> list[str]:
    """The RL stage's inconsistencies in any recipe config with ``rl``, ``mesh`` and ``env`` blocks:
    the group sampler, rows and micro-batches, the learner's rows against the rollouts' context, the
    clip range, the engine, the backend, the step and concurrency counts."""
    problems: list[str] = []
    rl, sampler = config.rl, config.rl.sampler
    if sampler.group_size < 2:
        problems.append("rl.sampler.group_size must be at least 2 (GRPO compares rollouts within a group)")
    if sampler.name == "bar":
        if not 0.0 <= sampler.rho_min <= sampler.rho_max <= 1.0:
            problems.append(f"BAR window [{sampler.rho_min}, {sampler.rho_max}] must satisfy 0 <= min <= max <= 1")
        elif math.ceil(sampler.rho_min * sampler.group_size - 1e-9) > math.floor(
                sampler.rho_max * sampler.group_size + 1e-9):
            problems.append(f"BAR window [{sampler.rho_min}, {sampler.rho_max}] holds no positive count for "
                            f"N = {sampler.group_size}")
        if sampler.max_budget < sampler.group_size or sampler.stride < 1:
            problems.append("BAR needs max_budget >= group_size and stride >= 1")
    if rl.rows_per == "trajectory" and rl.rows < rl.prompts_per_step * sampler.group_size:
        problems.append(f"rl.rows ({rl.rows}) < prompts_per_step x group_size "
                        f"({rl.prompts_per_step * sampler.group_size}): a step's groups would not fit")
    if rl.micro_rows < 1 or rl.rows % rl.micro_rows or rl.micro_rows % config.mesh.fsdp:
        problems.append(f"rl.rows ({rl.rows}) must be a multiple of rl.micro_rows ({rl.micro_rows}), and that of "
                        f"mesh.fsdp ({config.mesh.fsdp})")
    if rl.seq_len < rl.rollout.max_context + TEMPLATE_MARGIN:
        problems.append(f"rl.seq_len ({rl.seq_len}) < rl.rollout.max_context ({rl.rollout.max_context}) + "
                        f"{TEMPLATE_MARGIN} template tokens: the longest rollouts would not fit the learner's rows")
    if not 0.0 <= rl.eps_low < 1.0 or rl.eps_high < 0.0:
        problems.append(f"PPO clip range (eps_low {rl.eps_low}, eps_high {rl.eps_high}) is invalid")
    if rl.engine.kind not in ENGINES:
        problems.append(f"rl.engine.kind must be one of {tuple(ENGINES)}, got {rl.engine.kind!r}")
    else:
        problems += [f"rl.engine.{name} is required for a {rl.engine.kind} engine"
                     for name in ENGINES[rl.engine.kind] if not getattr(rl.engine, name)]
    if config.env.backend == "kubernetes" and not config.env.url:
        problems.append("env.url (the orchestrator of the cluster) is required for the kubernetes backend")
    if rl.num_steps < 1:
        problems.append("rl.num_steps must be at least 1")
    if rl.rollout.concurrency < 1:
        problems.append("rl.rollout.concurrency must be at least 1")
    if rl.updates_per_batch < 1:
        problems.append("rl.updates_per_batch (policy updates per step's rollouts) must be at least 1")
    return problems


def bar_summary(rl_metrics: dict[int, dict[str, float]]) -> dict[str, float]:
    """Rollouts per group, fallback counts and informative-group fraction over the whole RL run."""
    steps = list(rl_metrics.values())
    if not steps:
        return {}
    return {"rollouts_per_group": statistics.fmean(m["rollouts_per_group"] for m in steps),
            "fallback_relaxed": sum(m["fallback_relaxed"] for m in steps),
            "fallback_top_ranked": sum(m["fallback_top_ranked"] for m in steps),
            "informative_groups": statistics.fmean(m["informative_groups"] for m in steps)}


def summary_table(result: RecipeResult) -> Table:
    table = Table(title="Orchard-SWE: held-out resolve rate and BAR statistics")
    table.add_column("measure", no_wrap=True)
    table.add_column("value", justify="right")
    labels = {"init": "at init", "sft": "after SFT", "rl": "after RL"}
    for stage, label in labels.items():  # each stage's rows by instance, then by helper
        for split, results in SPLITS.items():
            for name, held in getattr(result, results).get(stage, {}).items():
                apart = ""
                if held.get("unseen_test_episodes"):  # held-out bugs whose test catches no training bug
                    unseen = held["unseen_test_episodes"]
                    apart = f"; {round(held['unseen_test_resolve_rate'] * unseen)}/{int(unseen)} with an unseen test"
                table.add_row(f"{split} {label} ({name})",
                              f"{held['resolve_rate']:.3f} ({int(held['episodes'])} episodes, "
                              f"{int(held['tasks_solved'])} tasks solved{apart})")
                if held.get("k", 1) > 1:
                    k = int(held["k"])
                    table.add_row(f"{split} {label} ({name}): pass@{k} / pass^{k}",
                                  f"{held['pass_at_k']:.3f} / {held['pass_hat_k']:.3f}")
    for split, change in (("held-out", result.rl_change), ("held-out helper", result.rl_change_helpers)):
        if change:
            table.add_row(f"{split} tasks RL raised / lowered",
                          f"{int(change['tasks_up'])} / {int(change['tasks_down'])}, sampled (sign test p = "
                          f"{change['sign_test_p']:.3f})")
    for name, value in bar_summary(result.rl_metrics).items():
        table.add_row(f"BAR {name.replace('_', ' ')}", f"{value:.2f}" if isinstance(value, float) else str(value))
    table.add_row("tasks (SFT / RL / held out / held-out helpers)",
                  f"{result.tasks['sft']} / {result.tasks['rl']} / {result.tasks['held_out']} / "
                  f"{result.tasks.get('held_out_helpers', 0)}")
    table.add_row("teacher trajectories (resolved)",
                  f"{result.teacher['trajectories']} ({result.teacher['resolved']})")
    for stage, seconds in result.seconds.items():  # stages a resumed run reuses take no time here
        table.add_row(f"time in this run: {stage}", f"{seconds:.0f} s")
    return table


def plot_curves(result: RecipeResult, path: str) -> str:
    """Training reward and resolve rate against RL step, beside the held-out resolve rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(result.rl_metrics)
    figure, (curves, held) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    metric: dict[str, Any] = {name: [result.rl_metrics[s][name] for s in steps]
                              for name in ("reward", "resolve_rate", "informative_groups")}
    curves.plot(steps, metric["resolve_rate"], marker="o", label="resolve rate (training rollouts)")
    curves.plot(steps, metric["reward"], marker="s", label="mean reward (+1 / -1)")
    curves.plot(steps, metric["informative_groups"], linestyle="--", label="informative-group fraction")
    curves.set_xlabel("RL step")
    curves.set_xticks(steps)
    curves.set_ylim(-1.05, 1.05)
    curves.axhline(0.0, color="grey", linewidth=0.5)
    curves.legend(loc="lower right", fontsize=8)
    curves.set_title("BAR RL")
    stages = [s for s in ("init", "sft", "rl") if s in result.held_out or s in result.held_out_helpers]
    bars_of = [(split, name, color, hatch) for (split, hatch) in (("held_out", ""), ("held_out_helpers", "//"))
               if getattr(result, split) for name, color in (("greedy", "#4a8"), ("sampled", "#36c"))]
    width = 0.8 / max(len(bars_of), 1)
    for offset, (split, name, color, hatch) in enumerate(bars_of):
        results = getattr(result, split)
        rates = [results[s][name]["resolve_rate"] if name in results.get(s, {}) else math.nan for s in stages]
        label = name if split == "held_out" else f"{name}, held-out helpers"
        bars = held.bar([i + width * offset for i in range(len(stages))], rates, width=width, color=color,
                        hatch=hatch, edgecolor="white" if hatch else None, label=label)
        held.bar_label(bars, labels=["" if math.isnan(r) else f"{r:.2f}" for r in rates], fontsize=7)  # 0 shows
    held.set_xticks([i + width * (len(bars_of) - 1) / 2 for i in range(len(stages))], stages)
    held.legend(loc="upper left", fontsize=8)
    held.set_ylim(0, 1)
    held.set_title("held-out resolve rate")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


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
