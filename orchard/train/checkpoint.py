"""Orbax checkpoints of the training state together with the data iterator's state, so a resumed
run sees exactly the batches the uninterrupted run would have. RL has no data iterator (its prompts
are drawn from the step number), so ``data`` is optional."""

from __future__ import annotations

import grain
import jax
import orbax.checkpoint as ocp

from orchard.train.state import TrainState


class Checkpointer:
    def __init__(self, directory: str, every: int, keep: int = 3) -> None:
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                               enable_async_checkpointing=False)
        self.manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: TrainState, data: grain.DatasetIterator | None = None,
             force: bool = False) -> bool:
        """Save if ``step`` is on the interval (or ``force``); returns whether it saved."""
        items = {"state": ocp.args.StandardSave(state)}
        if data is not None:
            items["data"] = grain.checkpoint.CheckpointSave(data)
        return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

    def restore(self, step: int, like: TrainState, data: grain.DatasetIterator | None = None) -> TrainState:
        """The state saved at ``step``, placed with the shardings of ``like``; ``data`` is moved to
        where it was at that step."""
        items = {"state": ocp.args.StandardRestore(jax.tree.map(ocp.utils.to_shape_dtype_struct, like))}
        if data is not None:
            items["data"] = grain.checkpoint.CheckpointRestore(data)
        return TrainState(*self.manager.restore(step, args=ocp.args.Composite(**items))["state"])

    def close(self) -> None:
        self.manager.close()
