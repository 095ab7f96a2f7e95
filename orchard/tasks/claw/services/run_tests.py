"""Run a Claw task's tests on an episode's final state: ``python -I run_tests.py BUNDLE``.

Standalone (the standard library only, no imports from its package), so it runs in a sandbox from
the uploaded file with ``python -I`` (no ``PYTHONPATH``, no user site). ``BUNDLE`` is a JSON file:

    {"state": <the services' /_admin/state>, "calls": <their audit log>, "workdir": "/workspace",
     "tests": [{"name", "kind", "weight", "code"}, ...]}

Each test's code runs with these names: ``state``, ``calls`` (every audited call), ``answer`` (what
the agent gave ``finish``, or ``None``), ``files`` (the workspace's text files, by path relative to
``workdir``), ``now``, and the helper ``ok(endpoint)``: the successful calls to a route template such
as ``"POST /mail/send"``. A test passes when its code raises nothing; a failed ``assert`` gives its
message. The results go to stdout as JSON: ``[{"name", "kind", "weight", "passed", "error"}]``.

``run_tests(bundle)`` is the same in process, for task generators checking their own plans.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MAX_FILE_BYTES = 1 << 20


def workspace_files(workdir: str) -> dict[str, str]:
    """The workspace's text files by relative path (binary and larger files are left out)."""
    files: dict[str, str] = {}
    if not os.path.isdir(workdir):
        return files
    for root, _, names in os.walk(workdir):
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
                continue
            try:
                with open(path, encoding="utf-8") as handle:
                    files[os.path.relpath(path, workdir)] = handle.read()
            except (UnicodeDecodeError, OSError):
                continue
    return files


def run_tests(bundle: dict[str, Any], files: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every test of ``bundle`` on its state; ``files`` default to those under ``bundle["workdir"]``."""
    state, calls = bundle["state"], bundle["calls"]
    if files is None:
        files = workspace_files(bundle.get("workdir", "/workspace"))

    def ok(endpoint: str) -> list[dict[str, Any]]:
        return [call for call in calls if call["endpoint"] == endpoint and call["status"] < 400]

    results = []
    for test in bundle["tests"]:
        names = {"state": json.loads(json.dumps(state)), "calls": calls, "answer": state.get("answer"),
                 "files": dict(files), "now": state.get("now"), "ok": ok, "__name__": "claw_test"}
        error = None
        try:
            exec(compile(test["code"], f"<test {test['name']}>", "exec"), names)  # the task's own test code
        except AssertionError as exc:
            error = f"assertion failed: {exc}" if str(exc) else "assertion failed"
        except Exception as exc:  # a test that breaks fails, with why
            error = f"{type(exc).__name__}: {exc}"
        results.append({"name": test["name"], "kind": test["kind"], "weight": test.get("weight", 1.0),
                        "passed": error is None, "error": error})
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: run_tests.py BUNDLE", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as handle:
        bundle = json.load(handle)
    json.dump(run_tests(bundle), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
