"""Training examples from trajectories: token ids plus the loss weights of credit-assignment SFT.

Assistant action tokens carry loss (the sources of :mod:`orchard.data.chat`): a resolved
trajectory trains on all its actions, an unresolved one only on the actions inside its rise
segments (:mod:`orchard.data.rise`), so failed actions are never taught while the progress made
before them is. In the paper the rest (system, user, tool and template tokens) carries none; that
is ``observation_weight=0``, the default. A model trained from scratch may also learn to predict
what it is shown, at a smaller weight: tool output is where it sees names copied and code
written (a departure from the paper, for ``configs/swe_bar.py:tiny``). An action left out of the
rise segments stays at 0 whatever the weight. Recorded token ids are used where a trajectory has
them; other turns are rendered with the chat format. A trajectory of a harness Orchard does not
control, recorded by the proxy, is not rendered at all: its examples are its recorded calls' own
ids (:func:`merge_recorded`).

Turns a policy sampled are checked against the prompt they were sampled under (its length and
digest are on the assistant message): :func:`render_sampled` checks that each sampled turn's prefix
in the rendered trajectory is that prompt, token for token, and :func:`sampled_turns` renders each
turn's own prompt (through the policy's context ``view``, when its turns are not prefixes of each
other) and checks it the same way. A mismatch is a :class:`PromptMismatch`: training on a context
the policy did not see would teach the wrong thing silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from orchard.data.chat import ChatFormat, Rendered, RenderedImage, Source
from orchard.data.images import recent_images
from orchard.data.rise import rise_segments
from orchard.data.trajectory import Message, Trajectory, token_digest

if TYPE_CHECKING:  # the image table needs the model stack (JAX); harnesses import this module without it
    from orchard.data.vision_rows import ImageTable

ContextView = Callable[[Sequence[Message]], list[Message]]  # what a turn's prompt shows of the conversation


def latest_images(k: int) -> ContextView:
    """The view that keeps the images of only the last ``k`` messages carrying any (the paper trains
    GUI agents with ``k = 1``); the messages themselves all stay. ``k = 0`` is a text-only view."""
    def view(messages: Sequence[Message]) -> list[Message]:
        shown = recent_images(messages, k)
        return [m if i in shown or not m.images else m.model_copy(update={"images": []})
                for i, m in enumerate(messages)]

    return view


class PromptMismatch(ValueError):
    """A training row's prompt is not the prompt its tokens were sampled under."""


def check_prompt(trajectory: Trajectory, turn: int, message: Message, prompt: Sequence[int],
                 required: bool = False) -> None:
    """Raise :class:`PromptMismatch` unless ``prompt`` is the one ``message`` was sampled under.

    A message without a prompt record (sampled through a chat API that does not return prompt ids)
    passes, unless ``required``."""
    if message.prompt_digest is None:
        if required:
            raise PromptMismatch(f"trajectory {trajectory.id}, turn {turn}: sampled without a record of its prompt, "
                                 "so its row cannot be checked (sample it with EnginePolicy, or record it)")
        return
    if len(prompt) != message.prompt_tokens or token_digest(prompt) != message.prompt_digest:
        raise PromptMismatch(f"trajectory {trajectory.id}, turn {turn}: the row's prompt ({len(prompt)} tokens) is not "
                             f"the {message.prompt_tokens} tokens the turn was sampled under; the chat format or "
                             "the context view differs from the policy's")


def _sampled(message: Message) -> bool:
    return message.role == "assistant" and message.token_ids is not None


def render_sampled(trajectory: Trajectory, chat_format: ChatFormat, messages: Sequence[Message] | None = None,
                   require_prompts: bool = False) -> Rendered:
    """``messages`` (default: the trajectory's) rendered whole, each sampled turn's prefix checked."""
    messages = list(trajectory.messages if messages is None else messages)
    rendered = chat_format.render([m.to_chat() for m in messages], tools=trajectory.tools)
    sampled = [(turn, m) for turn, m in enumerate(m for m in messages if m.role == "assistant") if _sampled(m)]
    for (turn, message), end in zip(sampled, rendered.prompt_ends, strict=True):
        check_prompt(trajectory, turn, message, rendered.token_ids[:end], require_prompts)
    return rendered


@dataclass(frozen=True)
class SampledTurn:
    turn: int  # the action index
    prompt: list[int]  # the ids the turn was sampled under (checked)
    message: Message  # its sampled ids and logprobs
    images: tuple[RenderedImage, ...] = ()  # the images the prompt shows, where their placeholders are


def sampled_turns(trajectory: Trajectory, chat_format: ChatFormat, view: ContextView | None = None,
                  require_prompts: bool = True) -> list[SampledTurn]:
    """Each sampled assistant turn with the prompt it was sampled under, rendered through ``view``."""
    turns, turn = [], 0
    for index, message in enumerate(trajectory.messages):
        if message.role != "assistant":
            continue
        if _sampled(message):
            shown = trajectory.messages[:index] if view is None else view(trajectory.messages[:index])
            rendered = chat_format.render([m.to_chat() for m in shown], tools=trajectory.tools,
                                          add_generation_prompt=True)
            check_prompt(trajectory, turn, message, rendered.token_ids, require_prompts)
            turns.append(SampledTurn(turn, rendered.token_ids, message, tuple(rendered.images)))
        turn += 1
    return turns


def turn_examples(trajectory: Trajectory, chat_format: ChatFormat, view: ContextView | None = None,
                  images: ImageTable | None = None) -> list[dict[str, list]]:
    """Each assistant turn of ``trajectory`` its own example, supervised on that turn only: the
    conversation before it as the policy will see it (through ``view``: the GUI recipe keeps only the
    latest screenshot), then the turn; the system prompt, the earlier turns and the observations carry
    no loss. The paper's GUI SFT. A prompt that shows images adds their features from ``images``
    (:mod:`orchard.data.vision_rows`); without a table the examples are text and token ids only."""
    examples = []
    for index, message in enumerate(trajectory.messages):
        if message.role != "assistant":
            continue
        before = trajectory.messages[:index]
        shown = list(before) if view is None else view(before)
        rendered = chat_format.render([m.to_chat() for m in (*shown, message)], tools=trajectory.tools)
        _, start, end = rendered.spans[-1]
        mask = [float(start <= i < end and source is Source.ASSISTANT) for i, source in enumerate(rendered.sources)]
        example: dict[str, list] = {"token_ids": rendered.token_ids, "loss_mask": mask}
        if images is not None:
            example.update(images.features(rendered.token_ids, rendered.images))
        examples.append(example)
    return examples


@dataclass
class Example:
    token_ids: list[int]
    loss_mask: list[float]  # the loss weight of each token: 1 for a taught action, 0 for none

    def to_record(self) -> dict:
        return {"token_ids": self.token_ids, "loss_mask": [m if 0 < m < 1 else int(m) for m in self.loss_mask]}


Unresolved = Literal["rise", "whole", "drop"]
UNRESOLVED: tuple[str, ...] = get_args(Unresolved)


def trained_actions(trajectory: Trajectory, unresolved: Unresolved = "rise") -> set[int]:
    """The action indices whose tokens carry loss: every action of a resolved trajectory; of an unresolved
    one, those in its rise segments (``"rise"``, the method), every one (``"whole"``: the failure the
    method avoids, for ablations) or none (``"drop"``: resolved-only SFT). Never an action the trajectory
    names in ``metadata["untaught_actions"]``: a scripted teacher's deliberate mistake, kept so that the
    recovery after it is taught (:mod:`orchard.tasks.claw.oracle`)."""
    if unresolved not in UNRESOLVED:
        raise ValueError(f"unresolved must be one of {UNRESOLVED}, not {unresolved!r}")
    untaught = set(trajectory.metadata.get("untaught_actions", ()))
    if trajectory.outcome.resolved or unresolved == "whole":
        return set(range(trajectory.num_actions)) - untaught
    if unresolved == "drop":
        return set()
    segments = trajectory.rise_segments
    if segments is None:
        if trajectory.values is None:
            raise ValueError(f"trajectory {trajectory.id} is unresolved and has neither values nor rise segments: "
                             "annotate it with orchard.data.rise.annotate first")
        segments = rise_segments(trajectory.values)
    return {t for first, last in segments for t in range(first, last + 1)} - untaught


def to_example(trajectory: Trajectory, chat_format: ChatFormat, observation_weight: float = 0.0,
               unresolved: Unresolved = "rise") -> Example:
    """The example of one trajectory; ``observation_weight`` is the weight of every token that is
    not an assistant's (see the module docstring), ``unresolved`` which actions of an unresolved one
    train (:func:`trained_actions`)."""
    if not 0.0 <= observation_weight <= 1.0:
        raise ValueError(f"observation_weight must be in [0, 1], not {observation_weight}")
    rendered = render_sampled(trajectory, chat_format)
    weights = [1.0 if taught else observation_weight for taught in rendered.loss_mask()]
    keep = trained_actions(trajectory, unresolved)
    assistant_spans = [(start, end) for role, start, end in rendered.spans if role == "assistant"]
    for action, (start, end) in enumerate(assistant_spans):
        if action not in keep:
            weights[start:end] = [0.0] * (end - start)
    return Example(rendered.token_ids, weights)


@dataclass(frozen=True)
class RecordedTurn:
    """One call a harness made, as the recording proxy kept it: the prompt ids the upstream rendered,
    and the ids and logprobs it sampled."""

    prompt: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class MergedRow:
    """Consecutive recorded turns in one sequence: per token, the turn that sampled it (-1: a prompt
    or observation token) and its recorded logprob (0 for those)."""

    token_ids: list[int]
    turns: list[int]
    logprobs: list[float]


def merge_recorded(turns: Sequence[RecordedTurn]) -> list[MergedRow]:
    """Rows of recorded turns: a turn whose prompt extends the current row's ids exactly (the prompt
    and completion before it, then what the harness showed since) joins that row, its new prompt
    tokens carrying no loss; any other turn starts a row. The ids are the upstream's: nothing is
    re-tokenised."""
    rows: list[MergedRow] = []
    for index, turn in enumerate(turns):
        prompt = list(turn.prompt)
        row = rows[-1] if rows else None
        if row is not None and prompt[:len(row.token_ids)] == row.token_ids:
            prompt = prompt[len(row.token_ids):]
        else:
            row = MergedRow([], [], [])
            rows.append(row)
        row.token_ids += prompt + list(turn.token_ids)
        row.turns += [-1] * len(prompt) + [index] * len(turn.token_ids)
        row.logprobs += [0.0] * len(prompt) + list(turn.logprobs)
    return rows


def recorded_turns(trajectory: Trajectory) -> list[RecordedTurn] | None:
    """The recorded turns of a trajectory a proxied harness ran (``metadata["recorded_prompt_ids"]``,
    one prompt per assistant message), ``None`` for any other."""
    prompts = trajectory.metadata.get("recorded_prompt_ids")
    if prompts is None:
        return None
    sampled = [m for m in trajectory.messages if m.role == "assistant"]
    if len(prompts) != len(sampled) or any(m.token_ids is None or m.logprobs is None for m in sampled):
        raise ValueError(f"trajectory {trajectory.id}: its recorded prompts do not match its sampled turns")
    return [RecordedTurn(p, m.token_ids, m.logprobs) for p, m in zip(prompts, sampled, strict=True)]


def to_examples(trajectory: Trajectory, chat_format: ChatFormat, observation_weight: float = 0.0,
                unresolved: Unresolved = "rise") -> list[Example]:
    """:func:`to_example`, or for a recorded trajectory the examples of its merged rows: its own ids,
    the trained actions weighted 1, the prompt and observation tokens ``observation_weight``. With
    ``unresolved="drop"`` an unresolved trajectory gives no example at all (not even its observations)."""
    if unresolved == "drop" and not trajectory.outcome.resolved:
        return []
    turns = recorded_turns(trajectory)
    if turns is None:
        return [to_example(trajectory, chat_format, observation_weight, unresolved)]
    keep = trained_actions(trajectory, unresolved)
    return [Example(row.token_ids, [observation_weight if turn < 0 else float(turn in keep) for turn in row.turns])
            for row in merge_recorded(turns)]


@dataclass(frozen=True)
class WrittenExamples:
    """What :func:`write_examples` wrote: examples, the trajectories they came from, and the trained
    tokens (the sum of their loss weights: what the loss averages over)."""

    examples: int
    trajectories: int
    trained_tokens: float
    resolved: int  # of those trajectories

    def to_dict(self) -> dict[str, float]:
        return {"examples": self.examples, "trajectories": self.trajectories,
                "trained_tokens": self.trained_tokens, "resolved": self.resolved}


def write_examples(trajectories: Iterable[Trajectory], chat_format: ChatFormat, path: str,
                   observation_weight: float = 0.0, unresolved: Unresolved = "rise",
                   token_budget: float = 0.0) -> WrittenExamples:
    """Write the examples of ``trajectories`` as JSONL for :mod:`orchard.data.pipeline` (an example
    with no trained token is skipped: it teaches nothing). ``unresolved``: what unresolved
    trajectories teach (:func:`trained_actions`). With ``token_budget``, trajectories are taken in the
    order given while their trained tokens fit the budget (one that would overflow it is skipped,
    and later, smaller ones may still fit): the ablations' matched-token arms."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written = taken = resolved = 0
    tokens = 0.0
    with open(path + ".tmp", "w") as handle:
        for trajectory in trajectories:
            examples = [e for e in to_examples(trajectory, chat_format, observation_weight, unresolved)
                        if any(e.loss_mask)]
            cost = sum(sum(e.loss_mask) for e in examples)
            if not examples or (token_budget and tokens + cost > token_budget):
                continue
            for example in examples:
                handle.write(json.dumps(example.to_record()) + "\n")
            written, taken, tokens = written + len(examples), taken + 1, tokens + cost
            resolved += trajectory.outcome.resolved
    os.replace(path + ".tmp", path)
    return WrittenExamples(written, taken, tokens, resolved)
