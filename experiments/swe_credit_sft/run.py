"""Credit-assignment SFT (Orchard-SWE's SFT stage): build the examples, then train.

    python experiments/swe_credit_sft/run.py --config=configs/swe_sft.py:tiny --workdir=runs/swe_sft_tiny

Re-running on the same workdir reuses the examples and resumes from the last checkpoint; a run
with another config stops unless --rerun. See configs/swe_sft.py.
"""

from __future__ import annotations

import json
import logging
import os

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from orchard.config import from_config
from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import resolve
from orchard.tasks.swe.sft_data import ExamplesConfig, build_examples
from orchard.train.sft import SFTConfig, train_and_evaluate
from orchard.workdir import Stage, write_json

config_flags.DEFINE_config_file("config", "configs/swe_sft.py:tiny", "the training config")
flags.DEFINE_string("workdir", "runs/swe_sft_tiny", "checkpoints, data and metrics go here")
flags.DEFINE_bool("rerun", False, "redo the stages whose config changed instead of stopping")


def main(_: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    config, workdir, rerun = flags.FLAGS.config, flags.FLAGS.workdir, flags.FLAGS.rerun
    write_json(os.path.join(workdir, "config.json"), config)
    shared = {"seed": config.seed, "chat_format": config.chat.format}
    examples = from_config(ExamplesConfig, {**config.examples.to_dict(), **shared}, "examples")
    sft = from_config(SFTConfig, {**config.sft.to_dict(), "seed": config.seed, "mesh": config.mesh.to_dict(),
                                  "model": config.model.to_dict()}, "sft")
    tokenizer = Tokenizer.from_pretrained(resolve(config.tokenizer))
    data = Stage(os.path.join(workdir, "data"), "sft_data", examples,
                 {"trajectories": config.trajectories or "synthetic", "tokenizer": config.tokenizer})
    train, held_out = os.path.join(data.directory, "train.jsonl"), os.path.join(data.directory, "eval.jsonl")
    if data.open(rerun) != "done":
        build_examples(examples, data.directory, tokenizer, config.trajectories or None)
        data.finish()
    final = train_and_evaluate(sft, os.path.join(workdir, "sft"), examples=train, eval_examples=held_out,
                               vocab_size=tokenizer.vocab_size, inputs={"examples": data.fingerprint}, rerun=rerun)
    print(json.dumps(final, indent=2))


if __name__ == "__main__":
    app.run(main)
