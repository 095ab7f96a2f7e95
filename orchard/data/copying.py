"""Copying lessons: what a policy trained from scratch learns before its first trajectory.

An agent copies all the time: the failing test's name from pytest's output into ``grep``, the path from
the traceback into ``sed``, the helper's name from the file into its edit. A transformer copies with
induction heads (attend to the token after an earlier occurrence of the current one, and emit it), and
a small one finds them only after a long plateau. The paper's policies are pretrained LLMs and have them;
a from-scratch policy trained on a few hundred teacher runs never gets off the plateau (the SWE skills
variant's SFT policy, asked to fix ``stack_nerripel``, kept the verb it had seen in training and made up a
noun: ``stack_dunri``).

So a fresh policy first learns to copy: each example is a random span of the tokenizer's word pieces
followed by the same span, the loss on the copy only, so nothing but copying lowers it. The tiny policy
(2 layers of width 64, 1,704 word pieces) stayed near ln(1704) = 7.4 (6.9 to 7.2) for 400 steps of 8 rows
of 512 tokens at a peak learning rate of 1e-2 (3e-3 never left it in 400), then fell below 0.2 within 100.
This stands in for pretraining; it teaches no task and holds no text of any task. On its own it does not
survive SFT on a few hundred runs that reward recalling names (the SFT policy copied no better than one
trained from scratch): :func:`orchard.tasks.swe.skills.renamed_runs` makes recall useless there.
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
                  max_span: int = 40) -> Iterator[dict[str, list]]:
    """``count`` examples ``span + span`` (a span of ``min_span`` to ``max_span`` tokens drawn from ``pieces``),
    trained on the copy's tokens after its first (which the span's start does not predict)."""
    if not pieces:
        raise ValueError("no tokens to copy: the tokenizer has no word pieces")
    if not 1 <= min_span <= max_span:
        raise ValueError(f"copy spans need 1 <= min_span <= max_span, got {min_span} and {max_span}")
    rng = seeded_random(seed, "copy-examples")
    for _ in range(count):
        span = [rng.choice(pieces) for _ in range(rng.randint(min_span, max_span))]
        yield {"token_ids": span + span, "loss_mask": [0] * (len(span) + 1) + [1] * (len(span) - 1)}


def write_copy_examples(path: str, tokenizer: Tokenizer, count: int, seed: int, min_span: int = 8,
                        max_span: int = 40) -> int:
    """Write :func:`copy_examples` over ``tokenizer``'s word pieces to the JSONL file ``path``; the number written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        for example in copy_examples(word_pieces(tokenizer), count, seed, min_span, max_span):
            handle.write(json.dumps(example) + "\n")
            written += 1
    return written
