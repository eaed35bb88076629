#!/usr/bin/env python
"""Step 2 of 3: tokenize a text split, pack it into fixed-length sequences and write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`. The split is read in
blocks of --rows_per_block input rows (blank ones count too), and each block is packed on its own: its
documents are concatenated in order and cut into --max_length sequences, so a sequence may start or end in
the middle of a document, and the [SEP] marks where one ends and the next begins. Nothing is padded: only
each block's final remainder, shorter than one sequence, is dropped (RoBERTa's FULL-SENTENCES packing).

    # local files
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # WikiText-103 from the Hub, straight to a GCS bucket (as on a TPU VM)
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 128 --output_dir gs://my-bucket/wikitext-103

    # one split on 4 machines: the same command on each, i = 0, 1, 2, 3; then one merge, on any of them
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --max_length 512 --output_dir gs://my-bucket/wikitext-103 --num_workers 4 --worker_index $i
    python prepare_tfrecord_shards.py --merge --num_workers 4 --split train --output_dir gs://my-bucket/wikitext-103

Output: <output_dir>/<split>/<split>-<block>-<shard>-<records>.tfrecord (one tf.train.Example per sequence,
"input_ids": int64 x max_length), then manifest.json, written last: without it the split is unfinished, and
the same command writes it again. Memory stays flat: batches flow through while --num_proc threads tokenize
and the main thread packs and writes. A block's sequences depend on its rows alone, so N workers can share a
split, worker i packing blocks i, i+N, ..., and the output is the same whatever N (mlm_pipeline/shard_workers.py).
Each block drops under max_length tokens; give a split with few blocks a smaller --rows_per_block.

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import collections
import copy
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager

from mlm_pipeline import contract, corpus, shard_workers, split_folder, storage
from mlm_pipeline.errors import OneLineErrorParser, UsageError, exit_on_usage_error, first_line, positive_int
from mlm_pipeline.tf_startup import tensorflow_startup_log_held_back

PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; the lines of each block of rows_per_block input rows "
    "are concatenated in order and cut into max_length sequences; only each block's final remainder is dropped"
)
# Large enough that the tokens dropped at block ends do not matter (under max_length per 100,000 rows), small
# enough that a corpus of a few million rows already spreads over several workers.
DEFAULT_ROWS_PER_BLOCK = 100_000


def available_cores():
    """The cores this process may run on (its CPU affinity), which can be fewer than the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def parse_args(argv=None):
    parser = OneLineErrorParser(description="Tokenize a split and write it as TFRecord shards of packed sequences.")
    data = parser.add_argument_group("data: local files, or a Hub dataset (the default)")
    data.add_argument("--train_file", help="Local train split: text (any extension), .json/.jsonl, .csv, .parquet.")
    data.add_argument("--validation_file", help="Local validation split, same formats.")
    data.add_argument("--test_file", help="Local test split, same formats.")
    data.add_argument("--split", default="train", help=f"Which split to write: one of {', '.join(contract.SPLITS)}.")
    data.add_argument("--dataset_name", default="wikitext", help="Hub dataset id (default: wikitext).")
    data.add_argument("--dataset_config", default="wikitext-103-raw-v1", help="Hub dataset configuration.")
    data.add_argument("--text_column", default="text", help="Column that holds the text (default: text).")
    data.add_argument("--limit", type=positive_int, help="Use only the first LIMIT rows of the split.")
    data.add_argument("--trust_remote_code", action="store_true", help="Allow code from Hub repositories.")
    tokens = parser.add_argument_group("tokenization")
    tokens.add_argument("--tokenizer_name_or_path", help="Tokenizer folder or Hub id (required, except with --merge).")
    tokens.add_argument("--max_length", type=positive_int, default=128, help="Tokens per sequence (default: 128).")
    tokens.add_argument("--batch_size", type=positive_int, default=1000, help="Lines per batch (default: 1000).")
    tokens.add_argument(
        "--num_proc", type=positive_int, help=f"Tokenizing threads (default: the {available_cores()} usable cores)."
    )
    output = parser.add_argument_group("output")
    output.add_argument("--output_dir", required=True, help="Local folder or gs://bucket/prefix.")
    output.add_argument("--shard_size", type=positive_int, default=10000, help="Sequences per shard (default: 10000).")
    output.add_argument("--overwrite_output_dir", action="store_true", help="Replace a split already in --output_dir.")
    workers = parser.add_argument_group(
        "blocks and workers: one split written by several processes or machines",
        "Run the same command once per worker, with --num_workers N --worker_index i for i = 0 .. N-1 (in any "
        "order or at once), then once with --merge and the same --num_workers, --split and --output_dir. The "
        "result is byte for byte what one run writes.",
    )
    workers.add_argument(
        "--rows_per_block",
        type=positive_int,
        default=DEFAULT_ROWS_PER_BLOCK,
        help="Input rows, blank ones included, packed together: each block drops its last partial sequence, and "
        f"blocks are what workers share out (default: {DEFAULT_ROWS_PER_BLOCK}).",
    )
    workers.add_argument("--num_workers", type=positive_int, default=1, help="Workers sharing the split (default: 1).")
    workers.add_argument("--worker_index", type=int, help="This worker, 0 to N-1: it packs blocks i, i+N, i+2N, ...")
    workers.add_argument(
        "--merge", action="store_true", help="Check that all N parts are there and agree, then write manifest.json."
    )
    args = parser.parse_args(argv)
    if args.tokenizer_name_or_path is None and not args.merge:  # --merge reads everything from the parts
        parser.error("the following arguments are required: --tokenizer_name_or_path")
    return args


def check_args(args):
    """Bad input is refused here, before any work, in one line that names the flag."""
    if args.split not in contract.SPLITS:
        splits = ", ".join(contract.SPLITS)
        raise UsageError(f"--split {args.split!r} is not a split this script knows; use one of {splits}.")
    args.worker_index = shard_workers.check_worker_flags(args.num_workers, args.worker_index, args.merge)
    if args.max_length < 2:
        raise UsageError(f"--max_length {args.max_length} is too short for a sequence; use 128 or 512.")
    if any([args.train_file, args.validation_file, args.test_file]) and not args.merge:  # the merge reads no input
        if local_split_file(args) is None:
            raise UsageError(
                f"--split {args.split} was asked for, but only other local splits were given; "
                f"pass --{args.split}_file."
            )
        corpus.check_corpus_file(local_split_file(args), f"--{args.split}_file")
    if storage.is_remote(args.output_dir):
        storage.check_gcs_paths({"--output_dir": args.output_dir}, writable=["--output_dir"])  # reached and written
    else:
        storage.check_local_output_dir(args.output_dir)


def local_split_file(args):
    return {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}[args.split]


def describe_source(args):
    return local_split_file(args) or f"{args.dataset_name}/{args.dataset_config}"


# Reading: the split's rows as a stream, in blocks


class SplitTally:
    """How many rows the split has (at most --limit), blank ones included: a downloaded split knows at once, a
    stream once it has been read to its end. Every worker reads them all, and the parts must agree."""

    rows = 0

    def counted(self, rows):
        for row in rows:
            self.rows += 1
            yield row


def worker_blocks(args, tally):
    """(block index, the block's rows) for each block of --rows_per_block rows that this worker packs, in order:
    blocks i, i+N, i+2N, ... for worker i of N. The rows of the other blocks are passed over, not tokenized."""
    path = local_split_file(args)
    if path is not None and corpus.local_format(path) == "text":  # read without datasets, line by line
        return streamed_blocks(corpus.text_file_lines(path, args.text_column), args, tally)
    import datasets

    dataset = corpus.load_split(args.split, path, args.dataset_name, args.dataset_config, args.trust_remote_code)
    if isinstance(dataset, datasets.Dataset):  # downloaded, so indexed: other workers' rows are not even read
        return indexed_blocks(dataset, args, tally)
    return streamed_blocks(corpus.dataset_column(dataset, args.text_column, args.batch_size), args, tally)


def streamed_blocks(rows, args, tally):
    """A stream of rows cut into blocks. Another worker's block is read to its end and dropped: for a text file
    that is the cost of reading lines, far below tokenizing them."""
    rows = corpus.reading_errors_as_usage_errors(rows, describe_source(args))
    if args.limit is not None:
        rows = itertools.islice(rows, args.limit)
    rows = tally.counted(rows)
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


def indexed_blocks(dataset, args, tally):
    """This worker's blocks of a downloaded split, each read as a range of row indices."""
    corpus.check_text_column(args.text_column, dataset.column_names)
    tally.rows = len(dataset) if args.limit is None else min(len(dataset), args.limit)
    rows_per_block = args.rows_per_block
    for start in range(args.worker_index * rows_per_block, tally.rows, args.num_workers * rows_per_block):
        block = dataset.select(range(start, min(start + rows_per_block, tally.rows)))  # a view: nothing is copied
        texts = corpus.dataset_column(block, args.text_column, args.batch_size)
        yield start // rows_per_block, corpus.reading_errors_as_usage_errors(texts, describe_source(args))


def block_batches(blocks, batch_size):
    """(block, texts) for each batch of up to `batch_size` non-blank texts of a block, then (block, None) once the
    block's rows are all read. A batch never holds texts of two blocks: each block is packed on its own."""
    for block, rows in blocks:
        texts = (text for text in rows if text is not None and text.strip())
        while batch := list(itertools.islice(texts, batch_size)):
            yield block, batch
        yield block, None


# Tokenizing: batches in parallel threads, results in order


class BatchEncoder:
    """texts -> their token ids, each text's `[CLS] ... [SEP]` concatenated into one int64 array: the same ids as
    `tokenizer(texts)["input_ids"]`, without building its per-text lists of ids, types and attention masks."""

    def __init__(self, tokenizer):
        from transformers import PreTrainedTokenizerFast

        self.tokenizer = tokenizer
        # Direct: the class's batch call is PreTrainedTokenizerFast's own, which hands the texts unchanged to the
        # Rust backend. Some classes (CPM, for one) rewrite the text in Python first; those keep their call.
        calls = ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus")
        self.direct = all(getattr(type(tokenizer), call) is getattr(PreTrainedTokenizerFast, call) for call in calls)
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
        del os.environ["TOKENIZERS_PARALLELISM"]
        if previous is not None:
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


def token_id_batches(batches, tokenizer, num_proc):
    """(block, number of texts, their token ids as one int64 array) for each (block, texts) batch, in order; a
    block's end, (block, None), comes out as (block, None, None)."""
    encode = BatchEncoder(tokenizer)

    def encode_batch(batch):
        block, texts = batch
        return (block, None, None) if texts is None else (block, len(texts), encode(texts))

    if encode.direct:
        with tokenizer_pool_off():
            yield from in_order(encode_batch, batches, threads=num_proc or available_cores())
    else:  # transformers reconfigures the backend at every call, so calls must not overlap (each uses its own pool)
        yield from in_order(encode_batch, batches, threads=1)


# Serializing: tf.train.Example bytes, a whole batch of sequences at once


def serialize(sequences):
    """tf.train.Example bytes for each row of a 2-D int64 array, the same as tf.train.Example(...).SerializeToString()
    row by row but for all rows at once: tf.io.encode_proto builds one message type for every row, taking nested
    messages as the bytes of the level below, so the Example is built inside out (Int64List, Feature, the map
    entry "input_ids" -> Feature, Features, Example). benchmarks/serialize_records.py measures the ways."""
    import tensorflow as tf

    rows = len(sequences)

    def message(message_type, **fields):  # one value of each field per row
        values = [tf.reshape(value, [rows, 1]) for value in fields.values()]
        return tf.io.encode_proto(tf.ones([rows, len(fields)], tf.int32), values, list(fields), message_type)

    lengths = tf.fill([rows, 1], sequences.shape[1])
    int64_list = tf.io.encode_proto(lengths, [sequences], ["value"], "tensorflow.Int64List")
    feature = message("tensorflow.Feature", int64_list=int64_list)
    entry = message("tensorflow.Features.FeatureEntry", key=tf.fill([rows], contract.FEATURE_NAME), value=feature)
    features = message("tensorflow.Features", feature=entry)
    return message("tensorflow.Example", features=features).numpy().tolist()


# Packing and writing: each block's sequences into shards that appear only when complete


class ShardWriter:
    """Writes a block's shards, `<split>-<block>-<shard>-<records>.tfrecord`, each under a temporary name until
    it is complete and renamed into place. The folder is cleared of what this run replaces only when the first
    record comes (or a worker whose blocks gave none writes its part): until then a bad input leaves existing
    output untouched. Killed at any moment, it leaves a finished split (a worker: a written part) or a folder
    without one, which the same command, run again, clears of this worker's files and writes afresh."""

    def __init__(self, split_dir, settings, worker_index):
        self.split_dir, self.settings, self.worker_index = split_dir, settings, worker_index
        self.split, self.shard_size = settings["split"], settings["shard_size"]
        self.block, self.block_shards = None, []  # the block being written, and its shards so far
        self.writer, self.temporary, self.records_in_shard = None, None, 0
        self.started, self.created_folders = False, []

    def start(self):
        """Create the split's folder and clear it of what this run replaces (once)."""
        if not self.started:
            self.created_folders = split_folder.missing_folders(self.split_dir)
            split_folder.clear_split_dir(self.split_dir, self.settings, self.worker_index)
            self.started = True

    def write(self, example_bytes):
        import tensorflow as tf

        if self.writer is None:
            self.start()
            name = contract.temporary_shard_name(self.split, self.block, len(self.block_shards))
            self.temporary = f"{self.split_dir}/{name}"
            self.writer = tf.io.TFRecordWriter(self.temporary)
        self.writer.write(example_bytes)
        self.records_in_shard += 1
        if self.records_in_shard == self.shard_size:
            self.finish_shard()

    def finish_shard(self):
        import tensorflow as tf

        if self.writer is None:
            return
        self.writer.close()
        name = contract.shard_name(self.split, self.block, len(self.block_shards), self.records_in_shard)
        # The size lets training check every shard is whole with one stat() call: a truncated TFRecord file
        # reads as a shorter one without any error.
        size = tf.io.gfile.stat(self.temporary).length
        tf.io.gfile.rename(self.temporary, f"{self.split_dir}/{name}", overwrite=True)
        self.block_shards.append({"file": name, "records": self.records_in_shard, "bytes": size})
        self.writer, self.records_in_shard = None, 0

    def discard(self):
        """Remove whatever this writer wrote: a later step must never pick up a half-written split or part."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.started:
            workers = self.settings["num_workers"]
            split_folder.remove_run_output(self.split_dir, self.worker_index, workers, self.created_folders)


def write_blocks(batches, writer, max_length):
    """Pack each block on its own and write its shards; returns, for each block in order, what it gave."""
    import numpy as np
    from tqdm.auto import tqdm

    blocks = []
    carry, documents = np.zeros(0, dtype=np.int64), 0  # carry: the block's tokens waiting to fill a sequence
    # The bar shows from the first sequence on (delay), so that input refused before then gets its error line
    # alone; closing it ends its line, so that an error found midway starts a line of its own.
    progress = tqdm(desc=f"Writing {writer.split} shards", unit=" sequences", delay=1e-9)
    with closing(batches), progress:  # closing: stops the threads if writing fails
        for block, texts_in_batch, ids in batches:
            if block != writer.block:
                writer.block, writer.block_shards = block, []
            if texts_in_batch is None:  # the block is all read: its remainder, shorter than a sequence, goes
                writer.finish_shard()
                summary = {"block": block, "documents": documents, "dropped_tokens": len(carry)}
                blocks.append({**summary, "shards": writer.block_shards})
                carry, documents = carry[:0], 0
                continue
            documents += texts_in_batch
            stream = np.concatenate([carry, ids])
            full = len(stream) // max_length * max_length
            carry = stream[full:]
            sequences = stream[:full].reshape(-1, max_length)
            for example_bytes in serialize(sequences):
                writer.write(example_bytes)
            if len(sequences):
                progress.update(len(sequences))
    return blocks


def main(args):
    check_args(args)
    if args.merge:
        with tensorflow_startup_log_held_back():
            import tensorflow  # noqa: F401  (loaded here so that its start-up log can be held back)
        overwrite = args.overwrite_output_dir
        return shard_workers.merge_parts(args.output_dir, args.split, args.num_workers, overwrite, PACKING)
    # The tokenizer first: a wrong path is reported in a second rather than after TensorFlow has loaded.
    tokenizer = contract.load_tokenizer(
        args.tokenizer_name_or_path, "--tokenizer_name_or_path", args.trust_remote_code, require_fast=True
    )
    with tensorflow_startup_log_held_back():
        import tensorflow as tf

        tf.config.list_physical_devices()  # serialize()'s ops look for devices, which logs too (cuInit)
    settings = shard_workers.run_settings(args, tokenizer, describe_source(args))
    split_dir = contract.split_dir(args.output_dir, args.split)
    # Checked before tokenizing: refusing after minutes of work would waste them.
    written = split_folder.check_split_dir(split_dir, settings, args.worker_index, args.overwrite_output_dir)
    if written is not None:  # a worker run again, by hand or by a scheduler's retry: nothing to do
        return written

    tally = SplitTally()
    batches = block_batches(worker_blocks(args, tally), args.batch_size)
    writer = ShardWriter(split_dir, settings, args.worker_index)
    try:
        blocks = write_blocks(token_id_batches(batches, tokenizer, args.num_proc), writer, args.max_length)
        part = shard_workers.part_manifest(args.worker_index, settings, tally.rows, blocks)  # all rows read now
        # A single run's manifest is the merge of its one part; it is checked before the folder is cleared.
        result = shard_workers.split_manifest([part], PACKING) if args.num_workers == 1 else part
        writer.start()  # a worker whose blocks gave no sequence still replaces its older output with its part
        own_manifest = split_folder.own_manifest_name(args.worker_index, args.num_workers)
        split_folder.write_manifest(split_dir, own_manifest, result)
    except BaseException as error:
        writer.discard()
        if isinstance(error, (OSError, tf.errors.OpError)):  # the file system refused a write
            raise UsageError(
                f"could not write the {args.split} split to {split_dir}: {first_line(error)}; "
                "check that --output_dir is writable and has room."
            ) from None
        raise
    shard_workers.report(result, split_dir, args.output_dir)
    return result


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "prepare_tfrecord_shards.py")
