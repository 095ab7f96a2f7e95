"""Trajectories to training examples: the credit-assignment SFT masks, token by token."""

from __future__ import annotations

import pytest

from orchard.data.chat import Qwen3Format
from orchard.data.examples import to_example, to_examples
from orchard.data.tokenizer import Tokenizer
from orchard.data.trajectory import Message, Outcome, ToolCall, Trajectory
from tests.fixtures.chat.qwen3_tokenizer import qwen3_tokenizer_dir

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_pretrained(qwen3_tokenizer_dir())


def run(resolved: bool, **fields) -> Trajectory:
    messages = [Message(role="system", content="Fix bugs."), Message(role="user", content="Fix calc.py")]
    for step, command in enumerate(["ls", "cat calc.py", "rm -rf /"]):
        messages.append(Message(role="assistant", content=f"Step {step}.",
                                tool_calls=[ToolCall(id=f"c{step}", name="bash", arguments={"command": command})]))
        messages.append(Message(role="tool", content=f"output {step}", tool_call_id=f"c{step}"))
    return Trajectory(task_id="calc", messages=messages, tools=TOOLS, outcome=Outcome(resolved=resolved), **fields)


def trained_texts(tokenizer: Tokenizer, example) -> list[str]:
    """The decoded runs of consecutive trained tokens."""
    runs, current = [], []
    for token, keep in zip(example.token_ids, example.loss_mask, strict=True):
        if keep:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def action(step: int, command: str) -> str:
    return (f'Step {step}.\n<tool_call>\n{{"name": "bash", "arguments": {{"command": "{command}"}}}}\n'
            "</tool_call><|im_end|>")


def test_a_resolved_trajectory_trains_on_every_action_and_nothing_else(tokenizer):
    example = to_example(run(resolved=True), Qwen3Format(tokenizer))
    assert trained_texts(tokenizer, example) == [action(0, "ls"), action(1, "cat calc.py"), action(2, "rm -rf /")]
    full = Qwen3Format(tokenizer).render([m.to_chat() for m in run(True).messages], tools=TOOLS)
    assert example.token_ids == full.token_ids  # the mask changes, the tokens do not


def test_an_unresolved_trajectory_trains_only_inside_rise_segments(tokenizer):
    chat = Qwen3Format(tokenizer)
    segmented = to_example(run(resolved=False, rise_segments=[(1, 1)]), chat)
    assert trained_texts(tokenizer, segmented) == [action(1, "cat calc.py")]
    from_values = to_example(run(resolved=False, values=[0.1, 0.3, 0.5, 0.0]), chat)  # rises on actions 0 and 1
    assert trained_texts(tokenizer, from_values) == [action(0, "ls"), action(1, "cat calc.py")]
    assert not any(to_example(run(resolved=False, values=[0.5, 0.4, 0.3, 0.0]), chat).loss_mask)
    with pytest.raises(ValueError, match="annotate it"):
        to_example(run(resolved=False), chat)


def test_the_ablations_teach_an_unresolved_trajectory_whole_or_not_at_all(tokenizer):
    """The credit-assignment ablation's arms: rise segments (the method), the whole failed run, or none of it
    (resolved-only SFT, where the run gives no example, not even its observations); a resolved run is the
    same in every arm."""
    chat = Qwen3Format(tokenizer)
    failed = run(resolved=False, rise_segments=[(1, 1)])
    every = [action(0, "ls"), action(1, "cat calc.py"), action(2, "rm -rf /")]
    assert trained_texts(tokenizer, to_example(failed, chat, unresolved="rise")) == [action(1, "cat calc.py")]
    assert trained_texts(tokenizer, to_example(failed, chat, unresolved="whole")) == every
    assert to_examples(failed, chat, observation_weight=0.5, unresolved="drop") == []
    for arm in ("rise", "whole", "drop"):
        assert trained_texts(tokenizer, to_example(run(resolved=True), chat, unresolved=arm)) == every
    with pytest.raises(ValueError, match="unresolved must be one of"):
        to_example(failed, chat, unresolved="some")


def test_an_action_the_trajectory_names_untaught_carries_no_loss_in_any_arm(tokenizer):
    """A scripted teacher's deliberate mistake (orchard.tasks.claw.oracle's recover variant) stays in the row, so
    the recovery after it is taught, and is never taught itself."""
    chat = Qwen3Format(tokenizer)
    erred = run(resolved=True, metadata={"untaught_actions": [2]})
    assert trained_texts(tokenizer, to_example(erred, chat)) == [action(0, "ls"), action(1, "cat calc.py")]
    assert trained_texts(tokenizer, to_example(erred, chat, unresolved="whole")) == [action(0, "ls"), action(1, "cat calc.py")]
    failed = run(resolved=False, rise_segments=[(1, 2)], metadata={"untaught_actions": [2]})
    assert trained_texts(tokenizer, to_example(failed, chat)) == [action(1, "cat calc.py")]


def test_recorded_token_ids_are_used_as_sampled(tokenizer):
    chat = Qwen3Format(tokenizer)
    end = tokenizer.token_id("<|im_end|>")
    odd = [tokenizer.token_id("<think>"), *tokenizer.encode("h"), *tokenizer.encode("ello"), end]  # not BPE's split
    cut = tokenizer.encode("partial answ")  # a turn cut off by max_tokens: no end token
    messages = [Message(role="user", content="Hi"), Message(role="assistant", content="ignored", token_ids=odd),
                Message(role="user", content="More"), Message(role="assistant", content="ignored", token_ids=cut)]
    example = to_example(Trajectory(task_id="t", messages=messages, outcome=Outcome(resolved=True)), chat)
    trained = [t for t, keep in zip(example.token_ids, example.loss_mask, strict=True) if keep]
    assert trained == odd + cut  # exactly the sampled ids, and the added end of the cut turn is not trained
    prompt = chat.render([{"role": "user", "content": "Hi"}], add_generation_prompt=True).token_ids
    assert example.token_ids[: len(prompt) + len(odd)] == prompt + odd
    assert example.token_ids[-2:] == [end, *tokenizer.encode("\n")] and not example.loss_mask[-2]


def test_observation_weight_weighs_what_the_model_is_shown_and_never_an_untaught_action(tokenizer):
    chat = Qwen3Format(tokenizer)
    trajectory = run(resolved=False, rise_segments=[(1, 1)])
    example = to_example(trajectory, chat, observation_weight=0.25)
    plain = to_example(trajectory, chat)
    assert example.token_ids == plain.token_ids
    assert set(example.loss_mask) == {0.0, 0.25, 1.0}
    # the taught action keeps weight 1; actions outside the rise segments stay at 0
    assert [w == 1.0 for w in example.loss_mask] == [w == 1.0 for w in plain.loss_mask]
    rendered = chat.render([m.to_chat() for m in trajectory.messages], tools=TOOLS)
    actions = [(start, end) for role, start, end in rendered.spans if role == "assistant"]
    for index in (0, 2):
        start, end = actions[index]
        assert example.loss_mask[start:end] == [0.0] * (end - start)
    # every other token (system, user, tool output, turn headers) has the observation weight
    in_actions = {i for start, end in actions for i in range(start, end)}
    assert all(w == 0.25 for i, w in enumerate(example.loss_mask) if i not in in_actions)
    assert tokenizer.decode([t for t, w in zip(example.token_ids, example.loss_mask, strict=True) if w == 0.25]
                            ).count("output 1") == 1
    with pytest.raises(ValueError, match="observation_weight"):
        to_example(trajectory, chat, observation_weight=1.5)


def test_a_recorded_trajectory_trains_on_its_own_ids_never_rendered():
    """A proxied harness's turns: the second call's prompt extends the first call's ids (one row), the
    third starts afresh (its own row); an action outside the rise segments carries no loss."""
    sampled = [Message(role="assistant", content="a", token_ids=[4, 5], logprobs=[-0.1, -0.2]),
               Message(role="assistant", content="b", token_ids=[8], logprobs=[-0.3]),
               Message(role="assistant", content="c", token_ids=[10, 11], logprobs=[-0.4, -0.5])]
    trajectory = Trajectory(task_id="t", messages=[Message(role="user", content="go"), *sampled],
                            outcome=Outcome(reward=-1.0, resolved=False), rise_segments=[(0, 0), (2, 2)],
                            metadata={"recorded_prompt_ids": [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7], [9]]})
    first, second = to_examples(trajectory, chat_format=None, observation_weight=0.25)
    assert first.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert first.loss_mask == [0.25, 0.25, 0.25, 1.0, 1.0, 0.25, 0.25, 0.0]  # action 1 is outside the segments
    assert second.token_ids == [9, 10, 11] and second.loss_mask == [0.25, 1.0, 1.0]
    broken = trajectory.model_copy(update={"metadata": {"recorded_prompt_ids": [[1, 2, 3]]}})
    with pytest.raises(ValueError, match="do not match its sampled turns"):
        to_examples(broken, chat_format=None)


def test_turn_examples_train_each_turn_alone_under_the_latest_screenshot(tokenizer):
    """The paper's GUI SFT: one example per assistant turn, the loss on that turn only, the prompt
    showing only the latest screenshot (k = 1) as the policy samples it."""
    from orchard.data.chat import make_chat_format
    from orchard.data.examples import latest_images, turn_examples
    from orchard.data.images import ImageRef

    shots = [ImageRef(sha256=str(i) * 64, width=64, height=32) for i in range(2)]
    trajectory = Trajectory(task_id="t", policy="oracle", harness="browser", outcome=Outcome(reward=1.0, resolved=True),
                            messages=[Message(role="user", content="Click OK.", images=[shots[0]]),
                                      Message(role="assistant", reasoning="first", tool_calls=[
                                          ToolCall(id="a", name="click", arguments={"x": 1, "y": 2})]),
                                      Message(role="tool", content="clicked", tool_call_id="a", images=[shots[1]]),
                                      Message(role="assistant", reasoning="second", tool_calls=[
                                          ToolCall(id="b", name="done", arguments={"response": "ok"})])])
    chat = make_chat_format("qwen3_vl", tokenizer, lambda w, h: (w // 32) * (h // 32))
    pad = tokenizer.token_id("<|image_pad|>")
    first, second = turn_examples(trajectory, chat, latest_images(1))
    for example, reasoning, other in ((first, "first", "second"), (second, "second", "first")):
        taught = tokenizer.decode([t for t, m in zip(example["token_ids"], example["loss_mask"], strict=True) if m])
        assert reasoning in taught and other not in taught and "Click OK" not in taught and "clicked" not in taught
        assert example["token_ids"].count(pad) == 2  # one 64 x 32 screenshot: the latest only
    assert "clicked" in tokenizer.decode(second["token_ids"]) and "first" in tokenizer.decode(second["token_ids"])
