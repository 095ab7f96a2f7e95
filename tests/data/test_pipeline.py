"""The SFT input pipeline: sources, packing, shuffling, sharding and resumable iterators."""

from __future__ import annotations

import json
import threading

import grain
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from orchard.data.pipeline import (
    ExampleSource,
    make_dataset,
    pack,
    read_ahead,
    truncation,
    write_array_record,
)
from orchard.models.config import ModelConfig
from orchard.models.transformer import Transformer


def make_examples(count: int, seed: int = 0) -> list[dict]:
    """Examples of 2-12 tokens whose first token (100 + i) identifies them; random 0/1 masks."""
    rng = np.random.default_rng(seed)
    examples = []
    for i in range(count):
        length = int(rng.integers(2, 13))
        ids = [100 + i, *rng.integers(1, 64, length - 1).tolist()]
        examples.append({"token_ids": ids, "loss_mask": rng.integers(0, 2, length).tolist()})
    return examples


def write_jsonl(path, examples: list[dict]) -> str:
    path.write_text("".join(json.dumps(example) + "\n" for example in examples))
    return str(path)


def unpack(row: dict[str, np.ndarray]) -> list[tuple[list[int], list[float]]]:
    """The examples in a packed row: (token ids, loss mask of tokens 1..n-1), checking the row's layout."""
    segments = row["segment_ids"]
    count = int(segments.max())
    assert set(np.unique(segments)) <= set(range(count + 1))
    assert (np.diff(segments[segments > 0]) >= 0).all()  # examples are contiguous
    padding = segments == 0
    assert not row["loss_mask"][padding].any() and not row["tokens"][padding].any()
    assert not row["targets"][padding].any() and not row["positions"][padding].any()
    found = []
    for segment in range(1, count + 1):
        where = segments == segment
        tokens, targets = row["tokens"][where], row["targets"][where]
        np.testing.assert_array_equal(row["positions"][where], np.arange(where.sum()))
        np.testing.assert_array_equal(targets[:-1], tokens[1:])  # the next token of the same example
        found.append(([*tokens.tolist(), int(targets[-1])], row["loss_mask"][where].tolist()))
    return found


def unpack_batches(iterator, count: int | None = None) -> list[list[int]]:
    """Token ids of the examples in the next ``count`` batches (all of them with None), in order."""
    examples = []
    for i, batch in enumerate(iterator):
        for b in range(batch["tokens"].shape[0]):
            examples += [ids for ids, _ in unpack({key: value[b] for key, value in batch.items()})]
        if count is not None and i + 1 == count:
            break
    return examples


def test_truncation_counts_what_rows_cut_and_agrees_with_the_rows(tmp_path):
    examples = [{"token_ids": list(range(1, 11)), "loss_mask": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]},  # 10 tokens
                {"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}]
    path = write_jsonl(tmp_path / "examples.jsonl", examples)
    cut = truncation(path, seq_len=7)  # a row keeps 8 tokens: the first example loses its last two trained ones
    assert (cut.scanned, cut.truncated, cut.trained, cut.cut) == (2, 1, 6.0, 2.0)
    assert cut.cut_share == pytest.approx(2 / 6)
    rows = next(iter(make_dataset(path, seq_len=7, batch_size=2, seed=0, shuffle=False)))
    assert rows["loss_mask"].sum() == cut.trained - cut.cut  # what the rows train is what truncation leaves
    assert truncation(path, seq_len=9).truncated == 0 and truncation(path, seq_len=7, limit=1).scanned == 1


def test_packed_row_layout_keeps_examples_apart():
    first = {"token_ids": [1, 2, 3, 4, 5, 6], "loss_mask": [0, 0, 1, 1, 1, 1]}
    second = {"token_ids": [7, 8, 9, 10, 11], "loss_mask": [True, False, True, True, False]}
    (row,) = pack([first, second], seq_len=12, num_packing_bins=1)
    assert {key: value.dtype for key, value in row.items()} == {
        "tokens": np.int32, "targets": np.int32, "loss_mask": np.float32, "segment_ids": np.int32,
        "positions": np.int32}
    np.testing.assert_array_equal(row["tokens"], [1, 2, 3, 4, 5, 7, 8, 9, 10, 0, 0, 0])
    # Position 4 holds the first example's last input; its target is 6, never the second example's 7.
    np.testing.assert_array_equal(row["targets"], [2, 3, 4, 5, 6, 8, 9, 10, 11, 0, 0, 0])
    np.testing.assert_array_equal(row["loss_mask"], [0, 1, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0])
    np.testing.assert_array_equal(row["segment_ids"], [1, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0])
    np.testing.assert_array_equal(row["positions"], [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0, 0])
    assert unpack(row) == [(first["token_ids"], [0, 1, 1, 1, 1]), (second["token_ids"], [0, 1, 1, 0])]


def test_packed_logits_equal_logits_alone():
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=8, dtype="float32")
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    forward = nnx.jit(lambda model, *args: model(*args))  # one compile instead of many eager ops
    first = {"token_ids": [5, 9, 2, 33, 17, 8, 41], "loss_mask": [1] * 7}
    second = {"token_ids": [12, 3, 60, 7, 25], "loss_mask": [1] * 5}
    (row,) = pack([first, second], seq_len=16, num_packing_bins=1)
    packed = forward(model, *(jnp.asarray(row[key])[None] for key in ("tokens", "positions", "segment_ids")))[0]
    for segment, example in enumerate((first, second), start=1):
        alone = forward(model, jnp.asarray(example["token_ids"][:-1])[None])[0]
        np.testing.assert_allclose(packed[row["segment_ids"] == segment], alone, atol=1e-5, rtol=1e-5)


def test_loss_masks_survive_packing():
    examples = [
        {"token_ids": [1, 2, 3], "loss_mask": [False, True, False]},
        {"token_ids": [4, 5, 6, 7, 8, 9, 10], "loss_mask": [1, 1, 0, 0, 1, 0, 1]},
        {"token_ids": [11], "loss_mask": [1]},  # no target: dropped
        {"token_ids": [12, 13], "loss_mask": [0, 1]},
        {"token_ids": [14, 15, 16, 17], "loss_mask": [1, 0.25, 0, 0.5]},  # weights between 0 and 1
        {"token_ids": list(range(20, 32)), "loss_mask": [0, 1] * 6},  # 12 tokens: truncated to 9
        *make_examples(20, seed=1),
    ]
    rows = pack(examples, seq_len=8, num_packing_bins=3)
    assert all(row[key].shape == (8,) for row in rows for key in row)
    found = sorted(example for row in rows for example in unpack(row))
    expected = sorted((e["token_ids"][:9], [float(m) for m in e["loss_mask"][1:9]])
                      for e in examples if len(e["token_ids"]) > 1)
    assert found == expected  # every example whole in one row, masks exact
    assert ([20, 21, 22, 23, 24, 25, 26, 27, 28], [1.0, 0.0] * 4) in found  # truncated to seq_len + 1


def test_seeded_shuffle_is_deterministic(tmp_path):
    examples = make_examples(30)
    path = write_jsonl(tmp_path / "train.jsonl", examples)

    def order(seed: int, **kwargs) -> list[int]:
        options = dict(seq_len=16, batch_size=1, seed=seed, num_epochs=1) | kwargs
        return [ids[0] - 100 for ids in unpack_batches(make_dataset(path, **options))]

    assert order(0, shuffle=False) == list(range(30))
    assert sorted(order(0)) == list(range(30))
    assert order(0) == order(0)
    assert order(0) != order(1)
    two_epochs = order(0, num_epochs=2)
    assert sorted(two_epochs[:30]) == sorted(two_epochs[30:]) == list(range(30))
    assert two_epochs[:30] != two_epochs[30:]  # each epoch is reshuffled


def test_the_pipeline_reads_only_a_few_batches_ahead(tmp_path, monkeypatch):
    """A run that trains on one batch decodes about read_ahead's buffer, not Grain's default 500 examples."""
    reads = []
    read = ExampleSource.__getitem__
    monkeypatch.setattr(ExampleSource, "__getitem__", lambda self, index: reads.append(index) or read(self, index))
    path = write_jsonl(tmp_path / "train.jsonl", make_examples(600))
    data = make_dataset(path, seq_len=16, batch_size=1, seed=0)
    next(data)
    settled = [-1]
    while settled[-1] != len(reads):  # the prefetch threads stop at the buffer's bound
        settled.append(len(reads))
        threading.Event().wait(0.2)
    bound = read_ahead(1)
    assert 0 < len(reads) <= bound.prefetch_buffer_size + bound.num_threads + 16  # + what one packed row holds


def test_shards_are_disjoint_and_cover_the_data(tmp_path):
    examples = make_examples(40)
    paths = [write_jsonl(tmp_path / "a.jsonl", examples[:25]), str(tmp_path / "b.array_record")]
    write_array_record(paths[1], examples[25:])
    shards = [unpack_batches(make_dataset(paths, seq_len=16, batch_size=1, seed=3, num_epochs=1, shard_index=i,
                                          shard_count=3)) for i in range(3)]
    ids = [{example[0] - 100 for example in shard} for shard in shards]
    assert [len(shard) for shard in shards] == [len(s) for s in ids] == [14, 13, 13]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert ids[0] | ids[1] | ids[2] == set(range(40))
    assert sorted(example for shard in shards for example in shard) == sorted(e["token_ids"] for e in examples)


def test_resume_from_saved_state(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", make_examples(30))
    options = dict(seq_len=16, batch_size=2, seed=7)
    iterator = make_dataset(path, **options)
    for _ in range(5):
        next(iterator)
    saved = json.loads(json.dumps(iterator.get_state()))  # JSON-serialisable, as Grain's Orbax handler needs
    expected = [next(iterator) for _ in range(6)]  # crosses an epoch boundary
    fresh = make_dataset(path, **options)
    fresh.set_state(saved)
    for want in expected:
        got = next(fresh)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_iterator_state_saved_with_orbax(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", make_examples(30))
    options = dict(seq_len=16, batch_size=2, seed=7)
    iterator = make_dataset(path, **options)
    for _ in range(3):
        next(iterator)
    train_state = {"w": jnp.arange(4.0)}
    with ocp.CheckpointManager(tmp_path / "checkpoints") as manager:
        manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(train_state),
                                                data=grain.checkpoint.CheckpointSave(iterator)))
        expected = [next(iterator) for _ in range(3)]  # the state was captured by save() itself
        manager.wait_until_finished()
    fresh = make_dataset(path, **options)
    with ocp.CheckpointManager(tmp_path / "checkpoints") as manager:
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(
            state=ocp.args.StandardRestore(train_state), data=grain.checkpoint.CheckpointRestore(fresh)))
    np.testing.assert_array_equal(restored.state["w"], train_state["w"])
    assert restored.data is fresh
    for want in expected:
        got = next(fresh)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_malformed_jsonl_line_is_named(tmp_path):
    good = {"token_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{json.dumps(good)}\n\n{{\"token_ids\": [1, 2\n{json.dumps(good)}\n"
                    '{"token_ids": [1, 2], "loss_mask": [1]}\n')
    source = ExampleSource(path)
    assert len(source) == 4  # the blank line 2 is skipped
    assert source[0] == source[2] == good
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3: malformed JSON"):
        source[1]
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 5: 'token_ids' has 2 entries but 'loss_mask' has 1"):
        source[3]
    with pytest.raises(ValueError, match=r"bad\.jsonl: line 3"):
        next(make_dataset(path, seq_len=8, batch_size=1, seed=0, shuffle=False))


def test_array_record_and_jsonl_give_the_same_examples(tmp_path):
    examples = [*make_examples(25), {"token_ids": [1, 2], "loss_mask": [False, True]},
                {"token_ids": [3, 4, 5], "loss_mask": [0.25, 1, 0]}]
    jsonl = ExampleSource(write_jsonl(tmp_path / "train.jsonl", examples))
    assert write_array_record(tmp_path / "train.array_record", examples) == 27
    records = ExampleSource(tmp_path / "train.array_record")
    assert len(jsonl) == len(records) == 27
    for i in (25, 3, 0, 17, 26):  # random access
        assert jsonl[i]["token_ids"] == records[i]["token_ids"] == examples[i]["token_ids"]
        assert [float(m) for m in jsonl[i]["loss_mask"]] == records[i]["loss_mask"]
    assert records[26]["loss_mask"] == [0.25, 1.0, 0.0]
