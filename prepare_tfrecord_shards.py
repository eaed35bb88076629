#!/usr/bin/env python
"""Step 2 of 4: tokenize a text split, pack it into fixed-length sequences, write TFRecord shards.

Each non-blank line (a document or paragraph) is tokenized as `[CLS] tokens [SEP]`. The split is
read in blocks of --rows_per_block input rows (blank ones count too; a block never spans two input
files), and each block is packed on its own: its documents are concatenated in order and cut into
--max_length sequences (which may start or end mid-document; a [SEP] ends each document). Nothing is
padded: only each block's final remainder is dropped (RoBERTa's FULL-SENTENCES packing).

    # local files (a glob over many works too: --train_file 'corpus/part-*.txt')
    python prepare_tfrecord_shards.py --train_file corpus/train.txt --split train \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards
    python prepare_tfrecord_shards.py --validation_file corpus/validation.txt --split validation \
        --tokenizer_name_or_path tokenizer --max_length 128 --output_dir shards

    # C4 as it is kept: gzip-compressed JSON lines in a bucket (.csv, .parquet, .zst likewise)
    python prepare_tfrecord_shards.py --train_file 'gs://my-bucket/c4/en/c4-train.*.json.gz' \
        --split train --tokenizer_name_or_path tokenizer --output_dir gs://my-bucket/c4-shards

    # WikiText-103 from the Hub, streamed (no download into the cache), straight to a GCS bucket
    python prepare_tfrecord_shards.py --split train --tokenizer_name_or_path my-user/my-tokenizer \
        --streaming --max_length 128 --output_dir gs://my-bucket/wikitext-103

    # past one machine: the same step as an Apache Beam pipeline, here on every core of this one; on
    # Dataflow, see README.md ("Several hosts, and Apache Beam") and mlm_pipeline/beam_pipeline.py
    python prepare_tfrecord_shards.py --train_file 'gs://my-bucket/corpus/*.txt' --split train \
        --tokenizer_name_or_path gs://my-bucket/tokenizer --output_dir gs://my-bucket/shards \
        --runner DirectRunner --direct_num_workers 0 --direct_running_mode multi_processing

Output: <output_dir>/<split>/<split>-<block>-<shard>-<records>.tfrecord, one tf.train.Example per
sequence (`tf_example` below: "input_ids", int64 x max_length), then manifest.json, written last:
without it the split is unfinished, and the same command writes it again. Memory stays flat:
--num_proc threads tokenize while the main thread packs and writes. A block's sequences depend on
its rows alone, so the Beam pipeline (--runner, after `pip install -r requirements-beam.txt`) packs
blocks on many workers at once and writes the same files, byte for byte.

Next step: run_mlm.py --train_dataset <output_dir>/train --eval_dataset <output_dir>/validation.
"""

import collections
import itertools
import json
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager

from mlm_pipeline import (
    beam_launcher,
    contract,
    corpus,
    hub_datasets,
    packing,
    split_folder,
    storage,
)
from mlm_pipeline.errors import (
    OneLineErrorParser,
    UsageError,
    exit_on_usage_error,
    first_line,
    positive_int,
)
from mlm_pipeline.tf_startup import keep_off_the_tpu, tensorflow_startup_log_held_back

PACKING = (
    "each non-blank line is tokenized as [CLS] tokens [SEP]; the lines of each block of "
    "rows_per_block input rows are concatenated in order and cut into max_length sequences; only "
    "each block's final remainder is dropped"
)
# Large enough that the tokens dropped at block ends do not matter (under max_length per 100,000
# rows), small enough that a corpus of a few million rows already spreads over several Beam workers.
DEFAULT_ROWS_PER_BLOCK = 100_000


def parse_args(argv=None):
    parser = OneLineErrorParser(
        description="Tokenize a split and write it as TFRecord shards of packed sequences.",
        epilog="With --runner, every flag this script does not know goes to Apache Beam as a "
        "pipeline option (--direct_num_workers, --project, --region, --temp_location, "
        "--setup_file, ...).",
    )
    data = corpus.add_corpus_flags(parser, splits=contract.SPLITS)
    data.add_argument(
        "--split",
        default="train",
        help=f"Which split to write: one of {', '.join(contract.SPLITS)} (default: train).",
    )
    add = parser.add_argument_group("tokenization").add_argument
    add(
        "--tokenizer_name_or_path",
        required=True,
        help="The tokenizer: train_unigram.py's folder (local or gs://) or a Hub id.",
    )
    add(
        "--max_length",
        type=positive_int,
        default=128,
        help="How many tokens each sequence holds (default: 128).",
    )
    add(
        "--batch_size",
        type=positive_int,
        default=1000,
        help="How many lines the tokenizer is handed at a time (default: 1000).",
    )
    add(
        "--num_proc",
        type=positive_int,
        help=f"How many threads tokenize (default: the {available_cores()} cores this process may "
        "use).",
    )
    add = parser.add_argument_group("output").add_argument
    add(
        "--output_dir",
        required=True,
        help="A local folder or gs://bucket/prefix; the split goes into its <split>/ folder.",
    )
    add(
        "--shard_size",
        type=positive_int,
        default=10000,
        help="How many sequences each shard file holds, at most (default: 10000).",
    )
    add(
        "--overwrite_output_dir",
        action="store_true",
        help="Replace a finished split of the same name in --output_dir.",
    )
    add(
        "--rows_per_block",
        type=positive_int,
        default=DEFAULT_ROWS_PER_BLOCK,
        help="How many input rows, blank ones included, are packed together: each block drops its "
        "last partial sequence, and blocks are what Beam's workers share out "
        f"(default: {DEFAULT_ROWS_PER_BLOCK}).",
    )
    add = parser.add_argument_group("Apache Beam: one split written by many workers").add_argument
    add(
        "--runner",
        help="Run the step as an Apache Beam pipeline on this runner: DirectRunner (this "
        "machine's cores), DataflowRunner, FlinkRunner, SparkRunner... The output is what a run "
        "without it writes. Needs `pip install -r requirements-beam.txt`.",
    )
    args, beam_options = parser.parse_known_args(argv)
    if beam_options and not args.runner:
        unknown = " ".join(beam_options)
        parser.error(f"unrecognized arguments: {unknown} (Beam pipeline options need --runner)")
    args.beam_argv = ["--runner", args.runner, *beam_options] if args.runner else []
    return args


def available_cores():
    """The cores this process may run on (its CPU affinity): maybe fewer than the machine has."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_args(args):
    """Bad input is refused here, before any work, in one line that names the flag. Returns the
    input files in the order they are read (None for a Hub dataset)."""
    if args.split not in contract.SPLITS:
        splits = ", ".join(contract.SPLITS)
        raise UsageError(
            f"--split {args.split!r} is not a split this script knows; use one of {splits}."
        )
    if args.max_length < 2:
        raise UsageError(
            f"--max_length {args.max_length} is too short for a sequence; use 128 or 512."
        )
    pattern, flag = local_split_file(args), f"--{args.split}_file"
    if any([args.train_file, args.validation_file, args.test_file]) and pattern is None:
        raise UsageError(
            f"--split {args.split} was asked for, but only other local splits were given; pass "
            f"{flag}."
        )
    if args.runner:
        beam_launcher.require_beam()
        if pattern is None:
            raise UsageError(
                "--runner reads files, local or gs://, not a Hub dataset "
                f"({describe_source(args)}); pass {flag} (a glob over the dataset's text files, "
                "e.g. in a bucket), or run without --runner and --streaming."
            )
        beam_launcher.check_options(
            args.beam_argv,
            tokenizer=args.tokenizer_name_or_path,
            output_dir=args.output_dir,
            inputs=[(flag, pattern)],
        )
    # Cloud Storage next, in seconds (listing an unreachable bucket takes TF minutes of retries)
    paths = {"--output_dir": args.output_dir, flag: pattern}
    paths["--tokenizer_name_or_path"] = args.tokenizer_name_or_path
    storage.check_gcs_paths(paths, writable=["--output_dir"])
    if not storage.is_remote(args.output_dir):
        storage.check_local_output_dir(args.output_dir)
    return corpus.input_files(pattern, flag) if pattern is not None else None


def local_split_file(args):
    files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
    return files[args.split]


def describe_source(args):
    return local_split_file(args) or f"{args.dataset_name}/{args.dataset_config}"


# Reading: the split's rows as a stream, in blocks


def file_rows(args, files):
    """The rows of each input file in turn, streamed in any format corpus.file_rows reads (a Hub
    dataset: its split, one stream)."""
    if files is None:
        dataset = hub_datasets.load_split(
            args.split,
            args.dataset_name,
            args.dataset_config,
            trust_remote_code=args.trust_remote_code,
            streaming=args.streaming,
        )
        yield corpus.dataset_column(dataset, args.text_column, args.batch_size)
    for path in files or ():
        yield corpus.file_rows(path, args.text_column)


def split_blocks(args, files, tally):
    """(block index, the block's rows) for each block of --rows_per_block rows, in order: each file
    is cut into blocks of its own, numbered on from one file to the next, and --limit counts rows
    across the files (`tally["rows"]`). mlm_pipeline/beam_pipeline.py numbers a Beam run's blocks
    the same way."""
    blocks = itertools.count()
    for rows in file_rows(args, files):
        rows = corpus.reading_errors_as_usage_errors(rows, describe_source(args))
        if args.limit is not None:
            rows = itertools.islice(rows, args.limit - tally["rows"])
        rows = corpus.counted(rows, tally)
        end = object()  # a row can be None, so the end of the stream needs a marker of its own
        while (first := next(rows, end)) is not end:
            block_rows = itertools.chain([first], itertools.islice(rows, args.rows_per_block - 1))
            yield next(blocks), block_rows
            collections.deque(block_rows, maxlen=0)  # the block's rest: the next starts after it
        if args.limit is not None and tally["rows"] >= args.limit:
            return


def block_batches(blocks, batch_size):
    """(block, texts) for each batch of up to `batch_size` non-blank texts of a block, then (block,
    None) once the block's rows are all read. A batch never holds texts of two blocks: each block is
    packed on its own."""
    for block, rows in blocks:
        for batch in corpus.text_batches(rows, batch_size):
            yield block, batch
        yield block, None


# Tokenizing: batches in parallel threads, results in order


class BatchEncoder:
    """texts -> their token ids, each text's `[CLS] ... [SEP]` concatenated into one int64 array:
    the same ids as `tokenizer(texts)["input_ids"]`, without building its per-text lists of ids,
    types and attention masks."""

    def __init__(self, tokenizer):
        from transformers import PreTrainedTokenizerFast

        self.tokenizer = tokenizer
        # Direct: the class's batch call is PreTrainedTokenizerFast's own, which hands the texts
        # unchanged to the Rust backend. Some classes (CPM, for one) rewrite the text in Python
        # first; those keep their call.
        calls = ("__call__", "_call_one", "batch_encode_plus", "_batch_encode_plus")
        fast = PreTrainedTokenizerFast
        self.direct = all(getattr(type(tokenizer), call) is getattr(fast, call) for call in calls)
        if self.direct:  # the backend as transformers sets it for that call; Beam's workers too
            self.backend = packing.batch_backend(
                tokenizer.backend_tokenizer, tokenizer.split_special_tokens
            )

    def __call__(self, texts):
        if self.direct:
            return packing.encode_texts(self.backend, texts)
        return packing.concatenate_ids(self.tokenizer(texts, add_special_tokens=True)["input_ids"])


@contextmanager
def tokenizer_pool_off():
    """Turn off the Rust tokenizer's own thread pool (read at every call), so that each of our
    threads uses one core: --num_proc threads then use --num_proc cores, not --num_proc times all of
    them."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        del os.environ["TOKENIZERS_PARALLELISM"]
        if previous is not None:
            os.environ["TOKENIZERS_PARALLELISM"] = previous


def in_order(function, batches, threads):
    """function(batch) for each batch, computed in `threads` threads and yielded in order. Only a
    few batches are read ahead, so memory does not grow with the corpus."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
    pending = collections.deque()
    try:
        for batch in batches:
            pending.append(pool.submit(function, batch))
            # Two batches a thread in line keep every thread busy while the main thread catches up.
            if len(pending) > 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(cancel_futures=True)


def token_id_batches(batches, tokenizer, num_proc):
    """(block, number of texts, their token ids as one int64 array) for each (block, texts) batch,
    in order; a block's end, (block, None), comes out as (block, None, None)."""
    encode = BatchEncoder(tokenizer)

    def encode_batch(batch):
        block, texts = batch
        return (block, None, None) if texts is None else (block, len(texts), encode(texts))

    if encode.direct:
        with tokenizer_pool_off():
            yield from in_order(encode_batch, batches, threads=num_proc or available_cores())
    else:
        # transformers reconfigures the backend at every call, so calls must not overlap
        yield from in_order(encode_batch, batches, threads=1)


# Packing and writing: each block's sequences into shards of tf.train.Example records


def tf_example(sequence):
    """One record of a shard: a tf.train.Example with one feature, "input_ids", the sequence's
    max_length token ids. run_mlm.py parses it back with contract.record_features."""
    import tensorflow as tf

    input_ids = tf.train.Feature(int64_list=tf.train.Int64List(value=sequence))
    features = tf.train.Features(feature={contract.FEATURE_NAME: input_ids})
    return tf.train.Example(features=features)


class SplitWriter:
    """Writes the split's shards, each whole (under a temporary name, then renamed). The folder is
    cleared of what this run replaces only when the first shard comes: until then a bad input
    leaves existing output untouched. Killed at any moment, it leaves a finished split or a folder
    without manifest.json, which the same command, run again, clears and writes afresh."""

    def __init__(self, split_dir):
        self.split_dir, self.started, self.created_folders = split_dir, False, []

    def start(self):
        if not self.started:
            self.created_folders = split_folder.missing_folders(self.split_dir)
            split_folder.clear_split_dir(self.split_dir)
            self.started = True

    def write_shard(self, path, sequences):
        """One shard: each sequence (a row of the 2-D array) as a tf.train.Example in a TFRecord
        file; returns its size in bytes."""
        import tensorflow as tf

        self.start()
        with storage.write_then_rename(path) as temporary, tf.io.TFRecordWriter(temporary) as file:
            for sequence in sequences:
                file.write(tf_example(sequence).SerializeToString())
        return tf.io.gfile.stat(path).length

    def discard(self):
        """Remove whatever this run wrote: a later step must never pick up a half-written split."""
        if self.started:
            split_folder.remove_run_output(self.split_dir, self.created_folders)


def write_blocks(id_batches, writer, args):
    """Pack each block on its own and write its shards (packing.pack_block: concatenate, cut,
    write); returns, for each block in order, what it gave."""
    from tqdm.auto import tqdm

    summaries = []
    # The bar shows from the first sequence on (delay): input refused before then gets its error
    # line alone; closing it ends its line, so that an error found midway starts a line of its own.
    progress = tqdm(desc=f"Writing {args.split} shards", unit=" sequences", delay=1e-9)
    with closing(id_batches), progress:  # closing: stops the threads if writing fails
        for block, batches in itertools.groupby(id_batches, key=lambda batch: batch[0]):
            encoded = ((texts, ids) for _, texts, ids in batches if texts is not None)
            shards = packing.BlockShards(
                split_dir=writer.split_dir,
                split=args.split,
                block=block,
                shard_size=args.shard_size,
                write_shard=writer.write_shard,
            )
            summary = packing.pack_block(block, encoded, args.max_length, shards, progress.update)
            summaries.append(summary)
    return summaries


def write_split(args, files, tokenizer, settings, split_dir):
    """The split in this process: read, tokenize in threads, pack and write, then manifest.json."""
    tally = collections.Counter()
    batches = block_batches(split_blocks(args, files, tally), args.batch_size)
    writer = SplitWriter(split_dir)
    try:
        blocks = write_blocks(token_id_batches(batches, tokenizer, args.num_proc), writer, args)
        # Built, and a split without a single sequence refused, before the folder is cleared.
        manifest = split_folder.split_manifest(blocks, tally["rows"], settings, PACKING)
        writer.start()
        split_folder.write_manifest(split_dir, split_folder.manifest_text(manifest))
    except BaseException:
        writer.discard()
        raise
    return manifest


def write_split_with_beam(args, files, tokenizer, settings, split_dir):
    """The split as an Apache Beam pipeline on --runner (mlm_pipeline/beam_pipeline.py): the same
    blocks, packed by pack_block on the runner's workers, which load the tokenizer themselves."""
    import tensorflow as tf

    encoder = BatchEncoder(tokenizer)
    if not encoder.direct:
        raise UsageError(
            f"the tokenizer {args.tokenizer_name_or_path!r} ({type(tokenizer).__name__}) rewrites "
            "text before its Rust backend sees it, which Beam's workers cannot do; run without "
            "--runner."
        )
    workers_tokenizer = beam_launcher.worker_tokenizer(
        args.tokenizer_name_or_path,
        backend=encoder.backend,
        split_special_tokens=tokenizer.split_special_tokens,
    )
    inputs = f"{len(files)} input files"
    print(f"Writing the {args.split} split ({inputs}) as an Apache Beam pipeline on {args.runner}")
    created_folders = split_folder.missing_folders(split_dir)
    split_folder.clear_split_dir(split_dir)  # before the workers start: they write at once
    try:
        beam_launcher.run(
            args.beam_argv,
            files,
            tokenizer=workers_tokenizer,
            settings=settings,
            split_dir=split_dir,
            batch_size=args.batch_size,
            limit=args.limit,
            text_column=args.text_column,
            packing_text=PACKING,
        )
    except BaseException:
        split_folder.remove_run_output(split_dir, created_folders)
        raise
    with tf.io.gfile.GFile(f"{split_dir}/{contract.MANIFEST_NAME}") as file:
        return json.load(file)


def main(args):
    keep_off_the_tpu()  # this step never uses the TPU, nor do its Beam workers; before TensorFlow
    files = check_args(args)
    # The tokenizer first: a wrong path is reported in a second, not after TensorFlow has loaded.
    name, flag = args.tokenizer_name_or_path, "--tokenizer_name_or_path"
    tokenizer = contract.load_tokenizer(name, flag, args.trust_remote_code, require_fast=True)
    with tensorflow_startup_log_held_back():
        import tensorflow as tf

        tf.config.list_physical_devices()  # looking for devices logs too (cuInit)
    settings = split_folder.split_settings(
        tokenizer,
        tokenizer_name=args.tokenizer_name_or_path,
        split=args.split,
        source=describe_source(args),
        max_length=args.max_length,
        rows_per_block=args.rows_per_block,
        shard_size=args.shard_size,
    )
    split_dir = contract.split_dir(args.output_dir, args.split)
    split_folder.check_split_dir(split_dir, args.split, args.overwrite_output_dir)
    write = write_split_with_beam if args.runner else write_split
    try:
        manifest = write(args, files, tokenizer, settings, split_dir)
    except (OSError, tf.errors.OpError) as error:  # the file system refused a write
        raise UsageError(
            f"could not write the {args.split} split to {split_dir}: {first_line(error)}; "
            "check that --output_dir is writable and has room."
        ) from None
    split_folder.print_summary(manifest, split_dir)
    return manifest


if __name__ == "__main__":
    exit_on_usage_error(main, parse_args(), "prepare_tfrecord_shards.py")
