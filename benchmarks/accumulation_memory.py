"""Peak memory against --gradient_accumulation_steps at a fixed global batch.

    python benchmarks/accumulation_memory.py --train_dataset wt2/shards/train \
        --tokenizer wt2/tokenizer --batch_size 128 --accumulation 1 2 4 8

Each setting is a fresh `run_mlm.py` process training the small config (hidden 256, 4 layers) for a
few steps on batches of --batch_size sequences; its peak resident memory is read from the kernel
when it exits (wait4's ru_maxrss). The same batch split into N micro-batches keeps one micro-batch's
activations alive at a time, so what falls is the activations' share; the weights, the optimizer's
moments, TensorFlow and the input pipeline stay. A last run on batches of the smallest micro-batch
alone shows that floor.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import describe_machine

REPO = Path(__file__).resolve().parent.parent
SMALL = "hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_dataset", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--batch_size", type=int, default=128, help="Global batch (one replica).")
    parser.add_argument("--accumulation", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--config_overrides", default=SMALL)
    return parser.parse_args()


def peak_memory(args, batch_size, accumulation, steps):
    """(peak RSS in MiB, seconds) of one run_mlm.py process."""
    with tempfile.TemporaryDirectory() as output_dir:
        command = [
            sys.executable,
            str(REPO / "run_mlm.py"),
            "--no_tpu",
            "--train_dataset",
            args.train_dataset,
            "--tokenizer",
            args.tokenizer,
            "--output_dir",
            output_dir,
            "--config_overrides",
            args.config_overrides,
            "--per_replica_batch_size",
            str(batch_size),
            "--gradient_accumulation_steps",
            str(accumulation),
            "--max_steps",
            str(steps),
            "--save_steps",
            "0",
            "--no_pytorch_export",
        ]
        started = time.perf_counter()
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        error = process.stderr.read()
        process.stderr.close()
        if status != 0:
            raise SystemExit(f"run_mlm.py failed for N={accumulation}:\n{error[-3000:]}")
    return usage.ru_maxrss / 1024, seconds  # ru_maxrss is in KiB on Linux


def main():
    args = parse_args()
    print(f"Machine: {describe_machine()}")
    print(
        f"Global batch {args.batch_size} sequences, config {args.config_overrides}, {args.steps} "
        "steps per run"
    )
    rows = []
    for accumulation in args.accumulation:
        mib, seconds = peak_memory(args, args.batch_size, accumulation, args.steps)
        rows.append((accumulation, mib, seconds))
        print(f"N={accumulation}: peak RSS {mib:,.0f} MiB, {seconds:.0f} s", flush=True)
    smallest = args.batch_size // max(args.accumulation)
    floor, _ = peak_memory(args, smallest, 1, 1)
    print("\n| N | micro-batch | peak RSS, MiB | vs N=1 | above a run of one micro-batch alone |")
    print("|---:|---:|---:|---:|---:|")
    for accumulation, mib, _ in rows:
        print(
            f"| {accumulation} | {args.batch_size // accumulation} | {mib:,.0f} | "
            f"{mib / rows[0][1]:.2f}x | {mib - floor:+,.0f} MiB |"
        )
    print(
        f"\nA run of batch {smallest} (N=1, one step): {floor:,.0f} MiB, the floor the runs above "
        "approach."
    )


if __name__ == "__main__":
    main()
