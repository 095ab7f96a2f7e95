"""Copying lessons: a span and its copy, the loss on the copy only, drawn from the tokenizer's word pieces."""

from __future__ import annotations

import json

import pytest

from orchard.data.copying import LESSONS, copy_examples, recall_examples, word_pieces, write_copy_examples
from orchard.data.tokenizer import Tokenizer

CORPUS = ["def fold_kovel(zantri, pelmu):\n    return zantri + pelmu * 3\n", "$ python -m pytest -q\n1 failed"] * 20


def test_each_example_is_a_span_then_its_copy_trained_on_the_copy_after_its_first_token():
    examples = list(copy_examples(range(100, 140), count=50, seed=3, min_span=4, max_span=9))
    assert len(examples) == 50
    for example in examples:
        ids, mask = example["token_ids"], example["loss_mask"]
        half = len(ids) // 2
        assert 4 <= half <= 9 and ids[:half] == ids[half:] and len(mask) == len(ids)
        assert all(100 <= i < 140 for i in ids)
        # the mask weighs the target token ids[j]: nothing of the span, nor the copy's first token (unpredictable)
        assert mask == [0] * (half + 1) + [1] * (half - 1)
    assert len({len(e["token_ids"]) for e in examples}) > 1  # spans of several lengths


def test_recall_lessons_train_only_names_that_a_look_up_by_key_predicts():
    """A passage of keyed names, then the same items shuffled with fresh filler: every trained token is a name
    token that followed the same token in the passage (what an induction head copies), the names keep their
    keys, and no fixed offset predicts the recall."""
    examples = list(recall_examples(range(100, 400), count=40, seed=3, min_span=20, max_span=60))
    offsets = set()
    for example in examples:
        ids, mask = example["token_ids"], example["loss_mask"]
        assert len(mask) == len(ids) and all(100 <= i < 400 for i in ids)
        trained = [j for j, weight in enumerate(mask) if weight]
        key = trained[0] - 1  # the first recalled item's key: after the passage and up to 3 tokens of filler
        assert 20 <= key <= 60 + 3
        for j in trained:
            earlier = [i for i in range(1, key) if ids[i - 1] == ids[j - 1] and ids[i] == ids[j]]
            assert earlier, (example, j)
            offsets.add(j - earlier[0])
    assert len(offsets) > 20  # copies come from many distances back: not one offset per example


def test_the_examples_follow_the_seed():
    for lessons in LESSONS.values():
        first = list(lessons(range(50), 20, seed=0))
        assert first == list(lessons(range(50), 20, seed=0))
        assert first != list(lessons(range(50), 20, seed=1))


def test_bad_spans_and_no_pieces_are_refused():
    for lessons in LESSONS.values():
        with pytest.raises(ValueError, match="min_span <= max_span"):
            next(lessons(range(10), 1, 0, min_span=5, max_span=4))
        with pytest.raises(ValueError, match="no word pieces"):
            next(lessons([], 1, 0))


def test_word_pieces_are_letters_only_and_never_special(tmp_path):
    tokenizer = Tokenizer.train(CORPUS, 300)
    pieces = word_pieces(tokenizer)
    assert pieces and all(tokenizer.decode([i]).strip().isalpha() for i in pieces)
    assert tokenizer.eos_id not in pieces and tokenizer.token_id("<|im_start|>") not in pieces
    assert {"zantri", "pelmu"} & {tokenizer.decode([i]).strip() for i in pieces}
    path = tmp_path / "lessons" / "train.jsonl"
    assert write_copy_examples(str(path), tokenizer, 12, seed=0) == 12
    written = [json.loads(line) for line in path.read_text().splitlines()]
    assert written == list(copy_examples(pieces, 12, 0))
