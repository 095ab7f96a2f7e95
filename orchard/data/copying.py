"""Copying lessons: what a policy trained from scratch learns before its first trajectory.

An agent copies all the time: the failing test's name from pytest's output into ``grep``, the path from
the traceback into ``sed``, the helper's name from the file into its edit. A transformer copies with
induction heads (attend to the token after an earlier occurrence of the current one, and emit it), and
a small one finds them only after a long plateau. The paper's policies are pretrained LLMs and have them;
a from-scratch policy trained on a few hundred teacher runs never gets off the plateau (the SWE skills
variant's SFT policy, asked to fix ``stack_nerripel``, kept the verb it had seen in training and made up a
noun: ``stack_dunri``).

So a fresh policy first learns to copy. The lessons (:data:`LESSONS`) are drawn from the tokenizer's word
pieces, the loss on the copy only, so nothing but copying lowers it: a random span followed by the same span
(``span``), or items (filler, a key, a name) recalled by key in a shuffled order (``recall``: no fixed
offset predicts them). This stands in for pretraining; it teaches no task and holds no text of any task.

What the tiny policy (2 layers of width 64, 2,048 tokens) learns from them, measured by greedy accuracy on
held-out lessons: on lessons of 8 to 40 tokens it stays near ln(V) for some 900 steps of 8 rows of 512
tokens at a peak learning rate of 1e-2, then learns to copy by content (span lessons: 0.93 on recall
lessons; recall lessons: 0.99). That reaches as far as the lessons did: on lessons of 100 to 1,000 tokens
it copies 0.12 of the names in a row's first 256 tokens and none past 512, and an agent's copies happen 500
to 2,000 tokens into its row. Long lessons from the start do not help: 1,100 steps at 8 to 1,000 tokens
stayed at ln(V). Lengthened in phases (``pretrain.lengthen``: 500 steps of 8 to 250 tokens in rows of
1,024, then 500 of 8 to 1,000 in rows of 2,048) it copies 0.54 to 0.67 of the names up to 1,024 tokens in
and 0.22 to 0.43 beyond. ``sft.examples.copy_lessons`` keeps lessons among the SFT examples.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

from orchard.data.tokenizer import Tokenizer
from orchard.seeds import seeded_random


def word_pieces(tokenizer: Tokenizer) -> list[int]:
    """The ids of ordinary tokens whose text is letters only (identifier pieces, not special tokens)."""
    special = set(tokenizer.backend.get_added_tokens_decoder())
    return [i for i in range(tokenizer.vocab_size)
            if i not in special and tokenizer.decode([i]).strip().isalpha()]


def copy_examples(pieces: Sequence[int], count: int, seed: int, min_span: int = 8,
                  max_span: int = 40, purpose: str = "copy-examples") -> Iterator[dict[str, list]]:
    """``count`` examples ``span + span`` (a span of ``min_span`` to ``max_span`` tokens drawn from ``pieces``),
    trained on the copy's tokens after its first (which the span's start does not predict); ``purpose`` names
    the draw (lessons kept in SFT are drawn apart from the ones before it)."""
    _check(pieces, min_span, max_span)
    rng = seeded_random(seed, purpose)
    for _ in range(count):
        span = [rng.choice(pieces) for _ in range(rng.randint(min_span, max_span))]
        yield {"token_ids": span + span, "loss_mask": [0] * (len(span) + 1) + [1] * (len(span) - 1)}


def recall_examples(pieces: Sequence[int], count: int, seed: int, min_span: int = 8, max_span: int = 40,
                    purpose: str = "recall-examples") -> Iterator[dict[str, list]]:
    """``count`` examples that are copied by content, not by offset: a passage of ``min_span`` to ``max_span``
    tokens of items (filler, a key, a name of 1 to 4 pieces; the keys distinct), then the same items in a
    shuffled order with fresh filler, trained on each name after its key. Only looking back for the key and
    copying what followed it (an induction head) predicts a name there; a copy at a fixed offset, which a
    span and its repeat allow, does not."""
    _check(pieces, min_span, max_span)
    rng = seeded_random(seed, purpose)
    distinct = len(set(pieces))
    for _ in range(count):
        target, items, keys, length = rng.randint(min_span, max_span), [], set(), 0
        while length < target and len(keys) < distinct:
            filler = [rng.choice(pieces) for _ in range(rng.randint(0, 3))]
            key, name = rng.choice(pieces), [rng.choice(pieces) for _ in range(rng.randint(1, 4))]
            if key in keys:
                continue
            if length + len(filler) + 1 + len(name) > target:
                break
            items.append((filler, key, name))
            keys.add(key)
            length += len(filler) + 1 + len(name)
        token_ids = [t for filler, key, name in items for t in (*filler, key, *name)]
        token_ids += [rng.choice(pieces) for _ in range(target - length)]  # filler up to the passage's length
        loss_mask = [0] * len(token_ids)
        for filler, key, name in rng.sample(items, len(items)):
            token_ids += [rng.choice(pieces) for _ in filler] + [key] + name
            loss_mask += [0] * (len(filler) + 1) + [1] * len(name)
        yield {"token_ids": token_ids, "loss_mask": loss_mask}


def _check(pieces: Sequence[int], min_span: int, max_span: int) -> None:
    if not pieces:
        raise ValueError("no tokens to copy: the tokenizer has no word pieces")
    if not 1 <= min_span <= max_span:
        raise ValueError(f"copy spans need 1 <= min_span <= max_span, got {min_span} and {max_span}")


LESSONS = {"span": copy_examples, "recall": recall_examples}


def write_copy_examples(path: str, tokenizer: Tokenizer, count: int, seed: int, min_span: int = 8,
                        max_span: int = 40, purpose: str = "copy-examples", append: bool = False,
                        kind: str = "span") -> int:
    """Write ``count`` lessons of ``kind`` (:data:`LESSONS`) over ``tokenizer``'s word pieces to the JSONL file
    ``path`` (after what it holds, with ``append``); the number written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written = 0
    with open(path, "a" if append else "w", encoding="utf-8") as handle:
        for example in LESSONS[kind](word_pieces(tokenizer), count, seed, min_span, max_span, purpose):
            handle.write(json.dumps(example) + "\n")
            written += 1
    return written
