"""Did the pretraining pay off? Validation accuracy on a classification task (SST-2 by default) of
a bag-of-words baseline, of the tiny config from random weights, and of fine-tuned pretrained
models, each row the mean and spread over fine-tuning seeds, with its minutes.

    python benchmarks/downstream.py --train_file sst2/train.tsv --validation_file sst2/dev.tsv \
        --quickstart_model quickstart_output/model --recipe_model runs/cpu-recipe/model

Rows: (a) a binary bag of words and logistic regression (tf_keras: TextVectorization multi-hot
features of the training split's words, one softmax layer, Adam), the baseline a pretrained model
must beat; (b) run_classifier.py --from_scratch: the architecture and tokenizer of --scratch_model
(by default the recipe's model, else the quickstart's) from random weights; (c) the quickstart's
model and (d) the model of README's 20-minute CPU recipe, fine-tuned. Each fine-tuning row runs
run_classifier.py as a user runs it, in a subprocess with its default flags but the data and the
seed, once per --seeds, and reads the scores from its eval_results.json: there is no second copy of
the fine-tuning here. Minutes are the wall time of each command, start-up and evaluation included.
Everything after `--` goes to every run_classifier.py call unchanged (--limit 64 --num_epochs 1
for a check in seconds; --limit also caps the bag of words' training rows).
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

from machine import describe_machine, markdown_table  # noqa: E402

from mlm_pipeline import labelled_data, tf_startup  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--train_file", required=True, help="labelled training examples (.tsv)")
    parser.add_argument("--validation_file", required=True, help="the examples scored (.tsv)")
    parser.add_argument("--quickstart_model", help="the quickstart's run_mlm.py output folder")
    parser.add_argument("--recipe_model", help="the 20-minute CPU recipe's output folder")
    parser.add_argument(
        "--scratch_model",
        help="the folder whose architecture and tokenizer the from-scratch row trains (default: "
        "--recipe_model, else --quickstart_model)",
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
    with open(f"{output_dir}.log", "w") as log:
        finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    minutes = (time.perf_counter() - started) / 60
    if finished.returncode != 0:
        sys.exit(f"{' '.join(command)} failed; its output is in {output_dir}.log")
    with open(f"{output_dir}/eval_results.json") as file:
        return json.load(file), minutes


def row(name, accuracies, minutes):
    """A table row: the mean, standard deviation, lowest and highest accuracy, and the mean
    minutes a run."""
    spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    figures = [statistics.mean(accuracies), spread, min(accuracies), max(accuracies)]
    return [name, *(f"{value:.3f}" for value in figures), f"{statistics.mean(minutes):.1f}"]


def main(args):
    print(describe_machine())
    with tf_startup.tensorflow_startup_log_held_back():  # shown only if TensorFlow fails to start
        import tensorflow as tf

        tf.config.list_physical_devices()  # the device probing that logs (cuInit without a GPU)
    limit = passed_on(args.run_classifier_flags, "--limit")
    train, validation, label_names = labelled_data.load_labelled_splits(
        dataset_name=None,
        dataset_config=None,
        train_file=args.train_file,
        validation_file=args.validation_file,
        text_column="sentence",
        text_pair_column=None,
        label_column="label",
        limit=int(limit) if limit else None,
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
    rows.append(row("(a) bag of words, logistic regression", accuracies, minutes))

    scratch = args.scratch_model or args.recipe_model or args.quickstart_model
    fine_tuned = [
        ("(b) tiny config from random weights (--from_scratch)", scratch, True),
        ("(c) the quickstart's model", args.quickstart_model, False),
        ("(d) the 20-minute CPU recipe's model", args.recipe_model, False),
    ]
    with tempfile.TemporaryDirectory() as scratch_space:
        output_dir = Path(args.output_dir or scratch_space)
        output_dir.mkdir(parents=True, exist_ok=True)
        for number, (name, model, from_scratch) in enumerate(fine_tuned):
            if model is None:
                continue
            results = [
                fine_tune(model, output_dir / f"row{number}-seed{seed}", seed, args, from_scratch)
                for seed in args.seeds
            ]
            accuracies = [scores["accuracy"] for scores, _ in results]
            rows.append(row(name, accuracies, [minutes for _, minutes in results]))
            print(f"{name}: {', '.join(f'{value:.4f}' for value in accuracies)}", flush=True)
    header = ["row", "accuracy", "std", "lowest", "highest", "minutes a run"]
    print(f"\nValidation accuracy over seeds {', '.join(map(str, args.seeds))}:\n")
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main(parse_args())
