"""Harnesses: the agent loop (ReAct core), its policies, and the bash and CodeAct harnesses on it.

.. code-block:: python

    from orchard.harness import BashHarness, EnginePolicy, Limits, run_episode

    policy = EnginePolicy(engine, Qwen3Format(tokenizer), SamplingParams(max_tokens=2048, temperature=0.7))
    async with orchestrator.async_client() as client:
        trajectory = await run_episode(client, BashHarness(), policy, "Fix the failing test.",
                                       setup=make_repo, limits=Limits(max_steps=50, time_limit=900))
    trajectory.outcome.status, trajectory.metadata["submission"]

``core`` (the loop, limits, the Policy and Harness protocols), ``policies`` (EnginePolicy,
OpenAIChatPolicy), ``episode`` (sandbox lifecycle), ``bash``, ``codeact`` and ``editor``.
"""

from orchard.harness.bash import BashHarness
from orchard.harness.codeact import CodeActHarness
from orchard.harness.core import (
    Action,
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
from orchard.harness.episode import run_episode
from orchard.harness.policies import EnginePolicy, OpenAIChatPolicy, PolicyError

__all__ = ["Action", "BashHarness", "CodeActHarness", "ContextLimitExceeded", "Conversation", "EnginePolicy",
           "FormatError", "Harness", "Limits", "Observation", "OpenAIChatPolicy", "Policy", "PolicyError", "Turn",
           "run_agent", "run_episode"]
