"""What every benchmark shares: the line that says which machine it ran on, its tables, a clock of
training steps, and the labelled task's local files read as run_classifier.py reads them.

Figures from one run are only compared with figures from the same run: the machines these benchmarks
run on are shared and noisy, so a ratio measured side by side is what carries over.
"""

import importlib.metadata
import os
import platform
import time

import psutil


def describe_machine():
    """One line: CPU model, the cores this process may use, memory, Python and the key library
    versions (read from the installed packages, so nothing heavy is imported for them)."""
    model = platform.processor() or "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):  # Linux names the model only there
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1] for line in cpuinfo if line.startswith("model name")]
        model = names[0].strip() if names else model
    cores = len(psutil.Process().cpu_affinity())
    memory = psutil.virtual_memory().total / 2**30
    versions = []
    for name in ("tensorflow", "tf-keras", "transformers", "tokenizers"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return (
        f"{model}, {cores} cores, {memory:.0f} GiB; Python {platform.python_version()}, "
        f"{', '.join(versions)}; load average {load_average()}"
    )


def load_average():
    """The machine's load over the last 1, 5 and 15 minutes: other jobs show here."""
    return " ".join(f"{value:.2f}" for value in psutil.getloadavg())


def markdown_table(header, rows, text_columns=1):
    """A markdown table as text, as BENCHMARKS.md shows them: the first `text_columns` columns
    left-aligned, the figures right-aligned."""
    rule = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in [header, rule, *rows])


def shard_sequences(folder, flag):
    """Every sequence of a prepare_tfrecord_shards.py split folder as one int64 array [records,
    max_length], and the split's manifest (checked by the package, which names `flag` if it is
    not a finished split)."""
    import numpy as np
    import tensorflow as tf

    from mlm_pipeline import contract, shard_checks

    manifest = shard_checks.read_manifest(folder, flag)
    features = contract.record_features(manifest["max_length"])
    batches = tf.data.TFRecordDataset(manifest["files"]).batch(4096)
    batches = batches.map(lambda records: tf.io.parse_example(records, features))
    return np.concatenate([batch[contract.FEATURE_NAME].numpy() for batch in batches]), manifest


def labelled_tsv_splits(train_file, validation_file, limit=None):
    """(train, validation, label names) of a task's local files in SST-2's layout (sentence, label),
    read and checked by the package as run_classifier.py reads them."""
    import run_classifier  # its Data group: the columns' defaults are SST-2's
    from mlm_pipeline import labelled_data

    data = run_classifier.Data(train_file=train_file, validation_file=validation_file, limit=limit)
    return labelled_data.load_labelled_splits(data)


def check_paths_exist(args, *flags):
    """Refuse a missing input file or folder in one line, as the step scripts do (UsageError)."""
    from mlm_pipeline.errors import UsageError

    for flag in flags:
        path = getattr(args, flag)
        if not os.path.exists(path):
            raise UsageError(f"--{flag} {path} does not exist; check the path.")


def step_clock():
    """A Keras callback that keeps each training step's seconds in `.seconds`."""
    import tf_keras

    class StepClock(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_train_batch_begin(self, batch, logs=None):
            self.began = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self.began)

    return StepClock()
