"""The GUI recipe: its config checks, its dry run, and the main job end to end on the smoke config (real
Chromium, real MiniWoB pages, a tiny Qwen3-VL through every stage); the RL-init notebook runs its second arm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs.gui_grpo import get_config
from orchard.data.trajectory import read_trajectories
from orchard.recipes.gui import GUI
from orchard.recipes.gui_rl_init import held_out_curve
from orchard.recipes.runner import eval_directory, run
from orchard.recipes.stages import episodes_path, sampled_change

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("variant", ["tiny", "elements", "marks", "smoke", "qwen3vl_4b"])
def test_shipped_configs_pass_the_check(variant):
    assert GUI.check_config(get_config(variant)) == []


def test_the_check_names_each_problem():
    config = get_config("tiny")
    config.chat.format = "qwen3"
    config.rl.rows_per = "trajectory"
    config.rl.seq_len = 1024
    config.rl.curriculum.stages = ({"max_turns": 2}, {"max_turns": 9})
    config.tasks.pages = ("click-test", "no-such-page")
    config.pretrain.num_steps = 10
    config.harness.tools = ("click", "teleport", "done")
    config.harness.update({"marks": True, "elements": True})
    problems = "\n".join(GUI.check_config(config))
    for expected in ("has no image tokens", "rows_per must be 'turn'", "rl.seq_len (1024)", "allows 9 steps",
                     "['no-such-page'] are not in the MiniWoB catalogue", "copying lessons are for a text policy",
                     "harness.tools: ['teleport'] are not browser tools", "set marks or elements, not both"):
        assert expected in problems, expected


def test_dry_run_checks_the_paper_config_and_launches_nothing(tmp_path):
    command = [sys.executable, "experiments/gui_grpo/run.py", "--config=configs/gui_grpo.py:qwen3vl_4b", "--dry-run",
               f"--workdir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout and "model.visual" in done.stdout and "kind: vllm" in done.stdout
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
def test_the_gui_recipe_end_to_end(orchestrator):
    """The smoke config through every stage in ``runs/gui_rl_init_small/from_sft``: the RL-init notebook's
    first arm (``notebooks/gui_rl_init.ipynb`` runs both arms over the same workdir in CI; it is emptied
    when the suite starts, tests/conftest.py). Whichever of the two gets to a stage first makes it; the
    other waits on the stage's lock and reuses it, so the arm is trained once."""
    workdir = os.path.join(ROOT, "runs", "gui_rl_init_small")
    config = get_config("smoke")
    config.env.update({"url": orchestrator.base_url, "api_key": orchestrator.api_key})
    arm = run(GUI, config, os.path.join(workdir, "from_sft"))
    summary = json.loads(Path(os.path.join(workdir, "from_sft", "summary.json")).read_text())
    assert summary == arm.to_dict()
    # 3 pages, ceil(3 x 0.3) = 1 held out whole; the other 2 have 1 SFT seed, 1 RL seed and 1 held-out seed each.
    assert summary["tasks"] == {"sft": 2, "rl": 2, "held_out_seed": 2, "held_out_task": 1}
    assert summary["teacher"]["kept"] == 2 and summary["teacher"]["success_rate"] == 1.0
    # The policy is given the smoke config's tools only (harness.tools), in teaching and in evaluation.
    for trajectory in read_trajectories(os.path.join(workdir, "from_sft", "teacher", "trajectories.jsonl")):
        assert [tool["function"]["name"] for tool in trajectory.tools] == ["click", "done"]
    passes = {"init": {"greedy"}, "sft": {"greedy", "sampled"}, "rl": {"greedy", "sampled"}}
    for held_out in ("held_out_seed", "held_out_task"):
        by_stage = arm.held_out[held_out]["browser"]
        assert {stage: set(p) for stage, p in by_stage.items()} == passes
        for stage, names in passes.items():
            for pass_ in names:
                folder = eval_directory(os.path.join(workdir, "from_sft"), held_out, "browser", stage, pass_)
                episodes = list(read_trajectories(episodes_path(folder)))
                assert len(episodes) == by_stage[stage][pass_]["episodes"] == arm.tasks[held_out]
                assert all(t.messages[2].images for t in episodes if t.outcome.reward is not None)
                assert all([tool["function"]["name"] for tool in t.tools] == ["click", "done"] for t in episodes)
        assert arm.changes[held_out]["browser"]["rl_vs_sft"] == sampled_change(
            *(eval_directory(os.path.join(workdir, "from_sft"), held_out, "browser", stage, "sampled")
              for stage in ("sft", "rl")))
    # The step-budget curriculum: 1 step per episode in RL's first step, then 2.
    assert [arm.rl_metrics[step]["max_turns"] for step in (1, 2)] == [1.0, 2.0]
    # Greedy held-out success midway (rl.eval_every = 1 of 2 steps): the curve's start, middle and end.
    for held_out in ("held_out_seed", "held_out_task"):
        assert 0.0 <= arm.rl_metrics[1][f"held_out_success/{held_out}"] <= 1.0
        assert f"held_out_success/{held_out}" not in arm.rl_metrics[2]
        assert [step for step, _ in held_out_curve(arm, held_out, "sft")] == [0, 1, 2]
    assert 0.0 <= arm.extras["browser_share"]["rl"] <= 1.0
    # SFT examples are the teacher's turns, each with its screenshot's features; the table names the images.
    data = os.path.join(workdir, "from_sft", "sft_data")
    examples = [json.loads(line) for line in Path(os.path.join(data, "train.jsonl")).read_text().splitlines()]
    assert examples and all(sum(e["image_ids"]) > 0 for e in examples)
    table = json.loads(Path(os.path.join(data, "images.json")).read_text())
    images = os.path.join(workdir, "from_sft", "images")
    assert {(ref["width"], ref["height"]) for ref in table} == {(160, 224)}
    assert all(os.path.exists(os.path.join(images, ref["sha256"][:2], f"{ref['sha256']}.png")) for ref in table)
    for path in ("config.json", "sft/model/preprocessor_config.json", "rl/model/tokenizer.json", "rl/curriculum.json"):
        assert os.path.exists(os.path.join(workdir, "from_sft", path)), path
    # The command line over the same workdir finds every stage done, reports the same numbers, and plots.
    command = [sys.executable, "experiments/gui_grpo/run.py", "--config=configs/gui_grpo.py:smoke",
               f"--workdir={os.path.join(workdir, 'from_sft')}", f"--config.env.url={orchestrator.base_url}",
               f"--config.env.api_key={orchestrator.api_key}"]
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Orchard-GUI: held-out success" in again.stdout
    assert json.loads(Path(os.path.join(workdir, "from_sft", "summary.json")).read_text())["held_out"] == summary["held_out"]
    assert os.path.exists(os.path.join(workdir, "from_sft", "held_out.png"))
