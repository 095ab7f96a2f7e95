"""GUI teacher collection and splits.

Collection follows the paper's SFT set (section 3.4): every task instance is tried ``samples``
times by the teacher (the oracle cycling through its variants, or any policy a factory makes)
through the real browser harness; of each instance's successful trajectories only the **shortest**
(fewest actions) is kept, and each site keeps at most ``cap_per_site`` of them (K = 20 in the
paper), the shortest first. Trajectories with a format error are not kept (a success with a slip
has reward 0, not +1, under :func:`~orchard.tasks.gui.judges.gui_reward`).

Splits are held out two ways, so that held-out numbers measure what they claim:

* **by seed**: the same pages with seeds from a range training never draws from (new instructions
  and layouts of familiar tasks);
* **by task**: whole pages (or site kinds) never trained on, chosen by the project's one split
  (:func:`~orchard.eval.splits.held_out_ids`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchard.data.trajectory import Trajectory
from orchard.eval.splits import held_out_ids
from orchard.harness.browser import screenshots
from orchard.harness.collection import Collection
from orchard.harness.collection import collect as collect_episodes
from orchard.harness.core import Policy
from orchard.harness.episode import EpisodeRunner
from orchard.harness.task import Task
from orchard.tasks.gui.judges import LLMJudge, Verdict
from orchard.tasks.gui.oracle import VARIANTS, GUIOracle

HELD_OUT_SEED_START = 1_000_000  # held-out-by-seed instances draw their seeds from here up; training below


class GUITask(Task, Protocol):
    @property
    def site(self) -> str: ...


TeacherFactory = Callable[[GUITask, int], Policy]  # (task, sample index)


def oracle_teacher(task: GUITask, sample: int, marks: bool = False) -> Policy:
    """The default teacher: the oracle, cycling clean, wander and fail over the samples (with ``marks``,
    writing the set-of-marks mode's calls)."""
    return GUIOracle(task, VARIANTS[sample % len(VARIANTS)], seed=sample, marks=marks)


def shortest_successes(trajectories: Sequence[Trajectory], sites: dict[str, str],
                       cap_per_site: int = 20) -> list[Trajectory]:
    """The shortest successful trajectory of each task instance (``sites`` maps task id to site),
    then at most ``cap_per_site`` per site, the shortest kept; ties go to the earlier trajectory."""
    if cap_per_site < 1:
        raise ValueError(f"cap_per_site must be at least 1, got {cap_per_site}")
    best: dict[str, Trajectory] = {}
    for trajectory in trajectories:
        outcome = trajectory.outcome
        if not (outcome.resolved and outcome.reward == 1.0) or trajectory.metadata.get("format_errors", 0):
            continue
        kept = best.get(trajectory.task_id)
        if kept is None or trajectory.num_actions < kept.num_actions:
            best[trajectory.task_id] = trajectory
    by_site: dict[str, list[Trajectory]] = defaultdict(list)
    for task_id, trajectory in best.items():
        by_site[sites[task_id]].append(trajectory)
    order = {id(t): i for i, t in enumerate(trajectories)}
    chosen = []
    for site in sorted(by_site):
        ranked = sorted(by_site[site], key=lambda t: (t.num_actions, order[id(t)]))
        chosen += ranked[:cap_per_site]
    return chosen


@dataclass
class GUICollection(Collection):
    """Every trajectory the teacher produced, and (``kept``) the SFT set chosen from them."""

    def summary(self) -> dict[str, float | int | None]:
        done = [t for t in self.trajectories if t.outcome.reward is not None]
        return {"episodes": len(self.trajectories), "dropped": len(self.trajectories) - len(done),
                "success_rate": sum(t.outcome.resolved for t in done) / max(len(done), 1),
                "kept": len(self.kept), "mean_kept_actions": sum(t.num_actions for t in self.kept) / max(len(self.kept), 1),
                **loop_seconds(self.trajectories), **judge_agreement(self.trajectories)}


def loop_seconds(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Seconds the episodes' agent loops spent in the policy and in the environment (the browser's
    actions and observations; page set-up and grading are outside the loop)."""
    return {"policy_s": sum(t.metadata.get("policy_s", 0.0) for t in trajectories),
            "env_s": sum(t.metadata.get("env_s", 0.0) for t in trajectories)}


def judge_agreement(trajectories: Sequence[Trajectory]) -> dict[str, float | int | None]:
    """How often the LLM judge agreed with the rule judge, over the episodes both gave a verdict of
    success or failure (``llm_verdict`` in the metadata: :func:`collect` with a ``judge``)."""
    pairs = [(t.metadata["verdict"], t.metadata["llm_verdict"]) for t in trajectories
             if {t.metadata.get("verdict"), t.metadata.get("llm_verdict")} <= {Verdict.SUCCESS, Verdict.FAILURE}]
    unknown = sum(t.metadata.get("llm_verdict") == Verdict.UNKNOWN for t in trajectories)
    return {"judge_pairs": len(pairs), "judge_unknown": unknown,
            "judge_agreement": sum(a == b for a, b in pairs) / len(pairs) if pairs else None}


async def collect(runner: EpisodeRunner, tasks: Sequence[GUITask], *, samples: int = 3, cap_per_site: int = 20,
                  teacher: TeacherFactory = oracle_teacher, run_seed: int = 0, progress: bool = True,
                  judge: LLMJudge | None = None, judge_screenshots: int = 3) -> GUICollection:
    """Run the teacher ``samples`` times on every task through ``runner`` (whose harness is the
    browser harness), then keep the shortest success per instance under the per-site cap. With an
    LLM ``judge``, every graded episode is also judged by it (the intent, the final response and the
    last ``judge_screenshots`` screenshots) and the summary reports how often the two judges agree;
    the rule judge's verdict still decides the reward."""
    async def judged(task: Task, trajectory: Trajectory) -> Trajectory:
        trajectory.metadata["site"] = task.site  # type: ignore[attr-defined]
        if judge is not None and "verdict" in trajectory.metadata:
            shots = screenshots(trajectory, runner.harness.images, last=judge_screenshots)
            verdict = await judge.judge(task.prompt, trajectory.metadata.get("submission"), shots)
            trajectory.metadata.update(llm_verdict=str(verdict.verdict), llm_reason=verdict.reason)
        return trajectory

    collection = await collect_episodes(runner, tasks, [runner.harness], lambda task, harness, k: teacher(task, k),
                                        samples, seed=run_seed, after=judged, progress=progress,
                                        desc="GUI teacher episodes", kind=GUICollection)
    collection.kept = shortest_successes(collection.trajectories, {t.id: t.site for t in tasks}, cap_per_site)
    return collection


@dataclass(frozen=True)
class GUISplits:
    """Task keys (a page or site kind) and seeds for each split."""

    train: list[tuple[str, int]]
    held_out_seed: list[tuple[str, int]]
    held_out_task: list[tuple[str, int]]


def gui_splits(keys: Sequence[str], train_seeds: int, held_out_seeds: int, held_out_task_fraction: float,
               seed: int = 0) -> GUISplits:
    """Split ``keys`` (MiniWoB pages, site kinds) into training instances (seeds ``0..train_seeds-1``),
    held-out-by-seed instances of the same keys (seeds from :data:`HELD_OUT_SEED_START`), and
    held-out-by-task instances of keys never trained on (a seeded fraction of the keys)."""
    unseen = held_out_ids(keys, held_out_task_fraction, seed, purpose="held-out-pages",
                          at_least_one=held_out_task_fraction > 0)
    seen = [key for key in keys if key not in unseen]
    fresh = range(HELD_OUT_SEED_START, HELD_OUT_SEED_START + held_out_seeds)
    return GUISplits(train=[(key, s) for key in seen for s in range(train_seeds)],
                     held_out_seed=[(key, s) for key in seen for s in fresh],
                     held_out_task=[(key, s) for key in sorted(unseen) for s in fresh])
