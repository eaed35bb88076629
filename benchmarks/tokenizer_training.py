#!/usr/bin/env python
"""Wall time of train_unigram.py's whole main() versus the 🤗 tokenizers Unigram trainer called
alone.

    python benchmarks/tokenizer_training.py --train_file wiki.train.tokens --vocab_size 8000 \
        --pairs 8

Both run in this process, one after the other, in pairs whose order alternates (A B, B A, A B, ...)
so that a slow spell of a shared machine hits both alike; each pair gives the ratio A / B, and the
median of those ratios is the result (goal: at most 1.1).

  A  train_unigram.main(): read the file line by line, train, canonicalize, wrap for transformers,
     save.
  B  the trainer alone: the same tokenizers Tokenizer (train_unigram's normalizer and training
     pre-tokenizer) and the same UnigramTrainer options, train_from_iterator over the file's lines
     in batches of 1000; nothing else. So A - B is what train_unigram.py adds around the trainer.

Import time is excluded from both: an untimed run of each first imports every library (transformers,
tokenizers) and reads the file once, so that both find it in the page cache. The CPU time of this
process is printed beside the wall time: on a machine others share it is the steadier of the two.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

# describe_machine() imports TensorFlow for its version
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# train_unigram.py's folder
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machine import describe_machine  # noqa: E402
from tokenizer_efficiency import as_txt, load_average, quiet  # noqa: E402

import train_unigram  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_file", required=True, help="Training text, one document per line.")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--pairs", type=int, default=8, help="Timed A/B pairs (default: 8).")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.train_file):
        parser.error(f"--train_file {args.train_file} does not exist")
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} must be at least 1")
    return args


def run_main(train_file, vocab_size, output_dir):
    argv = ["--train_file", train_file, "--vocab_size", str(vocab_size), "--output_dir", output_dir]
    train_unigram.main(train_unigram.parse_args(argv + ["--overwrite_output_dir"]))


def run_trainer_alone(train_file, vocab_size, batch_size=1000):
    tokenizer = train_unigram.build_tokenizer()
    tokenizer.pre_tokenizer = train_unigram.training_pre_tokenizer()
    trainer = train_unigram.build_trainer(vocab_size)
    with open(train_file, encoding="utf-8") as file:
        lines = (line.rstrip("\n") for line in file)
        batches = iter(lambda: [line for _, line in zip(range(batch_size), lines)], [])
        tokenizer.train_from_iterator(batches, trainer=trainer)


def timed(function, *args):
    """(wall seconds, CPU seconds of this process), with the progress bars and prints silenced."""
    with quiet():
        start, start_cpu = time.perf_counter(), time.process_time()
        function(*args)
        return time.perf_counter() - start, time.process_time() - start_cpu


def main(args):
    print(f"Machine: {describe_machine()}")
    print(f"Load average before: {load_average()}")
    size = os.path.getsize(args.train_file) / 1e6
    print(
        f"Corpus: {os.path.basename(args.train_file)} ({size:.1f} MB), vocabulary "
        f"{args.vocab_size} pieces"
    )
    with tempfile.TemporaryDirectory() as folder:
        train_file = as_txt(args.train_file, folder)
        output_dir = os.path.join(folder, "tokenizer")
        runs = {
            "A": lambda: timed(run_main, train_file, args.vocab_size, output_dir),
            "B": lambda: timed(run_trainer_alone, train_file, args.vocab_size),
        }
        runs["A"]()  # untimed: imports and page cache
        runs["B"]()
        rows = []
        for pair in range(args.pairs):
            order = "AB" if pair % 2 == 0 else "BA"
            seconds = {which: runs[which]() for which in order}
            (a, a_cpu), (b, b_cpu) = seconds["A"], seconds["B"]
            rows.append((pair + 1, order, a, b, a / b, a_cpu, b_cpu, a_cpu / b_cpu))
    print()
    print("| pair | order | A wall s | B wall s | A / B wall | A CPU s | B CPU s | A / B CPU |")
    print("|---:|:---:|---:|---:|---:|---:|---:|---:|")
    for pair, order, a, b, ratio, a_cpu, b_cpu, ratio_cpu in rows:
        print(
            f"| {pair} | {order} | {a:.2f} | {b:.2f} | {ratio:.3f} | {a_cpu:.2f} | {b_cpu:.2f} | "
            f"{ratio_cpu:.3f} |"
        )
    wall, cpu = statistics.median(row[4] for row in rows), statistics.median(row[7] for row in rows)
    print()
    print(
        f"Median of A / B over {len(rows)} pairs: {wall:.3f} in wall time (goal: at most 1.1), "
        f"{cpu:.3f} in CPU time"
    )
    print(f"Load average after: {load_average()}")


if __name__ == "__main__":
    main(parse_args())
