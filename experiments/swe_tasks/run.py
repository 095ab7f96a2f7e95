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

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from orchard.tasks.swe.bugs import KINDS
from orchard.tasks.swe.generate import generate_task_set
from orchard.tasks.swe.sources import SHIPPED, resolve_source

RESULTS = Path(__file__).parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", default="shipped",
                        help=f"comma-separated: 'shipped' (= {','.join(SHIPPED)}), a shipped name, or an "
                             "installed package that ships its tests (toolz, simplejson, ...)")
    parser.add_argument("--count", type=int, default=20, help="tasks to keep, spread evenly over the sources")
    parser.add_argument("--out", type=Path, help="output directory (default: experiments/swe_tasks/results/<source>)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tries", type=int, help="candidates to try per source (default: 25 x its quota)")
    parser.add_argument("--timeout", type=float,
                        help="seconds per test run of a candidate (default: 10 x the baseline run, at least 10)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated mutation kinds")
    parser.add_argument("--visible-tests", action="store_true",
                        help="keep the failing tests in the snapshot (SWE-smith) instead of withholding them "
                             "for test_patch (SWE-bench, the default)")
    parser.add_argument("--verify", type=int, default=0, metavar="N", help="grade the first N tasks in sandboxes")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown --kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    args.kinds = kinds
    names = [n for n in args.source.split(",") if n]
    args.names = [s for n in names for s in (SHIPPED if n == "shipped" else (n,))]
    args.out = args.out or RESULTS / args.source.replace(",", "+").replace(":", "_")
    return args


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sources = [resolve_source(name) for name in args.names]
    per_source = -(-args.count // len(sources))
    bar = tqdm(total=args.count, unit="task", disable=args.no_progress, desc="kept")
    reasons: Counter = Counter()

    def progress(mutation, reason) -> None:
        reasons[reason or "kept"] += 1
        if reason is None:
            bar.update(1)
        bar.set_postfix(tried=sum(reasons.values()), source=mutation.path.split("/", 1)[0], refresh=False)

    instances, report = generate_task_set(
        sources, args.count, str(args.out), seed=args.seed, kinds=args.kinds,
        max_tries=args.max_tries or 25 * per_source, tests_visible=args.visible_tests, timeout=args.timeout,
        progress=progress)
    bar.close()
    summary = report.to_dict()
    if args.verify:
        summary["verify"] = dict(verify(instances, args.verify))
        with open(args.out / "report.json", "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2)
    print(json.dumps(summary, indent=2))
    print(f"{report.kept} tasks from {report.tried} candidates in {report.seconds:.0f} s -> {args.out}/instances.jsonl")
    return 0 if report.kept else 1


if __name__ == "__main__":
    sys.exit(main())
