"""Packed batches with images, for a vision-language model's trainer (SFT and GRPO alike).

Packed rows carry, per input token, the features of :mod:`orchard.data.vision_rows`: which image a
placeholder belongs to and the token's 3-D rotary position. :func:`attach_images` turns them into what
the model needs, on the host before a step: each row's images, in the order their placeholder runs
appear, as patches (``patches [..., B, images_per_row * P, values]``) and the flat indices of their
placeholders (``image_rows [..., B, images_per_row * tokens]``), and the positions. A row with fewer
images is padded with blank images whose placeholders point past the batch (the model drops those
writes), so every batch of a run has the same shapes and the step compiles once. Every image of a
run has the same size (``image_grid``): the GUI recipe's screenshots do.

:func:`batch_logits` is the forward pass the loss functions share: text-only batches as before, and
batches with images through the vision tower.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orchard.models.vision import Grid
from orchard.models.vlm import Images

PatchesOf = Callable[[int], np.ndarray]  # an image's index in the run's table -> its patches [P, values]


def _runs(positions: np.ndarray, owners: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Contiguous runs of placeholder positions of one image: (image id, positions). The same image
    twice in a row (two examples showing one screenshot) is two runs."""
    breaks = np.flatnonzero((np.diff(positions) != 1) | (np.diff(owners) != 0)) + 1
    return [(int(ids[0]), run) for run, ids in zip(np.split(positions, breaks), np.split(owners, breaks), strict=True)
            if run.size]


def attach_images(batch: dict[str, np.ndarray], patches_of: PatchesOf, image_grid: Grid, tokens_per_image: int,
                  images_per_row: int) -> dict[str, np.ndarray]:
    """``batch`` (arrays of ``[..., B, T]`` with the image features) with ``patches``, ``image_rows`` and
    ``positions_t/h/w`` as int32, the ``image_ids`` feature consumed. Raises ``ValueError`` for a row
    with more images than ``images_per_row`` or a placeholder run of the wrong length."""
    out = dict(batch)
    ids = np.asarray(out.pop("image_ids")).astype(np.int64)
    *lead, rows, length = ids.shape
    patch_count = int(np.prod(image_grid))
    flat_ids = ids.reshape(-1, rows, length)
    patches: np.ndarray | None = None
    image_rows = np.full((flat_ids.shape[0], rows, images_per_row * tokens_per_image), rows * length, np.int32)
    for m, micro in enumerate(flat_ids):
        for b, row in enumerate(micro):
            positions = np.flatnonzero(row)
            runs = _runs(positions, row[positions])
            if len(runs) > images_per_row:
                raise ValueError(f"a packed row holds {len(runs)} images; the batch has room for {images_per_row} "
                                 "per row (raise images_per_row, or pack fewer examples per row)")
            for j, (image, where) in enumerate(runs):
                if len(where) != tokens_per_image:
                    raise ValueError(f"image {image - 1} has {len(where)} placeholder tokens in a row, not "
                                     f"{tokens_per_image}: every image of a run must have the same size")
                pixels = np.asarray(patches_of(image - 1), np.float32)
                if patches is None:
                    patches = np.zeros((flat_ids.shape[0], rows, images_per_row * patch_count, pixels.shape[-1]),
                                       np.float32)
                patches[m, b, j * patch_count:(j + 1) * patch_count] = pixels
                image_rows[m, b, j * tokens_per_image:(j + 1) * tokens_per_image] = b * length + where
    if patches is None:
        raise ValueError("a batch of a vision-language run with no image at all")
    out["patches"] = patches.reshape(*lead, rows, *patches.shape[2:])
    out["image_rows"] = image_rows.reshape(*lead, rows, image_rows.shape[-1])
    for axis in "thw":
        out[f"positions_{axis}"] = np.asarray(out[f"positions_{axis}"]).astype(np.int32)
    return out


def batch_logits(model: Any, batch: dict[str, jax.Array], image_grid: Grid | None = None, head: bool = True
                 ) -> jax.Array:
    """The logits of a packed batch (``[B, T]`` arrays); with ``image_grid``, a batch that went through
    :func:`attach_images`, its images in the model's vision tower. ``head`` False: the final-normed
    hidden states ``[B, T, D]`` instead (the loss projects them in chunks)."""
    if image_grid is None:
        return model(batch["tokens"], batch["positions"], batch["segment_ids"], head=head)
    positions = jnp.stack([batch[f"positions_{axis}"] for axis in "thw"])  # [3, B, T]
    patches = batch["patches"].reshape(-1, batch["patches"].shape[-1])
    rows = batch["image_rows"].reshape(-1)
    count = patches.shape[0] // int(np.prod(image_grid))
    images = Images(patches, (tuple(image_grid),) * count, rows)
    return model(batch["tokens"], positions, batch["segment_ids"], images=images, head=head)
