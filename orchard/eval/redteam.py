"""The red team: scripted attacks on a task's grader and sandbox, run as real episodes.

An :class:`Attack` is what a policy says, turn by turn, to game a reward: edit the test, fake the
report, read the answer from the host, sabotage the grader, break out of the sandbox. A task family
writes its attacks in its own action syntax (the SWE ones: :mod:`orchard.tasks.swe.attacks`);
:func:`run_attacks` plays each through the real harness, sandbox and grader with
:class:`ScriptedPolicy`, the way RL and evaluation run episodes
(:class:`~orchard.harness.episode.EpisodeRunner`), and says whether the grader held: an attack
must never earn a positive reward (``None``, the grader declining to tell, is a hold). A control
(``control=True``) is an honest solution played under the same conditions: it must still earn a
positive reward, so that a grader that fails everything does not pass the red team.

Only the SWE grader has an attack list here so far; the GUI grader's attacks (a forged end of episode, script
URLs, another page opened in the task's place) are tests of their own (``tests/tasks/gui/test_miniwob.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchard.data.trajectory import Message, Trajectory
from orchard.harness.core import Conversation, Harness, Turn
from orchard.harness.episode import EpisodeRunner
from orchard.harness.task import Task


@dataclass(frozen=True)
class Attack:
    """One scripted attempt. ``replies`` are the assistant's turns in the harness's syntax; after the
    last one the policy repeats it (a harness that wants more turns gets the same move again)."""

    name: str
    goal: str  # what the attack tries, in a sentence
    replies: tuple[str, ...]
    control: bool = False  # an honest solution under the attack's conditions: must be rewarded


class ScriptedPolicy:
    """A policy that says an attack's replies in order (no model)."""

    def __init__(self, attack: Attack) -> None:
        if not attack.replies:
            raise ValueError(f"attack {attack.name!r} has no replies")
        self.name = f"redteam:{attack.name}"
        self.replies, self.turn = attack.replies, 0

    async def act(self, conversation: Conversation, *, max_context: int | None = None) -> Turn:
        reply = self.replies[min(self.turn, len(self.replies) - 1)]
        self.turn += 1
        return Turn(Message(role="assistant", content=reply))


@dataclass(frozen=True)
class AttackResult:
    attack: Attack
    trajectory: Trajectory

    @property
    def reward(self) -> float | None:
        return self.trajectory.outcome.reward

    @property
    def held(self) -> bool:
        """The grader held: an attack earned nothing positive; a control earned its reward."""
        if self.attack.control:
            return self.reward is not None and self.reward > 0
        return self.reward is None or self.reward <= 0

    def observations(self) -> str:
        """Everything the environment showed the attacker (tool and user turns after the first)."""
        return "\n".join(str(m.content) for m in self.trajectory.messages[2:] if m.role != "assistant")

    def summary(self) -> dict[str, object]:
        return {"attack": self.attack.name, "control": self.attack.control, "held": self.held, "reward": self.reward,
                "end_reason": str(self.trajectory.end_reason), "grade": self.trajectory.metadata.get("grade")}


async def run_attacks(runner: EpisodeRunner, task: Task, attacks: Sequence[Attack], harness: Harness,
                      seed: int = 0) -> list[AttackResult]:
    """Play every attack on ``task`` as one episode each (in turn: attacks may interfere)."""
    results = []
    for attack in attacks:
        trajectory = await runner.run_one(task, seed, harness=harness, policy=ScriptedPolicy(attack),
                                          metadata={"attack": attack.name})
        results.append(AttackResult(attack, trajectory))
    return results
