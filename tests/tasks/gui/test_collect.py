"""GUI teacher collection (shortest success per instance, a cap per site) and the held-out splits."""

from __future__ import annotations

import json

from orchard.data.trajectory import Message, Outcome, ToolCall, Trajectory
from orchard.harness.browser import BrowserHarness
from orchard.harness.episode import EpisodeRunner, SandboxPool
from orchard.tasks.gui.collect import HELD_OUT_SEED_START, collect, gui_splits, shortest_successes
from orchard.tasks.gui.judges import LLMJudge
from orchard.tasks.gui.sites import SiteTask
from tests.conftest import require_root


def run(task_id: str, actions: int, reward: float | None, format_errors: int = 0) -> Trajectory:
    messages = [Message(role="assistant", tool_calls=[ToolCall(name="wait", arguments={})]) for _ in range(actions)]
    return Trajectory(task_id=task_id, messages=messages, outcome=Outcome(reward=reward, resolved=reward == 1.0),
                      metadata={"format_errors": format_errors})


def test_the_shortest_success_per_instance_under_a_cap_per_site():
    runs = [run("a/1", 5, 1.0), run("a/1", 3, 1.0), run("a/1", 2, 0.0), run("a/1", 1, 1.0, format_errors=1),
            run("a/2", 4, 1.0), run("a/3", 2, 1.0), run("b/1", 6, 1.0), run("b/2", 1, None)]
    sites = {"a/1": "a", "a/2": "a", "a/3": "a", "b/1": "b", "b/2": "b"}
    kept = shortest_successes(runs, sites, cap_per_site=2)
    assert [(t.task_id, t.num_actions) for t in kept] == [("a/3", 2), ("a/1", 3), ("b/1", 6)]
    assert len(shortest_successes(runs, sites, cap_per_site=20)) == 4


def test_held_out_splits_share_no_instance_and_no_held_out_task_is_trained_on():
    keys = [f"page-{i}" for i in range(10)]
    splits = gui_splits(keys, train_seeds=3, held_out_seeds=2, held_out_task_fraction=0.2, seed=1)
    trained = {key for key, _ in splits.train}
    assert len(trained) == 8 and not trained & {key for key, _ in splits.held_out_task}
    assert {key for key, _ in splits.held_out_seed} == trained
    assert all(s < 3 for _, s in splits.train) and all(s >= HELD_OUT_SEED_START for _, s in splits.held_out_seed)
    assert gui_splits(keys, 3, 2, 0.2, seed=1) == splits != gui_splits(keys, 3, 2, 0.2, seed=2)


async def test_collection_through_the_real_harness_keeps_the_clean_runs(aclient, scripted_chat):
    """Teacher episodes through the real harness; an LLM judge (a scripted endpoint) judges each one
    beside the rule judge, and the summary reports their agreement."""
    require_root()
    tasks = [SiteTask("price", 21), SiteTask("goto_url", 21)]
    say = [json.dumps({"verdict": v}) for v in ("success", "success", "success", "success")]
    scripted_chat.replies += [*say, "I cannot tell", json.dumps({"verdict": "failure"})]
    judge = LLMJudge(scripted_chat.url, "judge", max_retries=0)
    async with SandboxPool(size=1) as pool:
        runner = EpisodeRunner(aclient, BrowserHarness(), concurrency=1, pool=pool)
        collection = await collect(runner, tasks, samples=3, progress=False, judge=judge)
    await judge.aclose()
    assert [t.metadata["verdict"] for t in collection.trajectories] == ["success", "success", "failure"] * 2
    assert all(len(r["messages"][0]["content"]) >= 2 for r in scripted_chat.requests)  # the text and screenshots
    assert len(collection.trajectories) == 6
    assert [t.task_id for t in collection.kept] == ["site/goto_url/21", "site/price/21"]
    assert all(t.metadata["format_errors"] == 0 and t.num_actions == 2 for t in collection.kept)
    summary = collection.summary()
    assert summary["episodes"] == 6 and summary["kept"] == 2 and 0 < summary["success_rate"] < 1
    assert (summary["judge_pairs"], summary["judge_unknown"], summary["judge_agreement"]) == (5, 1, 0.8)
