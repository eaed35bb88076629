"""What run_mlm.py reports as it trains: the progress of the run, TensorBoard scalars, the CSV log,
the curves PNG, the summary line (the metrics themselves are in metrics.py).

The figures of each evaluation (at every epoch end, or every --eval_steps steps) go to
<output_dir>/training_log.csv (one row per evaluation, across resumed runs, with its optimizer step
and the epoch it falls in; checkpoints.py decides when a row is written) and, with the learning
rate and tokens per second, to TensorBoard (<output_dir>/logs); the run ends with
<output_dir>/training_curves.png and one summary line.
"""

import csv
import io
import math
import sys
import time

import tensorflow as tf
import tf_keras

from .contract import TENSORBOARD_DIR, TRAINING_LOG_NAME
from .file_writes import write_whole


def perplexity(loss):
    """exp(loss), capped: past exp(50) it is noise."""
    return math.exp(min(loss, 50.0))


def write_eval_scalars(logs):
    """The evaluation's figures among `logs` (val_loss, ... as fit() names them) as TensorBoard's
    eval/ scalars, into the default writer at its step."""
    for name, value in logs.items():
        if name.startswith("val_"):
            tf.summary.scalar(f"eval/{name[len('val_') :]}", float(value))


class EpochSummary(tf_keras.callbacks.Callback):
    """A Keras callback that adds val_perplexity, the wall time and the optimizer step to each
    epoch's logs, the figures of the epoch's row of training_log.csv."""

    def __init__(self):
        super().__init__()
        # set once: fit_exact_steps may call fit() several times with the same callbacks
        self.start = None

    def on_train_begin(self, logs=None):
        if self.start is None:
            self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        if "val_loss" in logs:
            logs["val_perplexity"] = perplexity(logs["val_loss"])
        logs["elapsed_minutes"] = (time.perf_counter() - self.start) / 60
        logs["step"] = int(self.model.optimizer.iterations.numpy())


def progress_verbosity():
    """fit()'s `verbose`, for both training scripts: a progress bar on a terminal, a line an epoch
    in a log file."""
    return 1 if sys.stdout.isatty() else 2


class RunProgress(tf_keras.callbacks.ProgbarLogger):
    """Keras' progress bar, its epochs numbered as one sequence for the whole run, and after each
    epoch a line of the steps left and about how long they will take. `numbered` False: no `Epoch
    4/8` lines, for fit() epochs that are not passes over the data (--eval_steps); the lines of the
    steps left mark their ends.

    fit_exact_steps calls fit() once per segment of fixed shape, and each call counts its epochs
    to its own end (`Epoch 4/4`, then `Epoch 5/8`); this numbers every epoch out of the run's
    `total_steps` / `steps_per_epoch`, so an epoch split by the sequence-length warmup's switch
    shows twice under the same number. The time left is the steps left at the pace this process has
    kept, evaluations included: after the first epoch, the pace since that epoch ended, so that
    the compilation of the first steps weighs no more than once.
    """

    def __init__(self, total_steps, steps_per_epoch, numbered=True):
        super().__init__(count_mode="steps")
        self.total_steps, self.numbered = total_steps, numbered
        self.run_epochs = math.ceil(total_steps / steps_per_epoch)
        # (time, optimizer step) the pace is measured from: this process's first fit(), then the
        # end of its first epoch
        self.pace_from = None
        self.epochs_ended = 0

    def set_params(self, params):
        super().set_params(params)
        # the run's epochs, not this fit() call's; Keras numbers none when there is one
        self.epochs = self.run_epochs if self.numbered else 1

    def step(self):
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self.pace_from is None:
            self.pace_from = (time.perf_counter(), self.step())

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        now, step = time.perf_counter(), self.step()
        start_time, start_step = self.pace_from
        seconds_per_step = (now - start_time) / max(step - start_step, 1)
        if self.verbose:
            print(steps_left_line(step, self.total_steps, seconds_per_step), flush=True)
        self.epochs_ended += 1
        if self.epochs_ended == 1:
            self.pace_from = (now, step)


def steps_left_line(step, total_steps, seconds_per_step):
    """'step 1,200/2,000, 800 to go, about 1.4 minutes left': the run's progress after an epoch."""
    done, left = f"step {step:,}/{total_steps:,}", total_steps - step
    if left <= 0:
        return f"{done}, none to go"
    return f"{done}, {left:,} to go, about {duration(left * seconds_per_step)} left"


def duration(seconds):
    """'40 seconds', '1.4 minutes', '2.3 hours': a time as a person would say it."""
    if seconds < 60:
        return f"{seconds:.0f} seconds"
    if seconds < 60 * 60:
        return f"{seconds / 60:.1f} minutes"
    return f"{seconds / 3600:.1f} hours"


def training_log_path(output_dir):
    return f"{output_dir.rstrip('/')}/{TRAINING_LOG_NAME}"


def read_training_log(path):
    """The columns and rows (dicts of strings) of a training_log.csv; ([], []) before any row."""
    if not tf.io.gfile.exists(path):
        return [], []
    with tf.io.gfile.GFile(path) as file:
        reader = csv.DictReader(io.StringIO(file.read()))
        rows = list(reader)
    return list(reader.fieldnames or []), rows


def epoch_of_step(step, steps_per_epoch):
    """The epoch (0, 1, ...: the pass over the data) whose batches optimizer step `step` (1, 2, ...)
    trains on: the column `epoch` of training_log.csv."""
    return (step - 1) // steps_per_epoch


def write_epoch_row(path, epoch, logs):
    """Log an evaluation's figures (`logs`, as fit() gives them at an epoch end of its own, with
    their optimizer step) as a row of the training_log.csv at `path`, in the `epoch` (the pass over
    the data) of that step.

    The file is rewritten whole, one row per step in order: rows of this step or later ones, logged
    before an interruption and trained again since, give way to this row; a column the earlier rows
    lack (a rerun given --eval_dataset) is added, empty in them.
    """
    columns, rows = read_training_log(path)
    step = int(logs["step"])
    rows = [row for row in rows if int(row["step"]) < step] + [{"epoch": epoch, **logs}]
    columns += [name for name in ["epoch", *sorted(logs)] if name not in columns]
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_whole(path, text.getvalue())


def write_baseline(output_dir, logs):
    """The evaluation before the first step (`logs`: val_loss, ... as fit() names them): the row of
    step 0 in training_log.csv (a rerun before the first checkpoint writes it again, in its place)
    and the eval scalars at step 0 in TensorBoard, where the curves then start."""
    write_epoch_row(training_log_path(output_dir), 0, {**logs, "step": 0, "elapsed_minutes": 0.0})
    writer = tf.summary.create_file_writer(f"{output_dir.rstrip('/')}/{TENSORBOARD_DIR}")
    with writer.as_default(step=0):
        write_eval_scalars(logs)
    writer.close()


def last_logged_epoch(path):
    """The newest row of a training_log.csv as fit()'s logs ({name: [value]}), {} if none: the
    figures a run resumed at its last step reports, having no epoch left to train."""
    _, rows = read_training_log(path)
    if not rows:
        return {}
    numbers = {
        name: value
        for name, value in rows[-1].items()
        if name != "epoch" and value not in ("", None)
    }
    return {
        name: [int(value) if value.lstrip("-").isdigit() else float(value)]
        for name, value in numbers.items()
    }


# The training figures TensorBoardScalars writes over each interval: the trainer's metrics.
INTERVAL_SCALARS = ("loss", "masked_accuracy", "mask_token_accuracy")


class TensorBoardScalars(tf_keras.callbacks.Callback):
    """TensorBoard scalars in <output_dir>/logs (local or gs://).

    Every `logging_steps` steps: the training loss and accuracies over those steps alone, the
    learning rate and tokens per second (`tokens_per_step` tokens a step); after every epoch, the
    evaluation metrics and perplexity. fit()'s metrics are running sums over the epoch, so two
    readings of their totals give the interval's exact figures. Like the checkpoint callback, it
    counts steps on the host and touches the device only when it writes.

    Reading a metric sums its copies across replicas, which across hosts is a collective operation
    every worker must join, so every worker runs this callback and only the chief (`writes`) keeps
    what it reads.
    """

    def __init__(self, output_dir, logging_steps, tokens_per_step, writes=True):
        super().__init__()
        self.logging_steps, self.tokens_per_step = logging_steps, tokens_per_step
        # the per-batch logs are never read, so they need no conversion
        self._supports_tf_logs = True
        log_dir = f"{output_dir.rstrip('/')}/{TENSORBOARD_DIR}"
        self.writer = (
            tf.summary.create_file_writer(log_dir) if writes else tf.summary.create_noop_writer()
        )

    def totals(self):
        trainer = self.model
        pairs = {
            "loss": (trainer.loss_tracker.total, trainer.loss_tracker.count),
            "masked_accuracy": (trainer.masked_accuracy.correct, trainer.masked_accuracy.total),
            "mask_token_accuracy": (
                trainer.mask_token_accuracy.correct,
                trainer.mask_token_accuracy.total,
            ),
        }
        # read_value() sums a metric's per-replica copies when there are several replicas.
        return {
            name: (float(a.read_value()), float(b.read_value())) for name, (a, b) in pairs.items()
        }

    def learning_rate(self):
        # a schedule (warmup, then decay) or a fixed value
        rate = self.model.optimizer.learning_rate
        if isinstance(rate, tf_keras.optimizers.schedules.LearningRateSchedule):
            rate = rate(self.model.optimizer.iterations)
        return float(rate)

    def write_interval(self, step):
        now, totals = time.perf_counter(), self.totals()
        with self.writer.as_default(step=step):
            for name, (numerator, denominator) in totals.items():
                previous_numerator, previous_denominator = self.previous_totals[name]
                if denominator > previous_denominator:
                    value = (numerator - previous_numerator) / (denominator - previous_denominator)
                    tf.summary.scalar(f"train/{name}", value)
            tf.summary.scalar("train/learning_rate", self.learning_rate())
            tf.summary.scalar(
                "train/tokens_per_second",
                (step - self.logged_step) * self.tokens_per_step / (now - self.logged_time),
            )
        self.logged_step, self.logged_time, self.previous_totals = step, now, totals

    def on_epoch_begin(self, epoch, logs=None):
        # fit() has just reset the metrics: the sums start again from zero.
        self.epoch_start = self.logged_step = int(self.model.optimizer.iterations.numpy())
        self.logged_time = time.perf_counter()
        self.previous_totals = {name: (0.0, 0.0) for name in INTERVAL_SCALARS}

    def on_train_batch_end(self, batch, logs=None):
        done, every = self.epoch_start + batch + 1, self.logging_steps
        # its sums are reset before the next epoch
        last_of_epoch = batch + 1 == self.params["steps"]
        if last_of_epoch or done // every > self.logged_step // every:
            self.write_interval(done)

    def on_epoch_end(self, epoch, logs=None):
        with self.writer.as_default(step=self.logged_step):
            write_eval_scalars(logs or {})
        self.writer.flush()


def read_scalars(log_dir):
    """{tag: {step: value}} from the TensorBoard files in `log_dir`; a step written twice (a resumed
    run repeats the steps after its last checkpoint) keeps the newer value."""

    # events.out.tfevents.<unix time>.<host>...: the older file's values are replaced
    def written_at(path):
        name = path.rsplit("/", 1)[-1]
        return int(name.split(".")[3]), name

    scalars = {}
    for path in sorted(tf.io.gfile.glob(f"{log_dir}/events.out.tfevents.*"), key=written_at):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def plot_curves(log_dir, path, names=()):
    """Training and evaluation loss and accuracy at [MASK] against the step, as a PNG (local or
    gs://); with several validation sets (`names`), a line for each."""
    # matplotlib starts only for the curves, at the end of a run
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    scalars = read_scalars(log_dir)
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4))
    lines = [("train/", "training", "-")]
    if names:  # each set's own scalars: eval/<name>_loss, ...
        lines += [(f"eval/{name}_", f"evaluation: {name}", "o-") for name in names]
    else:
        lines.append(("eval/", "evaluation", "o-"))
    for prefix, label, style in lines:
        for axes, name in ((loss_axes, "loss"), (accuracy_axes, "mask_token_accuracy")):
            points = sorted(scalars.get(f"{prefix}{name}", {}).items())
            if points:
                axes.plot(*zip(*points), style, label=label)
    loss_axes.set(title="masked-LM loss", xlabel="optimizer step", ylabel="cross-entropy")
    accuracy_axes.set(
        title="accuracy at [MASK] inputs", xlabel="optimizer step", ylabel="top-1 accuracy"
    )
    for axes in (loss_axes, accuracy_axes):
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png", dpi=100)
    plt.close(figure)
    with tf.io.gfile.GFile(path, "wb") as file:
        file.write(image.getvalue())


def summary_line(steps, tokens_per_step, logs, minutes, names=()):
    """One line that says how the run ended, with the evaluation figures if there were any (with
    several validation sets, `names`, each one's loss after the first's figures)."""
    parts = [f"{steps:,} steps", f"{steps * tokens_per_step:,} tokens seen"]
    final = {name: values[-1] for name, values in logs.items() if values}
    if "val_loss" in final:
        parts += [
            f"eval loss {final['val_loss']:.4f}",
            f"perplexity {final['val_perplexity']:.2f}",
            f"masked accuracy {final['val_masked_accuracy']:.4f}",
            f"accuracy at [MASK] {final['val_mask_token_accuracy']:.4f}",
        ]
        parts += [
            f"{name} eval loss {final[f'val_{name}_loss']:.4f}"
            for name in names
            if f"val_{name}_loss" in final
        ]
    elif "loss" in final:
        parts.append(f"train loss {final['loss']:.4f} (no --eval_dataset)")
    parts.append(f"wall time {minutes:.1f} min")
    return "Finished: " + ", ".join(parts) + "."
