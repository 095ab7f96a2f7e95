"""The memory plan of a stage (orchard.train.plan) against real models and meshes, and ``--dry-run``."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import jax
from flax import nnx

from orchard.models.build import ModelSpec, build_model
from orchard.models.config import ModelConfig
from orchard.models.sharding import MeshConfig, shard_bytes
from orchard.train.plan import plan_stage
from orchard.train.state import OptimConfig

ROOT = Path(__file__).resolve().parents[2]
MOE = {"model_type": "qwen3_moe", "vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
       "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2,
       "moe_intermediate_size": 16, "qk_norm": True}


def test_parameter_count_is_the_built_models():
    spec = ModelSpec(init=ModelConfig.preset_fields("tiny"))
    plan = plan_stage("sft", spec, MeshConfig(), OptimConfig(), rows=2, seq_len=64, vocab_size=300)
    model = build_model(spec, 0, 300)
    assert plan.parameters == sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert plan.problems == () and plan.fits


def test_bytes_per_device_are_the_real_shards_bytes():
    """On a mesh the 8 CPU devices can build, the planned parameter bytes a device are the largest shards'."""
    spec = ModelSpec(init=MOE)
    for mesh in (MeshConfig(2, 2, 2), MeshConfig(4, 2, 1), MeshConfig(1, 1, 4)):
        plan = plan_stage("sft", spec, mesh, OptimConfig(), rows=4, seq_len=16)
        model = build_model(spec, 0, mesh=mesh.make())
        real = sum(shard_bytes(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert plan.param_bytes == real, mesh
        assert plan.gradient_bytes == 2 * real
        assert 2 * real <= plan.optimizer_bytes <= 2 * real + 64  # AdamW's two moments (+ its step counts)


def test_what_does_not_divide_is_reported():
    spec = ModelSpec(init=MOE)
    plan = plan_stage("rl", spec, MeshConfig(2, 4, 3), OptimConfig(), rows=3, seq_len=16)
    assert any("do not divide over fsdp 2" in p for p in plan.problems)
    assert any("ep 3 does not divide the model's 4 experts" in p for p in plan.problems)
    # the 4 experts over ep 3 stay whole on every device: listed with their bytes
    experts = [r for r in plan.replicated if r.axes == ("experts",)]
    assert len(experts) == 6 and all(r.device_bytes > 0 for r in experts)
    assert "replicated (a mesh axis does not divide them): 6 parameters" in plan.table()
    dense = plan_stage("rl", ModelSpec(init=ModelConfig.preset_fields("tiny")), MeshConfig(1, 1, 2), OptimConfig(),
                       rows=2, seq_len=16, vocab_size=64)
    assert any("has no experts" in p for p in dense.problems)


def test_a_stage_too_large_for_its_device_fails():
    spec = ModelSpec(init=ModelConfig.preset_fields("qwen3_30b_a3b"), dtype="bfloat16", remat="layer")
    plan = plan_stage("sft", spec, MeshConfig(16, 2, 4, "tpu-v5e"), OptimConfig(), rows=16, seq_len=65536)
    assert abs(plan.parameters - 30.53e9) < 0.01e9  # Qwen3-30B-A3B's 30.5B
    assert not plan.fits and any("does not fit a tpu-v5e" in p for p in plan.problems)
    short = plan_stage("sft", spec, MeshConfig(16, 2, 4, "tpu-v5e"), OptimConfig(), rows=16, seq_len=4096)
    assert short.fits and short.problems == ()


def dry_run(script: str, config: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, f"--config={config}", "--dry-run", f"--workdir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dry_run_of_the_swe_chain_prints_plans_and_checks_the_chain(tmp_path):
    sft = dry_run("experiments/swe_credit_sft/run.py", "configs/swe_sft.py:qwen3_30b_a3b", tmp_path)
    bar = dry_run("experiments/swe_bar/run.py", "configs/swe_bar.py:qwen3_30b_a3b", tmp_path)
    for done, stage in ((sft, "[sft]"), (bar, "[rl]")):
        assert f"{stage} mesh fsdp 16 x tp 2 x ep 2 = 64 devices of tpu-v5p (95 GiB)" in done.stdout, done.stderr
        assert "30.532B parameters" in done.stdout
        # 64K-token rows, one a device, fit a v5p's 95 GiB by this estimate (a v5e's 16 GiB would not:
        # test_a_stage_too_large_for_its_device_fails).
        assert done.returncode == 0 and "of 95 GiB: fits" in done.stdout, done.stderr
    assert "chain: configs/swe_sft.py:qwen3_30b_a3b exports its final model to 'checkpoints/qwen3_30b_a3b_sft'" in (
        bar.stdout)
    broken = subprocess.run([sys.executable, "experiments/swe_bar/run.py", "--config=configs/swe_bar.py:qwen3_30b_a3b",
                             "--dry-run", "--config.model.path=elsewhere", f"--workdir={tmp_path / 'run'}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "model.path 'elsewhere' is not where configs/swe_sft.py:qwen3_30b_a3b exports" in broken.stderr
    assert not (tmp_path / "run").exists()


def test_dry_run_of_the_gui_variant_plans_both_stages(tmp_path):
    done = dry_run("experiments/gui_grpo/run.py", "configs/gui_grpo.py:qwen3vl_4b", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "[sft] mesh fsdp 32 x tp 2 x ep 1 = 64 devices of tpu-v5p" in done.stdout and "[rl] mesh" in done.stdout
    assert "of 95 GiB: fits" in done.stdout
    assert "4.438B parameters" in done.stdout and "config OK" in done.stdout
