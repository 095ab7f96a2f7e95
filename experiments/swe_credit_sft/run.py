"""Credit-assignment SFT (Orchard-SWE's SFT stage): build the examples, then train.

    python experiments/swe_credit_sft/run.py --config=configs/swe_sft.py:tiny --workdir=runs/swe_sft_tiny

Re-running on the same workdir reuses the examples and resumes from the last checkpoint; a run
with another config stops unless --rerun. The final model is ``<workdir>/sft/model``, also linked at
the config's ``export`` when set (the path the next stage loads). ``--dry-run`` prints the config
and the SFT stage's memory per device on its mesh and launches nothing. See configs/swe_sft.py.
"""

from __future__ import annotations

import json
import os

from absl import app, flags
from ml_collections import ConfigDict, config_flags

from orchard import distributed
from orchard.config import from_config
from orchard.data.tokenizer import Tokenizer
from orchard.models.shipped import resolve
from orchard.recipes.cli import dry_run, log_progress
from orchard.recipes.sft_data import ExamplesConfig, build_examples
from orchard.train.follow import follow_controller
from orchard.train.sft import SFTConfig, train_and_evaluate
from orchard.workdir import Stage, write_json

config_flags.DEFINE_config_file("config", "configs/swe_sft.py:tiny", "the training config")
flags.DEFINE_string("workdir", "runs/swe_sft_tiny", "checkpoints, data and metrics go here")
flags.DEFINE_bool("rerun", False, "redo the stages whose config changed instead of stopping")
flags.DEFINE_bool("dry-run", False, "print the config and its memory plan, check it, and launch nothing")


def export_model(model: str, export: str) -> None:
    """Link ``export`` to the final model directory ``model`` (a symlink to its absolute path: the
    checkpoint is not copied); an existing link elsewhere, or a directory, is an error."""
    target = os.path.abspath(model)
    if os.path.islink(export) and os.path.realpath(export) == os.path.realpath(target):
        return
    if os.path.lexists(export):
        raise FileExistsError(f"export {export} exists and is not a link to {target}")
    os.makedirs(os.path.dirname(os.path.abspath(export)), exist_ok=True)
    os.symlink(target, export)


def main(_: list[str]) -> None:
    log_progress()
    config, workdir, rerun = flags.FLAGS.config, flags.FLAGS.workdir, flags.FLAGS.rerun
    if flags.FLAGS["dry-run"].value:
        dry_run(config, [])
    distributed.initialize()  # a multi-host learner's processes join (nothing on one process)
    if not distributed.is_controller():
        follow_controller()  # the controller builds the examples and leads this process into the training
        return
    try:
        train(config, workdir, rerun)
    finally:
        distributed.release()


def train(config: ConfigDict, workdir: str, rerun: bool) -> None:
    """Build the examples (once), train, and link the final model at ``config.export``."""
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
    if config.export:
        export_model(os.path.join(workdir, "sft", "model"), config.export)
    print(json.dumps({**final, "model": os.path.join(workdir, "sft", "model"), "export": config.export}, indent=2))


if __name__ == "__main__":
    app.run(main)
