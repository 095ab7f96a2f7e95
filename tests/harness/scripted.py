"""A scripted rollout engine and the small repository the harness tests solve.

:class:`ScriptedEngine` implements :class:`~orchard.rollout.engine.RolloutEngine` by replaying
pre-written assistant texts, tokenised with the real Qwen3 tokenizer and closed with
``<|im_end|>``, so every turn has real token ids and (made-up, deterministic) logprobs. It records
each prompt and sampling it is given, and honours ``max_tokens`` by cutting the reply
(``finish_reason="length"``), as a real engine would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

from orchard.data.tokenizer import Tokenizer
from orchard.env.client import AsyncSandbox
from orchard.rollout.types import Completion, SamplingParams


class ScriptedEngine:
    def __init__(self, tokenizer: Tokenizer, replies: Sequence[str | BaseException], *, text: bool = False) -> None:
        self.tokenizer = tokenizer
        self.replies = list(replies)
        self.with_text = text  # engines with a tokenizer return text; the policy must cope with both
        self.prompts: list[list[int]] = []
        self.samplings: list[SamplingParams] = []
        self.images: list[list] = []  # per call, the pixels given with its prompt (a vision policy's)
        self.called = threading.Event()
        self.end = tokenizer.token_id("<|im_end|>")

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams,
                 images: Sequence[Sequence] | None = None) -> list[Completion]:
        self.images.append([list(row) for row in images] if images is not None else [])
        completions = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            self.samplings.append(sampling)
            self.called.set()
            if not self.replies:
                raise RuntimeError("the script has no more replies")
            reply = self.replies.pop(0)
            if isinstance(reply, BaseException):
                raise reply
            ids, finish = [*self.tokenizer.encode(reply), self.end], "stop"
            if len(ids) > sampling.max_tokens:
                ids, finish = ids[:sampling.max_tokens], "length"
            logprobs = [-0.05 - 0.01 * (i % 7) for i in range(len(ids))]
            text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.with_text else None
            completions.append(Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, text=text))
        return completions

    def update_weights(self, weights) -> None:
        raise NotImplementedError("a scripted engine has no weights")


def call(name: str, **arguments) -> str:
    """A Qwen3 ``<tool_call>`` block, as the model writes one."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


REPO = "/workspace/repo"
CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TEST_CALC = ("import unittest\n\nfrom calc import add, mul\n\n\nclass CalcTest(unittest.TestCase):\n"
             "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
             "    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n"
             "if __name__ == \"__main__\":\n    unittest.main()\n")


async def make_repo(sandbox: AsyncSandbox) -> None:
    """A git repository with a bug in ``calc.add`` and a test that catches it, committed."""
    await sandbox.write_file(f"{REPO}/calc.py", CALC)
    await sandbox.write_file(f"{REPO}/test_calc.py", TEST_CALC)
    await sandbox.write_file(f"{REPO}/.gitignore", "__pycache__/\n")
    (await sandbox.exec("git init -q && git add -A && git -c user.name=t -c user.email=t@example.com "
                        "commit -qm initial", cwd=REPO, timeout=60)).check()
