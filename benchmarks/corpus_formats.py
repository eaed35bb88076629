#!/usr/bin/env python
"""Step 2 on a corpus as people keep it: prepare_tfrecord_shards.py's speed and peak memory reading
the same text as plain text, gzip-compressed JSON lines (as C4 comes), zstd-compressed JSON lines
and Parquet, at several sizes.

    python benchmarks/corpus_formats.py --train_file wt2/train.txt --tokenizer wt2/tokenizer \
        --scales 1 10

For each --scales N, the file is repeated N times and cut into --parts files in each of --formats;
`python prepare_tfrecord_shards.py --train_file '<folder>/part-*.<format>' ...` runs on each, as a
user runs it, in a process of its own, and psutil samples its resident memory every --sample_every
seconds. Every format's shards must be the plain text's, byte for byte (manifest.json but the
pattern it names as the source). Memory that stays flat as the corpus grows shows in the last
table: each format's peak at the largest corpus over its peak at the smallest.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

from machine import check_paths_exist, describe_machine, load_average, markdown_table
from prepare_shards import measured_run

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # mlm_pipeline/
from mlm_pipeline.errors import OneLineErrorParser, exit_on_usage_error  # noqa: E402

FORMATS = ["txt", "jsonl.gz", "json.zst", "parquet"]


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
        "--scales",
        type=int,
        nargs="+",
        default=[1, 10],
        help="Copies of --train_file in each corpus (default: 1 10).",
    )
    parser.add_argument(
        "--formats",
        nargs="+",
        default=FORMATS,
        choices=FORMATS,
        help="The formats each corpus is written in (default: all); txt, the reference, always.",
    )
    parser.add_argument(
        "--parts", type=int, default=4, help="Files each corpus is cut into (default: 4)."
    )
    parser.add_argument(
        "--sample_every",
        type=float,
        default=0.1,
        help="Seconds between samples of a run's memory (default: 0.1).",
    )
    return parser.parse_args(argv)


def write_corpus(lines, times, parts, extension, folder):
    """`times` copies of `lines` cut into `parts` files of `extension`, one part in memory at a
    time; returns the glob over them and their size on disk in bytes."""
    import gzip

    import pyarrow
    import pyarrow.parquet
    import zstandard

    os.makedirs(folder)
    total = len(lines) * times
    for part in range(parts):
        first, last = total * part // parts, total * (part + 1) // parts
        texts = [lines[index % len(lines)] for index in range(first, last)]
        path = Path(folder, f"part-{part:02d}.{extension}")
        if extension == "parquet":
            pyarrow.parquet.write_table(pyarrow.table({"text": texts}), path)
            continue
        if extension == "txt":
            data = "".join(text + "\n" for text in texts).encode()
        else:
            data = "".join(json.dumps({"text": text}) + "\n" for text in texts).encode()
        compress = {"jsonl.gz": gzip.compress, "json.zst": zstandard.ZstdCompressor().compress}
        path.write_bytes(compress.get(extension, lambda data: data)(data))
    size = sum(path.stat().st_size for path in Path(folder).iterdir())
    return os.path.join(folder, f"part-*.{extension}"), size


def shards(folder):
    """The split's files, manifest.json without its "source" (the pattern, which names the
    format)."""
    files = {
        str(path.relative_to(folder)): path.read_bytes()
        for path in sorted(Path(folder).rglob("*"))
        if path.is_file()
    }
    manifest = json.loads(files.pop("train/manifest.json"))
    manifest.pop("source")
    return files, manifest


def run_prepare(args, pattern, rows_per_block, output_dir):
    command = [sys.executable, str(REPO / "prepare_tfrecord_shards.py"), "--train_file", pattern]
    command += ["--split", "train", "--tokenizer_name_or_path", args.tokenizer]
    command += ["--max_length", str(args.max_length), "--rows_per_block", str(rows_per_block)]
    command += ["--output_dir", output_dir]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TQDM_DISABLE="1")
    return measured_run(command, env, args.sample_every)


def main(args):
    check_paths_exist(args, "train_file", "tokenizer")
    args.train_file, args.tokenizer = map(os.path.abspath, (args.train_file, args.tokenizer))
    args.scales = sorted(set(args.scales))
    formats = ["txt", *[name for name in dict.fromkeys(args.formats) if name != "txt"]]
    print(f"Machine: {describe_machine()}")
    with open(args.train_file, encoding="utf-8") as file:
        lines = file.read().splitlines()
    text_mb = len("\n".join(lines).encode()) / 1e6
    print(f"Corpus: {args.train_file} ({text_mb:.1f} MB); --max_length {args.max_length}\n")
    # each part of an Nx corpus is N blocks, whatever N
    rows_per_block = max(1, len(lines) // args.parts)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="corpus-formats-benchmark-") as scratch:
        for scale in args.scales:
            reference = None
            for extension in formats:
                folder = os.path.join(scratch, f"{scale}x", extension.replace(".", "_"))
                pattern, size = write_corpus(lines, scale, args.parts, extension, folder)
                output_dir = os.path.join(scratch, f"{scale}x", f"shards_{extension}")
                run = run_prepare(args, pattern, rows_per_block, output_dir)
                written = shards(output_dir)
                reference = reference or written
                run.update(size=size, same=written == reference)
                runs[scale, extension] = run
                if not run["same"]:
                    sys.exit(
                        f"the {extension} corpus at {scale}x gave other shards than plain text"
                    )
    rows = [
        [
            f"{scale}x ({text_mb * scale:.1f} MB of text)",
            extension,
            f"{run['size'] / 1e6:.1f}",
            f"{run['wall']:.1f}",
            f"{text_mb * scale / run['wall']:.2f}",
            f"{run['cpu']:.1f}",
            f"{run['launcher']:,.0f}",
            "yes" if run["same"] else "no",
        ]
        for (scale, extension), run in runs.items()
    ]
    header = ["corpus", "format", "files MB", "wall s", "text MB/s", "CPU s", "peak RSS MiB"]
    print(markdown_table([*header, "same shards as txt"], rows, text_columns=2))
    if len(args.scales) > 1:
        first, last = args.scales[0], args.scales[-1]
        growth = [
            [
                extension,
                f"{runs[first, extension]['launcher']:,.0f}",
                f"{runs[last, extension]['launcher']:,.0f}",
                f"{runs[last, extension]['launcher'] / runs[first, extension]['launcher']:.2f}x",
            ]
            for extension in formats
        ]
        header = ["format", f"peak RSS MiB at {first}x", f"at {last}x", f"{last}x / {first}x"]
        print()
        print(markdown_table(header, growth))
    print(f"\nLoad average at the end: {load_average()}")


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "corpus_formats.py")
