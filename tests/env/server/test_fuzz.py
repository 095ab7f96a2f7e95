"""Schemathesis against the orchestrator's own OpenAPI spec: valid and invalid requests, no 5xx.

Schemathesis's pytest plugin does not work with pytest 9 yet, so the test drives its Hypothesis
strategies directly: one property test per operation and generation mode.
"""

from __future__ import annotations

import hypothesis
import hypothesis.errors
import pytest
import schemathesis
from schemathesis.generation.modes import GenerationMode

MAX_COMMAND_SECONDS = 2.0
EXAMPLES = 20


@pytest.fixture(scope="module")
def fuzz_sandbox(client):
    with client.create(memory="256Mi", pids=128, ttl=600) as sb:
        yield sb


def _is_problem(response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("code"), str) and body.get("status") == response.status_code


@pytest.mark.slow
def test_openapi_fuzzing_finds_no_server_errors(orchestrator, fuzz_sandbox):
    schema = schemathesis.openapi.from_url(f"{orchestrator.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    headers = {"Authorization": f"Bearer {orchestrator.api_key}"}
    failures: list[str] = []

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                                 suppress_health_check=list(hypothesis.HealthCheck))
            def check(case):
                deletes_sandbox = case.method.upper() == "DELETE" and case.operation.path == "/v1/sandboxes/{sandbox_id}"
                if case.path_parameters and "sandbox_id" in case.path_parameters and not deletes_sandbox:
                    case.path_parameters["sandbox_id"] = fuzz_sandbox.id  # reach the agent, not just a 404
                if isinstance(case.body, dict) and case.operation.path.endswith(("/exec", "/exec/stream")):
                    # Random commands may never end ("yes"): bound them (the default timeout is 60 s).
                    timeout = case.body.get("timeout")
                    case.body["timeout"] = min(max(timeout, 0.01), MAX_COMMAND_SECONDS) if isinstance(
                        timeout, int | float) else MAX_COMMAND_SECONDS
                if isinstance(case.body, dict) and case.operation.path.endswith("/fork"):
                    # Each fork is n real sandboxes: keep them few and short-lived.
                    if isinstance(case.body.get("n"), int | float):
                        case.body["n"] = min(case.body["n"], 2)
                    case.body["ttl"] = 30
                if isinstance(case.body, dict) and case.operation.path.endswith("/pools") and isinstance(
                        case.body.get("size"), int | float):
                    case.body["size"] = 0  # a pool of random shape would keep sandboxes for the whole session
                response = case.call(headers=headers, timeout=30)
                if response.status_code >= 500 or (response.status_code >= 400 and not _is_problem(response)):
                    failures.append(f"{case.method} {case.formatted_path} {case.query} -> "
                                    f"{response.status_code}: {response.text[:300]}")

            try:
                check()
            except hypothesis.errors.Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to break in, e.g., GET /health
    assert not failures, "\n".join(failures[:20])
    assert fuzz_sandbox.exec("echo still fine").stdout == "still fine\n"
