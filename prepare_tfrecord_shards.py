#!/usr/bin/env python
"""Step 2 of 3: tokenize a text split, pack it into fixed-length sequences and write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`; the documents of the
whole split are concatenated in order and cut into `--max_length` sequences, so a sequence may start or end
in the middle of a document and the [SEP] marks where one document ends and the next begins. Nothing is
padded: only the split's final remainder, shorter than one sequence, is dropped. This is the packing that
RoBERTa calls FULL-SENTENCES.

    # local files
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # WikiText-103 from the Hub, straight to a GCS bucket (as on a TPU VM)
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 128 --output_dir gs://my-bucket/wikitext-103

Output, for each split:
    <output_dir>/<split>/<split>-00000-<records>.tfrecord   one tf.train.Example per sequence,
                                                            feature "input_ids": int64 x max_length
    <output_dir>/<split>/manifest.json                      written last: a split without it is unfinished

Once a split's manifest exists, the split is replaced only with --overwrite_output_dir. An unfinished split (the
run was killed, or failed) needs no flag: the same command, run again, writes it from the start, byte for byte
as an uninterrupted run would have.

The split flows through in batches, so memory stays flat however large the corpus: local files are read as
a stream, a Hub split is downloaded to the datasets cache and read from there. --num_proc threads tokenize
batches while the main thread packs the previous ones and writes them.

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import argparse
import collections
import copy
import functools
import itertools
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TF's start-up chatter out of the log

LOCAL_FILE_BUILDERS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
SPLITS = ("train", "validation", "test")
MANIFEST_NAME = "manifest.json"
TEMPORARY_MANIFEST_NAME = f".{MANIFEST_NAME}.tmp"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
FEATURE_NAME = "input_ids"
PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; lines are concatenated in order and cut into "
    "max_length sequences; only the final remainder is dropped"
)


class UsageError(Exception):
    """A mistake in the user's input: reported as one line, without a traceback."""


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
    tokens.add_argument("--tokenizer_name_or_path", required=True, help="Tokenizer folder or Hub id.")
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
    return parser.parse_args(argv)


def local_split_file(args):
    return {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}[args.split]


def check_args(args):
    if args.split not in SPLITS:
        raise UsageError(f"--split {args.split!r} is not a split this script knows; use one of {', '.join(SPLITS)}.")
    for flag in ("max_length", "batch_size", "num_proc", "shard_size"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            raise UsageError(f"--{flag} {getattr(args, flag)} must be a positive number.")
    if args.max_length < 2:
        raise UsageError(f"--max_length {args.max_length} is too short for a sequence; use 128 or 512.")
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be a positive number of rows; leave it out to use them all.")
    local_files = [args.train_file, args.validation_file, args.test_file]
    if any(local_files):
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
# Reading: the split's texts as a stream


def split_texts(args):
    """The split's non-blank texts, in order, as a stream: the first --limit rows, blank ones skipped."""
    path = local_split_file(args)
    if path is not None and LOCAL_FILE_BUILDERS[os.path.splitext(path)[1].lower()] == "text":
        rows = text_file_lines(path, args)
    else:
        rows = dataset_column(load_split(args), args)
    rows = reading_errors_as_usage_errors(rows, args)
    if args.limit is not None:
        rows = itertools.islice(rows, args.limit)
    return (text for text in rows if text is not None and text.strip())


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


def token_id_batches(texts, tokenizer, args):
    """(number of texts, their token ids as one int64 array) for each batch of --batch_size texts, in order."""
    encode = BatchEncoder(tokenizer)

    def encode_batch(batch):
        return len(batch), encode(batch)

    batches = batches_of(texts, args.batch_size)
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
# Writing: shards, manifest, clean-up


class ShardWriter:
    """Writes `<split>-<index>-<records>.tfrecord` files; each appears under its final name only when complete.

    The split's folder is emptied of an earlier split only when the first record comes: until then a bad input
    leaves existing output untouched. Killed at any moment, it leaves either a finished split or a folder
    without a manifest, which the same command, run again, empties and writes afresh."""

    def __init__(self, split_dir, split, shard_size):
        self.split_dir, self.split, self.shard_size = split_dir, split, shard_size
        self.shards = []
        self.writer = None
        self.records_in_shard = 0
        self.started = False
        self.created_folders = []  # deepest first; discard() removes them again

    def _temporary_path(self):
        return f"{self.split_dir}/.{self.split}-{len(self.shards):05d}.tfrecord.tmp"

    def write(self, example_bytes):
        import tensorflow as tf

        if self.writer is None:
            if not self.started:
                self.created_folders = missing_folders(self.split_dir)
                clear_split_dir(self.split_dir)
                self.started = True
            self.writer = tf.io.TFRecordWriter(self._temporary_path())
        self.writer.write(example_bytes)
        self.records_in_shard += 1
        if self.records_in_shard == self.shard_size:
            self.finish_shard()

    def finish_shard(self):
        import tensorflow as tf

        if self.writer is None:
            return
        self.writer.close()
        name = f"{self.split}-{len(self.shards):05d}-{self.records_in_shard}.tfrecord"
        # The size lets training check every shard is whole with one stat() call: a truncated TFRecord file
        # reads as a shorter one without any error.
        size = tf.io.gfile.stat(self._temporary_path()).length
        tf.io.gfile.rename(self._temporary_path(), f"{self.split_dir}/{name}", overwrite=True)
        self.shards.append({"file": name, "records": self.records_in_shard, "bytes": size})
        self.writer, self.records_in_shard = None, 0

    def discard(self):
        """Remove whatever this writer wrote: a later step must never pick up a half-written split."""
        import tensorflow as tf

        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.started:
            remove_outputs(self.split_dir)
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


def check_split_dir(args):
    """The split's folder; refuses to replace a finished split unless --overwrite_output_dir."""
    import tensorflow as tf

    split_dir = f"{args.output_dir.rstrip('/')}/{args.split}"
    if tf.io.gfile.exists(f"{split_dir}/{MANIFEST_NAME}") and not args.overwrite_output_dir:
        raise UsageError(
            f"{split_dir} already holds a finished {args.split} split; "
            "pass --overwrite_output_dir to replace it, or choose another --output_dir."
        )
    return split_dir


def clear_split_dir(split_dir):
    """Create the split's folder, emptied of any earlier or unfinished output of this script."""
    import tensorflow as tf

    tf.io.gfile.makedirs(split_dir)
    remove_outputs(split_dir)


def remove_outputs(split_dir):
    """Delete the manifest, shards and temporary files this script writes, and nothing else. The manifest goes
    first, so that a folder interrupted halfway through this no longer claims to hold a finished split."""
    import tensorflow as tf

    for pattern in (MANIFEST_NAME, TEMPORARY_MANIFEST_NAME, "*.tfrecord", ".*.tfrecord.tmp"):
        for path in tf.io.gfile.glob(f"{split_dir}/{pattern}"):
            tf.io.gfile.remove(path)


def write_manifest(split_dir, manifest):
    import tensorflow as tf

    temporary = f"{split_dir}/{TEMPORARY_MANIFEST_NAME}"
    with tf.io.gfile.GFile(temporary, "w") as file:
        file.write(json.dumps(manifest, indent=2) + "\n")
    tf.io.gfile.rename(temporary, f"{split_dir}/{MANIFEST_NAME}", overwrite=True)


def special_token_ids(tokenizer):
    names = ("cls", "sep", "pad", "unk", "mask", "bos", "eos")
    return {name: getattr(tokenizer, f"{name}_token_id") for name in names}


def write_shards(args, tokenizer, texts, writer):
    """Tokenize, pack and write the split; returns its manifest."""
    import numpy as np
    from tqdm.auto import tqdm

    progress = None  # shown from the first sequence on: input refused before then gets its error line alone
    documents = 0
    carry = np.zeros((0,), dtype=np.int64)  # tokens waiting for the next batch to fill a sequence
    with closing(token_id_batches(texts, tokenizer, args)) as batches:  # stops the threads if writing fails
        try:
            for texts_in_batch, ids in batches:
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
    writer.finish_shard()
    if documents == 0:
        raise UsageError(
            f"the {args.split} split ({describe_source(args)}) has no non-blank text; "
            "check the input and --text_column."
        )
    dropped_tokens = len(carry)
    records = sum(shard["records"] for shard in writer.shards)
    if records == 0:
        raise UsageError(
            f"the {args.split} split ({describe_source(args)}) has {dropped_tokens} tokens, fewer than one "
            f"sequence of --max_length {args.max_length}; use more text or a smaller --max_length."
        )
    return {
        "split": args.split,
        "max_length": args.max_length,
        "records": records,
        "tokens": records * args.max_length,
        "dropped_tokens": int(dropped_tokens),
        "documents": documents,
        "packing": PACKING,
        "vocab_size": len(tokenizer),
        "special_token_ids": special_token_ids(tokenizer),
        "tokenizer": args.tokenizer_name_or_path,
        "source": describe_source(args),
        "features": {FEATURE_NAME: {"dtype": "int64", "shape": [args.max_length]}},
        "shards": writer.shards,
    }


def is_write_error(error):
    """Whether `error` is the file system refusing a write: permissions, a full disk, a file in the way."""
    import tensorflow as tf

    return isinstance(error, (OSError, tf.errors.OpError))


def main(args):
    check_args(args)
    # The tokenizer first: a wrong path is reported in a second rather than after TensorFlow has loaded.
    tokenizer = load_tokenizer(args.tokenizer_name_or_path, args.trust_remote_code)
    split_dir = check_split_dir(args)  # before tokenizing: refusing after minutes of work helps nobody
    texts = split_texts(args)
    writer = ShardWriter(split_dir, args.split, args.shard_size)
    try:
        manifest = write_shards(args, tokenizer, texts, writer)
        write_manifest(split_dir, manifest)
    except BaseException as error:
        writer.discard()
        if is_write_error(error):
            raise UsageError(
                f"could not write the {args.split} split to {split_dir}: {first_line(error)}; "
                "check that --output_dir is writable and has room."
            ) from None
        raise
    print(
        f"Wrote {manifest['records']} sequences of {args.max_length} tokens ({manifest['tokens']} tokens, "
        f"{manifest['dropped_tokens']} dropped) in {len(manifest['shards'])} shards to {split_dir}"
    )
    return manifest


if __name__ == "__main__":
    arguments = parse_args()
    try:
        main(arguments)
    except UsageError as error:
        sys.exit(f"prepare_tfrecord_shards.py: error: {error}")
