"""Third-party harnesses running their own agent loops in Orchard Env sandboxes.

An adapter implements a foreign harness's environment interface over an Orchard sandbox, so the
harness is used unchanged (its prompts, parsing, loop and trajectory format), and converts what it
records into an Orchard :class:`~orchard.data.trajectory.Trajectory`.

* :mod:`.mini_swe_agent`: mini-swe-agent 2.x (``pip install mini-swe-agent``), through its
  ``Environment`` protocol.

Each adapter is its own module and the harness it adapts is an optional dependency, so importing
this package imports none of them.
"""

import os

# mini-swe-agent prints a banner on import unless told not to; as a library under Orchard it is noise.
# setdefault: a user who sets the variable keeps their choice.
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
