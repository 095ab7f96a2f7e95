"""The local sites' intents, end to end through the episode runner with a sandbox pool (one browser
per sandbox, a fresh context per episode): the oracle solves each intent, its failing variant
scores 0, and the human-verification page gives reward ``None`` whatever the answer."""

from __future__ import annotations

import asyncio

import pytest

from orchard.harness.browser import BrowserHarness
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.tasks.gui.oracle import GUIOracle
from orchard.tasks.gui.sites import KINDS, Shop, SiteTask
from tests.conftest import require_root


def test_a_shop_is_a_function_of_its_seed():
    assert Shop.generate(4) == Shop.generate(4) != Shop.generate(5)
    shop = Shop.generate(4)
    assert len({price for _, _, price, _ in shop.products}) == len(shop.products)  # "the cheaper" is unique
    task = SiteTask("tabs", 4)
    assert task.answer in task.prompt  # the cheaper product is one of the two named...
    assert SiteTask("price", 4).answer not in SiteTask("price", 4).prompt  # ...but a price is never in the intent
    with pytest.raises(ValueError, match="unknown site task kind"):
        SiteTask("search", 1)


async def test_each_intent_is_solved_failed_or_blocked_as_it_should(aclient):
    require_root()
    harness = BrowserHarness()
    async with SandboxPool(size=2) as pool:
        runner = EpisodeRunner(aclient, harness, concurrency=2, pool=pool)
        jobs = [(task, variant) for kind in KINDS for task in (SiteTask(kind, 11),) for variant in ("clean", "fail")]
        trajectories = await asyncio.gather(*(runner.run_one(task, seed=i, policy=GUIOracle(task, variant))
                                              for i, (task, variant) in enumerate(jobs)))
        assert sum(len(boxes) for boxes in pool.idle.values()) == 2  # kept for later episodes, not one each
    for (task, variant), trajectory in zip(jobs, trajectories, strict=True):
        outcome, info = trajectory.outcome, trajectory.metadata
        assert outcome.status == "completed", (task.id, info.get("error"))
        if task.kind == "captcha" and variant == "clean":
            assert outcome.reward is None and info["verdict"] == "blocked"
        elif variant == "clean":
            assert (outcome.reward, outcome.resolved, info["submission"]) == (1.0, True, task.answer), task.id
        else:
            assert (outcome.reward, outcome.resolved, info["verdict"]) == (0.0, False, "failure"), task.id
    steps = {task.kind: t.metadata["steps"] for (task, variant), t in zip(jobs, trajectories, strict=True)
             if variant == "clean"}
    assert steps == {"price": 2, "go_back": 4, "goto_url": 2, "tabs": 6, "captcha": 5}
    tools = {task.kind: [c.name for m in t.messages for c in m.tool_calls]
             for (task, variant), t in zip(jobs, trajectories, strict=True) if variant == "clean"}
    assert tools["go_back"] == ["click", "go_back", "click", "done"]
    assert tools["goto_url"] == ["goto_url", "done"]
    assert tools["tabs"] == ["new_tab", "new_tab", "switch_tab", "close_tab", "close_tab", "done"]
