"""The wire schema: validation and encodings shared by SDK, orchestrator and agent."""

from __future__ import annotations

import pydantic
import pytest

from orchard.env import api


@pytest.mark.parametrize(("text", "size"), [("512Mi", 512 << 20), ("2Gi", 2 << 30), ("1G", 10**9),
                                            ("1048576", 1 << 20), ("1.5Gi", 3 << 29)])
def test_parse_memory(text, size):
    assert api.parse_memory(text) == size


@pytest.mark.parametrize("text", ["", "lots", "1Xi", "-1Gi", "1 Gi Gi"])
def test_parse_memory_rejects_garbage(text):
    with pytest.raises(ValueError):
        api.parse_memory(text)


@pytest.mark.parametrize("body", [
    {"command": ""}, {"command": []}, {"command": "a\0b"}, {"command": "ls", "env": {"": "x"}},
    {"command": "ls", "env": {"A=B": "x"}}, {"command": "ls", "timeout": 0}, {"command": "ls", "unknown": 1},
    {"command": "ls", "max_output_bytes": api.MAX_OUTPUT_BYTES_LIMIT + 1}, {"command": 3},
])
def test_exec_request_rejects_bad_input(body):
    with pytest.raises(pydantic.ValidationError):
        api.ExecRequest.model_validate(body)


@pytest.mark.parametrize("spec", [{"memory": "1Mi"}, {"memory": "2Ti"}, {"cpu": 0}, {"ttl": -1},
                                  {"network": "bridge"}, {"workdir": "relative"}, {"pids": 1}])
def test_sandbox_spec_rejects_bad_input(spec):
    with pytest.raises(pydantic.ValidationError):
        api.SandboxSpec(**spec)


def test_output_encoding_round_trips_binary():
    for data in (b"plain text", "ünïcode".encode(), b"\xff\x00\xfe", b""):
        text, encoding = api.encode_output(data)
        assert api.decode_output(text, encoding) == data
    assert api.encode_output(b"\xff")[1] == "base64"


def test_every_hot_route_is_implemented_by_the_agent():
    from orchard.env.agent.app import AgentConfig, create_app

    agent = create_app(AgentConfig(token="t", root="/tmp", state_dir="/tmp/orchard-test-agent")).app.app  # behind the fast path
    served = {(method, route.path) for route in agent.routes for method in getattr(route, "methods", ())}
    for hot in api.HOT_ROUTES:
        assert (hot.method, hot.path) in served, hot.name


def test_orchard_env_depends_on_nothing_else_in_orchard():
    import subprocess
    import sys

    probe = ("import sys, orchard.env, orchard.env.client, orchard.env.server.app, orchard.env.agent.app; "
             "print(sorted(m for m in sys.modules if m.startswith('orchard.') and not m.startswith('orchard.env'))"
             " + sorted(m for m in ('jax', 'flax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
