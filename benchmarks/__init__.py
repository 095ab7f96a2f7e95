"""Benchmark harnesses behind ``experiments/*_bench/run.py``: each measures Orchard against a named peer
in the same run and writes a JSON summary and a section of ``docs/benchmarks.md``.

They are not part of the ``orchard`` distribution (``pip install orchard-agentic[env]`` carries no
benchmark code); the experiments and tests import them from the repository root.
"""
