"""A learner over several processes: the settings it reads, and two real learner processes (JAX's CPU
collectives over gloo) that train SFT, GRPO and RL as one process does, and resume exactly after both are
killed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from orchard import distributed
from orchard.distributed import ProcessGroup
from orchard.env.local import free_port
from orchard.models.sharding import make_mesh
from orchard.train.metrics import read_metrics
from orchard.train.state import batch_sharding
from tests.conftest import xla_at_o0

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_process_group_comes_from_explicit_settings_or_an_indexed_job():
    assert ProcessGroup.from_env({}) is None  # one process: nothing to join
    explicit = {"JAX_COORDINATOR_ADDRESS": "learner-0.learner:8476", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "2"}
    assert ProcessGroup.from_env(explicit) == ProcessGroup("learner-0.learner:8476", 4, 2)
    indexed = {"JAX_COORDINATOR_ADDRESS": "learner-0.learner:8476", "JAX_NUM_PROCESSES": "4",
               "JOB_COMPLETION_INDEX": "3"}
    assert ProcessGroup.from_env(indexed).process_id == 3  # a JobSet pod's index is its process id
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES"):
        ProcessGroup.from_env({"JAX_COORDINATOR_ADDRESS": "learner-0:8476", "JAX_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="JOB_COMPLETION_INDEX"):
        ProcessGroup.from_env({"JAX_COORDINATOR_ADDRESS": "learner-0:8476", "JAX_NUM_PROCESSES": "2"})
    with pytest.raises(ValueError, match="not below the process count"):
        ProcessGroup.from_env({**explicit, "JAX_PROCESS_ID": "4"})
    with pytest.raises(ValueError, match="host:port"):
        ProcessGroup.from_env({**explicit, "JAX_COORDINATOR_ADDRESS": "learner-0"})


def test_a_tpu_slice_is_detected_only_with_several_hosts():
    assert distributed.detected_tpu_slice({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3"})
    assert not distributed.detected_tpu_slice({"TPU_WORKER_HOSTNAMES": "t-0"})
    assert not distributed.detected_tpu_slice({})


def test_on_one_process_the_operations_are_the_plain_ones():
    mesh = make_mesh(4, 2)
    sharding = batch_sharding(mesh)
    batch = np.arange(2 * 8 * 3, dtype=np.int32).reshape(2, 8, 3)
    placed = distributed.global_array(batch, sharding)
    assert placed.sharding == sharding and np.array_equal(distributed.host_array(placed), batch)
    assert distributed.local_block(sharding, batch.shape) == (slice(0, 2), slice(0, 8), slice(0, 3))
    assert distributed.broadcast({"rows": [1, 2]}) == {"rows": [1, 2]}
    assert distributed.is_controller() and not distributed.is_multiprocess()
    distributed.initialize({})  # nothing to join: a no-op
    assert jax.process_count() == 1


def _start(workdir: str, processes: int, extra_env: dict[str, str] | None = None) -> list:
    """Start tests/distributed_learner.py as ``processes`` processes over 4 CPU devices in all, at LLVM -O0: each
    compiles three sharded steps and runs them a few times on a tiny model, so compiling is nearly all its work."""
    env = {**xla_at_o0(), **(extra_env or {})}
    if processes > 1:
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{free_port()}", JAX_NUM_PROCESSES=str(processes))
    running = []
    for index in range(processes):
        log = open(os.path.join(os.path.dirname(workdir), f"{os.path.basename(workdir)}-{index}.log"), "a")  # noqa: SIM115
        running.append((subprocess.Popen(
            [sys.executable, "-m", "tests.distributed_learner", workdir, str(4 // processes)], cwd=ROOT,
            env={**env, "JAX_PROCESS_ID": str(index)}, stdout=log, stderr=subprocess.STDOUT), log))
    return running


def _wait(running: list) -> list[int]:
    """The exit codes of the processes :func:`_start` started."""
    codes = []
    for process, log in running:
        try:
            codes.append(process.wait(timeout=600))
        finally:
            process.kill()
            log.close()
    return codes


def _log(workdir: str) -> str:
    """The end of the controller's log (for a failed run's message)."""
    with open(f"{workdir}-0.log") as handle:
        return handle.read()[-3000:]


def _tensors(path: str) -> dict[str, np.ndarray]:
    return load_file(os.path.join(path, "model.safetensors"))


@pytest.mark.slow
def test_two_learner_processes_train_as_one_and_resume_exactly_after_both_are_killed(orchestrator, random_policy,
                                                                                     tmp_path):
    """SFT, GRPO updates and ``train_rl`` (as a recipe runs it: the controller's episodes in real sandboxes,
    sampled from ``orchard serve`` and synced to it by disk) on a learner of two processes, killed mid-SFT
    and restarted, against the same on one process."""
    from tests.conftest import start_model_server

    single, killed = str(tmp_path / "single"), str(tmp_path / "two")
    env = {"ORCHESTRATOR_URL": orchestrator.base_url, "ORCHESTRATOR_KEY": orchestrator.api_key,
           "SERVED_DIR": random_policy}
    # Each learner has a server of its own (RL syncs its weights into it), so the one-process reference runs
    # beside the two processes that die right after SFT step 5 (the last checkpoint is step 4's) and beside
    # their restart (whose RL's first sync serves the initial weights again).
    for server in start_model_server(random_policy, str(tmp_path / "serve-single.log")):
        for second in start_model_server(random_policy, str(tmp_path / "serve-two.log")):
            reference = _start(single, 1, {**env, "SERVER_URL": server.url})
            assert _wait(_start(killed, 2, {**env, "SERVER_URL": second.url, "DIE_AFTER_STEP": "5"})) == [-9, -9]
            assert sorted(map(int, os.listdir(os.path.join(killed, "sft", "checkpoints"))))[-1] == 4
            restarted = _start(killed, 2, {**env, "SERVER_URL": second.url})
            assert _wait(reference) == [0], _log(single)
            assert _wait(restarted) == [0, 0], _log(killed)

    # SFT: every step's loss, the eval loss and the exported model equal the one-process run's, bit for bit.
    expected, resumed = read_metrics(os.path.join(single, "sft")), read_metrics(os.path.join(killed, "sft"))
    assert sorted(resumed) == sorted(expected) == list(range(1, 9))
    for step in expected:
        for name in ("loss", "grad_norm", "lr", "tokens", "eval_loss"):
            assert resumed[step].get(name) == expected[step].get(name), (step, name)
    for directory in ("sft/model", "grpo/model", "served/v3"):
        reference, spread = _tensors(os.path.join(single, directory)), _tensors(os.path.join(killed, directory))
        assert sorted(reference) == sorted(spread)
        assert all(np.array_equal(reference[name], spread[name]) for name in reference), directory
    # GRPO: the controller's rollouts trained both processes' shards: the same losses, the same weights served.
    with open(os.path.join(single, "grpo", "metrics.json")) as one, open(os.path.join(killed, "grpo", "metrics.json")) as two:
        assert json.load(one) == json.load(two)
    # Only the controller wrote: one metrics line per logged step (5 before the kill, 5..8 after the restart).
    with open(os.path.join(killed, "sft", "metrics.jsonl")) as handle:
        assert len(handle.readlines()) == 5 + 4
    assert sorted(os.listdir(os.path.join(killed, "served"))) == ["v1", "v2", "v3"]

    # RL: the same rollouts (rewards, tokens), losses and final weights; not bit for bit, as the server batches
    # the episodes' requests as they arrive, so the logprobs it returns differ between runs at float rounding.
    one, two = (read_metrics(os.path.join(run, "rl")) for run in (single, killed))
    assert sorted(one) == sorted(two) == [1, 2]  # the rollout budget (4) was spent at step 2 of 5, on every process
    assert one[2]["rollouts_total"] == two[2]["rollouts_total"] == 4
    for step in one:
        assert one[step]["informative_groups"] == 1.0 and one[step]["trained_tokens"] > 0, one[step]
        assert two[step]["reward"] == one[step]["reward"] and two[step]["trained_tokens"] == one[step]["trained_tokens"]
        for name in ("loss", "grad_norm"):
            assert two[step][name] == pytest.approx(one[step][name], rel=1e-4, abs=1e-6), (step, name)
    reference, spread = (_tensors(os.path.join(run, "rl", "model")) for run in (single, killed))
    for name in reference:
        np.testing.assert_allclose(spread[name], reference[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert {"v1", "v2"} <= set(os.listdir(os.path.join(killed, "weights")))  # each update was served
    assert "Unclosed" not in _log(single)  # RL closed the engine's connection pools
