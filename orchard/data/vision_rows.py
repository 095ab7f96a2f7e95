"""Training rows with images: which image each placeholder token belongs to, and the 3-D positions.

A vision-language example is its token ids (with each image's placeholders, from a chat format
with image tokens) plus, per token and aligned with the *input* tokens, the features of
:data:`IMAGE_FEATURES`:

* ``image_ids``: 1 + the image's index in the run's image table for a placeholder token, 0 for any
  other token (0 is also what packing pads with);
* ``positions_t``, ``positions_h``, ``positions_w``: the token's multimodal rotary position
  (:func:`orchard.models.vlm.mrope_positions`), restarting at 0 for each example.

They ride through packing like the loss mask (:func:`orchard.data.pipeline.pack` with ``inputs=``),
so a packed row keeps each example's images with its tokens; the pixels themselves stay in the
image store, and the learner looks them up by id when it builds a batch
(:func:`orchard.train.images.attach_images`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from orchard.data.chat import RenderedImage
from orchard.data.images import ImageRef, ImageStore
from orchard.models.pixels import image_grid, patchify
from orchard.models.vision import Grid
from orchard.models.vlm import VLMConfig, mrope_positions, placeholder_starts

IMAGE_FEATURES = ("image_ids", "positions_t", "positions_h", "positions_w")


def image_features(token_ids: Sequence[int], image_ids: Sequence[int], grids: Sequence[Grid], cfg: VLMConfig,
                   starts: Sequence[int] | None = None) -> dict[str, list[int]]:
    """The per-token image features of one example whose images ``image_ids`` (indices into the run's
    image table) of ``grids`` have their placeholders at ``starts`` (default: found by scanning, see
    :func:`~orchard.models.vlm.placeholder_starts`; a sampled completion may hold the image token as text)."""
    if len(image_ids) != len(grids):
        raise ValueError(f"{len(image_ids)} image ids for {len(grids)} grids")
    tokens = np.asarray(token_ids)
    starts = placeholder_starts(tokens, grids, cfg) if starts is None else list(starts)
    positions, _ = mrope_positions(tokens, grids, cfg, starts)
    owner = np.zeros(len(tokens), np.int64)
    for image_id, grid, first in zip(image_ids, grids, starts, strict=True):
        owner[first:first + cfg.vision.tokens_for(grid)] = image_id + 1
    return {"image_ids": owner.tolist(), **{f"positions_{axis}": positions[i].tolist() for i, axis in enumerate("thw")}}


class ImageTable:
    """The images of a set of rows, by id (in order of first use), and their features: what a row
    builder gives each row (:meth:`features`) and what the learner reads pixels from (:meth:`patches`)."""

    def __init__(self, cfg: VLMConfig, store: ImageStore, refs: Sequence[ImageRef] = ()) -> None:
        self.cfg, self.store = cfg, store
        self.refs: list[ImageRef] = []
        self._ids: dict[str, int] = {}
        self._patches: dict[int, np.ndarray] = {}
        for ref in refs:
            self.add(ref)

    def save(self, path: str) -> None:
        """The table's images (by hash, in id order) as JSON: what an examples file's ids point into."""
        with open(path, "w") as handle:
            json.dump([ref.model_dump() for ref in self.refs], handle)

    @classmethod
    def load(cls, path: str, cfg: VLMConfig, store: ImageStore) -> ImageTable:
        with open(path) as handle:
            return cls(cfg, store, [ImageRef(**ref) for ref in json.load(handle)])

    def grid_of_all(self) -> Grid:
        """The one grid every image of the table has (a run trains on one screenshot size)."""
        grids = {self.grid(ref) for ref in self.refs}
        if len(grids) != 1:
            raise ValueError(f"the images have {len(grids)} sizes; a run trains on one screenshot size")
        return grids.pop()

    def add(self, ref: ImageRef) -> int:
        if ref.sha256 not in self._ids:
            self._ids[ref.sha256] = len(self.refs)
            self.refs.append(ref)
        return self._ids[ref.sha256]

    def grid(self, ref: ImageRef) -> Grid:
        return image_grid(ref.width, ref.height, self.cfg.vision, self.cfg.processing)

    def features(self, token_ids: Sequence[int], images: Sequence[RenderedImage]) -> dict[str, list[int]]:
        """The image features of a row whose placeholders are ``images`` (a rendered prompt's)."""
        refs = [image.image for image in images]
        return image_features(token_ids, [self.add(ref) for ref in refs], [self.grid(ref) for ref in refs], self.cfg,
                              [image.start for image in images])

    def patches(self, image_id: int) -> np.ndarray:
        """The patches of image ``image_id``, read from the store and processed as the model does (once)."""
        if image_id not in self._patches:
            pixels = self.store.pixels(self.refs[image_id])
            self._patches[image_id] = patchify(pixels, self.cfg.vision, self.cfg.processing)[0]
        return self._patches[image_id]
