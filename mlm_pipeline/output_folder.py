"""run_mlm.py's output folder before training: started afresh, or checked to belong to this very
run so that its checkpoints can be resumed.

A folder holding config.json holds a finished model (`contract.FINISHED_RUN_MARKER`), replaced only
with --overwrite_output_dir (model_folder.check_output_dir() refuses it otherwise). Beside the
checkpoints, run_settings.json records what their step numbers mean (`resume_settings()`): a rerun
under other settings would continue another run.
"""

import json

from .checkpoints import checkpoint_dir
from .contract import (
    CURVES_NAME,
    FINISHED_RUN_MARKER,
    MODEL_CARD_NAME,
    PYTORCH_DIR,
    RUN_SETTINGS_NAME,
    TENSORBOARD_DIR,
    TRAINING_LOG_NAME,
)
from .errors import UsageError
from .storage import write_whole


def resume_settings(config, train_manifest, global_batch_size, total_steps, recipe):
    """What a checkpoint's step number means: resuming under other settings would continue another
    run.

    `recipe`: the settings, by name, that shape the stream of batches and the optimizer (seed,
    masking, shuffling, schedule).
    """
    architecture = {
        key: value for key, value in config.to_dict().items() if key != "transformers_version"
    }
    settings = {
        "train_records": train_manifest["records"],
        "max_length": train_manifest["max_length"],
        "global_batch_size": global_batch_size,
        "total_steps": total_steps,
        **recipe,
        "config": architecture,
    }
    # as they read back from run_settings.json (JSON keys are strings)
    return json.loads(json.dumps(settings))


def prepare_output_dir(output_dir, overwrite_output_dir, settings):
    """Start afresh, or check that the checkpoints there belong to this very run so they can be
    resumed.

    Replacing a finished run (--overwrite_output_dir) starts afresh: its checkpoints must not be
    resumed, and the folder must stop looking finished at once, so that an interruption of the new
    run is resumed when the same command runs again rather than refused. The settings of a new run
    are recorded next to its checkpoints; resuming under other settings would continue a different
    run, so it is refused.
    """
    import tensorflow as tf

    output_dir = output_dir.rstrip("/")
    folder = checkpoint_dir(output_dir)
    path = f"{folder}/{RUN_SETTINGS_NAME}"

    def start_afresh():
        for name in (FINISHED_RUN_MARKER, TRAINING_LOG_NAME, CURVES_NAME, MODEL_CARD_NAME):
            if tf.io.gfile.exists(f"{output_dir}/{name}"):
                tf.io.gfile.remove(f"{output_dir}/{name}")
        # The PyTorch copy too: a run with --no_pytorch_export must not leave
        # the replaced model's behind.
        for old_folder in (
            folder,
            f"{output_dir}/{TENSORBOARD_DIR}",
            f"{output_dir}/{PYTORCH_DIR}",
        ):
            if tf.io.gfile.exists(old_folder):
                tf.io.gfile.rmtree(old_folder)

    # check_output_dir() allowed replacing it
    if tf.io.gfile.exists(f"{output_dir}/{FINISHED_RUN_MARKER}"):
        start_afresh()
    if tf.train.latest_checkpoint(folder) and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as file:
            saved = json.load(file)
        changed = sorted(
            key for key in settings.keys() | saved.keys() if settings.get(key) != saved.get(key)
        )
        if not changed:
            return
        if not overwrite_output_dir:
            raise UsageError(
                f"--output_dir {output_dir} holds checkpoints of a run with other settings "
                f"({', '.join(changed)} differ), so resuming them would not continue that run; "
                "rerun its exact command, choose another folder, or pass --overwrite_output_dir "
                "to start afresh."
            )
        start_afresh()
    tf.io.gfile.makedirs(folder)
    write_whole(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")
