"""Fine-tuning speed: run_classifier.py's training steps with every batch padded to --max_length
(one shape, what a TPU runs) against batches drawn from length buckets and padded to 16, 32, 64...
tokens (the default on CPUs and GPUs).

    python benchmarks/classifier_speed.py --train_file sst2/train.tsv \
        --validation_file sst2/dev.tsv --model runs/cpu-recipe/model --limit 8000 --rounds 3

Each variant is run_classifier.py itself, `main(parse_args([...]), callbacks=[clock])`, one epoch on
the first --limit training examples, with the variant's flags added:

    one length     --pad_to_max_length
    length buckets run_classifier.py's default

The clock, a Keras callback, times each step from its start to its end; a run's figure is the
examples of its steps after the first --warmup_steps (which trace the step) over their seconds.
Rounds run both variants in turn, a fresh run each, and each figure is the median over rounds, so a
slow spell of a shared machine hits both alike. The padded tokens a step are counted from the same
tokenizer and the same bucketing as the run's (run_classifier.py's engine, classifier_model.py).
"""

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
from pathlib import Path

from machine import (
    describe_machine,
    labelled_tsv_splits,
    load_average,
    markdown_table,
    step_clock,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run_classifier.py's folder
import run_classifier  # noqa: E402
from mlm_pipeline import classifier_model  # noqa: E402
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error  # noqa: E402
from mlm_pipeline.pretrained_model import PretrainedModel  # noqa: E402

VARIANTS = {"one length (--pad_to_max_length)": ["--pad_to_max_length"], "length buckets": []}


def parse_args(argv=None):
    parser = OneLineErrorParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--train_file", required=True, help="labelled training examples (.tsv)")
    parser.add_argument("--validation_file", required=True, help="the examples scored (.tsv)")
    parser.add_argument("--model", required=True, help="a run_mlm.py output folder")
    parser.add_argument("--limit", type=int, default=8000, help="training examples a run")
    parser.add_argument("--batch_size", type=int, default=32, help="examples a step")
    parser.add_argument("--max_length", type=int, default=64, help="run_classifier.py's")
    parser.add_argument("--warmup_steps", type=int, default=20, help="untimed steps a run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the variants")
    return parser.parse_args(argv)


def padded_tokens_a_step(args):
    """Tokens a training step holds, padding included, per variant: counted on the first --limit
    examples with run_classifier.py's encoding and buckets."""
    import numpy as np

    pretrained = PretrainedModel(args.model, weights=False)
    train, _, _ = labelled_tsv_splits(args.train_file, args.validation_file, limit=args.limit)
    with_token_types = pretrained.config.type_vocab_size > 1
    features = classifier_model.encode(
        pretrained.tokenizer, train, args.max_length, with_token_types
    )
    buckets = classifier_model.length_buckets(args.max_length)
    batches = classifier_model.batches_per_bucket(features, args.batch_size, buckets)
    real = features["attention_mask"].sum() / len(train)
    return {
        "one length (--pad_to_max_length)": args.max_length,
        "length buckets": float(np.dot(buckets, batches) / batches.sum()),
        "without padding": real,
    }


def run_variant(args, variant, output_dir):
    """One epoch of run_classifier.py with the variant's flags: examples a second after warm-up."""
    import tf_keras

    argv = ["--no_tpu", "--model_name_or_path", args.model, "--output_dir", output_dir]
    argv += ["--overwrite_output_dir", "--train_file", args.train_file]
    argv += ["--validation_file", args.validation_file, "--limit", str(args.limit)]
    argv += ["--num_epochs", "1", "--per_replica_batch_size", str(args.batch_size)]
    # the copy for transformers 5 is written after the timed steps: not needed here
    argv += ["--max_length", str(args.max_length), "--no_pytorch_export", *VARIANTS[variant]]
    clock = step_clock()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
            run_classifier.main(run_classifier.parse_args(argv), callbacks=[clock])
    finally:
        tf_keras.backend.clear_session()
    timed = clock.seconds[args.warmup_steps :]
    if not timed:
        raise UsageError(f"--limit {args.limit} gives no steps past --warmup_steps: raise --limit")
    return len(timed) * args.batch_size / sum(timed)


def main(args):
    print(describe_machine())
    tokens = padded_tokens_a_step(args)
    speeds = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(args.rounds):
            for variant in VARIANTS:
                output_dir = os.path.join(scratch, f"classifier-{round_index}")
                speeds[variant].append(run_variant(args, variant, output_dir))
    print(f"load average after the runs: {load_average()}")
    print(
        f"\n{args.limit:,} training examples, batches of {args.batch_size}, --max_length "
        f"{args.max_length}; {args.rounds} round(s), medians; {tokens['without padding']:.1f} "
        "tokens an example without padding:\n"
    )
    baseline = statistics.median(speeds["one length (--pad_to_max_length)"])
    rows = []
    for variant, figures in speeds.items():
        median = statistics.median(figures)
        rows.append(
            [
                variant,
                f"{tokens[variant]:.1f}",
                f"{1000 * args.batch_size / median:.0f}",
                f"{median:,.0f}",
                f"**{median / baseline:.2f}x**",
            ]
        )
    header = ["batches", "tokens an example", "ms a step", "examples/s", "vs one length"]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "classifier_speed.py")
