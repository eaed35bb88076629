"""run_mlm.py's checkpoints: saved during fit(), and restored when a run is resumed.

A run writes <output_dir>/checkpoints every --save_steps optimizer steps and at every evaluation
(each epoch end, or every --eval_steps steps). Running the same command again resumes from the
newest checkpoint: the weights, the optimizer's moments and its step count, which is also the
position of the learning-rate schedule and of the data stream. Each evaluation's row of
training_log.csv is written after the checkpoint that follows the evaluation, and a copy of it is
saved just before that checkpoint, so that a run killed in between writes the row when it resumes:
one row per evaluation, none missing, none twice.
"""

import json
import tempfile

from .contract import CHECKPOINT_DIR
from .errors import UsageError, first_line
from .storage import write_whole
from .training_logs import epoch_of_step, read_training_log, training_log_path, write_epoch_row

# Beside the checkpoints: the training_log.csv row of the evaluation the newest one follows.
EPOCH_ROW_NAME = "epoch_row.json"


def checkpoint_dir(output_dir):
    return f"{output_dir.rstrip('/')}/{CHECKPOINT_DIR}"


def restore_checkpoint(output_dir, masked_lm, optimizer, keep, chief=True):
    """Resume from the newest checkpoint in `output_dir`, if any; returns its manager and the step
    to start at.

    A checkpoint holds the weights and the optimizer: its moments and its step count, which is also
    the learning-rate schedule's position and, through the data stream's seeds, the position in the
    data. `keep`: how many checkpoints the manager keeps (--save_total_limit). On the `chief`, the
    evaluation that checkpoint follows gets its row of training_log.csv if the interrupted run was
    killed before writing it.
    """
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(model=masked_lm, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir(output_dir), max_to_keep=keep)
    if manager.latest_checkpoint is None:
        return manager, 0
    try:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        raise UsageError(
            f"could not resume from {manager.latest_checkpoint}: {first_line(error)}; delete "
            f"{checkpoint_dir(output_dir)} to start afresh."
        ) from None
    step = int(optimizer.iterations.numpy())
    if chief:
        log_epoch_of_checkpoint(output_dir, step)
    return manager, step


def log_epoch_of_checkpoint(output_dir, step):
    """Write the row of the evaluation the checkpoint of `step` follows, if training_log.csv lacks
    it."""
    import tensorflow as tf

    path = f"{checkpoint_dir(output_dir)}/{EPOCH_ROW_NAME}"
    if not tf.io.gfile.exists(path):
        return
    with tf.io.gfile.GFile(path) as file:
        saved = json.load(file)
    log = training_log_path(output_dir)
    if saved["step"] == step and str(step) not in {
        row["step"] for row in read_training_log(log)[1]
    }:
        write_epoch_row(log, saved["epoch"], saved["logs"])


def scratch_manager(manager):
    """For a worker that is not the chief: the same checkpoint, saved into a scratch folder of its
    own.

    Saving a checkpoint may take part in the cluster's collective ops, so every worker saves; only
    the chief's land in --output_dir. Remove the folder (`manager.directory`) when training ends.
    """
    import tensorflow as tf

    return tf.train.CheckpointManager(
        manager.checkpoint, tempfile.mkdtemp(prefix="worker-checkpoints-"), max_to_keep=1
    )


def checkpoint_callback(manager, save_steps, training_log=None, steps_per_epoch=None):
    """A Keras callback that saves through `manager` every `save_steps` optimizer steps (0: never)
    and at the end of every fit() epoch (a pass over the data, or --eval_steps steps), the epoch's
    last step included: it waits for the epoch's evaluation.

    `training_log`: on the chief, the path of training_log.csv, which gets each fit() epoch's row
    once the checkpoint that ends it is saved, in the column `epoch` the pass over the data (of
    `steps_per_epoch` steps) its last step falls in; a copy of the row is saved first, beside the
    checkpoints, for a run killed between the two (restore_checkpoint writes it then).
    """
    import tf_keras

    class SaveCheckpoints(tf_keras.callbacks.Callback):
        """The step is read from the device once per epoch and counted on the host in between:
        reading it after every batch would stall each step (on a TPU, each execution) until the
        device catches up."""

        def __init__(self):
            super().__init__()
            # the logs stay on the device too: nothing here reads them
            self._supports_tf_logs = True
            self.saved_step = None
            self.epoch_start = None

        def step(self):
            return int(self.model.optimizer.iterations.numpy())

        def save(self):
            self.saved_step = self.step()
            manager.save(checkpoint_number=self.saved_step)

        def on_train_begin(self, logs=None):
            if self.saved_step is None:
                self.saved_step = self.step()  # a resumed run starts from a saved step

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start = self.step()

        def on_train_batch_end(self, batch, logs=None):
            # `batch` is the index of the last step run in this epoch; with --steps_per_execution >
            # 1 this runs once per execution, so save on crossing a multiple of save_steps.
            if batch + 1 == self.params["steps"]:
                # Saved at the epoch's end instead, after its evaluation: saved here, a kill during
                # the evaluation would resume past an epoch whose row of training_log.csv was never
                # written.
                return
            done = self.epoch_start + batch + 1
            if save_steps and done // save_steps > self.saved_step // save_steps:
                self.save()

        def on_epoch_end(self, epoch, logs=None):
            # fit()'s `epoch` counts its own epochs (--eval_steps long, maybe); a row names the
            # pass over the data
            if training_log:
                epoch = epoch_of_step(self.step(), steps_per_epoch)
            if self.step() != self.saved_step:
                if training_log:
                    row = {"step": self.step(), "epoch": epoch, "logs": dict(logs or {})}
                    write_whole(
                        f"{manager.directory}/{EPOCH_ROW_NAME}", json.dumps(row, default=float)
                    )
                self.save()
            if training_log:
                write_epoch_row(training_log, epoch, dict(logs or {}))

    return SaveCheckpoints()
