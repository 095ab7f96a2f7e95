"""One learner process of tests/test_distributed.py: SFT, then GRPO updates, over this process's CPU devices.

Run as ``python -m tests.distributed_learner <workdir> <local devices>`` with, for a learner over several
processes, ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` set. With
``DIE_AFTER_STEP=n`` every process kills itself (SIGKILL) right after SFT step ``n``, as a preempted job's
processes die.

The controller calls the SFT trainer and the others follow it in (as a recipe's main runs them). SFT
trains the small model of tests/train/test_sft.py on a mesh of fsdp 2 x tp 2 (four devices, over
however many processes), so both the data-parallel and the tensor-parallel axes cross processes. GRPO
runs three updates of :class:`~orchard.train.rl.Learner` on rollouts the controller alone holds (as its
episodes would give it), recorded the way the proxy records an external harness's calls; each update's
weight sync exports the weights (the controller writes ``served/v<version>``). Then, with ``SERVER_URL``
set, the RL trainer itself, with episodes in real sandboxes and a real server (:func:`rl`).
"""

from __future__ import annotations

import os
import signal
import sys


def main(workdir: str, local_devices: int) -> None:
    # This process's device count, with the LLVM flags it was started with kept (tests/test_distributed.py: -O0);
    # not the suite's choice of XLA's older emitter, whose fusions reduce in another order in one process than in two.
    kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
            if "device_count" not in flag and "fusion_emitters" not in flag]
    os.environ["XLA_FLAGS"] = " ".join([*kept, f"--xla_force_host_platform_device_count={local_devices}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    from orchard import distributed

    distributed.initialize()

    import jax
    from flax import nnx

    from benchmarks.sft import write_examples
    from orchard.config import from_config
    from orchard.data.trajectory import Message, Trajectory
    from orchard.models import ModelConfig, Transformer
    from orchard.models.sharding import MeshConfig
    from orchard.models.weights import ModelWeights
    from orchard.train import checkpoint, sft
    from orchard.train.bar import GroupResult
    from orchard.train.follow import follow_controller
    from orchard.train.grpo import make_policy_loss
    from orchard.train.rl import Learner, RLConfig, ScoredRollout
    from orchard.train.state import OptimConfig, init_state, make_optimizer, make_train_step
    from orchard.workdir import write_json

    small = {"model_type": "qwen3", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
             "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "qk_norm": True, "tie_word_embeddings": False,
             "max_position_embeddings": 512}
    mesh = {"fsdp": 2, "tp": 2}
    if die_after := int(os.environ.get("DIE_AFTER_STEP", "0")):
        save = checkpoint.Checkpointer.save

        def save_then_die(self, step, *args, **kwargs):
            saved = save(self, step, *args, **kwargs)
            if step == die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return saved

        checkpoint.Checkpointer.save = save_then_die

    # Every process writes the same example files (the same bytes), as every host would read them from storage.
    data = os.path.join(workdir, f"data-{jax.process_index()}")
    os.makedirs(data, exist_ok=True)
    examples = write_examples(os.path.join(data, "train.jsonl"), 96, vocab_size=256)
    held_out = write_examples(os.path.join(data, "eval.jsonl"), 16, vocab_size=256, seed=1)
    config = from_config(sft.SFTConfig, {"num_steps": 8, "log_every": 1, "eval_every": 4, "checkpoint_every": 2,
                                         "seq_len": 64, "batch_size": 4, "grad_accum": 2, "mesh": mesh,
                                         "model": {"init": small}, "optim": {"peak_lr": 1e-2, "warmup_steps": 2}})
    if distributed.is_controller():  # it leads the others into the training (as a recipe's main does)
        sft.train_and_evaluate(config, os.path.join(workdir, "sft"), examples=examples, eval_examples=held_out,
                               inputs={"examples": "synthetic"})
        distributed.release()
    else:
        follow_controller()

    grpo = RLConfig(seq_len=64, rows=8, micro_rows=4)
    model = Transformer(ModelConfig(**small, dtype="float32"), rngs=nnx.Rngs(3))
    optimizer, schedule = make_optimizer(OptimConfig(1e-2, 1e-3, 1), 3)
    graphdef, state = init_state(model, optimizer, MeshConfig(**mesh).make())

    class Exporter:
        """The controller's engine: each sync exports the weights as a server would reload them."""

        def update_weights(self, weights: ModelWeights) -> None:
            weights.save_pretrained(os.path.join(workdir, "served", f"v{weights.version}"))

    def rollout(task: int, sample: int, update: int) -> ScoredRollout:
        """A rollout recorded through the proxy: one call, its prompt and its sampled ids and logprobs."""
        prompt = [(7 * task + i) % 256 for i in range(5 + task)]
        sampled = [(11 * sample + 3 * update + i) % 256 for i in range(4 + sample)]
        trajectory = Trajectory(task_id=f"t{task}", messages=[
            Message(role="user", content="do it"),
            Message(role="assistant", token_ids=sampled, logprobs=[-1.5] * len(sampled))],
            metadata={"recorded_prompt_ids": [prompt]})
        return ScoredRollout(trajectory, float(sample == 0), "completed", len(sampled))


    step = make_train_step(graphdef, optimizer, schedule, loss_fn=make_policy_loss())
    learner = Learner(graphdef, lambda grid: step, MeshConfig(**mesh).make(), Exporter(), None, grpo)
    losses = []
    for update in range(3):
        groups = [GroupResult([rollout(task, sample, update) for sample in range(2)], spent=2)
                  for task in range(3)] if distributed.is_controller() else []
        state, metrics = learner.update(state, groups)
        losses.append(metrics)
    ModelWeights(graphdef, state.params).save_pretrained(os.path.join(workdir, "grpo", "model"))
    if distributed.is_controller():
        write_json(os.path.join(workdir, "grpo", "metrics.json"), losses)
    if "SERVER_URL" in os.environ:
        rl(workdir)


def rl(workdir: str) -> None:
    """``train_rl`` as a recipe runs it, to its rollout budget (two steps): the controller runs the episodes in the orchestrator at
    ``ORCHESTRATOR_URL`` (key ``ORCHESTRATOR_KEY``) with the policy served by ``orchard serve`` at
    ``SERVER_URL`` (its model: ``SERVED_DIR``, also the policy RL starts from), syncs the server by disk
    through ``<workdir>/weights``, and leads the others into the training."""
    import asyncio
    import shutil

    from orchard import distributed
    from orchard.config import from_config
    from orchard.data.trajectory import Outcome
    from orchard.env import AsyncSandboxClient
    from orchard.harness.bash import BashHarness
    from orchard.harness.task import FunctionTask
    from orchard.train.follow import follow_controller
    from orchard.train.rl import RLConfig, train_rl

    if not distributed.is_controller():
        follow_controller()
        return
    served = os.environ["SERVED_DIR"]
    weights = os.path.join(workdir, "weights")  # the server reloads each version from here
    os.makedirs(weights, exist_ok=True)
    for name in os.listdir(served):
        if not name.endswith(".safetensors") and os.path.isfile(os.path.join(served, name)):
            shutil.copy(os.path.join(served, name), weights)
    config = from_config(RLConfig, {
        # five steps at most, but a budget of 4 rollouts (2 a step) ends it after two: the followers stop too
        "num_steps": 5, "rollout_budget": 4, "checkpoint_every": 1, "prompts_per_step": 1, "seq_len": 640, "rows": 4, "micro_rows": 2,
        "chat_format": "smollm2", "mesh": {"fsdp": 2, "tp": 2}, "optim": {"peak_lr": 1e-3, "warmup_steps": 1},
        "sampler": {"name": "fixed", "group_size": 2},
        "rollout": {"max_turns": 1, "max_new_tokens": 16, "concurrency": 2, "episode_seconds": 120},
        "engine": {"kind": "openai", "url": os.environ["SERVER_URL"], "served_model": served, "weights_dir": weights}})

    async def grade(_, trajectory):  # sample 0 wins: every group has variance
        return Outcome(reward=1.0 if trajectory.metadata["sample"] == 0 else -1.0)

    async def run() -> None:
        async with AsyncSandboxClient(os.environ["ORCHESTRATOR_URL"], os.environ["ORCHESTRATOR_KEY"]) as client:
            await train_rl(config, os.path.join(workdir, "rl"), client, [FunctionTask("hello", "Say hi.", grade_fn=grade)],
                           BashHarness(), policy=served, inputs={"policy": "tiny"})

    try:
        asyncio.run(run())
    finally:
        distributed.release()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
