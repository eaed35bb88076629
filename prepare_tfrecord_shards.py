#!/usr/bin/env python
"""Step 2 of 3: tokenize a text split, pack it into fixed-length sequences and write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`. The split is read in
blocks of --rows_per_block input rows (100,000 by default; blank rows count too), and each block is packed
on its own: its documents are concatenated in order and cut into `--max_length` sequences, so a sequence
may start or end in the middle of a document and the [SEP] marks where one document ends and the next
begins. Nothing is padded: only each block's final remainder, shorter than one sequence, is dropped. This
is the packing that RoBERTa calls FULL-SENTENCES; a split smaller than one block is one stream.

    # local files
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # WikiText-103 from the Hub, straight to a GCS bucket (as on a TPU VM)
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 128 --output_dir gs://my-bucket/wikitext-103

Output, for each split:
    <output_dir>/<split>/<split>-<block>-<shard>-<records>.tfrecord   e.g. train-00000-00000-10000.tfrecord:
                                  one tf.train.Example per sequence, feature "input_ids": int64 x max_length
    <output_dir>/<split>/manifest.json             written last: a split without it is unfinished
    <output_dir>/<split>/manifest-<i>-of-<N>.json  worker i's part, until --merge turns the parts into manifest.json

Once a split's manifest exists, the split is replaced only with --overwrite_output_dir. An unfinished split (the
run was killed, or failed) needs no flag: the same command, run again, writes it from the start, byte for byte
as an uninterrupted run would have.

The split flows through in batches, so memory stays flat however large the corpus: local files are read as
a stream, a Hub split is downloaded to the datasets cache and read from there. --num_proc threads tokenize
batches while the main thread packs the previous ones and writes them.

Several workers. Packed as one stream, every sequence of a split would depend on the token count of every
document before it, so no machine could write its share without tokenizing all that comes first. Packed
block by block, a block's sequences depend on that block's rows alone. So N processes or machines can share
a split: worker i writes blocks i, i+N, i+2N, ... and passes over the other rows without tokenizing them (a
text or streamed file is still read through, which costs little next to tokenizing; a downloaded Hub split
is indexed, so they are not even read). Then one --merge checks the parts and writes manifest.json. A
single run (--num_workers 1, the default) packs the same blocks, so the shards and manifest are byte for
byte the same whatever N:

    # on each of 4 machines, i = 0, 1, 2, 3: the same command and --output_dir, its own --worker_index
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 512 --output_dir gs://my-bucket/wikitext-103 --num_workers 4 --worker_index $i
    # then once, on any machine, when all 4 have finished
    python prepare_tfrecord_shards.py --merge --num_workers 4 --split train --output_dir gs://my-bucket/wikitext-103

Every worker must run the same command (the same input at the same path or Hub id, the same tokenizer and
flags) but for --worker_index (and --num_proc, which changes nothing in the output); parts written with
other settings are refused rather than mixed, and --overwrite_output_dir replaces them. A worker killed
midway is rerun with its own command and rewrites only its own blocks; a worker whose part is written does
nothing when run again.

The price of blocks: each drops up to max_length - 1 tokens and ends with a shard shorter than
--shard_size. At 100,000 rows a block, that is under 0.01% of the tokens at --max_length 512 for rows of a
few dozen tokens, as in WikiText-103 (1.8 M rows: 19 blocks, enough for a handful of workers); a large
corpus gives hundreds of blocks. Give a split with few blocks a smaller --rows_per_block, so that every
worker gets several, e.g. rows / (4 x workers).

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import argparse
import collections
import copy
import functools
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TF's start-up chatter out of the log

LOCAL_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
SPLITS = ("train", "validation", "test")
MANIFEST_NAME = "manifest.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
FEATURE_NAME = "input_ids"
PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; the lines of each block of rows_per_block input rows "
    "are concatenated in order and cut into max_length sequences; only each block's final remainder is dropped"
)
# Large enough that the tokens dropped at block ends do not matter (under max_length per 100,000 rows), small
# enough that a corpus of a few million rows already spreads over several workers.
DEFAULT_ROWS_PER_BLOCK = 100_000
PART_MANIFEST_PATTERN = "manifest-*-of-*.json"  # worker i of N: manifest-<i>-of-<N>.json, until --merge


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


@contextmanager
def tensorflow_startup_log_held_back():
    """Hold back the log TensorFlow's C++ libraries print while they load and find devices (oneDNN, CUDA).

    Those lines go straight to the process's stderr whatever TF_CPP_MIN_LOG_LEVEL says, and on a machine
    without a GPU they read like errors. They are kept in a temporary file and shown only if start-up fails
    for a reason other than the user's input; TF_CPP_MIN_LOG_LEVEL=0 shows them always.
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    sys.stderr.flush()
    stderr_copy = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except UsageError:
            raise
        except BaseException:
            sys.stderr.flush()
            held.seek(0)
            os.write(stderr_copy, held.read())
            raise
        finally:
            sys.stderr.flush()
            os.dup2(stderr_copy, 2)
            os.close(stderr_copy)


class OneLineErrorParser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def available_cores():
    """The cores this process may run on (its CPU affinity), which can be fewer than the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Tokenize a split and write it as TFRecord shards of packed sequences.")
    data = parser.add_argument_group("data (the Hub by default, or local files)")
    data.add_argument("--dataset_name", default="wikitext", help="Hub dataset id (default: wikitext).")
    data.add_argument("--dataset_config", default="wikitext-103-raw-v1", help="Hub dataset configuration.")
    data.add_argument("--train_file", help="Local train split: .txt, .json/.jsonl, .csv or .parquet.")
    data.add_argument("--validation_file", help="Local validation split, same formats.")
    data.add_argument("--test_file", help="Local test split, same formats.")
    data.add_argument("--split", default="train", help=f"Which split to write: one of {', '.join(SPLITS)}.")
    data.add_argument("--text_column", default="text", help="Column that holds the text (default: text).")
    data.add_argument("--limit", type=int, help="Use only the first LIMIT rows of the split.")
    data.add_argument(
        "--trust_remote_code", action="store_true", help="Allow code from Hub repositories (off by default)."
    )
    tokens = parser.add_argument_group("tokenization")
    tokens.add_argument("--tokenizer_name_or_path", help="Tokenizer folder or Hub id (required, except with --merge).")
    tokens.add_argument("--max_length", type=int, default=128, help="Tokens per sequence (default: 128).")
    tokens.add_argument(
        "--batch_size", type=int, default=1000, help="Non-blank lines tokenized per call (default: 1000)."
    )
    tokens.add_argument(
        "--num_proc",
        type=int,
        help="Tokenizer threads: this many batches are tokenized at once, one core each, while the main thread "
        f"packs and writes (default: the cores this process may use, {available_cores()} here). A tokenizer "
        "class that changes the text in Python before tokenizing runs in one thread, on the tokenizer's own "
        "thread pool.",
    )
    output = parser.add_argument_group("output")
    output.add_argument("--output_dir", required=True, help="Local folder or gs://bucket/prefix.")
    output.add_argument("--shard_size", type=int, default=10000, help="Sequences per shard (default: 10000).")
    output.add_argument(
        "--overwrite_output_dir", action="store_true", help="Replace a split already written in --output_dir."
    )
    workers = parser.add_argument_group(
        "blocks and workers: one split written by several processes or machines",
        "Run the same command once per worker, with --num_workers N --worker_index i for i = 0 .. N-1 (one "
        "machine or process each, in any order or at once), then once: prepare_tfrecord_shards.py --merge "
        "--num_workers N --split SPLIT --output_dir DIR. The result is byte for byte what one run writes.",
    )
    workers.add_argument(
        "--rows_per_block",
        type=int,
        default=DEFAULT_ROWS_PER_BLOCK,
        help="Input rows (blank ones included) packed together: each block drops its own last partial sequence, "
        f"and blocks are what workers share out (default: {DEFAULT_ROWS_PER_BLOCK}).",
    )
    workers.add_argument(
        "--num_workers", type=int, default=1, help="How many workers share the split (default: 1, this run alone)."
    )
    workers.add_argument(
        "--worker_index",
        type=int,
        help="This worker's number, 0 to N-1: it writes blocks i, i+N, i+2N, ... and its part, "
        "manifest-<i>-of-<N>.json.",
    )
    workers.add_argument(
        "--merge",
        action="store_true",
        help="Once every worker has written its part: check that all N parts are there and agree, write "
        "manifest.json and remove the parts. Needs only --num_workers, --split and --output_dir.",
    )
    args = parser.parse_args(argv)
    if args.tokenizer_name_or_path is None and not args.merge:  # --merge reads everything from the parts
        parser.error("the following arguments are required: --tokenizer_name_or_path")
    return args


def local_split_file(args):
    return {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}[args.split]


def check_worker_flags(args):
    workers = args.num_workers
    if workers < 1:
        raise UsageError(f"--num_workers {workers} must be 1 or more (1: this run writes the whole split).")
    if args.merge:
        if args.worker_index is not None:
            raise UsageError(
                f"--merge and --worker_index {args.worker_index} do not go together: run each worker with its "
                "--worker_index, then --merge once without one."
            )
        if workers == 1:
            raise UsageError(
                "--merge needs --num_workers N, the number of workers whose parts it merges "
                "(a run without --num_workers writes manifest.json itself)."
            )
        return
    if workers > 1 and args.worker_index is None:
        raise UsageError(
            f"--num_workers {workers} needs --worker_index: run the command once per worker with --worker_index 0 "
            f"to {workers - 1}, then once with --merge."
        )
    if args.worker_index is None:
        args.worker_index = 0  # a single run is worker 0 of 1: the same code writes the same blocks
    if not 0 <= args.worker_index < workers:
        raise UsageError(
            f"--worker_index {args.worker_index} is outside 0 to {workers - 1} for --num_workers {workers}; "
            "workers are numbered from 0, and each needs --num_workers, the number of workers."
        )


def check_args(args):
    if args.split not in SPLITS:
        raise UsageError(f"--split {args.split!r} is not a split this script knows; use one of {', '.join(SPLITS)}.")
    check_worker_flags(args)
    for flag in ("max_length", "batch_size", "num_proc", "shard_size", "rows_per_block"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise UsageError(f"--{flag} {getattr(args, flag)} must be a positive number.")
    if args.max_length < 2:
        raise UsageError(f"--max_length {args.max_length} is too short for a sequence; use 128 or 512.")
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be a positive number of rows; leave it out to use them all.")
    local_files = [args.train_file, args.validation_file, args.test_file]
    if any(local_files) and not args.merge:  # the merge reads no input: the machine it runs on may lack it
        path = local_split_file(args)
        if path is None:
            raise UsageError(
                f"--split {args.split} was asked for, but only other local splits were given; "
                f"pass --{args.split}_file."
            )
        if os.path.isdir(path):
            raise UsageError(f"--{args.split}_file {path} is a folder; pass a path to a text corpus file.")
        if not os.path.isfile(path):
            raise UsageError(f"--{args.split}_file {path} does not exist; pass a path to a text corpus file.")
        if os.path.getsize(path) == 0:
            raise UsageError(f"--{args.split}_file {path} is empty; pass a file with text in it.")
        extension = os.path.splitext(path)[1].lower()
        if extension not in LOCAL_FILE_BUILDERS:
            raise UsageError(
                f"--{args.split}_file {path} has extension {extension!r}; use one of {sorted(LOCAL_FILE_BUILDERS)}."
            )
    check_output_location(args.output_dir)


def check_output_location(output_dir):
    """A local --output_dir that cannot be created or written is refused before any work. A gs:// one must answer
    (check_gcs_paths); its permissions show only when written to, and main() reports a refused write then."""
    if "://" in output_dir:
        check_gcs_paths({"--output_dir": output_dir})
        return
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "is a file" if existing == os.path.abspath(output_dir) else f"lies under the file {existing}"
        raise UsageError(f"--output_dir {output_dir} {where}, not a folder; choose a folder path.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            f"--output_dir {output_dir} cannot be written: {existing} is read-only; choose another folder."
        )


GCS_PROBE_SECONDS = 60  # a bound on the whole probe: starting Python and TensorFlow, then a request per path
# Run by a child process: report the first gs:// path (argv) that TensorFlow cannot look up, or whose bucket
# does not exist (TensorFlow's makedirs() asks about a missing bucket again and again, without end). Reading
# a bucket's own metadata takes a right that reading and writing its objects does not: if that is refused,
# the bucket is taken to exist.
GCS_PROBE_CODE = """
import json, sys
import tensorflow as tf
def report(path, error, message):
    print(json.dumps({"path": path, "error": error, "message": message}))
    sys.exit()
for path in sys.argv[1:]:
    try:
        tf.io.gfile.exists(path)
    except tf.errors.OpError as error:
        report(path, type(error).__name__, str(error))
    bucket = "/".join(path.split("/")[:3])
    try:
        if not tf.io.gfile.exists(bucket):
            report(path, "NoSuchBucket", bucket)
    except tf.errors.OpError:
        pass
"""
GCS_PROBE_ENV = {
    # A few quick retries and short timeouts instead of TensorFlow's minutes of them, for the probe only.
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "500000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "2000000",
    "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": "10",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "10",
    "GCS_METADATA_REQUEST_TIMEOUT_SECS": "10",
    # The probe needs no accelerator: leave the TPU (which one process at a time may hold) and the GPUs alone.
    "TPU_LOAD_LIBRARY": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "TF_CPP_MIN_LOG_LEVEL": "3",
}


def check_gcs_paths(paths):
    """Refuse, in one line and within about a minute, a gs:// path that cannot be reached (no network, no access).

    TensorFlow retries a failed Cloud Storage request for over three minutes (GCS_RETRY_CONFIG_MAX_RETRIES: 10
    by default, backing off up to 32 s), then fails with a libcurl error code. That patience is what a long run
    needs to ride out a passing outage, so it stays; but TensorFlow reads those settings once per process,
    so they cannot be lowered for a first check alone. A short-lived child process with few retries and
    short timeouts therefore looks up every path once, before any work, and this process keeps the defaults.
    """
    import subprocess

    flags = {path: flag for flag, path in paths.items() if path and path.startswith("gs://")}
    if not flags:
        return
    first = next(iter(flags))
    command = [sys.executable, "-c", GCS_PROBE_CODE, *flags]
    advice = "check the network (and HTTPS_PROXY, if you use a proxy), or use a local path"
    try:
        probe = subprocess.run(
            command, env={**os.environ, **GCS_PROBE_ENV}, capture_output=True, text=True, timeout=GCS_PROBE_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise UsageError(
            f"{flags[first]} {first}: Cloud Storage did not answer within {GCS_PROBE_SECONDS} s; {advice}."
        ) from None
    try:
        failure = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 and probe.stdout else None
    except ValueError:
        failure = None
    if failure is None:
        return  # every path answered; or the probe itself broke, and then the run meets the same trouble itself
    where = f"{flags[failure['path']]} {failure['path']}"
    if failure["error"] == "NoSuchBucket":
        raise UsageError(f"{where}: the bucket {failure['message']} does not exist; check the name, or create it.")
    reason = gcs_failure_reason(failure["message"])
    if failure["error"] in ("PermissionDeniedError", "UnauthenticatedError") or re.search(r"code 40[13]\b", reason):
        raise UsageError(
            f"{where}: Cloud Storage refused access ({reason}); sign in with `gcloud auth application-default "
            "login` or set GOOGLE_APPLICATION_CREDENTIALS to the key of an account that may use the bucket."
        )
    raise UsageError(f"{where}: Cloud Storage cannot be reached ({reason}); {advice}.")


def gcs_failure_reason(message):
    """TensorFlow's error for a failed request, shortened to what went wrong (libcurl's words, not its code)."""
    text = message.strip().splitlines()[0] if message.strip() else "no details"
    text = re.sub(r"^All \d+ retry attempts failed\. The last failure: ", "", text)
    details = re.search(r"error details: (.+)", text)
    if details:
        return details.group(1).strip()
    text = re.sub(r"libcurl code \d+ meaning '([^']*)'", r"\1", text)
    text = re.sub(r" with body .*", "", text)  # an HTTP error's body is a page of JSON; its code says enough
    return re.sub(r"^Error executing an HTTP request: ", "", text).strip()[:200]


def describe_source(args):
    return local_split_file(args) or f"{args.dataset_name}/{args.dataset_config}"


# ---------------------------------------------------------------------------------------------------------
# Reading: the split's rows as a stream, in blocks


class SplitTally:
    """What reading the split finds out: how many rows it has (at most --limit), blank ones included. A
    downloaded split knows at once; a stream, once it has been read to its end."""

    def __init__(self):
        self.rows = 0


def worker_blocks(args, tally):
    """(block index, the block's rows) for each block of --rows_per_block rows that this worker packs, in order:
    blocks i, i+N, i+2N, ... for worker i of N. The rows of the other blocks are passed over, not tokenized."""
    path = local_split_file(args)
    if path is not None and LOCAL_FILE_BUILDERS[os.path.splitext(path)[1].lower()] == "text":
        return streamed_blocks(text_file_lines(path, args), args, tally)
    import datasets

    dataset = load_split(args)
    if isinstance(dataset, datasets.Dataset):  # downloaded, so indexed: other workers' rows are not even read
        return indexed_blocks(dataset, args, tally)
    return streamed_blocks(dataset_column(dataset, args), args, tally)


def streamed_blocks(rows, args, tally):
    """A stream of rows cut into blocks. Another worker's block is read to its end and dropped: for a text file
    that is the cost of reading lines, far below tokenizing them."""
    rows = reading_errors_as_usage_errors(rows, args)
    if args.limit is not None:
        rows = itertools.islice(rows, args.limit)
    rows = counted(rows, tally)
    end = object()  # a row can be None, so the end of the stream needs a marker of its own
    for block in itertools.count():
        block_rows = itertools.islice(rows, args.rows_per_block)
        first = next(block_rows, end)
        if first is end:
            return
        block_rows = itertools.chain([first], block_rows)
        if block % args.num_workers == args.worker_index:
            yield block, block_rows
        collections.deque(block_rows, maxlen=0)  # whatever is left of the block: the next one starts after it


def counted(rows, tally):
    """The rows, counted into `tally` as they go by: every worker reads them all, and the parts must agree."""
    for row in rows:
        tally.rows += 1
        yield row


def indexed_blocks(dataset, args, tally):
    """This worker's blocks of a downloaded split, each read as a range of row indices."""
    check_text_column(args, dataset.column_names)
    tally.rows = len(dataset) if args.limit is None else min(len(dataset), args.limit)
    rows_per_block = args.rows_per_block
    starts = range(args.worker_index * rows_per_block, tally.rows, args.num_workers * rows_per_block)
    for start in starts:
        block = dataset.select(range(start, min(start + rows_per_block, tally.rows)))  # a view: nothing is copied
        yield start // rows_per_block, reading_errors_as_usage_errors(dataset_column(block, args), args)


def block_count(rows, rows_per_block):
    return -(-rows // rows_per_block)


def text_file_lines(path, args):
    """The lines of a .txt file exactly as datasets' "text" builder splits them: universal newlines (\\r\\n and \\r
    read as \\n), split on \\n only, without the line break. Reading them here skips importing datasets."""
    check_text_column(args, ["text"])
    try:
        with open(path, encoding="utf-8") as file:
            for line in file:
                yield line.rstrip("\n")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"could not read {path}: it is not UTF-8 text (UnicodeDecodeError: {where_not_utf8(path, error)}); "
            "convert it to UTF-8 (e.g. iconv -f <its encoding> -t utf-8)."
        ) from None


def where_not_utf8(path, error):
    """Where `path` stops being UTF-8, as the user can find it: the line and its first bad byte. Text mode
    decodes ahead of the line it hands out, so the decoder's own position says little."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as line_error:
                return f"line {number} holds the byte {raw[line_error.start]:#04x}"
    return str(error)


def load_split(args):
    """The requested split as a datasets.Dataset: a local file as a stream, a Hub split from the local cache."""
    import datasets

    path = local_split_file(args)
    try:
        if path is not None:  # streamed: nothing is copied into the cache, and memory stays flat
            builder = LOCAL_FILE_BUILDERS[os.path.splitext(path)[1].lower()]
            dataset = datasets.load_dataset(builder, data_files={args.split: path}, split=args.split, streaming=True)
        else:  # only this split's files are fetched; an unknown split is named in the error
            extra = {"trust_remote_code": True} if args.trust_remote_code else {}
            dataset = datasets.load_dataset(args.dataset_name, args.dataset_config, split=args.split, **extra)
    except Exception as error:  # datasets raises many kinds; the user needs the source and the first reason
        raise UsageError(cannot_read(args, error)) from None
    return dataset


def dataset_column(dataset, args):
    """The --text_column of every row, read in Arrow batches; a streamed dataset knows its columns only then."""
    for table in dataset.with_format("arrow").iter(batch_size=args.batch_size):
        check_text_column(args, table.column_names)
        yield from table.column(args.text_column).to_pylist()


def check_text_column(args, columns):
    if args.text_column not in columns:
        raise UsageError(
            f"--text_column {args.text_column!r} is not in the data, whose columns are {columns}; "
            "pass the right --text_column."
        )


def reading_errors_as_usage_errors(rows, args):
    """The rows; a streamed source fails while it is read (bad encoding, malformed JSON), not when opened."""
    iterator = iter(rows)
    while True:
        try:
            row = next(iterator)
        except StopIteration:
            return
        except UsageError:
            raise
        except Exception as error:
            raise UsageError(cannot_read(args, error)) from None
        yield row


def cannot_read(args, error):
    return f"could not read {describe_source(args)}: {first_line(error)}; check the path or name."


def first_line(error):
    """A library error on one line: its own first line, and the root cause's when that differs."""

    def describe(exception):
        text = str(exception).strip()
        return f"{type(exception).__name__}: {text.splitlines()[0]}" if text else type(exception).__name__

    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    return describe(error) if root is error else f"{describe(error)} ({describe(root)})"


def batches_of(items, size):
    """Lists of `size` consecutive items (the last one shorter)."""
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def block_batches(blocks, batch_size):
    """(block, texts) for each batch of up to `batch_size` non-blank texts of a block, then (block, None) once the
    block's rows are all read. A batch never holds texts of two blocks: each block is packed on its own."""
    for block, rows in blocks:
        texts = (text for text in rows if text is not None and text.strip())
        for batch in batches_of(texts, batch_size):
            yield block, batch
        yield block, None


# ---------------------------------------------------------------------------------------------------------
# Tokenizing: batches in parallel threads, results in order


def load_tokenizer(name_or_path, trust_remote_code):
    if os.path.isdir(name_or_path):
        if not any(os.path.isfile(os.path.join(name_or_path, name)) for name in TOKENIZER_FILES):
            raise UsageError(
                f"--tokenizer_name_or_path {name_or_path} holds no {' or '.join(TOKENIZER_FILES)}, so it is not a "
                "tokenizer folder; pass the --output_dir of train_unigram.py or a Hub id."
            )
    elif os.path.exists(name_or_path) or name_or_path.startswith((".", "/")):
        raise UsageError(
            f"--tokenizer_name_or_path {name_or_path} is not a tokenizer folder; "
            "pass the --output_dir of train_unigram.py or a Hub id."
        )
    from transformers import AutoTokenizer  # only now: a wrong path is answered without loading it

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds for files it cannot make sense of
        raise UsageError(f"could not load the tokenizer {name_or_path!r}: {first_line(error)}") from None
    if not tokenizer.is_fast:
        raise UsageError(f"the tokenizer {name_or_path!r} is not a fast tokenizer; train one with train_unigram.py.")
    return tokenizer


def encodes_with_the_backend_as_is(tokenizer):
    """Whether `tokenizer(texts)` is PreTrainedTokenizerFast's own batch call, which hands the texts unchanged to
    the Rust backend. Some classes (CPM, for one) rewrite the text in Python first; those keep that call."""
    from transformers import PreTrainedTokenizerFast

    call_path = ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus")
    return all(getattr(type(tokenizer), name) is getattr(PreTrainedTokenizerFast, name) for name in call_path)


class BatchEncoder:
    """texts -> their token ids, each text's `[CLS] ... [SEP]` concatenated into one int64 array: the same ids as
    `tokenizer(texts)["input_ids"]`, without building its per-text lists of ids, types and attention masks."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.direct = encodes_with_the_backend_as_is(tokenizer)
        if self.direct:
            # A copy set up as transformers sets the backend for that call (no truncation, no padding), so the
            # threads share one object that nobody reconfigures while they use it.
            self.backend = copy.deepcopy(tokenizer.backend_tokenizer)
            self.backend.no_truncation()
            self.backend.no_padding()
            self.backend.encode_special_tokens = tokenizer.split_special_tokens

    def __call__(self, texts):
        import numpy as np

        if self.direct:
            per_text = [encoding.ids for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=True)]
        else:
            per_text = self.tokenizer(texts, add_special_tokens=True)["input_ids"]
        total = sum(map(len, per_text))
        return np.fromiter(itertools.chain.from_iterable(per_text), dtype=np.int64, count=total)


@contextmanager
def tokenizer_pool_off():
    """Turn off the Rust tokenizer's own thread pool (read at every call), so that each of our threads uses one
    core: --num_proc threads then use --num_proc cores, not --num_proc times all of them."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def in_order(function, batches, threads):
    """function(batch) for each batch, computed in `threads` threads and yielded in order. Only a few batches are
    read ahead, so memory does not grow with the corpus."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
    pending = collections.deque()
    try:
        for batch in batches:
            pending.append(pool.submit(function, batch))
            if len(pending) > 2 * threads:  # keeps every thread busy while the main thread catches up
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(cancel_futures=True)


def token_id_batches(batches, tokenizer, args):
    """(block, number of texts, their token ids as one int64 array) for each (block, texts) batch, in order; a
    block's end, (block, None), comes out as (block, None, None)."""
    encode = BatchEncoder(tokenizer)

    def encode_batch(batch):
        block, texts = batch
        return (block, None, None) if texts is None else (block, len(texts), encode(texts))

    if not encode.direct:  # transformers reconfigures the backend at every call, so calls must not overlap;
        yield from in_order(encode_batch, batches, threads=1)  # each one uses the tokenizer's own thread pool
        return
    with tokenizer_pool_off():
        yield from in_order(encode_batch, batches, threads=args.num_proc or available_cores())


# ---------------------------------------------------------------------------------------------------------
# Serializing: tf.train.Example bytes, built with numpy


def varint(value):
    """Protobuf's varint of a non-negative int: 7 bits a byte, low bits first, the top bit set on all but the last."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(field_number, length):
    """The tag and length that open a length-delimited protobuf field (wire type 2)."""
    return varint(field_number << 3 | 2) + varint(length)


@functools.lru_cache(maxsize=None)
def example_prefix(values_size):
    """The bytes of Example{features{feature{key: "input_ids", value: Feature{int64_list{value: [...]}}}}} that
    come before the packed values, for values taking `values_size` bytes; each level is a tag, the length of
    what follows and then its content, built here from the inside out. Few sizes occur, so they are cached."""
    name = FEATURE_NAME.encode()
    prefix = length_delimited(1, values_size)  # Int64List.value, packed
    prefix = length_delimited(3, len(prefix) + values_size) + prefix  # Feature.int64_list
    key = length_delimited(1, len(name)) + name  # the map entry's key comes before its value
    prefix = key + length_delimited(2, len(prefix) + values_size) + prefix  # the map entry's value
    prefix = length_delimited(1, len(prefix) + values_size) + prefix  # Features.feature, the map entry
    return length_delimited(1, len(prefix) + values_size) + prefix  # Example.features


def varints(values):
    """The varints of a 2-D uint64 array, all concatenated row by row, and the number of bytes of each row."""
    import numpy as np

    sizes = np.ones(values.shape, dtype=np.uint8)  # bytes per value
    largest = int(values.max()) if values.size else 0
    for bits in range(7, 64, 7):
        if largest < 1 << bits:
            break
        sizes += values >= 1 << bits
    width = int(sizes.max()) if values.size else 1
    # Byte k of every value (bits 7k..7k+6), and whether the value has a byte k. One pass per k: numpy is
    # slow when it broadcasts over a last axis this short.
    groups = np.empty(values.shape + (width,), dtype=np.uint8)
    present = np.empty(values.shape + (width,), dtype=bool)
    for k in range(width):
        groups[..., k] = (values >> 7 * k) & 0x7F
        present[..., k] = sizes > k
    groups[..., :-1] |= present[..., 1:].view(np.uint8) << 7  # the continuation bit: another byte follows
    return groups[present], sizes.sum(axis=1, dtype=np.int64)


def serialize(sequences):
    """tf.train.Example bytes for each row of a 2-D int64 array, identical to building the Example with
    tf.train.Int64List(value=row) and calling SerializeToString(), but without a Python object per token."""
    import numpy as np

    # Two's complement, as protobuf writes an int64: a negative value becomes a 10-byte varint.
    values = np.ascontiguousarray(sequences, dtype=np.int64).view(np.uint64)
    packed, sizes = varints(values)
    packed = packed.tobytes()
    ends = np.cumsum(sizes).tolist()
    return [example_prefix(end - start) + packed[start:end] for start, end in zip([0] + ends[:-1], ends)]


# ---------------------------------------------------------------------------------------------------------
# Writing: shards, manifests, clean-up


def shard_name(split, block, shard, records):
    """Names sort as the manifest lists the shards: by block, then by place in the block."""
    return f"{split}-{block:05d}-{shard:05d}-{records}.tfrecord"


def temporary_shard_name(split, block, shard):
    return f".{split}-{block:05d}-{shard:05d}.tfrecord.tmp"


def part_name(worker_index, num_workers):
    return f"manifest-{worker_index:05d}-of-{num_workers:05d}.json"


def own_manifest_name(args):
    """The file this run writes last: manifest.json for a single run, its part for a worker."""
    return MANIFEST_NAME if args.num_workers == 1 else part_name(args.worker_index, args.num_workers)


def worker_of(file_name, num_workers):
    """The worker a shard or temporary shard file belongs to: the one that packs its block. A name without a
    block, as an older version of this script wrote them, belongs to worker 0."""
    temporary = file_name.startswith(".")
    fields = file_name.lstrip(".").split(".")[0].split("-")  # split, block, shard, and records unless temporary
    if len(fields) == (3 if temporary else 4) and all(field.isdigit() for field in fields[1:]):
        return int(fields[1]) % num_workers
    return 0


class ShardWriter:
    """Writes each block's shards, `<split>-<block>-<shard>-<records>.tfrecord`; each appears under its final
    name only when complete.

    The split's folder is cleared of what this run replaces only when the first record comes (or when a worker
    whose blocks gave no record writes its part): until then a bad input leaves existing output untouched.
    Killed at any moment, it leaves either a finished split (a worker: a written part) or a folder without one,
    which the same command, run again, clears of this worker's files and writes afresh."""

    def __init__(self, split_dir, args, settings):
        self.split_dir, self.args, self.settings = split_dir, args, settings
        self.block = None
        self.block_shards = []  # the shards of the block being written
        self.writer = None
        self.records_in_shard = 0
        self.started = False
        self.created_folders = []  # deepest first; discard() removes them again

    def begin_block(self, block):
        self.block, self.block_shards = block, []

    def end_block(self):
        """Close the block's last shard; returns the block's shards."""
        self.finish_shard()
        return self.block_shards

    def _temporary_path(self):
        return f"{self.split_dir}/{temporary_shard_name(self.args.split, self.block, len(self.block_shards))}"

    def start(self):
        """Create the split's folder and clear it of what this run replaces (once)."""
        if not self.started:
            self.created_folders = missing_folders(self.split_dir)
            clear_split_dir(self.split_dir, self.args, self.settings)
            self.started = True

    def write(self, example_bytes):
        import tensorflow as tf

        if self.writer is None:
            self.start()
            self.writer = tf.io.TFRecordWriter(self._temporary_path())
        self.writer.write(example_bytes)
        self.records_in_shard += 1
        if self.records_in_shard == self.args.shard_size:
            self.finish_shard()

    def finish_shard(self):
        import tensorflow as tf

        if self.writer is None:
            return
        self.writer.close()
        name = shard_name(self.args.split, self.block, len(self.block_shards), self.records_in_shard)
        # The size lets training check every shard is whole with one stat() call: a truncated TFRecord file
        # reads as a shorter one without any error.
        size = tf.io.gfile.stat(self._temporary_path()).length
        tf.io.gfile.rename(self._temporary_path(), f"{self.split_dir}/{name}", overwrite=True)
        self.block_shards.append({"file": name, "records": self.records_in_shard, "bytes": size})
        self.writer, self.records_in_shard = None, 0

    def discard(self):
        """Remove whatever this writer wrote: a later step must never pick up a half-written split or part."""
        import tensorflow as tf

        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.started:
            remove_own_files(self.split_dir, self.args)
            if self.args.num_workers > 1:  # other workers may be writing into the folder at this very moment
                return
            for folder in dict.fromkeys([self.split_dir, *self.created_folders]):
                if tf.io.gfile.exists(folder) and not tf.io.gfile.listdir(folder):
                    tf.io.gfile.rmtree(folder)


def missing_folders(folder):
    """`folder` and those of its parents that do not exist yet, deepest first."""
    import tensorflow as tf

    missing = []
    while folder and not tf.io.gfile.exists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def read_parts(split_dir):
    """The parts in the split's folder: {file name: its content, or None when it is not a part this script
    wrote}."""
    import tensorflow as tf

    parts = {}
    for path in sorted(tf.io.gfile.glob(f"{split_dir}/{PART_MANIFEST_PATTERN}")):
        name = path.rsplit("/", 1)[-1]
        try:
            with tf.io.gfile.GFile(path) as file:
                part = json.load(file)
        except tf.errors.NotFoundError:  # just removed by a worker that replaces the parts of another run
            continue
        except ValueError:
            part = None
        is_part = isinstance(part, dict) and {"settings", "rows", "blocks"} <= part.keys()
        parts[name] = part if is_part and isinstance(part["settings"], dict) else None
    return parts


def first_difference(theirs, ours):
    """The first setting on which two runs differ, as (name, their value, our value), each value as JSON."""
    for key in [*ours, *(key for key in theirs if key not in ours)]:
        if theirs.get(key) != ours.get(key):
            return key, json.dumps(theirs.get(key)), json.dumps(ours.get(key))
    return None


def refusal_to_mix(split_dir, name, part, settings):
    """Why the part `name`, found in the split's folder, cannot sit beside this run's output, and what to do."""
    replace = "or pass --overwrite_output_dir to replace it"
    if part is None:
        return f"{split_dir}/{name} is not a part this script can read; remove it, {replace}."
    their_workers = part["settings"].get("num_workers")
    if their_workers != settings["num_workers"]:
        ours = "not a single run" if settings["num_workers"] == 1 else f"not {settings['num_workers']}"
        return (
            f"{split_dir} holds {name}, a part of a run with --num_workers {their_workers}, {ours}; finish that run "
            f"(its workers, then --merge --num_workers {their_workers}), {replace}."
        )
    key, theirs, ours = first_difference(part["settings"], settings)
    return (
        f"{split_dir} holds {name}, written with {key} {theirs} where this run has {ours}; give every worker the "
        f"same flags but --worker_index, {replace}."
    )


def check_split_dir(args, settings):
    """The split's folder, checked before any work. A finished split is replaced, and parts written with other
    settings are removed rather than mixed with this run's output, only with --overwrite_output_dir. Returns the
    folder and, for a worker whose part is already written with these settings, that part."""
    import tensorflow as tf

    split_dir = f"{args.output_dir.rstrip('/')}/{args.split}"
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not args.overwrite_output_dir:
        raise UsageError(
            f"{split_dir} already holds a finished {args.split} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )
    if args.overwrite_output_dir:
        return split_dir, None
    parts = read_parts(split_dir)
    for name, part in parts.items():
        if part is None or part["settings"] != settings:
            raise UsageError(refusal_to_mix(split_dir, name, part, settings))
    return split_dir, parts.get(own_manifest_name(args))


def clear_split_dir(split_dir, args, settings):
    """Create the split's folder and delete what this run replaces, and nothing else."""
    import tensorflow as tf

    tf.io.gfile.makedirs(split_dir)
    # The finished manifest first (there only with --overwrite_output_dir), so that a folder interrupted
    # halfway through this no longer claims to hold a finished split.
    remove_if_present(f"{split_dir}/{MANIFEST_NAME}")
    for name, part in read_parts(split_dir).items():
        if part is None or part["settings"] != settings:  # another run's: refused without --overwrite_output_dir
            remove_if_present(f"{split_dir}/{name}")
    remove_own_files(split_dir, args)


def remove_own_files(split_dir, args):
    """Delete this run's manifest (a worker's: its part) first, then the shards and temporary files of this
    worker's blocks. Other workers' files stay: they may be writing them at this very moment."""
    import tensorflow as tf

    own_manifest = own_manifest_name(args)
    for name in (own_manifest, f".{own_manifest}.tmp"):
        remove_if_present(f"{split_dir}/{name}")
    for pattern in ("*.tfrecord", ".*.tfrecord.tmp"):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            if worker_of(path.rsplit("/", 1)[-1], args.num_workers) == args.worker_index:
                tf.io.gfile.remove(path)


def remove_if_present(path):
    """Remove a file that may be gone already: two workers may remove the same stale file at once."""
    import tensorflow as tf

    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


def write_manifest(split_dir, name, manifest):
    """Write the manifest (or part) `name` under a temporary name first, so that it appears whole or not at all."""
    import tensorflow as tf

    temporary = f"{split_dir}/.{name}.tmp"
    with tf.io.gfile.GFile(temporary, "w") as file:
        file.write(json.dumps(manifest, indent=2) + "\n")
    tf.io.gfile.rename(temporary, f"{split_dir}/{name}", overwrite=True)


def special_token_ids(tokenizer):
    names = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")
    return {name: getattr(tokenizer, f"{name}_token_id") for name in names}


def run_settings(args, tokenizer):
    """Everything that decides the bytes of the shards, which the workers of one split must agree on. The
    tokenizer's fingerprint catches a different tokenizer under the same path or Hub id on another machine.
    (--num_proc and --batch_size change nothing in the output, so each machine may choose its own.)"""
    fingerprint = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16]
    return {
        "split": args.split,
        "source": describe_source(args),
        "text_column": args.text_column,
        "limit": args.limit,
        "tokenizer": args.tokenizer_name_or_path,
        "tokenizer_fingerprint": fingerprint,
        "vocab_size": len(tokenizer),
        "special_token_ids": special_token_ids(tokenizer),
        "max_length": args.max_length,
        "rows_per_block": args.rows_per_block,
        "shard_size": args.shard_size,
        "num_workers": args.num_workers,
    }


def write_blocks(args, batches, writer):
    """Pack each block on its own and write its shards; returns, for each block in order, what it gave."""
    import numpy as np
    from tqdm.auto import tqdm

    progress = None  # shown from the first sequence on: input refused before then gets its error line alone
    blocks = []
    no_tokens = np.zeros((0,), dtype=np.int64)
    carry, documents = no_tokens, 0  # carry: the block's tokens waiting for its next batch to fill a sequence
    with closing(batches):  # stops the threads if writing fails
        try:
            for block, texts_in_batch, ids in batches:
                if block != writer.block:
                    writer.begin_block(block)
                if texts_in_batch is None:  # the block is all read: its remainder, shorter than a sequence, goes
                    shards = writer.end_block()
                    blocks.append(
                        {"block": block, "documents": documents, "dropped_tokens": len(carry), "shards": shards}
                    )
                    carry, documents = no_tokens, 0
                    continue
                documents += texts_in_batch
                stream = np.concatenate([carry, ids])
                full = len(stream) // args.max_length * args.max_length
                carry = stream[full:]
                sequences = stream[:full].reshape(-1, args.max_length)
                if progress is None and len(sequences):
                    progress = tqdm(desc=f"Writing {args.split} shards", unit=" sequences")
                for example_bytes in serialize(sequences):
                    writer.write(example_bytes)
                if progress is not None:
                    progress.update(len(sequences))
        finally:
            if progress is not None:
                progress.close()  # ends the bar's line, so that an error found midway starts a line of its own
    return blocks


def part_manifest(args, settings, rows, blocks):
    """A worker's part: its settings, the split's row count as it read it, and what each of its blocks gave."""
    return {"worker_index": args.worker_index, "settings": settings, "rows": rows, "blocks": blocks}


def split_manifest(parts):
    """The split's manifest from the parts of all its workers (a single run has one): the blocks in order, and the
    shards of each in order, so it comes out the same however many workers wrote them."""
    settings = parts[0]["settings"]
    blocks = sorted((block for part in parts for block in part["blocks"]), key=lambda block: block["block"])
    shards = [shard for block in blocks for shard in block["shards"]]
    documents = sum(block["documents"] for block in blocks)
    dropped_tokens = sum(block["dropped_tokens"] for block in blocks)
    records = sum(shard["records"] for shard in shards)
    check_enough_text(settings, documents, records, dropped_tokens, len(blocks))
    max_length = settings["max_length"]
    return {
        "split": settings["split"],
        "max_length": max_length,
        "records": records,
        "tokens": records * max_length,
        "dropped_tokens": dropped_tokens,
        "documents": documents,
        "rows": parts[0]["rows"],
        "rows_per_block": settings["rows_per_block"],
        "blocks": len(blocks),
        "packing": PACKING,
        "vocab_size": settings["vocab_size"],
        "special_token_ids": settings["special_token_ids"],
        "tokenizer": settings["tokenizer"],
        "source": settings["source"],
        "features": {FEATURE_NAME: {"dtype": "int64", "shape": [max_length]}},
        "shards": shards,
    }


def check_enough_text(settings, documents, records, dropped_tokens, blocks):
    split, source, max_length = settings["split"], settings["source"], settings["max_length"]
    if documents == 0:
        raise UsageError(f"the {split} split ({source}) has no non-blank text; check the input and --text_column.")
    if records == 0 and blocks == 1:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, fewer than one sequence of --max_length "
            f"{max_length}; use more text or a smaller --max_length."
        )
    if records == 0:
        raise UsageError(
            f"the {split} split ({source}) has {dropped_tokens} tokens, but none of its {blocks} blocks of "
            f"--rows_per_block {settings['rows_per_block']} rows fills one sequence of --max_length {max_length}; "
            "use a larger --rows_per_block, more text or a smaller --max_length."
        )


def is_write_error(error):
    """Whether `error` is the file system refusing a write: permissions, a full disk, a file in the way."""
    import tensorflow as tf

    return isinstance(error, (OSError, tf.errors.OpError))


# ---------------------------------------------------------------------------------------------------------
# Merging the parts of several workers


def merge_parts(args):
    """--merge: check that the N parts are all there and agree, write manifest.json from them, then remove them."""
    import tensorflow as tf

    split_dir = f"{args.output_dir.rstrip('/')}/{args.split}"
    names = [part_name(index, args.num_workers) for index in range(args.num_workers)]
    found = read_parts(split_dir)
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not args.overwrite_output_dir:
        return finish_earlier_merge(args, split_dir, found)
    check_all_parts_present(args, split_dir, names, found)
    parts = [found[name] for name in names]
    check_parts_agree(split_dir, parts)
    manifest = split_manifest(parts)
    check_shard_files(split_dir, parts, manifest)
    write_manifest(split_dir, MANIFEST_NAME, manifest)
    for name in names:  # the manifest now says the split is finished: the parts have served
        remove_if_present(f"{split_dir}/{name}")
    print(
        f"Merged {args.num_workers} parts into {split_dir}/{MANIFEST_NAME}: {manifest['records']} sequences of "
        f"{manifest['max_length']} tokens in {len(manifest['shards'])} shards from {manifest['blocks']} blocks"
    )
    return manifest


def finish_earlier_merge(args, split_dir, found):
    """The split is merged already. Parts still beside its manifest (a merge killed while removing them) are
    removed when every shard they list is in the manifest; anything else is refused."""
    import tensorflow as tf

    if not found:
        raise UsageError(
            f"{split_dir} already holds a finished {args.split} split and no parts: there is nothing to merge "
            "(to write it again, run the workers with --overwrite_output_dir, then --merge)."
        )
    with tf.io.gfile.GFile(f"{split_dir}/{MANIFEST_NAME}") as file:
        listed = {shard["file"] for shard in json.load(file)["shards"]}
    for name, part in found.items():
        if part is None or not {shard["file"] for block in part["blocks"] for shard in block["shards"]} <= listed:
            raise UsageError(
                f"{split_dir} holds a finished {args.split} split and {name}, which is no part of it; remove "
                f"{name}, or pass --overwrite_output_dir to merge the parts into a new {MANIFEST_NAME}."
            )
    for name in found:
        remove_if_present(f"{split_dir}/{name}")
    print(f"{split_dir} was merged already; removed the {len(found)} parts left beside its {MANIFEST_NAME}")


def describe_workers(indices):
    """[1] -> "worker 1"; [1, 3, 5] -> "workers 1, 3 and 5"."""
    if len(indices) == 1:
        return f"worker {indices[0]}"
    return f"workers {', '.join(map(str, indices[:-1]))} and {indices[-1]}"


def check_all_parts_present(args, split_dir, names, found):
    workers = args.num_workers
    missing = [index for index, name in enumerate(names) if name not in found]
    others = [name for name in found if name not in names]
    if others and len(missing) == workers:
        their_workers = int(others[0].split("-of-")[1].split(".")[0])
        raise UsageError(
            f"{split_dir} holds no part of a run with --num_workers {workers}, but {others[0]}, a part of a run "
            f"with --num_workers {their_workers}; pass --num_workers {their_workers}."
        )
    if len(missing) == workers:
        raise UsageError(
            f"{split_dir} holds no parts to merge (no {names[0]} to {names[-1]}); run the {workers} workers first, "
            f"each with --num_workers {workers} and its --worker_index, 0 to {workers - 1}, then --merge again."
        )
    if missing:
        raise UsageError(
            f"{split_dir} lacks the part of {describe_workers(missing)} of {workers} ({names[missing[0]]} not "
            f"found); run the workers' command with --worker_index {' and '.join(map(str, missing))}, then --merge "
            "again."
        )
    if others:
        raise UsageError(
            f"{split_dir} holds {others[0]}, a part of another run, beside the {workers} parts to merge; remove it, "
            "or rerun the workers with --overwrite_output_dir."
        )


def check_parts_agree(split_dir, parts):
    """The parts come from one command run by every worker: same settings, the same split read, and each
    holding exactly the blocks its worker packs."""
    workers = len(parts)
    for index, part in enumerate(parts):
        if part is None:
            raise UsageError(
                f"{split_dir}/{part_name(index, workers)} is not a part this script can read; rerun worker {index} "
                "with --overwrite_output_dir, then --merge again."
            )
    first = parts[0]
    rerun = "with the same flags as the others and --overwrite_output_dir, then --merge again"
    for index, part in enumerate(parts[1:], start=1):
        if part["settings"] != first["settings"]:
            key, theirs, ours = first_difference(part["settings"], first["settings"])
            raise UsageError(
                f"the parts in {split_dir} disagree: worker {index} wrote with {key} {theirs}, worker 0 with {ours}; "
                f"rerun worker {index} {rerun}."
            )
        if part["rows"] != first["rows"]:
            raise UsageError(
                f"the parts in {split_dir} disagree: worker {index} read {part['rows']} rows of "
                f"{first['settings']['source']}, worker 0 read {first['rows']}, but all must read the same input; "
                f"rerun worker {index} {rerun}."
            )
    total_blocks = block_count(first["rows"], first["settings"]["rows_per_block"])
    for index, part in enumerate(parts):
        if [block["block"] for block in part["blocks"]] != list(range(index, total_blocks, workers)):
            raise UsageError(
                f"{split_dir}/{part_name(index, workers)} does not hold the blocks of worker {index} of {workers}; "
                f"rerun worker {index} with --overwrite_output_dir, then --merge again."
            )


def check_shard_files(split_dir, parts, manifest):
    """Every shard a part lists is there, and no other: the folder then holds exactly what a single run writes.
    (Their sizes are checked by run_mlm.py before training, one stat() each; here one listing does.)"""
    import tensorflow as tf

    present = {path.rsplit("/", 1)[-1] for path in tf.io.gfile.glob(f"{split_dir}/*.tfrecord")}
    for index, part in enumerate(parts):
        for shard in (shard for block in part["blocks"] for shard in block["shards"]):
            if shard["file"] not in present:
                raise UsageError(
                    f"{split_dir}/{shard['file']}, listed in the part of worker {index}, is missing; rerun worker "
                    f"{index} with --overwrite_output_dir, then --merge again."
                )
    unlisted = sorted(present - {shard["file"] for shard in manifest["shards"]})
    if unlisted:
        owner = worker_of(unlisted[0], len(parts))
        raise UsageError(
            f"{split_dir} holds {unlisted[0]}{f' and {len(unlisted) - 1} more' if len(unlisted) > 1 else ''}, "
            f"which no part lists; rerun worker {owner} with --overwrite_output_dir (it clears its blocks' old "
            "files), then --merge again."
        )


# ---------------------------------------------------------------------------------------------------------
# The run


def report_split(manifest, split_dir):
    at_block_ends = f" at the ends of {manifest['blocks']} blocks" if manifest["blocks"] > 1 else ""
    print(
        f"Wrote {manifest['records']} sequences of {manifest['max_length']} tokens ({manifest['tokens']} tokens, "
        f"{manifest['dropped_tokens']} dropped{at_block_ends}) in {len(manifest['shards'])} shards to {split_dir}"
    )


def report_part(args, part, split_dir):
    workers, index = args.num_workers, args.worker_index
    total_blocks = block_count(part["rows"], args.rows_per_block)
    shards = [shard for block in part["blocks"] for shard in block["shards"]]
    records = sum(shard["records"] for shard in shards)
    print(
        f"Wrote the part of worker {index} of {workers} to {split_dir}: {records} sequences of {args.max_length} "
        f"tokens in {len(shards)} shards, from {len(part['blocks'])} of the split's {total_blocks} blocks"
    )
    if not part["blocks"]:
        print(
            f"Worker {index} got no block: {part['rows']} rows make {total_blocks} blocks of --rows_per_block "
            f"{args.rows_per_block}; a smaller --rows_per_block spreads a split over more workers."
        )
    print(
        f"Once all {workers} workers are done: python prepare_tfrecord_shards.py --merge --num_workers {workers} "
        f"--split {args.split} --output_dir {args.output_dir}"
    )


def main(args):
    check_args(args)
    if args.merge:
        with tensorflow_startup_log_held_back():
            import tensorflow  # noqa: F401  (loaded here so that its start-up log can be held back)
        return merge_parts(args)
    # The tokenizer first: a wrong path is reported in a second rather than after TensorFlow has loaded.
    tokenizer = load_tokenizer(args.tokenizer_name_or_path, args.trust_remote_code)
    with tensorflow_startup_log_held_back():
        import tensorflow  # noqa: F401  (loaded here so that its start-up log can be held back)
    settings = run_settings(args, tokenizer)
    split_dir, written_part = check_split_dir(args, settings)  # before tokenizing: refusing after minutes of work
    if written_part is not None:  # a worker run again, by hand or by a scheduler's retry
        print(
            f"{split_dir}/{own_manifest_name(args)} is written already, with these settings: nothing to do "
            "(--overwrite_output_dir writes it again)"
        )
        return written_part
    tally = SplitTally()
    batches = token_id_batches(block_batches(worker_blocks(args, tally), args.batch_size), tokenizer, args)
    writer = ShardWriter(split_dir, args, settings)
    try:
        blocks = write_blocks(args, batches, writer)
        part = part_manifest(args, settings, tally.rows, blocks)  # the row count is known once all is read
        # A single run's manifest is the merge of its one part; it is checked before the folder is cleared.
        result = split_manifest([part]) if args.num_workers == 1 else part
        writer.start()  # a worker whose blocks gave no sequence still replaces its older output with its part
        write_manifest(split_dir, own_manifest_name(args), result)
    except BaseException as error:
        writer.discard()
        if is_write_error(error):
            raise UsageError(
                f"could not write the {args.split} split to {split_dir}: {first_line(error)}; "
                "check that --output_dir is writable and has room."
            ) from None
        raise
    if args.num_workers == 1:
        report_split(result, split_dir)
    else:
        report_part(args, result, split_dir)
    return result


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"prepare_tfrecord_shards.py: error: {error}")
