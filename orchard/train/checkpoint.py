"""Orbax checkpoints of the training state together with the data iterator's state, so a resumed
run sees exactly the batches the uninterrupted run would have."""

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

    def save(self, step: int, state: TrainState, data: grain.DatasetIterator, force: bool = False) -> bool:
        """Save if ``step`` is on the interval (or ``force``); returns whether it saved."""
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data))
        return self.manager.save(step, args=args, force=force)

    def restore(self, step: int, like: TrainState, data: grain.DatasetIterator) -> TrainState:
        """The state saved at ``step``, placed with the shardings of ``like``; ``data`` is moved to
        where it was at that step."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract), data=grain.checkpoint.CheckpointRestore(data))
        return TrainState(*self.manager.restore(step, args=args)["state"])

    def close(self) -> None:
        self.manager.close()
