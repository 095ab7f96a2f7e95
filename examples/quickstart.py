"""Orchard Env quickstart: start a local orchestrator, open a sandbox, fix a bug in it.

Run it with ``make run`` (or ``python examples/quickstart.py`` as root on Linux). It starts a real
orchestrator on loopback, creates an isolated sandbox (its own namespaces, no network), uploads a
tiny project with a failing test, applies a patch, and streams the test run.
"""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from orchard.env import local_server

log = logging.getLogger("quickstart")

PROJECT = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": (
        "import unittest\nfrom calc import add\n\n\n"
        "class TestAdd(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
        'if __name__ == "__main__":\n    unittest.main()\n'
    ),
}
FIX = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    with local_server() as server:
        log.info("orchestrator at %s (docs at %s/docs)", server.base_url, server.base_url)
        client = server.client()
        started = time.perf_counter()
        with client.create(cpu=1, memory="1Gi", ttl=600) as sb:
            log.info("sandbox %s ready in %.2f s", sb.id, time.perf_counter() - started)
            inside = sb.exec("uname -n; id -un; ls /sys/class/net").stdout.split()
            log.info("inside: hostname=%s user=%s network interfaces=%s", inside[0], inside[1], inside[2:])

            with tempfile.TemporaryDirectory() as local:
                for name, text in PROJECT.items():
                    Path(local, name).write_text(text)
                sb.upload_dir(local, "/workspace/calc")
            log.info("uploaded %s", [f.name for f in sb.list_dir("/workspace/calc")])

            # -B: no .pyc files. The fix keeps calc.py's size, and a same-second edit of the same size
            # would otherwise be masked by the bytecode cache written by this first run.
            before = sb.exec("python3 -B test_calc.py", cwd="/workspace/calc")
            log.info("tests before the fix: exit %s (%s)", before.exit_code, before.stderr.splitlines()[-1])

            patch = sb.apply_patch(FIX, cwd="/workspace/calc")
            log.info("patch applied=%s with %s", patch.applied, patch.method)

            log.info("tests after the fix, streamed:")
            for chunk in sb.stream("python3 -B -u test_calc.py -v", cwd="/workspace/calc"):
                if chunk.stream == "exit":
                    log.info("exit code %s", chunk.exit_code)
                else:
                    for line in chunk.text.splitlines():
                        log.info("  %s| %s", chunk.stream, line)

            timings = [sb.exec("true").duration for _ in range(20)]
            log.info("agent-side time of `true`: median %.2f ms", sorted(timings)[10] * 1000)
        log.info("sandbox deleted; stopping the orchestrator")
        client.close()


if __name__ == "__main__":
    main()
