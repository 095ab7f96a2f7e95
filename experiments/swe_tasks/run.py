"""Write a synthetic SWE task set: bugs put into a repository, kept when its tests catch them.

A thin wrapper over :func:`orchard.tasks.swe.generate.generate_task_set` (which documents the
procedure). Writes ``instances.jsonl`` (SWE-bench format, plus ``repo_path``), ``repos/<id>/``
(the buggy snapshots) and ``report.json`` (tried, kept, rejected by reason) under ``--out``, and
prints the report.

    python experiments/swe_tasks/run.py --source shipped --count 20        # the four shipped repos
    python experiments/swe_tasks/run.py --source toolz --count 20          # an installed package with tests
    python experiments/swe_tasks/run.py --source shipped --count 4 --verify 4   # also grade in sandboxes (root)

``--verify N`` grades the first N tasks in real sandboxes: the gold patch must resolve each one
and an empty patch must not.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from absl import app, flags
from tqdm import tqdm

from orchard.tasks.swe.bugs import KINDS
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.sources import SHIPPED, resolve_source

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

flags.DEFINE_list("source", ["shipped"], f"'shipped' (= {','.join(SHIPPED)}), a shipped name, or an installed "
                  "package that ships its tests (toolz, simplejson, ...); comma-separated")
flags.register_validator("source", bool, "--source names at least one source")
flags.DEFINE_integer("count", 20, "tasks to keep, spread evenly over the sources", lower_bound=1)
flags.DEFINE_string("out", None, "output directory (default: experiments/swe_tasks/results/<source>)")
flags.DEFINE_integer("seed", 0, "the mutations' seed")
flags.DEFINE_integer("max_tries", None, "candidates to try per source (default: 25 x its quota)", lower_bound=1)
flags.DEFINE_float("timeout", None,
                   "seconds per test run of a candidate (default: 10 x the baseline run, at least 10)")
flags.DEFINE_list("kinds", list(KINDS), "mutation kinds, comma-separated")
flags.register_validator("kinds", lambda kinds: bool(kinds) and set(kinds) <= set(KINDS),
                         f"known --kinds: {','.join(KINDS)}")
flags.DEFINE_bool("visible_tests", False, "keep the failing tests in the snapshot (SWE-smith) instead of "
                  "withholding them for test_patch (SWE-bench, the default)")
flags.DEFINE_integer("verify", 0, "grade the first N tasks in sandboxes", lower_bound=0)
flags.DEFINE_bool("progress", True, "show the progress bar (--noprogress hides it)")
FLAGS = flags.FLAGS


def verify(instances: list, count: int) -> Counter:
    """Grade gold and empty patches of the first ``count`` instances in fresh local sandboxes."""
    from orchard.env import local_server
    from orchard.tasks.swe.grading import evaluate

    outcome: Counter = Counter()
    with local_server() as server, server.client() as client:
        for instance in tqdm(instances[:count], desc="verify", unit="task"):
            gold = evaluate(client, instance, instance.patch, memory="1Gi")
            empty = evaluate(client, instance, "", memory="1Gi")
            outcome["gold_resolved" if gold.resolved else "gold_NOT_resolved"] += 1
            outcome["empty_NOT_resolved" if not empty.resolved else "empty_resolved"] += 1
    return outcome


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}: every option is a flag")
    names = [s for n in FLAGS.source for s in (SHIPPED if n == "shipped" else (n,))]
    out = Path(FLAGS.out or os.path.join(RESULTS, "+".join(FLAGS.source).replace(":", "_")))
    sources = [resolve_source(name) for name in names]
    per_source = -(-FLAGS.count // len(sources))
    bar = tqdm(total=FLAGS.count, unit="task", disable=not FLAGS.progress, desc="kept")
    reasons: Counter = Counter()

    def progress(mutation, reason) -> None:
        reasons[reason or "kept"] += 1
        if reason is None:
            bar.update(1)
        bar.set_postfix(tried=sum(reasons.values()), source=mutation.path.split("/", 1)[0], refresh=False)

    instances, report = generate_task_set(
        sources, FLAGS.count, str(out), seed=FLAGS.seed, kinds=tuple(FLAGS.kinds),
        max_tries=FLAGS.max_tries or 25 * per_source, tests_visible=FLAGS.visible_tests, timeout=FLAGS.timeout,
        progress=progress)
    bar.close()
    summary = report.to_dict()
    if FLAGS.verify:
        summary["verify"] = dict(verify(instances, FLAGS.verify))
        with open(out / "report.json", "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
    print(json.dumps(summary, indent=2))
    print(f"{report.kept} tasks from {report.tried} candidates in {report.seconds:.0f} s -> {out}/instances.jsonl")
    return 0 if report.kept else 1


if __name__ == "__main__":
    app.run(main)
