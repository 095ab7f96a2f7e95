"""The SWE recipe: its task split, its config checks, its stage records, and the main job end to end on a
reduced config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest
from flax import nnx
from ml_collections import ConfigDict

from configs.swe_bar import get_config
from orchard.data.trajectory import Outcome, Trajectory, read_trajectories, save_trajectories
from orchard.models import ModelConfig, Transformer, save_pretrained
from orchard.recipes.cli import chain_problems, stage_plans
from orchard.recipes.report import plot_curves, summary_table
from orchard.recipes.runner import RecipeResult, eval_directory, run
from orchard.recipes.stages import episodes_path, sampled_change, trained_policy
from orchard.recipes.swe import SWE, swe_config
from orchard.tasks.swe.instance import SWEInstance, save_instances
from orchard.tasks.swe.taskset import TaskSetConfig, split_task_set, unseen_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_split_holds_out_instances_and_names_those_with_an_unseen_test():
    instances = [SWEInstance(instance_id=f"i{n}", repo="r", base_commit="c", problem_statement="",
                             FAIL_TO_PASS=(f"tests/t.py::test_{n % 13}",)) for n in range(40)]
    config = TaskSetConfig(held_out_helper_fraction=0.0, held_out_fraction=0.25, rl_fraction=0.2)
    split = split_task_set(instances, config, seed=1)  # no helper held out (tests/tasks/swe/test_taskset.py)
    train = split.sft + split.rl
    assert len(split.held_out) == 10 and len(split.rl) == 6 and len(split.sft) == 24  # ceil(40 x 0.25), ceil(30 x 0.2)
    assert not {i.instance_id for i in train} & {i.instance_id for i in split.held_out}
    assert split_task_set(list(reversed(instances)), config, seed=1).held_out == \
        list(reversed(split.held_out))  # seeded by id: the order instances come in changes nothing
    seen = {i.FAIL_TO_PASS[0] for i in train}
    assert split.unseen == {i.instance_id for i in split.held_out if i.FAIL_TO_PASS[0] not in seen}
    assert unseen_tests(instances, instances) == set()


def test_training_tasks_too_few_to_split_into_sft_and_rl_are_a_clear_error(tmp_path):
    save_instances([SWEInstance(instance_id="only", repo="r", base_commit="c", problem_statement="Fix it.")],
                   tmp_path / "instances.jsonl")
    config = get_config("tiny")
    config.tasks.update({"path": str(tmp_path / "instances.jsonl"), "held_out_helper_fraction": 0.0,
                         "held_out_fraction": 0.0, "rl_fraction": 0.5})
    with pytest.raises(ValueError, match="do not split into SFT and RL tasks"):
        run(SWE, config, str(tmp_path / "run"))  # before any sandbox or model is started
    assert not os.path.exists(tmp_path / "run" / "teacher")


def _episodes(directory, outcomes: dict[str, list[bool]]) -> str:
    save_trajectories(episodes_path(str(directory)), [Trajectory(task_id=task, messages=[], outcome=Outcome(resolved=s))
                                                      for task, runs in outcomes.items() for s in runs])
    return str(directory)


def test_the_sampled_change_pairs_tasks_and_gives_the_sign_test(tmp_path):
    before = _episodes(tmp_path / "before", {"a": [True, False, False, False], "b": [True] * 4,
                                             "c": [False] * 4, "d": [True, True, False, False]})
    after = _episodes(tmp_path / "after", {"a": [True, True, False, False], "b": [True, True, True, False],
                                           "c": [False] * 4, "d": [True, True, True, False]})
    # a and d rose, b fell, c did not change: P(at least 2 of 3 changed tasks rise) = (3 + 1) / 8
    assert sampled_change(before, after) == {"tasks_up": 2.0, "tasks_down": 1.0, "sign_test_p": 0.5}
    seven_of_eight = {f"t{n}": [n < 7] for n in range(8)}
    seven_up = sampled_change(_episodes(tmp_path / "none", {task: [False] for task in seven_of_eight}),
                              _episodes(tmp_path / "flip", seven_of_eight))
    assert seven_up["tasks_up"] == 7 and seven_up["sign_test_p"] == 1 / 2**7  # t7 did not change: 7 of 7 rose
    assert sampled_change(before, before) == {"tasks_up": 0.0, "tasks_down": 0.0, "sign_test_p": 1.0}


def _rates(rate: float, tasks: int, samples: int = 1) -> dict[str, float]:
    return {"resolve_rate": rate, "episodes": float(tasks * samples), "tasks_solved": float(round(rate * tasks)),
            "k": float(samples), "pass_at_k": rate, "pass_hat_k": rate, "unseen_test_episodes": 0.0}


def test_the_table_and_plot_show_both_held_out_sets_in_each_pass(tmp_path):
    by_stage = {"init": {"greedy": _rates(0.0, 4)}, "sft": {"greedy": _rates(0.25, 4), "sampled": _rates(0.5, 4, 2)},
                "rl": {"greedy": _rates(0.5, 4), "sampled": _rates(0.75, 4, 2)}}
    change = {"tasks_up": 2.0, "tasks_down": 0.0, "sign_test_p": 0.25}
    result = RecipeResult(family="swe", config_digest="", tasks={"sft": 8, "rl": 2, "held_out": 4, "held_out_helpers": 4},
                          teacher={"kept": 2, "resolved": 1},
                          held_out={"held_out": {"bash": by_stage}, "held_out_helpers": {"bash": by_stage}},
                          changes={"held_out": {"bash": {"rl_vs_sft": change}},
                                   "held_out_helpers": {"bash": {"rl_vs_sft": change}}},
                          rl_metrics={}, seconds={})
    table = summary_table(result)
    rows = list(zip(*(column._cells for column in table.columns), strict=True))
    for split in ("held out", "held out helpers"):
        assert (split, "bash", "after SFT", "greedy", "0.250", "4 (1 tasks solved)", "") in rows
        assert (split, "bash", "after RL", "sampled", "0.750", "8 (3 tasks solved)", "0.750 / 0.750 (k=2)") in rows
        assert (split, "bash", "rl vs sft", "sampled", "tasks +2 / -0", "sign test p = 0.250", "") in rows
    assert "tasks: sft 8, rl 2, held_out 4, held_out_helpers 4" in table.caption
    assert RecipeResult.from_dict(result.to_dict()) == result  # summary.json reads back as it was written
    result.rl_metrics = {1: {"reward": 0.0, "resolve_rate": 0.5, "informative_groups": 0.5}}
    assert os.path.getsize(plot_curves(result, str(tmp_path / "plot.png"))) > 0


@pytest.mark.parametrize("variant", ["tiny", "qwen3_30b_a3b", "gpu"])
def test_shipped_configs_pass_the_check(variant):
    assert SWE.check_config(get_config(variant)) == []


def test_the_one_gpu_variant_fits_an_h100_and_starts_from_the_shipped_smollm2():
    """What --dry-run checks, in this process: each training stage's memory plan, read from the GGUF's shape."""
    config = get_config("gpu")
    plans, notes = stage_plans(config)
    assert [plan.stage for plan in plans] == ["sft", "rl"] and all(plan.fits and not plan.problems for plan in plans)
    assert all("SmolLM2-135M-Instruct" in note for note in notes) and chain_problems(config) == []
    assert config.rl.rollout.max_context + config.rl.rollout.max_new_tokens <= 8192  # SmolLM2's positions


def test_the_check_names_each_problem():
    config = get_config("qwen3_30b_a3b")
    config.rl.sampler.update({"rho_min": 0.3, "rho_max": 0.36})  # no whole count of 8 in [2.4, 2.88]
    config.rl.rows = 8
    config.rl.engine.url = ""
    config.env.url = ""
    config.tasks.rl_fraction = 1.0
    config.tasks.held_out_helper_fraction = -0.1
    config.rl.updates_per_batch = 0
    config.eval.samples = 0
    config.chat.format = "llama3"
    problems = "\n".join(SWE.check_config(config))
    assert "holds no positive count" in problems and "rl.rows (8)" in problems
    assert "rl.updates_per_batch" in problems
    assert "tasks.rl_fraction must be in [0, 1)" in problems and "tasks.held_out_helper_fraction must be" in problems
    config.rl.pass_filter.update({"samples": 4, "low": 0.5, "high": 0.5})
    assert "rl.pass_filter: need 0 <= low < high <= 1" in SWE.check_config(config)
    assert "rl.engine.url is required" in problems and "kubernetes backend" in problems
    assert "eval.samples (sampled held-out episodes per task) must be at least 1" in problems
    assert "chat.format must be one of" in problems


def test_copying_lessons_and_renamings_are_checked():
    config = get_config("tiny")
    config.pretrain.update({"num_steps": 10, "max_span": 300, "kind": "echo"})
    config.model.path = "checkpoints/trained"
    problems = "\n".join(SWE.check_config(config))
    assert "model.path (checkpoints/trained) is already trained" in problems
    assert "pretrain.seq_len (512) cannot hold a span and its copy" in problems
    assert "pretrain.kind 'echo': one of span, recall" in problems
    config.pretrain.num_steps = 0  # no lessons: nothing of theirs is checked
    assert SWE.check_config(config) == []
    config.sft.examples.copy_lessons = 10  # lessons kept in SFT are drawn as the pretrain block says: checked too
    assert "pretrain.kind 'echo': one of span, recall" in "\n".join(SWE.check_config(config))
    config.pretrain.kind, config.sft.examples.copy_lessons = "span", 0
    config.sft.examples.renamings = 2  # opkit's names are not generated
    assert "sft.examples.renamings renames generated repositories" in "\n".join(SWE.check_config(config))


def test_the_skills_variant_passes_and_its_problems_are_named():
    config = get_config("skills")
    assert SWE.check_config(config) == []
    config.tasks.procedural.held_out_vocabulary = config.tasks.procedural.vocabularies[0]  # also a training one
    config.teacher.update({"brief": True, "variants": ("recover", "lucky")})
    problems = "\n".join(SWE.check_config(config))
    assert "also a training one" in problems and "['lucky'] are not among" in problems
    assert "recover rerun the tests" in problems


def test_a_field_that_does_not_fit_its_stage_is_named_before_anything_runs():
    config = get_config("tiny")
    config.tasks = ConfigDict({**config.tasks.to_dict(), "sources": "opkit,toolz"})  # a string where a list belongs
    assert SWE.check_config(config) == ["tasks.sources: expected a list, got 'opkit,toolz' (write a list, not a "
                                    "comma-separated string)"]
    config = get_config("tiny")
    config.rl.sampler.name = "grpo"
    assert SWE.check_config(config) == ["rl.sampler.name: 'grpo' is not one of 'bar', 'fixed', 'dynamic'"]
    config = get_config("tiny")
    config.rl.unlock()
    config.rl.num_step = 3  # a typo
    assert "rl: unknown field(s) num_step" in SWE.check_config(config)[0]


def test_trained_policies_and_rl_compute_with_the_configs_model_settings(tmp_path):
    config = get_config("tiny")
    compute = {"dtype": "bfloat16", "param_dtype": "bfloat16", "attention_block": 64, "remat": "layer",
               "logits_chunk": 256}
    config.model.update(compute)
    settings = swe_config(config)
    assert {name: getattr(settings.rl, name) for name in compute} == compute  # RL builds its policy with these
    directory = str(tmp_path / "policy")
    save_pretrained(Transformer(ModelConfig.tiny(vocab_size=64), rngs=nnx.Rngs(0)), directory)  # float32, defaults
    model = trained_policy(settings, directory)
    assert {name: getattr(model.cfg, name) for name in compute} == compute
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {"bfloat16"}


def test_dry_run_checks_the_paper_config_and_launches_nothing(tmp_path):
    command = [sys.executable, "experiments/swe_bar/run.py", "--config=configs/swe_bar.py:qwen3_30b_a3b", "--dry-run",
               f"--workdir={tmp_path / 'run'}"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "config OK" in done.stdout and "group_size: 8" in done.stdout and "kind: vllm" in done.stdout
    assert not os.path.exists(tmp_path / "run")
    bad = subprocess.run([*command, "--config.rl.sampler.max_budget=4"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "max_budget >= group_size" in bad.stderr


@pytest.mark.slow
def test_the_main_job_end_to_end(orchestrator, tmp_path):
    workdir = tmp_path / "run"
    overrides = {"tasks.count": 8, "teacher.samples": 2, "tokenizer.train_vocab": 400, "sft.num_steps": 4,
                 "sft.eval_every": 4, "sft.log_every": 2, "sft.batch_size": 2, "rl.num_steps": 1,
                 "rl.prompts_per_step": 1, "rl.sampler.group_size": 2, "rl.sampler.max_budget": 4,
                 "rl.sampler.stride": 2, "rl.rows": 4, "rl.micro_rows": 4, "rl.rollout.max_turns": 2,
                 "rl.rollout.max_new_tokens": 16, "eval.samples": 2, "env.url": orchestrator.base_url,
                 "env.api_key": orchestrator.api_key}
    command = [sys.executable, "experiments/swe_bar/run.py", f"--workdir={workdir}",
               *(f"--config.{key}={value}" for key, value in overrides.items())]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Orchard-SWE" in done.stdout and "BAR rollouts per group" in done.stdout
    assert "held out helpers" in done.stdout and "…" not in done.stdout  # the whole table, though stdout is a pipe
    summary = json.loads((workdir / "summary.json").read_text())
    # 8 bugs in 7 helpers: ceil(7 x 0.14) = 1 helper (its one bug) held out, then 2 of the 7 others, then 5 by 1/5
    assert summary["tasks"] == {"sft": 4, "rl": 1, "held_out": 2, "held_out_helpers": 1}
    # Greedy at every stage; sampled (eval.samples a task) where RL starts, after SFT, and where it ends; over
    # each held-out set, in eval/<set>/bash/<stage>_<pass>.
    passes = {"init": {"greedy": 1}, "sft": {"greedy": 1, "sampled": 2}, "rl": {"greedy": 1, "sampled": 2}}
    assert summary["family"] == "swe" and set(summary["held_out"]) == {"held_out", "held_out_helpers"}
    for key, by_harness in summary["held_out"].items():
        held = summary["tasks"][key]
        assert {stage: set(results) for stage, results in by_harness["bash"].items()} == {
            stage: set(counts) for stage, counts in passes.items()}
        for stage, counts in passes.items():
            for name, per_task in counts.items():
                result, episodes_run = by_harness["bash"][stage][name], per_task * held
                assert result["episodes"] == episodes_run and 0.0 <= result["resolve_rate"] <= 1.0
                episodes = list(read_trajectories(episodes_path(eval_directory(str(workdir), key, "bash", stage, name))))
                assert len(episodes) == episodes_run
                assert sum(t.outcome.resolved for t in episodes) == pytest.approx(result["resolve_rate"] * episodes_run)
        change = summary["changes"][key]["bash"]["rl_vs_sft"]
        assert change == sampled_change(*(eval_directory(str(workdir), key, "bash", stage, "sampled")
                                          for stage in ("sft", "rl")))
        assert change["tasks_up"] + change["tasks_down"] <= held and 0.0 < change["sign_test_p"] <= 1.0
    assert summary["teacher"]["kept"] == 2 * summary["tasks"]["sft"]  # none for the RL tasks
    assert summary["teacher"]["resolved"] == summary["tasks"]["sft"]  # the clean variant resolves, fail does not
    [step] = summary["rl_metrics"].values()
    assert 2 <= step["rollouts_per_group"] <= 4 and "informative_groups" in step
    for path in ("held_out.png", "config.json", "sft/model/config.json", "rl/model/tokenizer.json",
                 "rl/metrics.jsonl", "rl/stage.json", "eval/held_out/bash/rl_sampled/stage.json"):
        assert (workdir / path).exists(), path
    assert json.loads((workdir / "config.json").read_text())["rl"]["num_steps"] == 1
    # A second run over the same workdir finds every stage done and reports the same numbers.
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    again_summary = json.loads((workdir / "summary.json").read_text())
    assert again_summary["held_out"] == summary["held_out"]
    # A changed setting stops the run at the stage it changes, naming it; --rerun redoes that stage and the later ones.
    # (A setting of the sampler's, not one compiled into the training step: the rerun reuses the compiled programs.)
    changed = [*command, "--config.rl.sampler.rho_max=0.8"]
    stale = subprocess.run(changed, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert stale.returncode == 1 and "stage 'rl'" in stale.stderr and "sampler.rho_max: 0.75 -> 0.8" in stale.stderr
    # The rerun also changes the rollouts' temperature: the sampled evaluations rerun, the greedy ones do not.
    kept = {path: (workdir / path / "stage.json").read_text()
            for path in ("sft", "eval/held_out/bash/init_greedy", "eval/held_out/bash/sft_greedy")}
    redone = subprocess.run([*changed, "--config.rl.rollout.temperature=0.9", "--rerun"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert redone.returncode == 0, redone.stderr[-3000:]
    for path, record in kept.items():  # SFT and the greedy evaluations were not touched
        assert (workdir / path / "stage.json").read_text() == record, path
    assert json.loads((workdir / "rl" / "stage.json").read_text())["config"]["sampler"]["rho_max"] == 0.8
    sampled = json.loads((workdir / "eval/held_out/bash/sft_sampled/stage.json").read_text())
    assert sampled["config"]["rollout"]["temperature"] == 0.9
    # RL from a saved policy, without SFT: the sampled pass and RL's change start at init.
    start, policy = tmp_path / "from_policy", str(workdir / "sft" / "model")
    no_sft = {**overrides, "teacher.samples": 0, "sft.num_steps": 0, "model.path": policy, "tokenizer.path": policy}
    done = subprocess.run([sys.executable, "experiments/swe_bar/run.py", f"--workdir={start}",
                           *(f"--config.{key}={value}" for key, value in no_sft.items())],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((start / "summary.json").read_text())
    for key in ("held_out", "held_out_helpers"):
        assert {stage: set(results) for stage, results in summary["held_out"][key]["bash"].items()} == {
            "init": {"greedy", "sampled"}, "rl": {"greedy", "sampled"}}
        assert summary["changes"][key]["bash"] == {"rl_vs_init": sampled_change(
            *(eval_directory(str(start), key, "bash", stage, "sampled") for stage in ("init", "rl")))}


def test_localisation_rates_say_how_far_episodes_got():
    from orchard.data.trajectory import Message
    from orchard.recipes.swe import localisation_rates

    instance = SWEInstance(instance_id="kit__bug-1", repo="procedural/kit", base_commit="c", problem_statement="",
                           FAIL_TO_PASS=("tests/test_ropes.py::test_score_broth",),
                           metadata={"path": "kit/ropes.py", "function": "RopeOps.score_broth"})

    def episode(*commands: str) -> Trajectory:
        return Trajectory(task_id=instance.instance_id, messages=[
            Message(role="user", content="fix tests/test_ropes.py"),
            *(Message(role="assistant", content=f"THOUGHT: go\n```bash\n{c}\n```") for c in commands)],
                          outcome=Outcome(reward=-1.0, resolved=False))

    rates = localisation_rates([
        episode("python -m pytest -q tests/test_ropes.py::test_score_broth", "nl -ba kit/ropes.py"),  # all three
        episode("python -m pytest -q tests/test_mosss.py::test_mend_gasket", "grep -rn 'def score_broth' ."),
        episode("ls")], {instance.instance_id: instance})
    assert rates == {"first_action_names_failing_test": 1 / 3, "names_buggy_file": 1 / 3,
                     "names_buggy_function": 2 / 3}


def test_the_copy_probe_renames_resolved_generated_runs_past_sfts_copies(tmp_path):
    """The probe scores renamed copies (copy index sft.examples.renamings, which no SFT row holds) of resolved runs
    on generated repositories only, and finds the new names' pieces among their copyable action tokens."""
    from orchard.data.tokenizer import Tokenizer
    from orchard.data.trajectory import Message
    from orchard.recipes.stages import copy_probe
    from orchard.recipes.swe import probe_pairs
    from orchard.tasks.swe.procedural import repository_nouns
    from orchard.tasks.swe.skills import procedural_specs
    from orchard.workdir import read_json

    config = get_config("skills")
    config.sft.examples.renamings = 3
    settings = swe_config(config)
    spec = procedural_specs(settings.tasks.procedural, settings.seed)["train"][0]
    nouns = repository_nouns(spec)
    helper, test = f"fold_{nouns[0]}", f"tests/test_{nouns[1]}s.py"

    def run(task_id: str, resolved: bool) -> Trajectory:
        return Trajectory(task_id=task_id, outcome=Outcome(reward=1.0 if resolved else -1.0, resolved=resolved),
                          messages=[Message(role="user", content=f"Fix `{helper}`: {test} fails"),
                                    Message(role="assistant", content=f"```bash\ngrep -rn 'def {helper}' src\n```"),
                                    Message(role="user", content=f"src/{spec.name}/x.py:3:def {helper}(a):"),
                                    Message(role="assistant", content=f"```bash\nsed -n 3p src/{spec.name}/x.py\n```")])

    runs = [run(f"{spec.name}__swap_operator-1", True), run(f"{spec.name}__off_by_one-2", False),
            run("opkit__swap_operator-3", True)]  # an unresolved run and a shipped repository's: not probed
    tokenizer = Tokenizer.train(["\n".join(m.content for m in r.messages) for r in runs] * 4, 400)
    directory = str(tmp_path / "policy")
    save_pretrained(Transformer(ModelConfig.tiny(vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0)), directory)
    tokenizer.save_pretrained(directory)
    pairs = probe_pairs(settings, runs)
    assert [run.id for run, _ in pairs] == [runs[0].id] and pairs[0][1].id == f"{runs[0].id}-renamed3"
    probe = copy_probe(settings, settings.examples, str(tmp_path), directory, pairs, tokenizer)
    assert read_json(str(tmp_path / "sft" / "copy_probe.json")) == probe.to_dict()
    assert probe.counts["actions"] > probe.counts["copyable"] >= probe.counts["novel"] > 0
    assert all(0.0 <= value <= 1.0 for value in (probe.actions, probe.copyable, probe.novel))
