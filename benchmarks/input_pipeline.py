"""Input pipeline: sequences per second that run_mlm.py's training tf.data pipeline delivers,
masking included, against the sequences per second its fastest training step consumes, measured side
by side.

    python benchmarks/input_pipeline.py --train_dataset shards/train --tokenizer tokenizer

The pipeline is run_mlm.build_dataset(training=True) on the given shards, read to the end of each
batch (file shuffle, interleaved reads, shuffle buffer, batch, parse, mask, prefetch), with nothing
else running. The step is the tiny config with the sparse head (the fastest variant in
benchmarks/training_speed.py), fed from memory. A ratio well above 1 means training never waits for
data; the goal is 50x, so the pipeline keeps up on hardware that runs the step 50 times faster than
this machine.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run_mlm.py lives at the repository root

from machine import describe_machine  # noqa: E402
from training_speed import CONFIGS, build_variant, masked_batches, seconds_per_step  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import contract  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--train_dataset",
        required=True,
        help="A train split written by prepare_tfrecord_shards.py.",
    )
    parser.add_argument(
        "--tokenizer", required=True, help="The tokenizer those shards were written with."
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--mlm_probability", type=float, default=0.15)
    parser.add_argument("--shuffle_buffer_size", type=int, default=2**16)
    parser.add_argument("--batches", type=int, default=300, help="Batches read per round.")
    parser.add_argument("--steps", type=int, default=20, help="Training steps timed per round.")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def sequences_per_second(iterator, batches, batch_size):
    start = time.perf_counter()
    for _ in range(batches):
        features, labels = next(iterator)
        labels.numpy()  # make sure the batch really exists on the host
    return batches * batch_size / (time.perf_counter() - start)


def main():
    args = parse_args()
    print(f"Machine: {describe_machine()}")
    tokenizer = contract.load_tokenizer(args.tokenizer, "--tokenizer", require_mlm_tokens=True)
    manifest = contract.read_manifest(args.train_dataset, "--train_dataset")
    paths = ["--train_dataset", args.train_dataset, "--tokenizer", args.tokenizer]
    options = ["--seed", "0", "--shuffle_buffer_size", str(args.shuffle_buffer_size)]
    options += ["--mlm_probability", str(args.mlm_probability), "--output_dir", "unused"]
    flags = run_mlm.parse_args(paths + options)  # run_mlm.py's own flags and defaults
    dataset = run_mlm.build_dataset(
        manifest["files"],
        args.batch_size,
        training=True,
        tokenizer=tokenizer,
        max_length=manifest["max_length"],
        **run_mlm.flag_values(flags, run_mlm.DATA_FLAGS),
    )
    iterator = iter(dataset)
    sequences_per_second(iterator, 20, args.batch_size)  # fill the shuffle buffer and warm up

    tiny = dict(CONFIGS["tiny"], vocab_size=len(tokenizer))
    batches = masked_batches(
        args.batch_size, manifest["max_length"], args.mlm_probability, len(tokenizer)
    )
    model, memory_dataset = build_variant("sparse", tiny, batches, manifest["max_length"])
    seconds_per_step(model, memory_dataset, 3)

    supplied, consumed = [], []
    for _ in range(args.rounds):  # alternate, so both see the same machine
        supplied.append(sequences_per_second(iterator, args.batches, args.batch_size))
        consumed.append(args.batch_size / seconds_per_step(model, memory_dataset, args.steps))
    supply, demand = statistics.median(supplied), statistics.median(consumed)
    print(
        f"Shards: {len(manifest['files'])} files, {manifest['records']} sequences of "
        f"{manifest['max_length']} tokens; batch {args.batch_size}; median of {args.rounds} "
        "rounds\n"
    )
    print("| pipeline (sequences/s) | tiny sparse training step consumes (sequences/s) | ratio |")
    print("|---:|---:|---:|")
    print(f"| {supply:,.0f} | {demand:,.0f} | {supply / demand:.0f}x |")


if __name__ == "__main__":
    main()
