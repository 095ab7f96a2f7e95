"""The shared training step: frozen parameters (a VLM's vision tower and mergers) do not move; bfloat16
parameters train through a float32 master copy in the optimizer state."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from orchard.models import ModelConfig, Transformer, VisionLanguageModel, VLMConfig
from orchard.models.pixels import ImageProcessing, patchify
from orchard.models.sharding import make_mesh
from orchard.models.vlm import vision_inputs
from orchard.train.checkpoint import Checkpointer
from orchard.train.state import (
    OptimConfig,
    TrainState,
    frozen_labels,
    init_state,
    make_optimizer,
    make_train_step,
    master_weights,
    target_logprobs,
)

CFG = VLMConfig.tiny(vocab_size=32, image_token_id=29, vision_start_token_id=30, vision_end_token_id=31,
                     vision={"patch_size": 4, "num_position_embeddings": 16})


def _flat(params) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path, simple=True, separator="."): np.asarray(value)
            for path, value in jax.tree_util.tree_leaves_with_path(params)}


def _text_loss(graphdef, params, batch):
    """A text model's summed next-token loss and its token count (the train step's loss function)."""
    logits = nnx.merge(graphdef, params)(batch["tokens"])
    nll = -target_logprobs(logits[:, :-1].astype(jnp.float32), batch["tokens"][:, 1:])
    return jnp.sum(nll), jnp.asarray(nll.size, jnp.float32)


def _train_one_step(frozen: tuple[str, ...]) -> tuple[dict, dict]:
    model = VisionLanguageModel(CFG, rngs=nnx.Rngs(0))
    image = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    patches, grid = patchify(image, CFG.vision, ImageProcessing(min_pixels=64))
    tokens = np.asarray([[1, 2, 30, 29, 29, 29, 29, 31, 3, 4]], np.int32)
    positions, images, _ = vision_inputs(tokens, [[(patches, grid)]], CFG)

    def loss_fn(graphdef, params, batch):
        logits = nnx.merge(graphdef, params)(batch["tokens"], batch["positions"], images=images)
        nll = -target_logprobs(logits[:, :-1], batch["tokens"][:, 1:])
        return jnp.sum(nll), jnp.asarray(nll.size, jnp.float32)

    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-2, warmup_steps=1, weight_decay=0.1,
                                                     frozen=frozen), total_steps=4)
    graphdef, state = init_state(model, optimizer, make_mesh())
    before = _flat(state.params)
    step = make_train_step(graphdef, optimizer, schedule, loss_fn)
    state, _ = step(state, {"tokens": jnp.asarray(tokens)[None], "positions": jnp.asarray(positions)[None]})
    return before, _flat(state.params)


@pytest.mark.parametrize("frozen", [(), ("model.visual",)])
def test_frozen_parameters_do_not_move_and_the_rest_trains(frozen):
    before, after = _train_one_step(frozen)
    moved = {name for name in before if not np.array_equal(before[name], after[name])}
    vision = {name for name in before if name.startswith("model.visual.")}
    assert vision and moved - vision, "the language model must train"
    if frozen:
        assert not moved & vision
    else:  # without freezing, the image reaches the tower's every part (DeepStack mergers included)
        assert vision <= moved


def test_a_frozen_prefix_that_names_nothing_is_an_error():
    params = nnx.state(VisionLanguageModel(CFG, rngs=nnx.Rngs(0)), nnx.Param)
    labels = frozen_labels(params, ("model.visual.merger",))
    assert set(jax.tree.leaves(labels)) == {"frozen", "trained"}
    with pytest.raises(ValueError, match="match no parameter"):
        frozen_labels(params, ("model.vision",))


def _quadratic_run(param_dtype: jnp.dtype, master_dtype: str, steps: int = 50) -> tuple[dict, list]:
    """``steps`` AdamW steps at a constant 1e-3 pulling weights near 1.5 towards 0: each step is below half
    of bfloat16's spacing there (2**-8), 50 of them are not. The parameters, and the master after each step."""
    params = {"w": jnp.linspace(1.25, 1.75, 16).astype(param_dtype).reshape(4, 4),
              "b": jnp.full((3,), 1.5, param_dtype)}
    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-3, final_lr=1e-3, warmup_steps=1,
                                                     weight_decay=0.01, master_dtype=master_dtype), steps)

    def loss_fn(graphdef, params, batch):
        return sum(jnp.sum(jnp.square(p.astype(jnp.float32))) for p in jax.tree.leaves(params)), jnp.ones(())

    step = make_train_step(None, optimizer, schedule, loss_fn)
    state, masters = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params)), []
    for _ in range(steps):
        state, _ = step(state, {"x": jnp.zeros((1, 1))})
        master = master_weights(state.opt_state)
        masters.append(None if master is None else jax.tree.map(np.asarray, master.master))
        if master is not None and param_dtype != jnp.float32:  # the parameters: the master rounded, exactly
            for name in params:
                assert master.master[name].dtype == jnp.float32
                np.testing.assert_array_equal(np.asarray(state.params[name]),
                                              np.asarray(master.master[name].astype(param_dtype)))
    return jax.tree.map(np.asarray, state.params), masters


def test_bfloat16_parameters_train_through_a_float32_master_copy():
    start = {"w": np.asarray(jnp.linspace(1.25, 1.75, 16).astype(jnp.bfloat16).reshape(4, 4)),
             "b": np.full((3,), 1.5, jnp.bfloat16)}
    plain, _ = _quadratic_run(jnp.bfloat16, "")
    for name in start:  # the failure mode: every bfloat16 step rounds back to where it was
        np.testing.assert_array_equal(plain[name], start[name])
    mixed, masters = _quadratic_run(jnp.bfloat16, "float32")
    for name in start:
        assert mixed[name].dtype == jnp.bfloat16
        assert np.all(mixed[name].astype(np.float32) < start[name].astype(np.float32) - 0.02)
        # about 50 steps of 1e-3 (Adam's steps are about the learning rate), in float32
        moved = start[name].astype(np.float32) - masters[-1][name]
        np.testing.assert_allclose(moved, 0.05, rtol=0.1)


def test_float32_parameters_train_the_same_with_or_without_a_master():
    plain, _ = _quadratic_run(jnp.float32, "", steps=10)
    mixed, masters = _quadratic_run(jnp.float32, "float32", steps=10)
    for name in plain:
        np.testing.assert_allclose(mixed[name], plain[name], rtol=0, atol=1e-6)
    # parameters already in float32 are their own master: no second copy
    assert not jax.tree.leaves(masters[-1])


def test_a_master_copy_matches_plain_float32_training_of_the_same_weights():
    """The master's trajectory is float32 AdamW's on the same loss (its gradients taken at the rounded weights)."""
    params = {"w": jnp.linspace(-1.0, 1.0, 8).astype(jnp.bfloat16).astype(jnp.float32)}  # exact in bfloat16
    optimizer, _ = make_optimizer(OptimConfig(peak_lr=1e-3, final_lr=1e-3, warmup_steps=1, master_dtype="float32"), 5)
    reference, _ = make_optimizer(OptimConfig(peak_lr=1e-3, final_lr=1e-3, warmup_steps=1), 5)
    low = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
    state, ref_state, ref = optimizer.init(low), reference.init(params), params
    for i in range(5):
        grads = {"w": jnp.full((8,), 0.1 * (i + 1), jnp.bfloat16)}
        updates, state = optimizer.update(grads, state, low)
        low = optax.apply_updates(low, updates)
        ref_updates, ref_state = reference.update(jax.tree.map(lambda g: g.astype(jnp.float32), grads), ref_state, ref)
        ref = optax.apply_updates(ref, ref_updates)
        np.testing.assert_allclose(np.asarray(state.master["w"]), np.asarray(ref["w"]), rtol=0, atol=1e-7)
        # without make_train_step, optax.apply_updates also lands on the rounded master
        np.testing.assert_array_equal(np.asarray(low["w"]), np.asarray(state.master["w"].astype(jnp.bfloat16)))


def _tiny_vlm(param_dtype: str) -> VisionLanguageModel:
    dtypes = {"param_dtype": param_dtype}
    cfg = VLMConfig.tiny(vocab_size=32, image_token_id=29, vision_start_token_id=30, vision_end_token_id=31,
                         text=dtypes, vision={"patch_size": 4, "num_position_embeddings": 16, **dtypes})
    return VisionLanguageModel(cfg, rngs=nnx.Rngs(0))


def test_frozen_parameters_get_no_master_copy_and_no_update(tmp_path):
    model = _tiny_vlm("bfloat16")
    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-2, warmup_steps=1, weight_decay=0.1,
                                                     frozen=("model.visual",), master_dtype="float32"), 4)
    graphdef, state = init_state(model, optimizer, make_mesh())
    master = master_weights(state.opt_state).master
    names = set(_flat(state.params))
    vision = {name for name in names if name.startswith("model.visual.")}
    kept = set(_flat(master))
    assert vision and kept == names - vision, "a master copy of each trained parameter, none of the frozen"
    assert all(value.dtype == np.float32 for value in _flat(master).values())
    # the vision tower is not doubled: the optimizer state's float32 arrays are the trained parameters' 3 copies
    trained_elements = sum(v.size for n, v in _flat(state.params).items() if n not in vision)
    state_elements = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert state_elements == 3 * trained_elements  # master, mu and nu

    before = _flat(state.params)
    state, _ = make_train_step(graphdef, optimizer, schedule, _text_loss)(
        state, {"tokens": jnp.asarray([[[1, 2, 3, 4, 5, 6]]], jnp.int32)})
    after = _flat(state.params)
    assert all(np.array_equal(before[name], after[name]) for name in vision)
    assert any(not np.array_equal(before[name], after[name]) for name in names - vision)
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), every=1)  # the masked master round-trips
    checkpointer.save(1, state, force=True)
    restored = checkpointer.restore(1, like=state)
    checkpointer.close()
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert set(_flat(master_weights(restored.opt_state).master)) == names - vision
    for saved, loaded in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))


def test_the_master_copy_is_sharded_like_its_parameters_and_checkpointed(tmp_path):
    cfg = ModelConfig.tiny(vocab_size=64, param_dtype="bfloat16")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    mesh = make_mesh(fsdp=4, tp=2)
    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-3, master_dtype="float32"), 4)
    graphdef, state = init_state(model, optimizer, mesh)

    def check(state: TrainState) -> None:
        master = master_weights(state.opt_state).master
        params, copies = jax.tree.leaves(state.params), jax.tree.leaves(master)
        assert len(params) == len(copies)
        assert any(not p.sharding.is_fully_replicated for p in params), "some parameter is sharded"
        for param, copy in zip(params, copies, strict=True):
            assert copy.dtype == jnp.float32 and copy.shape == param.shape
            assert copy.sharding.is_equivalent_to(param.sharding, param.ndim), (copy.sharding, param.sharding)

    check(state)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 8, 12)), jnp.int32)

    step = make_train_step(graphdef, optimizer, schedule, _text_loss)
    state, _ = step(state, {"tokens": tokens})
    check(state)

    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), every=1)
    checkpointer.save(1, state, force=True)
    restored = checkpointer.restore(1, like=state)
    checkpointer.close()
    check(restored)
    for saved, loaded in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        assert saved.dtype == loaded.dtype
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))
    # and training resumes from the restored master as from the saved one
    ahead, _ = step(state, {"tokens": tokens})
    resumed, _ = step(restored, {"tokens": tokens})
    for a, b in zip(jax.tree.leaves(ahead), jax.tree.leaves(resumed), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(("fsdp", "tp", "master_dtype"), [(1, 1, ""), (4, 2, "float32")])
def test_the_first_and_later_steps_share_one_compiled_program(fsdp, tp, master_dtype, tmp_path):
    """The state starts placed as the step returns it (the moments and master copy as their
    parameters): before, every run compiled its step twice, the second time for the first step's output."""
    cfg = ModelConfig.tiny(vocab_size=64, param_dtype="bfloat16" if master_dtype else "float32")
    optimizer, schedule = make_optimizer(OptimConfig(peak_lr=1e-3, master_dtype=master_dtype), 4)
    graphdef, state = init_state(Transformer(cfg, rngs=nnx.Rngs(0)), optimizer, make_mesh(fsdp, tp))
    shardings = {path: leaf.sharding for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state):
        mirrored = [s for p, s in shardings.items() if path[-len(p):] == p]
        assert leaf.sharding == (mirrored[0] if mirrored else NamedSharding(leaf.sharding.mesh, PartitionSpec()))

    step = make_train_step(graphdef, optimizer, schedule, _text_loss)
    batch = {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 8, 12)), jnp.int32)}
    state, _ = step(state, batch)
    state, _ = step(state, batch)
    checkpointer = Checkpointer(str(tmp_path / "checkpoints"), every=1)  # a resumed run's state too
    checkpointer.save(2, state, force=True)
    restored = checkpointer.restore(2, like=state)
    checkpointer.close()
    step(restored, batch)
    assert step._cache_size() == 1
