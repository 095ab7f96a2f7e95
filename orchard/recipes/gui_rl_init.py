"""The paper's Figure 7 question on Orchard-GUI: GRPO from the SFT checkpoint against GRPO from the initial
model at an equal rollout budget, as two arms of the recipe runner over shared tasks, teacher and tokenizer
(``notebooks/gui_rl_init.ipynb``)."""

from __future__ import annotations

import asyncio
import contextlib
import os

from ml_collections import ConfigDict

from orchard.recipes.gui import GUI, HELD_OUT
from orchard.recipes.runner import RecipeResult, eval_directory, run_recipe
from orchard.workdir import write_json

# What both arms of the RL-init ablation use: the stages before SFT, and the initial policy's greedy evaluation
# (the same policy, tasks and seeds in both arms: the same episodes, so the second arm reuses the first's).
SHARED_STAGES = ("images", "tasks", "teacher", "tokenizer",
                 *(eval_directory("", held_out, "browser", "init", "greedy") for held_out in HELD_OUT))


def run_rl_init_ablation(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, RecipeResult]:
    """:func:`arun_rl_init_ablation` from synchronous code."""
    return asyncio.run(arun_rl_init_ablation(config, workdir, rerun=rerun))


async def arun_rl_init_ablation(config: ConfigDict, workdir: str, *, rerun: bool = False) -> dict[str, RecipeResult]:
    """The paper's Figure 7 question: GRPO from the SFT checkpoint (``from_sft``) against GRPO from the
    initial model (``from_init``, ``sft.num_steps = 0``) at an equal rollout budget (the same RL config).
    Both arms share one set of tasks, teacher trajectories and tokenizer, and the initial policy's greedy
    evaluation (the second arm's folders link to the first's), so they differ in where RL starts and nothing
    else. Each arm is a recipe workdir: a rerun reuses what is done."""
    arms = {"from_sft": config, "from_init": config.copy_and_resolve_references()}
    arms["from_init"].sft.num_steps = 0
    results = {}
    for name, arm in arms.items():
        directory = os.path.join(workdir, name)
        os.makedirs(directory, exist_ok=True)
        if name != "from_sft":
            for stage in SHARED_STAGES:
                link, target = os.path.join(directory, stage), os.path.join(workdir, "from_sft", stage)
                if not os.path.lexists(link) and os.path.exists(target):
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                    with contextlib.suppress(FileExistsError):  # another run over this workdir linked it first
                        os.symlink(os.path.abspath(target), link)
        results[name] = await run_recipe(GUI, arm, directory, rerun=rerun)
    write_json(os.path.join(workdir, "summary.json"), {name: r.to_dict() for name, r in results.items()})
    return results


def held_out_curve(result: RecipeResult, held_out: str, start: str) -> list[tuple[int, float]]:
    """Greedy held-out success against RL step: the evaluation of the policy RL started from (step 0),
    RL's own evaluations along the way (``rl.eval_every``), and the final policy's (the last step)."""
    stages = result.held_out.get(held_out, {}).get("browser", {})
    steps = sorted(result.rl_metrics)
    if start not in stages or "rl" not in stages or not steps:
        return []
    key = f"held_out_success/{held_out}"
    middle = [(step, result.rl_metrics[step][key]) for step in steps[:-1] if key in result.rl_metrics[step]]
    return [(0, stages[start]["greedy"]["resolve_rate"]), *middle,
            (steps[-1], stages["rl"]["greedy"]["resolve_rate"])]


def plot_rl_init(results: dict[str, RecipeResult], path: str) -> str:
    """The RL-init ablation (Figure 7): each arm's training reward per RL step, and its held-out success
    (greedy, by set) against RL step (:func:`held_out_curve`); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, result in results.items():
        steps = sorted(result.rl_metrics)
        left.plot(steps, [result.rl_metrics[s]["reward"] for s in steps], marker="o", label=name.replace("_", " "))
        start = "sft" if result.metric("held_out_seed", "browser", "sft", "greedy", "resolve_rate") is not None else "init"
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
