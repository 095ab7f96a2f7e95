"""Checkpoints as the model loader reads them: tensors by their Hugging Face names.

:class:`Checkpoint` is the protocol (``get(hf_tensor_name) -> np.ndarray``, in HF's layout);
:class:`SafetensorsCheckpoint` reads a Hugging Face directory, and
:class:`orchard.models.gguf.GGUFCheckpoint` a llama.cpp file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
from safetensors import safe_open


class CheckpointError(ValueError):
    """The checkpoint does not fit the model it was loaded into."""


class Checkpoint(Protocol):
    def get(self, name: str) -> np.ndarray:
        """The tensor HF calls ``name``, in HF's layout (``[out, in]`` for linear weights)."""
        ...


class SafetensorsCheckpoint:
    """Lazy tensor access over ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""

    def __init__(self, path: str) -> None:
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as handle:
                weight_map: dict[str, str] = json.load(handle)["weight_map"]
        elif os.path.exists(os.path.join(path, "model.safetensors")):
            with safe_open(os.path.join(path, "model.safetensors"), "np") as single:
                weight_map = dict.fromkeys(single.keys(), "model.safetensors")
        else:
            raise CheckpointError(f"no model.safetensors or model.safetensors.index.json in {path}")
        self.path = path
        self.weight_map = weight_map
        self._files: dict[str, Any] = {}  # open (memory-mapped) shards, opened once each

    def names(self) -> Iterator[str]:
        return iter(self.weight_map)

    def get(self, name: str) -> np.ndarray:
        return self._file(name).get_tensor(name)

    def get_slice(self, name: str) -> Any:
        """The tensor HF calls ``name``, unread: ``.get_shape()``, and indexing with slices reads only that
        block from the (memory-mapped) file."""
        return self._file(name).get_slice(name)

    def _file(self, name: str) -> Any:
        try:
            filename = self.weight_map[name]
        except KeyError:
            raise CheckpointError(f"checkpoint has no tensor {name!r}") from None
        if filename not in self._files:
            self._files[filename] = safe_open(os.path.join(self.path, filename), "np")
        return self._files[filename]
