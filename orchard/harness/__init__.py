"""Harnesses: the agent loop (ReAct core), its policies, and the bash and CodeAct harnesses on it.

.. code-block:: python

    from orchard.harness import BashHarness, EnginePolicy, FunctionTask, Limits, run_episode

    policy = EnginePolicy(engine, Qwen3Format(tokenizer), SamplingParams(max_tokens=2048, temperature=0.7))
    task = FunctionTask("fix-1", "Fix the failing test.", setup_fn=make_repo)   # or any Task: SWE, GUI, Claw
    async with orchestrator.async_client() as client:
        trajectory = await run_episode(client, BashHarness(), policy, task, limits=Limits(max_turns=50))
    trajectory.outcome.status, trajectory.metadata["submission"]

``core`` (the loop, limits, the Policy and Harness protocols), ``task`` (the Task protocol),
``policies`` (EnginePolicy, OpenAIChatPolicy), ``episode`` (sandboxes and many episodes at once),
``seeds`` (the seed formula), ``bash``, ``codeact`` and ``editor``.
"""

from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.harness.core import (
    ContextLimitExceeded,
    Conversation,
    FormatError,
    Harness,
    Limits,
    Observation,
    Policy,
    Turn,
    run_agent,
)
from orchard.harness.episode import EpisodeRunner, run_episode
from orchard.harness.policies import EnginePolicy, OpenAIChatPolicy, PolicyError
from orchard.harness.task import FunctionTask, Task, TaskFamily

__all__ = ["BashHarness", "CodeActHarness", "ContextLimitExceeded", "Conversation", "EnginePolicy", "EpisodeRunner",
           "FormatError", "FunctionTask", "Harness", "Limits", "Observation", "OpenAIChatPolicy", "Policy",
           "PolicyError", "Task", "TaskFamily", "Turn", "run_agent", "run_episode"]
