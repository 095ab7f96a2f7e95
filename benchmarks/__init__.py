"""Benchmark harnesses behind ``experiments/*_bench/run.py``: each measures Orchard against a named peer
in the same run and writes a JSON summary and a section of ``docs/benchmarks.md`` (through
:func:`orchard.results.publish`, its tables through :func:`orchard.results.markdown_table`).

The project installs them beside ``orchard`` (and ``configs``), so the experiments and tests import them from
anywhere, with no ``sys.path`` changes; they are not part of Orchard's API.
"""
