"""The recipes' command-line plumbing."""

from __future__ import annotations

import subprocess
import sys

MAIN = """
import logging
from absl import app, logging as absl_logging
from orchard.recipes.cli import log_progress

def main(_):
    log_progress()
    logging.getLogger("orchard.recipes.example").info("stage done")
    absl_logging.info("saved a checkpoint")
    absl_logging.warning("disk almost full")
    logging.getLogger("httpx").info("HTTP Request: GET http://claw/todo/items")

app.run(main)
"""


def test_a_job_logs_its_stages_at_info_and_absl_and_httpx_only_from_warning():
    """Under absl's app.run, which puts its own handler on the root logger at WARNING before main runs."""
    done = subprocess.run([sys.executable, "-c", MAIN], capture_output=True, text=True, timeout=120, check=True)
    assert "INFO orchard.recipes.example: stage done" in done.stderr
    assert "disk almost full" in done.stderr and "saved a checkpoint" not in done.stderr
    assert "HTTP Request" not in done.stderr  # one record a request
