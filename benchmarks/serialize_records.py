#!/usr/bin/env python
"""Building tf.train.Example bytes for packed sequences: four ways, alone and inside prepare's whole
run.

    python benchmarks/serialize_records.py --train_file wt2/train.txt --tokenizer wt2/tokenizer \
        --repeats 7

prepare_tfrecord_shards.py turns every [N, max_length] block of token ids into N serialized Examples
with one int64 feature. The ways compared, all checked to give the same bytes:

  varints     mlm_pipeline.packing.serialize_examples, what prepare uses: a protobuf encoder in
              numpy (the varints of the whole array at once, then the few bytes that open each
              record, cached by size), which needs no TensorFlow, so Apache Beam's workers run it
              too
  per-row     tf.train.Example(... Int64List(value=row.tolist()) ...).SerializeToString() for each
              row: the textbook way
  reused      one Example object, its Int64List emptied and `.extend(row)`-ed for each row
  encode      tf.io.encode_proto on the whole array, one call per level of nesting (Int64List,
              Feature, the "input_ids" map entry, Features, Example), each on all N rows, which
              prepare used before

Two measurements, each repeated --repeats times with the ways in rotating order:

1. Alone: each way on the same int64 [N, max_length] array of real token ids (the records prepare
   wrote for --train_file). Median seconds, and the median over repeats of each way's time / the
   varints' time.
2. End to end: prepare_tfrecord_shards.py's main() on --train_file, in this process, with
   packing.serialize_examples replaced by each way; wall and CPU seconds of the whole run (CPU:
   every thread's), the seconds spent in `serialize` (wall, and the CPU of the main thread, which
   runs it), and that CPU's share of the run's. prepare tokenizes in --num_proc threads while the
   main thread packs, serializes and writes, so the wall time inside `serialize` includes waiting
   for a core; on a shared machine CPU time is the steadier figure. Imports are paid once, by an
   untimed first run.

The machine is printed first; figures from other machines compare only as ratios.
"""

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # prepare_tfrecord_shards.py and mlm_pipeline/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # machine.py

from machine import describe_machine  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_file", required=True, help="A .txt corpus, one document per line.")
    parser.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder (train_unigram.py's --output_dir)."
    )
    parser.add_argument(
        "--num_proc", type=int, help="Passed to prepare_tfrecord_shards.py if given."
    )
    parser.add_argument(
        "--max_length", type=int, default=128, help="Tokens per sequence (default: 128)."
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="Rounds over the ways, for medians (default: 5)."
    )
    return parser.parse_args(argv)


# --------------------------------------------------------------------------------------------------
# The four ways: int64 [N, L] -> N serialized tf.train.Example, feature "input_ids"


def encode_proto(sequences):
    """tf.io.encode_proto on the whole array, one call per level of nesting, inside out (Int64List,
    Feature, the map entry "input_ids" -> Feature, Features, Example), each on all rows: what
    prepare used before its records had to be written without TensorFlow (Beam's workers)."""
    import tensorflow as tf

    rows = len(sequences)

    def message(message_type, **fields):  # one value of each field per row
        values = [tf.reshape(value, [rows, 1]) for value in fields.values()]
        return tf.io.encode_proto(
            tf.ones([rows, len(fields)], tf.int32), values, list(fields), message_type
        )

    lengths = tf.fill([rows, 1], sequences.shape[1])
    int64_list = tf.io.encode_proto(lengths, [sequences], ["value"], "tensorflow.Int64List")
    feature = message("tensorflow.Feature", int64_list=int64_list)
    entry = message(
        "tensorflow.Features.FeatureEntry", key=tf.fill([rows], "input_ids"), value=feature
    )
    features = message("tensorflow.Features", feature=entry)
    return message("tensorflow.Example", features=features).numpy().tolist()


def per_row(sequences):
    import tensorflow as tf

    records = []
    for row in sequences:
        feature = tf.train.Feature(int64_list=tf.train.Int64List(value=row.tolist()))
        records.append(
            tf.train.Example(
                features=tf.train.Features(feature={"input_ids": feature})
            ).SerializeToString()
        )
    return records


def reused(sequences):
    import tensorflow as tf

    example = tf.train.Example()
    values = example.features.feature["input_ids"].int64_list.value
    records = []
    for row in sequences:
        del values[:]
        values.extend(row)
        records.append(example.SerializeToString())
    return records


# main() adds prepare's own: "varints"
WAYS = {"per-row": per_row, "reused": reused, "encode": encode_proto}


# --------------------------------------------------------------------------------------------------
# Measuring


def print_table(header, rows):
    lines = [header, ["---"] + ["---:"] * (len(header) - 1), *rows]
    print("\n".join("| " + " | ".join(cells) + " |" for cells in lines))


def rotations(names, repeats):
    """The names in a different order each round, so that no way always runs first or after the same
    one."""
    for repeat in range(repeats):
        shift = repeat % len(names)
        yield names[shift:] + names[:shift]


def quietly(prepare, argv):
    """prepare's main() without its progress bar and closing line."""
    with (
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
        contextlib.redirect_stderr(devnull),
    ):
        return prepare.main(prepare.parse_args(argv))


def end_to_end(args, prepare, packing, scratch):
    """prepare's main() once per way per round. Returns {way: [(wall, CPU, serialize wall, serialize
    CPU)]}, in seconds, and the last run's manifest and folder."""
    original = packing.serialize_examples
    results = {name: [] for name in WAYS}
    manifest = None
    for round_number, order in enumerate(rotations(list(WAYS), args.repeats)):
        for name in order:
            # wall, and CPU of the main thread, which is the thread that serializes
            spent = [0.0, 0.0]

            def timed(sequences, way=WAYS[name]):
                wall, cpu = time.perf_counter(), time.thread_time()
                records = way(sequences)
                spent[0] += time.perf_counter() - wall
                spent[1] += time.thread_time() - cpu
                return records

            output_dir = tempfile.mkdtemp(dir=scratch)
            argv = ["--train_file", args.train_file, "--tokenizer_name_or_path", args.tokenizer]
            argv += ["--max_length", str(args.max_length), "--output_dir", output_dir]
            argv += ["--num_proc", str(args.num_proc)] if args.num_proc else []
            packing.serialize_examples = timed
            try:
                wall, cpu = time.perf_counter(), time.process_time()
                manifest = quietly(prepare, argv)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            finally:
                packing.serialize_examples = original
            results[name].append((wall, cpu, *spent))
            print(
                f"round {round_number + 1}, {name}: {wall:.2f} s, serialize {spent[0]:.2f} s",
                flush=True,
            )
    return results, manifest, output_dir


def read_sequences(split_dir, manifest):
    import numpy as np
    import tensorflow as tf

    files = [f"{split_dir}/{shard['file']}" for shard in manifest["shards"]]
    spec = {"input_ids": tf.io.FixedLenFeature([manifest["max_length"]], tf.int64)}
    batches = (
        tf.data.TFRecordDataset(files)
        .batch(4096)
        .map(lambda records: tf.io.parse_example(records, spec))
    )
    return np.concatenate([batch["input_ids"].numpy() for batch in batches])


def alone(sequences, repeats):
    """Each way on the whole array, once per round; returns {way: [seconds]}. Checks the bytes
    agree."""
    expected = per_row(sequences)
    for name, way in WAYS.items():
        assert way(sequences) == expected, f"{name} gives other bytes than tf.train.Example"
    times = {name: [] for name in WAYS}
    for order in rotations(list(WAYS), repeats):
        for name in order:
            start = time.perf_counter()
            WAYS[name](sequences)
            times[name].append(time.perf_counter() - start)
    return times


def main(args):
    import prepare_tfrecord_shards as prepare
    from mlm_pipeline import packing

    WAYS["varints"] = packing.serialize_examples

    args.train_file, args.tokenizer = (
        os.path.abspath(args.train_file),
        os.path.abspath(args.tokenizer),
    )
    print(f"machine: {describe_machine()}")
    print(
        f"corpus: {os.path.basename(args.train_file)}, --max_length {args.max_length}, --repeats "
        f"{args.repeats}\n"
    )
    median = statistics.median
    with tempfile.TemporaryDirectory(prefix="serialize-benchmark-") as scratch:
        quietly(
            prepare,
            [
                "--train_file",
                args.train_file,
                "--tokenizer_name_or_path",
                args.tokenizer,
                "--max_length",
                str(args.max_length),
                "--output_dir",
                f"{scratch}/warm-up",
            ],
        )  # (a first run pays the imports and reads the file into the page cache)
        runs, manifest, output_dir = end_to_end(args, prepare, packing, scratch)
        sequences = read_sequences(f"{output_dir}/train", manifest)
    print(
        f"\n{sequences.shape[0]} records of {sequences.shape[1]} ids, the largest "
        f"{sequences.max()}\n"
    )

    times = alone(sequences, args.repeats)
    base = times["varints"]
    rows = []
    for name, seconds in times.items():
        ratio = median([mine / theirs for mine, theirs in zip(seconds, base)])
        per_record = median(seconds) / len(sequences) * 1e6
        rows.append([name, f"{median(seconds):.3f}", f"{per_record:.2f}", f"{ratio:.2f}×"])
    print("Alone, on the same array (bytes identical):\n")
    print_table(["way", "median s", "µs per record", "vs varints (median of rounds)"], rows)

    base = runs["varints"]
    rows = []
    for name, results in runs.items():
        walls, cpus, spent, spent_cpu = zip(*results)
        wall_ratio = median([mine[0] / theirs[0] for mine, theirs in zip(results, base)])
        cpu_ratio = median([mine[1] / theirs[1] for mine, theirs in zip(results, base)])
        share = median([serialize_cpu / cpu for _, cpu, _, serialize_cpu in results])
        rows.append(
            [
                name,
                f"{median(walls):.2f}",
                f"{median(cpus):.2f}",
                f"{median(spent):.2f} ({median(spent_cpu):.2f})",
                f"{share:.1%}",
                f"{wall_ratio:.2f}× ({cpu_ratio:.2f}×)",
            ]
        )
    print(
        f"\nEnd to end: prepare_tfrecord_shards.py main() on {os.path.basename(args.train_file)}:\n"
    )
    header = [
        "way",
        "median wall s",
        "median CPU s",
        "in serialize: wall s (CPU s)",
        "serialize share of CPU",
        "vs varints: wall (CPU), median of rounds",
    ]
    print_table(header, rows)
    print(f"\nload average at the end: {' '.join(f'{value:.2f}' for value in os.getloadavg())}")


if __name__ == "__main__":
    main(parse_args())
