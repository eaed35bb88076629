"""run_mlm.py's output folder as a run goes: started afresh or checked to belong to this very run
(`prepare_output_dir`), its checkpoints saved during fit() and restored when the run is resumed.

A folder holding config.json holds a finished model (`contract.FINISHED_RUN_MARKER`), replaced only
with --overwrite_output_dir (model_folder.check_output_dir() refuses it otherwise). A run writes
<output_dir>/checkpoints every --save_steps optimizer steps and at every evaluation (each epoch
end, or every --eval_steps steps); beside them, run_settings.json records what their step numbers
mean (`resume_settings()`): a rerun under other settings would continue another run, so it is
refused. Running the same command again resumes from the newest checkpoint: the weights, the
optimizer's moments and its step count, which is also the position of the learning-rate schedule
and of the data stream. Each evaluation's row of training_log.csv is written after the checkpoint
that follows the evaluation, and a copy of it is saved just before that checkpoint, so that a run
killed in between writes the row when it resumes: one row per evaluation, none missing, none twice.
"""

import dataclasses
import json
import tempfile

import tensorflow as tf
import tf_keras

from .contract import (
    CHECKPOINT_DIR,
    CURVES_NAME,
    FINISHED_RUN_MARKER,
    LAST_STEP_DIR,
    MODEL_CARD_NAME,
    PYTORCH_DIR,
    RUN_SETTINGS_NAME,
    TENSORBOARD_DIR,
    TRAINING_LOG_NAME,
)
from .errors import UsageError, first_line
from .file_writes import write_whole
from .training_logs import epoch_of_step, read_training_log, training_log_path, write_epoch_row

# Beside the checkpoints: the training_log.csv row of the evaluation the newest one follows.
EPOCH_ROW_NAME = "epoch_row.json"


# Beside the checkpoints, the checkpoint of the step where the learning rate starts to decay (a run
# with --decay_ratio): in a folder of its own, which no rotation (--save_total_limit) reaches.
DECAY_START_DIR = "decay_start"


def checkpoint_dir(output_dir):
    return f"{output_dir.rstrip('/')}/{CHECKPOINT_DIR}"


def decay_start_dir(output_dir):
    return f"{checkpoint_dir(output_dir)}/{DECAY_START_DIR}"


def resume_settings(
    settings, origin, config, train_manifest, global_batch_size, total_steps, mixture=None
):
    """What a checkpoint's step number means: resuming under other settings would continue another
    run. The record run_settings.json holds, by name. A `mixture` (mixture.Mixture) of several
    training folders adds each folder, its sequences and its weight ("train_mixture"); one folder's
    record stays as it always was, so that runs recorded before resume.

    From `origin` (masked_lm_model.Scratch, pretrained_model.Parent or branching.Branch), the
    parent continued: its name as --model_name_or_path gave it, None from scratch or in a branch;
    a branch adds where it starts (branch_from, branch_checkpoint, branch_step and
    branch_learning_rate: a branch of it computes its rate from them). From run_mlm.py's
    `settings`, the groups that shape the stream of batches and the optimizer (Masking: seed,
    masking, shuffling; Optimizer: the schedule, its decay_shape only when not linear).
    `total_steps`: the step the run ends at (a branch's counts on from its parent's step).
    """
    architecture = {
        key: value for key, value in config.to_dict().items() if key != "transformers_version"
    }
    optimizer = dataclasses.asdict(settings.optimizer)
    # a linear decay is recorded as it was before there was a choice, so that old runs resume
    if optimizer["decay_shape"] == "linear":
        del optimizer["decay_shape"]
    settings = {
        **stream_settings(settings.masking, train_manifest, global_batch_size, mixture),
        "total_steps": total_steps,
        "model_name_or_path": origin.name,
        **optimizer,
        "config": architecture,
    }
    branch = origin.branch
    if branch is not None:  # keys of a branch alone: a run's record stays as it was
        settings.update(
            branch_from=branch.name,
            branch_checkpoint=branch.prefix,
            branch_step=branch.step,
            branch_learning_rate=branch.learning_rate,
        )
    # as they read back from run_settings.json (JSON keys are strings)
    return json.loads(json.dumps(settings))


def stream_settings(masking, train_manifest, global_batch_size, mixture=None):
    """The part of the record (resume_settings) that fixes the stream of batches from a step on:
    the training shards (a `mixture`'s folders, their sequences and weights), their length, the
    global batch and the Masking settings (seed, masks, shuffle), as run_settings.json holds them.
    Two runs that agree on it read the same batch at the same step."""
    stream = {
        "train_records": train_manifest["records"],
        "max_length": train_manifest["max_length"],
        "global_batch_size": global_batch_size,
        **dataclasses.asdict(masking),
    }
    if mixture is not None:
        stream["train_mixture"] = [
            {"folder": folder, "records": records, "weight": weight}
            for folder, records, weight in zip(mixture.folders, mixture.records, mixture.weights)
        ]
    return json.loads(json.dumps(stream))  # as they read back from run_settings.json


def prepare_output_dir(output_dir, overwrite_output_dir, settings, plan=None):
    """Start afresh, or check that the checkpoints there belong to this very run so they can be
    resumed.

    Replacing a finished run (--overwrite_output_dir) starts afresh: its checkpoints must not be
    resumed, and the folder must stop looking finished at once, so that an interruption of the new
    run is resumed when the same command runs again rather than refused. The settings of a new run
    are recorded next to its checkpoints; resuming under other settings would continue a different
    run, so it is refused. `plan`, the training split's hosts.InputPlan, lets that refusal say when
    the batch differs because --gradient_accumulation_steps now multiplies it
    (`accumulation_changed`).
    """
    output_dir = output_dir.rstrip("/")
    folder = checkpoint_dir(output_dir)
    path = f"{folder}/{RUN_SETTINGS_NAME}"

    def start_afresh():
        for name in (FINISHED_RUN_MARKER, TRAINING_LOG_NAME, CURVES_NAME, MODEL_CARD_NAME):
            if tf.io.gfile.exists(f"{output_dir}/{name}"):
                tf.io.gfile.remove(f"{output_dir}/{name}")
        # The PyTorch copy too: a run with --no_pytorch_export must not leave
        # the replaced model's behind; nor one without --average_last its last_step/.
        for old_folder in (
            folder,
            f"{output_dir}/{TENSORBOARD_DIR}",
            f"{output_dir}/{PYTORCH_DIR}",
            f"{output_dir}/{LAST_STEP_DIR}",
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
            why = accumulation_changed(saved.get("global_batch_size"), plan)
            if why:
                raise UsageError(
                    f"--output_dir {output_dir} holds checkpoints of a run with other settings "
                    f"({', '.join(changed)} differ): {why}, or choose another folder, or pass "
                    "--overwrite_output_dir to start afresh."
                )
            raise UsageError(
                f"--output_dir {output_dir} holds checkpoints of a run with other settings "
                f"({', '.join(changed)} differ), so resuming them would not continue that run; "
                "rerun its exact command, choose another folder, or pass --overwrite_output_dir "
                "to start afresh."
            )
        start_afresh()
    tf.io.gfile.makedirs(folder)
    write_whole(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def accumulation_changed(saved_global_batch_size, plan):
    """Why a run's recorded global batch differs when --gradient_accumulation_steps N > 1 now gives
    N times the batch it gave before (each replica's batch was split into N micro-batches; now N
    batches are accumulated, as in transformers' Trainer), and the flags that continue that run at
    its own batch; None when the batch differs for another reason (or not at all)."""
    if plan is None or plan.accumulation_steps == 1 or saved_global_batch_size is None:
        return None
    accumulation, per_replica = plan.accumulation_steps, plan.per_replica_batch_size
    if saved_global_batch_size * accumulation != plan.global_batch_size:
        return None
    why = (
        f"--gradient_accumulation_steps {accumulation} now multiplies the batch, as in "
        f"transformers' Trainer: {accumulation} batches of --per_replica_batch_size {per_replica} "
        f"a replica, {plan.global_batch_size} sequences a step, where that run split each "
        f"replica's batch into micro-batches and trained {saved_global_batch_size}"
    )
    if per_replica % accumulation:  # its batch without accumulation, in more memory
        flags = f"--per_replica_batch_size {per_replica} --gradient_accumulation_steps 1"
    else:  # its micro-batch, accumulated as many times
        flags = (
            f"--per_replica_batch_size {per_replica // accumulation} "
            f"--gradient_accumulation_steps {accumulation}"
        )
    return f"{why}; continue it at its own batch: its exact command with {flags}"


def restore_checkpoint(output_dir, masked_lm, optimizer, keep, chief=True):
    """Resume from the newest checkpoint in `output_dir`, if any; returns its manager and the step
    to start at.

    A checkpoint holds the weights and the optimizer: its moments and its step count, which is also
    the learning-rate schedule's position and, through the data stream's seeds, the position in the
    data. `keep`: how many checkpoints the manager keeps (--save_total_limit). On the `chief`, the
    evaluation that checkpoint follows gets its row of training_log.csv if the interrupted run was
    killed before writing it.
    """
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
    return tf.train.CheckpointManager(
        manager.checkpoint, tempfile.mkdtemp(prefix="worker-checkpoints-"), max_to_keep=1
    )


class SaveCheckpoints(tf_keras.callbacks.Callback):
    """A Keras callback that saves through `manager` every `save_steps` optimizer steps (0: never)
    and at the end of every fit() epoch (a pass over the data, or --eval_steps steps), the epoch's
    last step included: it waits for the epoch's evaluation.

    `training_log`: on the chief, the path of training_log.csv, which gets each fit() epoch's row
    once the checkpoint that ends it is saved, in the column `epoch` the pass over the data (of
    `steps_per_epoch` steps) its last step falls in; a copy of the row is saved first, beside the
    checkpoints, for a run killed between the two (restore_checkpoint writes it then).

    The step is read from the device once per epoch and counted on the host in between: reading it
    after every batch would stall each step (on a TPU, each execution) until the device catches up.
    """

    def __init__(self, manager, save_steps, training_log=None, steps_per_epoch=None):
        super().__init__()
        self.manager, self.save_steps = manager, save_steps
        self.training_log, self.steps_per_epoch = training_log, steps_per_epoch
        # the logs stay on the device too: nothing here reads them
        self._supports_tf_logs = True
        self.saved_step = None
        self.epoch_start = None

    def step(self):
        return int(self.model.optimizer.iterations.numpy())

    def save(self):
        self.saved_step = self.step()
        self.manager.save(checkpoint_number=self.saved_step)

    def on_train_begin(self, logs=None):
        if self.saved_step is None:
            self.saved_step = self.step()  # a resumed run starts from a saved step

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = self.step()

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the index of the last step run in this epoch; with --steps_per_execution > 1
        # this runs once per execution, so save on crossing a multiple of save_steps.
        if batch + 1 == self.params["steps"]:
            # Saved at the epoch's end instead, after its evaluation: saved here, a kill during the
            # evaluation would resume past an epoch whose row of training_log.csv was never written.
            return
        done, every = self.epoch_start + batch + 1, self.save_steps
        if every and done // every > self.saved_step // every:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        # fit()'s `epoch` counts its own epochs (--eval_steps long, maybe); a row names the pass
        # over the data
        if self.training_log:
            epoch = epoch_of_step(self.step(), self.steps_per_epoch)
        if self.step() != self.saved_step:
            if self.training_log:
                row = {"step": self.step(), "epoch": epoch, "logs": dict(logs or {})}
                write_whole(
                    f"{self.manager.directory}/{EPOCH_ROW_NAME}", json.dumps(row, default=float)
                )
            self.save()
        if self.training_log:
            write_epoch_row(self.training_log, epoch, dict(logs or {}))


class SaveDecayStart(tf_keras.callbacks.Callback):
    """A Keras callback that saves the checkpoint of optimizer step `decay_start` (where the
    learning rate starts to decay) through `manager`, into a folder of its own that rotation never
    reaches (decay_start_dir), with a copy of run_settings.json from `settings_path` beside it (on
    the chief: None elsewhere), so that a branch (--branch_from) can start there: ModernBERT's and
    Ettin's decay, a longer context, another mixture.

    At exactly that step, whatever --steps_per_execution: fit() runs the steps of an execution
    together and calls back only after them, so an execution that would run past `decay_start`
    inside an epoch is shortened to end there. tf_keras' DataHandler reads the model's
    `steps_per_execution` variable before each execution, and shortens an epoch's last one the same
    way (tf_keras/src/engine/data_adapter.py, DataHandler.steps()); the train function loops that
    many times. No fit() call is split, so no evaluation, checkpoint or row is added, and the
    variable is back to its value before the epoch ends (its evaluation)."""

    def __init__(self, manager, decay_start, settings_path=None):
        super().__init__()
        self.manager, self.decay_start, self.settings_path = manager, decay_start, settings_path
        self._supports_tf_logs = True  # nothing here reads the logs
        self.executions = None  # --steps_per_execution, while an execution is shortened
        self.epoch_start = None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = int(self.model.optimizer.iterations.numpy())
        self.shorten_next_execution(self.epoch_start)

    def on_train_batch_end(self, batch, logs=None):
        done = self.epoch_start + batch + 1  # counted on the host: no wait for the device
        if done == self.decay_start:
            if self.executions is not None:
                self.model.steps_per_execution.assign(self.executions)
                self.executions = None
            self.manager.save(checkpoint_number=done)
            if self.settings_path:
                folder = self.manager.directory
                tf.io.gfile.copy(self.settings_path, f"{folder}/{RUN_SETTINGS_NAME}", True)
        self.shorten_next_execution(done)

    def shorten_next_execution(self, done):
        """Before the execution that starts after step `done`: end it at the decay's start if it
        would run past it within this epoch."""
        per_execution = self.model.steps_per_execution
        if per_execution is None or self.executions is not None:
            return
        steps, epoch_end = int(per_execution.numpy()), self.epoch_start + self.params["steps"]
        if done < self.decay_start < min(done + steps, epoch_end):
            self.executions = steps
            per_execution.assign(self.decay_start - done)
