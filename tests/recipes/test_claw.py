"""The Claw recipe: its config checks, its dry run, and the main job end to end on the smoke config (the tool
services in real sandboxes, the teacher through both harnesses, SFT, GRPO, held-out pass^3 in both harnesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from configs.claw_cross_harness import get_config as cross_config
from configs.claw_grpo import get_config
from orchard.data.trajectory import Message, Outcome, Trajectory, read_trajectories
from orchard.eval.claw_score import claw_table
from orchard.recipes.claw import CLAW, PASS_K, held_out_set, probe_pairs, tasks_stage
from orchard.recipes.report import summary_table
from orchard.recipes.runner import eval_directory, run
from orchard.recipes.stages import STAGES, Made, episodes_path, sampled_change
from orchard.tasks.claw.families import FAMILIES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("config", [get_config(v) for v in ("tiny", "smoke", "skills", "qwen3_30b_a3b")]
                         + [cross_config(v) for v in ("tiny", "small")])
def test_shipped_configs_pass_the_check(config):
    assert CLAW.check_config(config) == []


def test_the_check_names_each_problem():
    config = get_config("tiny")
    config.chat.format = "chatml"
    config.eval.samples = 2
    config.harness.rl = "openhands"
    config.teacher.variants = ("clean", "sloppy")
    config.rl.seq_len = 1024
    config.tasks.rl_fraction = 1.0
    config.tasks.update({"families": ("inbox_triage", "todo_from_mail"), "held_out_family": "todo_from_mail"})
    config.sft.examples.renamings = 2
    problems = "\n".join(CLAW.check_config(config))
    for expected in ("must write tool calls", "eval.samples must be at least 3", "['openhands'] are not Claw harnesses",
                     "['sloppy'] are not among", "rl.seq_len (1024)", "tasks.rl_fraction must be in [0, 1)",
                     "renamings renames the casts that tasks invent: none of the families inbox_triage, todo_from_mail"):
        assert expected in problems, expected


def test_sft_trains_on_renamed_copies_of_the_teachers_episodes_and_probes_copying(tmp_path, monkeypatch):
    import orchard.recipes.claw as claw_recipe
    from orchard.recipes.family import Context

    config = get_config("skills")
    config.tasks.count_per_family = 10
    config.sft.examples.renamings = 2
    settings = CLAW.typed(config)
    split = tasks_stage(settings, str(tmp_path), rerun=False)
    runs = [Trajectory(id=f"run-{task.id}", task_id=task.id, messages=[Message(role="user", content=task.spec.prompt)],
                       outcome=Outcome(reward=1.0, resolved=True)) for task in split.sft]
    trained, probed = {}, {}
    policy = Made(str(tmp_path / "sft" / "model"), "made-by")

    def sft_stage(settings, workdir, examples, trajectories, *rest):
        trained["runs"] = trajectories
        return policy

    def probe(settings, examples, workdir, policy_dir, pairs, *rest):
        probed.update(policy=policy_dir, pairs=pairs)

    monkeypatch.setattr(claw_recipe, "text_sft_stage", sft_stage)
    monkeypatch.setattr(claw_recipe, "copy_probe", probe)
    ctx = Context(settings=settings, workdir=str(tmp_path), rerun=False, client=None)
    assert CLAW.sft(ctx, str(tmp_path / "sft"), runs, None, Made("", ""), {}) == policy
    assert {task.spec.params["cast"] for task in split.sft} == {"invented"}  # so every episode has copies
    assert [run.id for run in trained["runs"]] == [run.id for run in runs] + [
        f"{run.id}-renamed{copy}" for run in runs for copy in (0, 1)]
    assert probed["policy"] == policy.directory
    assert [(run.id, copy.id) for run, copy in probed["pairs"]] == [(run.id, f"{run.id}-renamed2") for run in runs]


def test_the_copy_probe_renames_passed_episodes_of_invented_casts_past_sfts_copies():
    quick = FAMILIES["quick_action"]
    specs = {spec.id: spec for spec in (quick.make({"action": "add_todo", "wording": 0, "cast": cast}, 5)
                                        .model_copy(update={"id": f"quick_action-{cast}"}) for cast in ("invented", "real"))}

    def episode(task_id: str, passed: bool) -> Trajectory:
        return Trajectory(id=f"{task_id}-{passed}", task_id=task_id, messages=[
            Message(role="user", content=specs[task_id].prompt)], outcome=Outcome(reward=1.0 if passed else -1.0,
                                                                                 resolved=passed))

    runs = [episode("quick_action-invented", True), episode("quick_action-invented", False),
            episode("quick_action-real", True)]  # a failed episode and a real cast's: not probed
    pairs = probe_pairs(runs, specs, seed=0, renamings=4)
    assert [(run.id, copy.id) for run, copy in pairs] == [(runs[0].id, f"{runs[0].id}-renamed4")]
    assert pairs[0][1].messages[0].content != runs[0].messages[0].content


def test_the_split_holds_out_a_whole_family_and_carves_validation_from_training(tmp_path):
    config = get_config("tiny")
    config.tasks.update({"count_per_family": 10, "validation_share": 0.2})
    split = tasks_stage(CLAW.typed(config), str(tmp_path), rerun=False)

    def families(tasks) -> set[str]:
        return {task.spec.family for task in tasks}

    assert list(split.held_out) == ["validation", "held_out", "held_out_cast", "family"]
    by_cast = split.held_out["held_out_cast"]  # the quick actions held out only by their unseen cast
    assert by_cast and {(t.spec.family, t.spec.params["cast"], t.spec.params["wording"] < 2) for t in by_cast} == {
        ("quick_action", "real", True)}
    assert not any(t.spec.params.get("cast") == "real" for t in [*split.sft, *split.rl])
    # A task whose parameters its family's rule cannot read (written elsewhere) is in the main held-out set.
    assert held_out_set(by_cast[0].spec.model_copy(update={"params": {}})) == "held_out"
    assert families(split.held_out["family"]) == {"todo_from_mail"} and len(split.held_out["family"]) == 10
    trained = [*split.sft, *split.rl, *split.held_out["validation"], *split.held_out["held_out"]]
    assert "todo_from_mail" not in families(trained)
    sets = [{task.id for task in tasks} for tasks in (split.sft, split.rl, *split.held_out.values())]
    assert sum(map(len, sets)) == len(set().union(*sets)) == 6 * 10  # disjoint, and every task is in one
    validation = split.held_out["validation"]
    assert len(validation) == 8  # a fifth of the 40 training tasks of the five other families
    assert not any(FAMILIES[task.spec.family].HELD_OUT(task.spec.params) for task in validation)  # training combos
    # The split's fingerprint follows its settings, so the stages after it rerun when they change.
    config.tasks.held_out_family = "inbox_triage"
    other = tasks_stage(CLAW.typed(config), str(tmp_path), rerun=False)
    assert families(other.held_out["family"]) == {"inbox_triage"} and other.made_by != split.made_by
    config.tasks.update({"held_out_family": "inbox_triage", "families": ("quick_action", "no_such_family")})
    problems = "\n".join(CLAW.check_config(config))
    assert "tasks.families: ['no_such_family'] are not Claw families" in problems
    assert "tasks.held_out_family 'inbox_triage' is not one of the generated families" in problems


def test_dry_run_checks_the_paper_config_and_launches_nothing(tmp_path):
    command = [sys.executable, "experiments/claw_grpo/run.py", "--config=configs/claw_grpo.py:qwen3_30b_a3b",
               "--dry-run", f"--workdir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout and "kind: vllm" in done.stdout and "group_size: 8" in done.stdout
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.slow
def test_the_claw_recipe_end_to_end(orchestrator, tmp_path):
    config = get_config("smoke")
    config.env.update({"url": orchestrator.base_url, "api_key": orchestrator.api_key})
    workdir = str(tmp_path / "claw")
    result = run(CLAW, config, workdir)
    summary = json.loads(Path(workdir, "summary.json").read_text())
    assert summary == result.to_dict()
    # 2 tasks of each of three families, half held out, and todo_from_mail's two held out as a family: 2
    # training tasks (SFT's, and RL's prompts at rl_fraction 0), 2 held out by parameters, 2 by family.
    assert result.tasks == {"sft": 2, "rl": 2, "held_out": 2, "family": 2}
    assert result.teacher["kept"] == 4 and result.teacher["by_harness"] == {"claw": 2, "claw-shell": 2}
    assert json.loads(Path(workdir, "config.json").read_text())["harness"]["rl"] == "claw"
    assert list(result.held_out) == ["held_out", "family"]
    family_episodes = list(read_trajectories(episodes_path(eval_directory(workdir, "family", "claw", "sft", "sampled"))))
    assert {t.task_id.split("-")[0] for t in family_episodes} == {"todo_from_mail"}
    assert not any(t.task_id.startswith("todo_from_mail") for t in read_trajectories(
        os.path.join(workdir, "teacher", "trajectories.jsonl")))  # a held-out family never trains
    for harness in ("claw", "claw-shell"):
        assert list(result.held_out["held_out"][harness]) == list(STAGES)
        for stage in STAGES:
            folder = eval_directory(workdir, "held_out", harness, stage, "sampled")
            episodes = list(read_trajectories(episodes_path(folder)))
            assert len(episodes) == 2 * config.eval.samples and {t.harness for t in episodes} == {harness}
            graded = [t for t in episodes if t.outcome.reward is not None]
            assert graded and all("score" in t.metadata["claw"] for t in graded)  # graded from the services' state
            metrics = result.held_out["held_out"][harness][stage]["sampled"]
            table = claw_table(episodes, PASS_K)
            assert {k: metrics[k] for k in ("pass_hat_k", "pass_at_k", "mean_score")} == \
                {k: table[k] for k in ("pass_hat_k", "pass_at_k", "mean_score")}
            assert 0.0 <= metrics["pass_hat_k"] <= metrics["pass_at_k"] <= 1.0
        changes = result.changes["held_out"][harness]
        assert changes["rl_vs_sft"] == sampled_change(*(eval_directory(workdir, "held_out", harness, stage, "sampled")
                                                        for stage in ("sft", "rl")))
        assert set(changes) == {"sft_vs_init", "rl_vs_sft", "rl_vs_init"}
    assert list(result.rl_metrics) == [1] and -1.0 <= result.rl_metrics[1]["reward"] <= 1.0  # GRPO's one step
    per_task = result.extras["per_task"]
    assert set(per_task) == {"held_out", "family"}  # each set's tasks, by harness and stage
    assert set(per_task["held_out"]["claw"]["rl"]) == set(per_task["held_out"]["claw"]["init"])
    assert len(per_task["held_out"]["claw"]["rl"]) == 2 and len(per_task["family"]["claw-shell"]["sft"]) == 2
    assert summary_table(result, CLAW.measures).row_count == 2 * 2 * (3 + 3)  # each set and harness: 3 stages, 3 changes
    # A rerun reuses every stage: no episode is run again.
    stamps = {p: p.stat().st_mtime_ns for p in Path(workdir, "eval").rglob("trajectories.jsonl")}
    assert run(CLAW, config, workdir).to_dict()["held_out"] == summary["held_out"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
