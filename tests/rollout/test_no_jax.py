"""The rollout contract imports without JAX: an HTTP-only engine, the harnesses and evaluation need none,
and ``orchard serve``'s command line starts without the sandbox server's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed here")
sys.meta_path.insert(0, Block())
"""


def run_without(blocked: set[str], code: str) -> subprocess.CompletedProcess:
    script = BLOCK.format(blocked=sorted(blocked)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def test_the_engine_protocol_its_types_and_an_http_engine_import_without_jax():
    done = run_without({"jax", "jaxlib", "flax", "optax", "orbax"}, """
        from orchard.rollout.engine import RolloutEngine
        from orchard.rollout.types import Completion, SamplingParams, Weights
        from orchard.rollout.openai_engine import OpenAIEngine, ReloadFromDisk
        from orchard.rollout.weight_transfer import NcclWeightTransfer
        import orchard.harness, orchard.harness.bash, orchard.harness.codeact, orchard.eval.runner
        engine = OpenAIEngine("http://127.0.0.1:9/v1", "policy", weight_sync=ReloadFromDisk("/tmp/unused"))
        print(SamplingParams(max_tokens=4).max_tokens, engine.model)
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["4", "policy"]
    jax_engine = run_without({"jax"}, "import orchard.rollout.jax_engine")
    assert jax_engine.returncode != 0 and "jax is not installed here" in jax_engine.stderr  # the block works


def test_orchard_serve_needs_none_of_the_sandbox_servers_dependencies():
    done = run_without({"aiohttp", "prometheus_client", "redis", "kubernetes", "minisweagent"}, """
        import sys
        import orchard.rollout.server  # the app, its engine and model
        from orchard.cli import main
        sys.argv = ["orchard", "serve", "--help"]
        main()
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--model" in done.stdout
