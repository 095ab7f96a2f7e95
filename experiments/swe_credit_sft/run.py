"""Credit-assignment SFT (Orchard-SWE stage 1): build the examples, then train.

    python experiments/swe_credit_sft/run.py --config=configs/swe_sft.py:tiny --workdir=runs/swe_sft_tiny

Re-running on the same workdir resumes from its last checkpoint. See configs/swe_sft.py.
"""

from __future__ import annotations

import json
import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from orchard.models.shipped import resolve
from orchard.tasks.swe.sft_data import build_sft_data
from orchard.train.sft import train_and_evaluate

config_flags.DEFINE_config_file("config", "configs/swe_sft.py:tiny", "the training config")
flags.DEFINE_string("workdir", "runs/swe_sft_tiny", "checkpoints, data and metrics go here")


def main(_: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
    config.data.train, config.data.eval = build_sft_data(config, workdir)
    config.model.path = resolve(config.model.path)
    final = train_and_evaluate(config, workdir)
    print(json.dumps(final, indent=2))


if __name__ == "__main__":
    app.run(main)
