"""The Grain input pipeline for supervised fine-tuning: examples -> packed, batched rows.

An example is a tokenised training sequence, ``{"token_ids": [...], "loss_mask": [...]}`` of equal
length, where ``loss_mask[j]`` is the weight of the loss on producing token ``j`` (0 or 1, or a
weight between: :mod:`orchard.data.examples`). Examples
live in JSONL files (one object a line) or ArrayRecord files (each record that object as JSON).

Each example of ``n`` tokens becomes ``n - 1`` next-token steps: inputs ``token_ids[:-1]``,
targets ``token_ids[1:]`` and the loss mask of those targets, ``loss_mask[1:]``. An example's last
token is only ever a target, so no position is trained to predict the next example's first token.
Examples are then packed first-fit into rows of ``seq_len`` steps (Grain's
``FirstFitPackIterDataset``); every row is a dict of numpy arrays of shape ``[seq_len]``:

* ``tokens`` (int32): the inputs.
* ``targets`` (int32): the next token within the same example.
* ``loss_mask`` (float32): the weight of ``targets[i]`` (1 where it is trained on), 0 on padding.
* ``segment_ids`` (int32): 1, 2, 3... for the examples in the row, 0 for padding.
* ``positions`` (int32): restart at 0 for each example.

Feed ``model(tokens, positions, segment_ids)``: the model's causal mask only joins equal segment
ids, so attention never crosses examples. Examples longer than ``seq_len + 1`` tokens are truncated
to their first ``seq_len + 1`` tokens; examples of fewer than two tokens have no target and are
dropped.

Resuming: the iterator from :func:`make_dataset` is a ``grain.DatasetIterator``; its
``get_state()`` is a small JSON-serialisable dict and ``set_state(state)`` puts a freshly built
iterator (same files and arguments) back at that point. The trainer saves it with the model
checkpoint through Orbax, with Grain's own handler::

    import grain
    import orbax.checkpoint as ocp

    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(train_state), data=grain.checkpoint.CheckpointSave(iterator)))
    manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(iterator)))

The handler writes one ``process_<i>-of-<n>.json`` per host, so each host restores its own shard.
"""

from __future__ import annotations

import array
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex

import grain
import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

PathLike = str | os.PathLike
Example = dict[str, list]


def _validate(example: Any, where: str) -> Example:
    if not isinstance(example, dict) or "token_ids" not in example or "loss_mask" not in example:
        raise ValueError(f"{where}: expected an object with 'token_ids' and 'loss_mask'")
    if len(example["token_ids"]) != len(example["loss_mask"]):
        raise ValueError(f"{where}: 'token_ids' has {len(example['token_ids'])} entries but 'loss_mask' has "
                         f"{len(example['loss_mask'])}")
    return example


def _decode(raw: bytes, where: str) -> Example:
    try:
        example = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{where}: malformed JSON: {error}") from error
    return _validate(example, where)


class ExampleSource:
    """Random access to the examples of one JSONL or ``.array_record`` file (a Grain data source).

    A JSONL file is scanned once at open to index where each non-blank line starts and ends (24
    bytes an example); each access then reads one line. A malformed line raises ``ValueError``
    naming the file and its 1-based line number when that example is read.
    """

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        self._records = None
        if self.path.endswith(".array_record"):
            self._records = grain.sources.ArrayRecordDataSource(self.path)
            return
        starts, ends, lines = array.array("q"), array.array("q"), array.array("q")
        offset = 0
        with open(self.path, "rb") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    starts.append(offset)
                    ends.append(offset + len(line))
                    lines.append(number)
                offset += len(line)
        self._starts, self._ends, self._lines = np.asarray(starts), np.asarray(ends), np.asarray(lines)

    def __len__(self) -> int:
        return len(self._records) if self._records is not None else len(self._starts)

    def __getitem__(self, index: SupportsIndex) -> Example:
        index = int(index)
        if self._records is not None:
            return _decode(self._records[index], f"{self.path}: record {index}")
        start, end = int(self._starts[index]), int(self._ends[index])
        with open(self.path, "rb") as handle:  # opened per read: thread-safe and picklable
            handle.seek(start)
            raw = handle.read(end - start)
        return _decode(raw, f"{self.path}: line {self._lines[index]}")

    def __repr__(self) -> str:
        return f"ExampleSource({self.path!r})"


@dataclass(frozen=True)
class Truncation:
    """What rows of ``seq_len`` steps cut from the examples of a file (of the first ``scanned`` of them):
    examples longer than ``seq_len + 1`` tokens, and the loss weight past the cut."""

    scanned: int
    truncated: int
    trained: float  # the loss weight of the scanned examples' targets
    cut: float  # the part of it past the cut

    @property
    def cut_share(self) -> float:
        return self.cut / self.trained if self.trained else 0.0


def truncation(path: PathLike, seq_len: int, limit: int = 10_000) -> Truncation:
    """How much of the first ``limit`` examples of ``path`` :func:`make_dataset` would cut at ``seq_len``: a
    row keeps an example's first ``seq_len + 1`` tokens, and an agent's last actions are what it cuts."""
    source = ExampleSource(path)
    truncated, trained, cut = 0, 0.0, 0.0
    scanned = min(len(source), limit)
    for index in range(scanned):
        weights = np.asarray(source[index]["loss_mask"][1:], np.float64)
        trained += float(weights.sum())
        if len(weights) > seq_len:
            truncated += 1
            cut += float(weights[seq_len:].sum())
    return Truncation(scanned, truncated, trained, cut)


def write_array_record(path: PathLike, examples: Iterable[Mapping[str, Sequence]]) -> int:
    """Write examples to an ArrayRecord file (``group_size:1``, for random access); returns the count."""
    writer = ArrayRecordWriter(os.fspath(path), "group_size:1")
    count = 0
    try:
        for count, example in enumerate(examples, start=1):
            record = {"token_ids": [int(t) for t in example["token_ids"]],
                      "loss_mask": [float(m) for m in example["loss_mask"]]}
            writer.write(json.dumps(_validate(record, f"{path}: example {count}")).encode())
    finally:
        writer.close()
    return count


def _to_steps(example: Mapping[str, Sequence], seq_len: int, features: Sequence[str] = (),
              inputs: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """Truncate to ``seq_len + 1`` tokens and shift: inputs, next-token targets and their mask, each
    extra per-token feature aligned with the targets, and each of ``inputs`` aligned with the input
    tokens (a VLM's image ids and 3-D positions: :mod:`orchard.data.vision_rows`); all float32."""
    ids = np.asarray(example["token_ids"], np.int32)[: seq_len + 1]
    steps = {"tokens": ids[:-1], "targets": ids[1:]}
    for name in ("loss_mask", *features):
        steps[name] = np.asarray(example[name], np.float32)[1: seq_len + 1]
    for name in inputs:
        steps[name] = np.asarray(example[name], np.float32)[: len(ids) - 1]
    return steps


def _has_steps(steps: dict[str, np.ndarray]) -> bool:
    return len(steps["tokens"]) > 0


def _rename(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    renamed = {k: v for k, v in row.items() if k not in ("tokens_segment_ids", "tokens_positions")}
    return {**renamed, "segment_ids": row["tokens_segment_ids"], "positions": row["tokens_positions"]}


def _pack(steps: grain.IterDataset, seq_len: int, num_packing_bins: int, features: Sequence[str] = ()
          ) -> grain.IterDataset:
    """First-fit packing; ``targets``, ``loss_mask`` and extra features ride along with ``tokens``."""
    meta = ("targets", "loss_mask", *features)
    packed = grain.experimental.FirstFitPackIterDataset(
        steps, length_struct={"tokens": seq_len, **dict.fromkeys(meta, seq_len)},
        num_packing_bins=num_packing_bins, shuffle_bins=False, meta_features=meta)
    return packed.map(_rename)


def pack(examples: Iterable[Mapping[str, Sequence]], seq_len: int, *, num_packing_bins: int = 8,
         features: Sequence[str] = (), inputs: Sequence[str] = ()) -> list[dict[str, np.ndarray]]:
    """Pack examples (in order) into rows of ``seq_len`` steps, the same way :func:`make_dataset` does.

    First-fit over ``num_packing_bins`` open rows: each example goes into the first open row with
    room; when none has room, the open rows are emitted and new ones started. One bin is plain
    sequential packing. ``features`` names extra per-token fields of the examples (GRPO's old
    logprobs and advantages), shifted to line up with the targets as the loss mask is; ``inputs``
    names per-token fields that stay aligned with the input tokens (padding: 0).
    """
    steps = grain.MapDataset.source(list(examples)).map(
        functools.partial(_to_steps, seq_len=seq_len, features=tuple(features), inputs=tuple(inputs)))
    steps = steps.filter(_has_steps).to_iter_dataset(grain.ReadOptions(num_threads=0))
    return list(_pack(steps, seq_len, num_packing_bins, (*features, *inputs)))


def read_ahead(batch_size: int) -> grain.ReadOptions:
    """How far the input pipeline reads ahead of training: four batches' examples (at least 16) on two
    threads. The reads (a line of JSON each) are far cheaper than a train step, so this keeps the step fed
    while decoding little that a run stops before using; the batches do not depend on it."""
    return grain.ReadOptions(num_threads=2, prefetch_buffer_size=max(16, 4 * batch_size))


def make_dataset(path_or_paths: PathLike | Sequence[PathLike], *, seq_len: int, batch_size: int, seed: int,
                 shuffle: bool = True, num_epochs: int | None = None, shard_index: int = 0,
                 shard_count: int = 1, num_packing_bins: int | None = None,
                 read_options: grain.ReadOptions | None = None, inputs: Sequence[str] = ()) -> grain.DatasetIterator:
    """An iterator of packed batches: dicts of ``[batch_size, seq_len]`` arrays (see the module docstring).

    Examples of all files are concatenated, split into ``shard_count`` disjoint shards (example
    ``i`` goes to shard ``i % shard_count``; pass ``jax.process_index()`` and
    ``jax.process_count()``), shuffled within the shard (reshuffled each epoch, deterministically
    from ``seed``), repeated ``num_epochs`` times (forever with ``None``), packed first-fit into
    ``num_packing_bins`` rows at a time (default ``batch_size``) and batched; a last partial batch
    is dropped. Hosts' shards can pack into different numbers of batches, so multi-host training
    should repeat forever and stop after a number of steps. ``inputs`` names per-token fields aligned
    with the input tokens that ride along (a VLM's image features: :mod:`orchard.data.vision_rows`).
    """
    paths = [path_or_paths] if isinstance(path_or_paths, str | os.PathLike) else list(path_or_paths)
    sources = [grain.MapDataset.source(ExampleSource(path)) for path in paths]
    ds = sources[0] if len(sources) == 1 else grain.MapDataset.concatenate(sources)
    ds = ds[shard_index::shard_count].seed(seed)
    if shuffle:
        ds = ds.shuffle()
    ds = ds.repeat(num_epochs).map(functools.partial(_to_steps, seq_len=seq_len, inputs=tuple(inputs)))
    read_options = read_options or read_ahead(batch_size)
    rows = _pack(ds.filter(_has_steps).to_iter_dataset(read_options), seq_len, num_packing_bins or batch_size,
                 tuple(inputs))
    return iter(rows.batch(batch_size, drop_remainder=True))
