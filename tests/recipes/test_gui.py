"""The GUI recipe: its config checks, its dry run, and the main job end to end on the smoke config (real
Chromium, real MiniWoB pages, a tiny Qwen3-VL through every stage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from configs.gui_grpo import get_config
from orchard.data.trajectory import read_trajectories
from orchard.recipes.gui import episodes_path, sampled_change
from orchard.recipes.gui_report import check_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("variant", ["tiny", "elements", "smoke", "qwen3vl_4b"])
def test_shipped_configs_pass_the_check(variant):
    assert check_config(get_config(variant)) == []


def test_the_check_names_each_problem():
    config = get_config("tiny")
    config.chat.format = "qwen3"
    config.rl.rows_per = "trajectory"
    config.rl.seq_len = 1024
    config.rl.curriculum.stages = ({"max_steps": 2}, {"max_steps": 9})
    config.tasks.pages = ("click-test", "no-such-page")
    problems = "\n".join(check_config(config))
    for expected in ("has no image tokens", "rows_per must be 'turn'", "rl.seq_len (1024)", "allows 9 steps",
                     "['no-such-page'] are not in the MiniWoB catalogue"):
        assert expected in problems, expected


def test_dry_run_checks_the_paper_config_and_launches_nothing(tmp_path):
    command = [sys.executable, "experiments/gui_grpo/run.py", "--config=configs/gui_grpo.py:qwen3vl_4b", "--dry-run",
               f"--workdir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout and "model.visual" in done.stdout and "kind: vllm" in done.stdout
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
def test_the_gui_main_job_end_to_end(orchestrator, tmp_path):
    workdir = tmp_path / "run"
    env = {"env.url": orchestrator.base_url, "env.api_key": orchestrator.api_key}
    command = [sys.executable, "experiments/gui_grpo/run.py", "--config=configs/gui_grpo.py:smoke",
               f"--workdir={workdir}", *(f"--config.{key}={value}" for key, value in env.items())]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Orchard-GUI: held-out success" in done.stdout
    summary = json.loads((workdir / "summary.json").read_text())
    # 3 pages, ceil(3 x 0.3) = 1 held out whole; the other 2 have 2 SFT seeds, 2 RL seeds and 1 held-out seed each.
    assert summary["tasks"] == {"sft": 4, "rl": 4, "held_out_seed": 2, "held_out_task": 1}
    assert summary["teacher"]["kept"] == 4 and summary["teacher"]["success_rate"] == 1.0
    passes = {"init": {"greedy"}, "sft": {"greedy", "sampled"}, "rl": {"greedy", "sampled"}}
    for held_out in ("held_out_seed", "held_out_task"):
        assert {stage: set(p) for stage, p in summary["held_out"][held_out].items()} == passes
        for stage, names in passes.items():
            for name in names:
                episodes = list(read_trajectories(episodes_path(str(workdir / "eval" / f"{stage}_{name}_{held_out}"))))
                result = summary["held_out"][held_out][stage][name]
                assert len(episodes) == result["episodes"] == summary["tasks"][held_out]
                assert all(t.messages[2].images for t in episodes if t.outcome.reward is not None)
        assert summary["rl_change"][held_out] == sampled_change(
            *(str(workdir / "eval" / f"{stage}_sampled_{held_out}") for stage in ("sft", "rl")))
    # The step-budget curriculum: 1 step per episode in RL's first step, then 2.
    assert [summary["rl_metrics"][step]["max_steps"] for step in ("1", "2")] == [1.0, 2.0]
    # SFT examples are the teacher's turns, each with its screenshot's features; the table names the images.
    examples = [json.loads(line) for line in (workdir / "sft_data" / "train.jsonl").read_text().splitlines()]
    assert examples and all(sum(e["image_ids"]) > 0 for e in examples)
    table = json.loads((workdir / "sft_data" / "images.json").read_text())
    assert {(ref["width"], ref["height"]) for ref in table} == {(160, 224)}
    assert all((workdir / "images" / ref["sha256"][:2] / f"{ref['sha256']}.png").exists() for ref in table)
    for path in ("success.png", "config.json", "sft/model/preprocessor_config.json", "rl/model/tokenizer.json",
                 "rl/curriculum.json", "tokenizer/tokenizer.json"):
        assert (workdir / path).exists(), path
    # A second run over the same workdir finds every stage done and reports the same numbers.
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((workdir / "summary.json").read_text())["held_out"] == summary["held_out"]
