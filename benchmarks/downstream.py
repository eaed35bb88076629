"""Did the pretraining pay off? Validation accuracy on a classification task (SST-2 by default) of
a bag-of-words baseline and of fine-tuned models, pretrained or from random weights, each row the
mean and spread over fine-tuning seeds, with its minutes, beside the pretraining's own figures.

    python benchmarks/downstream.py --train_file sst2/train.tsv --validation_file sst2/dev.tsv \
        --from_scratch "recipe config, random weights=runs/cpu-recipe/model" \
        --model "quickstart=quickstart_output/model" --model "CPU recipe=runs/cpu-recipe/model"

Rows: first a binary bag of words and logistic regression (tf_keras: TextVectorization multi-hot
features of the training split's words, one softmax layer, Adam), the baseline a pretrained model
must beat; then one row for each --from_scratch NAME=FOLDER (run_classifier.py --from_scratch: that
folder's architecture and tokenizer from random weights) and each --model NAME=FOLDER (the
run_mlm.py output folder fine-tuned), in that order. A model row also shows its pretraining's
minutes and accuracy at [MASK], the last evaluation in the folder's training_log.csv. Each
fine-tuning row runs run_classifier.py as a user runs it, in a subprocess with its default flags
but the data and the seed, once per --seeds, and reads the scores from its eval_results.json: there
is no second copy of the fine-tuning here. Minutes are the wall time of each command, start-up and
evaluation included. Everything after `--` goes to every run_classifier.py call unchanged (--limit
64 --per_replica_batch_size 8 --num_epochs 1 for a check in seconds; --limit also caps the bag of
words' training rows).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the package lives at the repository root

from machine import describe_machine, labelled_tsv_splits, markdown_table  # noqa: E402

from mlm_pipeline import tf_startup  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402


def parse_args(argv=None):
    parser = OneLineErrorParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--train_file", required=True, help="labelled training examples (.tsv)")
    parser.add_argument("--validation_file", required=True, help="the examples scored (.tsv)")
    parser.add_argument(
        "--from_scratch",
        action="append",
        default=[],
        type=named_folder,
        metavar="NAME=FOLDER",
        help="a row: FOLDER's architecture and tokenizer trained from random weights; repeatable",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        type=named_folder,
        metavar="NAME=FOLDER",
        help="a row: the run_mlm.py output folder FOLDER fine-tuned; repeatable",
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="one fine-tuning run per seed"
    )
    parser.add_argument("--bow_epochs", type=int, default=5, help="the bag of words' epochs")
    parser.add_argument(
        "--output_dir", help="where the classifiers and their logs go (default: a temporary folder)"
    )
    parser.add_argument(
        "run_classifier_flags", nargs="*", help="after --: flags for every run_classifier.py call"
    )
    return parser.parse_args(argv)


def named_folder(text):
    """argparse type: "NAME=FOLDER", a row's name in the table and its model folder."""
    name, equals, folder = text.partition("=")
    if not (name and equals and folder):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=FOLDER, e.g. 'recipe=runs/model'")
    return name, folder


def pretraining_figures(folder):
    """(minutes, accuracy at [MASK]) of the last evaluation in the folder's training_log.csv, as
    run_mlm.py writes it; (None, None) when there is none."""
    with tf_startup.tensorflow_startup_log_held_back():  # the engine's module: TensorFlow loads
        from mlm_pipeline import training_logs

    _, rows = training_logs.read_training_log(training_logs.training_log_path(folder))
    evaluated = [line for line in rows if line.get("val_mask_token_accuracy")]
    if not evaluated:
        return None, None
    last = evaluated[-1]
    return float(last["elapsed_minutes"]), float(last["val_mask_token_accuracy"])


def passed_on(flags, name):
    """The value of `--name` among the run_classifier.py flags after `--`, or None."""
    return flags[flags.index(name) + 1] if name in flags[:-1] else None


def bag_of_words(train, validation, label_count, seed, epochs):
    """The validation accuracy of logistic regression on binary bag-of-words features: each text
    as the set of the training split's words it holds (TextVectorization, multi-hot), one softmax
    layer over them, Adam, batches of 64."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    words = tf_keras.layers.TextVectorization(output_mode="multi_hot")
    words.adapt(tf.data.Dataset.from_tensor_slices(train.texts).batch(1024))

    def batches(split, shuffle):
        dataset = tf.data.Dataset.from_tensor_slices((split.texts, np.asarray(split.labels)))
        if shuffle:
            dataset = dataset.shuffle(len(split), seed=seed)
        return dataset.batch(64).map(lambda texts, labels: (words(texts), labels))

    model = tf_keras.Sequential([tf_keras.layers.Dense(label_count, activation="softmax")])
    model.compile(
        tf_keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy", metrics=["accuracy"]
    )
    model.fit(batches(train, shuffle=True), epochs=epochs, verbose=0)
    return model.evaluate(batches(validation, shuffle=False), verbose=0)[1]


def fine_tune(model, output_dir, seed, args, from_scratch=False):
    """One run_classifier.py command; its scores from eval_results.json and its minutes."""
    command = [sys.executable, str(REPO / "run_classifier.py"), "--no_tpu"]
    command += ["--model_name_or_path", model, "--output_dir", output_dir, "--seed", str(seed)]
    command += ["--train_file", args.train_file, "--validation_file", args.validation_file]
    command += ["--from_scratch"] * from_scratch + args.run_classifier_flags
    started = time.perf_counter()
    # In the caller's working folder: relative folders and files mean what they meant there.
    with open(f"{output_dir}.log", "w") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
    minutes = (time.perf_counter() - started) / 60
    if finished.returncode != 0:  # the log may be in a temporary folder, gone at exit: show it
        with open(f"{output_dir}.log") as log:
            tail = "".join(log.readlines()[-15:])
        sys.exit(f"{tail}\n{' '.join(map(str, command))} failed; the end of its output is above.")
    with open(f"{output_dir}/eval_results.json") as file:
        return json.load(file), minutes


def row(name, accuracies, minutes, pretraining=(None, None)):
    """A table row: the pretraining's minutes and accuracy at [MASK] (blank without), then the mean,
    standard deviation, lowest and highest accuracy, and the mean minutes a run."""
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    figures = [statistics.mean(accuracies), spread, min(accuracies), max(accuracies)]
    pretraining_minutes, mask_accuracy = pretraining
    before = [
        "" if pretraining_minutes is None else f"{pretraining_minutes:.1f}",
        "" if mask_accuracy is None else f"{mask_accuracy:.3f}",
    ]
    return [
        name,
        *before,
        *(f"{value:.3f}" for value in figures),
        f"{statistics.mean(minutes):.1f}",
    ]


def main(args):
    print(describe_machine())
    with tf_startup.tensorflow_startup_log_held_back():  # shown only if TensorFlow fails to start
        import tensorflow as tf

        tf.config.list_physical_devices()  # the device probing that logs (cuInit without a GPU)
    limit = passed_on(args.run_classifier_flags, "--limit")
    train, validation, label_names = labelled_tsv_splits(
        args.train_file, args.validation_file, limit=int(limit) if limit else None
    )
    most_frequent = max(range(len(label_names)), key=train.labels.count)
    print(
        f"{len(train):,} training and {len(validation):,} validation examples; the training "
        f"split's most frequent label scores {validation.majority_share(most_frequent):.3f}."
    )
    rows = []
    accuracies, minutes = [], []
    for seed in args.seeds:
        started = time.perf_counter()
        accuracies.append(bag_of_words(train, validation, len(label_names), seed, args.bow_epochs))
        minutes.append((time.perf_counter() - started) / 60)
    rows.append(row("bag of words, logistic regression", accuracies, minutes))

    fine_tuned = [(name, folder, True) for name, folder in args.from_scratch]
    fine_tuned += [(name, folder, False) for name, folder in args.model]
    with tempfile.TemporaryDirectory() as scratch_space:
        output_dir = Path(args.output_dir or scratch_space)
        output_dir.mkdir(parents=True, exist_ok=True)
        for number, (name, model, from_scratch) in enumerate(fine_tuned):
            results = [
                fine_tune(model, output_dir / f"row{number}-seed{seed}", seed, args, from_scratch)
                for seed in args.seeds
            ]
            accuracies = [scores["accuracy"] for scores, _ in results]
            pretraining = (None, None) if from_scratch else pretraining_figures(model)
            rows.append(row(name, accuracies, [minutes for _, minutes in results], pretraining))
            print(f"{name}: {', '.join(f'{value:.4f}' for value in accuracies)}", flush=True)
    header = ["row", "pretraining minutes", "accuracy at [MASK]", "accuracy", "std", "lowest"]
    header += ["highest", "minutes a run"]
    print(f"\nValidation accuracy over seeds {', '.join(map(str, args.seeds))}:\n")
    print(markdown_table(header, rows))


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "downstream.py")
