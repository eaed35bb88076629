#!/usr/bin/env python
"""Step 2 on Beam with one big compressed file: does its wall time grow with the number of blocks
the file is cut into? The same documents as one plain text file (entered at byte offsets) are the
reference, at the same --rows_per_block.

    python benchmarks/beam_big_files.py --train_file wt2/train.txt --tokenizer wt2/tokenizer \
        --copies 5 --blocks 40 160 --rounds 3

--copies N copies of --train_file's lines are written as one .txt and as one file of each of
--formats (JSON lines, {"text": line} a line, gzip- or zstd-compressed); for each of --blocks K,
`python prepare_tfrecord_shards.py --rows_per_block <rows / K> --runner DirectRunner
--direct_num_workers 2 --direct_running_mode multi_processing` runs on each file, as a user runs
it, in a process of its own. The sides are alternated (each round runs them in the reverse order of
the last), and the table gives each side's median wall time and the median of the rounds' ratios to
the plain text's. A file read from its start for each of its blocks would show as a ratio that
grows with K; a file read once keeps it flat. Every file's shards must be the plain text's, byte
for byte (manifest.json but the path it names as the source).
"""

import gzip
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from corpus_formats import shards  # the split's files, its manifest without the source
from machine import check_paths_exist, describe_machine, load_average, markdown_table
from prepare_shards import measured_run

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # mlm_pipeline/
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error  # noqa: E402

FORMATS = ["jsonl.gz", "jsonl.zst"]


def parse_args(argv=None):
    parser = OneLineErrorParser(description=__doc__.splitlines()[1])
    parser.add_argument("--train_file", required=True, help="A text corpus, one document a line.")
    parser.add_argument(
        "--tokenizer", required=True, help="Tokenizer folder (train_unigram.py's --output_dir)."
    )
    parser.add_argument(
        "--max_length", type=int, default=128, help="Tokens a sequence (default: 128)."
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=5,
        help="Copies of --train_file's lines in the one big file (default: 5).",
    )
    parser.add_argument(
        "--blocks",
        type=int,
        nargs="+",
        default=[40, 160],
        help="How many blocks the file is cut into, each a run (default: 40 160).",
    )
    parser.add_argument(
        "--formats",
        nargs="+",
        default=FORMATS,
        choices=FORMATS,
        help="The compressed formats measured against plain text (default: all).",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="Beam worker processes (--direct_num_workers, multi_processing); 1 runs the "
        "DirectRunner in its own process (default: 2).",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="Runs of every side at every K (default: 3)."
    )
    parser.add_argument(
        "--sample_every",
        type=float,
        default=0.2,
        help="Seconds between samples of a run's memory (default: 0.2).",
    )
    return parser.parse_args(argv)


def write_file(lines, extension, path):
    """`lines` as one file: plain text, or JSON lines compressed as `extension` says."""
    if extension == "txt":
        data = "".join(line + "\n" for line in lines).encode()
    else:
        data = "".join(json.dumps({"text": line}) + "\n" for line in lines).encode()
    if extension.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)  # gzip's own default level
    elif extension.endswith(".zst"):
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    Path(path).write_bytes(data)
    return len(data)


def run_prepare(args, path, rows_per_block, output_dir):
    command = [sys.executable, str(REPO / "prepare_tfrecord_shards.py"), "--train_file", path]
    command += ["--split", "train", "--tokenizer_name_or_path", args.tokenizer]
    command += ["--max_length", str(args.max_length), "--rows_per_block", str(rows_per_block)]
    command += ["--output_dir", output_dir, "--runner", "DirectRunner"]
    if args.workers > 1:
        command += ["--direct_num_workers", str(args.workers)]
        command += ["--direct_running_mode", "multi_processing"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_DISABLE="1")
    return measured_run(command, env, args.sample_every)


def main(args):
    check_paths_exist(args, "train_file", "tokenizer")
    if importlib.util.find_spec("apache_beam") is None:
        raise UsageError(
            "this benchmark runs Apache Beam, which is not installed: pip install -r "
            "requirements-beam.txt"
        )
    args.train_file, args.tokenizer = map(os.path.abspath, (args.train_file, args.tokenizer))
    sides = ["txt", *dict.fromkeys(args.formats)]
    print(f"Machine: {describe_machine()}")
    with open(args.train_file, encoding="utf-8") as file:
        lines = file.read().splitlines() * args.copies
    text_mb = len("\n".join(lines).encode()) / 1e6
    print(
        f"Corpus: {args.copies} x {args.train_file}: {len(lines):,} rows, {text_mb:.1f} MB of "
        f"text; --max_length {args.max_length}, Beam workers: {args.workers}\n"
    )
    walls, ratios, peaks = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="beam-big-files-benchmark-") as scratch:
        files, sizes = {}, {}
        for side in sides:
            files[side] = os.path.join(scratch, f"corpus.{side}")
            sizes[side] = write_file(lines, side, files[side])
        for round_ in range(args.rounds):
            order = sides if round_ % 2 == 0 else sides[::-1]  # alternated, round by round
            for blocks in args.blocks:
                rows_per_block = -(-len(lines) // blocks)
                written, wall = {}, {}
                for side in order:
                    output_dir = os.path.join(scratch, f"shards-{blocks}-{side}")
                    run = run_prepare(args, files[side], rows_per_block, output_dir)
                    written[side], wall[side] = shards(output_dir), run["wall"]
                    walls.setdefault((blocks, side), []).append(run["wall"])
                    peak = max(run["workers"] or [run["launcher"]])  # 1 worker: the launcher
                    peaks[blocks, side] = max(peaks.get((blocks, side), 0), peak)
                    shutil.rmtree(output_dir)
                for side in sides:
                    if written[side] != written["txt"]:
                        sys.exit(f"{side} at {blocks} blocks gave other shards than plain text")
                    ratios.setdefault((blocks, side), []).append(wall[side] / wall["txt"])
                print(
                    f"round {round_ + 1}, {blocks} blocks: "
                    + ", ".join(f"{side} {wall[side]:.1f} s" for side in order),
                    flush=True,
                )
    rows = [
        [
            side,
            f"{sizes[side] / 1e6:.1f}",
            f"{blocks}",
            f"{-(-len(lines) // blocks):,}",
            f"{statistics.median(walls[blocks, side]):.1f}",
            f"{peaks[blocks, side]:,.0f}",
            f"{statistics.median(ratios[blocks, side]):.2f}x",
            "yes",
        ]
        for blocks in args.blocks
        for side in sides
    ]
    header = ["file", "MB", "blocks", "rows a block", "wall s (median)", "a worker's peak RSS MiB"]
    header += ["/ txt (median of rounds)", "same shards as txt"]
    print()
    print(markdown_table(header, rows))
    print(f"\n{args.rounds} rounds. Load average at the end: {load_average()}")


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "beam_big_files.py")
