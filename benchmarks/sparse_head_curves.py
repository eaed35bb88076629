"""The sparse LM head against full logits on real shards: loss at every step, and time per step,
side by side.

    python benchmarks/sparse_head_curves.py --train_dataset shards/train --tokenizer tokenizer \
        --steps 300

Both runs start from the same initial weights and read the same batches with the same masks (same
seed), so any difference in the loss curves comes from the head. run_mlm.py's own functions build
the data and the model; the loss of each step is recovered from fit()'s running mean.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run_mlm.py lives at the repository root

from machine import describe_machine  # noqa: E402
from training_speed import CONFIGS  # noqa: E402

import run_mlm  # noqa: E402
from mlm_pipeline import contract  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train_dataset", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--config", default="tiny", choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--print_every", type=int, default=25)
    return parser.parse_args()


def train(head, args, tokenizer, manifest):
    """Per-step losses and seconds per step (the first 5 steps, which trace and warm up,
    excluded)."""
    import tensorflow as tf
    import tf_keras

    overrides = ",".join(f"{k}={v}" for k, v in CONFIGS[args.config].items() if k != "vocab_size")
    paths = ["--train_dataset", args.train_dataset, "--tokenizer", args.tokenizer]
    options = ["--seed", "0", "--shuffle_buffer_size", "10000", "--mlm_head", head]
    options += ["--learning_rate", str(args.learning_rate), "--warmup_ratio", "0.05"]
    options += ["--per_replica_batch_size", str(args.batch_size), "--no_pytorch_export"]
    options += ["--config_overrides", overrides, "--output_dir", "unused"]
    flags = run_mlm.parse_args(paths + options)  # run_mlm.py's own flags; its defaults for the rest
    tf_keras.utils.set_random_seed(0)  # the same initial weights for both heads
    max_length = manifest["max_length"]
    config = run_mlm.build_config(
        tokenizer, max_length, **run_mlm.flag_values(flags, run_mlm.CONFIG_FLAGS)
    )
    dataset = run_mlm.build_dataset(
        manifest["files"],
        args.batch_size,
        training=True,
        tokenizer=tokenizer,
        max_length=max_length,
        **run_mlm.flag_values(flags, run_mlm.DATA_FLAGS),
    )
    _, trainer = run_mlm.build_model(
        config,
        tf.distribute.get_strategy(),
        tokenizer.mask_token_id,
        args.steps,
        **run_mlm.flag_values(flags, run_mlm.MODEL_FLAGS),
    )

    class StepLog(tf_keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.means, self.times = [], []

        def on_train_batch_end(self, batch, logs=None):
            self.means.append(logs["loss"])
            self.times.append(time.perf_counter())

    log = StepLog()
    trainer.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[log])
    # fit() reports the running mean of the epoch; step k's own loss is k*mean_k - (k-1)*mean_(k-1).
    losses = [log.means[0]] + [
        (k + 1) * log.means[k] - k * log.means[k - 1] for k in range(1, len(log.means))
    ]
    seconds = (log.times[-1] - log.times[4]) / (len(log.times) - 5)
    return losses, seconds


def main():
    args = parse_args()
    print(f"Machine: {describe_machine()}")
    tokenizer = contract.load_tokenizer(args.tokenizer, "--tokenizer", require_mlm_tokens=True)
    manifest = contract.read_manifest(args.train_dataset, "--train_dataset")
    full_losses, full_seconds = train("full", args, tokenizer, manifest)
    sparse_losses, sparse_seconds = train("sparse", args, tokenizer, manifest)

    print(
        f"{args.config} config, vocab {len(tokenizer)}, batch {args.batch_size} x "
        f"{manifest['max_length']}, lr {args.learning_rate}, {args.steps} steps\n"
    )
    print("| step | loss, full logits | loss, sparse head | difference |")
    print("|---:|---:|---:|---:|")
    for step in list(range(0, args.steps, args.print_every)) + [args.steps - 1]:
        full, sparse = full_losses[step], sparse_losses[step]
        print(f"| {step + 1} | {full:.4f} | {sparse:.4f} | {sparse - full:+.4f} |")
    largest = max(abs(a - b) for a, b in zip(full_losses, sparse_losses))
    print(f"\nLargest per-step difference over {args.steps} steps: {largest:.2e}")
    # The two runs are sequential, so this ratio is rougher than benchmarks/training_speed.py's
    # interleaved one.
    print(
        f"Seconds per step (sequential runs): full {full_seconds:.3f}, sparse {sparse_seconds:.3f} "
        f"({full_seconds / sparse_seconds:.2f}x the tokens per second)"
    )


if __name__ == "__main__":
    main()
