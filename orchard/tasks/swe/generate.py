"""Synthetic SWE tasks, SWE-smith style: put a bug in a real repository, keep it if tests catch it.

For each source (:mod:`.sources`):

1. Copy the repository to a scratch directory and run its tests: the *baseline*. Only tests that
   pass here can become FAIL_TO_PASS or PASS_TO_PASS (a test that already fails is left out).
2. List every mutation of its code files (:mod:`.bugs`) and try them in a seeded order that
   takes each kind in turn, so that one frequent kind (statement removal) does not crowd out
   the rest.
3. For a candidate: write the buggy file into the scratch copy, run the whole test suite
   (:mod:`.localtests`), put the original back. FAIL_TO_PASS = baseline-passing tests that no
   longer pass; PASS_TO_PASS = those that still do. Keep the candidate only when both are
   non-empty; otherwise it is rejected with a reason: ``syntax_error``, ``unchanged`` (same AST),
   ``duplicate`` (same buggy file as an earlier candidate), ``timeout``, ``no_failing_test``
   (the tests do not notice) or ``no_passing_test`` (it breaks everything, e.g. an import).
4. A kept bug becomes an :class:`~orchard.tasks.swe.instance.SWEInstance`: the gold ``patch`` is
   the diff buggy → original; the problem statement is written from the failing tests
   (:mod:`.statement`); the repository snapshot is the buggy tree, written to
   ``<out>/repos/<instance_id>/``; ``base_commit`` is a digest of that tree.

Tests, SWE-bench's way by default: the files holding FAIL_TO_PASS tests are withheld from the
snapshot, and ``test_patch`` adds them back at grading time, so the agent does not see the tests
that check its fix (it sees their names, messages and code in the problem statement).
``tests_visible=True`` keeps them in the snapshot with an empty ``test_patch``, as SWE-smith does.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchard.seeds import seeded_random
from orchard.tasks.swe.bugs import (
    KINDS,
    Mutation,
    check_mutation,
    find_mutations,
)
from orchard.tasks.swe.diffs import new_file_diff, unified_diff
from orchard.tasks.swe.instance import SWEInstance, save_instances
from orchard.tasks.swe.localtests import LocalRun, run_tests
from orchard.tasks.swe.sources import RepoSource
from orchard.tasks.swe.statement import problem_statement, source_of_test
from orchard.tasks.swe.testlog import passing

REASONS = ("syntax_error", "unchanged", "duplicate", "timeout", "no_failing_test", "no_passing_test")
Progress = Callable[[Mutation, str | None], None]  # called after each candidate: (mutation, reason or None if kept)


@dataclass
class GenerationReport:
    sources: list[str] = field(default_factory=list)
    tried: int = 0
    kept: int = 0
    rejected: Counter = field(default_factory=Counter)
    by_kind: dict[str, Counter] = field(default_factory=dict)  # kind -> {"tried": n, "kept": m}
    baseline: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> passing/total tests
    candidates: dict[str, int] = field(default_factory=dict)  # source -> mutations found
    seconds: float = 0.0

    def count(self, mutation: Mutation, reason: str | None) -> None:
        self.tried += 1
        kind = self.by_kind.setdefault(mutation.kind, Counter())
        kind["tried"] += 1
        if reason is None:
            self.kept += 1
            kind["kept"] += 1
        else:
            self.rejected[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"sources": self.sources, "tried": self.tried, "kept": self.kept,
                "rejected": {r: self.rejected[r] for r in REASONS if self.rejected[r]},
                "by_kind": {k: dict(v) for k, v in sorted(self.by_kind.items())}, "baseline": self.baseline,
                "candidates": self.candidates, "seconds": round(self.seconds, 1)}


def tree_digest(root: str) -> str:
    """A sha1 over the relative paths and contents of every file under ``root``: the snapshot's "commit"."""
    digest = hashlib.sha1()
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(directory, name)
            digest.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.sha1(handle.read()).digest())
    return digest.hexdigest()


def _ordered(mutations: list[Mutation], rng: random.Random) -> list[Mutation]:
    """Shuffle each kind, then take the kinds in turn (in a shuffled order each round)."""
    by_kind: dict[str, list[Mutation]] = {}
    for mutation in mutations:
        by_kind.setdefault(mutation.kind, []).append(mutation)
    for group in by_kind.values():
        rng.shuffle(group)
    order: list[Mutation] = []
    while any(by_kind.values()):
        kinds = [k for k in sorted(by_kind) if by_kind[k]]
        rng.shuffle(kinds)
        order.extend(by_kind[k].pop() for k in kinds)
    return order


def _lines_at(text: str, line: int, span_text: str) -> list[str]:
    """The lines of ``text`` an edit starting at ``line`` and covering ``span_text`` touches, stripped."""
    lines = text.splitlines()
    return [s.strip() for s in lines[line - 1:line + span_text.count("\n")]]


def generate(source: RepoSource, count: int, out_dir: str, *, seed: int = 0, kinds: Sequence[str] = KINDS,
             max_tries: int | None = None, tests_visible: bool = False, timeout: float | None = None,
             progress: Progress | None = None, report: GenerationReport | None = None,
             jobs: int | None = None) -> list[SWEInstance]:
    """Up to ``count`` bug tasks from ``source``; snapshots go to ``<out_dir>/repos/``.

    Stops at ``count`` kept, after ``max_tries`` candidates, or when candidates run out.
    ``timeout`` bounds each candidate's test run; by default it is ten times the baseline run,
    and at least 10 s: mutations make infinite loops, and a long fixed timeout would spend most
    of the generation time (and a CPU) on them. ``report`` (updated in place) records what was
    tried and why candidates were rejected. ``jobs`` test runs go at once (default: the CPUs, at
    most 4), each in its own copy of the repository; candidates are judged in order, so the
    instances and the report do not depend on ``jobs``.
    """
    jobs = jobs or min(os.cpu_count() or 1, 4)
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    report = report if report is not None else GenerationReport()
    report.sources.append(source.name)
    rng = seeded_random(seed, "swe-generate", source.name)
    instances: list[SWEInstance] = []
    with tempfile.TemporaryDirectory(prefix=f"orchard-swe-{source.name}-") as scratch:
        base = os.path.join(scratch, "repo")
        source.materialize(base)
        started = time.monotonic()
        baseline = run_tests(base, source.test_dirs, timeout=max(timeout or 0.0, 600.0))
        timeout = timeout or max(10.0, 10 * (time.monotonic() - started))
        good = passing(baseline.results)
        report.baseline[source.name] = {"passing": len(good), "total": len(baseline.results)}
        if not good:
            raise RuntimeError(f"no test of {source.name} passes before any bug is put in:\n{baseline.log[-3000:]}")
        texts = {}
        mutations: list[Mutation] = []
        for path in source.code_files(base):
            with open(os.path.join(base, path), encoding="utf-8") as handle:
                texts[path] = handle.read()
            try:
                mutations += find_mutations(texts[path], path, tuple(kinds))
            except SyntaxError:
                continue
        report.candidates[source.name] = len(mutations)
        seen: set[str] = set()
        free = [os.path.join(scratch, f"worker-{i}") for i in reversed(range(jobs))]  # base stays pristine
        for directory in free:
            shutil.copytree(base, directory)
        window: collections.deque = collections.deque()  # in order: (mutation, reason, buggy, future, directory)

        def test(directory: str, mutation: Mutation, buggy: str) -> LocalRun:
            target = os.path.join(directory, mutation.path)
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(buggy)
            try:
                return run_tests(directory, source.test_dirs, timeout=timeout)
            finally:
                with open(target, "w", encoding="utf-8") as handle:
                    handle.write(texts[mutation.path])

        def settle() -> None:
            """Judge the oldest candidate (in order, so the result does not depend on ``jobs``)."""
            mutation, reason, buggy, future, directory = window.popleft()
            run = future.result() if future is not None else None
            if directory is not None:
                free.append(directory)
            if len(instances) >= count:
                return  # considered while the window was open, after the set was full: as if never tried
            if run is not None:
                now_passing = passing(run.results)
                fail_to_pass, pass_to_pass = sorted(good - now_passing), sorted(good & now_passing)
                if run.timed_out:
                    reason = "timeout"
                elif not fail_to_pass:
                    reason = "no_failing_test"
                elif not pass_to_pass:
                    reason = "no_passing_test"
                else:
                    instances.append(_instance(source, mutation, texts[mutation.path], buggy, base, run.results,
                                               fail_to_pass, pass_to_pass, out_dir, rng, tests_visible))
            report.count(mutation, reason)
            if progress is not None:
                progress(mutation, reason)

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            for tries, mutation in enumerate(_ordered(mutations, rng)):
                while window and (not free or len(instances) + len(window) >= count):
                    settle()
                if len(instances) >= count or (max_tries is not None and tries >= max_tries):
                    break
                reason, buggy = check_mutation(texts[mutation.path], mutation)
                fingerprint = hashlib.sha1(f"{mutation.path}\0{buggy}".encode()).hexdigest()
                if reason is None and fingerprint in seen:
                    reason = "duplicate"
                seen.add(fingerprint)
                if reason is None:
                    directory = free.pop()
                    window.append((mutation, None, buggy, pool.submit(test, directory, mutation, buggy), directory))
                else:
                    window.append((mutation, reason, buggy, None, None))
            while window:
                settle()
    return instances


def _instance(source: RepoSource, mutation: Mutation, original: str, buggy: str, base: str, results: dict,
              fail_to_pass: list[str], pass_to_pass: list[str], out_dir: str, rng: random.Random,
              tests_visible: bool) -> SWEInstance:
    instance_id = f"{source.name}__{mutation.kind}-{mutation.key}"
    snapshot = os.path.join(out_dir, "repos", instance_id)
    if os.path.exists(snapshot):
        shutil.rmtree(snapshot)
    shutil.copytree(base, snapshot)
    with open(os.path.join(snapshot, mutation.path), "w", encoding="utf-8") as handle:
        handle.write(buggy)
    withheld = [] if tests_visible else sorted({test.split("::", 1)[0] for test in fail_to_pass})
    test_patch = []
    for path in withheld:
        with open(os.path.join(base, path), encoding="utf-8") as handle:
            test_patch.append(new_file_diff(handle.read(), path))
        os.remove(os.path.join(snapshot, path))
    forbidden = _lines_at(original, mutation.line, mutation.original) + _lines_at(buggy, mutation.line,
                                                                                    mutation.replacement)
    statement = problem_statement(
        source.repo, {test: results.get(test) for test in fail_to_pass},
        {test: source_of_test(base, test) for test in fail_to_pass[:2]}, rng, forbidden, tests_visible)
    buggy_lines = [*buggy.splitlines(), ""]  # a deletion at the end of the file leaves no line there
    return SWEInstance(
        instance_id=instance_id, repo=source.repo, base_commit=tree_digest(snapshot),
        problem_statement=statement, patch=unified_diff(buggy, original, mutation.path),
        test_patch="".join(test_patch), FAIL_TO_PASS=tuple(fail_to_pass), PASS_TO_PASS=tuple(pass_to_pass),
        version=source.version, repo_path=snapshot,
        metadata={"generator": "orchard.tasks.swe.generate", "source": source.name, "kind": mutation.kind,
                  "description": mutation.description, "path": mutation.path, "function": mutation.function,
                  "line": mutation.line, "buggy_line": buggy_lines[mutation.line - 1],
                  "original_line": original.splitlines()[mutation.line - 1], "tests_visible": tests_visible,
                  "withheld_tests": withheld, **source.tags,
                  **source.function_tags.get(f"{mutation.path}:{mutation.function}", {})})


def generate_task_set(sources: Sequence[RepoSource], count: int, out_dir: str, *, seed: int = 0,
                      kinds: Sequence[str] = KINDS, max_tries: int | None = None, tests_visible: bool = False,
                      timeout: float | None = None, progress: Progress | None = None
                      ) -> tuple[list[SWEInstance], GenerationReport]:
    """``count`` tasks spread evenly over ``sources``: ``<out_dir>/instances.jsonl``, ``repos/``, ``report.json``.

    ``max_tries`` applies per source.
    """
    if not sources:
        raise ValueError("no sources to generate from")
    os.makedirs(out_dir, exist_ok=True)
    report = GenerationReport()
    started = time.monotonic()
    instances: list[SWEInstance] = []
    for index, source in enumerate(sources):
        quota = count // len(sources) + (1 if index < count % len(sources) else 0)
        if quota:
            instances += generate(source, quota, out_dir, seed=seed, kinds=kinds, max_tries=max_tries,
                                  tests_visible=tests_visible, timeout=timeout, progress=progress, report=report)
    report.seconds = time.monotonic() - started
    save_instances(instances, os.path.join(out_dir, "instances.jsonl"))
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as handle:
        json.dump(report.to_dict(), handle, indent=2)
        handle.write("\n")
    return instances, report
