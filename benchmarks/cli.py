"""The command line the benchmark scripts share (``experiments/*_bench/run.py``): absl flags, as the main jobs'.

Each script defines its own flags at import, plus :func:`define_output_flags` (``--out``, ``--markdown``), and ends
with :func:`orchard.results.publish`. Lists of integers are comma-separated (``--concurrency=4,16,64``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from absl import app, flags

flags.disclaim_key_flags()  # the flags defined below belong to the script that asks for them (its --helpshort)


def define_output_flags(script: str) -> None:
    """``--out`` (the JSON summary; default ``results/summary.json`` beside ``script``) and ``--markdown`` (also
    write the summary's section of that page). Call at import, as absl wants."""
    flags.DEFINE_string("out", str(Path(script).resolve().parent / "results" / "summary.json"),
                        "where to write the JSON summary")
    flags.DEFINE_string("markdown", None, "also write the summary's section of this Markdown page")


def define_integers(name: str, default: Sequence[int], help: str, minimum: int = 1) -> None:
    """A flag of comma-separated integers, each at least ``minimum`` (read it with :func:`integers`)."""
    flags.DEFINE_list(name, [str(v) for v in default], f"{help} (comma-separated)")
    flags.register_validator(name, lambda values: bool(values) and all(_integer(v, minimum) for v in values),
                             f"--{name} takes integers of at least {minimum}, comma-separated")


def _integer(text: str, minimum: int) -> bool:
    try:
        return int(text) >= minimum
    except ValueError:
        return False


def integers(name: str) -> tuple[int, ...]:
    """The value of a flag made by :func:`define_integers`."""
    return tuple(int(v) for v in flags.FLAGS[name].value)


def flags_only(argv: Sequence[str]) -> None:
    """Stop on positional arguments (``--concurrency 4 16`` leaves ``16`` behind: lists take commas)."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}: every option is a flag, lists are "
                             "comma-separated (--concurrency=4,16,64)")


def command(script: str) -> str:
    """How this run was invoked, as a command to reproduce it from the repository root (summaries record it)."""
    return shlex.join(["python", "/".join(Path(script).resolve().parts[-3:]), *sys.argv[1:]])
